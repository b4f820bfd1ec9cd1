"""A sweep point's key does not depend on whether a number was given as an int or a float:
`--grid rate=2` and `--grid rate=2.0`, `--think-time 1` and `--grid think_time_s=1`,
`run_sweep(max_time_s=60, cv=2)` and `--max-time 60 --cv 2` are one point each, so a rerun
skips it (docs/stability.md: "a rerun skips finished points"). Keys of points made with
the CLI's float flags are the ones they were."""

import hashlib
import json

import pyarrow.parquet as pq
import pytest

from llmsched.analysis.points import KEY_VERSION, _by_absolute_paths, point_key, resolve_point
from llmsched.analysis.sweep import run_sweep
from llmsched.api import build_config
from llmsched.cli import main

FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=100)
CLI = ["--cost-model", "paper", "--b-max", "128", "--prompt", "geometric:40", "--output", "geometric:21"]
CLI += ["--num-requests", "100", "--no-plots", "--quiet"]


def old_key(cfg, version: str = KEY_VERSION) -> str:
    """The key as llmsched made it before numbers were normalised (no files, built-in policies)."""
    key = {"v": version, "config": _by_absolute_paths(cfg.to_dict())}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


@pytest.mark.parametrize(
    ("as_int", "as_float"),
    [
        ({"rate": 2}, {"rate": 2.0}),
        ({"rate": 2, "think_time_s": 1, "turns": 3}, {"rate": 2.0, "think_time_s": 1.0, "turns": 3}),
        (
            {"rate": 3, "arrival": "gamma", "cv": 2, "max_time_s": 60},
            {"rate": 3.0, "arrival": "gamma", "cv": 2.0, "max_time_s": 60.0},
        ),
        (
            {"rate": 3, "time_scale": 2, "sample_interval_s": 1},
            {"rate": 3.0, "time_scale": 2.0, "sample_interval_s": 1.0},
        ),
        ({"duration_s": 5, "rate": 2.0}, {"duration_s": 5.0, "rate": 2.0}),
        ({"rate": 2.0, "num_requests": 100.0, "seed": 1.0}, {"rate": 2.0, "num_requests": 100, "seed": 1}),
    ],
)
def test_int_and_float_give_one_key(as_int, as_float):
    a = resolve_point(None, {**FIXED, **as_int})
    b = resolve_point(None, {**FIXED, **as_float})
    assert point_key(a) == point_key(b)
    assert a.to_dict() == b.to_dict()
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)


def test_keys_of_float_configurations_are_unchanged():
    # what the CLI's float flags make: their points keep the keys they were stored under
    for over in ({"rate": 2.0}, {"rate": 3.0, "arrival": "gamma", "cv": 2.0, "max_time_s": 60.0}):
        cfg = resolve_point(None, {**FIXED, **over})
        assert point_key(cfg) == old_key(cfg)
    # and one pinned key, computed by the code before the change
    cfg = resolve_point(None, {**FIXED, "num_requests": 400, "rate": 2.0})
    # (under the key version of before 2026-12-03's result changes, a partial block's hits,
    # a rise of under one request: its points are simulated again, once)
    # and of 2026-12-04's verdict changes (adaptive's threshold, sampling, back-pressure)
    assert old_key(cfg, "llmsched-sweep-1") == "c48f60d730edee8da928"
    assert old_key(cfg, "llmsched-sweep-2") == "0f64edaf316a43a61dbf"
    assert point_key(cfg) == "01faf4c37fdaead547da" not in ("c48f60d730edee8da928", "0f64edaf316a43a61dbf")


def test_point_key_of_a_mapping_normalises_too():
    cfg = build_config(None, **FIXED, rate=2.0, max_time_s=60.0)
    d = cfg.to_dict()
    d["max_time_s"] = 60
    d["workload"] = {**d["workload"], "rate": 2}
    assert point_key(d) == point_key(cfg)


def test_cli_grid_int_then_float_reruns_nothing(tmp_path, capsys):
    out = str(tmp_path / "kt")
    assert main(["sweep", *CLI, "--grid", "rate=2,4", "--out", out]) == 0
    capsys.readouterr()
    assert main(["sweep", *CLI, "--grid", "rate=2.0,4.0", "--out", out, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["ran"], rep["skipped"]) == (0, 2)
    assert len(list((tmp_path / "kt" / "points").glob("*.json"))) == 2


def test_python_and_cli_share_points_and_column_types(tmp_path, capsys):
    out = tmp_path / "mt"
    res = run_sweep(
        grid={"rate": [2]}, out_dir=out, progress=False, plots=False, arrival="gamma", max_time_s=60, cv=2, **FIXED
    )
    assert res.ran == 1
    schema = pq.read_schema(out / "results.parquet")
    assert str(schema.field("max_time_s").type) == "double"
    assert str(schema.field("rate").type) == "double"
    args = ["sweep", *CLI, "--arrival", "gamma", "--max-time", "60", "--cv", "2", "--grid", "rate=2.0"]
    assert main([*args, "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["ran"], rep["skipped"]) == (0, 1)
    # a grid of the time option itself: one point with the flag's
    assert (
        main(
            ["sweep", *CLI, "--arrival", "gamma", "--grid", "cv=2", "--grid", "max_time_s=60", "--rate", "2"]
            + ["--out", str(out), "--json"]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert (rep["ran"], rep["skipped"]) == (0, 1)
    assert str(pq.read_schema(out / "results.parquet").field("max_time_s").type) == "double"
