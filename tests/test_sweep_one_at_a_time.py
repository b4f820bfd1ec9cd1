"""Two sweeps into one --out folder at once: the second is refused with one line (exit 2)
before it runs or removes anything. They interleaved: each removed the other's tables as
it began writing its own, and the folder ended with one sweep's results.csv beside the
other's search.csv or figures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import held_alone

SWEEP = ["sweep", "--cost-model", "paper", "--num-requests", "100", "--grid", "load=0.5", "--no-plots", "--quiet"]
HOLD = (
    "import fcntl, os, sys, time; fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX); "
    "print('held', flush=True); time.sleep(60)"
)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_sweep_into_a_folder_another_process_writes_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*SWEEP, "--workers", "1", "--out", str(out)]) == 0
    before = _files(out)
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main([*SWEEP, "--workers", "1", "--grid", "seed=1", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "being written by another sweep running now" in err[0]
        assert _files(out) == before
    finally:
        other.kill()
        other.wait()
    assert main([*SWEEP, "--workers", "1", "--grid", "seed=1", "--out", str(out)]) == 0  # free again


def test_the_python_sweep_is_refused_too_and_its_lock_ends_with_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with held_alone(out, "sweep"), pytest.raises(ConfigError, match="being written by another sweep"):
        run_sweep(cost_model="paper", num_requests=100, grid=["load=0.5"], out_dir=out, workers=1, plots=False)
    run_sweep(cost_model="paper", num_requests=100, grid=["load=0.5"], out_dir=out, workers=1, plots=False)
    with held_alone(out, "sweep"):  # the sweep let go of the folder when it ended
        pass
