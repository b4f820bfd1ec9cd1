"""The one runtime: the stop checker on hand cases, and the step driver with an executor
of its own (the engine and the virtual GPU are two such drivers)."""

import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.policies import make_scheduler
from llmsched.runtime import Sequence, StepDriver
from llmsched.sim.virtual import VirtualEngine


def _feed(seq, tokens, texts, last_is_length=True):
    """Feed tokens with their text pieces; returns the outputs."""
    outs = []
    for i, (tok, text) in enumerate(zip(tokens, texts)):
        done = last_is_length and i == len(tokens) - 1
        outs.append(seq.accept(tok, done, lambda final, drop, t=text: "" if drop else t))
        if outs[-1].finished:
            break
    return outs


def test_eos_stops_without_its_text_and_ignore_eos_does_not():
    seq = Sequence("a", 3, SamplingParams(max_tokens=5), eos_ids=frozenset({2}))
    outs = _feed(seq, [7, 2, 9], ["x", "EOS", "y"], last_is_length=False)
    assert [o.new_text for o in outs] == ["x", ""] and outs[-1].finish_reason == "stop"
    assert outs[-1].stop_reason is None and seq.text == "x"
    seq = Sequence("b", 3, SamplingParams(max_tokens=3, ignore_eos=True), eos_ids=frozenset({2}))
    outs = _feed(seq, [7, 2, 9], ["x", "E", "y"])
    assert [o.finish_reason for o in outs] == [None, None, "length"] and seq.text == "xEy"


def test_stop_string_across_pieces_is_cut_and_held_back_text_is_flushed():
    seq = Sequence("a", 1, SamplingParams(max_tokens=10, stop=["END"]))
    outs = _feed(seq, [1, 2, 3, 4], ["ab", "cE", "N", "Dzz"], last_is_length=False)
    # the last len("END") - 1 characters are held back; the match cuts the held "EN" away
    assert [o.new_text for o in outs] == ["", "ab", "c", ""]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == "END" and seq.text == "abc"
    assert outs[-1].output_tokens == 4


def test_min_tokens_masks_stop_ids_and_delays_stop_strings():
    seq = Sequence(
        "a", 1, SamplingParams(max_tokens=6, min_tokens=2, stop_token_ids=[5], stop=["q"]), eos_ids=frozenset({2})
    )
    assert seq.banned_ids() == {5, 2}
    out = seq.accept(5, False, lambda final, drop: "q")  # token 1: no stop condition applies yet
    assert not out.finished and seq.banned_ids() == {5, 2}
    # token 2: as in vLLM, stop strings apply only once more than min_tokens tokens exist
    out = seq.accept(9, False, lambda final, drop: "q")
    assert not out.finished and seq.banned_ids() is None
    out = seq.accept(9, False, lambda final, drop: "q")  # token 3: stop strings apply
    assert out.finished and out.stop_reason == "q" and seq.text == "qq"


def test_min_tokens_stop_string_must_end_after_the_first_min_tokens_text():
    # vLLM's stop_check_offset: a stop string wholly in the first min_tokens tokens' text
    # never matches; one that ends in a later token's text does, even if it starts earlier
    seq = Sequence("a", 1, SamplingParams(max_tokens=6, min_tokens=2, stop=["ab"]))
    outs = _feed(seq, [1, 2, 3, 4], ["a", "b", "c", "d"])
    assert [o.finish_reason for o in outs] == [None, None, None, "length"] and seq.text == "abcd"
    seq = Sequence("b", 1, SamplingParams(max_tokens=6, min_tokens=2, stop=["bc"]))
    outs = _feed(seq, [1, 2, 3, 4], ["a", "b", "c", "d"])
    assert outs[-1].finish_reason == "stop" and len(outs) == 3 and seq.text == "a"
    # min_tokens=1: the first token's text is never a stop (the engine's repro: ' ' + 'world')
    seq = Sequence("c", 1, SamplingParams(max_tokens=3, min_tokens=1, stop=["x"]))
    outs = _feed(seq, [1, 2, 3], ["x", "y", "z"])
    assert [o.finish_reason for o in outs] == [None, None, "length"] and seq.text == "xyz"


def test_engine_and_virtual_gpu_run_the_one_step_loop():
    from llmsched.engine.engine import LLMEngine
    from llmsched.engine.engine import Sequence as EngineSequence

    assert LLMEngine.step is StepDriver.step and VirtualEngine.step is StepDriver.step
    assert issubclass(EngineSequence, Sequence)
    for cls in (LLMEngine, VirtualEngine):
        assert not any(hasattr(cls, name) for name in ("_emit_token", "_stop_check", "_find_stop"))


class _FixedExecutor:
    """Every step takes 10 ms and every sampler emits token 7."""

    def execute(self, batch):
        return batch.start_ns + 10_000_000, [7] * len(batch.samplers)


class _Driver(StepDriver):
    def __init__(self, scheduler):
        super().__init__(scheduler)
        self.executor = _FixedExecutor()

    def now_ns(self):
        return self.state.now

    def add(self, rid, prompt, params):
        self.state.add(self._register(Sequence(rid, prompt, params), self.state.now))


def test_a_driver_with_its_own_executor_serves_and_reports_every_step():
    seen = []
    sched = make_scheduler("sarathi", b_max=8)
    sched.closed_loop = True
    sched.observe = lambda state, fb: seen.append((fb.duration, fb.plan.tokens))
    d = _Driver(sched)
    d.add("a", 12, SamplingParams(max_tokens=3))
    d.add("b", 2, SamplingParams(max_tokens=2, stop_token_ids=[7]))
    outs = []
    while d.has_unfinished_requests():
        outs += d.step()
    # a: 12 prompt tokens in chunks of 8 and 4 (with b's prompt), then 2 decodes; b stops on token 7
    by = {}
    for o in outs:
        by.setdefault(o.request_id, []).append(o)
    assert [o.finish_reason for o in by["a"]] == [None, None, "length"]
    assert len(by["b"]) == 1 and by["b"][0].finish_reason == "stop" and by["b"][0].stop_reason == 7
    assert d.steps == len(seen) and all(dur == pytest.approx(0.01) for dur, _ in seen)
    assert all(tokens <= 8 for _, tokens in seen)
    assert d.finished_total == 2 and d.generation_tokens_total == 4 and d.state.is_idle()
