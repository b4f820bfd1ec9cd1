"""The block-size warning of a sweep is decided for the whole sweep: once where no point
has a prefix cache, never where one has. The sweep silenced its points' warning by
matching its text (a reworded warning leaked through), and a grid of block sizes without
a cache warned once per size."""

import warnings

from llmsched import api
from llmsched.analysis.sweep import max_stable_rate, run_sweep
from llmsched.cli import main

KW = dict(cost_model="paper", system_prompt=64, rate=2, num_requests=30, progress=False, plots=False, workers=1)
ARGV = ["--cost-model", "paper", "--num-requests", "20", "--prompt", "geometric:40", "--output", "geometric:21"]


def _said(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "block_size=" in str(w.message)]


def test_a_reworded_warning_is_still_silenced_where_a_point_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "BLOCK_SIZE_UNUSED", "is not used by a run without a prefix cache")
    said = _said(lambda: run_sweep(grid={"prefix_caching": [False, True]}, out_dir=tmp_path, block_size=8, **KW))
    assert said == []


def test_a_grid_of_block_sizes_without_a_cache_warns_once(tmp_path, capsys):
    code = main(["sweep", *ARGV, "--grid", "load=0.5", "--grid", "block-size=32,48", "--no-plots", "--no-progress",
                 "--workers", "1", "--out", str(tmp_path / "s")])  # fmt: skip
    assert code == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "block_size" in x]
    assert lines == [
        "llmsched sweep: warning: block_size=32, 48 has no effect without prefix caching (--prefix-caching)"
    ]


def test_a_search_warns_once_and_a_single_run_as_before(tmp_path, capsys):
    fixed = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=50)
    said = _said(lambda: max_stable_rate(policies=["orca"], seeds=[0, 1], tol=0.4, block_size=8, workers=1, **fixed))
    assert said == ["block_size=8 has no effect without prefix caching (--prefix-caching)"]
    assert main(["simulate", *ARGV, "--rate", "1", "--block-size", "48", "--out", ""]) == 0
    err = capsys.readouterr().err
    assert "llmsched simulate: warning: block_size=48 has no effect without prefix caching (--prefix-caching)" in err
