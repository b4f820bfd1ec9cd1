"""A rerun of `simulate --out` into a run's folder that stops while writing (Ctrl-C, a
kill, a full disk) left the new run's summary.json and config.json beside the earlier
run's requests.csv, timeseries.csv and histograms: a folder that looked complete and
mixed two runs (`plot` drew one run's data under the other's title). The earlier run's
files now go first and summary.json, the run's proof, comes last; the folder is marked
while it is written, so a rerun still takes it as a run's and `plot` refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmsched import simulate
from llmsched.analysis import tables
from llmsched.core import paths
from llmsched.core.errors import ConfigError
from llmsched.core.paths import INCOMPLETE_MARK, atomic_write, check_run_dir
from llmsched.plots import plot_dir
from llmsched.sim.network_result import simulate_network
from llmsched.sim.result import SimResult
from llmsched.sim.serverless_result import ServerlessResult, simulate_serverless

TANDEM = "examples/networks/tandem.yaml"
SERVERLESS = "examples/serverless/small.yaml"
RUN = {"cost_model": "const:1", "num_requests": 40, "rate": 5}


def _stop(*_args, **_kw):
    raise KeyboardInterrupt  # a Ctrl-C in the middle of the write


def _names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def _temporary(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob(".*.tmp"))


def _seed(d: Path) -> int:
    """The run's seed as its config.json records it (at the top, or in its workload)."""
    c = json.loads((d / "config.json").read_text())
    return c["seed"] if "seed" in c else c["workload"]["seed"]


def test_single_server_rerun_stopped_midway_leaves_no_mix(tmp_path, monkeypatch):
    d = tmp_path / "run"
    simulate(**RUN, seed=2, out_dir=d)
    old_itl = (d / "itl_histogram.csv").read_text()
    again = simulate(**RUN, seed=3)
    monkeypatch.setattr(SimResult, "_write_timeseries", _stop)
    with pytest.raises(KeyboardInterrupt):
        again.write(d)
    # no summary.json (the old code had the new one), nothing of seed 2's run left beside
    # the new files, no half-written temporary file
    assert "summary.json" not in _names(d)
    assert not (d / "itl_histogram.csv").exists() or (d / "itl_histogram.csv").read_text() != old_itl
    assert not (d / "timeseries.csv").exists()
    assert _temporary(d) == []
    assert (d / INCOMPLETE_MARK).is_file()
    with pytest.raises(ConfigError, match="stopped while writing"):
        plot_dir(d)
    # still a run's folder: a rerun (of any simulate kind) replaces it
    for kind in ("single-server", "network", "serverless"):
        check_run_dir(d, kind)
    monkeypatch.undo()
    again.write(d)
    assert _seed(d) == 3 and json.loads((d / "summary.json").read_text())["steps"] == again.summary["steps"]
    assert INCOMPLETE_MARK not in _names(d)
    assert len(plot_dir(d)) == 4


def test_a_killed_write_s_temporary_files_go_with_the_rerun(tmp_path):
    """A kill (SIGTERM, SIGKILL) runs no clean-up: its .NAME.tmp files and the old run's
    files stay until the rerun, which removes them before writing anything."""
    d = tmp_path / "run"
    simulate(**RUN, seed=2, out_dir=d)
    (d / ".requests.csv.tmp").write_text("id,tag\n0,")  # what a killed write leaves
    (d / "summary.json").unlink()
    (d / INCOMPLETE_MARK).write_text(json.dumps({"incomplete": "single-server"}))
    with pytest.raises(ConfigError, match="stopped while writing"):
        plot_dir(d)
    simulate(**RUN, seed=3, out_dir=d)
    assert _temporary(d) == [] and INCOMPLETE_MARK not in _names(d) and _seed(d) == 3


def test_without_its_mark_a_folder_of_output_names_is_still_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "requests.csv").write_text("mine\n")
    (d / INCOMPLETE_MARK).write_text("not a run's mark")  # (content, not a name, proves it)
    with pytest.raises(ConfigError, match="but no 'summary.json'"):
        check_run_dir(d, "single-server")


def test_network_rerun_stopped_in_a_replica_leaves_no_mix(tmp_path, monkeypatch):
    d = tmp_path / "net"
    simulate_network(TANDEM, num_jobs=30, seed=2, out_dir=d)
    old = {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert any(p.parts[0] == "servers" for p in old)
    again = simulate_network(TANDEM, num_jobs=30, seed=3)
    monkeypatch.setattr(SimResult, "_write_timeseries", _stop)  # in the first replica's folder
    with pytest.raises(KeyboardInterrupt):
        again.write(d)
    assert "summary.json" not in _names(d)
    now = {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != INCOMPLETE_MARK}
    # every file left is the new run's: none of seed 2's (the old code kept its replicas'
    # histograms and a summary.json of seed 3 over them)
    assert not [p for p, b in now.items() if old.get(p) == b and p.name != "config.json"]
    assert _temporary(d) == []
    check_run_dir(d, "network")  # the interrupted replica's folder is a run's, not the user's
    monkeypatch.undo()
    again.write(d)
    assert _seed(d) == 3 and (d / "summary.json").is_file()
    assert not list(d.rglob(INCOMPLETE_MARK))
    for rep in (d / "servers").iterdir():
        assert (rep / "summary.json").is_file() and (rep / "timeseries.csv").is_file()


def test_serverless_rerun_stopped_midway_leaves_no_mix(tmp_path, monkeypatch):
    d = tmp_path / "sl"
    simulate_serverless(SERVERLESS, d, num_requests=30, seed=2)
    old_requests = (d / "requests.csv").read_text()
    again = simulate_serverless(SERVERLESS, num_requests=30, seed=3)
    assert again.summary != json.loads((d / "summary.json").read_text())
    monkeypatch.setattr(ServerlessResult, "_write_instances", _stop)
    with pytest.raises(KeyboardInterrupt):
        again.write(d)
    assert "summary.json" not in _names(d) and "instances.csv" not in _names(d)
    assert (d / "requests.csv").read_text() != old_requests
    assert _temporary(d) == []
    check_run_dir(d, "serverless")
    monkeypatch.undo()
    again.write(d)
    assert _seed(d) == 3 and (d / "summary.json").is_file() and INCOMPLETE_MARK not in _names(d)


def test_reproduce_proofs_are_written_whole(tmp_path, monkeypatch):
    """An experiment's table.json / result.json, its proof, was written in place: a write
    that stopped left half a file, and the rerun refused the folder (not a JSON object)."""
    import llmsched.analysis.reproduce as rep  # noqa: PLC0415
    import llmsched.analysis.reproduce_networks as rn  # noqa: PLC0415
    import llmsched.analysis.reproduce_prefix as rp  # noqa: PLC0415
    import llmsched.analysis.reproduce_twp as rt  # noqa: PLC0415

    for mod in (rep, rn, rp, rt):
        assert mod.end_reproduce_write is paths.end_reproduce_write
    assert paths.end_reproduce_write.__globals__["atomic_write"] is atomic_write
    assert tables.atomic_write is atomic_write
    proof = tmp_path / "table.json"
    proof.write_text(json.dumps({"meta": {}, "rows": []}))

    def half(p):
        Path(p).write_text('{"meta": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(proof, half)
    assert json.loads(proof.read_text()) == {"meta": {}, "rows": []} and _temporary(tmp_path) == []


def test_a_parquet_run_stopped_in_its_tables_leaves_no_summary(tmp_path, monkeypatch):
    """`simulate --parquet` wrote its Parquet tables (and config.json again) after
    summary.json: a run stopped between them left summary.json beside a missing
    timeseries.parquet, and `plot` took the folder as finished."""
    pq = pytest.importorskip("pyarrow.parquet")
    from llmsched.cli import main

    d = tmp_path / "pq"
    calls = []
    write_table = pq.write_table

    def second_stops(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return write_table(*args, **kw)

    monkeypatch.setattr(pq, "write_table", second_stops)
    args = ["simulate", "--cost-model", "const:1", "--num-requests", "40", "--parquet", "--out", str(d), "--quiet"]
    assert main(args) == 130  # the command line's Ctrl-C
    assert "summary.json" not in _names(d) and _temporary(d) == []
    with pytest.raises(ConfigError, match="stopped while writing"):
        plot_dir(d)
    monkeypatch.setattr(pq, "write_table", write_table)
    assert (
        main(["simulate", "--cost-model", "const:1", "--num-requests", "40", "--parquet", "--out", str(d), "--quiet"])
        == 0
    )
    names = _names(d)
    assert {"summary.json", "requests.parquet", "timeseries.parquet"} <= names
    assert json.loads((d / "config.json").read_text())["provenance"]["parquet"] is True


def test_a_whole_replica_of_a_stopped_network_run_is_not_plotted(tmp_path, monkeypatch):
    """A network run stopped after its first replica's files: `plot` refused the network's
    folder and pointed to a replica's, which it then drew, of a run that did not finish."""
    d = tmp_path / "net"
    res = simulate_network(TANDEM, num_jobs=30, seed=2)
    real, calls = SimResult._write_timeseries, []

    def second_stops(self, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(SimResult, "_write_timeseries", second_stops)
    with pytest.raises(KeyboardInterrupt):
        res.write(d)
    monkeypatch.undo()
    whole = [p for p in (d / "servers").iterdir() if (p / "summary.json").is_file()]
    assert whole  # (the case: a replica's files complete)
    link = tmp_path / "replica-link"
    link.symlink_to(whole[0])
    for folder in (d, whole[0], link, whole[0] / ".." / whole[0].name):
        with pytest.raises(ConfigError, match="stopped while writing"):
            plot_dir(folder)
    assert not list(whole[0].glob("*.png"))
    res.write(d)  # a finished rerun: its replicas plot
    assert len(plot_dir(whole[0])) == 4
