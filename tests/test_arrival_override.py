"""An override of the arrival process, rate or cv (a flag, a keyword, a sweep's grid value)
keeps the rate and cv written inside the configuration's arrival (gamma:rate=5,cv=2, the
mapping {process: gamma, rate: 5, cv: 2}, poisson:5) unless it names its own: it does not
fall back to the default rate."""

from __future__ import annotations

import csv
import json

import pytest

from llmsched.analysis.points import resolve_point
from llmsched.api import build_config
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec

REST = {"num_requests": 100, "prompt": "const:10", "output": "const:5"}
INLINE = {"arrival": "gamma:rate=5,cv=2", **REST}
MAPPING = {"arrival": {"process": "gamma", "rate": 5, "cv": 2}, **REST}


def arrival_of(cfg) -> tuple:
    w = cfg.workload
    return w["arrival"], w["rate"], w.get("cv")


@pytest.mark.parametrize("given", [INLINE, MAPPING], ids=["inline", "mapping"])
@pytest.mark.parametrize(
    ("over", "want"),
    [
        ({"arrival": "poisson"}, ("poisson", 5, None)),  # (a gamma's cv does not carry to poisson)
        ({"arrival": "deterministic"}, ("deterministic", 5, None)),
        ({"rate": 10}, ("gamma", 10, 2)),
        ({"cv": 3}, ("gamma", 5, 3)),
        ({"arrival": "gamma:rate=7"}, ("gamma", 7, 2)),
        ({"arrival": "poisson", "rate": 8}, ("poisson", 8, None)),
    ],
)
def test_override_keeps_the_arrivals_own_rate_and_cv(given, over, want):
    cfg = build_config({"cost_model": "paper", "workload": given}, **over)
    assert arrival_of(cfg) == want


def test_override_adds_a_cv_to_an_inline_rate():
    cfg = build_config({"workload": {"arrival": "poisson:5", **REST}}, arrival="gamma", cv=2)
    assert arrival_of(cfg) == ("gamma", 5, 2)


def test_a_cv_given_for_a_process_without_one_is_still_refused():
    with pytest.raises(ConfigError, match="cv=2.0 applies to gamma arrivals only"):
        WorkloadSpec.from_dict(build_config({"workload": INLINE}, arrival="poisson", cv=2).workload)


def test_cli_simulate_keeps_the_files_rate(tmp_path):
    cfg = tmp_path / "ar.yaml"
    cfg.write_text(
        "cost_model: paper\nworkload:\n  arrival: gamma:rate=5,cv=2\n  num_requests: 100\n"
        "  prompt: const:10\n  output: const:5\n"
    )
    out = tmp_path / "run"
    assert main(["simulate", "--config", str(cfg), "--arrival", "poisson", "--out", str(out), "--quiet"]) == 0
    w = json.loads((out / "config.json").read_text())["workload"]
    assert (w["arrival"], w["rate"], w["cv"]) == ("poisson", 5.0, None)
    out2 = tmp_path / "run2"
    assert main(["simulate", "--config", str(cfg), "--rate", "10", "--out", str(out2), "--quiet"]) == 0
    w = json.loads((out2 / "config.json").read_text())["workload"]
    assert (w["arrival"], w["rate"], w["cv"]) == ("gamma", 10.0, 2.0)


def test_sweep_grid_of_arrivals_keeps_the_files_rate(tmp_path):
    cfg = tmp_path / "ar.yaml"
    cfg.write_text(
        "cost_model: paper\nworkload:\n  arrival: gamma:rate=5,cv=2\n  num_requests: 100\n"
        "  prompt: const:10\n  output: const:5\n"
    )
    for process in ("poisson", "deterministic"):
        assert arrival_of(resolve_point(str(cfg), {}, {"arrival": process})) == (process, 5, None)
    out = tmp_path / "sw"
    argv = ["sweep", "--config", str(cfg), "--grid", "arrival=poisson,deterministic", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["arrival"] for r in rows) == ["deterministic", "poisson"]
    assert [float(r["rate"]) for r in rows] == [5.0, 5.0]


M = "/work/shared/traces/mooncake_synthetic/synthetic_trace.jsonl"  # (only names: nothing read)
TM = {"process": "trace", "path": M}


@pytest.mark.parametrize(
    ("given", "over", "want"),
    [
        # a rate written inside the arrival carries to a trace as a key's does (it was dropped)
        ({"arrival": "poisson:5"}, {"arrival": f"trace:{M}"}, {"arrival": f"trace:{M}", "rate": 5.0}),
        ({"arrival": "poisson", "rate": 5}, {"arrival": f"trace:{M}"}, {"arrival": f"trace:{M}", "rate": 5.0}),
        # a gamma's cv does not (it was refused: "cv applies to gamma arrivals only")
        ({"arrival": {"process": "gamma", "rate": 5, "cv": 2}}, {"trace": M}, {"trace": M, "rate": 5.0}),
        # a trace mapping's own rate and time scale give way to a flag (refused as given twice)
        (
            {"arrival": {"process": "trace", "path": M, "rate": 2}},
            {"rate": 3},
            {"arrival": "trace", "trace": M, "rate": 3.0},
        ),
        (
            {"arrival": {"process": "trace", "path": M, "time_scale": 2}},
            {"time_scale": 3},
            {"arrival": "trace", "trace": M, "time_scale": 3.0},
        ),
        # and carry to a synthetic process, with the trace file gone (the rate fell to 16)
        (
            {"arrival": {"process": "trace", "path": M, "rate": 2}},
            {"arrival": "poisson"},
            {"arrival": "poisson", "rate": 2.0},
        ),
        ({"trace": M, "rate": 2}, {"arrival": "poisson"}, {"arrival": "poisson", "rate": 2.0}),
    ],
)
def test_an_override_to_or_from_a_trace_keeps_the_arrivals_parameters_in_any_spelling(given, over, want):
    from llmsched.api import build_config

    cfg = build_config({"cost_model": "paper", "workload": {**given, "num_requests": 100}}, **over)
    assert cfg.given_workload() == {**want, "num_requests": 100}
