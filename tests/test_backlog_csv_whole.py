"""`reproduce agents` and `reproduce rybko-stolyar` wrote their backlog CSVs
(agents_backlog.csv, rybko_stolyar_backlog.csv) in place: a write that stopped midway (a
full disk, Ctrl-C) left a cut file under the final name. They are now written as every
other file of a run is (`atomic_write`): whole or not at all."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from llmsched.analysis import reproduce_networks as rn
from llmsched.core.paths import INCOMPLETE_MARK

real_write_text = Path.write_text


def _full_disk_midway(monkeypatch) -> None:
    """A backlog CSV's write stops halfway, its first half on disk (ENOSPC); other
    writes (the folder's mark, the tables, table.json) go through."""

    def write_text(self, data, *args, **kw):
        if not data.startswith("run,time_s,"):
            return real_write_text(self, data, *args, **kw)
        real_write_text(self, data[: len(data) // 2], *args, **kw)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", write_text)


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".") and p.name != INCOMPLETE_MARK)


RUNS = [("a", {"series": {"servers": {"s1": [1.0, 2.0, 3.0]}, "time_s": [0.0, 1.0, 2.0], "network": [1.0, 2.0, 3.0]}})]


def test_a_backlog_csv_cut_midway_keeps_the_earlier_whole_file(tmp_path, monkeypatch):
    path = tmp_path / "agents_backlog.csv"
    rn._series_csv(path, RUNS)
    whole = path.read_text()
    assert whole.splitlines()[0] == "run,time_s,s1,network" and len(whole.splitlines()) == 4
    _full_disk_midway(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        rn._series_csv(path, [("b", RUNS[0][1])])
    assert path.read_text() == whole  # (the old code left the new file's first half)
    assert _hidden(tmp_path) == []  # no temporary file left


def _agents(d: Path, seed: int):
    return rn.reproduce_agents(out_dir=d, quick=True, num_jobs=60, seeds=[seed], workers=1)


def _rybko(d: Path, seed: int):
    return rn.reproduce_rybko_stolyar(out_dir=d, quick=True, num_jobs=300, seeds=[seed], workers=1)


@pytest.mark.parametrize(
    "run, name", [(_agents, "agents_backlog.csv"), (_rybko, "rybko_stolyar_backlog.csv")], ids=["agents", "rybko"]
)
def test_a_rerun_whose_backlog_csv_is_cut_midway_leaves_none_under_its_name(tmp_path, monkeypatch, run, name):
    d = tmp_path / "out"
    run(d, 0)
    assert (d / name).is_file()
    _full_disk_midway(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        run(d, 1)
    # the earlier run's file went before the rerun wrote any (`begin_reproduce_write`); the
    # new one, cut, never took its name (the old code left its first half there)
    assert not (d / name).exists()
    assert (d / INCOMPLETE_MARK).is_file() and not (d / "table.json").exists()
    assert _hidden(d) == []
    monkeypatch.undo()
    run(d, 1)
    lines = (d / name).read_text().splitlines()
    assert lines[0].startswith("run,time_s,") and len(lines) > 1
    assert not (d / INCOMPLETE_MARK).exists()
