"""Property tests over random workloads, policies and limits."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
from helpers import trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched.core import CostModel, make_cost_model
from llmsched.policies import BATCH_POLICIES, make_scheduler
from llmsched.sim.result import SimResult
from llmsched.sim.simulator import simulate_trace


class ContextCost(CostModel):
    """A cost model that depends on contexts and sampled rows, to exercise the general path."""

    name = "test-context"

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return (
            1e-3
            + 1e-5 * (prefill_tokens + decode_tokens)
            + 1e-6 * decode_context
            + 1e-8 * sum(c * ctx for c, ctx in chunks)
            + 1e-4 * sampled
        )


def checked(scheduler, violations):
    """Wrap `scheduler.plan` to check every plan against the state it was made from."""
    inner = scheduler.plan
    batch = scheduler.batch
    c = scheduler.constraints
    unlimited = c.k_max is None and c.kv_capacity is None and scheduler.admission.name == "fcfs"

    def plan(state):
        p = inner(state)
        b, k = p.tokens, p.batch_size
        if b > state.b_max:
            violations.append(f"b={b} > b_max")
        if c.k_max and k > c.k_max:
            violations.append(f"k={k} > k_max")
        if p.decode > state.n_decoding - sum(1 for r in p.preempt if r.phase == 2):
            violations.append("more decodes than decoders")
        freed = sum(state.footprint(r) for r in p.preempt)
        admitted = sum(r.prefill_target for r, _ in p.prefill if r.phase == 0)
        if state.kv_free + freed - admitted - p.decode < 0:
            violations.append("KV over capacity")
        for r, n in p.prefill:
            if n <= 0 or n > r.prefill_target - r.prefilled:
                violations.append(f"bad chunk {n} for {r}")
        if batch.work_conserving and unlimited:
            demand = (
                sum(r.prefill_target - r.prefilled for r in state.prefilling)
                + state.n_decoding
                + sum(r.prefill_target for r in state.waiting)
            )
            if b != min(state.b_max, demand):
                violations.append(f"{batch.name} not work-conserving: b={b}, demand={demand}")
        return p

    scheduler.plan = plan
    return scheduler


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.005, 0.02, 0.1]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps)
    return trace(list(zip(arrivals, prompts, outputs)))


@st.composite
def configs(draw, tr):
    need = int(max(tr.prompt + tr.output - 1))
    return dict(
        policy=draw(st.sampled_from(sorted(BATCH_POLICIES))),
        admission=draw(st.sampled_from(["fcfs", "spf", "twp"])),
        b_max=draw(st.integers(1, 64)),
        k_max=draw(st.one_of(st.none(), st.integers(1, 8))),
        kv_capacity=draw(st.one_of(st.none(), st.integers(need, need + 80))),
        max_running=draw(st.one_of(st.none(), st.integers(1, 6))),
    )


def simulate(tr, cfg, cost, fast, violations=None):
    sched = make_scheduler(**cfg)
    if violations is not None:
        checked(sched, violations)
    buf = io.StringIO()
    stats = simulate_trace(tr, sched, cost, fast=fast, steps_file=buf)
    return SimResult({}, stats, tr.arrival_s, tr.prompt, tr.output, None), buf.getvalue()


COSTS = [make_cost_model("const:10"), make_cost_model("paper:c=1,a=3,b0=4"), ContextCost()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_conservation_and_fast_path(data):
    tr = data.draw(workloads())
    cfg = data.draw(configs(tr))
    cost = data.draw(st.sampled_from(COSTS))
    violations: list[str] = []
    exact, exact_steps = simulate(tr, cfg, cost, fast=False, violations=violations)
    assert violations == []
    # no request lost, and every token after the first has one inter-token gap
    assert exact.summary["completed"] == len(tr.prompt)
    assert exact.summary["itl_count"] == int((tr.output - 1).sum())
    # tokens conserved, per request
    decodes, prefills, evicted = Counter(), Counter(), Counter()
    for line in exact_steps.splitlines():
        for e in line.split(",")[6].split():
            rid, work = e.split(":")
            if work == "d":
                decodes[int(rid)] += 1
            elif work == "x":
                evicted[int(rid)] += 1
            else:
                prefills[int(rid)] += int(work[1:])
    for i, (p, o) in enumerate(zip(tr.prompt, tr.output)):
        assert evicted[i] == exact.stats.preemptions[i]  # steps.csv names each preemption
        if exact.stats.preemptions[i] == 0:
            assert prefills[i] == p and decodes[i] == o - 1
        else:
            assert prefills[i] > p and decodes[i] < o
    # the fast path gives the same steps, times and metrics
    fast, fast_steps = simulate(tr, cfg, cost, fast=True)
    assert fast_steps == exact_steps
    assert np.array_equal(fast.stats.ttft_ns, exact.stats.ttft_ns)
    assert np.array_equal(fast.stats.e2e_ns, exact.stats.e2e_ns)
    sf, se = dict(fast.summary), dict(exact.summary)
    sf.pop("wall_s"), se.pop("wall_s")
    assert sf == se


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_same_input_same_result(data):
    tr = data.draw(workloads())
    cfg = data.draw(configs(tr))
    a, sa = simulate(tr, cfg, COSTS[2], fast=True)
    b, sb = simulate(tr, cfg, COSTS[2], fast=True)
    assert sa == sb and np.array_equal(a.stats.e2e_ns, b.stats.e2e_ns)


def test_fast_path_skips_steps_on_long_decodes():
    """The fast path must actually batch identical steps: count plan() calls."""
    tr = trace([(0.0, 10, 2000), (0.0, 10, 3000)])
    calls = {"fast": 0, "exact": 0}
    for mode in calls:
        sched = make_scheduler("sarathi", b_max=64)
        inner = sched.plan

        def counting(state, inner=inner, mode=mode):
            calls[mode] += 1
            return inner(state)

        sched.plan = counting
        simulate_trace(tr, sched, make_cost_model("paper"), fast=(mode == "fast"))
    assert calls["exact"] == 3000
    assert calls["fast"] <= 5


def test_fast_path_kfcfs_under_kv_pressure():
    """K-FCFS may serve fewer decoders than the planner keeps KV room for; the fast path
    must stop where the planner would preempt (a regression found in review)."""
    tr = trace([(0.0, 1, 10), (0.0, 100, 2), (0.0, 1, 10)])
    cfg = dict(policy="kfcfs", admission="spf", b_max=16, kv_capacity=104)
    (a, sa), (b, sb) = (simulate(tr, cfg, COSTS[0], fast=f) for f in (True, False))
    assert sa == sb and np.array_equal(a.stats.e2e_ns, b.stats.e2e_ns)
