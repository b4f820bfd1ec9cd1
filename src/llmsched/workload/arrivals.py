"""Synthetic arrival processes (renewal processes started at time 0).

Request i arrives at the sum of the first i inter-arrival gaps, so the first arrival is at
the first gap (not at 0) and the number of arrivals in [0, T] of the Poisson process is
Poisson(rate * T).
- `Poisson(rate)`: exponential gaps with mean 1/rate.
- `Gamma(rate, cv)`: gamma gaps with mean 1/rate and coefficient of variation cv
  (shape 1/cv^2); cv = 1 is Poisson, cv > 1 bursty, cv < 1 smoother.
- `Deterministic(rate)`: gaps exactly 1/rate.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError, count_text
from ..core.request import MAX_SECONDS

__all__ = [
    "ArrivalProcess",
    "Poisson",
    "Gamma",
    "Deterministic",
    "make_arrival_process",
    "times_for_merge",
    "refuse_short_merge",
    "MAX_REQUESTS",
]

MAX_REQUESTS = 20_000_000  # guard against a typo that asks for billions of requests
#: The range of a gamma process's cv: shape 1/cv^2 stays a number numpy can draw with.
MIN_CV, MAX_CV = 1e-3, 1e3
#: The relative standard error of a gamma run's realised rate past which `simulate` warns
#: (`loose_rate`), and the one its advice aims at.
MAX_RATE_SPREAD, GOOD_RATE_SPREAD = 0.25, 0.1


def loose_rate(cv: float, n: int, unit: str = "requests") -> str | None:
    """A warning's text when `n` gamma arrivals of cv > 1 (`unit`: requests, or the
    conversations whose first turns they are) give a realised rate that spreads past
    MAX_RATE_SPREAD of the rate asked for, else None: their mean gap, 1 / (realised rate),
    has a relative standard error of cv / sqrt(n) (bursts, not a short run alone: Poisson's
    is 1 / sqrt(n)). The text names no rate, so that a sweep shows it once."""
    spread = cv / math.sqrt(max(n, 1))
    if cv <= 1 or spread <= MAX_RATE_SPREAD:
        return None
    needed = math.ceil((cv / GOOD_RATE_SPREAD) ** 2)
    advice = (
        f"ask for at least {count_text(needed)} {unit} for +-{100 * GOOD_RATE_SPREAD:.0f}%"
        if needed <= MAX_REQUESTS  # (more are refused: only a lower cv helps)
        else f"use a lower cv (+-{100 * GOOD_RATE_SPREAD:.0f}% would need {count_text(needed)} {unit}, "
        f"over the limit of {count_text(MAX_REQUESTS)})"
    )
    if spread > 1:  # (a "+-1414%" reads as a spread; past 100% the rate is no estimate at all)
        return (
            f"gamma arrivals of cv {cv:g}: the realised rate of {count_text(n)} {unit} means nothing "
            f"(cv / sqrt(n) = {spread:.3g}, over 100%): the arrivals bunch into a few bursts, at any rate "
            f"asked for; {advice}"
        )
    return (
        f"gamma arrivals of cv {cv:g}: the realised rate of {count_text(n)} {unit} varies by about "
        f"+-{100 * spread:.0f}% (cv / sqrt(n)) around the rate asked for; {advice}"
    )


def check_rate(rate) -> float:
    if isinstance(rate, bool):
        raise ConfigError(f"arrival rate must be a number of requests per second, got {rate!r}")
    try:
        r = float(rate)
    except (TypeError, ValueError):
        raise ConfigError(f"arrival rate must be a number of requests per second, got {rate!r}") from None
    if not (math.isfinite(r) and r > 0):
        raise ConfigError(f"arrival rate must be a positive number of requests per second, got {rate!r}")
    if r > MAX_RATE:
        raise ConfigError(
            f"arrival rate must be at most {MAX_RATE:g} requests per second (one a nanosecond, "
            f"the simulator's clock tick), got {rate!r}"
        )
    return r


#: the highest arrival rate: one request a nanosecond (faster ones share a clock tick)
MAX_RATE = 1e9


def check_cv(cv) -> float:
    if isinstance(cv, bool):  # float(True) is 1.0: `cv: true` was read as cv 1
        raise ConfigError(f"cv (coefficient of variation) must be a number, got {cv!r}")
    try:
        c = float(cv)
    except (TypeError, ValueError):
        raise ConfigError(f"cv (coefficient of variation) must be a number, got {cv!r}") from None
    if not (math.isfinite(c) and c > 0):
        raise ConfigError(f"cv (coefficient of variation) must be > 0, got {cv!r}")
    if not MIN_CV <= c <= MAX_CV:
        raise ConfigError(f"cv (coefficient of variation) must be between {MIN_CV:g} and {MAX_CV:g}, got {cv!r}")
    return c


def _check_times(t: np.ndarray, rate: float, time_scale: float = 1.0) -> np.ndarray:
    """`t` if its last (largest) arrival time, divided by `time_scale` as the caller will,
    is a finite number below MAX_SECONDS."""
    if len(t):
        with np.errstate(over="ignore"):
            last = float(t[-1] / time_scale) if time_scale != 1.0 else float(t[-1])
        if not (math.isfinite(last) and last < MAX_SECONDS):
            scaled = f" and time_scale {time_scale:g}" if time_scale != 1.0 else ""
            raise ConfigError(
                f"arrival times must be below {MAX_SECONDS:g} s: at rate {rate:g}/s{scaled} arrival {len(t):,} "
                f"comes at {last:g} s (raise the rate or ask for fewer arrivals)"
            )
    return t


def _undivided(duration_s: float, time_scale: float) -> float:
    """A duration on the clock of the times divided by `time_scale`, on the times' own."""
    return duration_s * time_scale if time_scale != 1.0 else duration_s


def count_over_the_limit(n: int) -> ConfigError:
    return ConfigError(f"num_requests={count_text(n)} exceeds the limit of {MAX_REQUESTS:,}")


def _duration_over_the_limit(duration_s: float, rate: float) -> ConfigError:
    """The same line for every arrival process: the count rate * duration_s is exact for
    deterministic arrivals and the expectation for random ones."""
    expect = rate * duration_s
    # a duration near the largest float times the rate overflows to inf
    count = f"about {count_text(int(expect))}" if math.isfinite(expect) else f"more than {sys.float_info.max:.3g}"
    return ConfigError(
        f"duration_s={duration_s} at rate {rate} gives {count} requests, over the limit of {MAX_REQUESTS:,}"
    )


class ArrivalProcess:
    """Base: subclasses draw `n` inter-arrival gaps (seconds)."""

    rate: float

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def times(
        self, rng: np.random.Generator, n: int | None = None, duration_s: float | None = None, time_scale: float = 1.0
    ) -> np.ndarray:
        """Arrival times: the first `n`, or all up to `duration_s` (inclusive), or the
        first n within duration_s when both are given. `time_scale` K: the caller divides
        the times by K, so they must be below the simulator's clock once divided, and
        `duration_s` is on that divided clock."""
        if n is None and duration_s is None:
            raise ConfigError("give num_requests or duration_s to stop the arrivals")
        if duration_s is None:
            if n > MAX_REQUESTS:
                raise count_over_the_limit(n)
            return _check_times(np.cumsum(self.gaps(rng, n)), self.rate, time_scale)
        duration_s = _undivided(duration_s, time_scale)
        expect = self.rate * duration_s
        if n is None and expect > MAX_REQUESTS:
            raise _duration_over_the_limit(duration_s, self.rate)
        # at most MAX_REQUESTS whatever n is (num_requests 1e12 with a duration tried to
        # allocate its whole block of gaps: 119 GiB)
        cap = MAX_REQUESTS if n is None else min(n, MAX_REQUESTS)
        # Draw in blocks so the result is the same prefix of one gap sequence however the
        # blocks fall (draws of numpy's generators are sequential).
        block = int(min(cap, expect + 6 * math.sqrt(expect) + 16))
        parts, t0, total = [], 0.0, 0
        while total < cap:
            m = min(block, cap - total)
            t = t0 + np.cumsum(self.gaps(rng, m))
            k = int(np.searchsorted(t, duration_s, side="right"))
            parts.append(t[:k])
            total += k
            if k < m:
                break
            if (n is None or n > MAX_REQUESTS) and total >= cap:
                raise _duration_over_the_limit(duration_s, self.rate)
            t0 = float(t[-1])
            block = max(block, 1024)
        return _check_times(np.concatenate(parts) if parts else np.zeros(0), self.rate, time_scale)

    def to_dict(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class Poisson(ArrivalProcess):
    rate: float

    def __post_init__(self):
        object.__setattr__(self, "rate", check_rate(self.rate))

    def gaps(self, rng, n):
        return rng.exponential(1.0 / self.rate, n)

    def to_dict(self):
        return {"arrival": "poisson", "rate": self.rate}


@dataclass(frozen=True)
class Gamma(ArrivalProcess):
    rate: float
    cv: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "rate", check_rate(self.rate))
        object.__setattr__(self, "cv", check_cv(self.cv))

    def gaps(self, rng, n):
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, 1.0 / (self.rate * shape), n)

    def to_dict(self):
        return {"arrival": "gamma", "rate": self.rate, "cv": self.cv}


@dataclass(frozen=True)
class Deterministic(ArrivalProcess):
    rate: float

    def __post_init__(self):
        object.__setattr__(self, "rate", check_rate(self.rate))

    def gaps(self, rng, n):
        return np.full(n, 1.0 / self.rate)

    def times(self, rng, n=None, duration_s=None, time_scale=1.0):
        # exact multiples of 1/rate (a cumulative sum would drift by rounding)
        if n is None and duration_s is None:
            raise ConfigError("give num_requests or duration_s to stop the arrivals")
        if duration_s is None and n > MAX_REQUESTS:
            raise count_over_the_limit(n)
        m = n if n is not None else math.inf
        if duration_s is not None:
            limit, duration_s = duration_s, _undivided(duration_s, time_scale)
            x = duration_s * self.rate
            if n is None and not x < MAX_REQUESTS + 1:
                raise _duration_over_the_limit(duration_s, self.rate)

            # the caller's time (k / rate) / time_scale against its own limit: the product
            # duration_s * time_scale is rounded (0.3 * 3 < 0.9) and dropped the arrival on
            # the boundary (at time_scale 1 both tests are the same)
            def within(k):
                return (k / self.rate) / time_scale <= limit

            # past n arrivals the duration stops none (and a product that overflows to inf
            # has no floor)
            if x < m + 1:
                k = math.floor(x)  # arrivals k / rate <= duration_s
                while within(k + 1):
                    k += 1
                while k > 0 and not within(k):
                    k -= 1
                m = min(m, k)
        if m > MAX_REQUESTS:
            raise _duration_over_the_limit(duration_s, self.rate)
        return _check_times(np.arange(1, int(m) + 1, dtype=np.float64) / self.rate, self.rate, time_scale)

    def to_dict(self):
        return {"arrival": "deterministic", "rate": self.rate}


def times_for_merge(proc: ArrivalProcess, make_rng, n: int | None, duration_s: float | None) -> tuple[np.ndarray, bool]:
    """One of several processes whose arrivals are merged and cut to the first `n`: its
    times, and whether they stop short of `n` at the simulator's clock (MAX_SECONDS). Each
    process draws `n`, so a slow one's last draws, past the clock, are often never kept:
    they are dropped here, and the caller refuses the merge only if it then holds fewer
    than `n` (a ConfigError naming the process). `make_rng()` gives the process's stream,
    a fresh generator each call (the times up to the clock are the same draws)."""
    try:
        return proc.times(make_rng(), n, duration_s), False
    except ConfigError:
        if duration_s is not None or n is None or n > MAX_REQUESTS:
            raise
    before_clock = float(np.nextafter(MAX_SECONDS, 0))
    return proc.times(make_rng(), n, before_clock), True


def refuse_short_merge(short: str, merged: int, n: int, unit: str) -> None:
    """After `times_for_merge`: refuse a merge that needs an arrival past the clock, one of
    `short` (the processes cut there, named for the message) when fewer than `n` `unit`
    arrived before it."""
    if short and merged < n:
        raise ConfigError(
            f"{short}: arrival times must be below {MAX_SECONDS:g} s (the simulator's clock), and only "
            f"{merged:,} {unit} arrive before then, not the {n:,} asked for (raise the rate or ask for fewer {unit})"
        )


def make_arrival_process(kind: str, rate, cv=None) -> ArrivalProcess:
    """`poisson`, `gamma` or `deterministic` with a rate (req/s); cv only for gamma."""
    k = str(kind).strip().lower()
    if k in ("poisson", "exponential"):
        _no_cv(k, cv)
        return Poisson(rate)
    if k == "gamma":
        return Gamma(rate, 1.0 if cv is None else cv)
    if k in ("deterministic", "constant", "uniform-spacing"):
        _no_cv(k, cv)
        return Deterministic(rate)
    # only the processes built here: trace replay is one server's (`WorkloadSpec` names it
    # in its own message), and a network or platform listing it would refuse it all the same
    raise ConfigError(f"unknown arrival process '{kind}' (known: poisson, gamma, deterministic)")


def _no_cv(kind, cv):
    if cv is not None and float(check_cv(cv)) != 1.0:
        raise ConfigError(
            f"cv={cv} applies to gamma arrivals only, not to {kind} (use arrival 'gamma' for bursty traffic)"
        )
