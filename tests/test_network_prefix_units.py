"""A caching server's verdicts in a network judge its backlog in the backlog's units: the
backlog counts a waiting call's whole prompt (its cache hits leave it only at
admission), so a saturated queue drains gross / work backlog tokens per token of work,
and the threshold's capacity is scaled by that, as one server's verdict scales it
(docs/stability.md). Before, a replica's, a pool's and the network's thresholds were 2% of
an unscaled capacity: 969.7 tokens/s for a two-replica pool whose hits saved 62% of its
work, where its backlog's units make it 2,557."""

import numpy as np
import pytest

from llmsched.sim import network_result
from llmsched.sim.network_result import _replica_fill_capacity, simulate_network

EPS = 0.02  # (stability_verdict's default)


def spec(caching: bool) -> dict:
    """A two-replica pool (Sarathi, unlimited KV) whose jobs share a 2,048-token system
    prompt: with caching most of each prompt is a hit."""
    server = {"policy": "sarathi", "b_max": 512, "replicas": 2, "prefix_caching": caching, "block_size": 16}
    call = {"call": {"server": "s", "prompt": "const:100", "output": "const:50"}}
    job = {"arrival": {"process": "poisson", "rate": 4}, "route": [call], "system_prompt": 2048}
    return {"servers": {"s": server}, "jobs": {"A": job}, "num_jobs": 600, "seed": 1}


def units(res, replica: int | None = None) -> float:
    """gross / work over the admitted calls (of one replica, or of the pool), counted here
    from the calls' columns: prompt + output - 1 less any handed-over context, over that
    less the hits at first admission."""
    st = res.stats
    col = {k: np.frombuffer(getattr(st, k), dtype=np.int64) for k in ("call_prompt", "call_cached", "call_output")}
    rep = np.frombuffer(st.call_replica, dtype=np.int64)
    sel = np.frombuffer(st.call_queue, dtype=np.int64) >= 0
    reps = range(len(st.replicas)) if replica is None else [replica]
    if replica is not None:
        sel &= rep == replica
    gross = float((col["call_prompt"] - col["call_cached"] + col["call_output"] - 1)[sel].sum())
    hits = sum(res.replicas()[i].stats.prefix["first_admission_hit_tokens"] for i in reps)
    return gross / (gross - hits)


def judged(monkeypatch, caching: bool):
    """The run, and the capacity each `stability_verdict` call of its verdicts took."""
    seen = []
    real = network_result.stability_verdict

    def spy(*args, **kw):
        seen.append(kw["capacity"])
        return real(*args, **kw)

    monkeypatch.setattr(network_result, "stability_verdict", spy)
    res = simulate_network(spec(caching))
    res.summary  # every verdict: the replicas', the pool's, the network's
    return res, seen


def test_a_caching_pools_thresholds_are_in_its_backlogs_units(monkeypatch):
    res, seen = judged(monkeypatch, caching=True)
    load = res.traffic.server("s")
    share = res.summary["servers"]["s"]["prefix_saved_work_share"]
    assert share > 0.5  # (the system prompt is a hit for nearly every call)
    pool = units(res)
    assert pool > 2
    # the replicas', each in its own calls' units
    for i in range(2):
        assert seen[i] == pytest.approx(_replica_fill_capacity(load) * units(res, i), rel=1e-12)
    s = res.summary
    assert s["servers"]["s"]["pool_verdict"]["threshold_tokens_per_s"] == pytest.approx(
        EPS * load.fill_capacity * pool, rel=1e-12
    )
    # the network's work: the bottleneck's units (here the pool)
    assert s["network_work_verdict"]["threshold_tokens_per_s"] == pytest.approx(
        EPS * load.fill_capacity * pool, rel=1e-12
    )


def test_without_caching_the_thresholds_are_unscaled(monkeypatch):
    res, seen = judged(monkeypatch, caching=False)
    load = res.traffic.server("s")
    assert seen[:2] == [_replica_fill_capacity(load)] * 2
    assert res.summary["servers"]["s"]["pool_verdict"]["threshold_tokens_per_s"] == EPS * load.fill_capacity
    assert res.summary["network_work_verdict"]["threshold_tokens_per_s"] == EPS * load.fill_capacity
