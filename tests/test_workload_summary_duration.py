"""summary.json's `duration` and rates when no request completes (a `max_time_s` stop
before the first completion) or every request arrives at once: honest figures, never a
placeholder epsilon that turns counts into absurd rates."""

from __future__ import annotations

import json
import math

import pytest
from helpers import run

from llmsched.api import simulate

LONG = dict(rate=2, num_requests=20, prompt="const:2000", output="const:500", cost_model="paper", seed=0)
RATES = ("request_throughput", "output_throughput", "total_token_throughput")


def _first_arrival(res) -> float:
    return float(res.arrival_s.min())


def test_no_completion_reports_the_simulated_span(tmp_path):
    res = simulate(**LONG, max_time_s=3.0, out_dir=tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["completed"] == 0 and s["steps"] > 0
    # the time simulated since the first arrival, not 1e-12
    assert s["duration"] == pytest.approx(s["sim_end_s"] - _first_arrival(res))
    assert s["duration"] > 0.5
    for key in RATES:
        assert s[key] == 0.0


def test_a_stop_before_the_first_arrival_is_a_run_of_no_length(tmp_path):
    res = simulate(**LONG, max_time_s=0.5, slo={"ttft_ms": 1000}, out_dir=tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["completed"] == 0 and s["steps"] == 0 and s["arrived"] == 0
    assert s["sim_end_s"] == 0.5 < _first_arrival(res)  # the clock stopped before anyone came
    assert s["duration"] == 0.0
    for key in (*RATES, "goodput"):
        assert s[key] == 0.0  # nothing completed: no throughput, not 0 / 1e-12


def test_completed_runs_keep_first_arrival_to_last_completion():
    res = simulate(**LONG)
    s = res.summary
    last = float((res.arrival_s + res.e2e_s).max())
    assert s["completed"] == 20
    assert s["duration"] == pytest.approx(last - _first_arrival(res))
    assert s["request_throughput"] == pytest.approx(20 / s["duration"])


def test_offered_token_rate_of_simultaneous_arrivals_is_none():
    res, _ = run([(1.0, 10, 2), (1.0, 10, 2), (1.0, 5, 3)])
    s = res.summary
    assert s["offered_token_rate"] is None  # every request at once: no span to divide by
    assert s["completed"] == 3 and math.isfinite(s["request_throughput"])
    res, _ = run([(0.0, 10, 2), (2.0, 10, 2)])
    # offered_rate's (n - 1) / span requests per second times the mean tokens per request
    assert res.summary["offered_token_rate"] == pytest.approx((11 + 11) / 2 * 1 / 2.0)


def test_offered_token_rate_over_token_capacity_is_the_utilisation():
    s = simulate(cost_model="paper", rate=3, num_requests=300, prompt="geometric:200", output="geometric:80").summary
    assert s["offered_token_rate"] / s["token_capacity"] == pytest.approx(s["utilisation"], rel=1e-9)
