"""Results that are copied (pickle, deepcopy, a multiprocessing worker's return) stay
whole, and API inputs of the wrong type are one ConfigError."""

from __future__ import annotations

import copy
import gc
import inspect
import pickle

import pytest

import llmsched
from llmsched.core.errors import ConfigError
from llmsched.sim.serverless_result import simulate_serverless

BASE = dict(cost_model="paper", rate=5, prompt="geometric:200", output="geometric:100", num_requests=60)
SERVERLESS = "examples/serverless/small.yaml"


def _steps_run():
    return llmsched.simulate(record_steps=True, **BASE)


def test_a_pickled_result_keeps_its_steps_after_the_original_is_gone(tmp_path):
    r = _steps_run()
    want = r.steps_path.read_bytes()
    c = pickle.loads(pickle.dumps(r))
    del r
    gc.collect()
    c.write(tmp_path / "c")
    assert (tmp_path / "c" / "steps.csv").read_bytes() == want


def test_a_deep_copy_and_its_original_both_write_their_steps(tmp_path):
    r = _steps_run()
    want = r.steps_path.read_bytes()
    d = copy.deepcopy(r)
    assert d.steps_path != r.steps_path
    d.write(tmp_path / "a")
    r.write(tmp_path / "b")
    assert (tmp_path / "a" / "steps.csv").read_bytes() == want
    assert (tmp_path / "b" / "steps.csv").read_bytes() == want


def test_a_copy_made_files_are_removed_with_it():
    r = _steps_run()
    c = pickle.loads(pickle.dumps(r))
    path = c.steps_path
    assert path.is_file()
    del c
    gc.collect()
    assert not path.exists()


def test_a_network_result_pickles():
    n = llmsched.simulate_network(llmsched.cluster_network(replicas=2, cost_model="paper", rate=10, num_requests=60))
    m = pickle.loads(pickle.dumps(n))
    assert m.summary == n.summary
    assert [r.summary for r in m.replicas()] == [r.summary for r in n.replicas()]
    assert all("sim" in rep for rep in n.stats.replicas)  # the original keeps its simulators


@pytest.mark.parametrize("config", [5, [1], b"x"])
def test_a_config_of_another_type_is_one_config_error(config):
    with pytest.raises(ConfigError, match="config must be a SimConfig, a mapping or a YAML path"):
        llmsched.simulate(config, cost_model="paper")


def test_an_empty_folder_name_is_refused_by_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = llmsched.simulate(**BASE)
    with pytest.raises(ConfigError, match="must name a folder"):
        r.write("")
    assert list(tmp_path.iterdir()) == []
    pytest.importorskip("pyarrow")
    with pytest.raises(ConfigError, match="must name a folder"):
        r.write_parquet("")
    assert list(tmp_path.iterdir()) == []


def test_dir_lists_the_lazy_exports():
    names = dir(llmsched)
    assert {"simulate", "SimResult", "LLM", "make_trace", "__version__"} <= set(names)
    # the subpackages that load names lazily too
    from llmsched import analysis, engine, server

    assert "LLM" in dir(engine) and "LLMEngine" in dir(engine)
    assert "GracefulServer" in dir(server)
    assert set(analysis.__all__) <= set(dir(analysis))


@pytest.mark.parametrize("option", ["scale", "num_requests", "seed"])
def test_serverless_numbers_in_quotes_are_refused(option):
    with pytest.raises(ConfigError, match=f"{option} must be a number, got '2'"):
        simulate_serverless(SERVERLESS, **{option: "2"})


def test_simulate_help_names_its_overrides():
    doc = inspect.getdoc(llmsched.simulate)
    for name in ("b_max", "policy_options", "record_steps", "num_requests", "arrival", "think_time_s"):
        assert name in doc


def test_simulate_serverless_is_a_top_level_name_as_simulate_network_is():
    from llmsched.sim.serverless_result import simulate_serverless

    assert "simulate_serverless" in llmsched.__all__ and "simulate_serverless" in dir(llmsched)
    assert llmsched.simulate_serverless is simulate_serverless
    r = llmsched.simulate_serverless("examples/serverless/small.yaml", num_requests=40)
    assert r.summary["completed"] == 40
