"""A scheduler used for a second run gives what a fresh one gives: every driver resets the
policies (`Scheduler.reset`) before its first step, so that no window, cap, measured step
time or running mean of an earlier run carries over (request ids start at 0 again, so
adaptive's requests seen would never be counted again)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from llmsched.core import make_cost_model
from llmsched.core.constraints import Constraints
from llmsched.policies import (
    ADMISSION_POLICIES,
    BATCH_POLICIES,
    AdmissionPolicy,
    BatchPolicy,
    RunningCap,
    Scheduler,
    make_scheduler,
)
from llmsched.policies.sarathi import Sarathi
from llmsched.policies.twp import TWP
from llmsched.sim.simulator import simulate_trace
from llmsched.sim.virtual import VirtualEngine
from llmsched.workload import WorkloadSpec, make_trace


def _trace(rate, prompt, output, seed):
    spec = dict(arrival="poisson", rate=rate, prompt=prompt, output=output, num_requests=250, seed=seed)
    return make_trace(WorkloadSpec.from_dict(spec))


# two workloads unlike each other: long prompts and short outputs, then the reverse
A = dict(prompt="lognormal:mean=512,sigma=1.0,max=4000", output="geometric:mean=64,max=500", seed=0)
B = dict(prompt="lognormal:mean=100,sigma=0.5,max=400", output="geometric:mean=300,max=1000", seed=1)


def _run(trace, scheduler, cost):
    buf = io.StringIO()
    stats = simulate_trace(trace, scheduler, cost, steps_file=buf)
    return buf.getvalue(), stats


def _same(a, b):
    (steps_a, sa), (steps_b, sb) = a, b
    assert sa.steps == sb.steps and sa.end_ns == sb.end_ns
    assert np.array_equal(sa.ttft_ns, sb.ttft_ns) and np.array_equal(sa.e2e_ns, sb.e2e_ns)
    assert sa.load_hist == sb.load_hist
    assert steps_a == steps_b  # steps.csv, byte for byte


class _MeasuredTWP(TWP):
    """TWP as the engine runs it: no cost model bound, l_min and B_0 measured."""

    name = "twp-measured"

    def bind_cost_model(self, cost) -> None:
        pass


def _scheduler(kind, k_max=None):
    if kind == "twp-measured":
        return Scheduler(Sarathi(), _MeasuredTWP(), Constraints(b_max=512, k_max=k_max))
    if kind == "twp+cap":
        return make_scheduler("sarathi", "twp", k_max=k_max, max_running=24)
    if kind == "adaptive":
        return make_scheduler("adaptive", "fcfs", k_max=k_max)
    return make_scheduler("sarathi", kind, k_max=k_max)


# loads at which a carried state changed the second run before runs were reset (adaptive
# on the paper model at 4 req/s, each of the others at 8 req/s, and all on the H200 profile)
@pytest.mark.parametrize("cost_model,rate", [("paper", 4.0), ("paper", 8.0), ("profile:h200-llama-3-8b", 60.0)])
@pytest.mark.parametrize("kind", ["twp", "dynamicbatch", "adaptive", "twp+cap", "twp-measured"])
def test_a_reused_scheduler_runs_as_a_fresh_one(kind, cost_model, rate):
    cost = make_cost_model(cost_model)
    k_max = 16 if kind == "adaptive" else None
    first, second = _trace(rate, **A), _trace(rate, **B)
    reused = _scheduler(kind, k_max)
    _run(first, reused, cost)
    again = _run(second, reused, cost)
    fresh_scheduler = _scheduler(kind, k_max)
    fresh = _run(second, fresh_scheduler, cost)
    _same(again, fresh)
    assert reused.describe() == fresh_scheduler.describe()
    # the same trace twice through one scheduler: the same run twice
    _same(_run(second, reused, cost), fresh)


def test_the_first_run_leaves_state_the_second_would_have_used():
    """The test above compares runs: here the state itself, so that it cannot pass by a
    workload on which the carried state happens to change nothing."""
    cost = make_cost_model("paper")
    s = make_scheduler("sarathi", "twp")
    _run(_trace(8.0, **A), s, cost)
    assert s.admission.window is not None and s.admission.l_ewma is not None
    s.reset()
    assert s.admission.window is None and s.admission.l_ewma is None and s.admission.meter.prev_end is None
    d = make_scheduler("sarathi", "dynamicbatch")
    _run(_trace(8.0, **A), d, cost)
    assert d.admission.cap is not None
    d.reset()
    assert d.admission.cap is None and d.admission.l_ewma is None
    a = make_scheduler("adaptive", k_max=16)
    _run(_trace(8.0, **A), a, make_cost_model("profile:h200-llama-3-8b"))
    assert a.batch._seen_ids and a.batch._steps
    a.reset()
    assert not a.batch._seen_ids and a.batch._steps == 0 and a.batch._n == 0 and a.batch.chosen == {}


def test_the_virtual_gpu_starts_its_policies_afresh():
    s = make_scheduler("sarathi", "twp")
    _run(_trace(8.0, **A), s, make_cost_model("paper"))
    VirtualEngine(s, "paper", realtime=False)
    assert s.admission.window is None and s.admission.l_ewma is None


def test_every_built_in_policy_resets():
    """A policy that keeps state between steps defines `reset` (a new built-in one must
    too, or say here why it keeps nothing)."""
    stateless_batch = {"fastertransformer", "vllm", "orca", "sarathi", "kfcfs"}
    stateless_admission = {"fcfs", "spf"}
    for name, cls in BATCH_POLICIES.items():
        if name not in stateless_batch:
            assert cls.reset is not BatchPolicy.reset, name
    for name, factory in ADMISSION_POLICIES.items():
        if name not in stateless_admission and isinstance(factory, type):
            assert factory.reset is not AdmissionPolicy.reset, name


def test_the_running_cap_forwards_every_admission_hook():
    """`RunningCap` wraps another admission policy: every hook the contract has reaches it
    (it used to miss `went_idle`, so a capped TWP's ITL meter spanned an idle gap)."""
    hooks = [k for k, v in vars(AdmissionPolicy).items() if callable(v) and not k.startswith("_")]
    missing = [k for k in hooks if k not in vars(RunningCap)]
    assert not missing


def test_a_capped_twp_forgets_the_last_step_when_the_server_goes_idle():
    s = make_scheduler("sarathi", "twp", max_running=4)
    meter = s.admission.inner.meter
    meter.prev_end, meter.prev_emitted = 1.0, True
    s.went_idle()
    assert meter.prev_end is None and meter.prev_emitted is False


def test_a_capped_twp_resets():
    s = make_scheduler("sarathi", "twp", max_running=4)
    inner = s.admission.inner
    inner.window, inner.l_ewma = 300.0, 0.5
    s.reset()
    assert inner.window is None and inner.l_ewma is None


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_a_policy_run_capped_then_unwrapped_runs_uncapped(admission):
    """A running cap is its wrapper's: the same policy object run first under
    `RunningCap` (`max_running=4`) and then on its own runs as a fresh uncapped one (it
    used to keep the cap: TWP's B_max and DynamicBatch's C_max stayed 4)."""
    cost = make_cost_model("paper")
    trace = _trace(8.0, **A)
    capped = make_scheduler("sarathi", admission, max_running=4)
    _run(trace, capped, cost)
    policy = capped.admission.inner
    alone = Scheduler(Sarathi(), policy, Constraints(b_max=512))
    fresh = make_scheduler("sarathi", admission)
    _same(_run(trace, alone, cost), _run(trace, fresh, cost))
    assert alone.describe() == fresh.describe()
    # and wrapped again, the cap is back in force
    again = Scheduler(Sarathi(), RunningCap(policy, 4), Constraints(b_max=512))
    _same(_run(trace, again, cost), _run(trace, make_scheduler("sarathi", admission, max_running=4), cost))
    assert again.describe() == capped.describe()
