"""The per-run stability verdict on real simulator runs at known loads.

Cheap runs: paper cost model with b_max = 128 (every step t(b) = 46.75 ms, one block),
short geometric lengths (prompt 40, output 21: w = 60 tokens, C = 2738 tokens/s,
lambda* = 45.6 req/s), the fast path, and enough requests for many relaxation times.
"""

import pytest

from llmsched.api import simulate
from llmsched.theory import capacity

KW = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=6000)
LAM = capacity("paper", 128, 40.0, 21.0).critical_rate


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sarathi_stable_at_85_unstable_at_115(seed):
    lo = simulate(policy="sarathi", rate=0.85 * LAM, seed=seed, **KW).summary
    hi = simulate(policy="sarathi", rate=1.15 * LAM, seed=seed, **KW).summary
    assert lo["utilisation"] == pytest.approx(0.85, abs=0.05)
    assert lo["stable"] is True
    assert hi["stable"] is False
    # the growth estimate is close to the fluid prediction lambda w - C
    assert hi["backlog_growth_tokens_per_s"] == pytest.approx(hi["predicted_backlog_growth_tokens_per_s"], rel=0.5)


def test_non_work_conserving_unstable_where_sarathi_is_stable():
    sar = simulate(policy="sarathi", rate=0.6 * LAM, seed=0, **KW).summary
    ft = simulate(policy="fastertransformer", rate=0.6 * LAM, seed=0, **KW).summary
    assert sar["stable"] is True
    assert ft["stable"] is False and ft["backlog_growth_tokens_per_s"] > 0.1 * sar["token_capacity"]


def test_a_short_run_of_a_stable_queue_is_not_called_unstable():
    """Seed 20 of this 44%-load workload grows 123 tokens/s over its judged 49 s (interval
    wholly above the threshold of 67): before the short-window guard it was called unstable."""
    from llmsched.api import simulate

    kw = dict(cost_model="paper", rate=3, prompt="geometric:300", output="geometric:200", seed=20)
    s = simulate(num_requests=300, **kw).summary
    assert s["utilisation"] < 0.5
    lo, hi = s["backlog_growth_ci"]
    assert lo > s["verdict_threshold_tokens_per_s"]  # the interval alone would call it unstable
    assert s["verdict"] == "inconclusive" and s["stable"] is None and not s["verdict_conclusive"]
    assert s["verdict_reason"].startswith("too short to call unstable")
    # run longer and the same queue is judged stable
    assert simulate(num_requests=3000, **kw).summary["verdict"] == "stable"


def test_a_short_run_of_a_strongly_overloaded_queue_is_still_unstable():
    from llmsched.api import simulate

    s = simulate(cost_model="paper", rate=30, prompt="geometric:200", output="geometric:101", num_requests=600).summary
    assert s["utilisation"] > 2
    assert s["verdict"] == "unstable" and s["stable"] is False


def test_an_overloaded_run_whose_backlog_shrank_is_not_called_stable():
    """30 requests at 129% load, seed 13: the judged half drains what the first half built
    (interval [-1265, -61] tokens/s): before, a confident "stable"."""
    s = simulate(
        cost_model="paper", prompt="geometric:200", output="geometric:101", rate=14.5, num_requests=30, seed=13
    ).summary
    assert s["policy_utilisation"] > 1.2 and s["backlog_growth_ci"][1] < 0
    assert s["verdict"] == "inconclusive" and s["stable"] is None and s["verdict_conclusive"] is False
    assert "of the policy's limit" in s["verdict_reason"]


def test_a_late_straggler_in_a_trace_does_not_hide_an_overload(tmp_path):
    """3,000 arrivals at 14.5 req/s (129% load) and one more at six times the last: the
    arrival window ends at the straggler, its judged half holds one arrival, and the load
    over the whole span reads 21%: before, "stable"."""
    import numpy as np

    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / 14.5, 3000))
    p, o = rng.geometric(1 / 200, 3000), rng.geometric(1 / 101, 3000)
    rows = [*zip(t, p, o), (t[-1] * 6, 200, 101)]
    path = tmp_path / "straggler.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a:.6f},{b},{c}\n" for a, b, c in rows))
    s = simulate(cost_model="paper", trace=str(path)).summary
    assert s["utilisation"] < 0.5
    assert s["verdict"] == "inconclusive" and s["stable"] is None
    assert s["verdict_reason"].startswith("the arrival rate changed: 1 of 3001 arrivals")


def test_bursty_arrivals_need_a_proportionally_longer_window():
    """Gamma arrivals with cv 4 relax (1 + 16) / 2 = 8.5 times more slowly than Poisson ones:
    seed 9 at 90% load over 1,000 requests grows past the threshold in its judged 50 s and
    was called unstable before the short-window guard scaled its decode times by 8.5."""
    s = simulate(
        cost_model="paper",
        prompt="geometric:200",
        output="geometric:101",
        rate=10,
        num_requests=1000,
        seed=9,
        arrival="gamma",
        cv=4,
    ).summary
    assert s["utilisation"] < 0.95
    assert s["verdict"] == "inconclusive" and s["stable"] is None
    assert s["verdict_reason"].startswith("too short to call unstable") and "8.5" in s["verdict_reason"]
