"""Two `simulate --out D` or `reproduce ... --out D` into one folder at once: the second is
refused with one line (exit 2) before it removes or writes anything, as a second sweep is
(`test_sweep_one_at_a_time`). They had no guard: each removed the other's files as it
began writing, and the folder could end with one run's summary beside the other's files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import llmsched
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import held_alone

SIM = ["simulate", "--cost-model", "paper", "--num-requests", "50", "--rate", "1"]
HOLD = (
    "import fcntl, os, sys, time; fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX); "
    "print('held', flush=True); time.sleep(60)"
)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def held_elsewhere():
    """Hold a folder from another process, as a run writing it does."""
    procs = []

    def hold(folder):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def _refused(argv, capsys, who):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"being written by another {who} running now" in err[0], err


def test_a_simulate_into_a_folder_another_writes_is_refused(tmp_path, capsys, held_elsewhere):
    out = tmp_path / "out"
    assert main([*SIM, "--out", str(out)]) == 0
    before = _files(out)
    held_elsewhere(out)
    _refused([*SIM, "--seed", "1", "--out", str(out)], capsys, "simulate")
    assert _files(out) == before


@pytest.mark.parametrize("experiment", ["twp", "clusters", "agents", "rybko-stolyar", "stability", "prefix-caching"])
def test_a_reproduce_into_a_folder_another_writes_is_refused_before_it_runs(
    tmp_path, capsys, held_elsewhere, experiment
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # (a folder of the user's: the runs write beside it)
    held_elsewhere(out)
    extra = ["--workers", "1"]
    if experiment == "prefix-caching":  # (its runs go before its folder is made: a small trace)
        rows = [
            {"timestamp": i * 500, "input_length": 1000, "output_length": 10, "hash_ids": [0, i + 1]} for i in range(40)
        ]
        (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        extra = ["--trace", str(tmp_path / "trace.jsonl"), "--cost-model", "paper", "--b-max", "512"]
    _refused(["reproduce", experiment, "--quick", *extra, "--out", str(out)], capsys, f"reproduce {experiment}")
    assert _files(out) == {out.relative_to(out) / "notes.txt": b"mine"}


def test_the_python_write_is_refused_too_and_its_lock_ends_with_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = llmsched.simulate(cost_model="paper", num_requests=50, rate=1)
    with held_alone(out, "simulate"), pytest.raises(ConfigError, match="being written by another simulate"):
        r.write(out)
    r.write(out)
    r.write(out)  # (the same process again: its own earlier hold ended with the write)
    with held_alone(out, "simulate"):
        pass
