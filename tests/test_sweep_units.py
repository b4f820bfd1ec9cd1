"""A sweep's load and rate search in the units `simulate` reports: with turns the rate
counts conversations, prefix caching lowers the work, --time-scale speeds arrivals up
(named datasets in a point's key and bad inputs: tests/test_sweep_checks.py)."""

import json

import pytest

from llmsched.analysis import sweep
from llmsched.analysis.points import critical_arrival_rate_of, critical_rate_of, resolve_point
from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.theory import requests_per_rate

BASE = dict(cost_model="paper", prompt="geometric:200", output="geometric:101", num_requests=600)
CLI = ["--cost-model", "paper", "--prompt", "geometric:200", "--output", "geometric:101"]
CLI += ["--num-requests", "600", "--workers", "1", "--no-plots"]


def one_point(tmp_path, grid, **fixed):
    res = run_sweep(None, grid, out_dir=tmp_path, workers=1, progress=False, plots=False, **{**BASE, **fixed})
    assert res.errors == 0
    (row,) = res.rows
    return row


# -- 1. turns: a load's rate counts conversations -------------------------------------


def test_a_load_with_turns_offers_that_load_of_requests(tmp_path):
    fixed = dict(turns="geometric:4", think_time_s=5)
    cfg = resolve_point(None, {**BASE, **fixed}, {"load": 0.5})
    turns = requests_per_rate(cfg.workload)
    assert turns == pytest.approx(4, rel=0.02)
    # the rate is conversations/s: lambda* (requests/s) over the mean turns
    assert cfg.workload["rate"] == pytest.approx(0.5 * critical_rate_of(cfg) / turns)
    row = one_point(tmp_path, {"load": [0.5]}, **fixed)
    # what the run itself measured: about half its critical rate (was 1.67, unstable)
    assert 0.4 < row["utilisation"] < 0.6 and row["stable"] in (True, "True")


def test_the_search_with_turns_reports_conversations_per_s(tmp_path, monkeypatch, capsys):
    fixed = dict(turns="geometric:4", think_time_s=5)
    lam = critical_arrival_rate_of(resolve_point(None, {**BASE, **fixed}, {}))
    assert lam == pytest.approx(critical_rate_of(resolve_point(None, {**BASE, **fixed}, {})) / 4, rel=0.02)

    def run(cfg):  # stable below 0.8 lambda* in offered requests/s
        stable = cfg["workload"]["rate"] < 0.8 * lam
        return {"stable": stable, "verdict": "stable" if stable else "unstable", "wall_s": 0.0}

    monkeypatch.setattr(sweep, "run_point", run)
    argv = ["sweep", *CLI, "--turns", "geometric:4", "--think-time", "5", "--grid", "policy=sarathi"]
    assert main([*argv, "--search", "max-stable-rate", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "conversations/s" in out and "above theorem 2's bound" not in out
    (row,) = json.loads((tmp_path / "search.json").read_text())
    assert row["rate_unit"] == "conversations/s"
    assert row["critical_rate"] == pytest.approx(lam)
    assert row["max_stable_load"] == pytest.approx(0.8, abs=0.05)


def test_capacity_with_turns_counts_each_conversations_turns(capsys):
    argv = ["capacity", *CLI[:6], "--turns", "geometric:4", "--think-time", "5", "--rate", "1.4", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["rate_unit"] == "conversations/s"
    assert rep["request_rate"] == pytest.approx(1.4 * rep["requests_per_rate"])
    # simulate measures about 1.9 at this rate; capacity said 49.8% and inside the region
    assert rep["utilisation"] > 1.5 and rep["inside"] is False
    assert main(argv[:-1]) == 0
    assert "conversations/s x 4 mean turns" in capsys.readouterr().out


# -- 2. prefix caching: lambda* without the cached prompt tokens ---------------------


def test_a_load_with_prefix_caching_uses_the_cached_work(tmp_path):
    fixed = dict(system_prompt=1000, prefix_caching=True)
    row = one_point(tmp_path, {"load": [0.5]}, **fixed)
    # the sweep's lambda* is the run's own (was 2.57 against the run's 10.58)
    assert critical_rate_of(resolve_point(None, {**BASE, **fixed}, {})) == pytest.approx(
        row["critical_rate"],
        rel=0.06,  # (the run's 600 prompts against 200,000 sampled)
    )
    assert 0.4 < row["utilisation"] < 0.6


# -- 4. --time-scale: the rate a load sets is run time_scale times as fast -------------


def test_a_load_with_a_time_scale_offers_that_load(tmp_path):
    cfg = resolve_point(None, {**BASE, "time_scale": 2}, {"load": 0.5})
    assert cfg.workload["rate"] == pytest.approx(0.5 * critical_rate_of(cfg) / 2)
    row = one_point(tmp_path, {"load": [0.5]}, time_scale=2)
    assert 0.4 < row["utilisation"] < 0.6  # was 1.06


def test_the_search_refuses_a_time_scale(tmp_path, capsys):
    argv = ["sweep", *CLI, "--time-scale", "2", "--grid", "policy=sarathi", "--search", "max-stable-rate"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "time_scale" in err
    assert not (tmp_path / "s").exists()
