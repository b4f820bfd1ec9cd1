"""The virtual GPU (`VirtualEngine`): same steps as the simulator, honest real-time clock."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from llmsched.core import ConfigError, make_cost_model
from llmsched.core.engine_api import SamplingParams
from llmsched.core.prefix_cache import token_block_ids
from llmsched.policies import make_scheduler
from llmsched.policies.spec import SchedulerSpec
from llmsched.sim.simulator import simulate_trace
from llmsched.sim.virtual import VirtualEngine


def _trace(n=150, seed=1):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(
        arrival_s=np.cumsum(rng.exponential(0.02, n)),
        prompt=rng.integers(1, 600, n),
        output=rng.integers(1, 120, n),
        tag=None,
    )


def _replay(ve: VirtualEngine, t):
    """Feed a trace to a non-realtime VirtualEngine as the simulator would."""
    n = len(t.prompt)
    arr = t.arrival_s
    ttft, e2e = {}, {}
    i = 0
    while i < n or ve.has_unfinished_requests():
        if not ve.has_unfinished_requests():
            ve.advance_to(arr[i])
        while i < n and int(round(arr[i] * 1e9)) <= ve.now_ns():
            ve.add_request(
                str(i), range(int(t.prompt[i])), SamplingParams(max_tokens=int(t.output[i])), arrival_time=float(arr[i])
            )
            i += 1
        for o in ve.step():
            k = int(o.request_id)
            at = int(round(arr[k] * 1e9))
            if o.output_tokens == 1:
                ttft[k] = ve.now_ns() - at
            if o.finished:
                assert o.output_tokens == t.output[k] and o.finish_reason == "length"
                e2e[k] = ve.now_ns() - at
    return np.array([ttft[k] for k in range(n)]), np.array([e2e[k] for k in range(n)])


@pytest.mark.parametrize("policy", ["sarathi", "orca", "vllm", "fastertransformer", "kfcfs"])
@pytest.mark.parametrize("kv", [None, 3000])
def test_matches_simulator_step_by_step(policy, kv):
    t = _trace()
    mk = lambda: make_scheduler(policy, b_max=256, kv_capacity=kv)  # noqa: E731
    ref = simulate_trace(t, mk(), make_cost_model("paper"), fast=False)
    ve = VirtualEngine(mk(), "paper", realtime=False)
    ttft, e2e = _replay(ve, t)
    assert np.array_equal(ttft, ref.ttft_ns)
    assert np.array_equal(e2e, ref.e2e_ns)
    s = ve.stats()
    assert s["kv_used_tokens"] == 0 and s["running"] == 0 and s["unfinished"] == 0
    assert s["preemptions"] == int(ref.preemptions.sum())
    assert s["generation_tokens_total"] == int(t.output.sum())


@pytest.mark.parametrize("admission", ["spf", "twp", "dynamicbatch"])
@pytest.mark.parametrize("policy", ["sarathi", "vllm"])
@pytest.mark.parametrize("kv, max_running", [(None, None), (3000, None), (3000, 6)])
def test_admissions_match_the_simulator_step_by_step(admission, policy, kv, max_running):
    """Every admission policy, closed-loop ones included, with KV pressure and a running
    cap: the virtual GPU takes the simulator's steps (TWP and DynamicBatch see the same
    feedback, so they make the same plans)."""
    t = _trace()
    mk = lambda: make_scheduler(policy, admission=admission, b_max=256, kv_capacity=kv, max_running=max_running)  # noqa: E731
    ref = simulate_trace(t, mk(), make_cost_model("paper"), fast=False)
    ve = VirtualEngine(mk(), "paper", realtime=False)
    ttft, e2e = _replay(ve, t)
    assert np.array_equal(ttft, ref.ttft_ns)
    assert np.array_equal(e2e, ref.e2e_ns)
    assert ve.stats()["preemptions"] == int(ref.preemptions.sum())


@pytest.mark.parametrize("policy", ["sarathi", "vllm"])
@pytest.mark.parametrize("kv", [None, 3000])
def test_matches_simulator_with_prefix_caching(policy, kv):
    # the replay's prompts are range(n): every two share their shorter one's full blocks
    t = _trace()
    t.blocks = [token_block_ids(range(int(p)), 16) for p in t.prompt]
    spec = SchedulerSpec(policy=policy, b_max=256, kv_capacity=kv, prefix_caching=True, block_size=16)
    ref = simulate_trace(t, spec.build(), make_cost_model("paper"), fast=True)
    ve = VirtualEngine(spec.build(), "paper", realtime=False)
    ttft, e2e = _replay(ve, t)
    assert np.array_equal(ttft, ref.ttft_ns) and np.array_equal(e2e, ref.e2e_ns)
    s = ve.stats()
    assert s["prefix_cache"] == ref.prefix and ref.prefix["token_hit_rate"] > 0.5
    assert s["kv_used_tokens"] == 0 and s["running"] == 0


def test_realtime_clock_follows_cost_model():
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:10")
    for i in range(4):
        ve.add_request(f"r{i}", range(32), SamplingParams(max_tokens=6))
    t0 = time.monotonic()
    steps = 0
    while ve.has_unfinished_requests():
        ve.step()
        steps += 1
    wall = time.monotonic() - t0
    # 128 prompt tokens at 64 per step, decodes first (Sarathi): r0, r1 get token 1 in
    # step 1, r2 in step 2, r3 in step 3; the last of its 6 tokens comes in step 8
    assert steps == 8
    assert 0.079 <= wall < 0.079 + 0.2, wall
    assert ve.stats()["busy_s"] == pytest.approx(0.08)


class _FakeClock:
    """time for a VirtualEngine: sleep() advances it; a hiccup adds host time."""

    def __init__(self):
        self.t = 1000.0
        self.hiccup_at = {}
        self.sleeps = 0

    def clock(self):
        return self.t

    def sleep(self, s):
        self.sleeps += 1
        self.t += s + self.hiccup_at.get(self.sleeps, 0.0)


@pytest.mark.parametrize("max_debt, lag, late", [(0.05, 0.0, 2), (0.0, 0.03, 0), (0.01, 0.02, 0)])
def test_catches_up_after_a_host_hiccup(max_debt, lag, late):
    fc = _FakeClock()
    fc.hiccup_at = {3: 0.03}  # the host wakes 30 ms late after the 3rd step
    ve = VirtualEngine(
        make_scheduler("sarathi", b_max=64), "const:10", clock=fc.clock, sleep=fc.sleep, max_debt_s=max_debt
    )
    ve.add_request("a", range(8), SamplingParams(max_tokens=10))
    t0 = fc.t
    ends = []
    while ve.has_unfinished_requests():
        ve.step()
        ends.append(round(fc.t - t0, 6))
    # 10 steps of 10 ms. With a 50 ms debt limit the schedule is kept (steps 4 and 5 end
    # late, then it is caught up): the run ends at 100 ms. Without catch-up the 30 ms are
    # lost; with a 10 ms limit, 20 of them.
    assert ends[-1] == pytest.approx(0.1 + lag)
    s = ve.stats()
    assert s["lag_s"] == pytest.approx(lag)
    assert s["late_steps"] == late
    assert s["max_late_s"] == pytest.approx(0.02 if late else 0.0)


def test_abort_frees_kv_and_stop_conditions():
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64, kv_capacity=1000), "const:1", realtime=False)
    ve.add_request("a", range(40), SamplingParams(max_tokens=50))
    ve.add_request("b", range(10), SamplingParams(max_tokens=50, stop=["tok tok tok"]))
    ve.add_request("c", range(10), SamplingParams(max_tokens=50, stop_token_ids=[0]))
    outs = ve.step()
    assert {o.request_id for o in outs} == {"a", "b", "c"}
    assert [o.finished for o in outs if o.request_id == "c"] == [True]
    assert ve.stats()["kv_used_tokens"] > 0
    ve.step()
    outs = ve.step()
    b = [o for o in outs if o.request_id == "b"]
    assert b[0].finished and b[0].finish_reason == "stop" and b[0].output_tokens == 3
    ve.abort_request("a")
    ve.abort_request("a")  # idempotent
    ve.abort_request("zzz")  # unknown: ignored
    s = ve.stats()
    assert s["kv_used_tokens"] == 0 and s["running"] == 0 and not ve.has_unfinished_requests()
    assert ve.step() == []


def test_rejects_requests_that_cannot_fit():
    ve = VirtualEngine(make_scheduler("sarathi", kv_capacity=100), "const:1", max_model_len=80)
    with pytest.raises(ConfigError, match="maximum context length"):
        ve.add_request("x", range(70), SamplingParams(max_tokens=20))
    ve2 = VirtualEngine(make_scheduler("sarathi", kv_capacity=100), "const:1")
    with pytest.raises(ConfigError, match="KV"):
        ve2.add_request("x", range(90), SamplingParams(max_tokens=20))
    with pytest.raises(ConfigError):
        ve2.add_request("x", [], SamplingParams(max_tokens=2))
    ve2.add_request("x", range(5), SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="already"):
        ve2.add_request("x", range(5), SamplingParams(max_tokens=2))


def test_abort_of_the_last_request_leaves_the_gpu_idle():
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:1", realtime=False)
    ve.add_request("a", range(10), SamplingParams(max_tokens=50))
    for _ in range(3):
        ve.step()
    ve.abort_request("a")
    ve.advance_to(10.0)  # idle for ~10 s: the next arrival is not late
    ve.add_request("b", range(10), SamplingParams(max_tokens=5))
    while ve.has_unfinished_requests():
        ve.step()
    s = ve.stats()
    assert s["lag_s"] == 0 and s["late_steps"] == 0
    assert ve.now_ns() == 10 * 10**9 + 5 * 10**6  # 5 steps of 1 ms from t = 10 s
    # an abort that leaves work keeps the schedule back to back
    ve.add_request("c", range(10), SamplingParams(max_tokens=50))
    ve.add_request("d", range(10), SamplingParams(max_tokens=50))
    ve.step()
    ve.abort_request("c")
    t = ve.now_ns()
    ve.step()
    assert ve.now_ns() == t + 10**6 and ve.stats()["lag_s"] == 0


def _run_one(**params):
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:1", realtime=False)
    ve.add_request("a", range(3), SamplingParams(**params))
    outs = []
    while ve.has_unfinished_requests():
        outs += ve.step()
    return outs


def test_stop_strings_cut_text_as_the_engine_does():
    outs = _run_one(max_tokens=5, stop="tok tok")
    last = outs[-1]
    assert last.finished and last.finish_reason == "stop" and last.stop_reason == "tok tok"
    assert "".join(o.new_text for o in outs) == " " and last.output_tokens == 2
    # held back while it could start a stop string; every piece adds up to the final text
    outs = _run_one(max_tokens=6, stop=["zzzzz"])
    assert [o.new_text for o in outs] == ["", " tok", " tok", " tok", " tok", " tok tok"]
    assert outs[-1].finish_reason == "length" and outs[-1].stop_reason is None
    # several stop strings: the earliest match wins; a stop string on the last token: "stop"
    outs = _run_one(max_tokens=3, stop=["k t", " to"])
    assert "".join(o.new_text for o in outs) == "" and outs[-1].stop_reason == " to"
    outs = _run_one(max_tokens=2, stop=["tok tok"])
    assert outs[-1].finish_reason == "stop" and "".join(o.new_text for o in outs) == " "
    # a stop token: its text is left out
    outs = _run_one(max_tokens=5, stop_token_ids=[0])
    assert len(outs) == 1 and outs[0].new_text == "" and outs[0].stop_reason == 0
    assert outs[0].finish_reason == "stop"


def test_min_tokens_delays_stop_conditions():
    outs = _run_one(max_tokens=8, stop=["tok tok"], min_tokens=4)
    # as in vLLM, stop strings are looked for once more than min_tokens tokens exist: the
    # first match is the one token 5 completes (it may start in the first 4 tokens' text)
    assert outs[-1].output_tokens == 5 and outs[-1].stop_reason == "tok tok"
    assert "".join(o.new_text for o in outs) == " tok tok tok "
    outs = _run_one(max_tokens=8, stop_token_ids=[0], min_tokens=3)
    assert outs[-1].output_tokens == 4 and outs[-1].stop_reason == 0  # ids 1-3 cannot be a stop token
    assert "".join(o.new_text for o in outs) == " tok" * 3
    outs = _run_one(max_tokens=5, stop_token_ids=[0], min_tokens=5)
    assert outs[-1].output_tokens == 5 and outs[-1].finish_reason == "length"


def test_closed_loop_policy_sees_every_emitted_token_under_preemption():
    import collections

    from llmsched.policies import ADMISSION_POLICIES, AdmissionPolicy, register_admission_policy

    class Counting(AdmissionPolicy):
        name = "test-counting"
        closed_loop = True

        def __init__(self):
            self.tokens = collections.Counter()
            self.resumed = 0

        def observe(self, state, feedback):
            for r, n in feedback.emitted():
                self.tokens[r.payload.request_id] += n
            self.resumed += len(feedback.resumed)

    register_admission_policy("test-counting", Counting)
    try:
        sched = make_scheduler("vllm", admission="test-counting", b_max=256, kv_capacity=400)
    finally:
        ADMISSION_POLICIES.pop("test-counting", None)
    policy = sched.admission
    ve = VirtualEngine(sched, "paper", realtime=False)
    t = _trace(n=40, seed=3)
    produced = collections.Counter()
    stops = {}
    for i in range(40):
        ve.advance_to(float(t.arrival_s[i]) / 10)
        p = SamplingParams(max_tokens=int(t.output[i]) % 100 + 1, stop=["tok" * 30] if i % 3 else [])
        ve.add_request(str(i), range(int(t.prompt[i]) % 200 + 1), p, arrival_time=float(t.arrival_s[i]) / 10)
        stops[str(i)] = p.max_tokens
        for o in ve.step():
            produced[o.request_id] += len(o.new_token_ids)
    while ve.has_unfinished_requests():
        for o in ve.step():
            produced[o.request_id] += len(o.new_token_ids)
    assert ve.stats()["preemptions"] > 0
    assert produced == stops
    assert policy.tokens == produced
    assert policy.resumed > 0


def test_interrupt_ends_the_wait_for_a_long_step_at_once():
    """A server stopping at once (a second signal) interrupts the virtual GPU's wait for
    the current step's end: with a 4-s step it waited the step out (the shutdown's join
    gave up after 5 s)."""
    import threading

    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:4000")
    ve.add_request("a", range(8), SamplingParams(max_tokens=4))
    worker = threading.Thread(target=ve.step)
    t0 = time.monotonic()
    worker.start()
    time.sleep(0.2)
    ve.interrupt()
    worker.join(timeout=3)
    assert not worker.is_alive() and time.monotonic() - t0 < 2
