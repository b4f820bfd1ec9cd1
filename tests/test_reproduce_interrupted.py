"""A `reproduce` rerun into a run's folder that stopped while writing (Ctrl-C, a kill, a
full disk) left the new run's table.csv beside the earlier run's table.json (or
result.json) and figures: a folder that looked finished and mixed two runs. The earlier
run's files of the experiment now go first, the folder is marked (`INCOMPLETE_MARK`)
until the proof, written last, is in place; `plot` and a run of another kind refuse a
marked folder, a rerun of the experiment replaces it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from llmsched.analysis import reproduce as rs
from llmsched.analysis import reproduce_networks as rn
from llmsched.analysis import reproduce_prefix as rp
from llmsched.analysis import reproduce_twp as rt
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import INCOMPLETE_MARK, RUN_PROOFS, check_run_dir
from llmsched.plots import plot_dir


def _prefix_trace(path: Path, n: int = 80) -> str:
    """Mooncake JSON lines: one of 4 shared 2-block prompts, then a block of the request's own."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            fam = rng.randrange(4)
            row = {
                "timestamp": i * 500,
                "input_length": 512 * 3 - rng.randrange(0, 300),
                "output_length": rng.randint(5, 20),
                "hash_ids": [fam * 10, fam * 10 + 1, 1000 + i],
            }
            f.write(json.dumps(row) + "\n")
    return str(path)


def _stability(d: Path, seed: int, tmp: Path):
    return rs.reproduce_stability(
        out_dir=d,
        quick=True,
        policies=["sarathi"],
        workers=1,
        progress=False,
        search=False,
        num_requests=300,
        seeds=[seed],
    )


def _twp(d: Path, seed: int, tmp: Path):
    return rt.reproduce_twp(
        out_dir=d,
        quick=True,
        workloads=["azure"],
        schedulers=["fcfs", "twp"],
        loads=[0.5],
        num_requests=60,
        stability_requests=100,
        stability_loads=[0.5],
        seeds=[seed],
        workers=1,
    )


def _prefix(d: Path, seed: int, tmp: Path):
    trace = _prefix_trace(tmp / "trace.jsonl")
    return rp.reproduce_prefix_caching(
        trace, out_dir=d, cost_model="paper", b_max=512, loads=(0.5 + seed / 10,), kv_capacities=(60000,)
    )


def _clusters(d: Path, seed: int, tmp: Path):
    return rn.reproduce_clusters(out_dir=d, quick=True, replicas=[2], loads=[0.5], num_jobs=50, seeds=[seed], workers=1)


def _agents(d: Path, seed: int, tmp: Path):
    return rn.reproduce_agents(out_dir=d, quick=True, num_jobs=60, seeds=[seed], workers=1)


def _rybko(d: Path, seed: int, tmp: Path):
    return rn.reproduce_rybko_stolyar(out_dir=d, quick=True, num_jobs=300, seeds=[seed], workers=1)


# (experiment, its run, the module whose write_table it calls)
KINDS = [
    ("stability", _stability, rs),
    ("twp", _twp, rt),
    ("prefix-caching", _prefix, rp),
    ("clusters", _clusters, rn),
    ("agents", _agents, rn),
    ("rybko-stolyar", _rybko, rn),
]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _stop_after_first_table(monkeypatch, mod):
    real = mod.write_table

    def first_then_stop(*args, **kw):
        real(*args, **kw)
        raise KeyboardInterrupt  # a Ctrl-C right after the first table

    monkeypatch.setattr(mod, "write_table", first_then_stop)


@pytest.mark.parametrize("experiment, run, mod", KINDS, ids=[k[0] for k in KINDS])
def test_a_rerun_stopped_after_its_first_table_leaves_no_old_file_beside_a_new_one(
    tmp_path, monkeypatch, capsys, experiment, run, mod
):
    kind = f"reproduce {experiment}"
    proof = RUN_PROOFS[kind][0]
    d = tmp_path / "out"
    d.mkdir()
    (d / "notes.txt").write_text("mine")  # a user's file: never the run's to remove
    run(d, 0, tmp_path)
    old = _files(d)
    assert proof in old and INCOMPLETE_MARK not in old

    _stop_after_first_table(monkeypatch, mod)
    with pytest.raises(KeyboardInterrupt):
        run(d, 1, tmp_path)
    now = _files(d)
    # the new table written, and nothing of the earlier run's beside it but the user's file
    # (the old code kept the earlier run's proof, and its figures or tables not yet rewritten)
    assert "table.csv" in now and now["table.csv"] != old["table.csv"]
    assert [p for p, b in now.items() if old.get(p) == b] == ["notes.txt"]
    # marked while written, no proof
    assert json.loads(now.pop(INCOMPLETE_MARK)) == {"incomplete": kind} and proof not in now
    assert not [p for p in now if Path(p).name.startswith(".")]  # no half-written temporary file

    # a reader refuses the folder with one line naming it; a run of another kind too
    with pytest.raises(ConfigError, match="stopped while writing") as e:
        plot_dir(d)
    assert str(d) in str(e.value) and "rerun" in str(e.value)
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(d) in err and "rerun" in err
    other = "reproduce clusters" if experiment != "clusters" else "reproduce agents"
    for k in (other, "sweep", "single-server"):
        with pytest.raises(ConfigError, match="stopped while writing"):
            check_run_dir(d, k)
    check_run_dir(d, kind)  # its own rerun takes it

    monkeypatch.undo()
    res = run(d, 1, tmp_path)
    done = _files(d)
    assert INCOMPLETE_MARK not in done and proof in done and done["notes.txt"] == b"mine"
    assert sorted(done) == sorted(["notes.txt", *(str(Path(f).relative_to(d)) for f in res["files"])])


def test_a_stability_rerun_without_the_search_removes_the_old_search_first(tmp_path, monkeypatch):
    """The earlier run's search/ went only once the rerun had finished (`clear_stale`): a
    rerun without the search stopped in its table left it beside the new queue.png."""
    d = tmp_path / "s"
    rs.reproduce_stability(out_dir=d, quick=True, policies=["sarathi"], workers=1, progress=False)
    assert (d / "search" / "points").is_dir()
    _stop_after_first_table(monkeypatch, rs)
    with pytest.raises(KeyboardInterrupt):
        _stability(d, 1, tmp_path)
    assert not (d / "search").exists() and (d / INCOMPLETE_MARK).is_file() and not (d / "table.json").exists()
    monkeypatch.undo()
    _stability(d, 1, tmp_path)
    assert not (d / INCOMPLETE_MARK).exists() and (d / "table.json").is_file()


def test_a_stability_rerun_keeps_its_probes_records_for_its_search(tmp_path, monkeypatch):
    """Its search's points/ (each a probe's record, keyed by its configuration) stay for the
    rerun's search; the earlier run's files stay until the search is done."""
    from llmsched.analysis import sweep  # noqa: PLC0415

    d = tmp_path / "s"
    kw = dict(quick=True, policies=["sarathi"], workers=1, progress=False)
    rs.reproduce_stability(out_dir=d, **kw)
    points = sorted(p.name for p in (d / "search" / "points").iterdir())
    assert points and (d / "search" / "search.csv").is_file()
    old = _files(d)
    ran = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda cfg: ran.append(cfg) or real(cfg))
    search = rs.max_stable_rate

    def look_then_search(*args, **kw):
        # the folder marked, nothing of the earlier run's gone
        now = _files(d)
        assert json.loads(now.pop(INCOMPLETE_MARK))["incomplete"] == "reproduce stability"
        assert now == old
        return search(*args, **kw)

    monkeypatch.setattr(rs, "max_stable_rate", look_then_search)
    rs.reproduce_stability(out_dir=d, **kw)
    assert ran == [] and not (d / INCOMPLETE_MARK).exists() and (d / "search" / "search.csv").is_file()


def test_a_stability_rerun_stopped_in_its_search_keeps_the_earlier_runs_files(tmp_path, monkeypatch, capsys):
    """A rerun removed the earlier run's table.json, tables and queue.png before its search
    (minutes to hours at full size): a Ctrl-C in the search lost the earlier finished
    results. They now stay until the search is done; the folder is marked meanwhile."""
    from llmsched.analysis import sweep  # noqa: PLC0415

    d = tmp_path / "rs"
    argv = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--seeds", "0", "--workers", "1"]
    assert main([*argv, "--out", str(d)]) == 0
    old = _files(d)
    assert {"table.json", "table.csv", "queue.png"} <= set(old) and INCOMPLETE_MARK not in old

    def stop(*args, **kw):
        raise KeyboardInterrupt  # a Ctrl-C in the search

    monkeypatch.setattr(rs, "max_stable_rate", stop)
    assert main([*argv, "--out", str(d)]) == 130
    now = _files(d)
    assert json.loads(now.pop(INCOMPLETE_MARK))["incomplete"] == "reproduce stability"
    assert now == old  # every file of the earlier run's as it was
    capsys.readouterr()
    # marked: plot refuses it with one line, as a run of another kind does
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(d) in err and "rerun" in err and "stopped before writing" in err
    for k in ("reproduce clusters", "sweep", "single-server"):
        with pytest.raises(ConfigError, match="stopped"):
            check_run_dir(d, k)

    # a complete rerun resumes from search/points (no probe simulated again), clears the mark
    monkeypatch.undo()
    ran = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda cfg: ran.append(cfg) or real(cfg))
    assert main([*argv, "--out", str(d)]) == 0
    assert ran == [] and not (d / INCOMPLETE_MARK).exists() and (d / "table.json").is_file()
    assert main(["plot", str(d)]) == 2  # (refused, but not as an interrupted run's)
    assert "stopped before writing" not in capsys.readouterr().err


def test_plot_of_a_stability_runs_search_stopped_while_writing_names_the_experiment(tmp_path, monkeypatch, capsys):
    """`plot rs/search` of a stability run stopped in its search's write said the folder
    held a `llmsched sweep` run to rerun: it is the `reproduce stability` run to rerun."""
    from llmsched.analysis import sweep  # noqa: PLC0415

    d = tmp_path / "rs"
    real = sweep.write_table

    def stop(*args, **kw):
        raise KeyboardInterrupt  # in the search's write: search/ marked, no results.csv

    monkeypatch.setattr(sweep, "write_table", stop)
    with pytest.raises(KeyboardInterrupt):
        rs.reproduce_stability(out_dir=d, quick=True, policies=["sarathi"], workers=1, progress=False)
    assert (d / "search" / INCOMPLETE_MARK).is_file() and not (d / "search" / "results.csv").exists()
    capsys.readouterr()
    assert main(["plot", str(d / "search")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "reproduce stability" in err and str(d) in err
    assert "`llmsched sweep`" not in err
    monkeypatch.setattr(sweep, "write_table", real)
    rs.reproduce_stability(out_dir=d, quick=True, policies=["sarathi"], workers=1, progress=False)
    assert not (d / INCOMPLETE_MARK).exists() and not (d / "search" / INCOMPLETE_MARK).exists()


def test_the_command_line_stopped_in_a_reproduce_run(tmp_path, monkeypatch, capsys):
    d = tmp_path / "rs"
    argv = ["reproduce", "rybko-stolyar", "--quick", "--num-requests", "300", "--workers", "1", "--out", str(d)]
    assert main([*argv, "--seeds", "0"]) == 0
    _stop_after_first_table(monkeypatch, rn)
    assert main([*argv, "--seeds", "1"]) == 130  # the command line's Ctrl-C
    assert (d / INCOMPLETE_MARK).is_file() and not (d / "table.json").exists()
    capsys.readouterr()
    assert main(["reproduce", "agents", "--quick", "--out", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stopped while writing" in err and str(d) in err
    monkeypatch.undo()
    assert main([*argv, "--seeds", "1"]) == 0
    assert not (d / INCOMPLETE_MARK).exists() and (d / "table.json").is_file()
