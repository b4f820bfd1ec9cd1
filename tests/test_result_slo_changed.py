"""`r.slo = ...` after a run: summary.json reports goodput under the new limits, and
config.json agrees with it (it kept the run's SLO), pinning the ITL target the run's TWP
took from the run's SLO, so that a rerun from config.json writes the same summary."""

from __future__ import annotations

import json

import pytest

import llmsched
from llmsched.core.errors import ConfigError

RUN = dict(cost_model="paper", rate=1.5, num_requests=150, seed=2)


def _read(folder, name):
    return json.loads((folder / name).read_text())


def test_a_twp_run_written_under_a_new_slo_reruns_to_the_same_summary(tmp_path):
    r = llmsched.simulate(admission="twp", slo={"itl_ms": 80, "ttft_ms": 3000}, **RUN)
    r.slo = {"itl": 200}
    r.write(tmp_path / "a")
    config, summary = _read(tmp_path / "a", "config.json"), _read(tmp_path / "a", "summary.json")
    assert config["slo"] == summary["slo"] == {"itl_ms": 200.0}
    assert config["provenance"]["slo_of_run"] == {"itl_ms": 80.0, "ttft_ms": 3000.0}
    assert config["admission_options"]["itl_target_ms"] == 80.0  # what paced the run
    again = llmsched.simulate(config=str(tmp_path / "a" / "config.json"))
    for key in ("goodput", "mean_ttft_ms", "p99_itl_ms", "steps"):
        assert again.summary[key] == summary[key], key


def test_a_default_target_is_pinned_as_null(tmp_path):
    r = llmsched.simulate(admission="dynamicbatch", **RUN)
    r.slo = {"tpot_ms": 120}
    r.write(tmp_path / "b")
    config = _read(tmp_path / "b", "config.json")
    assert config["slo"] == {"tpot_ms": 120.0} and config["admission_options"] == {"itl_target_ms": None}
    again = llmsched.simulate(config=str(tmp_path / "b" / "config.json"))
    assert again.summary["goodput"] == r.summary["goodput"] and again.summary["steps"] == r.summary["steps"]


def test_an_unchanged_slo_writes_the_config_as_it_was(tmp_path):
    r = llmsched.simulate(admission="twp", slo={"itl_ms": 80}, **RUN)
    r.slo = {"itl_ms": 80.0}
    r.write(tmp_path / "c")
    assert _read(tmp_path / "c", "config.json")["admission_options"] == {}
    assert "slo_of_run" not in _read(tmp_path / "c", "config.json")["provenance"]


def test_a_bad_slo_is_refused_when_set():
    r = llmsched.simulate(**RUN)
    with pytest.raises(ConfigError, match="p99_itl_ms"):
        r.slo = {"p99_itl_ms": 50}
    r.slo = None
    assert "slo" not in r.summary


def test_write_config_alone_is_refused_under_another_slo_than_the_folders_summary(tmp_path):
    r = llmsched.simulate(admission="twp", slo={"itl_ms": 80}, **RUN)
    r.write(tmp_path / "d")
    r.slo = {"itl_ms": 200}
    with pytest.raises(ConfigError, match="summary.json has"):
        r.write_config(tmp_path / "d")
    assert _read(tmp_path / "d", "config.json")["slo"] == {"itl_ms": 80}
    r.slo = {"itl_ms": 80}
    r.write_config(tmp_path / "d")  # the same limits again: the folder's summary's
