"""A pool worker killed while it ran a point (the out-of-memory killer, kill -9, a crash)
broke the pool, and the sweep ended with concurrent.futures' BrokenProcessPool traceback
(exit 1). It is now one line, exit 2; the points finished before stay, and a rerun
resumes from them."""

from __future__ import annotations

import os
import signal
import time

import pytest

from llmsched.analysis import points, sweep
from llmsched.analysis.runner import Backend
from llmsched.cli import main
from llmsched.core.errors import ConfigError

COMMON = ["--cost-model", "paper", "--b-max", "128", "--prompt", "geometric:40", "--output", "geometric:21"]
COMMON += ["--num-requests", "60", "--grid", "rate=1,2,4", "--no-progress"]


def killed_at_rate_4(cfg: dict) -> dict:
    """A point's run in a pool worker: the rate-4 point's worker is killed (after the
    other points had time to finish)."""
    if cfg["workload"]["rate"] == 4.0:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    return points.run_point(cfg)


def test_a_worker_killed_mid_point_is_one_line_and_the_sweep_resumes(tmp_path, monkeypatch, capsys):
    d = tmp_path / "sw"
    monkeypatch.setattr(sweep, "run_point", killed_at_rate_4)
    assert main(["sweep", *COMMON, "--workers", "2", "--out", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "worker process died" in err and "rerun to resume" in err
    assert f"kept in {d / 'points'}" in err  # (an experiment keeps none: no promise there)
    kept = sorted(p.name for p in (d / "points").iterdir())
    assert len(kept) == 2 and all(n.endswith(".json") for n in kept)  # rates 1 and 2, no temporary file
    monkeypatch.undo()
    assert main(["sweep", *COMMON, "--workers", "2", "--out", str(d)]) == 0
    assert "1 simulated, 2 already done" in capsys.readouterr().out
    assert len(list((d / "points").iterdir())) == 3


def test_a_ray_worker_killed_mid_point_is_the_same_one_line_error():
    """(A Ray worker's death ended the sweep with Ray's WorkerCrashedError traceback.)"""

    def die(arg):  # (local: Ray sends it by value, as its workers cannot import this module)
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(ConfigError, match="worker process died"), Backend("ray", 1, quiet=True) as be:
        list(be.run([("a", 1)], die))


def test_a_config_error_raised_in_a_ray_task_is_the_error_itself():
    """(Ray's RayTaskError(ConfigError) reached the command line, its text the worker's
    traceback: a many-line "error" with colour codes.)"""

    def refuse(arg):
        raise ConfigError("point a: refused")

    with pytest.raises(ConfigError) as e, Backend("ray", 1, quiet=True) as be:
        list(be.run([("a", 1)], refuse))
    assert str(e.value) == "point a: refused"
