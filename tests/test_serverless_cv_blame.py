"""A workload's own cv under poisson arrivals with a rate per model was blamed on the first
model ("workload.models.llama-3-8b: cv=2.0 applies to gamma arrivals only"), where the
single-rate form names the workload, whose key it is."""

from pathlib import Path

import pytest
import yaml

from llmsched.core import ConfigError
from llmsched.workload.serverless import load_serverless

SMALL = Path(__file__).resolve().parents[1] / "examples" / "serverless" / "small.yaml"


def _per_model_rates(**workload) -> dict:
    cfg = yaml.safe_load(SMALL.read_text())
    w = cfg["workload"]
    del w["rate"], w["popularity"]
    w.update(models={"llama-3-8b": {"rate": 10}, "llama-3.2-1b": {"rate": 2}}, **workload)
    return cfg


def test_the_workload_s_cv_is_blamed_on_the_workload():
    with pytest.raises(ConfigError) as e:
        load_serverless(_per_model_rates(arrival="poisson", cv=2))
    assert str(e.value).startswith("workload: cv=2.0 applies to gamma arrivals only"), str(e.value)
    assert "models" not in str(e.value)


def test_a_model_s_own_cv_is_still_blamed_on_the_model():
    cfg = _per_model_rates(arrival="gamma", cv=2)
    cfg["workload"]["models"]["llama-3.2-1b"].update(arrival="poisson", cv=3)
    with pytest.raises(ConfigError, match=r"^workload\.models\.llama-3\.2-1b: cv=3\.0 applies to gamma"):
        load_serverless(cfg)
    # the workload's gamma cv, kept by a model that keeps gamma, is valid
    load_serverless(_per_model_rates(arrival="gamma", cv=2))


def test_a_name_with_a_carriage_return_is_refused_as_a_newline_is():
    """A CSV reader ends a line at a lone carriage return: a model, server or job class
    named with one wrote requests.csv / calls.csv rows that read back split."""
    from llmsched.workload.network import load_network

    cfg = yaml.safe_load(SMALL.read_text())
    cfg["models"]["a\rb"] = cfg["models"].pop("llama-3.2-1b")
    with pytest.raises(ConfigError, match="carriage returns"):
        load_serverless(cfg)
    net = yaml.safe_load((SMALL.parents[1] / "networks" / "tandem.yaml").read_text())
    net["jobs"]["r\req"] = net["jobs"].pop("req")
    with pytest.raises(ConfigError, match="carriage returns"):
        load_network(net)
