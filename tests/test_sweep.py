"""`llmsched sweep` / `analysis.sweep`: grid specs, resume, Ray = local, searches, CLI errors."""

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import llmsched
from llmsched.analysis import sweep
from llmsched.analysis.sweep import expand_grid, max_stable_rate, parse_grid, parse_slo, run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError, Terminated

# tiny, fast points: paper model at b_max 128 (t = 46.75 ms per step), short lengths
FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=400)


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.pop("wall_s")
    return rows


def test_parse_grid_forms():
    g = parse_grid(
        [
            "policy=sarathi,orca,vllm",
            "rate=1:20:20",
            "seed=0,1",
            "b_max=256,512",
            "cost_model=paper:c=11,a=35|linear:c=10,a=0.1",
            "k-max=none,16",
        ]
    )
    assert g["policy"] == ["sarathi", "orca", "vllm"]
    assert len(g["rate"]) == 20 and g["rate"][0] == 1.0 and g["rate"][-1] == 20.0
    assert g["seed"] == [0, 1] and g["b_max"] == [256, 512]
    assert g["cost_model"] == ["paper:c=11,a=35", "linear:c=10,a=0.1"]
    assert g["k_max"] == [None, 16]
    assert parse_grid(["num_requests=100:300:3"])["num_requests"] == [100, 200, 300]
    # mappings in YAML's flow form (the error listed slo and the option maps as grid keys,
    # but no command-line value could be one: "slo must be a mapping")
    assert parse_grid(["slo={ttft_ms: 100}|{ttft_ms: 200, itl_ms: 5}"])["slo"] == [
        {"ttft_ms": 100},
        {"ttft_ms": 200, "itl_ms": 5},
    ]
    assert parse_grid(["admission_options={beta: 0.4, alpha: 0.1}"])["admission_options"] == [
        {"beta": 0.4, "alpha": 0.1}
    ]
    with pytest.raises(ConfigError, match="cannot read '{ttft_ms: 1' as a mapping"):
        parse_grid(["slo={ttft_ms: 1"])
    assert len(expand_grid(g)) == 3 * 20 * 2 * 2 * 2 * 2
    assert expand_grid({}) == [{}]
    assert parse_slo(["p99_itl_ms=100", "median_ttft_ms=2e3"]) == {"p99_itl_ms": 100.0, "median_ttft_ms": 2000.0}


def test_ranges_of_every_integer_option_give_integers():
    # block_size (and system_prompt) were missing from a hand-kept list: 16:32:2 gave 16.0,
    # which the configuration refused as not a positive integer
    from llmsched.analysis.grid import integer_keys

    assert {"b_max", "k_max", "kv_capacity", "max_running", "block_size", "num_requests", "seed"} <= integer_keys()
    assert "system_prompt" in integer_keys() and "rate" not in integer_keys() and "prompt" not in integer_keys()
    g = parse_grid(["block_size=16:32:2", "system_prompt=0:100:3"])
    assert g == {"block_size": [16, 32], "system_prompt": [0, 50, 100]}
    assert all(type(v) is int for vals in g.values() for v in vals)
    with pytest.raises(ConfigError, match="non-integer"):
        parse_grid(["block_size=16:32:4"])


def test_cli_block_size_range_runs(tmp_path, capsys):
    argv = ["sweep", "--out", str(tmp_path / "s"), "--workers", "1", "--no-plots", "--rate", "2"]
    argv += ["--prefix-caching", "--grid", "block_size=16:32:2", "--num-requests", "30"]
    argv += ["--cost-model", "paper", "--prompt", "geometric:40", "--output", "geometric:21"]
    assert main(argv) == 0
    assert [r["block_size"] for r in read_rows(tmp_path / "s" / "results.csv")] == ["16", "32"]


@pytest.mark.parametrize("key", ["seed", "num_requests", "block_size", "b_max", "system_prompt"])
def test_cli_refuses_a_bool_for_an_integer_option(tmp_path, capsys, key):
    # float(True) == 1: seed=true silently ran seed 1
    argv = ["sweep", "--out", str(tmp_path / "s"), "--workers", "1", "--no-plots", "--rate", "2"]
    argv += ["--grid", f"{key}=true"] + ([] if key == "num_requests" else ["--num-requests", "30"])
    argv += ["--cost-model", "paper", "--prompt", "geometric:40", "--output", "geometric:21"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "True" in err
    assert not (tmp_path / "s" / "results.csv").exists()


def test_workload_spec_refuses_a_bool_seed():
    from llmsched.workload import WorkloadSpec

    for bad in (True, False):
        with pytest.raises(ConfigError, match="seed must be a whole number"):
            WorkloadSpec(rate=1.0, prompt=10, output=10, num_requests=5, seed=bad)


@pytest.mark.parametrize("bad, shown", [(float("inf"), "inf"), (float("nan"), "nan"), (1e400, "inf"), (-2, "-2")])
def test_an_infinite_or_negative_seed_is_one_line(bad, shown):
    """An infinite float seed went through int(float(seed)): an OverflowError traceback."""
    with pytest.raises(ConfigError, match=f"seed must be a whole number >= 0, got {shown}$"):
        llmsched.simulate(cost_model="paper", num_requests=20, seed=bad)


def test_a_seed_past_64_bits_is_kept_exactly_and_written_to_the_tables(tmp_path, capsys):
    """A seed went through a float (2**70 + 1 ran as 2**70), and results.parquet's int64
    column could not hold one past 2**63 - 1 (an OverflowError after every run)."""
    import pyarrow.parquet as pq

    wide = 2**70 + 1
    runs = [llmsched.simulate(cost_model="paper", num_requests=20, seed=s, verdict=False) for s in (wide, wide - 1)]
    assert runs[0].prompt.tolist() != runs[1].prompt.tolist()
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "20", "--no-plots", "--workers", "1"]
    assert main([*argv, "--grid", f"seed={wide},0", "--out", str(tmp_path / "s")]) == 0
    column = pq.read_table(tmp_path / "s" / "results.parquet").column("seed").to_pylist()
    assert sorted(column) == ["0", str(wide)]
    assert str(wide) in (tmp_path / "s" / "results.csv").read_text()
    assert main([*argv, "--grid", "seed=1e400", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("seed must be a whole number >= 0, got inf") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "spec, msg",
    [
        (["rate"], "KEY=VALUES"),
        (["colour=red"], "unknown grid key"),
        (["rate="], "no values"),
        (["rate=1,,2"], "empty value"),
        (["rate=1:5:0"], "whole number >= 1"),
        (["rate=1:5:1"], "1 point"),
        (["b_max=100:200:4"], "non-integer"),
        (["rate=1,2", "load=0.5"], "not both"),
        (["seed=1", "seed=2"], "twice"),
        (["load=-1"], "positive"),
    ],
)
def test_bad_grid_specs(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_grid(spec)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--grid", "rate"], "KEY=VALUES"),
        (["--grid", "nope=1,2"], "unknown grid key"),
        (["--grid", "rate=a:b:c"], None),
        (["--grid", "policy=nosuch", "--rate", "5"], "unknown batch policy"),
        (["--grid", "rate=1,2", "--search", "max-stable-rate"], "do not put rate"),
        (["--grid", "policy=sarathi", "--slo", "p99_itl_ms=10"], "--search"),
        (["--grid", "policy=sarathi", "--search", "max-stable-rate", "--slo", "p42_foo=1"], "unknown SLO"),
        ([], "at least one --grid"),
    ],
)
def test_cli_errors(tmp_path, capsys, argv, msg):
    code = main(["sweep", "--out", str(tmp_path / "s"), "--workers", "1", "--cost-model", "paper", *argv])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err
    if msg:
        assert msg in err


def test_resume_skips_finished_points(tmp_path, monkeypatch):
    grid = {"policy": ["sarathi", "fastertransformer"], "load": [0.5, 1.2]}
    r1 = run_sweep(None, grid, out_dir=tmp_path, workers=1, progress=False, **FIXED)
    assert (r1.ran, r1.skipped, r1.errors) == (4, 0, 0)
    assert len(list((tmp_path / "points").glob("*.json"))) == 4
    for f in ("results.csv", "results.parquet", "throughput.png", "latency.png", "max_stable_rate.png"):
        assert (tmp_path / f).is_file(), f
    rows1 = read_rows(tmp_path / "results.csv")

    def boom(cfg):
        raise AssertionError("a finished point was simulated again")

    monkeypatch.setattr(sweep, "run_point", boom)
    r2 = run_sweep(None, grid, out_dir=tmp_path, workers=1, progress=False, **FIXED)
    assert (r2.ran, r2.skipped) == (0, 4)
    assert read_rows(tmp_path / "results.csv") == rows1
    # a grown grid runs only the new points
    monkeypatch.undo()
    r3 = run_sweep(None, {**grid, "load": [0.5, 1.2, 0.8]}, out_dir=tmp_path, workers=1, progress=False, **FIXED)
    assert (r3.ran, r3.skipped) == (2, 4)
    # the table: one row per point, grid columns, config columns and metrics
    row = rows1[0]
    for col in (
        "key",
        "policy",
        "load",
        "rate",
        "b_max",
        "cost_model",
        "prompt",
        "stable",
        "p99_ttft_ms",
        "total_token_throughput",
        "backlog_growth_ci_low",
        "critical_rate",
    ):
        assert col in row, col
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "results.parquet")
    assert t.num_rows == 6 and t.schema.field("b_max").type == "int64"


SMALL = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=20)


def _two_points(out):
    """A sweep of two points into `out`: (result, the records' paths by seed)."""
    res = run_sweep(None, {"seed": [0, 1]}, out_dir=out, rate=2, workers=1, progress=False, plots=False, **SMALL)
    keys = {int(r["seed"]): r["key"] for r in res.rows}
    return res, {seed: out / "points" / f"{key}.json" for seed, key in keys.items()}


def without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_s"}


def test_a_damaged_or_mismatched_record_is_simulated_again(tmp_path):
    """Store.get took any JSON object with a summary: a null summary or a record missing
    its config or key was a traceback, an empty summary gave rows with no metrics, and
    another point's record copied over this one's file gave its metrics for this point."""
    first, path = _two_points(tmp_path)
    good = {seed: p.read_text() for seed, p in path.items()}
    rows = sorted((r["key"], r["p99_ttft_ms"], r["completed"]) for r in first.rows)
    record = json.loads(good[0])
    damaged = {
        "summary null": {**record, "summary": None},
        "no config": {k: v for k, v in record.items() if k != "config"},
        "no key": {k: v for k, v in record.items() if k != "key"},
        "config null": {**record, "config": None},
        "summary empty": {**record, "summary": {}},
        "summary of no run": {**record, "summary": {"wall_s": 0.1}},
        "a list": [record],
        "another point's": json.loads(good[1]),
    }
    for what, value in damaged.items():
        path[0].write_text(json.dumps(value))
        res, _ = _two_points(tmp_path)
        assert (res.ran, res.skipped, res.errors) == (1, 1, 0), what
        assert sorted((r["key"], r["p99_ttft_ms"], r["completed"]) for r in res.rows) == rows, what
        rewritten = json.loads(path[0].read_text())  # this point's record again, its run reproduced
        assert (rewritten["key"], rewritten["config"]) == (path[0].stem, record["config"]), what
        assert without_wall(rewritten["summary"]) == without_wall(record["summary"]), what
        assert json.loads(path[1].read_text()) == json.loads(good[1]), what  # the other point's own record stays
    path[0].write_bytes(b"\xff\xfe not text")  # (a UnicodeDecodeError, not a JSONDecodeError)
    assert _two_points(tmp_path)[0].ran == 1
    path[0].unlink()
    path[0].symlink_to(path[1])  # a link to another point's record: replaced, not written through
    assert _two_points(tmp_path)[0].ran == 1
    assert not path[0].is_symlink() and json.loads(path[1].read_text()) == json.loads(good[1])


def test_a_records_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    """Store.put left points/.KEY.PID.tmp behind when its write failed (a full disk)."""
    import pathlib

    write_text = pathlib.Path.write_text

    def full_disk(self, text, *a, **kw):
        if self.parent.name == "points":
            write_text(self, text[:10], *a, **kw)  # (part of it written)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, text, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "20", "--rate", "2", "--grid", "seed=0", "--no-plots"]
    assert main([*argv, "--workers", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "No space left on device" in err and "Traceback" not in err
    assert list((tmp_path / "points").iterdir()) == []


def test_a_new_run_clears_the_temporary_files_a_killed_run_left_in_points(tmp_path):
    _, path = _two_points(tmp_path)
    stale = [tmp_path / "points" / ".k.123.tmp", tmp_path / "points" / ".llmsched-123-abcd.tmp"]
    for p in stale:
        p.write_text('{"key": "k"')
    (tmp_path / "points" / ".notes").write_text("mine\n")  # a hidden file, not a write's: it stays
    res, _ = _two_points(tmp_path)
    assert (res.ran, res.skipped) == (0, 2)
    left = {p.name for p in (tmp_path / "points").iterdir()}
    assert left == {".notes", *(p.name for p in path.values())}


def test_ray_backend_gives_the_local_table(tmp_path):
    import ray  # a test dependency (make install-test)

    grid = {"policy": ["sarathi", "vllm"], "rate": [20.0, 60.0]}
    local = run_sweep(None, grid, out_dir=tmp_path / "local", workers=2, progress=False, **FIXED)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(None, grid, out_dir=tmp_path / "ray", backend="ray", progress=False, **FIXED)
    finally:
        ray.shutdown()
    assert local.ran == remote.ran == 4
    assert read_rows(tmp_path / "ray" / "results.csv") == read_rows(tmp_path / "local" / "results.csv")


def test_search_max_stable_rate_and_slo(tmp_path):
    # probes of 3,000 requests: shorter ones are inconclusive near lambda* (too short)
    res = max_stable_rate(
        policies=["sarathi", "fastertransformer"],
        seeds=[0],
        tol=0.1,
        slo={"p99_ttft_ms": 2000},
        out_dir=tmp_path,
        workers=1,
        progress=False,
        **{**FIXED, "num_requests": 3000},
    )
    by = {r["policy"]: r for r in res}
    lam = by["sarathi"]["critical_rate"]
    assert 0.8 * lam <= by["sarathi"]["max_stable_rate"] <= 1.15 * lam
    assert by["fastertransformer"]["max_stable_rate"] < 0.5 * lam
    for r in res:
        assert r["max_slo_rate"] <= r["max_stable_rate"] + 1e-9
        assert r["failed_rate"] is None
        # both edges to within tol: the last stable rate and the next rate probed (the
        # first inconclusive, or unstable), the last inconclusive and the first unstable
        first_not_stable = min(x for x in (r["inconclusive_low"], r["unstable_rate"]) if x is not None)
        # with no probe stable the row holds the first unstable rate, flagged as an upper bound
        last_stable = 0.0 if r["max_stable_upper_bound"] else r["max_stable_rate"]
        assert r["max_stable_rate"] == (r["unstable_rate"] if r["max_stable_upper_bound"] else last_stable)
        assert first_not_stable - last_stable <= 0.1 * lam + 1e-9
        last_not_unstable = r["inconclusive_high"] if r["inconclusive_probes"] else last_stable
        assert 0 < r["unstable_rate"] - last_not_unstable <= 0.1 * lam + 1e-9
    s = json.loads((tmp_path / "search.json").read_text())
    assert {r["policy"] for r in s} == {"sarathi", "fastertransformer"}
    # every probe's row holds its point's lambda*, as a grid's rows do (a search left it out)
    probes = read_rows(tmp_path / "results.csv")
    assert probes and all(float(p["point_critical_rate"]) == pytest.approx(lam, rel=1e-9) for p in probes)
    assert (tmp_path / "max_stable_rate.png").is_file() is False  # plots off by default in the API


def test_cli_sweep_json(tmp_path, capsys):
    argv = [
        "sweep",
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--json",
        "--cost-model",
        "paper",
        "--b-max",
        "128",
        "--prompt",
        "geometric:40",
        "--output",
        "geometric:21",
        "--num-requests",
        "300",
        "--grid",
        "policy=sarathi,orca",
        "--grid",
        "rate=10,30",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 4 and out["ran"] == 4
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["ran"] == 0


def test_cli_sweep_names_everything_it_writes(tmp_path, capsys):
    # the message left out the points/ folder of per-point records (what a rerun resumes from)
    out = tmp_path / "s"
    argv = ["sweep", "--out", str(out), "--workers", "1", "--cost-model", "paper", "--num-requests", "100"]
    assert main([*argv, "--grid", "rate=10,30", "--no-plots"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"written to {out}/: ")
    named = line.split(": ", 1)[1].split(", ")
    assert sorted(named) == sorted(p.name + "/" * p.is_dir() for p in out.iterdir())
    assert "points/" in named and len(list((out / "points").glob("*.json"))) == 2


@pytest.mark.parametrize(
    "argv, msg",
    [
        # a bisection to 1e-300 of lambda* and a search from inf ran for ever
        (["--tol", "1e-300"], "--tol: the tolerance must be a number from 0.001 to below 1, got '1e-300'"),
        (["--tol", "nan"], "--tol: the tolerance must be"),
        (["--search-hi", "inf"], "--search-hi: the search's upper end must be a number from 0.001 to 100, got 'inf'"),
    ],
)
def test_search_settings_that_never_end(tmp_path, capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        main(
            ["sweep", "--out", str(tmp_path / "s"), "--workers", "1", "--cost-model", "paper", "--num-requests", "30"]
            + ["--grid", "seed=0", "--search", "max-stable-rate", *argv]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "s").exists()


def test_sweep_slo_names_take_dashes_and_refuse_a_repeat():
    assert parse_slo(["p99-itl-ms=100", "median_ttft_ms=2000"]) == {"p99_itl_ms": 100.0, "median_ttft_ms": 2000.0}
    with pytest.raises(ConfigError, match="p99_itl_ms is given twice"):
        parse_slo(["p99_itl_ms=100", "p99-itl-ms=200"])


def _load_rows(verdicts):
    """Rows of a load grid with two seeds whose rates differ slightly (lambda* is
    computed for each seed's workload): {load: (seed 0's verdict, seed 1's)}."""
    rows = []
    for load, pair in verdicts.items():
        for seed, v in enumerate(pair):
            row = {"policy": "sarathi", "load": load, "seed": seed, "rate": load * (2.0 + 0.01 * seed)}
            row.update({"critical_rate": 2.0, "stable": v, "error": "RuntimeError: boom" if v == "failed" else None})
            rows.append(row)
    return rows


def test_the_grid_max_stable_rate_needs_every_seed_of_a_load():
    from llmsched.analysis.figures import _empirical_max_stable

    # each seed's rate stood alone: seed 0's 0.7 counted as stable although seed 1 was not
    rows = _load_rows({0.5: (True, True), 0.6: (True, True), 0.7: (True, None), 0.8: (True, False)})
    assert _empirical_max_stable(rows) == pytest.approx(0.6 * 2.0)  # the smaller of the seeds' rates
    assert _empirical_max_stable(_load_rows({0.5: (True, False)})) is None
    # a rate grid: the seeds share each rate
    rate_rows = [{"rate": r, "seed": s, "stable": r < 3} for r in (1.0, 2.0, 3.0) for s in (0, 1)]
    assert _empirical_max_stable(rate_rows) == 2.0


def test_the_grid_max_stable_bar_counts_a_failed_seed_as_not_stable(tmp_path, monkeypatch):
    from llmsched.analysis import figures

    bars = []
    monkeypatch.setattr(figures, "_plot_max_stable", lambda b, path, *a: bars.extend(b) or str(path))
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: str(path))
    rows = _load_rows({0.5: (True, True), 0.6: (True, "failed"), 0.7: (True, True)})
    figures.plot_sweep(rows, tmp_path, ["policy", "load", "seed"])
    ((label, value, lam, _),) = bars
    assert label == "sarathi" and value == pytest.approx(0.5 * 2.0) and lam == 2.0


def test_sweep_figures_place_runs_by_the_request_rate_they_offered():
    """With turns (rate in conversations/s), a time scale, or a trace at its own rate (no
    rate), the figures divided the grid's rate by lambda* (requests/s) or dropped every
    point; x is the offered request rate over lambda*, bars are offered requests/s."""
    from llmsched.analysis.figures import _empirical_max_stable, _x_of

    # a grid of conversation rates, three turns each: offered = 3 x rate
    rows = [
        {"rate": r, "offered_rate": 3 * r, "critical_rate": 3.0, "stable": r < 1.0, "error": None}
        for r in (0.4, 0.8, 1.2)
    ]
    xs, relative = _x_of(rows)
    assert relative and xs == pytest.approx([0.4, 0.8, 1.2])
    assert _empirical_max_stable(rows) == pytest.approx(2.4)  # requests/s, the axis's unit
    # a trace replayed at its own rate: no grid rate
    trace_rows = [
        {"rate": None, "offered_rate": 4.99, "critical_rate": 11.0, "stable": True, "error": None},
        {"rate": None, "offered_rate": 4.99, "critical_rate": 11.0, "stable": True, "error": None},
    ]
    xs, relative = _x_of(trace_rows)
    assert relative and xs == pytest.approx([4.99 / 11.0] * 2)
    assert _empirical_max_stable(trace_rows) == pytest.approx(4.99)


def test_a_grid_mapping_takes_arrays_ranges_and_numpy_numbers():
    """Values given as a numpy array or a range were turned into one string each
    ('[1. 2.]', 'range(0', '2)'), and a numpy load was refused."""
    import numpy as np

    from llmsched.analysis.grid import parse_grid

    g = parse_grid({"rate": np.array([1.0, 2.0]), "seed": range(2), "policy": ("sarathi", "orca")})
    assert g == {"rate": [1.0, 2.0], "seed": [0, 1], "policy": ["sarathi", "orca"]}
    assert all(type(v) is float for v in g["rate"]) and all(type(v) is int for v in g["seed"])
    assert parse_grid({"load": [np.float32(0.5), np.float64(0.75)]}) == {"load": [0.5, 0.75]}
    assert parse_grid({"policy": "sarathi,orca", "b_max": 512}) == {"policy": ["sarathi", "orca"], "b_max": [512]}


def _workers_of(pid: int) -> list[int]:
    """The live processes forked from `pid` running its command line (a pool's workers)."""
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)):
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid and Path(f"/proc/{entry}/cmdline").read_bytes() == own:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signals_as_a_shell_gives() -> None:
    """The sweep starts as from an interactive shell: no signal blocked or ignored. Both
    survive exec, and a suite started as a background job (`make test &`) ignores SIGINT:
    its sweep then lost the SIGINT and ran to its end (exit 0)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(
    "sig, code, said",
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted"), (signal.SIGKILL, -9, "")],
)
def test_a_signal_to_the_sweep_alone_stops_its_pool_workers(tmp_path, sig, code, said):
    """SIGTERM to the sweep's process (not its group) ended it at once and left its pool's
    workers waiting for work forever; SIGINT waited for the running points to end; after
    SIGKILL (nothing of the sweep runs) the workers lived on, orphaned, until killed."""
    argv = [sys.executable, "-m", "llmsched.cli", "sweep", "--cost-model", "paper", "--prompt", "geometric:200"]
    argv += ["--output", "geometric:101", "--num-requests", "40000", "--no-plots", "--workers", "2"]
    argv += ["--grid", "policy=sarathi,orca,vllm,kfcfs", "--out", str(tmp_path / "s")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_signals_as_a_shell_gives
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
            workers = _workers_of(proc.pid)
        time.sleep(0.5)  # the workers run their first points
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == code
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers)
        # (read after the workers are gone: they hold the stderr pipe open while they live)
        err = proc.stderr.read().strip()
        assert err.endswith(said)
        # with points still queued the pool's manager thread printed an InvalidStateError
        # traceback (it set an exception on the cancelled futures) before "interrupted"
        assert "Traceback" not in err and "InvalidStateError" not in err, err
    finally:
        proc.kill()
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


@pytest.mark.parametrize("sig, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_signal_swallowed_where_it_landed_still_stops_the_run(sig, raised):
    """A signal that lands while the interpreter runs a finaliser raises there and is
    swallowed; the sweep then ran on to its end and exited 0 (seen once under load). The
    backend remembers it and raises it again at the next finished point."""
    import math  # noqa: PLC0415

    from llmsched.analysis.runner import Backend  # noqa: PLC0415

    # the handlers a command line starts with (a test before may have left others: Ray's)
    before = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(raised), Backend("local", 2) as backend:
            results = backend.run([("a", 4.0), ("b", 9.0), ("c", 16.0), ("d", 25.0)], math.sqrt)
            next(results)
            try:
                os.kill(os.getpid(), sig)
                time.sleep(2)  # the handler runs here
            except KeyboardInterrupt:
                pass  # swallowed, as in a finaliser
            list(results)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_the_grid_figures_use_the_lambda_star_the_loads_use():
    """The dashed lambda* line of a load grid's max_stable_rate.png was one run's own
    `critical_rate` (from its requests: 10.889 req/s for seed 0 of 1,000 requests) while
    the loads were fractions of 11.154 (rate / load, what `llmsched capacity` reports); a
    rate grid's x axis divided by the runs' median the same way."""
    from llmsched.analysis import figures

    rows = []
    for load in (0.5, 0.95):
        for seed, (lam, run_lam) in enumerate(((11.154, 10.889), (11.145, 11.269))):
            rows.append({"policy": "sarathi", "load": load, "seed": seed, "rate": load * lam})
            rows[-1].update({"point_critical_rate": lam, "critical_rate": run_lam, "offered_rate": load * lam})
            rows[-1].update({"stable": True, "error": None})
    assert figures._lambda_star(rows) == pytest.approx((11.154 + 11.145) / 2)
    for r in rows:  # the lambda* each load is a fraction of
        assert r["rate"] / r["load"] == pytest.approx(r["point_critical_rate"])
    rate_rows = [{**r, "load": None, "offered_rate": 5.0} for r in rows]
    xs, relative = figures._x_of(rate_rows)
    assert relative and xs[0] == pytest.approx(5.0 / ((11.154 + 11.145) / 2))
    # a table written before the column: the runs' own lambda*, their median
    old = [{k: v for k, v in r.items() if k != "point_critical_rate"} for r in rows]
    assert figures._lambda_star(old) == pytest.approx((10.889 + 11.269) / 2)


def test_a_load_grid_bar_draws_the_sweeps_lambda_star(tmp_path, monkeypatch):
    from llmsched.analysis import figures

    bars = []
    monkeypatch.setattr(figures, "_plot_max_stable", lambda b, path, *a: bars.extend(b) or str(path))
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: str(path))
    res = run_sweep(
        None,
        {"policy": ["sarathi"], "load": [0.5], "seed": [0, 1]},
        out_dir=tmp_path,
        workers=1,
        progress=False,
        **{**FIXED, "num_requests": 200},
    )
    lams = sorted(r["rate"] / r["load"] for r in res.rows)
    assert [r["point_critical_rate"] for r in sorted(res.rows, key=lambda r: r["rate"])] == pytest.approx(lams)
    ((_, _, lam, _),) = bars
    assert lam == pytest.approx(sum(lams) / 2)


def test_latency_lines_average_the_seeds_of_each_grid_rate():
    """Each seed's run offers its own rate, so the seeds of one grid rate were points of
    their own and the lines zigzagged between them: one point per grid value, at the
    seeds' mean x, with the seeds' mean metric."""
    from llmsched.analysis.figures import _by_x

    offered = {(4, 0): 4.2, (4, 1): 3.9, (8, 0): 7.8, (8, 1): 8.3}
    ttft = {(4, 0): 100.0, (4, 1): 300.0, (8, 0): 1000.0, (8, 1): 3000.0}
    rows = [
        {"rate": r, "seed": s, "offered_rate": offered[r, s], "point_critical_rate": 10.0, "p99_ttft_ms": ttft[r, s]}
        for r in (4, 8)
        for s in (0, 1)
    ]
    xs, ys = _by_x(rows, "p99_ttft_ms")
    assert xs == pytest.approx([0.405, 0.805]) and ys == pytest.approx([200.0, 2000.0])


def test_search_table_names_the_policy_when_it_is_no_grid_key(tmp_path):
    """search.csv left policy_name blank (search.json null) for a --policy flag or the
    default policy: only a grid value was read."""
    out = tmp_path / "s"
    argv = ["sweep", "--cost-model", "paper", "--policy", "vllm", "--num-requests", "300", "--workers", "1"]
    argv += ["--no-plots", "--search", "max-stable-rate", "--grid", "seed=0", "--tol", "0.2", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    with open(out / "search.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["policy_name"] for r in rows] == ["vllm"]
    assert [g["policy_name"] for g in json.loads((out / "search.json").read_text())] == ["vllm"]
