"""Outputs ready for analysis: the `arrived` flag of `--max-time` runs, the ITL
histogram's bucket edges, `SimResult.to_pandas()` and `simulate --parquet`."""

import csv
import json
import math
import random
import sys

import numpy as np
import pytest

import llmsched
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.sim.histogram import GapHistogram

SMALL = dict(cost_model="paper", b_max=256, rate=5, prompt="uniform:10,200", output="geometric:20", num_requests=300)
FLAGS = ["--cost-model", "paper", "--b-max", "256", "--rate", "5", "--prompt", "uniform:10,200"]
FLAGS += ["--output", "geometric:20", "--num-requests", "300"]


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_max_time_run_tells_arrived_from_never_arrived(tmp_path):
    r = llmsched.simulate(**SMALL, max_time_s=20.0, out_dir=tmp_path)
    rows = _read(tmp_path / "requests.csv")
    end = r.summary["sim_end_s"]
    arrived = [row["arrived"] == "1" for row in rows]
    # the simulator's own rule: a request arrived once the clock reached its arrival time
    assert arrived == [float(row["arrival_s"]) <= end + 1e-9 for row in rows]
    assert 0 < sum(arrived) < len(rows)  # the stop cut the trace
    assert r.summary["arrived"] == sum(arrived)
    for row, a in zip(rows, arrived):
        if row["finished"] == "1":
            assert a and row["e2e_s"] != ""
        if not a:  # never reached the server: no time of any kind
            assert row["queue_s"] == row["ttft_s"] == row["e2e_s"] == "" and row["finished"] == "0"
    # unfinished = arrived but still in the system + never arrived
    in_system = sum(1 for row, a in zip(rows, arrived) if a and row["finished"] == "0")
    assert in_system > 0
    assert r.summary["unfinished"] == in_system + (len(rows) - sum(arrived))


@pytest.mark.parametrize("max_time, arrived", [(2.5, 2), (0.5, 0), (3.0, 2), (3.000000001, 3)])
def test_an_idle_server_stops_at_max_time_before_the_next_arrival(tmp_path, max_time, arrived):
    # one request a second, each done in 94 ms: the server idles until the next arrival,
    # and must not jump (and let that request arrive) past the stop
    kw = dict(cost_model="paper", arrival="deterministic", rate=1, prompt="const:10", output="const:2")
    r = llmsched.simulate(**kw, num_requests=10, max_time_s=max_time, out_dir=tmp_path)
    rows = _read(tmp_path / "requests.csv")
    assert r.summary["arrived"] == sum(row["arrived"] == "1" for row in rows) == arrived
    assert all(float(row["arrival_s"]) <= max_time for row in rows if row["arrived"] == "1")
    assert r.summary["sim_end_s"] <= max_time + 0.1  # the clock ran to the stop (or the step across it)
    assert r.summary["unfinished"] == 10 - r.summary["completed"]


@pytest.mark.parametrize("fast", [True, False])
def test_no_request_arrives_during_the_step_across_the_stop(fast):
    # 7 ms steps; the step running at the 1 s stop ends at 1.001 s: requests at 1.0 and
    # 1.0005 s come at or after the stop and never arrive (as on serverless and networks)
    from helpers import trace

    from llmsched.core import make_cost_model
    from llmsched.policies import make_scheduler
    from llmsched.sim.result import SimResult
    from llmsched.sim.simulator import simulate_trace

    t = trace([(0.0, 10, 200), (1.0, 10, 2), (1.0005, 10, 2), (1.2, 10, 2)])
    stats = simulate_trace(t, make_scheduler("sarathi"), make_cost_model("const:7"), fast=fast, max_time_s=1.0)
    res = SimResult({}, stats, t.arrival_s, t.prompt, t.output, None)
    assert stats.end_ns > 1_000_000_000
    assert res.arrived.tolist() == [True, False, False, False] and res.summary["arrived"] == 1


def test_a_whole_run_has_every_request_arrived(tmp_path):
    r = llmsched.simulate(**SMALL, out_dir=tmp_path)
    rows = _read(tmp_path / "requests.csv")
    assert all(row["arrived"] == "1" and row["finished"] == "1" for row in rows)
    assert r.summary["arrived"] == r.summary["completed"] == 300


def test_histogram_bins_hold_their_values():
    rng = random.Random(3)
    values = [int(rng.lognormvariate(16, 0.7)) + 1 for _ in range(20000)]  # > 4096 distinct: buckets
    h = GapHistogram()
    for v in values:
        h.add(v)
    assert not h.exact
    bins = h.bins()
    assert sum(w for *_, w in bins) == len(values)
    assert [(v, w) for v, _, _, w in bins] == h.counts()
    for v, lo, hi, _ in bins:
        # (whole-number edges: the bucket's ratio, each edge rounded up to an integer)
        assert lo < hi and abs(hi / lo - 1.01) <= 2.02 / lo
    uppers = [hi for _, _, hi, _ in bins]
    for x in values:  # each value falls in exactly one bin's [lower, upper)
        k = np.searchsorted(uppers, x, side="right")
        assert bins[k][1] <= x < bins[k][2]
    exact = GapHistogram()
    exact.add(5, 2)
    exact.add(7)
    assert exact.bins() == [(5, 5, 5, 2), (7, 7, 7, 1)]


def test_itl_histogram_csv_has_bucket_edges(tmp_path):
    # the H200 profile gives many distinct step times: bucketed percentiles
    r = llmsched.simulate(rate=12, prompt="uniform:10,2000", output="geometric:40", num_requests=1500, out_dir=tmp_path)
    rows = _read(tmp_path / "itl_histogram.csv")
    assert list(rows[0]) == ["itl_ms", "lower_ms", "upper_ms", "count"]
    assert sum(int(row["count"]) for row in rows) == r.summary["itl_count"]
    lo = np.array([float(row["lower_ms"]) for row in rows])
    hi = np.array([float(row["upper_ms"]) for row in rows])
    mid = np.array([float(row["itl_ms"]) for row in rows])
    if r.summary["itl_percentiles_exact"]:
        assert (lo == mid).all() and (hi == mid).all()
    else:
        assert (lo < hi).all() and (lo <= mid + 1e-6).all() and (mid <= hi + 1e-6).all()
        assert (lo[1:] >= hi[:-1] - 1e-6).all()  # bins do not overlap
        assert lo[0] <= r.summary["median_itl_ms"] <= hi[-1]
        assert hi[-1] >= r.summary["max_itl_ms"] - 1e-6


def test_to_pandas_tables_match_the_files(tmp_path):
    import pandas as pd

    r = llmsched.simulate(**SMALL, max_time_s=30.0, record_steps=True, out_dir=tmp_path)
    t = r.to_pandas()
    assert set(t) == {"requests", "timeseries", "itl_histogram", "steps"}
    req = t["requests"]
    csv_req = pd.read_csv(tmp_path / "requests.csv", keep_default_na=True)
    assert list(req.columns) == list(csv_req.columns)
    assert len(req) == 300 and req["arrived"].dtype == bool and req["finished"].dtype == bool
    assert req["arrived"].sum() == r.summary["arrived"] and req["finished"].sum() == r.summary["completed"]
    for col in ("arrival_s", "ttft_s", "e2e_s", "tpot_s", "queue_s"):
        np.testing.assert_allclose(req[col].to_numpy(), csv_req[col].to_numpy(), atol=1e-9, equal_nan=True)
    assert (req["arrived"].astype(int) == csv_req["arrived"]).all()
    steps = t["steps"]
    assert len(steps) == r.summary["steps"]
    assert int((steps["prefill_tokens"] + steps["decode_tokens"]).max()) <= 256
    assert len(t["timeseries"]) == len(_read(tmp_path / "timeseries.csv"))
    assert t["itl_histogram"]["count"].sum() == r.summary["itl_count"]
    # without recorded steps, no steps table
    assert "steps" not in llmsched.simulate(**SMALL).to_pandas()


def test_to_pandas_without_pandas_is_one_clear_error(monkeypatch):
    r = llmsched.simulate(**SMALL)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(ConfigError, match=r"needs pandas.*llmsched\[analysis\]"):
        r.to_pandas()


def test_simulate_parquet_writes_typed_tables(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "res"
    assert main(["simulate", *FLAGS, "--max-time", "30", "--steps", "--parquet", "--out", str(out), "--quiet"]) == 0
    req = pq.read_table(out / "requests.parquet").to_pydict()
    rows = _read(out / "requests.csv")
    assert req["id"] == [int(row["id"]) for row in rows]
    assert req["arrived"] == [row["arrived"] == "1" for row in rows]
    assert req["finished"] == [row["finished"] == "1" for row in rows]
    ttft = [float(row["ttft_s"]) if row["ttft_s"] else None for row in rows]
    assert [None if x is None or math.isnan(x) else round(x, 9) for x in req["ttft_s"]] == ttft
    steps = pq.read_table(out / "steps.parquet")
    assert steps.num_rows == json.loads((out / "summary.json").read_text())["steps"]
    assert steps.column_names[-1] == "entries" and str(steps.schema.field("entries").type) == "string"
    assert pq.read_table(out / "timeseries.parquet").num_rows == len(_read(out / "timeseries.csv"))
    # a rerun without --parquet leaves no stale Parquet file behind
    assert main(["simulate", *FLAGS, "--out", str(out), "--quiet"]) == 0
    assert not list(out.glob("*.parquet"))


def test_parquet_and_pandas_tables_of_a_run_of_no_step_keep_their_types(tmp_path):
    """A --max-time stop before the first arrival: no sample, no step, yet the tables keep
    a run's column types (steps.parquet's were null, timeseries.parquet's counts double)."""
    import pyarrow.parquet as pq

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n1,100,5\n2,50,3\n")
    whole, empty = tmp_path / "whole", tmp_path / "empty"
    argv = ["simulate", "--cost-model", "paper", "--trace", str(trace), "--steps", "--parquet", "--quiet"]
    assert main([*argv, "--out", str(whole)]) == 0
    assert main([*argv, "--max-time", "0.5", "--out", str(empty)]) == 0
    for name in ("steps", "timeseries"):
        full, none = pq.read_table(whole / f"{name}.parquet"), pq.read_table(empty / f"{name}.parquet")
        assert none.num_rows == 0 and full.num_rows > 0
        assert none.schema == full.schema
    r = llmsched.simulate(cost_model="paper", trace=str(trace), max_time_s=0.5, record_steps=True)
    t = r.to_pandas()
    assert str(t["steps"]["batch_size"].dtype) == "int64" and str(t["steps"]["start_s"].dtype) == "float64"
    assert str(t["timeseries"]["running_requests"].dtype) == "int64"


def test_parquet_and_pandas_tpot_equal_requests_csv_and_goodput(tmp_path):
    """requests.parquet and to_pandas() hold requests.csv's tpot_s (the mean gap rounded up
    to the ns), so `tpot_s <= objective` counts exactly the requests goodput counts."""
    import pyarrow.parquet as pq

    out = tmp_path / "res"
    argv = ["simulate", "--cost-model", "paper", "--rate", "1", "--num-requests", "300"]
    argv += ["--prompt", "geometric:100", "--output", "geometric:50", "--slo", "tpot_ms=46.75"]
    assert main([*argv, "--parquet", "--out", str(out), "--quiet"]) == 0
    rows = _read(out / "requests.csv")
    csv_tpot = [float(row["tpot_s"]) if row["tpot_s"] else math.nan for row in rows]
    pq_tpot = pq.read_table(out / "requests.parquet").to_pydict()["tpot_s"]
    assert len(pq_tpot) == len(csv_tpot)
    for a, b in zip(pq_tpot, csv_tpot):
        assert (math.isnan(a) and math.isnan(b)) or a == b
    summary = json.loads((out / "summary.json").read_text())
    meets = sum(1 for row, t in zip(rows, pq_tpot) if row["finished"] == "1" and not t > 0.04675)
    assert meets == round(summary["goodput_share"] * summary["completed"])
    frame = llmsched.simulate(
        cost_model="paper", rate=1, num_requests=300, prompt="geometric:100", output="geometric:50"
    ).to_pandas()["requests"]
    assert [x for x in frame["tpot_s"] if not math.isnan(x)] == [x for x in csv_tpot if not math.isnan(x)]


def test_simulate_parquet_is_recorded_in_config_json(tmp_path):
    """config.json recorded --steps (record_steps) but not --parquet."""
    out = tmp_path / "res"
    assert main(["simulate", *FLAGS, "--max-time", "20", "--steps", "--parquet", "--out", str(out), "--quiet"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["record_steps"] is True and cfg["provenance"]["parquet"] is True
    assert not list(out.glob(".*.tmp"))
    # the run's config.json still reruns it; that rerun, without --parquet, records none
    again = tmp_path / "again"
    assert main(["simulate", "--config", str(out / "config.json"), "--out", str(again), "--quiet"]) == 0
    cfg2 = json.loads((again / "config.json").read_text())
    assert "parquet" not in cfg2["provenance"] and not list(again.glob("*.parquet"))
    assert cfg2["record_steps"] is True and cfg2["b_max"] == cfg["b_max"] == 256
    assert _read(again / "requests.csv") == _read(out / "requests.csv")


def test_parquet_errors_are_one_line(tmp_path, capsys, monkeypatch):
    assert main(["simulate", *FLAGS, "--parquet", "--json"]) == 2
    assert "--parquet writes requests.parquet into the output folder" in capsys.readouterr().err
    assert main(["simulate", "--replicas", "2", *FLAGS, "--parquet", "--out", str(tmp_path / "n")]) == 2
    assert "--parquet is for one server" in capsys.readouterr().err
    # a flag that does not apply is refused as such, not first for the --out it lacks
    assert main(["simulate", "--replicas", "2", *FLAGS, "--parquet", "--json"]) == 2
    assert "--parquet is for one server" in capsys.readouterr().err
    assert main(["simulate", "--replicas", "2", *FLAGS, "--steps", "--json"]) == 2
    assert "--steps is for one server" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert main(["simulate", *FLAGS, "--parquet", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--parquet needs pyarrow" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before the run


def test_timeseries_columns_mean_what_readme_says(tmp_path):
    """One request of 100 prompt and 5 output tokens, 46.75 ms steps (paper): inside its
    prefill step no request waits, yet its 100 prompt tokens are still to prefill."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n")
    r = llmsched.simulate(cost_model="paper", trace=str(trace), sample_interval_s=0.04, verdict=False)
    ts = {k: v.tolist() for k, v in r.timeseries.items()}
    # samples at 0 and 0.04 s (prefill step), 0.08 s (first decode step), then decode steps
    assert ts["waiting_requests"][:3] == [0, 0, 0] and ts["running_requests"][:3] == [1, 1, 1]
    assert ts["waiting_prefill_tokens"][:3] == [100, 100, 0]
    assert ts["decoding_requests"][:3] == [0, 0, 1]
    assert ts["token_load"][:3] == [100, 100, 1]
    assert ts["backlog_tokens"][:3] == [104, 104, 4]
