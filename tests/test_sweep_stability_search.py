"""A sweep into a `reproduce stability` run's search/ is refused: it replaced the run's
search results (results.csv, search.csv) silently, exit 0, under the run's table.json. The
stability run's own search, and its rerun, still write there."""

from __future__ import annotations

import pytest

from llmsched.analysis.reproduce import reproduce_stability
from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError

SWEEP = ["sweep", "--cost-model", "paper", "--num-requests", "100", "--grid", "load=0.5", "--no-plots", "--quiet"]


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stability(tmp_path_factory):
    out = tmp_path_factory.mktemp("stab")
    reproduce_stability(quick=True, out_dir=out, policies=["orca"], workers=1, progress=False)
    return out


def test_a_sweep_into_a_stability_runs_search_is_refused(stability, capsys):
    before = _files(stability)
    assert main([*SWEEP, "--workers", "1", "--out", str(stability / "search")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rate search of the `llmsched reproduce stability` run" in err[0]
    with pytest.raises(ConfigError, match="rate search of the"):
        run_sweep(cost_model="paper", num_requests=100, grid=["load=0.5"], out_dir=stability / "search", workers=1)
    assert _files(stability) == before


def test_the_stability_runs_rerun_still_writes_its_search(stability):
    res = reproduce_stability(quick=True, out_dir=stability, policies=["orca"], workers=1, progress=False)
    assert res["rows"][0]["max_stable_rate"] is not None
    assert (stability / "search" / "results.csv").is_file()


def test_a_folder_named_search_elsewhere_takes_a_sweep(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main([*SWEEP, "--workers", "1", "--out", str(tmp_path / "search")]) == 0
    assert (tmp_path / "search" / "results.csv").is_file()
