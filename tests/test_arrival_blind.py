"""Plans that ignore the waiting queue (`StepPlan.ignores_waiting`): which plans are marked,
and that running such a batch past arrivals gives exactly what cutting it at each arrival
gives (the simulator's results, steps and time series; the serverless runtime's)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched.core import make_cost_model
from llmsched.core.request import Request
from llmsched.policies import make_scheduler
from llmsched.policies.base import Scheduler
from llmsched.sim.serverless import run_serverless
from llmsched.sim.simulator import simulate_trace
from llmsched.workload.serverless import ServerlessRequests, load_serverless


def plan_of(policy, admission="fcfs", waiting=(), prefilling=(), **limits):
    """The plan of `policy` for a state with these running prefills (one step done each)
    and waiting prompts."""
    sched = make_scheduler(policy, admission=admission, **limits)
    sched.bind_cost_model(make_cost_model("paper"))
    state = sched.new_state()
    rid = 0
    for prompt in prefilling:
        state.add(Request(rid, 0, prompt, 4))
        rid += 1
        first = sched.plan(state)  # admits it with a first chunk
        state.begin_step(first, 0)
        state.end_step(first, 1)
    for prompt in waiting:
        state.add(Request(rid, 1, prompt, 4))
        rid += 1
    return sched.plan(state)


def test_a_full_budget_before_admission_ignores_the_queue():
    # a running prefill of 1000 tokens takes the whole budget of 64: the queue is never read
    assert plan_of("sarathi", waiting=[10], prefilling=[1000], b_max=64).ignores_waiting
    assert plan_of("orca", waiting=[10], prefilling=[1000], b_max=64).ignores_waiting
    assert plan_of("fastertransformer", waiting=[10], prefilling=[1000], b_max=64).ignores_waiting


def test_budget_left_reads_the_queue():
    # a short running prefill leaves budget: the queue (empty or not) decides the plan
    assert not plan_of("sarathi", prefilling=[10], b_max=64).ignores_waiting
    assert not plan_of("sarathi", waiting=[10], prefilling=[10], b_max=64).ignores_waiting
    assert not plan_of("sarathi", waiting=[10], b_max=64).ignores_waiting


@pytest.mark.parametrize("policy", ["vllm", "kfcfs", "adaptive"])
def test_policies_that_read_the_queue_themselves_never_ignore_it(policy):
    assert not plan_of(policy, waiting=[10], prefilling=[1000], b_max=64).ignores_waiting


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_admission_limits_may_read_the_queue(admission):
    # TWP's and DynamicBatch's limits change with the queue and the feedback
    assert not plan_of("sarathi", admission=admission, waiting=[10], prefilling=[1000], b_max=64).ignores_waiting


def test_a_priority_order_still_ignores_the_queue_when_the_budget_is_full():
    assert plan_of("sarathi", admission="spf", waiting=[10], prefilling=[1000], b_max=64).ignores_waiting


def _cutting(sched):
    """The same scheduler, with every plan marked as reading the queue (arrivals cut batches)."""
    sched._marks_blind = False
    return sched


workloads = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=40
).map(lambda rows: sorted(rows))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=workloads,
    policy=st.sampled_from(["sarathi", "orca", "fastertransformer"]),
    admission=st.sampled_from(["fcfs", "spf"]),
    b_max=st.sampled_from([16, 64, 256]),
    kv=st.sampled_from([None, 400, 2000]),
    cost=st.sampled_from(["paper:c=1,a=2,b0=16", "profile"]),
    interval=st.sampled_from([0.001, 0.013]),
)
def test_running_past_arrivals_equals_cutting_at_them(rows, policy, admission, b_max, kv, cost, interval):
    tr = trace(rows)
    if kv is not None and int(max(tr.prompt + tr.output)) > kv:
        kv = None

    def run(cut: bool):
        sched = make_scheduler(policy, admission=admission, b_max=b_max, kv_capacity=kv)
        if cut:
            _cutting(sched)
        model = make_cost_model(cost)
        sched.bind_cost_model(model)
        buf = io.StringIO()
        stats = simulate_trace(tr, sched, model, steps_file=buf, sample_interval_s=interval)
        return stats, buf.getvalue()

    (a, steps_a), (b, steps_b) = run(False), run(True)
    assert steps_a == steps_b
    for f in ("ttft_ns", "e2e_ns", "queue_ns", "preemptions"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.timeseries == b.timeseries
    for f in ("steps", "busy_ns", "end_ns", "load_hist", "batch_hist"):
        assert getattr(a, f) == getattr(b, f), f
    assert (a.itl.count, a.itl.total, a.itl.total_sq) == (b.itl.count, b.itl.total, b.itl.total_sq)


def planned(sched, rows) -> list:
    """The plans `sched` makes simulating `rows` (one per batch)."""
    plans = []
    inner = sched.plan

    def recorded(state):
        plans.append(inner(state))
        return plans[-1]

    sched.plan = recorded
    simulate_trace(trace(rows), sched, make_cost_model("paper:c=1,a=2,b0=16"))
    return plans


def test_the_simulator_runs_fewer_batches_past_arrivals():
    # one long prompt fills every step's budget while short requests keep arriving
    rows = [(0.0, 4000, 5)] + [(0.001 * k, 20, 3) for k in range(1, 60)]
    marked = planned(make_scheduler("sarathi", b_max=64), rows)
    cut = planned(_cutting(make_scheduler("sarathi", b_max=64)), rows)
    assert len(marked) < len(cut)


def test_serverless_instances_run_past_arrivals_unchanged(monkeypatch):
    cfg = {
        "cluster": {
            "remote_bandwidth_gbps": 1,
            "nodes": [{"count": 1, "gpus": 2, "gpu_memory_gb": 80, "dram_gb": 50, "ssd_gb": 100}],
        },
        "models": {"m": {"weights_gb": 10, "cost_model": "profile"}},
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"init_s": 0, "keep_alive_s": "never", "scale_out_tokens": 3000},
    }
    rng = np.random.default_rng(3)
    n = 300
    reqs = ServerlessRequests(
        np.sort(rng.uniform(0, 20, n)),
        rng.integers(50, 3000, n),
        rng.integers(1, 200, n),
        np.zeros(n, dtype=np.int64),
        ["m"],
    )
    spec = load_serverless(cfg)
    marked = run_serverless(spec, requests=reqs)
    init = Scheduler.__init__

    def cutting_init(self, *a, **k):
        init(self, *a, **k)
        self._marks_blind = False

    monkeypatch.setattr(Scheduler, "__init__", cutting_init)
    cut = run_serverless(spec, requests=reqs)
    for f in ("queue_ns", "ttft_ns", "e2e_ns", "tokens", "instance", "cold"):
        assert np.array_equal(getattr(marked, f), getattr(cut, f)), f
    assert marked.steps == cut.steps
    assert marked.end_ns == cut.end_ns
    assert (marked.itl.count, marked.itl.total, marked.itl.total_sq) == (cut.itl.count, cut.itl.total, cut.itl.total_sq)


def test_an_admission_that_spends_the_budget_on_part_of_its_prompt_repeats():
    plan = plan_of("sarathi", waiting=[1000, 10], b_max=64)
    assert [n for _, n in plan.prefill] == [64]
    assert plan.repeats_admission and plan.ignores_waiting
    # the whole prompt fits: its prefill completes, the next plan differs
    assert not plan_of("sarathi", waiting=[40, 10], b_max=64).repeats_admission
    # two admissions: the second is not the running prefill of the next step alone
    assert not plan_of("sarathi", waiting=[30, 1000], b_max=64).repeats_admission
    # an admission policy whose limits move with the queue: no
    assert not plan_of("sarathi", admission="dynamicbatch", waiting=[1000], b_max=64).repeats_admission


def test_an_admitted_prompt_runs_its_chunks_in_one_batch():
    # 640 prompt tokens at 64 a step: one batch of 10 steps (the admission, then 9 chunks)
    assert len(planned(make_scheduler("sarathi", b_max=64), [(0.0, 640, 1)])) == 1
