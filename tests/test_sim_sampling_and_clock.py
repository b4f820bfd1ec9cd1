"""A user's sampling interval is bounded (all its samples stay in memory), and the run's
duration is summed in whole ns even far out on the clock."""

from __future__ import annotations

import csv
from dataclasses import replace
from decimal import Decimal

import pytest

import llmsched
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.sim.server import MAX_USER_SAMPLES


def test_an_interval_giving_more_samples_than_the_bound_is_refused_before_the_run(capsys, tmp_path):
    out = tmp_path / "run"
    code = main(["simulate", "--num-requests", "10", "--rate", "4", "--sample-interval", "0.000001", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than 1,000,000 samples" in err[0] and "arrivals alone span" in err[0]
    assert not out.exists()


def test_an_interval_passing_the_bound_during_the_drain_stops_with_one_line(capsys):
    # the arrivals span about 2 s (400,000 intervals); the drain takes the run past 5 s
    code = main(["simulate", "--num-requests", "10", "--rate", "4", "--sample-interval", "0.000005", "--out", ""])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than 1,000,000 samples" in err[0] and "the run reached" in err[0]


def test_an_interval_under_the_bound_keeps_every_sample():
    r = llmsched.simulate(cost_model="paper", rate=4, num_requests=10, seed=1, sample_interval_s=1e-4, verdict=False)
    n = len(r.timeseries["time_s"])
    assert 4096 < n < MAX_USER_SAMPLES  # not thinned as the automatic interval is


@pytest.mark.parametrize("span_s, interval_s", [(0.0, 0.01), (2.0, 0.01), (40.0, 0.04)])
def test_the_automatic_interval_is_the_span_over_1000_at_least_10_ms(tmp_path, span_s, interval_s):
    """As README and --help say: a short run (or one request) is sampled every 10 ms, not
    every span / 1000 (which the docs claimed, 0 for a single request)."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,100,400\n{span_s},100,400\n")
    r = llmsched.simulate(trace=str(trace), cost_model="paper", verdict=False)
    t = r.timeseries["time_s"]
    assert len(t) > 10 and set((t[1:] - t[:-1]).round(9)) == {interval_s}


def test_a_max_time_stop_bounds_the_span_the_check_counts():
    # arrivals span about 2 s: 1e-6 s would give 2M samples, but the stop at 0.5 s leaves 0.5M
    r = llmsched.simulate(
        cost_model="paper", rate=4, num_requests=10, seed=1, sample_interval_s=1e-6, max_time_s=0.5, verdict=False
    )
    assert len(r.timeseries["time_s"]) <= MAX_USER_SAMPLES
    with pytest.raises(ConfigError, match="more than 1,000,000 samples"):
        llmsched.simulate(cost_model="paper", rate=4, num_requests=10, seed=1, sample_interval_s=1e-6, verdict=False)


def test_duration_far_out_on_the_clock_is_exact_in_ns(tmp_path):
    """Past 2**53 ns (about 104 days) a float64 sum of arrival and latency rounds: the
    duration came out 0.887676864 s where the run's own clock gives 0.887676871 s."""
    trace = tmp_path / "late.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens\n123456789.123456789,100,5\n123456789.5,50,3\n123456790,30,2\n"
    )
    out = tmp_path / "run"
    r = llmsched.simulate(trace=str(trace), out_dir=out, verdict=False)  # (the paper model happens to sum exactly)
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    first = min(Decimal(row["arrival_s"]) for row in rows)
    last = max(Decimal(row["arrival_s"]) + Decimal(row["e2e_s"]) for row in rows)
    assert Decimal(repr(r.summary["duration"])) == last - first


def test_a_network_counts_every_replicas_samples_before_the_run(capsys):
    """16 replicas at 0.2 ms over 99 s of arrivals: 496,000 samples each, 7.9M in all (2.4 GB
    when each replica was held to the bound alone)."""
    args = ["simulate", "--cost-model", "paper", "--replicas", "16", "--rate", "160", "--num-requests", "16000"]
    assert main([*args, "--sample-interval", "0.0002", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "all 16 replicas' series together" in err[0] and "arrivals alone span" in err[0]


def test_a_network_replica_holds_its_share_of_the_bound_during_the_run():
    from llmsched.sim.network_result import simulate_network

    spec = {
        "servers": {"s": {"policy": "sarathi", "b_max": 256, "cost_model": "paper", "replicas": 2}},
        "jobs": {
            "a": {
                "arrival": {"rate": 20.0},
                "route": [{"call": {"server": "s", "prompt": "const:100", "output": "const:200"}}],
            }
        },
        "num_jobs": 20,
        "seed": 0,
    }
    # the arrivals span about 1 s (200,000 samples in all at 10 us) but the calls decode
    # for about 2 s more: each replica stops at its 500,000th sample
    with pytest.raises(ConfigError, match="all 2 replicas' series together.*the run reached"):
        simulate_network(spec, sample_interval_s=1e-5)
    ok = simulate_network(spec, sample_interval_s=1e-3)
    assert all(len(r.timeseries["time_s"]) > 1000 for r in ok.replicas())


def test_the_one_microsecond_floor_holds_for_networks_and_clusters(capsys):
    # 1e-10 s rounded to 0 ns and divided by it (ZeroDivisionError); 1e-8 s was accepted
    for interval in ("1e-10", "1e-8"):
        assert (
            main(["simulate", "--replicas", "2", "--num-requests", "50", "--sample-interval", interval, "--out", ""])
            == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "at least 1 microsecond" in err[0]


def test_a_replicas_share_of_the_bound_holds_below_4096_samples():
    """With more than 244 replicas a replica's share is under 4,096 samples; it was checked
    only from the 4,096th on (512 replicas could hold 2.1M samples)."""
    from llmsched.sim.server import TimeSeries

    series = TimeSeries(0, 1000, auto=False, replicas=500)
    assert series.limit == 2000
    with pytest.raises(ConfigError, match="all 500 replicas' series together"):
        for _ in range(2001):
            series.cols["time_s"].append(0.0)
            series._advance()
    assert len(series.cols["time_s"]) == 2000


def test_run_network_reads_the_specs_run_options():
    from llmsched.sim.network import run_network
    from llmsched.workload.network import load_network

    spec = load_network("examples/networks/tandem.yaml")
    spec = replace(spec, num_jobs=200, run={"max_time_s": 5.0})
    assert run_network(spec).end_ns <= 5.2e9
    assert run_network(spec, max_time_s=50.0).end_ns > 5.2e9


def _idle_state():
    from types import SimpleNamespace

    return SimpleNamespace(waiting=[], pending_prefill=0, n_running=1, n_decoding=1, backlog_tokens=10**9, kv_used=0)


@pytest.mark.parametrize("auto", [False, True])
def test_late_arrivals_sampled_in_a_batch_of_equal_steps_as_step_by_step(auto):
    """A batch of equal steps (a load-only cost model) is sampled by sample: the same
    samples, the late arrivals counted from the same steps, as its steps one by one."""
    from llmsched.sim.server import TimeSeries

    late = [(2_500, 100, 110), (2_500, 7, 9), (9_001, 50, 60), (40_000, 1, 2)]
    series = {}
    for durations in (1_000, [1_000] * 50):
        s = TimeSeries(0, 700 if not auto else 70, auto=auto)
        s.span(_idle_state(), 300, durations, 50, 8, 2, late)
        series[type(durations)] = s.cols
    assert series[int] == series[list]
    assert series[int]["waiting_requests"][-1] == 4  # every late arrival joined by the last step


@pytest.mark.timeout(30)
def test_a_late_arrival_does_not_walk_every_step_of_a_long_batch():
    """A request arriving during a batch of 10^12 equal steps: the samples are recorded
    without a pass over every step (the step-by-step walk took minutes at 10^9)."""
    from llmsched.sim.server import TimeSeries

    s = TimeSeries(0, 10**12, auto=False)
    s.span(_idle_state(), 0, 1_000, 10**12, 8, 0, [(1_500, 10, 20)])
    assert len(s.cols["time_s"]) == 1_000
    assert s.cols["waiting_requests"][:2] == [0, 1]  # the arrival joins from step 2 (at 2,000 ns)


# ---- the clock's end (core.state.UNLIMITED, 2**62 ns): "never" when no stop time is given ----
def _past_the_clock(**run):
    """One request whose 5,000,000-token prompt takes five chunks of up to 1,048,576 tokens
    (1e6 ms a token: up to 1.05e9 s a step): the fifth ends past 2**62 ns (4.6e9 s)."""
    trace = llmsched.Trace(arrival_s=[0.0], prompt=[5_000_000], output=[2])
    return llmsched.simulate(trace=trace, cost_model="linear:c=1,a=1e6", b_max=1 << 20, verdict=False, **run)


@pytest.mark.parametrize("fast", [True, False])
def test_a_run_going_past_the_clock_without_a_stop_is_a_clear_error(fast):
    """It stopped at 2**62 ns with the request silently unfinished (step by step, and on
    the fast path when the batch ended before 2**63 ns), or raised OverflowError storing a
    finish past 2**63 ns (the fast path's one batch for 5e6 const:1e6 steps)."""
    with pytest.raises(ConfigError, match=r"the run would go on past the simulator's clock \(4\.612e\+09 s\)"):
        _past_the_clock(fast=fast)


@pytest.mark.parametrize("output", [5_000_000, 9_300_000])
def test_the_fast_path_refuses_a_batch_past_the_clock_as_step_by_step_does(output):
    """const:1e6 steps of one request: the fast path's one batch ended past 2**62 ns and
    finished the request (5e6 steps; step by step stopped at 2**62 ns with it unfinished),
    or past 2**63 ns, where storing its finish raised OverflowError (9.3e6 steps)."""
    trace = llmsched.Trace(arrival_s=[0.0], prompt=[100], output=[output])
    with pytest.raises(ConfigError, match=r"past the simulator's clock"):
        llmsched.simulate(trace=trace, cost_model="const:1e6", verdict=False)


def test_a_stop_time_before_the_clock_ends_keeps_the_run_stopped_there():
    res = _past_the_clock(max_time_s=1e9)  # the step across the stop counts, as always
    assert res.stats.unfinished == 1 and res.stats.stop_ns == 10**18
    assert res.stats.end_ns == 1_048_576_000_001_000_064 and res.stats.steps == 1


def test_a_run_going_past_the_clock_is_one_line_and_exit_2(capsys, tmp_path):
    csv_path = tmp_path / "r.csv"
    csv_path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000000,2\n")
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(csv_path), "--cost-model", "linear:c=1,a=1e6", "--b-max", str(1 << 20)]
    for exact in ([], ["--exact"]):
        assert main([*argv, *exact, "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "past the simulator's clock" in err[0] and "--max-time" in err[0]
        assert not out.exists()


@pytest.mark.parametrize(
    "where",
    [[], ["--network", "examples/networks/cluster.yaml"], ["--serverless", "examples/serverless/small.yaml"]],
)
def test_a_stop_time_rounding_to_0_ns_is_refused(capsys, where):
    """`--max-time 1e-10` rounded to a stop at 0 ns: a run of no request that exited 0."""
    code = main(["simulate", *where, "--num-requests", "50", "--max-time", "1e-10", "--quiet", "--out", ""])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_time_s" in err[0] and "at least 1 ns" in err[0], err


def test_a_stop_time_rounding_to_1_ns_runs():
    assert main(["simulate", "--num-requests", "5", "--max-time", "6e-10", "--quiet", "--out", ""]) == 0
    with pytest.raises(ConfigError, match="at least 1 ns"):
        llmsched.simulate(num_requests=5, max_time_s=4e-10)
