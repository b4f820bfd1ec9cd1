"""`goodput_share` of no completed requests is null, as the latency statistics of no
requests are, not 0.0 (every request missed its objectives): a share of nothing is
undefined. `goodput` stays 0 req/s (a rate over the run's time)."""

from __future__ import annotations

import json
from pathlib import Path

import llmsched
from llmsched.cli import main
from llmsched.sim.serverless_result import simulate_serverless

SMALL = str(Path(__file__).resolve().parent.parent / "examples" / "serverless" / "small.yaml")
STOPPED = ["--cost-model", "paper", "--rate", "1.5", "--num-requests", "20", "--max-time", "0.01"]


def test_a_run_that_completed_nothing_has_no_share(tmp_path, capsys):
    r = llmsched.simulate(cost_model="paper", rate=1.5, num_requests=20, slo={"ttft_ms": 1000}, max_time_s=0.01)
    s = r.summary
    assert s["completed"] == 0 and s["mean_ttft_ms"] is None
    assert s["goodput_share"] is None and s["goodput"] == 0.0
    assert main(["simulate", *STOPPED, "--slo", "ttft_ms=1000", "--out", str(tmp_path / "o")]) == 0
    assert "0.00 req/s (-)" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["goodput_share"] is None


def test_a_serverless_model_that_completed_nothing_has_no_share(capsys):
    s = simulate_serverless(SMALL, slo={"ttft_ms": 1000}, max_time_s=10).summary
    models = s["models"]
    assert models["codellama-34b"]["completed"] == 0 and models["codellama-34b"]["goodput_share"] is None
    assert models["codellama-34b"]["p50_ttft_ms"] is None
    assert 0 < models["llama-3-8b"]["goodput_share"] <= 1 and 0 < s["goodput_share"] <= 1
    s = simulate_serverless(SMALL, slo={"ttft_ms": 1000}, max_time_s=1).summary
    assert s["completed"] == 0 and s["goodput_share"] is None and s["goodput"] == 0.0
    assert main(["simulate", "--serverless", SMALL, "--max-time", "1", "--slo", "ttft_ms=1000", "--out", ""]) == 0
    assert "0.00 req/s (-)" in capsys.readouterr().out
