"""The network simulator's per-replica time series: the fast path (batches of identical
steps) and the step-by-step path record the same samples, and a call delivered during a
step counts from the next step boundary on (the single-server simulator's rule)."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.sim.network import ROUTERS, run_network
from llmsched.workload.network import NetworkSpec


def _series(stats):
    return [(r["name"], r["sim"].series.cols) for r in stats.replicas]


def _results(stats):
    return (
        bytes(stats.job_finish),
        bytes(stats.call_e2e),
        bytes(stats.call_ttft),
        bytes(stats.call_queue),
        bytes(stats.call_replica),
        [(r["name"], r["sim"].steps, r["sim"].busy, dict(r["sim"].batch_hist)) for r in stats.replicas],
    )


def _same_both_ways(d: dict, **kw):
    fast = run_network(NetworkSpec.from_dict(d), fast=True, **kw)
    exact = run_network(NetworkSpec.from_dict(d), fast=False, **kw)
    assert _results(fast) == _results(exact)
    sf, se = _series(fast), _series(exact)
    assert [n for n, _ in sf] == [n for n, _ in se]
    for (name, a), (_, b) in zip(sf, se):
        assert a.keys() == b.keys(), name
        for col in a:
            assert a[col] == b[col], f"{name}: {col}"
    assert sum(len(c["time_s"]) for _, c in sf) > 0
    return fast


def _example(name: str, num_jobs: int, **changes) -> dict:
    d = NetworkSpec.from_yaml(f"examples/networks/{name}.yaml").to_dict()
    d["num_jobs"] = num_jobs
    d.update(changes)
    return d


def _replicas(router: str, **server) -> dict:
    return {
        "servers": {
            "s": {"policy": "sarathi", "b_max": 256, "cost_model": "paper", "replicas": 3, "router": router, **server}
        },
        "jobs": {
            "chat": {
                "arrival": {"process": "poisson", "rate": 40.0},
                "route": [
                    {"call": {"server": "s", "prompt": "geometric:300", "output": "geometric:80"}},
                    {"call": {"server": "s", "prompt": "geometric:40", "output": "geometric:60", "context": True}},
                ],
            }
        },
        "num_jobs": 300,
        "seed": 3,
    }


@pytest.mark.parametrize("router", ROUTERS)
def test_replicas_series_fast_equals_exact(router):
    _same_both_ways(_replicas(router))


def test_replicas_series_fast_equals_exact_with_cached_context_and_kv_limit():
    d = _replicas("least-tokens", kv_capacity=4000)
    d["jobs"]["chat"]["route"][1]["call"]["cached"] = True
    _same_both_ways(d)


def test_agent_dag_series_fast_equals_exact():
    _same_both_ways(_example("agent_dag", 300))


def test_fork_join_series_fast_equals_exact():
    _same_both_ways(_example("fork_join", 200))


def test_backpressure_series_fast_equals_exact():
    d = _example("rybko_stolyar", 300, control="backpressure")
    for srv in d["servers"].values():
        srv["priority"] = []
    _same_both_ways(d)


def test_priority_series_fast_equals_exact():
    _same_both_ways(_example("rybko_stolyar", 300))


def test_prefix_caching_series_fast_equals_exact():
    fast = _same_both_ways(_example("agent_loop", 200))
    cols = fast.replicas[0]["sim"].series.cols
    assert "prefix_hit_tokens" in cols and cols["prefix_hit_tokens"][-1] > 0


def test_twp_admission_series_fast_equals_exact():
    d = _replicas("jsq", admission="twp")
    _same_both_ways(d)
    d = _example("agent_dag", 200)
    for srv in d["servers"].values():
        srv["admission"] = "twp"
    _same_both_ways(d)


def test_a_fixed_sampling_interval_keeps_fast_equal_to_exact():
    _same_both_ways(_example("tandem", 200), sample_interval_s=0.003)


def test_a_call_delivered_mid_step_counts_from_the_next_boundary():
    """One replica, 10 ms steps: a call of 16 + 200 tokens runs; a second arrives 50.5 steps
    later, in the middle of a step. The samples of that step (and of every earlier one) do
    not count it; from the next boundary it runs (admitted there) and its work is backlog."""
    d = {
        "servers": {"s": {"policy": "sarathi", "b_max": 512, "cost_model": "const:10"}},
        "jobs": {
            "j": {
                "arrival": {"process": "deterministic", "rate": 1 / 0.505},
                "route": [{"call": {"server": "s", "prompt": "const:16", "output": "const:200"}}],
            }
        },
        "num_jobs": 2,
        "seed": 0,
    }
    stats = _same_both_ways(d, sample_interval_s=0.001)
    arr = np.frombuffer(stats.call_arrival, dtype=np.int64)
    assert arr[1] - arr[0] == 505_000_000
    c = stats.replicas[0]["sim"].series.cols
    t = np.round((np.asarray(c["time_s"]) - arr[0] / 1e9) * 1000).astype(int)  # ms since the first call
    waiting, running, backlog = (np.asarray(c[k]) for k in ("waiting_requests", "running_requests", "backlog_tokens"))
    work = 16 + 200 - 1
    before = (t >= 0) & (t < 510)  # up to the boundary after the second call's arrival (505 ms)
    assert before.sum() == 510
    assert (waiting[before] == 0).all() and (running[before] == 1).all()
    # the first call's work left: its prefill (step 0), then a token a step
    steps_done = t[before] // 10
    assert (backlog[before] == work - np.where(steps_done > 0, 16 + steps_done - 1, 0)).all()
    after = (t >= 510) & (t < 520)
    assert after.sum() == 10
    assert (running[after] == 2).all() and (waiting[after] == 0).all()
    assert (backlog[after] == (work - 16 - 50) + work).all()


def test_a_batch_that_never_read_the_queue_runs_past_a_delivery(monkeypatch):
    """With a budget of one token, a decoding call's plan spends it before admission and
    never reads the waiting queue (`StepPlan.ignores_waiting`): a call delivered mid-step
    does not cut its batch. The series still counts that call from the next boundary on,
    waiting until the first call finishes, as the step-by-step path does."""
    from llmsched.sim.server import ServerSim

    cuts = []
    truncate = ServerSim.truncate
    monkeypatch.setattr(ServerSim, "truncate", lambda self, t: cuts.append(t) or truncate(self, t))
    d = {
        "servers": {"s": {"policy": "sarathi", "b_max": 1, "cost_model": "const:10"}},
        "jobs": {
            "j": {
                "arrival": {"process": "deterministic", "rate": 1 / 0.505},
                "route": [{"call": {"server": "s", "prompt": "const:1", "output": "const:100"}}],
            }
        },
        "num_jobs": 2,
        "seed": 0,
    }
    fast = run_network(NetworkSpec.from_dict(d), fast=True, sample_interval_s=0.001)
    assert cuts == []
    exact = run_network(NetworkSpec.from_dict(d), fast=False, sample_interval_s=0.001)
    assert _results(fast) == _results(exact)
    assert fast.replicas[0]["sim"].series.cols == exact.replicas[0]["sim"].series.cols
    arr = np.frombuffer(fast.call_arrival, dtype=np.int64)
    c = fast.replicas[0]["sim"].series.cols
    t = np.round((np.asarray(c["time_s"]) - arr[0] / 1e9) * 1000).astype(int)
    waiting, backlog = np.asarray(c["waiting_requests"]), np.asarray(c["backlog_tokens"])
    # the first call: 1 prefill step, then 99 decode steps (ends at 1000 ms)
    before = (t >= 0) & (t < 510)
    assert (waiting[before] == 0).all()
    assert (backlog[before] == 100 - t[before] // 10).all()
    during = (t >= 510) & (t < 1000)
    assert during.sum() == 490
    assert (waiting[during] == 1).all()
    assert (backlog[during] == 100 - t[during] // 10 + 100).all()


def test_a_cached_call_on_a_prefix_caching_server_keeps_fast_equal_to_exact():
    # A call whose resent context arrives computed (`cached: true`) may already hold the
    # block the head of the queue waits for: the plan lasts one step (it once made a batch
    # of no steps, counting a resumed decoder's gap twice).
    def call(server, prompt, context, cached, cls):
        spec = {"server": server, "prompt": prompt, "output": "uniform:1,2", "context": context, "cached": cached}
        return {"call": {**spec, "class": cls}}

    d = {
        "servers": {
            "s0": {
                **{"policy": "sarathi", "b_max": 32, "cost_model": "paper", "replicas": 1, "router": "random"},
                **{"prefix_caching": True, "block_size": 4},
            }
        },
        "jobs": {
            "j0": {
                "arrival": {"process": "poisson", "rate": 0.5},
                "route": [
                    call("s0", "uniform:1,2", False, False, "c0"),
                    call("s0", "uniform:1,2", False, False, "c1"),
                    {
                        "fork": [
                            [call("s0", "uniform:1,51", True, True, "c2")],
                            [call("s0", "uniform:1,2", True, False, "c3")],
                        ]
                    },
                ],
            }
        },
        "num_jobs": 5,
        "seed": 0,
    }
    fast = _same_both_ways(d)
    exact = run_network(NetworkSpec.from_dict(d), fast=False)
    (a,), (b,) = fast.replicas, exact.replicas
    assert (a["sim"].itl.count, a["sim"].itl.total) == (b["sim"].itl.count, b["sim"].itl.total)
    assert a["sim"].itl.count > 0
