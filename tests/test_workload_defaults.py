"""Which default workload options a run takes: none for a trace replay, whatever the
arrival's spelling (trace:F, replay:F, any case, the YAML mapping, a named trace)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmsched.api import DEFAULT_WORKLOAD, SimConfig, build_config, simulate
from llmsched.cli import main
from llmsched.theory import workload_means
from llmsched.workload import replays_trace

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
    assert again.workload == {"rate": 16.0, "num_requests": 2, "trace": tcsv, "arrival": "replay:F"}
    assert build_config(SimConfig(), trace=tcsv).workload == {"trace": tcsv}
