"""Stability verdict for one simulation run, from its unfinished-work time series.

Input: samples `(t_i, W_i)`, where `W_i` is the unfinished work at time `t_i` in tokens:
over all requests in the system (waiting or running), remaining prefill tokens plus
remaining decode tokens (`o - 1` accounting, docs/stability.md "Work and capacity"). A
stable (positive recurrent) queue fluctuates around a level; an unstable one grows
linearly in the fluid limit, at `lambda * work - capacity` tokens/s for a work-conserving
policy (theorem 2 of paper 1, "Throughput-optimal scheduling for LLM inference and AI
agents").

Decision rule (`stability_verdict`):

1. Keep the tail of the run, `t >= t_end - tail_fraction * (t_end - t_start)` (default:
   the second half), so the warm-up transient does not count.
2. Estimate the backlog growth rate `g` (tokens/s) on the tail with a confidence
   interval `[lo, hi]` at level `1 - alpha` that is robust to autocorrelation:
   - `method="hac"` (default): OLS slope of W on t with a Newey-West (Bartlett kernel)
     standard error; bandwidth `M = max(b_min * n, Andrews' AR(1) plug-in)` (b_min = 0.3) capped at n;
     critical values from fixed-b asymptotics (Kiefer-Vogelsang) for a regression on a
     linear trend, tabulated in `FIXED_B_CV` by Monte Carlo
     (`benchmarks/verdict_rates.py --fixed-b-table` regenerates them). Fixed-b critical
     values keep the coverage close to nominal even when the bandwidth is a large
     fraction of the sample, which is what a persistent queue needs.
   - `method="batch"`: split the tail into `groups` contiguous blocks, fit an OLS slope
     in each and use Student's t with `groups - 1` degrees of freedom on their mean
     (Ibragimov-Mueller); valid when block slopes are roughly independent.
3. Threshold `h = eps * capacity` tokens/s (default eps = 0.02) when the token capacity
   is given, else `threshold` (explicit, tokens/s), else 0.
4. The verdict says what the run shows, one of three:
   - **unstable** iff `g > h` and `lo > 0`: the growth is both material, relative to
     what the server can process, and statistically distinguishable from zero;
   - **stable** iff `lo <= 0` and `hi < h`: no significant growth, and the interval
     rules out material growth; unless the run shows a drain rather than a level (then
     inconclusive): a judged window under MIN_DECODE_TIMES decode times with `hi < 0`,
     an offered `load` above LOAD_MARGIN times the policy's limit, or a judged window
     (or either half of it) with under MIN_ARRIVAL_SHARE of the `arrival_times` its
     share of time would give, and fewer than a Poisson stream would give but with
     ARRIVAL_CHANCE;
     With `min_rise` (one server's run and a network's verdicts pass it, except under a
     binding k_max), a significant growth below `h` whose
     interval's top adds up to under `min_rise` (one request's work) over the judged
     window is stable too, under the same guards: no queue grows by less than a request;
   - **inconclusive** otherwise, for one of two reasons: the backlog grows
     significantly (`lo > 0`) but at `g <= h`, below the threshold (a slow drift, a
     warm-up not over yet, or a queue near criticality); or the run is too short (the
     interval holds both 0 and `h`, with `h > 0`).
   A stable queue's slope estimate hovers around 0, far below `h` on a run that lasts
   many relaxation times; an overloaded queue at load rho grows at `(rho - 1) *
   capacity`, so loads above about `1 + eps` are called unstable once the run is long
   enough for the CI to exclude 0. Near criticality (rho ~ 1, null recurrent) a finite
   run is often inconclusive. `Verdict.stable` is True, False or None (inconclusive);
   `reason` says why in one sentence. `conclusive` (kept for existing readers) is True
   when the CI lies entirely on one side of `h`. A growth or interval that is not a
   finite number (a series too large for floats) is inconclusive, never stable: the
   reason says the growth could not be estimated.

The fluid prediction `predicted_growth = max(0, lambda * work - capacity)` is reported
alongside when the arrival rate and work per request are given (or passed directly).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import asdict, dataclass

import numpy as np

from ..core.checks import as_real
from ..core.errors import ConfigError

__all__ = [
    "Verdict",
    "stability_verdict",
    "predicted_growth",
    "hac_slope",
    "batch_slope",
    "fixed_b_critical_value",
    "FIXED_B_GRID",
    "FIXED_B_CV",
    "STABLE",
    "UNSTABLE",
    "INCONCLUSIVE",
    "describe_verdict",
    "MIN_DECODE_TIMES",
    "MIN_JUDGED_ARRIVALS",
    "service_steps",
    "short_window_time_s",
    "guard_time_of",
    "burst_factor",
]

STABLE, UNSTABLE, INCONCLUSIVE = "stable", "unstable", "inconclusive"
# over a judged window shorter than this many request decode times, an unstable verdict
# needs the growth threshold raised in proportion (`stability_verdict`'s decode_time_s)
MIN_DECODE_TIMES = 20
#: the judged window must hold this many arrivals before a verdict is judged as a long
#: run's (`short_window_time_s`; docs/stability.md)
MIN_JUDGED_ARRIVALS = 500
# a stable call on a run whose offered load is above the policy's limit by more than this
# factor is a drain, not stability (`stability_verdict`'s load; docs/stability.md)
LOAD_MARGIN = 1.02
# a stable call whose judged window holds fewer than this share of the arrivals its share
# of the arrival window would give judges a run whose arrival rate changed
MIN_ARRIVAL_SHARE = 0.25
# ... and fewer than a Poisson stream of the same rate would give but with this chance: a
# count that small is chance (a replica of a large pool that took one call: 0 of 1 in a
# judged half happens half the time), not a changed rate
ARRIVAL_CHANCE = 0.01

# Fixed-b critical values of |t| for the OLS slope on a linear trend (with intercept),
# Bartlett kernel, bandwidth M = b * n, two-sided levels 90/95/99 %. Monte Carlo with
# iid normal errors, n = 400, 40000 replications (`benchmarks/verdict_rates.py
# --fixed-b-table`); b = 0 is the normal limit.
FIXED_B_GRID = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
FIXED_B_CV = {
    0.10: np.array([1.645, 1.717, 1.840, 2.041, 2.459, 2.824, 3.136, 3.407, 3.650, 3.887, 4.104, 4.304, 4.537]),
    0.05: np.array([1.960, 2.063, 2.232, 2.516, 3.050, 3.517, 3.922, 4.291, 4.625, 4.921, 5.208, 5.481, 5.761]),
    0.01: np.array([2.576, 2.757, 3.049, 3.506, 4.365, 5.054, 5.695, 6.233, 6.768, 7.263, 7.742, 8.197, 8.581]),
}


def fixed_b_critical_value(b: float, alpha: float = 0.05) -> float:
    """Two-sided critical value at level 1 - alpha for bandwidth fraction b in [0, 1]
    (linear interpolation in the table; alpha one of 0.10, 0.05, 0.01)."""
    key = min(FIXED_B_CV, key=lambda a: abs(a - alpha))
    if abs(key - alpha) > 1e-12:
        raise ConfigError(f"alpha must be one of {sorted(FIXED_B_CV)} for the HAC method, got {alpha!r}")
    table = FIXED_B_CV[key]
    return float(np.interp(min(max(b, 0.0), 1.0), FIXED_B_GRID, table))


def predicted_growth(rate: float, work: float, capacity: float) -> float:
    """Fluid backlog growth of a work-conserving policy: max(0, rate * work - capacity)."""
    return max(0.0, rate * work - capacity)


# ---------------------------------------------------------------------------------------
# estimators


def _ols(t: np.ndarray, w: np.ndarray):
    tc = t - t.mean()
    sxx = float(tc @ tc)
    if sxx <= 0:
        raise ConfigError("the time samples must not all be equal")
    beta = float(tc @ (w - w.mean())) / sxx
    resid = w - w.mean() - beta * tc
    return beta, tc, resid, sxx


def _autocov_sums(u: np.ndarray) -> np.ndarray:
    """gamma_l = sum_i u_i u_{i+l}, l = 0..n-1 (FFT, last axis)."""
    n = u.shape[-1]
    nfft = 1 << int(math.ceil(math.log2(2 * n)))
    f = np.fft.rfft(u, nfft, axis=-1)
    return np.fft.irfft(f * np.conj(f), nfft, axis=-1)[..., :n]


def _bartlett_weights(n: int, m: float) -> np.ndarray:
    lags = np.arange(n, dtype=float)
    return np.clip(1.0 - lags / m, 0.0, None)


def _andrews_bandwidth(u: np.ndarray) -> float:
    """Andrews (1991) AR(1) plug-in bandwidth for the Bartlett kernel."""
    n = len(u)
    den = float(u[:-1] @ u[:-1])
    if den <= 0:
        return 1.0
    rho = float(u[1:] @ u[:-1]) / den
    rho = min(max(rho, -0.99), 0.99)
    a1 = 4 * rho * rho / ((1 - rho) ** 2 * (1 + rho) ** 2)
    return max(1.0, 1.1447 * (a1 * n) ** (1.0 / 3.0))


def hac_slope(t, w, alpha: float = 0.05, b_min: float = 0.3):
    """OLS slope of w on t with a Newey-West standard error and a fixed-b critical value.
    Returns (slope, standard error, critical value, bandwidth fraction b)."""
    t = np.asarray(t, dtype=float)
    w = np.asarray(w, dtype=float)
    n = len(t)
    beta, tc, resid, sxx = _ols(t, w)
    u = tc * resid
    m = min(float(n), max(b_min * n, _andrews_bandwidth(u)))
    gam = _autocov_sums(u)
    k = _bartlett_weights(n, m)
    omega = gam[0] + 2.0 * float(k[1:] @ gam[1:])
    se = math.sqrt(max(omega, 0.0)) / sxx
    b = m / n
    return beta, se, fixed_b_critical_value(b, alpha), b


def batch_slope(t, w, alpha: float = 0.05, groups: int = 8):
    """Mean of OLS slopes in `groups` contiguous blocks, its standard error and the
    Student-t critical value with groups - 1 degrees of freedom."""
    from scipy import stats  # noqa: PLC0415 (scipy.stats costs ~1 s to import; only this method needs it)

    t = np.asarray(t, dtype=float)
    w = np.asarray(w, dtype=float)
    if groups < 2 or len(t) < 3 * groups:
        raise ConfigError(
            f"batch method needs groups >= 2 and >= 3 samples per group ({len(t)} samples, {groups} groups)"
        )
    slopes = np.array([_ols(tb, wb)[0] for tb, wb in zip(np.array_split(t, groups), np.array_split(w, groups))])
    se = float(slopes.std(ddof=1)) / math.sqrt(groups)
    return float(slopes.mean()), se, float(stats.t.ppf(1 - alpha / 2, groups - 1)), groups


# ---------------------------------------------------------------------------------------
# the verdict


@dataclass
class Verdict:
    """`verdict`: "stable", "unstable" or "inconclusive"; `reason`: why, one sentence;
    `stable`: the same as True, False or None; `unit`: what the series counts (tokens of
    unfinished work, or requests in the system), the unit of `mean_backlog` and of every
    `_per_s` field but `predicted_growth_tokens_per_s` (tokens always); `growth_per_s`:
    estimated growth g of the series over the tail;
    `ci_low`, `ci_high`: its (1 - alpha) interval; `threshold_per_s`: h;
    `threshold_rule`: how h was set; `conclusive`: the CI lies on one side of h;
    `capacity_per_s`: the capacity h scales with, if given; `predicted_growth_tokens_per_s`:
    fluid prediction of the tokens' growth, if known."""

    verdict: str
    reason: str
    growth_per_s: float
    ci_low: float
    ci_high: float
    method: str
    threshold_per_s: float
    threshold_rule: str
    alpha: float
    conclusive: bool
    samples_used: int
    tail_start_s: float
    tail_end_s: float
    unit: str = "tokens"
    capacity_per_s: float | None = None
    relative_growth: float | None = None
    predicted_growth_tokens_per_s: float | None = None
    mean_backlog: float | None = None
    detail: str = ""

    @property
    def stable(self) -> bool | None:
        """True (stable), False (unstable) or None (inconclusive)."""
        return {STABLE: True, UNSTABLE: False}.get(self.verdict)

    def to_dict(self) -> dict:
        return {"stable": self.stable, **asdict(self)}


def _decide(
    g: float, lo: float, hi: float, h: float, what: str = "the backlog", unit: str = "tokens"
) -> tuple[str, str]:
    """(verdict, reason) from the growth estimate g, its interval [lo, hi] and the
    threshold h (see the module docstring); `what` grows, counted in `unit`."""
    limit = f"the threshold {h:,.4g} {unit}/s"
    if g > h and lo > 0:
        return UNSTABLE, f"{what} grows faster than {limit}, and the growth's interval excludes 0"
    if lo > 0:
        return INCONCLUSIVE, (
            f"{what} grows (the growth's interval excludes 0), though not faster "
            f"than {limit}: a slow drift or a warm-up not over; run longer"
        )
    if hi >= h and h > 0:
        return INCONCLUSIVE, f"too short: the growth's interval holds both 0 and {limit}; run longer"
    if hi < 0:
        return STABLE, f"{what} shrinks (the growth's interval lies below 0)"
    return STABLE, f"the growth's interval holds 0 and lies below {limit}"


def _tok(x: float) -> str:
    """A growth in tokens/s for a table: whole tokens from 1 up, 3 significant digits
    below (never "-0")."""
    if x == 0:  # (-0.0 too)
        return "0"
    return f"{x:,.0f}" if abs(x) >= 1 else f"{x:.3g}"


def _poisson_cdf(n: int, mean: float) -> float:
    """P(N <= n) for N Poisson with `mean` (scipy's, in constant time: a sum of terms
    from exp(-mean) took a step per count and underflowed to 0 past a mean of 745)."""
    from scipy.special import pdtr  # noqa: PLC0415 - start-up: only a stable call's check needs it

    return float(pdtr(n, mean))


def _not_stable(
    hi, window, short, decode_time_s, decode_of, load, load_of, arrival_times, t, tt, what, time_of="decode"
) -> str | None:
    """Why a `stable` call does not stand (`stability_verdict`), or None."""
    if load is not None and load > LOAD_MARGIN:
        return (
            f"{what} shows no material growth while the offered load is {load:.0%} of {load_of} "
            f"(over {LOAD_MARGIN:.0%}): a drain or a lull, not stability; run longer"
        )
    if arrival_times is not None:
        a = arrival_times[(arrival_times >= t[0]) & (arrival_times <= t[-1])]
        if len(a):
            first = float(a.min())  # (the arrivals' window: from the first arrival to the series' end)
            start = max(float(tt[0]), first)
            span = float(t[-1]) - first
            # the judged window and each of its halves (a lull inside it hides as well as one at its end)
            mid = (start + float(tt[-1])) / 2
            for lo_s, hi_s, part in (
                (start, float(tt[-1]), "window"),
                (start, mid, "window's first half"),
                (mid, float(tt[-1]), "window's second half"),
            ):
                n_in = int(np.count_nonzero((a >= lo_s) & (a <= hi_s)))
                expected = len(a) * (hi_s - lo_s) / span if span > 0 else 0.0
                if n_in < MIN_ARRIVAL_SHARE * expected and _poisson_cdf(n_in, expected) < ARRIVAL_CHANCE:
                    return (
                        f"the arrival rate changed: {n_in} of {len(a)} arrivals in the judged {part}, "
                        f"{(hi_s - lo_s) / span:.0%} of the arrivals' time; {what} there says little about the "
                        "load; judge a steady stretch"
                    )
    if short > 1 and hi < 0:
        return (
            f"too short to call stable: {what} shrank over the judged {window:.0f} s, fewer than "
            f"{MIN_DECODE_TIMES} {decode_of} {time_of} times ({decode_time_s:.1f} s each): a drain rather "
            "than a level; run longer"
        )
    return None


def describe_verdict(summary: dict) -> str | None:
    """One line for a run's verdict in a table, from its summary: `stable (3 tok/s, [-40,
    45])`, `UNSTABLE (...)` (with the requests in the system's growth too where they were
    judged unstable: a binding k_max) or `inconclusive (...): why`; None when the run has
    none."""
    verdict = summary.get("verdict")
    if verdict is None:
        return None
    g, ci = summary.get("backlog_growth_tokens_per_s"), summary.get("backlog_growth_ci")
    nums = f" ({_tok(g)} tok/s, [{_tok(ci[0])}, {_tok(ci[1])}])" if g is not None and ci else ""
    if verdict == INCONCLUSIVE:
        reason = summary.get("verdict_reason")
        return f"inconclusive{nums}" + (f": {reason}" if reason else "")
    r, rci = summary.get("requests_growth_per_s"), summary.get("requests_growth_ci")
    if verdict == UNSTABLE and r is not None and rci and summary.get("requests_verdict") == UNSTABLE:
        # (a binding k_max: the requests in the system may be what made it unstable)
        nums += f"; requests in the system {r:,.3g}/s, [{rci[0]:,.3g}, {rci[1]:,.3g}]"
    return f"{'UNSTABLE' if verdict == UNSTABLE else 'stable'}{nums}"


def _series(values, what: str) -> np.ndarray:
    """A series of numbers as a flat float array; a ConfigError naming `what` for anything
    else (strings, None, ragged lists)."""
    try:
        a = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a sequence of numbers, got {values!r:.60}") from None
    return a


def _finite_numbers(func):
    """`func` with its keyword-only parameters annotated `float` or `float | None` checked:
    None or a finite number (numpy's too; never a string, a bool, a list), passed on as a
    Python number; a ConfigError naming the parameter otherwise."""
    params = inspect.signature(func, eval_str=True).parameters.values()
    names = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.annotation in (float, float | None)]

    @functools.wraps(func)
    def checked(*args, **kwargs):
        for name in names:
            v = kwargs.get(name)
            if v is not None:
                x = as_real(v)
                if x is None or not math.isfinite(x):
                    raise ConfigError(f"{name} must be a finite number, got {v!r:.60}")
                kwargs[name] = x
        return func(*args, **kwargs)

    return checked


@_finite_numbers
def stability_verdict(
    times,
    unfinished_tokens,
    *,
    capacity: float | None = None,
    eps: float = 0.02,
    threshold: float | None = None,
    alpha: float = 0.05,
    method: str = "hac",
    tail_fraction: float = 0.5,
    groups: int = 8,
    b_min: float = 0.3,
    predicted_growth_tokens_per_s: float | None = None,
    arrival_rate: float | None = None,
    work_per_request: float | None = None,
    decode_time_s: float | None = None,
    decode_of: str = "request",
    time_of: str = "decode",
    what: str = "the backlog",
    unit: str = "tokens",
    rate_format: str = ".0f",
    load: float | None = None,
    load_of: str = "the policy's limit",
    arrival_times=None,
    min_rise: float | None = None,
    rise_of: str = "request",
) -> Verdict:
    """Stable, unstable or inconclusive, from the unfinished-work series (see the module
    docstring).

    `decode_time_s`: how long a request decodes; over a judged window shorter than
    MIN_DECODE_TIMES of them, `unstable` needs the growth above h raised in proportion (a
    stable queue's upswing over a short window passes for growth: docs/stability.md).
    `decode_of` names what decodes in the reason ("request"; a network's work: "job"),
    `time_of` what kind of time `decode_time_s` is ("decode"; a single server's run:
    "service", `api.guard_time_s`),
    `load_of` what `load` is a share of ("the policy's limit"; a network's work: its
    bottleneck's, named).
    `what` and `unit` name the series in the reason (default: the backlog, in tokens; a
    count of requests is judged the same way with `what="the number of requests in the
    system", unit="requests"` and a threshold in requests/s); `rate_format` writes a
    growth in the reason (whole tokens/s by default; `.3g` suits requests/s).

    A `stable` call is inconclusive instead (the backlog may be draining, not level) when
    the judged window is short (under MIN_DECODE_TIMES decode times) and the growth's
    interval lies wholly below 0; when `load` (the offered load over the policy's limit,
    where theory gives one) exceeds LOAD_MARGIN; or when `arrival_times` are given and the
    judged window, or either half of it, holds fewer than MIN_ARRIVAL_SHARE of the
    arrivals its share of the arrival window (from the first arrival to the series' end)
    would give, and a count a Poisson stream of that rate falls to only with ARRIVAL_CHANCE
    (not a few arrivals' chance): the arrival rate changed.

    `min_rise` (opt-in; one server's run, and a network's replicas, pools and work, pass
    it where no k_max binds): one `rise_of`'s mean
    work in the series' units. A significant growth below h whose interval's top, over the
    judged window, adds up to less than that is a `stable` call (subject to the guards
    above), not a slow drift: a queue's backlog moves by whole requests, and a rise of
    under one across a window of many service times is the slope test's chance excursion
    (a light load's sparse spikes), not growth (docs/stability.md).

    `capacity`: token capacity b_max / t(b_max) in tokens/s (sets h = eps * capacity);
    `threshold`: an explicit h in tokens/s (overrides eps * capacity). The fluid
    prediction is `predicted_growth_tokens_per_s` if given, else computed from
    `arrival_rate`, `work_per_request` and `capacity` when all are given. The float
    parameters are finite numbers or None (`_finite_numbers`).
    """
    t, w = _series(times, "times"), _series(unfinished_tokens, "unfinished work")
    if t.shape != w.shape:
        raise ConfigError(f"times and unfinished work differ in length ({len(t)} vs {len(w)})")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(w))):
        raise ConfigError("times and unfinished work must be finite")
    if arrival_times is not None:  # checked whatever the call, not only where it is read
        arrival_times = _series(arrival_times, "arrival times")
        if not np.all(np.isfinite(arrival_times)):
            raise ConfigError("arrival times must be finite")
    if not 0 < tail_fraction <= 1:
        raise ConfigError(f"tail_fraction must be in (0, 1], got {tail_fraction!r}")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")
    if capacity is not None and not capacity > 0:
        raise ConfigError(f"capacity must be > 0 tokens/s, got {capacity!r}")
    if not eps >= 0:
        raise ConfigError(f"eps (the threshold's share of the capacity) must be >= 0, got {eps!r}")
    if decode_time_s is not None and not decode_time_s >= 0:
        raise ConfigError(f"decode_time_s must be >= 0 seconds, got {decode_time_s!r}")
    if min_rise is not None and not min_rise >= 0:
        raise ConfigError(f"min_rise must be >= 0 {unit}, got {min_rise!r}")
    # (each method's own parameter checked where it is used: groups means nothing to hac,
    # b_min nothing to batch)
    if method == "hac" and not 0 <= b_min <= 1:
        raise ConfigError(f"b_min (the HAC bandwidth's least share of the samples) must be in [0, 1], got {b_min!r}")
    if method == "batch":
        x = as_real(groups)  # (a whole-valued float, 8.0, counts as its integer)
        if x is None or not (math.isfinite(x) and x == int(x) and x >= 2):
            raise ConfigError(f"groups (the batch method's blocks) must be a whole number >= 2, got {groups!r:.60}")
        groups = int(x)
    order = np.argsort(t, kind="stable")
    t, w = t[order], w[order]
    if len(t) < 2:
        raise ConfigError("need at least two samples")
    # (a tail of the whole run keeps every sample: t[-1] - (t[-1] - t[0]) can round above t[0])
    start = t[0] if tail_fraction == 1 else t[-1] - tail_fraction * (t[-1] - t[0])
    keep = t >= start
    tt, ww = t[keep], w[keep]
    if len(tt) < 16:
        raise ConfigError(f"need at least 16 samples in the tail, got {len(tt)}; sample the backlog more often")
    if method == "hac":
        with np.errstate(all="ignore"):  # (a series too large for floats: judged below, not warned of)
            g, se, cv, b = hac_slope(tt, ww, alpha, b_min)
        desc = f"OLS slope, Newey-West/Bartlett SE, bandwidth b={b:.3f}, fixed-b critical value {cv:.3f}"
    elif method == "batch":
        with np.errstate(all="ignore"):
            g, se, cv, q = batch_slope(tt, ww, alpha, groups)
        desc = f"mean of {q} block OLS slopes, Student t({q - 1}) critical value {cv:.3f}"
    else:
        raise ConfigError(f"unknown verdict method {method!r} (known: hac, batch)")
    with np.errstate(all="ignore"):
        lo, hi = g - cv * se, g + cv * se
        mean_backlog = float(ww.mean())  # (inf for a series too large for floats: no warning)
    estimated = math.isfinite(g) and math.isfinite(lo) and math.isfinite(hi)
    if threshold is not None:
        if threshold < 0:
            raise ConfigError(f"threshold must be >= 0 tokens/s, got {threshold!r}")
        h, rule = float(threshold), "explicit threshold"
    elif capacity is not None:
        h, rule = eps * capacity, f"eps * capacity (eps={eps:g})"
    else:
        h, rule = 0.0, "0 (no capacity given: significance only)"
    if estimated:
        verdict, reason = _decide(g, lo, hi, h, what, unit)
        conclusive = lo > h or hi < h
    else:  # (a series too large for floats: its slope or interval overflowed to inf or nan)
        verdict, conclusive = INCONCLUSIVE, False
        reason = (
            f"the growth of {what} could not be estimated (its slope or interval is not a finite number: "
            f"{g:g} [{lo:g}, {hi:g}]; values too large?)"
        )
    window = float(tt[-1] - tt[0])
    if min_rise and verdict == INCONCLUSIVE and 0 < lo and hi < h and hi * window < min_rise:
        verdict, conclusive = STABLE, True
        reason = (
            f"{what} rises (the growth's interval excludes 0) by under one {rise_of}'s work "
            f"({min_rise:,.0f} {unit}) over the judged {window:.0f} s, even at the interval's top "
            f"({hi:.3g} {unit}/s): a chance excursion, not growth"
        )
    short = MIN_DECODE_TIMES * decode_time_s / window if decode_time_s and window > 0 else 0.0
    if verdict == UNSTABLE and short > 1 and not g > h * short:
        verdict, conclusive = INCONCLUSIVE, False
        reason = (
            f"too short to call unstable: the judged {window:.0f} s hold fewer than "
            f"{MIN_DECODE_TIMES} {decode_of} {time_of} times ({decode_time_s:.1f} s each), and its growth "
            f"({g:{rate_format}} {unit}/s) is below the {h * short:{rate_format}} {unit}/s that needs; run longer"
        )
    if verdict == STABLE:
        why = _not_stable(
            hi, window, short, decode_time_s, decode_of, load, load_of, arrival_times, t, tt, what, time_of
        )
        if why:
            verdict, conclusive, reason = INCONCLUSIVE, False, why
    if predicted_growth_tokens_per_s is None and None not in (arrival_rate, work_per_request, capacity):
        predicted_growth_tokens_per_s = predicted_growth(arrival_rate, work_per_request, capacity)
    return Verdict(
        verdict=verdict,
        reason=reason,
        growth_per_s=g,
        ci_low=lo,
        ci_high=hi,
        method=method,
        threshold_per_s=h,
        threshold_rule=rule,
        alpha=alpha,
        conclusive=conclusive,
        samples_used=int(len(tt)),
        tail_start_s=float(tt[0]),
        tail_end_s=float(tt[-1]),
        unit=unit,
        capacity_per_s=capacity,
        relative_growth=None if capacity is None else g / capacity,
        predicted_growth_tokens_per_s=predicted_growth_tokens_per_s,
        mean_backlog=mean_backlog,
        detail=desc,
    )


def service_steps(mean_prompt: float, mean_output: float, b_max: int) -> float:
    """A request's steps if every step served it: ceil(mean prompt / b_max) prefill steps,
    the first token among them, then mean output - 1 decode steps; at least one."""
    return max(1.0, math.ceil(mean_prompt / b_max) + mean_output - 1.0)


def short_window_time_s(service_s: float, rate: float | None) -> tuple[float, bool]:
    """The time scale of the short-window guard (`stability_verdict`'s decode_time_s) for
    a queue whose requests take `service_s` each (`service_steps` times the mean step
    time) and arrive at `rate` a second, and whether the floor set it: no less than the
    time in which MIN_JUDGED_ARRIVALS / MIN_DECODE_TIMES requests arrive, so that a judged
    window of MIN_DECODE_TIMES holds MIN_JUDGED_ARRIVALS arrivals (over fewer, the
    arrivals' own surplus, about sqrt(n) of n, passes for growth of a stable queue; a
    prefill-heavy request's service, a step or a few, is far shorter). One server's run:
    `api.guard_time_s`; a network's replicas, pools and work: `sim.network_result`."""
    floor = MIN_JUDGED_ARRIVALS / MIN_DECODE_TIMES / rate if rate else 0.0
    return max(service_s, floor), floor > service_s


def burst_factor(cv: float) -> float:
    """How many times a Poisson stream's relaxation time arrivals of squared coefficient of
    variation cv^2 take: (1 + cv^2) / 2 (Kingman) for bursty arrivals (cv > 1), else 1. The
    short-window guard's time scale is multiplied by it (`api._stability_fields`, and a
    network's replicas, pools and work: `sim.network_result`; docs/stability.md)."""
    return max(1.0, (1.0 + cv * cv) / 2.0)


def guard_time_of(floored: bool) -> str:
    """The reason's name for a `short_window_time_s` (`stability_verdict`'s time_of)."""
    gaps = MIN_JUDGED_ARRIVALS // MIN_DECODE_TIMES
    return f"service (at least {gaps} arrival gaps)" if floored else "service"
