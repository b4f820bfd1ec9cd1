"""`rate` on a trace that num_requests or duration_s cut: the replayed part itself runs at
that mean rate, (n - 1) / (t_last - t_first), for one server (`make_trace`), the CLI's
summary, a serverless platform and a sweep's `load`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsched.analysis.points import critical_rate_of, resolve_point
from llmsched.api import simulate
from llmsched.core.errors import ConfigError
from llmsched.workload import Trace, WorkloadSpec, make_trace
from llmsched.workload.serverless import load_serverless, make_serverless_requests
from llmsched.workload.trace import replay_cut

# 41 requests: 20 gaps of 1 s, then 20 of 0.1 s. The whole trace's mean rate is 40 / 22
# req/s; its first 11 requests run at 1 req/s.
DRIFT = np.concatenate([np.arange(21.0), 20.0 + 0.1 * np.arange(1, 21)])


def _write(path, arrival) -> str:
    Trace(arrival, np.full(len(arrival), 10), np.full(len(arrival), 2)).to_csv(path)
    return str(path)


@pytest.fixture
def drift(tmp_path) -> str:
    return _write(tmp_path / "drift.csv", DRIFT)


def test_num_requests_cut_runs_at_the_rate(drift):
    tr = make_trace(WorkloadSpec(trace=drift, rate=2.0, num_requests=11))
    # the whole trace's rate (1.82/s) would have replayed this head at 1.1 req/s
    assert len(tr) == 11 and tr.mean_rate == pytest.approx(2.0)
    assert np.allclose(tr.arrival_s, DRIFT[:11] / 2.0)  # the same requests, only faster


def test_duration_cut_runs_at_the_rate(drift):
    tr = make_trace(WorkloadSpec(trace=drift, rate=2.0, duration_s=5.0))
    # a trace starting at 0: floor(R * D) + 1 requests, the last at (n - 1) / R = D
    assert len(tr) == 11 and tr.mean_rate == pytest.approx(2.0)
    assert tr.arrival_s[-1] <= 5.0
    assert np.allclose(tr.arrival_s, np.arange(11) / 2.0)


def test_both_cuts_the_earlier_wins(drift):
    a = make_trace(WorkloadSpec(trace=drift, rate=2.0, duration_s=5.0, num_requests=6))
    assert len(a) == 6 and a.mean_rate == pytest.approx(2.0)
    b = make_trace(WorkloadSpec(trace=drift, rate=2.0, duration_s=5.0, num_requests=30))
    assert len(b) == 11 and b.mean_rate == pytest.approx(2.0)


def test_whole_trace_and_time_scale_unchanged(drift):
    whole = make_trace(WorkloadSpec(trace=drift, rate=4.0))
    assert len(whole) == len(DRIFT) and np.allclose(whole.arrival_s, DRIFT / (4.0 / (40 / 22)))
    # time_scale divides the times, then cuts in the scaled clock, as before
    ts = make_trace(WorkloadSpec(trace=drift, time_scale=2.0, duration_s=5.0))
    assert np.array_equal(ts.arrival_s, DRIFT[DRIFT / 2.0 <= 5.0] / 2.0)


@pytest.mark.parametrize("rate", [0.3, 1.0, 2.5, 7.0])
@pytest.mark.parametrize("duration_s", [3.0, 10.0, 40.0])
def test_duration_cut_of_an_irregular_trace_starting_late(tmp_path, rate, duration_s):
    """A trace whose first request comes at 3 s (kept, scaled) and whose rate drifts: the
    replayed head has mean rate R, arrives by D, and is the longest such head."""
    gaps = np.random.default_rng(1).exponential(np.linspace(0.2, 2.0, 400))
    arrival = 3.0 + np.concatenate([[0.0], np.cumsum(gaps)])
    path = _write(tmp_path / "late.csv", arrival)
    try:
        tr = make_trace(WorkloadSpec(trace=path, rate=rate, duration_s=duration_s))
    except ConfigError as e:
        assert "fewer than two" in str(e)
        return
    n = len(tr)
    assert tr.mean_rate == pytest.approx(rate, rel=1e-9)
    assert tr.arrival_s[-1] <= duration_s
    assert np.allclose(tr.arrival_s, arrival[:n] * (tr.arrival_s[-1] / arrival[n - 1]))
    if n < len(arrival):  # one more request, at its own head's rate, would come after D
        k = rate * (arrival[n] - arrival[0]) / n
        assert arrival[n] / k > duration_s


def test_replay_cut_rounding_keeps_every_arrival_by_the_duration():
    arrival = np.arange(50.0)
    for rate, d in [(0.1, 30.0), (3.0, 7.0), (2.0, 10.0), (0.7, 10.0)]:
        k, n = replay_cut(arrival, rate=rate, duration_s=d)
        assert n == math.floor(rate * d + 1e-9) + 1
        assert arrival[n - 1] / k <= d
        assert (n - 1) / (arrival[n - 1] / k) == pytest.approx(rate, rel=1e-12)


def test_replay_cut_just_below_a_whole_duration_is_instant_and_keeps_floor_rd_plus_one():
    # a duration a hair below R * D's whole value: a wide rounding slack let the request at
    # D in, then stepped the scale one float at a time for seconds to keep it by D
    arrival = np.arange(2000.0) * 0.7
    for d in (999.9999995, 999.99999905, 1000.0):
        k, n = replay_cut(arrival, rate=1.0, duration_s=d)
        assert n == math.floor(d + 1e-9) + 1 and arrival[n - 1] / k <= d
        assert (n - 1) / (arrival[n - 1] / k) == pytest.approx(1.0, rel=1e-12)


def test_no_rate_from_fewer_than_two_requests(drift):
    with pytest.raises(ConfigError, match="its one request has no rate .that takes two requests at different times"):
        make_trace(WorkloadSpec(trace=drift, rate=2.0, num_requests=1))
    with pytest.raises(ConfigError, match=r"within duration_s=0\.4: .*fewer than two"):
        make_trace(WorkloadSpec(trace=drift, rate=2.0, duration_s=0.4))


def test_summary_offered_rate_is_the_asked_rate(drift):
    res = simulate(arrival=f"trace:{drift}", rate=2.0, num_requests=11, cost_model="const:10")
    assert res.summary["offered_rate"] == pytest.approx(2.0)
    res = simulate(arrival=f"trace:{drift}", rate=2.0, duration_s=5.0, cost_model="const:10")
    assert res.summary["num_requests"] == 11 and res.summary["offered_rate"] == pytest.approx(2.0)


def _serverless(workload: dict) -> dict:
    return {
        "cluster": {
            "remote_bandwidth_gbps": 2.0,
            "nodes": [{"count": 1, "gpus": 1, "gpu_memory_gb": 80, "dram_gb": 50, "ssd_gb": 100}],
        },
        "models": {"m": {"weights_gb": 10, "cost_model": "const:10"}},
        "workload": workload,
        "platform": {"init_s": 0, "keep_alive_s": "never"},
    }


def test_serverless_trace_follows_the_same_rule(drift):
    for cut, n in (({"num_requests": 11}, 11), ({"duration_s": 5.0}, 11), ({"num_requests": 6}, 6)):
        reqs = make_serverless_requests(load_serverless(_serverless({"trace": drift, "rate": 2.0, **cut})))
        assert len(reqs) == n
        assert (n - 1) / (reqs.arrival_s[-1] - reqs.arrival_s[0]) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="workload.trace: .*no rate .that takes two requests at different times"):
        make_serverless_requests(load_serverless(_serverless({"trace": drift, "rate": 2.0, "num_requests": 1})))


def test_sweep_load_is_the_replayed_rate_over_lambda_star(drift):
    """A sweep sets rate = load x lambda*: the trace it replays then runs at that rate."""
    config = {"cost_model": "paper", "b_max": 512, "workload": {"trace": drift, "num_requests": 11}}
    cfg = resolve_point(config, params={"load": 0.5})
    lam = critical_rate_of(cfg)
    assert cfg.workload["rate"] == pytest.approx(0.5 * lam)
    assert make_trace(cfg.workload).mean_rate == pytest.approx(0.5 * lam)


def test_a_replay_past_one_request_a_nanosecond_is_refused(drift, capsys):
    """`--rate 1e10` on a trace, or a `--time-scale` that speeds a trace or a synthetic
    process past 1e9 req/s, ran with many requests on one clock tick."""
    from helpers import one_line_error

    with pytest.raises(ConfigError, match=r"cannot rescale the trace to 1e\+10 req/s: at most 1e\+09"):
        make_trace(WorkloadSpec(trace=drift, rate=1e10, num_requests=11))
    # the first 11 requests run at 1 req/s: time_scale 1e9 is one a nanosecond, just allowed
    assert make_trace(WorkloadSpec(trace=drift, time_scale=1e9, num_requests=11)).mean_rate == pytest.approx(1e9)
    with pytest.raises(ConfigError, match=r"11 requests replayed at time_scale 2e\+09 arrive at a mean rate of 2e\+09"):
        make_trace(WorkloadSpec(trace=drift, time_scale=2e9, num_requests=11))
    assert make_trace(WorkloadSpec(trace=drift, rate=1e9, num_requests=11)).mean_rate == pytest.approx(1e9)
    with pytest.raises(ConfigError, match=r"workload.trace: .*at most 1e\+09"):
        make_serverless_requests(load_serverless(_serverless({"trace": drift, "rate": 1e10})))
    with pytest.raises(ConfigError, match=r"workload.trace: .*time_scale 1e\+12"):
        make_serverless_requests(load_serverless(_serverless({"trace": drift, "time_scale": 1e12})))
    synthetic = ["simulate", "--cost-model", "const:1", "--prompt", "10", "--output", "2", "--num-requests", "5"]
    one_line_error(capsys, [*synthetic, "--rate", "1e9", "--time-scale", "1000", "--out", ""], "offers 1e+12 req/s")
    one_line_error(capsys, ["simulate", "--trace", drift, "--rate", "1e10", "--out", ""], "at most 1e+09")
    one_line_error(capsys, ["simulate", "--trace", drift, "--time-scale", "1e12", "--out", ""], "mean rate of")


def test_a_traces_own_burst_within_a_nanosecond_replays_as_one_timestamps(tmp_path):
    """4 arrivals within 1 ns (a mean rate of 1e10 req/s) were refused at time_scale 1,
    while the same burst at one timestamp ran: on the ns clock both are one burst, in the
    trace's order. Only a time scale that speeds the replay past 1e9 req/s is refused."""
    prompts, outputs = np.array([40, 10, 30, 20]), np.array([2, 5, 3, 4])  # (their order shows)
    close, same = str(tmp_path / "close.csv"), str(tmp_path / "same.csv")
    Trace(np.array([0.0, 1e-10, 2e-10, 3e-10]), prompts, outputs).to_csv(close)
    Trace(np.zeros(4), prompts, outputs).to_csv(same)
    runs = [simulate(trace=t, cost_model="const:1", verdict=False) for t in (close, same)]
    columns = [r.request_columns() for r in runs]
    assert columns[0]["arrival_s"].tolist() == [0.0] * 4
    assert columns[0]["prompt_tokens"].tolist() == prompts.tolist()
    for name in ("id", "output_tokens", "ttft_s", "e2e_s"):
        assert columns[0][name].tolist() == columns[1][name].tolist()
    assert len(make_trace(WorkloadSpec(trace=close, time_scale=0.5))) == 4  # slowed, still past 1e9
    with pytest.raises(ConfigError, match=r"4 requests replayed at time_scale 2 arrive at a mean rate of 2e\+10"):
        make_trace(WorkloadSpec(trace=close, time_scale=2))
