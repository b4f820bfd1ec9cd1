"""`r.slo = ...` after a serverless run, as after one server's (tests/test_result_slo_changed.py):
checked as `slo=` is, the summary (overall and per model) follows it, and config.json
records the summary's SLO, the run's under provenance.slo_of_run; the summary read before
kept the run's goodput, and config.json the run's SLO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmsched.core.errors import ConfigError
from llmsched.sim.serverless_result import simulate_serverless

SMALL = str(Path(__file__).resolve().parent.parent / "examples" / "serverless" / "small.yaml")


def _goodputs(summary):
    return [summary["goodput"], *(m["goodput"] for m in summary["models"].values())]


def test_the_summary_follows_a_new_slo():
    r = simulate_serverless(SMALL, slo={"ttft_ms": 1000})
    tight = _goodputs(r.summary)
    r.slo = {"ttft_ms": 100000}
    loose = simulate_serverless(SMALL, slo={"ttft_ms": 100000}).summary
    assert r.summary["slo"] == {"ttft_ms": 100000.0}
    assert _goodputs(r.summary) == _goodputs(loose) != tight


def test_a_bad_slo_is_refused_when_set_and_none_removes_it():
    r = simulate_serverless(SMALL, slo={"ttft_ms": 1000})
    with pytest.raises(ConfigError, match="p99_itl_ms"):
        r.slo = {"p99_itl_ms": 50}
    r.slo = None
    assert "slo" not in r.summary and "goodput" not in r.summary


def test_config_json_records_the_summarys_slo_and_reruns_to_it(tmp_path):
    r = simulate_serverless(SMALL, slo={"ttft_ms": 1000})
    r.slo = {"ttft": 100000}
    r.write(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert config["run"]["slo"] == summary["slo"] == {"ttft_ms": 100000.0}
    assert config["provenance"] == {"slo_of_run": {"ttft_ms": 1000.0}}
    assert r.config["run"]["slo"] == {"ttft_ms": 1000.0}  # the result's own config is the run's
    again = simulate_serverless(str(tmp_path / "a" / "config.json")).summary
    assert _goodputs(again) == _goodputs(summary) and again["steps"] == summary["steps"]


def test_an_unchanged_slo_writes_the_config_as_it_was(tmp_path):
    r = simulate_serverless(SMALL, slo={"ttft_ms": 1000})
    r.slo = {"ttft_ms": 1000.0}
    r.write(tmp_path / "b")
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert "provenance" not in config and config["run"]["slo"] == {"ttft_ms": 1000.0}
