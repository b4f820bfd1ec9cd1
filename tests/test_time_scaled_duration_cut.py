"""`duration_s` with `time_scale` on synthetic arrivals: the cut is on the divided clock."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.workload import WorkloadSpec, make_trace
from llmsched.workload.arrivals import make_arrival_process
from llmsched.workload.spec import _ARRIVALS, _rng

LENGTHS = dict(prompt="const:10", output="const:2")


@pytest.mark.parametrize(
    "kw",
    [
        dict(rate=30, duration_s=0.3),
        dict(rate=10, time_scale=3, duration_s=0.3),
        dict(rate=1, time_scale=10, duration_s=0.3),
    ],
)
def test_a_time_scaled_duration_keeps_the_arrival_on_its_boundary(kw):
    """0.3 s on a clock 3x faster: 0.3 * 3 rounds to 0.8999999999999999 and the 9th
    arrival (0.9 / 3 = 0.3 s) was dropped."""
    t = make_trace(WorkloadSpec(arrival="deterministic", **LENGTHS, **kw))
    assert len(t) == round(kw["rate"] * kw.get("time_scale", 1) * kw["duration_s"])
    assert t.arrival_s[-1] <= kw["duration_s"]


def test_a_time_scaled_duration_keeps_random_arrivals():
    """The random processes' cut is the one they had (the same draws, the same count)."""
    for arrival in ("poisson", "gamma"):
        t = make_trace(WorkloadSpec(arrival=arrival, rate=4, time_scale=2.5, duration_s=30, seed=3, **LENGTHS))
        # the times on the process's own clock, cut at the duration scaled to it
        own = make_arrival_process(arrival, 4).times(_rng(3, _ARRIVALS), None, 75.0)
        np.testing.assert_array_equal(t.arrival_s, own / 2.5)
