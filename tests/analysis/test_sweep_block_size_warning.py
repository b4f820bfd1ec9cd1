"""The block-size warning of a sweep is decided for the whole sweep: once where no point
has a prefix cache, never where one has. The sweep silenced its points' warning by
matching its text (a reworded warning leaked through), and a grid of block sizes without
a cache warned once per size."""

import warnings

from llmsched.analysis.sweep import max_stable_rate, run_sweep
from llmsched.cli import main
from llmsched.core import errors

KW = dict(cost_model="paper", system_prompt=64, rate=2, num_requests=30, progress=False, plots=False, workers=1)
ARGV = ["--cost-model", "paper", "--num-requests", "20", "--prompt", "geometric:40", "--output", "geometric:21"]


def _said(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "block_size=" in str(w.message)]


def test_a_reworded_warning_is_still_silenced_where_a_point_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(errors, "BLOCK_SIZE_UNUSED", "is not used by a run without a prefix cache")
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


NETWORK = {
    "servers": {
        "s1": {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "block_size": 7},
        "s2": {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "block_size": 7, "prefix_caching": True},
    },
    "jobs": {
        "A": {
            "arrival": {"process": "poisson", "rate": 1.0},
            "route": [{"call": {"server": "s1", "prompt": "const:10", "output": "const:5"}},
                      {"call": {"server": "s2", "prompt": "const:10", "output": "const:5"}}],
        }
    },
    "num_jobs": 5,
}  # fmt: skip


def test_a_cluster_and_a_network_server_warn_of_a_block_size_without_caching(capsys):
    """Said on one server; a cluster from flags and a network file's server dropped it
    without a word."""
    from llmsched import cluster_network, simulate_network

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate_network(NETWORK)
    said = [w for w in caught if issubclass(w.category, errors.BlockSizeUnusedWarning)]
    assert [str(w.message) for w in said] == [
        "servers.s1: block_size=7 has no effect without prefix caching (prefix_caching: true)"
    ]
    assert said[0].filename == __file__  # the caller's line, not llmsched's
    from llmsched.sim.network_result import simulate_network as inner

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inner(NETWORK)  # (without the api's wrapper: the level was counted with it)
    assert [w.filename for w in caught if issubclass(w.category, errors.BlockSizeUnusedWarning)] == [__file__]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster_network(replicas=2, block_size=32, rate=1, num_requests=5)
    assert [w.filename for w in caught] == [__file__]
    assert _said(lambda: cluster_network(replicas=2, block_size=32, rate=1, num_requests=5)) == [
        "block_size=32 has no effect without prefix caching (--prefix-caching)"
    ]
    assert _said(lambda: cluster_network(replicas=2, block_size=32, prefix_caching=True, rate=1)) == []
    argv = ["simulate", "--rate", "5", "--num-requests", "20", "--block-size", "32", "--replicas", "2", "--out", ""]
    assert main([*argv, "--quiet"]) == 0
    assert "llmsched simulate: warning: block_size=32 has no effect" in capsys.readouterr().err
