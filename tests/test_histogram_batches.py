"""GapHistogram.add_counts (the simulator's batched inter-token gaps) equals one add() per value."""

import math

import numpy as np
import pytest

from llmsched.sim.histogram import GapHistogram


@pytest.mark.parametrize("distinct", [50, 4096, 4097, 20000])
def test_add_counts_equals_single_adds(distinct):
    rng = np.random.default_rng(distinct)
    values = rng.integers(1, 10**9, distinct)
    items = [(int(v), int(w)) for v, w in zip(rng.choice(values, 30000), rng.integers(0, 5, 30000))]
    one = GapHistogram()
    for v, w in items:
        one.add(v, w)
    batched = GapHistogram()
    for lo in range(0, len(items), 7000):  # uneven batches, repeated values within a batch
        counts = {}
        for v, w in items[lo : lo + 7000]:
            counts[v] = counts.get(v, 0) + w
        batched.add_counts(counts)
    assert batched.exact == one.exact
    assert (batched.count, batched.total, batched.total_sq, batched.min, batched.max) == (
        one.count,
        one.total,
        one.total_sq,
        one.min,
        one.max,
    )
    assert batched.counts() == one.counts()
    assert batched.percentiles((1, 50, 90, 99.9)) == one.percentiles((1, 50, 90, 99.9))


def test_zero_weights_are_not_values():
    h = GapHistogram()
    h.add_counts({5: 0, 7: 2})
    assert h.counts() == [(7, 2)] and h.min == 7 and h.count == 2


def test_merge_equals_adding_every_value():
    rng = np.random.default_rng(7)
    for sizes in ((10, 20), (3000, 3000), (10, 9000), (9000, 10), (0, 50)):
        parts = [rng.integers(1, 10**6, n) for n in sizes]
        one = GapHistogram(exact_limit=4096)
        for p in parts:
            for v in p.tolist():
                one.add(v)
        merged = GapHistogram(exact_limit=4096)
        for p in parts:
            h = GapHistogram(exact_limit=4096)
            for v in p.tolist():
                h.add(v)
            merged.merge(h)
        assert merged.count == one.count and merged.total == one.total and merged.total_sq == one.total_sq
        assert (merged.min, merged.max, merged.exact) == (one.min, one.max, one.exact)
        assert merged.percentiles((1, 50, 90, 99.9)) == one.percentiles((1, 50, 90, 99.9))


@pytest.mark.parametrize(
    "values",
    [
        range(1, 300_000),  # every integer: every bucket edge up to 0.3 ms
        range(10**9 - 50_000, 10**9 + 50_000, 3),
        [1, 2, 3, 10**6, 2**40 - 1],
        [5, 2**40, 2**40 + 1, 10**15, 10**18],  # past MONOTONE_LIMIT: one log per value
    ],
)
def test_buckets_by_runs_equal_one_log_per_value(values):
    h = GapHistogram(exact_limit=0)
    counts = {v: 1 + v % 3 for v in values}
    h.add_counts(counts)
    expected = {}
    for v, w in counts.items():
        k = int(math.log(v) * h._inv_log)
        expected[k] = expected.get(k, 0) + w
    assert h._buckets == expected


def _one_by_one(values, weights, **kw):
    h = GapHistogram(**kw)
    for v, w in zip(values, weights):
        h.add(v, w)
    return h


def _same(a: GapHistogram, b: GapHistogram) -> None:
    assert a.exact == b.exact
    assert (a.count, a.total, a.total_sq, a.min, a.max) == (b.count, b.total, b.total_sq, b.min, b.max)
    assert a.counts() == b.counts()
    assert a._buckets == b._buckets


@pytest.mark.parametrize(
    "values",
    [
        list(range(1, 300_000)),  # every integer: every bucket edge up to 0.3 ms
        list(range(10**9 - 50_000, 10**9 + 50_000, 3)),  # around 1 s
        [5, 2**31 - 1, 2**31, 2**40, 10**15, 10**18],  # past the int64-limb and bisection limits
    ],
)
def test_add_arrays_equals_one_add_per_value(values):
    """The simulator's gap rows (numpy buckets, no sort) against one `add` per value, in
    bucket mode and while exact, with repeated values, zero weights and rows past LIMB."""
    rng = np.random.default_rng(len(values))
    rows = rng.choice(values, 2 * len(values)).tolist()
    weights = rng.integers(0, 300, len(rows)).tolist()
    for exact_limit in (0, 4096, 10**7):
        batched = GapHistogram(exact_limit=exact_limit)
        for lo in range(0, len(rows), 70_000):  # uneven batches, some above LIMB rows
            batched.add_arrays(rows[lo : lo + 70_000], weights[lo : lo + 70_000])
        _same(batched, _one_by_one(rows, weights, exact_limit=exact_limit))


def test_add_arrays_exact_sums_past_int64():
    """Sums of v * v * w far beyond int64 stay exact (the limbs), huge weights too."""
    values = [2**31 - 1, 2**31 - 2, 123_456_789] * 30_000
    weights = [2**31 - 1, 5, 2**40] * 30_000
    h = GapHistogram(exact_limit=0)
    h.add_arrays(values, weights)
    _same(h, _one_by_one(values, weights, exact_limit=0))
    assert h.total_sq == sum(v * v * w for v, w in zip(values, weights))


def test_add_arrays_zero_weights_are_not_values():
    h = GapHistogram(exact_limit=0)
    h.add_arrays([3, 9, 5], [0, 2, 0])
    assert (h.count, h.min, h.max) == (2, 9, 9)
    h.add_arrays([1], [0])
    assert (h.count, h.min) == (2, 9)
