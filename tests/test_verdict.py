import json
import math

import numpy as np
import pytest

from llmsched.core.errors import ConfigError
from llmsched.theory import fixed_b_critical_value, predicted_growth, stability_verdict

DT = 0.15316
CAP = 512 / DT  # paper model, b_max = 512
WORK = 300.0


def reflected_walk(rng, rho, steps=4000, every=10):
    """Unfinished work of an M/M/1-like slotted queue: W_k = max(0, W_{k-1} + A_k - C dt)."""
    n = rng.poisson(rho * CAP / WORK * DT, steps)
    s = np.cumsum(rng.gamma(n.astype(float), WORK) - CAP * DT)
    w = s - np.minimum(0.0, np.minimum.accumulate(s))
    t = DT * np.arange(1, steps + 1)
    return t[every - 1 :: every], w[every - 1 :: every]


@pytest.mark.parametrize("method", ["hac", "batch"])
def test_stable_queue_is_stable(method):
    rng = np.random.default_rng(11)
    for _ in range(20):
        # 4x the default length: the batch method's interval (t(7) on 8 block slopes) is
        # wide, and an interval holding both 0 and the threshold is inconclusive
        v = stability_verdict(*reflected_walk(rng, 0.85, steps=16000), capacity=CAP, method=method)
        assert v.stable
        assert abs(v.growth_per_s) < 0.02 * CAP


@pytest.mark.parametrize("method", ["hac", "batch"])
def test_overloaded_queue_is_unstable(method):
    rng = np.random.default_rng(12)
    growth = 0.15 * CAP
    for _ in range(20):
        v = stability_verdict(
            *reflected_walk(rng, 1.15),
            capacity=CAP,
            method=method,
            arrival_rate=1.15 * CAP / WORK,
            work_per_request=WORK,
        )
        assert not v.stable and v.ci_low > 0
        assert v.growth_per_s == pytest.approx(growth, rel=0.35)
        assert v.predicted_growth_tokens_per_s == pytest.approx(growth)


def test_white_noise_and_trends():
    rng = np.random.default_rng(3)
    t = np.linspace(0, 600, 400)
    noise = 500 * rng.standard_normal(400)
    v = stability_verdict(t, 5000 + noise, capacity=CAP)
    assert v.stable and v.conclusive
    v = stability_verdict(t, 0.05 * CAP * t + noise, capacity=CAP)
    assert not v.stable and v.conclusive
    assert v.growth_per_s == pytest.approx(0.05 * CAP, rel=0.05)
    assert v.ci_low < 0.05 * CAP < v.ci_high
    # significant growth below eps * capacity: neither stable nor unstable
    v = stability_verdict(t, 0.002 * CAP * t + noise, capacity=CAP)
    assert v.verdict == "inconclusive" and v.stable is None and v.ci_low > 0
    assert v.reason.startswith("the backlog grows")
    # with an explicit zero threshold the same series is unstable
    v = stability_verdict(t, 0.002 * CAP * t + noise, threshold=0.0)
    assert not v.stable and v.threshold_rule == "explicit threshold"


def test_a_shrinking_backlog_is_stable_and_says_so():
    # a queue draining over the judged half: the interval lies below 0
    t = np.linspace(0, 600, 400)
    w = 1e6 - 0.01 * CAP * t + 50 * np.random.default_rng(4).standard_normal(400)
    v = stability_verdict(t, w, capacity=CAP)
    assert v.stable and v.ci_high < 0
    assert v.reason == "the backlog shrinks (the growth's interval lies below 0)"
    v = stability_verdict(t, 5000 + 50 * np.random.default_rng(4).standard_normal(400), capacity=CAP)
    assert v.stable and v.ci_low <= 0 <= v.ci_high and v.reason.startswith("the growth's interval holds 0")


def test_warm_up_is_ignored():
    # fast growth during the first half, flat afterwards
    t = np.linspace(0, 100, 200)
    w = np.where(t < 50, 100 * t, 5000) + np.random.default_rng(0).normal(0, 50, 200)
    assert stability_verdict(t, w, capacity=1000.0).stable
    assert not stability_verdict(t, w, capacity=1000.0, tail_fraction=1.0).stable


def test_ci_coverage_on_white_noise():
    rng = np.random.default_rng(5)
    t = np.arange(300.0)
    rejections = 0
    for _ in range(200):
        v = stability_verdict(t, rng.standard_normal(300), threshold=0.0)
        rejections += (v.ci_low > 0) or (v.ci_high < 0)
    assert 0.0 <= rejections / 200 < 0.12


def test_fixed_b_table():
    assert fixed_b_critical_value(0.0) == pytest.approx(1.96, abs=1e-3)
    vals = [fixed_b_critical_value(b) for b in np.linspace(0, 1, 21)]
    assert all(a <= b for a, b in zip(vals, vals[1:]))
    assert fixed_b_critical_value(0.5, 0.10) < fixed_b_critical_value(0.5, 0.05) < fixed_b_critical_value(0.5, 0.01)
    with pytest.raises(ConfigError):
        fixed_b_critical_value(0.5, 0.2)


def test_report_fields_and_errors():
    t = np.linspace(0, 10, 100)
    v = stability_verdict(t, np.zeros(100), capacity=1000.0)  # idle system
    assert v.stable and v.growth_per_s == 0.0
    assert v.threshold_per_s == pytest.approx(20.0)
    assert v.samples_used == 50
    json.dumps(v.to_dict())
    assert predicted_growth(10, 300, 2000) == 1000 and predicted_growth(1, 300, 2000) == 0
    with pytest.raises(ConfigError):
        stability_verdict(t[:10], np.zeros(10))
    with pytest.raises(ConfigError):
        stability_verdict(t, np.zeros(99))
    with pytest.raises(ConfigError):
        stability_verdict(t, np.zeros(100), method="nope")
    with pytest.raises(ConfigError):
        stability_verdict(t, np.zeros(100), capacity=0)


def test_a_short_window_needs_faster_growth_to_be_called_unstable():
    import numpy as np

    from llmsched.theory import stability_verdict

    t = np.linspace(0, 50, 400)
    w = 30.0 * t + np.random.default_rng(0).normal(0, 5, t.size)  # 30 tokens/s against h = 20
    assert stability_verdict(t, w, capacity=1000).verdict == "unstable"
    v = stability_verdict(t, w, capacity=1000, decode_time_s=10.0)  # 25 judged s < 20 x 10 s
    assert v.verdict == "inconclusive" and v.stable is None and not v.conclusive
    assert v.reason.startswith("too short to call unstable")
    assert stability_verdict(t, w, capacity=1000, decode_time_s=1.0).verdict == "unstable"  # 25 s >= 20 x 1 s
    assert v.unit == "tokens" and "(30 tokens/s) is below the 160 tokens/s that needs" in v.reason
    # a count of requests: its unit in the fields and the reason, its rates written as asked
    r = stability_verdict(t, w / 1000, capacity=1, decode_time_s=10.0, unit="requests", rate_format=".3g")
    assert r.unit == "requests" and r.growth_per_s == pytest.approx(v.growth_per_s / 1000)
    assert r.threshold_per_s == pytest.approx(0.02) and r.capacity_per_s == 1
    assert "(0.03 requests/s) is below the 0.16 requests/s that needs" in r.reason


def test_every_number_of_the_verdict_is_checked_by_name():
    t = np.arange(100.0)
    numbers = ("capacity", "eps", "threshold", "alpha", "tail_fraction", "b_min")
    numbers += ("predicted_growth_tokens_per_s", "arrival_rate", "work_per_request", "decode_time_s")
    for name in numbers:
        for bad in ("1", True, [1.0], math.inf, math.nan):
            with pytest.raises(ConfigError, match=rf"^{name} must be a finite number, got "):
                stability_verdict(t, np.ones(100), **{name: bad})
    v = stability_verdict(t, np.ones(100), capacity=np.float32(100), eps=np.float64(0.5), decode_time_s=np.int64(1))
    assert type(v.capacity_per_s) is float and v.threshold_per_s == 50.0


@pytest.mark.parametrize("method", ["hac", "batch"])
def test_a_growth_that_cannot_be_estimated_is_inconclusive_never_stable(method):
    """1e300 * t: the slope's interval overflowed to [nan, nan], which fell through to
    'stable'. 1e306 * (1 + t): the tail's mean backlog overflows too (it warned of it)."""
    t = np.linspace(0, 100, 400)
    with np.errstate(all="raise"):  # no floating-point warning escapes either
        v = stability_verdict(t, 1e306 * (1 + t), capacity=1000, method=method)
    assert v.verdict == "inconclusive" and v.stable is None and not v.conclusive
    assert "could not be estimated" in v.reason


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"eps": -0.5}, r"^eps \(the threshold's share of the capacity\) must be >= 0, got -0.5$"),
        ({"decode_time_s": -5.0}, r"^decode_time_s must be >= 0 seconds, got -5.0$"),
        ({"b_min": -1.0}, r"^b_min .* must be in \[0, 1\], got -1.0$"),
        ({"b_min": 5.0}, r"^b_min .* must be in \[0, 1\], got 5.0$"),
        (
            {"method": "batch", "groups": "8"},
            r"^groups \(the batch method's blocks\) must be a whole number >= 2, got '8'$",
        ),
        ({"method": "batch", "groups": 2.5}, r"^groups .* got 2.5$"),
        ({"method": "batch", "groups": True}, r"^groups .* got True$"),
        ({"method": "batch", "groups": 1}, r"^groups .* got 1$"),
        ({"method": "batch", "groups": 8.5}, r"^groups .* got 8.5$"),
        ({"method": "batch", "groups": math.inf}, r"^groups .* got inf$"),
    ],
)
def test_parameters_out_of_range_are_one_line_errors_naming_them(kwargs, match):
    t = np.linspace(0, 100, 400)
    with pytest.raises(ConfigError, match=match):
        stability_verdict(t, 10 * t, capacity=1000, **kwargs)


def test_a_series_that_is_not_numbers_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^times must be a sequence of numbers"):
        stability_verdict(["a"] * 20, list(range(20)))
    with pytest.raises(ConfigError, match=r"^unfinished work must be a sequence of numbers"):
        stability_verdict(list(range(20)), [[1, 2], [3]] * 10)


def test_a_tail_of_the_whole_run_keeps_every_sample():
    """16 samples at t = 0.1..1.6 with tail_fraction 1.0: 1.6 - 1.0 * 1.5 rounds above 0.1,
    which dropped the first sample ('need at least 16 samples in the tail, got 15')."""
    t = np.arange(16) * 0.1 + 0.1
    v = stability_verdict(t, np.arange(16.0) * 100, capacity=1000, tail_fraction=1.0)
    assert v.samples_used == 16 and v.tail_start_s == t[0]


def test_each_method_checks_only_its_own_parameter():
    """groups=8.0 (a whole number as a float) was refused; groups was checked for hac,
    which has no blocks, and b_min for batch, which has no bandwidth."""
    t = np.linspace(0, 100, 400)
    w = 10 * t + np.sin(t)
    whole = stability_verdict(t, w, capacity=1000, method="batch", groups=8.0)
    assert whole == stability_verdict(t, w, capacity=1000, method="batch", groups=8)
    assert stability_verdict(t, w, capacity=1000, method="batch", groups=np.float64(4.0)).detail.startswith("mean of 4")
    hac = stability_verdict(t, w, capacity=1000)
    assert stability_verdict(t, w, capacity=1000, groups=1) == hac
    assert stability_verdict(t, w, capacity=1000, method="batch", b_min=5.0) == whole


def test_a_short_window_that_shrinks_is_a_drain_not_stable():
    """The short-window guard holds both ways: over a window shorter than 20 decode times
    a backlog whose interval lies below 0 may be draining a queue built before it."""
    t = np.linspace(0, 50, 400)
    w = 1e5 - 30.0 * t + np.random.default_rng(0).normal(0, 5, t.size)
    assert stability_verdict(t, w, capacity=1000).verdict == "stable"  # a long enough window
    v = stability_verdict(t, w, capacity=1000, decode_time_s=10.0)  # 25 judged s < 20 x 10 s
    assert v.verdict == "inconclusive" and v.stable is None and not v.conclusive
    assert v.reason.startswith("too short to call stable") and "drain" in v.reason
    # a level backlog over the same short window stays stable: its interval holds 0
    flat = 5000 + np.random.default_rng(0).normal(0, 5, t.size)
    assert stability_verdict(t, flat, capacity=1000, decode_time_s=10.0).verdict == "stable"


def test_no_stable_call_above_the_policys_limit():
    t = np.linspace(0, 600, 400)
    flat = 5000 + 50 * np.random.default_rng(4).standard_normal(400)
    assert stability_verdict(t, flat, capacity=CAP, load=1.02).verdict == "stable"  # within the margin
    v = stability_verdict(t, flat, capacity=CAP, load=1.05)
    assert v.verdict == "inconclusive" and v.stable is None and not v.conclusive
    assert "105% of the policy's limit" in v.reason and "not stability" in v.reason
    # an unstable call stands whatever the load
    grow = 0.1 * CAP * t + 50 * np.random.default_rng(4).standard_normal(400)
    assert stability_verdict(t, grow, capacity=CAP, load=1.05).verdict == "unstable"
    with pytest.raises(ConfigError, match="load must be a finite number"):
        stability_verdict(t, flat, capacity=CAP, load=float("nan"))


def test_a_judged_window_without_its_arrivals_is_not_stable():
    t = np.linspace(0, 600, 400)
    flat = 5000 + 50 * np.random.default_rng(4).standard_normal(400)
    steady = np.linspace(0, 600, 3000)
    assert stability_verdict(t, flat, capacity=CAP, arrival_times=steady).verdict == "stable"
    straggler = np.append(np.linspace(0, 100, 3000), 600.0)  # all but one in the first sixth
    v = stability_verdict(t, flat, capacity=CAP, arrival_times=straggler)
    assert v.verdict == "inconclusive" and v.reason.startswith("the arrival rate changed: 1 of 3001 arrivals")
    # a lull inside the judged window (arrivals resume after a long gap) hides as well
    gap = np.concatenate([np.linspace(0, 50, 1500), np.linspace(550, 600, 1500)])
    v = stability_verdict(t, flat, capacity=CAP, arrival_times=gap)
    assert v.verdict == "inconclusive" and v.reason.startswith("the arrival rate changed: 0 of 3000 arrivals")
    assert "judged window's first half" in v.reason


def test_too_few_arrivals_say_nothing_of_a_changed_rate():
    """A series fed by one arrival (a replica of a large pool that took one call) had "0 of
    1 arrivals in the judged window's second half": a count that small is chance. The rule
    holds a part to its share only where a Poisson stream of that rate falls that short
    with a chance under ARRIVAL_CHANCE."""
    t = np.linspace(0, 600, 400)
    flat = 5000 + 50 * np.random.default_rng(4).standard_normal(400)
    assert stability_verdict(t, flat, capacity=CAP, arrival_times=[10.0]).verdict == "stable"
    three = [10.0, 200.0, 350.0]  # 0.76 expected in the judged window's second half, none there: P = 47%
    assert stability_verdict(t, flat, capacity=CAP, arrival_times=three).verdict == "stable"
    early = np.linspace(0, 100, 15)  # 7.5 expected in the judged window, none there: P = 0.06%
    v = stability_verdict(t, flat, capacity=CAP, arrival_times=early)
    assert v.verdict == "inconclusive" and v.reason.startswith("the arrival rate changed: 0 of 15")


def test_small_growths_are_written_with_three_digits():
    from llmsched.theory import describe_verdict

    line = describe_verdict(
        {"verdict": "stable", "backlog_growth_tokens_per_s": 0.0057, "backlog_growth_ci": [-0.0092, 0.021]}
    )
    assert line == "stable (0.0057 tok/s, [-0.0092, 0.021])"
    line = describe_verdict({"verdict": "stable", "backlog_growth_tokens_per_s": -3.4, "backlog_growth_ci": [-40, 45]})
    assert line == "stable (-3 tok/s, [-40, 45])"
    flat = {"verdict": "stable", "backlog_growth_tokens_per_s": -0.0, "backlog_growth_ci": [-0.0, 0.0]}
    assert describe_verdict(flat) == "stable (0 tok/s, [0, 0])"  # never "-0"


@pytest.mark.parametrize("bad, words", [("abc", "sequence of numbers"), ([float("nan")], "finite")])
def test_bad_arrival_times_are_refused_whatever_the_verdict(bad, words):
    """They were read only on the way to a stable call: an unstable one took any value."""
    from llmsched.theory.verdict import stability_verdict

    t = np.arange(100.0)
    with pytest.raises(ConfigError, match=words):
        stability_verdict(t, t * 1000, capacity=1000, arrival_times=bad)
