"""The automatic sampling interval thins a long drain, not the arrival window the verdict
judges: an overloaded run whose queue took 200 times its arrivals' span to drain kept
16 samples in that window (the verdict: "too short") where `--sample-interval 0.5`
called it unstable."""

from __future__ import annotations

import numpy as np

import llmsched
from llmsched.core.request import NS
from llmsched.sim.server import MAX_SAMPLES, TimeSeries

OVERLOAD = dict(
    policy="sarathi", b_max=512, cost_model="const:500", rate=100, prompt="constant:200", output="constant:2000"
)


def test_an_overloaded_run_with_a_long_drain_is_judged_unstable():
    r = llmsched.simulate(num_requests=2000, **OVERLOAD)
    t = r.timeseries["time_s"]
    assert len(t) <= MAX_SAMPLES and t[-1] > 100 * r.arrival_span_s  # thinned over a long drain
    judged = t <= t[0] + r.arrival_span_s
    assert judged.sum() > 900  # the 1,000 samples of the automatic interval, all kept
    assert r.summary["verdict"] == "unstable", r.summary["verdict_reason"]


class _Idle:
    waiting = ()
    pending_prefill = n_running = n_decoding = backlog_tokens = kv_used = 0


def test_the_drain_is_thinned_and_the_judged_samples_are_kept():
    s = TimeSeries(0, 10, auto=True, keep_until=1000 * 10)
    s.idle(_Idle, 10**7)
    t = np.round(np.asarray(s.cols["time_s"]) * NS).astype(np.int64)
    assert len(t) <= MAX_SAMPLES
    kept = t[t <= 1000 * 10]
    assert len(kept) == 1001 and set(np.diff(kept)) == {10}  # every sample up to the last arrival
    drain = t[t > 1000 * 10]
    assert len(set(np.diff(drain))) == 1 and np.diff(drain)[0] > 10  # one coarser grid after it
    assert drain[-1] + np.diff(drain)[0] >= 10**7  # and it reaches the run's end


def test_without_an_arrival_window_every_other_sample_goes():
    s = TimeSeries(0, 10, auto=True)
    s.idle(_Idle, 10**6)
    t = np.round(np.asarray(s.cols["time_s"]) * NS).astype(np.int64)
    assert len(t) <= MAX_SAMPLES and t[0] == 0 and len(set(np.diff(t))) == 1
