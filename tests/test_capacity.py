import json
import math

import pytest

from llmsched.core.cost import CostModel, make_cost_model
from llmsched.core.errors import ConfigError
from llmsched.theory import (
    capacity,
    peak_token_capacity,
    representative_step_time,
    step_time_at_budget,
    token_capacity,
    work_per_request,
)


def test_paper_token_capacity_by_hand():
    cost = make_cost_model("paper")
    assert cost.load_time(512) == pytest.approx(0.01128 + 4 * 0.03547)  # 153.16 ms
    assert token_capacity(cost, 512) == pytest.approx(512 / 0.15316)
    assert token_capacity("paper", 128) == pytest.approx(128 / (0.01128 + 0.03547))
    assert token_capacity("paper", 8192) == pytest.approx(8192 / (0.01128 + 64 * 0.03547))


def test_paper_capacity_report_by_hand():
    r = capacity("paper", 512, mean_prompt=200, mean_output=101, rate=10.0)
    cap = 512 / 0.15316
    work = 200 + 101 - 1
    assert r.work_per_request == work
    assert r.decode_tokens_per_request == 100
    assert r.step_time_at_b_max_s == pytest.approx(0.15316)
    assert r.token_capacity == pytest.approx(cap)
    assert r.critical_rate == pytest.approx(cap / work)
    assert r.critical_rate_token_bound == pytest.approx(cap / work)
    assert r.effective_capacity == pytest.approx(cap)
    assert r.utilisation == pytest.approx(10.0 * work / cap)
    assert r.offered_tokens_per_s == pytest.approx(3000.0)
    assert r.predicted_growth_tokens_per_s == 0.0
    assert r.peak_token_capacity == pytest.approx(cap) and r.peak_load == 512
    assert "theorem 2" in r.binding
    json.dumps(r.to_dict())


def test_overload_growth():
    cap = 512 / 0.15316
    r = capacity("paper", 512, 200, 101, rate=15.0)
    assert r.utilisation == pytest.approx(15 * 300 / cap)
    assert r.predicted_growth_tokens_per_s == pytest.approx(15 * 300 - cap)


def test_linear_model_by_hand():
    cost = make_cost_model("linear:c=10,a=0.05")
    t = 0.010 + 0.00005 * 512
    assert token_capacity(cost, 512) == pytest.approx(512 / t)
    r = capacity(cost, 512, 100, 1)  # output 1: no decode work
    assert r.work_per_request == 100
    assert r.critical_rate == pytest.approx(512 / t / 100)
    const = make_cost_model("const:20")
    assert token_capacity(const, 256) == pytest.approx(256 / 0.020)


def test_k_max_binding_matches_hand_computation():
    # b_max=512, k_max=16, paper model: the ray (200, 100) leaves the region through the
    # edge between shapes (113, 15) and (0, 16), both at load 128 (t = 46.75 ms).
    r = capacity("paper", 512, 200, 101, k_max=16, rate=3.0)
    u = 83 / 115  # 2 * (15 + u) = 113 * (1 - u)
    lam = (15 + u) / (100 * 0.04675)
    assert r.critical_rate == pytest.approx(lam, rel=1e-9)
    assert r.critical_rate < r.critical_rate_token_bound
    assert r.binding.startswith("batch-size cap")
    assert r.utilisation == pytest.approx(3.0 / lam)
    assert r.effective_capacity == pytest.approx(lam * 300)
    # given means bound no request's prefill: the region is an upper bound (any prompt
    # length could be cut into (113, 15) steps' chunks, which one slot cannot always take)
    assert r.region_exact is False and "longest prompt" in r.region_note


def test_k_max_not_binding():
    r = capacity("paper", 512, 200, 101, k_max=4096)
    assert r.critical_rate == pytest.approx(512 / 0.15316 / 300)
    assert "theorem 2" in r.binding


def test_peak_capacity_flags_violated_assumption():
    # max variant with c < a * b0: b / t(b) peaks at b0, not at b_max
    cost = make_cost_model("paper:variant=max,c=11.28,a=0.1,b0=128")
    peak, b = peak_token_capacity(cost, 512)
    assert b == 128 and peak == pytest.approx(128 / 0.01128)
    assert peak > token_capacity(cost, 512)


class CtxModel(CostModel):
    name = "ctx"

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return (
            0.005
            + 2e-5 * (prefill_tokens + decode_tokens)
            + 1e-8 * decode_context
            + sum(1e-9 * c * (c / 2 + ctx) for c, ctx in chunks)
            + 1e-6 * sampled
        )


def test_context_dependent_model_uses_workload_mix():
    cost = CtxModel()
    # mix 500 : 199 of 1024 tokens -> x = 1024 * 500 / 699 = 732.48 prefill tokens: a
    # time-share of the whole shapes (732, 292) and (733, 291)
    t = step_time_at_budget(cost, 1024, 500, 200)
    share = 1024 * 500 / 699 - 732
    low, high = (representative_step_time(cost, x, 1024 - x, 500, 200) for x in (732, 733))
    assert t == pytest.approx((1 - share) * low + share * high, rel=1e-12)

    # means are timed as prompts of 500 tokens laid end to end: the 732 prefill tokens are
    # a window of that stream (a first piece after a tokens of its prompt, then the next
    # prompt's first tokens, or a whole prompt and a third piece), 732 / 500 prompts
    # complete; a model without `chunk_time` is averaged over 32 windows, so within 1e-4
    # of the mean over every start
    def chunk(c, ctx):
        return 1e-9 * c * (c / 2 + ctx)

    pieces = 0.0
    for a in range(500):
        rest = 732 - (500 - a)
        pieces += chunk(500 - a, a) + (chunk(rest, 0) if rest <= 500 else chunk(500, 0) + chunk(rest - 500, 0))
    expected = 0.005 + 2e-5 * 1024 + 1e-8 * 292 * 600 + pieces / 500 + 1e-6 * (292 + 732 / 500)
    assert low == pytest.approx(expected, rel=1e-4)
    assert token_capacity(cost, 1024, 500, 200) == pytest.approx(1024 / t)
    r = capacity(cost, 1024, 500, 200, k_max=64)
    assert r.critical_rate <= r.critical_rate_token_bound * (1 + 1e-9)
    with pytest.raises(ConfigError):
        representative_step_time(cost, 10, 10)  # a context model needs the mean lengths


def test_bad_inputs():
    with pytest.raises(ConfigError):
        work_per_request(0, 10)
    with pytest.raises(ConfigError):
        work_per_request(10, 0.5)
    with pytest.raises(ConfigError):
        token_capacity("paper", 0)
    with pytest.raises(ConfigError):
        capacity("paper", 512, 100, 10, rate=-1)
    assert math.isfinite(capacity("paper", 512, 100, 10, rate=0).utilisation)


def test_profile_model():
    cost = make_cost_model("profile")
    r = capacity(cost, 2048, 1024, 256, k_max=256, rate=10.0)
    assert r.token_capacity == pytest.approx(2048 / step_time_at_budget(cost, 2048, 1024, 256))
    assert 0 < r.critical_rate < math.inf and r.region_exact is False
    from llmsched.theory import stability_region, workload_point

    reg = stability_region(cost, 2048, 256, mean_prompt=1024, mean_output=256)
    lam = reg.critical_rate(1024, 256)
    # lambda* is the lower of C / w and the region's LP (reported apart, as
    # shape_bound_rate, where the region's shapes beat the one mixed step; with the means
    # timed as a constant-length mix, since 2026-12-03, the cap of 256 binds here instead)
    assert r.critical_rate <= r.critical_rate_token_bound * (1 + 1e-9)
    assert lam == pytest.approx(r.shape_bound_rate or r.critical_rate, rel=1e-9)
    assert reg.contains(*workload_point(0.99 * lam, 1024, 256))
    assert not reg.contains(*workload_point(1.01 * lam, 1024, 256))


def test_capacity_without_the_peak_scan_gives_the_same_rates():
    """`simulate` asks for the rates only (`peak=False`): the scan of every load up to
    b_max, slow at large budgets, is skipped and nothing else changes."""
    from llmsched.theory import capacity as cap

    for cost, b_max, k_max in (("paper", 512, None), ("profile", 4096, None), ("profile", 2048, 32)):
        full = cap(cost, b_max, 900.0, 180.0, k_max=k_max, rate=3.0)
        quick = cap(cost, b_max, 900.0, 180.0, k_max=k_max, rate=3.0, peak=False)
        assert quick.peak_token_capacity is None and quick.peak_load is None
        assert full.peak_token_capacity >= full.token_capacity * (1 - 1e-12) and 1 <= full.peak_load <= b_max
        a, b = full.to_dict(), quick.to_dict()
        for k in ("token_capacity", "critical_rate", "effective_capacity", "utilisation", "binding"):
            assert a[k] == b[k], k


# --- a k_max that cannot bind, and theorem 2's assumption failing --------------------------

MAXV = "paper:variant=max"  # c = 11.28 ms < a * b0: b / t(b) peaks at b0 = 128, not at b_max


@pytest.mark.parametrize("k_max", [None, 512, 513, 100_000])
def test_non_binding_k_max_leaves_lambda_star_alone_when_theorem_2_fails(k_max):
    """paper:variant=max: lambda* was C / w (0.151 req/s) without k_max and the region's
    45.57 with a cap no step can reach. The uncapped region is the triangle
    x + y <= max_b b / t(b), so lambda* is that over the work, with or without the cap, and
    the largest cap that can bind (b_max - 1) gives the same too."""
    peak = 128 / 0.01128
    r = capacity(MAXV, 512, 200, 50, k_max=k_max, rate=1.0)
    assert r.critical_rate == pytest.approx(peak / 249)  # 45.57 req/s
    assert r.critical_rate_token_bound == pytest.approx(512 / (0.01128 + 0.03547 * 384) / 249)  # 0.151
    assert r.binding.startswith("token budget at b = 128 < b_max")
    assert r.utilisation == pytest.approx(1.0 / r.critical_rate)
    capped = capacity(MAXV, 512, 200, 50, k_max=511)
    assert capped.critical_rate == pytest.approx(r.critical_rate, rel=1e-12)
    quick = capacity(MAXV, 512, 200, 50, k_max=k_max, peak=False)  # simulate's call
    assert quick.critical_rate == r.critical_rate and quick.binding == r.binding


def test_lambda_star_never_grows_as_the_cap_tightens():
    for cost in (MAXV, "paper", "paper:c=1,a=0.5,b0=64,variant=max"):
        lams = [capacity(cost, 512, 200, 50, k_max=k).critical_rate for k in (None, 512, 511, 200, 64, 16, 2)]
        assert all(a >= b * (1 - 1e-9) for a, b in zip(lams, lams[1:])), (cost, lams)


def test_a_cap_of_b_max_or_more_is_the_uncapped_report_for_a_profile():
    """The H200 profile: a cap of b_max requests or more cannot bind; it gave the region's
    23.95 req/s against 23.66 without it."""
    none = capacity("profile", 512, 1000, 200, peak=False)
    for k in (512, 100_000):
        r = capacity("profile", 512, 1000, 200, k_max=k, peak=False)
        assert r.critical_rate == none.critical_rate == none.critical_rate_token_bound
        assert r.region_exact is None and r.binding.endswith("cannot bind")


def test_profile_region_above_c_over_w_is_the_shape_bound_not_lambda_star():
    """With a binding cap the profile's region can exceed theorem 2's C / w (it times the
    region's step shapes one by one; C one mixed step at b_max): by 0.3% at k_max 256, 0.9%
    at 511 (0.6% and 1.2% with the means' contexts before 2026-12-03).
    lambda* was the region's then, 23.947 req/s at k_max 511 against 23.664 at 512
    (where the cap cannot bind): relaxing the cap lowered lambda*. As without a cap, lambda*
    is now never above C / w for a context-dependent model, and the region's rate is
    `shape_bound_rate` on both sides of k_max = b_max."""
    r = capacity("profile", 512, 1000, 200, k_max=256, peak=False)
    assert r.critical_rate == r.critical_rate_token_bound
    assert 1.002 < r.shape_bound_rate / r.critical_rate_token_bound < 1.01
    assert "shape_bound_rate" in r.binding and "below b_max" not in r.binding
    load_only = capacity("paper", 512, 1000, 200, k_max=256)
    assert load_only.critical_rate <= load_only.critical_rate_token_bound * (1 + 1e-9)


def test_lambda_star_never_falls_as_the_cap_is_relaxed_for_a_profile():
    lams = [capacity("profile", 512, 1000, 200, k_max=k).critical_rate for k in (16, 64, 128, 256, 511, 512, None)]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(lams, lams[1:])), lams
    shapes = [capacity("profile", 512, 1000, 200, k_max=k).shape_bound_rate for k in (256, 511, None)]
    assert shapes[0] < shapes[1] <= shapes[2]


@pytest.mark.parametrize("spec", ["paper", MAXV, "paper:c=2,a=0.3,b0=100", "linear:c=10,a=0.05", "const:7"])
def test_vectorised_load_times_and_peak_match_the_scalar_ones(spec):
    import numpy as np

    cost = make_cost_model(spec)
    b = np.arange(1, 5001)
    assert np.array_equal(cost.load_times(b), np.array([cost.load_time(int(v)) for v in b]))
    rates = [v / cost.load_time(v) for v in range(1, 5001)]
    best = max(rates)
    peak, arg = peak_token_capacity(cost, 5000)
    assert peak == best and arg == 1 + next(i for i, r in enumerate(rates) if r * (1 + 1e-12) >= best)


def test_the_verdict_threshold_is_at_most_c_where_smaller_steps_serve_more():
    """`paper:variant=max`: lambda* is the peak's (steps of b = 128), 300x what a policy
    filling b_max = 512 serves (C / w); the verdict's threshold took the peak's capacity,
    so Sarathi offered 3.3x what it serves was 'inconclusive'. It is 2% of C now."""
    import llmsched

    s = llmsched.simulate(
        cost_model="paper:variant=max",
        prompt="const:200",
        output="const:50",
        b_max=512,
        rate=0.5,
        num_requests=600,
        out_dir=None,
    ).summary
    assert s["critical_rate"] > 40 * 0.5  # the peak's lambda*: far above the offered rate
    assert s["verdict_threshold_tokens_per_s"] == pytest.approx(0.02 * s["token_capacity"])
    assert s["verdict"] == "unstable"


# --- k_max is checked before it is compared with b_max ------------------------------------


@pytest.mark.parametrize(
    "k_max, message",
    [
        (10**30, "k_max must be at most 1,048,576"),
        (600.5, "k_max must be a positive integer, got 600.5"),
        ("600", "k_max must be a positive integer, got '600'"),
        (True, "k_max must be a positive integer, got True"),
        (0, "k_max must be a positive integer, got 0"),
    ],
)
def test_capacity_refuses_a_bad_k_max_even_above_b_max(k_max, message):
    """A k_max >= b_max cannot bind, but it is checked first: 1e30 and 600.5 were
    accepted, '600' raised a TypeError and True passed."""
    with pytest.raises(ConfigError, match=message):
        capacity("paper", 512, 200, 101, k_max=k_max)


def test_capacity_stores_a_numpy_k_max_as_an_int():
    import numpy as np

    for k in (np.int64(600), np.int32(16)):
        r = capacity("paper", 512, 200, 101, k_max=k)
        assert type(r.k_max) is int and r.k_max == int(k)
        json.dumps(r.to_dict())


def test_a_cost_model_with_a_free_step_is_one_line():
    """A user's cost model object whose step takes 0 s made capacity divide by zero
    (ZeroDivisionError in the peak's scan and at b_max)."""
    import numpy as np

    from llmsched.core import make_cost_model
    from llmsched.theory.bounds import capacity as bound

    paper = make_cost_model("paper")

    class Free(type(paper)):
        def load_time(self, b):
            return 0.0 if b >= 256 else super().load_time(b)

        def load_times(self, b):
            return np.where(np.asarray(b) >= 256, 0.0, super().load_times(b))

    free = Free.__new__(Free)
    free.__dict__.update(paper.__dict__)
    with pytest.raises(ConfigError, match="must be positive and finite"):
        bound(free, 512, 200.0, 101.0)
