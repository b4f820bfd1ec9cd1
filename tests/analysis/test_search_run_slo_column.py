"""A search's SLO limits and a grid's `slo` (per-request objectives) in one search table:
the limits were written into the `slo` column, over the grid's values, so every group's
row read the same and no longer said which grid point it was."""

import csv
import json

from llmsched.analysis.sweep import max_stable_rate
from llmsched.cli import main

FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=100)
OBJECTIVES = [{"ttft_ms": 1000}, {"ttft_ms": 2000}]


def test_grid_slo_and_search_slo_both_kept():
    res = max_stable_rate(
        policies=["orca"],
        grid={"slo": OBJECTIVES},
        slo={"p99_ttft_ms": 5000},
        tol=0.4,
        workers=1,
        progress=False,
        **FIXED,
    )
    assert [r["slo"] for r in res] == OBJECTIVES
    assert [json.loads(r["run_slo"]) for r in res] == [{"p99_ttft_ms": 5000.0}] * 2
    assert all(r["max_slo_rate"] is not None for r in res)


def test_cli_search_table_names_each_group(tmp_path, capsys):
    argv = [
        "sweep", "--cost-model", "paper", "--b-max", "128", "--prompt", "geometric:40", "--output", "geometric:21",
        "--num-requests", "100", "--no-plots", "--no-progress", "--workers", "1", "--tol", "0.4",
        "--grid", "slo={ttft_ms: 1000}|{ttft_ms: 2000}", "--search", "max-stable-rate",
        "--slo", "p99_ttft_ms=5000", "--out", str(tmp_path / "s"),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    # the printed table has the grid's column, one value per row
    assert '{"ttft_ms": 1000}' in out and '{"ttft_ms": 2000}' in out, out
    with open(tmp_path / "s" / "search.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [json.loads(r["slo"]) for r in rows] == OBJECTIVES
    assert {r["run_slo"] for r in rows} == {'{"p99_ttft_ms": 5000.0}'}
