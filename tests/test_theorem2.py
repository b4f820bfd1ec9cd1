"""Theorem 2 sanity checks with the paper cost model (paper 1, "Throughput-optimal scheduling
for LLM inference and AI agents"; docs/stability.md "Work and capacity").

b_max = 128: t(b_max) = 11.28 + 35.47 = 46.75 ms, token capacity 2738 tokens/s. Prompts
geometric(mean 60), outputs geometric(mean 30): work per request = 60 + 30 - 1 = 89
tokens, so lambda* = 30.8 requests/s.
"""

import numpy as np
import pytest

import llmsched
from llmsched.analysis.capacity import capacity
from llmsched.workload import WorkloadSpec, make_trace

B_MAX = 128
COST = "paper"
CAPACITY = B_MAX / (0.01128 + 0.03547)


def workload(load, n, seed=0):
    lam = load * CAPACITY / 89.0
    return make_trace(
        WorkloadSpec(
            arrival="poisson", rate=lam, prompt="geometric:60", output="geometric:30", num_requests=n, seed=seed
        )
    )


def backlog_slope(result, t_from, t_to):
    ts = result.timeseries
    keep = (ts["time_s"] >= t_from) & (ts["time_s"] <= t_to)
    return np.polyfit(ts["time_s"][keep], ts["backlog_tokens"][keep], 1)[0]


def test_capacity_matches_hand_computation():
    rep = capacity(COST, B_MAX, 60, 30)
    assert rep.token_capacity == pytest.approx(CAPACITY)
    assert rep.critical_rate == pytest.approx(CAPACITY / 89)


@pytest.mark.parametrize("policy", ["sarathi", "orca", "kfcfs"])
def test_work_conserving_policies_are_stable_at_80_percent(policy):
    tr = workload(0.8, 30_000)
    r = llmsched.simulate(trace=tr, policy=policy, b_max=B_MAX, cost_model=COST)
    s = r.summary
    assert s["completed"] == len(tr)
    assert s["stable"] is True
    ts = r.timeseries
    during = ts["time_s"] <= tr.arrival_s[-1]
    # bounded: the backlog never exceeds a few seconds of capacity, and does not trend up
    assert ts["backlog_tokens"][during].max() < 20 * CAPACITY
    half = tr.arrival_s[-1] / 2
    assert abs(backlog_slope(r, half, tr.arrival_s[-1])) < 0.02 * CAPACITY


@pytest.mark.parametrize("policy", ["sarathi", "orca", "kfcfs", "vllm", "fastertransformer"])
def test_backlog_grows_at_the_predicted_rate_at_120_percent(policy):
    tr = workload(1.2, 15_000, seed=1)
    work = tr.prompt + tr.output - 1
    offered = work.sum() / (tr.arrival_s[-1] - tr.arrival_s[0])
    predicted = offered - CAPACITY
    r = llmsched.simulate(trace=tr, policy=policy, b_max=B_MAX, cost_model=COST)
    assert r.summary["stable"] is False
    slope = backlog_slope(r, tr.arrival_s[-1] * 0.25, tr.arrival_s[-1])
    if policy in ("sarathi", "orca", "kfcfs"):
        assert slope == pytest.approx(predicted, rel=0.1)
    else:  # not work-conserving: at least as fast
        assert slope >= 0.9 * predicted
