"""Arrival seconds to the clock's whole ns: one rounding (half to even) for traces, the
simulator and its results."""

import numpy as np
from helpers import run

from llmsched.core.clock import to_clock_ns
from llmsched.workload.trace import Trace

TIES = [0.0, 0.5e-9, 1.5e-9, 2.5e-9, 3.5e-9]  # exactly 0, 0.5, 1.5, 2.5, 3.5 ns in float64


def test_seconds_round_half_to_even_onto_whole_ns():
    ns = to_clock_ns(TIES)
    assert ns.dtype == np.int64 and ns.tolist() == [0, 0, 2, 2, 4]
    assert to_clock_ns(np.float32(1.0)) == 1_000_000_000  # float64 arithmetic whatever comes in
    kept = to_clock_ns([np.nan, np.inf, 1.25], np.float64)
    assert kept.dtype == np.float64 and np.isnan(kept[0]) and kept[1] == np.inf and kept[2] == 1.25e9


def test_a_trace_the_simulator_and_its_result_take_the_same_arrival_ns():
    rows = [(t, 10, 2) for t in TIES]
    assert Trace(np.array(TIES), np.full(5, 10), np.full(5, 2)).arrival_ns().tolist() == [0, 0, 2, 2, 4]
    res, _ = run(rows, cost="const:10")
    assert res.arrival_ns.tolist() == [0, 0, 2, 2, 4]
    # the two arriving at 0 ns share the first step (10 ms); the others wait for its end,
    # so their queue times say at which ns the simulator let them arrive
    assert res.stats.queue_ns.tolist() == [0, 0, 10_000_000 - 2, 10_000_000 - 2, 10_000_000 - 4]
