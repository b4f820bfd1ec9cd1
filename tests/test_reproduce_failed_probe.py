"""`reproduce stability` whose rate search stopped at a failed probe showed the policy's
max stable rate as `-`, which reads as every probe inconclusive, and exited 0. It now
ends with one line naming the failed probe, exit 1; a rerun retries it."""

from __future__ import annotations

from llmsched.analysis import points, sweep
from llmsched.cli import main

ARGV = ["reproduce", "stability", "--num-requests", "300", "--search-requests", "300", "--policies", "sarathi"]
ARGV += ["--tol", "0.2", "--workers", "1", "--no-progress"]


def test_a_failed_search_probe_fails_the_run_and_a_rerun_retries_it(tmp_path, monkeypatch, capsys):
    def run(cfg: dict) -> dict:
        if cfg["workload"]["rate"] > 5:  # (the search's first probes are near lambda*, 11 req/s)
            return {"error": "RuntimeError: boom", "wall_s": 0.0}
        return points.run_point(cfg)

    out = tmp_path / "st"
    monkeypatch.setattr(sweep, "run_point", run)
    assert main([*ARGV, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "failed probe" in err and "sarathi" in err
    assert (out / "table.csv").is_file()  # (the rest of the experiment is written)
    monkeypatch.undo()
    assert main([*ARGV, "--out", str(out)]) == 0
    assert "error" not in capsys.readouterr().err
