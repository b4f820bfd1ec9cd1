"""A weighted histogram of positive values (inter-token gaps) in bounded memory.

Values are counted exactly while there are at most `exact_limit` distinct ones (a
load-only cost model gives few distinct step times); beyond that they fold into
logarithmic buckets of ratio `1 + 2 * rel_error`, so a percentile is off by at most
`rel_error` (0.5% by default). Mean, standard deviation, min and max are always exact (integer sums).
Percentiles interpolate between ranks like `numpy.percentile` (method 'linear').
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import mul

import numpy as np

MONOTONE_LIMIT = 1 << 40  # values (ns: 18 minutes) below which bucket runs are found by bisection
SMALL = 1 << 31  # values and weights below it: their exact sums are taken in int64 limbs
LIMB = 1 << 16  # rows summed at once in int64 (each term below 2^47: no overflow)


class GapHistogram:
    __slots__ = ("_exact", "_buckets", "_exact_limit", "_inv_log", "_log", "count", "total", "total_sq", "min", "max")

    def __init__(self, rel_error: float = 0.005, exact_limit: int = 4096):
        self._exact: dict[int, int] | None = {}
        self._buckets: dict[int, int] = {}
        self._exact_limit = exact_limit
        self._log = math.log1p(2 * rel_error)
        self._inv_log = 1.0 / self._log
        self.count = 0
        self.total = 0  # integers: exact sums of integer values
        self.total_sq = 0
        self.min = math.inf
        self.max = 0

    def add(self, value: int, weight: int = 1) -> None:
        """Add `weight` copies of `value` (an integer, e.g. nanoseconds, > 0)."""
        if weight <= 0:
            return
        self.count += weight
        self.total += value * weight
        self.total_sq += value * value * weight
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        exact = self._exact
        if exact is not None:
            exact[value] = exact.get(value, 0) + weight
            if len(exact) > self._exact_limit:
                self._fold()
        else:
            k = int(math.log(value) * self._inv_log)
            self._buckets[k] = self._buckets.get(k, 0) + weight

    def add_counts(self, counts: dict[int, int]) -> None:
        """Add `weight` copies of every `value` in `counts` ({value: weight}); the same as
        calling `add(value, weight)` for each, in any order."""
        if counts and min(counts.values()) <= 0:
            counts = {v: w for v, w in counts.items() if w > 0}
        if not counts:
            return
        # integer sums, so the order of additions is free: the builtins add a batch in C
        values, weights = counts.keys(), counts.values()
        self.count += sum(weights)
        products = list(map(mul, values, weights))
        self.total += sum(products)
        self.total_sq += sum(map(mul, products, values))
        lo, hi = min(values), max(values)
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        exact = self._exact
        if exact is None:
            self._add_to_buckets(counts)
            return
        if exact:
            get = exact.get
            for value, w in counts.items():
                exact[value] = get(value, 0) + w
        else:
            exact.update(counts)
        if len(exact) > self._exact_limit:
            self._fold()

    def add_arrays(self, values, weights) -> None:
        """Add `weights[i]` copies of `values[i]` for every i (sequences of ints of one
        length, weights >= 0; a value may repeat): the same as `add_counts` of their sums
        by value, in numpy (the simulator hands its gaps over in large batches). Buckets
        need no sort: each row's index from numpy's log, but a row whose index lies within
        1e-9 of an integer (where numpy's log and `math.log` could part) takes `math.log`'s."""
        v = np.fromiter(values, dtype=np.int64, count=len(values))
        w = np.fromiter(weights, dtype=np.int64, count=len(weights))
        keep = w > 0
        if not keep.all():
            v, w = v[keep], w[keep]
        if len(v) > LIMB:
            for start in range(0, len(v), LIMB):
                self.add_arrays(v[start : start + LIMB], w[start : start + LIMB])
            return
        if not len(v):
            return
        lo, hi = int(v.min()), int(v.max())
        if hi >= SMALL or int(w.max()) >= SMALL or self._exact is not None:
            # rare (long gaps, huge weights, huge batches) or still exact: by value
            order = np.argsort(v, kind="stable")
            v = v[order]
            starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))
            counts = dict(zip(v[starts].tolist(), np.add.reduceat(w[order], starts).tolist()))
            self.add_counts(counts)
            return
        self.count += int(w.sum())
        total, total_sq = _exact_sums(v, w)
        self.total += total
        self.total_sq += total_sq
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        x = np.log(v) * self._inv_log
        k = np.floor(x)
        near = np.flatnonzero((x - k < 1e-9) | (k + 1 - x < 1e-9))
        k = k.astype(np.int64)
        if len(near):
            log, inv_log = math.log, self._inv_log
            k[near] = [int(log(value) * inv_log) for value in v[near].tolist()]
        k0 = int(k.min())
        sums = np.bincount(k - k0, weights=w)  # float64: exact, each sum below 2^47
        buckets = self._buckets
        get = buckets.get
        for i in np.flatnonzero(sums).tolist():
            buckets[k0 + i] = get(k0 + i, 0) + int(sums[i])

    def _add_to_buckets(self, counts: dict[int, int]) -> None:
        """Bucket k = int(log(value) / log(ratio)) of each value, a run of values at a time.
        Below MONOTONE_LIMIT the logs of consecutive integers lie over 100 ulps apart, so
        the index never decreases as the value grows: sorted, the values of one bucket are
        a run, which ends about exp((k + 1) * log(ratio)), and a few logs a bucket find
        it (a run cut short is only continued by the next pass)."""
        buckets = self._buckets
        get = buckets.get
        inv_log = self._inv_log
        log = math.log
        values = sorted(counts)
        if values and values[-1] >= MONOTONE_LIMIT:
            for value in values:
                k = int(log(value) * inv_log)
                buckets[k] = get(k, 0) + counts[value]
            return
        weight = counts.__getitem__
        n = len(values)
        i = 0
        while i < n:
            k = int(log(values[i]) * inv_log)
            j = bisect_left(values, math.exp((k + 1) * self._log), i + 1)
            while j > i + 1 and int(log(values[j - 1]) * inv_log) > k:
                j -= 1
            buckets[k] = get(k, 0) + sum(map(weight, values[i:j]))
            i = j

    def merge(self, other: GapHistogram) -> None:
        """Add every value of `other`: the same as adding them one by one (the result never
        depends on the order of additions)."""
        if not other.count:
            return
        if other._exact is not None:
            self.add_counts(other._exact)
            return
        if self._exact is not None:
            self._fold()
        buckets = self._buckets
        for k, w in other._buckets.items():
            buckets[k] = buckets.get(k, 0) + w
        self.count += other.count
        self.total += other.total
        self.total_sq += other.total_sq
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def _fold(self) -> None:
        self._add_to_buckets(self._exact)
        self._exact = None

    @property
    def exact(self) -> bool:
        return self._exact is not None

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        if not self.count:
            return math.nan
        n = self.count
        return math.sqrt(max(0, self.total_sq * n - self.total * self.total)) / n

    def _points(self) -> list[tuple[float, int]]:
        if self._exact is not None:
            return sorted(self._exact.items())
        pts = []
        for k, w in sorted(self._buckets.items()):
            mid = math.exp((k + 0.5) * self._log)
            pts.append((min(max(mid, self.min), self.max), w))
        return pts

    def percentiles(self, qs) -> list[float]:
        """Values at percentiles `qs` (0-100), numpy 'linear' method over the samples."""
        if not self.count:
            return [math.nan for _ in qs]
        pts = self._points()
        out = []
        for q in qs:
            pos = q / 100.0 * (self.count - 1)
            lo = math.floor(pos)
            frac = pos - lo
            v_lo = _value_at_rank(pts, lo)
            v_hi = _value_at_rank(pts, lo + 1) if frac > 0 else v_lo
            out.append(v_lo + (v_hi - v_lo) * frac)
        return out

    def counts(self) -> list[tuple[float, int]]:
        """(value, weight) pairs: exact values, or bucket midpoints."""
        return self._points()

    def bins(self) -> list[tuple[float, int, int, int]]:
        """(value, lower, upper, weight) rows: an exact value is its own bin (lower = upper
        = value); a logarithmic bucket holds the (integer) values in [lower, upper), both
        integers, and `value` is its midpoint (clipped to the observed min and max) as in
        `counts`."""
        if self._exact is not None:
            return [(v, v, v, w) for v, w in sorted(self._exact.items())]
        log = self._log
        return [
            (min(max(math.exp((k + 0.5) * log), self.min), self.max), self._first_in(k), self._first_in(k + 1), w)
            for k, w in sorted(self._buckets.items())
        ]

    def _first_in(self, k: int) -> int:
        """The least integer value in bucket `k` or above, by `add`'s rule (so that a
        bucket's whole-number edges hold exactly its values: rounded in print, a float edge
        left the values at the edge outside their row)."""
        inv_log = self._inv_log
        v = max(1, math.ceil(math.exp(k * self._log)))
        while v > 1 and int(math.log(v - 1) * inv_log) >= k:
            v -= 1
        while int(math.log(v) * inv_log) < k:
            v += 1
        return v


def _exact_sums(v: np.ndarray, w: np.ndarray) -> tuple[int, int]:
    """(sum of v * w, sum of v * v * w) as exact integers, for at most LIMB rows of int64
    values and weights in [0, SMALL): each product p = v * w is below 2^62; cut into 16-bit
    limbs, whose products with v are below 2^47, it sums in int64 without overflow."""
    p = v * w
    total = total_sq = 0
    for shift in (0, 16, 32, 48):
        limb = (p >> shift) & 0xFFFF
        total += int(limb.sum()) << shift
        total_sq += int(np.dot(limb, v)) << shift
    return total, total_sq


def _value_at_rank(points: list[tuple[float, int]], rank: int) -> float:
    seen = 0
    for value, w in points:
        seen += w
        if rank < seen:
            return value
    return points[-1][0]
