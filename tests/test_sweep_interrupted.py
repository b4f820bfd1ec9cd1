"""A `sweep --out` rerun into a sweep's folder that stopped while writing its tables and
figures (Ctrl-C, a kill, a full disk) left the new run's results.csv beside the earlier
run's search.csv, search.json and figures (a grid rerun of a search, a search rerun of a
grid): a folder that looked finished and mixed two runs. The earlier run's tables and
figures now go first (its points/ stay: the rerun resumes from them), the folder is
marked (`INCOMPLETE_MARK`) until results.csv, written last, is in place; `plot` and a run
of another kind refuse a marked sweep folder, a rerun of the sweep resumes and replaces it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import fake_summary

from llmsched.analysis import figures, sweep, tables
from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import INCOMPLETE_MARK, check_run_dir
from llmsched.plots import plot_dir

FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=60)


def _fake_runs(monkeypatch) -> list[float]:
    """A point's run, replaced: stable below 3 requests/s, its metrics the rate's."""
    rates = []

    def run(cfg: dict) -> dict:
        rate = cfg["workload"]["rate"]
        rates.append(rate)
        stable = rate < 3.0
        return fake_summary(
            stable=stable,
            verdict="stable" if stable else "unstable",
            total_token_throughput=60.0 * rate,
            offered_token_rate=60.0 * rate,
            p99_ttft_ms=10.0 * rate,
            p99_itl_ms=5.0 * rate,
        )

    monkeypatch.setattr(sweep, "run_point", run)
    return rates


def _grid(d: Path, rates=(1.0, 2.0, 4.0), **kw):
    grid = {"policy": ["sarathi"], "rate": list(rates)}
    return run_sweep(None, grid, out_dir=d, workers=1, progress=False, **FIXED, **kw)


def _grid_other(d: Path, **kw):
    return _grid(d, rates=(0.5, 1.0), **kw)


def _search(d: Path, **kw):
    grid = {"policy": ["sarathi"]}
    return run_sweep(None, grid, out_dir=d, workers=1, progress=False, search="max-stable-rate", tol=0.2, **FIXED, **kw)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _stop_after_first_file(monkeypatch) -> None:
    """A Ctrl-C right after the sweep's first table or figure is in place."""
    real, real_figure = tables.atomic_write, figures.save_figure

    def write_then_stop(path, writer):
        real(path, writer)
        raise KeyboardInterrupt

    def draw_then_stop(fig, path):
        real_figure(fig, path)
        raise KeyboardInterrupt

    monkeypatch.setattr(tables, "atomic_write", write_then_stop)
    monkeypatch.setattr(figures, "save_figure", draw_then_stop)


RERUNS = [("grid, then a search", _grid, _search), ("a search, then a grid", _search, _grid)]
RERUNS.append(("a grid, then another grid", _grid, _grid_other))


@pytest.mark.parametrize("first, second", [r[1:] for r in RERUNS], ids=[r[0] for r in RERUNS])
def test_a_sweep_rerun_stopped_after_its_first_file_leaves_no_old_file_beside_a_new_one(
    tmp_path, monkeypatch, capsys, first, second
):
    d = tmp_path / "out"
    d.mkdir()
    (d / "notes.txt").write_text("mine")  # a user's file: never the run's to remove
    _fake_runs(monkeypatch)
    first(d)
    old = _files(d)
    assert "results.csv" in old and INCOMPLETE_MARK not in old

    _stop_after_first_file(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        second(d)
    now = _files(d)
    # nothing of the earlier run's tables and figures beside the new file (the old code
    # kept its search.csv, search.json and figures beside the new results.csv); its
    # points' records stay, for the rerun to resume from
    outputs = {p: b for p, b in now.items() if not p.startswith("points/") and p != INCOMPLETE_MARK}
    assert [p for p, b in outputs.items() if old.get(p) == b] == ["notes.txt"]
    assert len(outputs) == 2  # the user's file and the one new file
    assert all(now.get(p) == b for p, b in old.items() if p.startswith("points/"))
    # marked while written, no results.csv (the file a sweep writes last)
    assert json.loads(now[INCOMPLETE_MARK]) == {"incomplete": "sweep"} and "results.csv" not in now
    assert not [p for p in now if Path(p).name.startswith(".") and p != INCOMPLETE_MARK]  # no temporary file

    # a reader refuses the folder with one line naming it; a run of another kind too
    with pytest.raises(ConfigError, match="stopped while writing") as e:
        plot_dir(d)
    assert str(d) in str(e.value) and "results.csv" in str(e.value)
    capsys.readouterr()
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stopped while writing" in err and str(d) in err and "rerun" in err
    for k in ("reproduce clusters", "single-server"):
        with pytest.raises(ConfigError, match="stopped while writing"):
            check_run_dir(d, k)
    check_run_dir(d, "sweep")  # its own rerun takes it

    monkeypatch.undo()
    rates = _fake_runs(monkeypatch)
    res = second(d)
    assert rates == [] and res.ran == 0 and res.skipped > 0  # resumed from its points' records
    done = _files(d)
    assert INCOMPLETE_MARK not in done and done["notes.txt"] == b"mine"
    tops = sorted(p for p in done if not p.startswith("points/"))
    assert tops == sorted(["notes.txt", *(Path(f).name for f in res.files if Path(f).name != "points")])


def test_results_csv_is_the_last_file_a_sweep_writes(tmp_path, monkeypatch):
    """The mark goes only once results.csv, which a sweep writes last, is in place: every
    other table and figure is written before it."""
    _fake_runs(monkeypatch)
    order = []
    real, real_figure = tables.atomic_write, figures.save_figure

    def note(path, writer=None, fig=None):
        real(path, writer) if fig is None else real_figure(fig, path)
        order.append((Path(path).name, (Path(path).parent / INCOMPLETE_MARK).is_file()))
        return str(path)

    monkeypatch.setattr(tables, "atomic_write", note)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: note(path, fig=fig))
    for run in (_search, _grid):
        order.clear()
        res = run(tmp_path / "s")
        assert order[-1] == ("results.csv", True) and all(marked for _, marked in order)
        assert not (tmp_path / "s" / INCOMPLETE_MARK).exists()
        assert sorted(n for n, _ in order) == sorted(Path(f).name for f in res.files if Path(f).name != "points")


def test_the_command_line_stopped_in_a_sweep(tmp_path, monkeypatch, capsys):
    d = tmp_path / "sw"
    common = ["--cost-model", "paper", "--b-max", "128", "--num-requests", "60", "--workers", "1", "--out", str(d)]
    _fake_runs(monkeypatch)
    assert main(["sweep", "--grid", "rate=1,2,4", *common]) == 0
    _stop_after_first_file(monkeypatch)
    assert main(["sweep", "--search", "max-stable-rate", "--tol", "0.2", *common]) == 130  # the command line's Ctrl-C
    assert (d / INCOMPLETE_MARK).is_file() and not (d / "results.csv").exists()
    assert not (d / "throughput.png").exists()  # the grid's figures went before the first new file
    capsys.readouterr()
    assert main(["reproduce", "agents", "--quick", "--out", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stopped while writing" in err and str(d) in err
    monkeypatch.undo()
    rates = _fake_runs(monkeypatch)
    assert main(["sweep", "--search", "max-stable-rate", "--tol", "0.2", *common]) == 0
    assert rates == [] and "0 simulated" in capsys.readouterr().out
    assert not (d / INCOMPLETE_MARK).exists() and (d / "results.csv").is_file() and (d / "search.csv").is_file()
