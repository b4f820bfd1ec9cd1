"""The region's prefill cap with a prefix cache, and adaptive planning with a foreign cost."""

import numpy as np
import pytest

from llmsched import api
from llmsched.analysis.capacity_report import capacity_report
from llmsched.policies import batch_holds_back
from llmsched.theory import capacity


def test_cached_fraction_caps_prefill_at_the_uncached_prompt():
    # prompts of 200, half cached: 100 prefill + 1 decode per request, 2 requests a step,
    # each step at least t(128) = 46.75 ms on the paper model: 1 / 0.04675 = 21.390 req/s
    rep = capacity_report(
        cost_model="paper", k_max=2, prompt="const:200", output="const:2", cached_fraction=0.5, rate=22.5
    )
    assert rep["largest_prompt"] == 100
    assert rep["capacity"]["critical_rate"] == pytest.approx(1 / 0.04675, rel=1e-4)
    assert rep["inside"] is False


def test_simulate_caps_prefill_at_what_requests_compute():
    r = api.simulate(
        cost_model="paper",
        k_max=3,
        prompt="uniform:20,200",
        output="const:2",
        system_prompt=100,
        prefix_caching=True,
        rate=15,
        policy="kfcfs",
        num_requests=300,
        seed=1,
    )
    p = np.asarray(r.prompt)
    longest = int((p - r.stats.prefix_hits).max())
    assert longest < int(p.max())  # (this run: 204 of 300)
    n = len(p)
    cached = r.stats.prefix["first_admission_hit_tokens"] / n

    def lam(cap):
        return capacity(
            "paper",
            512,
            float(p.mean()),
            float(r.output.mean()),
            k_max=3,
            cached_prompt=cached,
            max_prefill_per_request=cap,
            peak=False,
        ).critical_rate

    assert r.summary["critical_rate"] == pytest.approx(lam(longest), rel=1e-9)
    assert lam(longest) < lam(int(p.max())) * (1 - 1e-3)


def test_adaptive_with_another_cost_model_has_no_guarantee():
    kw = dict(cost_model="paper", b_max=600, mean_prompt=200, mean_output=101, rate=11)
    rep = capacity_report(policy="adaptive:cost=const:10", **kw)
    assert rep["throughput_optimal"] is False
    assert rep["policy_critical_rate"] is None
    assert rep["not_throughput_optimal_kinds"] == ["cost"]
    assert "const:10" in rep["not_throughput_optimal"]
    # the same model spelt out, or in policy_options: a guarantee as before
    assert capacity_report(policy="adaptive:cost=paper", **kw)["throughput_optimal"] is True
    assert batch_holds_back("adaptive", 600, None, cost_model="paper", options={"cost": "const:10"})
    assert not batch_holds_back("adaptive", 600, None, cost_model="paper", options={"cost": "paper"})


def test_simulate_summary_withholds_adaptive_limit_under_a_foreign_cost():
    r = api.simulate(
        cost_model="paper",
        b_max=600,
        prompt="const:200",
        output="const:101",
        rate=11,
        policy="adaptive:cost=const:10",
        num_requests=300,
    )
    assert r.summary["policy_critical_rate"] is None
