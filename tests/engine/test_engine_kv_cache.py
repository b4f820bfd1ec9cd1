"""Paged KV cache: block accounting, no leaks, preemption, refusal of impossible prompts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError
from llmsched.engine.kv_cache import BlockAllocator, token_capacity


def test_allocator_grows_and_frees():
    a = BlockAllocator(10, 4)
    t: list[int] = []
    a.ensure(t, 1)
    assert len(t) == 1 and a.num_free == 9
    a.ensure(t, 4)
    assert len(t) == 1
    a.ensure(t, 9)
    assert len(t) == 3 and a.num_used == 3
    assert a.slots(t, 3, 6) == [t[0] * 4 + 3, t[1] * 4, t[1] * 4 + 1]
    a.free(t)
    assert t == [] and a.num_free == 10
    with pytest.raises(RuntimeError):
        a.ensure(t, 41)


def test_token_capacity_guards_rounding():
    assert token_capacity(20, 16, 4) == 256
    with pytest.raises(ConfigError):
        token_capacity(4, 16, 4)


def test_too_small_a_cache_names_the_command_line_flags():
    """`llmsched serve`/`generate` users have no max_num_seqs flag: the line names theirs."""
    with pytest.raises(ConfigError) as e:
        token_capacity(24, 16, 64)
    message = str(e.value)
    assert "--max-running" in message and "--kv-cache-gb" in message and "--num-blocks" not in message
    # the flag is named as the way to lower it, not as if the user had given it
    assert message.endswith("or lower max_num_seqs (--max-running on the command line)")
    with pytest.raises(ConfigError, match=r"give it more memory \(num_blocks, --num-blocks\)"):
        token_capacity(24, 16, 64, ("num_blocks", "--num-blocks"))


def test_too_small_a_cache_names_only_the_flags_the_command_has(tiny_model, capsys):
    # profile, validate and generate have no --num-blocks (only serve), but were told to raise it
    from llmsched.cli import main

    for argv in (["profile", "--out", "unused.csv"], ["generate", "--prompt", "x", "--max-tokens", "2"]):
        assert main([*argv, "--model", str(tiny_model), "--kv-cache-gb", "0.00005", "--max-running", "64"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "give it more memory (kv_cache_gb, --kv-cache-gb)" in err and "num-blocks" not in err, err
    # given --num-blocks (serve, or num_blocks from Python), that is what the line names
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match=r"\(num_blocks, --num-blocks\)") as e:
        LLM(tiny_model, block_size=4, max_num_seqs=8, num_blocks=4, max_model_len=64)
    assert "kv-cache-gb" not in str(e.value)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Greedy outputs with a roomy cache, to compare the cramped runs with."""
    from llmsched.engine import LLM

    return LLM(tiny_model, b_max=512, max_model_len=512, max_num_seqs=16)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=6),
    b_max=st.integers(1, 48),
    policy=st.sampled_from(["sarathi", "orca", "vllm", "fastertransformer", "kfcfs"]),
    seqs=st.integers(1, 4),
    spare=st.integers(1, 6),
)
def test_no_block_leaks_and_same_tokens(tiny_model, reference, lens, b_max, policy, seqs, spare):
    from llmsched.engine import LLM

    longest = max(p + o - 1 for p, o in lens)
    bs = 4
    blocks = seqs + -(-longest // bs) + spare - 1
    llm = LLM(
        tiny_model,
        scheduler=policy,
        b_max=b_max,
        block_size=bs,
        max_num_seqs=seqs,
        num_blocks=blocks,
        max_model_len=512,
    )
    prompts = [[(7 * i + 3 * j) % 300 + 2 for j in range(p)] for i, (p, _) in enumerate(lens)]
    params = [SamplingParams(max_tokens=o, temperature=0, ignore_eos=True) for _, o in lens]
    outs = llm.generate(prompts, params)
    eng = llm.engine
    assert eng.allocator.num_used == 0
    assert eng.state.kv_used == 0 and eng.state.is_idle()
    ref = reference.generate(prompts, params)
    assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
    assert [len(o.token_ids) for o in outs] == [o for _, o in lens]


def test_preemption_happens_under_tiny_cache(tiny_model, reference):
    from llmsched.engine import LLM

    prompts = [[5 + i] * 30 for i in range(4)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    llm = LLM(tiny_model, b_max=64, block_size=4, max_num_seqs=4, num_blocks=4 + 13 + 2, max_model_len=512)
    outs = llm.generate(prompts, params)
    assert llm.engine.preemptions > 0
    assert sum(o.preemptions for o in outs) == llm.engine.preemptions
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference.generate(prompts, params)]
    assert llm.engine.allocator.num_used == 0


def test_prompt_that_can_never_fit_is_refused(tiny_model):
    from llmsched.engine import LLM

    llm = LLM(tiny_model, block_size=4, max_num_seqs=2, num_blocks=10, max_model_len=512)
    assert llm.engine.kv_capacity == 32
    with pytest.raises(ConfigError, match="could never complete"):
        llm.generate([[3] * 30], SamplingParams(max_tokens=5))
    with pytest.raises(ConfigError, match="maximum context length"):
        llm.generate([[3] * 500], SamplingParams(max_tokens=20))
    assert llm.engine.allocator.num_used == 0 and not llm.engine.has_unfinished_requests()
    # the engine still serves requests that fit
    out = llm.generate([[3] * 20], SamplingParams(max_tokens=5, temperature=0))
    assert len(out[0].token_ids) == 5


def test_cache_too_small_for_max_num_seqs(tiny_model):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match="max_num_seqs"):
        LLM(tiny_model, block_size=4, max_num_seqs=8, num_blocks=8, max_model_len=512)


def _cache_allocation_fails(monkeypatch, exc):
    """torch.zeros fails for the 5-d cache tensors alone, as the allocator does for one too large."""
    import torch

    real = torch.zeros

    def zeros(*shape, **kwargs):
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if len(dims) == 5:
            raise exc
        return real(*shape, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory"),
        MemoryError(),
        # a size past what torch can count (no memory check before it on CUDA)
        RuntimeError("Storage size calculation overflowed with sizes=[4, 2, 1000000000000000001, 16, 32]"),
    ],
)
def test_a_cache_that_cannot_be_allocated_is_a_config_error(tiny_model, monkeypatch, exc):
    """A failed allocation (CPU, or CUDA's OutOfMemoryError, a RuntimeError) was a bare traceback."""
    from llmsched.engine import LLM

    _cache_allocation_fails(monkeypatch, exc)
    with pytest.raises(ConfigError, match="could not be allocated") as e:
        LLM(tiny_model, block_size=4, max_num_seqs=2, num_blocks=1000, max_model_len=512)
    message = str(e.value)
    assert "1,000 blocks of 4 tokens" in message
    assert "--num-blocks" in message and "--max-running" in message
    assert "kv-cache-gb" not in message  # num_blocks sized it, not kv_cache_gb


def test_generate_and_serve_say_a_failed_cache_allocation_in_one_line(tiny_model, monkeypatch, capsys):
    from llmsched.cli import main

    _cache_allocation_fails(monkeypatch, RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    argv = ["--model", str(tiny_model), "--kv-cache-gb", "2", "--max-running", "100000"]
    assert main(["generate", *argv, "--prompt", "x", "--max-tokens", "2"]) == 2
    assert main(["serve", *argv, "--port", "0"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all("could not be allocated" in line for line in lines), err
    assert "Traceback" not in err


def test_a_cpu_cache_larger_than_the_machine_is_refused_before_it_is_made(tiny_model, monkeypatch):
    """With overcommit, zeroing such a cache could get the process killed instead of raising."""
    from llmsched.engine import LLM, runner

    real = runner.physical_memory()
    monkeypatch.setattr(runner, "physical_memory", lambda: 1 << 20)
    with pytest.raises(ConfigError, match=r"larger than the 1\.0 MiB of memory on the CPU") as e:
        LLM(tiny_model, block_size=4, max_num_seqs=2, num_blocks=100_000, max_model_len=512)
    assert "--num-blocks" in str(e.value)
    # the default cache (capped at what max_num_seqs sequences can use) passes on this machine
    assert real is None or real > 1 << 30
    monkeypatch.setattr(runner, "physical_memory", lambda: real)
    llm = LLM(tiny_model, max_model_len=512)
    assert llm.engine.runner.kv_cache_bytes < (real or 1 << 62)


def test_abort_frees_blocks(tiny_model):
    from llmsched.engine.engine import LLMEngine

    eng = LLMEngine(tiny_model, b_max=8, max_num_seqs=4, max_model_len=512)
    p = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    eng.add_request("a", [4] * 20, p)
    eng.add_request("b", [5] * 20, p)
    eng.add_request("c", [6] * 5, p)
    for _ in range(4):
        eng.step()
    assert eng.allocator.num_used > 0
    eng.abort_request("a")
    eng.abort_request("c")  # maybe still waiting
    eng.abort_request("zzz")  # unknown: ignored
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert all(o.request_id == "b" for o in outs)
    assert eng.allocator.num_used == 0 and eng.state.kv_used == 0
    s = eng.stats()
    assert s["waiting"] == 0 and s["running"] == 0 and s["kv_capacity_tokens"] == eng.kv_capacity


def test_decode_graph_buckets_match_eager(tiny_model, reference):
    """The CUDA-graph decode path (static buffers, padded batch and block-table buckets,
    scratch block for padding rows) on the CPU, with replay emulated by re-running the
    captured call: same tokens as eager."""
    from llmsched.engine import LLM
    from llmsched.engine.runner import DecodeGraphs

    class EmulatedGraphs(DecodeGraphs):
        captures = 0

        def _capture(self, bsz, blk):
            EmulatedGraphs.captures += 1
            model = self.r.model
            meta = lambda: self._meta(bsz, blk)  # noqa: E731 - a fresh meta, as in a capture
            out = model(self.ids[:bsz], self.pos[:bsz], meta())

            class Replay:
                def replay(self_inner):
                    out.copy_(model(self.ids[:bsz], self.pos[:bsz], meta()))

            return Replay(), out

    llm = LLM(tiny_model, b_max=64, block_size=4, max_num_seqs=6, max_model_len=512)
    llm.engine.runner.graphs = EmulatedGraphs(llm.engine.runner)
    prompts = [[(5 * i + j) % 300 + 2 for j in range(3 + 7 * i)] for i in range(5)]
    params = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert EmulatedGraphs.captures >= 2
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference.generate(prompts, params)]


def test_a_bug_while_allocating_the_cache_is_not_called_a_cache_too_large(tiny_model, monkeypatch):
    """Any RuntimeError was reported as the cache not fitting, hiding the real error."""
    from llmsched.engine import LLM

    _cache_allocation_fails(monkeypatch, RuntimeError("expected scalar type Float but found Half"))
    with pytest.raises(RuntimeError, match="expected scalar type") as e:
        LLM(tiny_model, block_size=4, max_num_seqs=2, num_blocks=1000, max_model_len=512)
    assert not isinstance(e.value, ConfigError)
