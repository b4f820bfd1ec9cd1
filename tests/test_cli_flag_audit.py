"""Flag audit of `capacity`, `sweep` and `reproduce`: what a flag cannot do is refused
with one line and exit 2, never ignored (and `--workers` is bounded)."""

import pytest

from llmsched.analysis.runner import MAX_WORKERS, Backend
from llmsched.cli import main

SWEEP = ["sweep", "--cost-model", "paper", "--prompt", "const:20", "--output", "const:5", "--num-requests", "20"]


def refused(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert msg in err, err


# -- 1. --workers is bounded, and a pool has no more processes than jobs ---------------------


@pytest.mark.parametrize("cmd", ["sweep", "capacity", "reproduce"])
def test_absurd_workers_are_refused_before_any_work(capsys, tmp_path, cmd):
    out = str(tmp_path / "o")
    argv = {
        "sweep": [*SWEEP, "--grid", "seed=0", "--out", out],
        "capacity": ["capacity", "--cost-model", "paper", "--k-max", "16", "--find-counterexample"],
        "reproduce": ["reproduce", "stability", "--quick", "--out", out],
    }[cmd]
    refused(capsys, [*argv, "--workers", "100000"], f"--workers must be at most {MAX_WORKERS}")
    assert not (tmp_path / "o").exists()


def test_a_pool_has_no_more_processes_than_jobs():
    with pytest.raises(Exception, match="at most"):
        Backend("local", MAX_WORKERS + 1)
    with Backend("local", 64) as be:
        assert be._pool is None  # nothing forked before there are jobs
        assert sorted(v for _, v in be.run([("a", -1), ("b", -2)], abs)) == [1, 2]
        assert be._pool_size == 2 and be._pool._max_workers == 2
        assert [v for _, v in be.run([("c", -3)], abs)] == [3]  # the pool is reused
        assert be._pool_size == 2
