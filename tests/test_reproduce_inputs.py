"""The reproduce_* functions' arguments are checked before any run and before the output
folder: a bad one is one ConfigError naming it (not a TypeError from `float(None)` or
`int("abc")`), a string is no list of numbers (`replicas="16"` ran pools of 1 and 6), and
num_jobs 0 or 2.7 is refused (`num_jobs or default` ran the default; `int()` ran 2)."""

from __future__ import annotations

import pytest

from llmsched import ConfigError
from llmsched.analysis import reproduce_networks as rn
from llmsched.analysis import reproduce_twp as rt


class _Ran(Exception):
    """Raised by the stub backend: the call got as far as its runs."""

    def __init__(self, jobs):
        super().__init__("ran")
        self.jobs = jobs


class _NoRuns:
    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, jobs, fn):
        raise _Ran(jobs)


@pytest.fixture(autouse=True)
def _no_runs(monkeypatch):
    monkeypatch.setattr(rn, "Backend", _NoRuns)
    monkeypatch.setattr(rt, "Backend", _NoRuns)


BAD = [
    (rn.reproduce_clusters, {"replicas": 4}, "replicas must be a list"),
    (rn.reproduce_clusters, {"replicas": "16"}, "replicas must be a list"),
    (rn.reproduce_clusters, {"replicas": ["x"]}, "replicas must be a whole number"),
    (rn.reproduce_clusters, {"replicas": [0]}, "replicas must be a whole number >= 1"),
    (rn.reproduce_clusters, {"replicas": [2.5]}, "replicas must be a whole number"),
    (rn.reproduce_clusters, {"replicas": []}, "replicas must be a list"),
    (rn.reproduce_clusters, {"loads": 0.9}, "loads must be a list"),
    (rn.reproduce_clusters, {"loads": "0.9"}, "loads must be a list"),
    (rn.reproduce_clusters, {"loads": [None]}, "loads must be positive"),
    (rn.reproduce_clusters, {"routers": [1]}, "routers must be names"),
    (rn.reproduce_clusters, {"num_jobs": "abc"}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_clusters, {"num_jobs": 0}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_clusters, {"num_jobs": -5}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_clusters, {"num_jobs": 2.7}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_clusters, {"num_jobs": True}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_agents, {"loads": 1.0}, "loads must be a list"),
    (rn.reproduce_agents, {"ft_loads": "0.9"}, "ft_loads must be a list"),
    (rn.reproduce_agents, {"plot_load": "x"}, "plot_load must be positive"),
    (rn.reproduce_agents, {"plot_load": None}, "plot_load must be positive"),
    (rn.reproduce_agents, {"num_jobs": [1]}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_agents, {"num_jobs": 0}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_agents, {"workflows": [None]}, "workflows must be names"),
    (rn.reproduce_rybko_stolyar, {"num_jobs": "x"}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_rybko_stolyar, {"num_jobs": 0}, "num_jobs must be a whole number >= 1"),
    (rn.reproduce_rybko_stolyar, {"scan_loads": 0.5}, "scan_loads must be a list"),
    (rn.reproduce_rybko_stolyar, {"scan_loads": ["x"]}, "scan_loads must be positive"),
    (rt.reproduce_twp, {"loads": 0.3}, "loads must be a list"),
    (rt.reproduce_twp, {"loads": ["x"]}, "loads must be positive"),
    (rt.reproduce_twp, {"num_requests": "x"}, "num_requests must be a whole number >= 1"),
    (rt.reproduce_twp, {"num_requests": 0}, "num_requests must be a whole number >= 1"),
    (rt.reproduce_twp, {"slo_targets_ms": 50}, "slo_targets_ms must be a list"),
    (rt.reproduce_twp, {"stability_loads": 0.5}, "stability_loads must be a list"),
    (rt.reproduce_twp, {"stability_requests": "x"}, "stability_requests must be a whole number >= 1"),
    (rt.reproduce_twp, {"stability_requests": 0}, "stability_requests must be a whole number >= 1"),
    (rt.reproduce_twp, {"k_max": "64"}, "k_max must be a whole number >= 1"),
    (rt.reproduce_twp, {"k_max": None}, "k_max must be a whole number >= 1"),
    (rt.reproduce_twp, {"ttft_slo_ms": None}, "ttft_slo_ms must be a positive number"),
    (rt.reproduce_twp, {"ttft_slo_ms": -1}, "ttft_slo_ms must be a positive number"),
]


@pytest.mark.parametrize(("fn", "kw", "match"), BAD, ids=[f"{f.__name__}-{kw}" for f, kw, _ in BAD])
def test_a_bad_argument_is_one_config_error_before_any_run_or_folder(tmp_path, fn, kw, match):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=match) as err:
        fn(out_dir=out, quick=True, workers=1, **kw)
    assert "\n" not in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize(
    ("fn", "kw", "at", "want"),
    [
        (rn.reproduce_clusters, {"routers": "jsq"}, 1, {"jsq"}),
        (rn.reproduce_agents, {"workflows": "dag"}, 0, {"dag"}),
        (rn.reproduce_rybko_stolyar, {"orders": "exit"}, 0, {"exit"}),
        (rt.reproduce_twp, {"schedulers": "twp", "workloads": "azure"}, 4, {"twp"}),
    ],
)
def test_one_name_is_a_list_of_one_not_its_characters(tmp_path, fn, kw, at, want):
    with pytest.raises(_Ran) as ran:
        fn(out_dir=tmp_path / "out", quick=True, workers=1, **kw)
    # (twp: its main runs' keys; the ablation and stability runs are other schedulers)
    keys = [k for k, _ in ran.value.jobs if fn is not rt.reproduce_twp or k[0] == "main"]
    assert {k[at] for k in keys} == want


def test_counts_given_as_whole_numbers_run_as_given(tmp_path):
    with pytest.raises(_Ran) as ran:
        rn.reproduce_clusters(out_dir=tmp_path / "o", quick=True, replicas=[2.0], num_jobs=7.0, loads=[0.5])
    assert {arg["num_jobs"] for _, arg in ran.value.jobs} == {14}
    assert all(isinstance(arg["num_jobs"], int) for _, arg in ran.value.jobs)


REPRODUCERS = [rn.reproduce_clusters, rn.reproduce_agents, rn.reproduce_rybko_stolyar, rt.reproduce_twp]


@pytest.mark.parametrize("fn", REPRODUCERS)
def test_an_output_folder_under_a_file_is_one_config_error(tmp_path, fn):
    # reproduce_twp(out_dir="/dev/null/x") raised NotADirectoryError from mkdir
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"^output folder .*file is a file, not a folder$"):
        fn(out_dir=tmp_path / "file" / "x", quick=True, workers=1)


@pytest.mark.parametrize("fn", REPRODUCERS)
def test_an_unknown_keyword_is_one_config_error(tmp_path, fn):
    # Python's TypeError ("got an unexpected keyword argument 'quik'"), where simulate,
    # simulate_network and run_sweep say "unknown option" with the close name
    with pytest.raises(ConfigError, match=r"^unknown option 'quik'; did you mean 'quick'\?$"):
        fn(out_dir=tmp_path / "out", quik=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fn", REPRODUCERS)
def test_a_switch_must_be_true_or_false(tmp_path, fn):
    # quick="no" is truthy: it ran the quick experiment
    with pytest.raises(ConfigError, match=r"^quick must be true or false, got 'no'$"):
        fn(out_dir=tmp_path / "out", quick="no")
    assert not (tmp_path / "out").exists()
