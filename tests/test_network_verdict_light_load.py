"""A lightly loaded single replica is not "inconclusive" for a rise of a fraction of a call.

At 4% of its capacity a replica's backlog is mostly empty, with a call's spike now and
then; the slope test finds such a series growing significantly (the interval above 0) by
chance in a few runs in a hundred, at a fraction of a token a second against a threshold
of 613, and called it "a slow drift or a warm-up not over". A pool of two or more replicas
falls back to its pool's summed backlog, which averages such chance out; a pool of one
has nothing to fall back to, so its server and the network were inconclusive too (seed 3
below: 0.308 tokens/s, interval [0.07, 0.546], a rise of 183 tokens at the top over the
judged 335 s, under one 405-token call). The network's verdicts now pass one call's mean
work as `stability_verdict`'s `min_rise`: a significant growth below the threshold whose
interval's top adds up to less than one call over the judged window is stable."""

import numpy as np
import pytest

from llmsched.core.errors import ConfigError
from llmsched.sim.network_result import simulate_network
from llmsched.theory import INCONCLUSIVE, STABLE, UNSTABLE, stability_verdict


def network(scale: float = 1.0) -> dict:
    server = {"policy": "sarathi", "b_max": 512, "cost_model": "profile:h200-llama-3-8b"}
    call = {"call": {"server": "s", "prompt": "geometric:300", "output": "geometric:100"}}
    job = {"arrival": {"process": "poisson", "rate": 3.0 * scale}, "route": [call]}
    return {"servers": {"s": server}, "jobs": {"A": job}, "num_jobs": 2000, "seed": 3}


def test_a_light_single_replicas_chance_rise_is_stable():
    s = simulate_network(network()).summary
    srv = s["servers"]["s"]
    assert srv["utilisation"] < 0.05
    rep = srv["replicas"]["s"]
    lo, hi = rep["backlog_growth_ci"]
    assert 0 < lo < hi < 1  # (significant, but a fraction of a token a second)
    assert rep["verdict"] == STABLE, rep["verdict_reason"]
    assert "under one call's work" in rep["verdict_reason"]
    assert srv["verdict"] == STABLE
    assert s["verdict"] == STABLE


def test_an_overloaded_single_replica_is_still_unstable():
    s = simulate_network(network(scale=30.0)).summary  # (117% of its capacity)
    assert s["servers"]["s"]["utilisation"] > 1.1
    assert s["servers"]["s"]["replicas"]["s"]["verdict"] == UNSTABLE
    assert s["verdict"] == UNSTABLE


def drift(rate: float, n: int = 400, seed: int = 0):
    """A level series with a small linear rise, sampled once a second."""
    t = np.arange(n, dtype=float)
    w = 100 + rate * t + np.random.default_rng(seed).normal(0, 1.0, n)
    return t, w


def test_min_rise_turns_only_a_rise_under_it_to_stable():
    t, w = drift(0.05)  # (a rise of about 10 tokens over the judged 200 s)
    plain = stability_verdict(t, w, capacity=10_000)
    assert plain.verdict == INCONCLUSIVE and plain.ci_low > 0
    v = stability_verdict(t, w, capacity=10_000, min_rise=400)
    assert v.verdict == STABLE and v.stable is True
    assert (v.growth_per_s, v.ci_low, v.ci_high) == (plain.growth_per_s, plain.ci_low, plain.ci_high)
    # a rise of more than one request over the window stays a slow drift
    assert stability_verdict(t, w, capacity=10_000, min_rise=5).verdict == INCONCLUSIVE
    # the guards on a stable call still apply: above the policy's limit it is a drain
    assert stability_verdict(t, w, capacity=10_000, min_rise=400, load=1.5).verdict == INCONCLUSIVE


def test_min_rise_never_touches_an_unstable_call():
    t, w = drift(50.0)
    assert stability_verdict(t, w, capacity=1_000, min_rise=1e9).verdict == UNSTABLE


def test_a_negative_min_rise_is_refused():
    t, w = drift(0.0)
    with pytest.raises(ConfigError, match="min_rise"):
        stability_verdict(t, w, capacity=1_000, min_rise=-1)


@pytest.mark.parametrize("seed", [26, 96])
def test_one_server_judges_a_chance_rise_as_its_replica_would(seed):
    """`llmsched simulate` of the same light load was inconclusive on 2 of 100 seeds (26,
    96: a rise of under 200 tokens at the interval's top over the judged ~330 s, against a
    ~400-token request) where a network's single replica now says stable: one server takes
    the same one-request rule."""
    import llmsched

    s = llmsched.simulate(
        policy="sarathi",
        b_max=512,
        cost_model="profile:h200-llama-3-8b",
        prompt="geometric:300",
        output="geometric:100",
        rate=3.0,
        num_requests=2000,
        seed=seed,
    ).summary
    assert 0 < s["backlog_growth_ci"][0] < s["backlog_growth_ci"][1] < 1
    assert s["verdict"] == STABLE, s["verdict_reason"]
    assert "under one request's work" in s["verdict_reason"]


def test_a_binding_k_max_keeps_the_slow_drift_for_the_requests_rule():
    """Under a binding k_max decoders with a few tokens left pile up while the tokens
    barely rise: there the rise rule is off, in one server and in a network, so the
    requests in the system still decide a slow drift (`api._judge_requests`)."""
    from llmsched.sim.network_result import NetworkResult

    res = simulate_network({**network(), "servers": {"s": {**network()["servers"]["s"], "k_max": 4}}})
    assert isinstance(res, NetworkResult)
    assert res._min_rise("s", np.arange(3)) is None
    uncapped = simulate_network(network())
    assert uncapped._min_rise("s", np.arange(3)) > 0
