"""Which default workload options a run takes: none for a trace replay, whatever the
arrival's spelling (trace:F, replay:F, any case, the YAML mapping, a named trace); no
request count for a workload given a duration; no rate for an arrival that names its own."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from llmsched.analysis.points import resolve_point
from llmsched.api import DEFAULT_WORKLOAD, SimConfig, build_config, simulate
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.theory import workload_means
from llmsched.workload import make_trace, replays_trace

ROWS = "arrival_s,prompt_tokens,output_tokens\n0.0,100,5\n1.0,50,3\n2.0,70,4\n"
PROMPTS, OUTPUTS = [100, 50, 70], [5, 3, 4]

# every spelling WorkloadSpec reads as a replay of F
SPELLINGS = ["trace:F", "replay:F", "Trace:F", "REPLAY:F", "  trace:F", "TRACE : F"]
MAPPINGS = [{"process": "trace", "path": "F"}, {"process": "Replay", "file": "F"}, {"path": "F"}]


@pytest.fixture
def tcsv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "F").write_text(ROWS)
    return "F"


@pytest.mark.parametrize("arrival", [*SPELLINGS, *MAPPINGS, "azure-conv", "Azure-Conv", " AZURE-CONV"])
def test_replays_trace_reads_every_spelling(arrival):
    assert replays_trace({"arrival": arrival})
    assert replays_trace({"trace": "F"})
    assert not replays_trace({"arrival": "poisson:5"}) and not replays_trace({"arrival": {"process": "gamma"}})


@pytest.mark.parametrize("arrival", SPELLINGS)
def test_cli_replays_every_spelling(tcsv, arrival, capsys):
    assert main(["simulate", "--arrival", arrival, "--cost-model", "paper", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    # the default workload (16 req/s, lognormal prompts, 5000 requests) gave 1156 input tokens
    assert s["num_requests"] == 3 and s["total_input_tokens"] == 220 and s["total_output_tokens"] == 12


@pytest.mark.parametrize("arrival", [*SPELLINGS, *MAPPINGS])
def test_api_and_yaml_replay_every_spelling(tcsv, tmp_path, arrival):
    res = simulate(cost_model="paper", workload={"arrival": arrival}, verdict=False)
    assert res.prompt.tolist() == PROMPTS and res.output.tolist() == OUTPUTS
    assert res.arrival_s.tolist() == [0.0, 1.0, 2.0]
    if isinstance(arrival, str):
        res = simulate(cost_model="paper", arrival=arrival, verdict=False)
        assert res.prompt.tolist() == PROMPTS and res.arrival_s.tolist() == [0.0, 1.0, 2.0]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"cost_model": "paper", "workload": {"arrival": arrival}}))  # JSON is YAML
    res = simulate(str(cfg), verdict=False)
    assert res.prompt.tolist() == PROMPTS and res.arrival_s.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("arrival", ["replay:F", "Trace:F", "  trace:F"])
def test_capacity_reads_the_trace_of_every_spelling(tcsv, arrival, capsys):
    assert main(["capacity", "--cost-model", "paper", "--arrival", arrival, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["means_source"] == "trace" and r["rate"] == pytest.approx(1.0)
    c = r["capacity"]
    assert c["mean_prompt"] == pytest.approx(np.mean(PROMPTS)) and c["mean_output"] == pytest.approx(4.0)
    assert workload_means({"arrival": {"process": "replay", "path": "F"}}) == pytest.approx((220 / 3, 4.0))


def test_named_trace_in_any_case_takes_no_default():
    for arrival in ("AZURE-CONV", " Azure-Conv"):
        wl = build_config(arrival=arrival).workload
        assert wl == {"arrival": arrival}  # no default rate, lengths or count


def test_defaults_complete_a_synthetic_workload():
    assert SimConfig().workload == DEFAULT_WORKLOAD
    assert build_config(rate=3).workload == {**DEFAULT_WORKLOAD, "rate": 3}
    assert SimConfig.from_dict({"workload": {"seed": 4}}).workload == {**DEFAULT_WORKLOAD, "seed": 4}


def test_a_value_given_equal_to_its_default_stays_given(tcsv):
    # switching a configuration to a trace drops the defaults, not values the file gave
    cfg = build_config({"workload": {"rate": 16.0, "num_requests": 2}}, trace=tcsv)
    assert cfg.workload == {"rate": 16.0, "num_requests": 2, "trace": tcsv}
    again = build_config(cfg, arrival="replay:F", trace=None)
    # (the new arrival replaces the given process with its trace file: both were two files)
    assert again.workload == {"rate": 16.0, "num_requests": 2, "arrival": "replay:F"}
    assert build_config(SimConfig(), trace=tcsv).workload == {"trace": tcsv}


# 200 req/s for 30 s: 6,066 arrivals (seed 0), past the default count of 5,000
FAST = ["--prompt", "const:10", "--output", "const:5", "--cost-model", "paper"]


def test_cli_duration_alone_takes_no_default_count(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--rate", "200", "--duration", "30", *FAST, "--out", str(out), "--quiet"]) == 0
    with open(out / "requests.csv") as f:
        arrival = np.array([float(r["arrival_s"]) for r in csv.DictReader(f)])
    # the default count cut this run at 5,000 requests, the last arriving at 24.9 s
    assert len(arrival) == 6066 and 29.9 < arrival.max() <= 30.0


def test_python_and_config_duration_take_no_default_count(tmp_path):
    res = simulate(rate=200, duration_s=30, prompt="const:10", output="const:5", cost_model="paper", verdict=False)
    assert len(res.arrival_s) == 6066 and res.arrival_s.max() > 29.9
    cfg = tmp_path / "run.yaml"
    cfg.write_text("workload:\n  rate: 200\n  duration_s: 30\n")
    assert "num_requests" not in build_config(str(cfg)).workload
    assert len(make_trace(build_config(str(cfg)).workload)) == 6066
    # a sweep's point and a load (rate from lambda*) keep the rule
    point = resolve_point(None, {"duration_s": 30, "cost_model": "paper"}, {"load": 0.5})
    assert "num_requests" not in point.workload and point.workload["duration_s"] == 30


def test_a_count_given_with_a_duration_still_caps():
    assert build_config(rate=200, duration_s=30, num_requests=100).workload["num_requests"] == 100
    # a count from a file and a duration from the flags: both hold, whichever comes first
    cfg = build_config({"workload": {"num_requests": 5000}}, duration_s=30)
    assert cfg.workload["num_requests"] == 5000 and cfg.workload["duration_s"] == 30
    assert build_config({"workload": {"duration_s": 30}}, num_requests=7).workload["num_requests"] == 7


@pytest.mark.parametrize(
    ("arrival", "rate"),
    [("poisson:5", 5.0), ("gamma:rate=5,cv=2", 5.0), ("deterministic:rate=4", 4.0), ("gamma:cv=2", 16.0)],
)
def test_an_inline_rate_stands_against_no_default(arrival, rate, capsys):
    assert main(["simulate", "--arrival", arrival, *FAST, "--num-requests", "50", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["num_requests"] == 50
    res = simulate(arrival=arrival, num_requests=50, prompt="const:10", output="const:5", cost_model="paper")
    assert res.config["workload"]["rate"] == rate  # gamma:cv=2 names no rate: the default holds
    assert build_config(arrival=arrival, rate=rate).workload["rate"] == rate  # the same value again is no conflict


def test_yaml_arrival_mapping_rate_stands_against_no_default(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("cost_model: paper\nworkload:\n  arrival: {process: gamma, rate: 5, cv: 2}\n  num_requests: 50\n")
    res = simulate(str(cfg), verdict=False)
    assert res.config["workload"]["rate"] == 5.0 and res.config["workload"]["cv"] == 2.0
    tr = make_trace(build_config(str(cfg)).workload)
    assert len(tr) == 50


def test_a_rate_given_against_the_inline_one_is_refused(tmp_path, capsys):
    assert main(["simulate", "--arrival", "poisson:5", "--rate", "7", *FAST, "--num-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "llmsched simulate: error: rate given twice with different values: 7 and 5 in arrival 'poisson:5'"
    # (given against a configuration's arrival, a rate replaces that one, as any option overrides the file's)
    assert build_config({"workload": {"arrival": {"process": "gamma", "rate": 5}}}, rate=7).workload["rate"] == 7
    with pytest.raises(ConfigError, match="rate given twice with different values: 3 and 4 in arrival 'gamma:rate=3"):
        build_config(arrival="gamma:rate=3,rate=4")


def test_a_workload_changed_after_construction_keeps_the_default_rules():
    # a value set on cfg.workload counts as given; the defaults it still holds do not, so a
    # duration given later drops the default request count as it does on a fresh config
    cfg = build_config()
    cfg.workload["rate"] = 3
    wl = build_config(cfg, duration_s=10).workload
    assert wl["rate"] == 3 and wl["duration_s"] == 10 and "num_requests" not in wl
    # a count given explicitly stays, even when it equals the default
    wl = build_config(build_config(num_requests=DEFAULT_WORKLOAD["num_requests"]), duration_s=10).workload
    assert wl["num_requests"] == DEFAULT_WORKLOAD["num_requests"]


def test_workload_means_takes_the_run_defaults():
    """`workload_means` of a workload leaving its laws out samples the default laws a run
    takes (it said "deterministic arrivals need a prompt length law": an arrival the user
    did not choose, the sampler's own), and a missing law is named with the right article."""
    assert workload_means({"rate": 12}, 20_000) == workload_means(DEFAULT_WORKLOAD, 20_000)
    mp, mo = workload_means({"arrival": "gamma", "rate": 12, "cv": 2, "prompt": "const:5"}, 20_000)
    assert mp == 5.0 and mo == workload_means(DEFAULT_WORKLOAD, 20_000)[1]
    with pytest.raises(ConfigError, match=r"^gamma arrivals need an output length law \(e\.g\. output "):
        make_trace({"arrival": "gamma", "rate": 1, "num_requests": 3, "prompt": "const:5"})
