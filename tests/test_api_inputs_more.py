"""More of the Python API's inputs: a result's steps after another run was written into
its folder, single strings where lists are meant, unknown keywords, numpy numbers, and
the theory functions' arguments: ConfigErrors naming the argument, never a raw error or a
silent wrong answer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import llmsched
from llmsched.analysis.grid import parse_grid, parse_slo
from llmsched.analysis.reproduce import reproduce_stability
from llmsched.analysis.sweep import max_stable_rate, run_sweep
from llmsched.api import SimConfig, cluster_network
from llmsched.core.cost import make_cost_model
from llmsched.core.errors import ConfigError
from llmsched.sim.network_result import simulate_network
from llmsched.sim.serverless_result import simulate_serverless
from llmsched.theory import (
    capacity,
    peak_token_capacity,
    stability_region,
    stability_verdict,
    step_time_at_budget,
    token_capacity,
    work_per_request,
)
from llmsched.workload import Trace, WorkloadSpec

BASE = dict(cost_model="paper", rate=5, verdict=False)
NETWORK = "examples/networks/tandem.yaml"
SERVERLESS = "examples/serverless/small.yaml"


def _steps_run(n):
    return llmsched.simulate(num_requests=n, record_steps=True, **BASE)


def test_steps_of_a_result_whose_folder_another_run_replaced_are_refused(tmp_path):
    pytest.importorskip("pandas")
    a = tmp_path / "A"
    r1, r2 = _steps_run(20), _steps_run(30)
    r1.write(a)
    own = len(r1.to_pandas()["steps"])
    r2.write(a)  # replaces A/steps.csv
    with pytest.raises(ConfigError, match=r"steps.csv in .*A was replaced by another run .*record_steps"):
        r1.to_pandas()
    with pytest.raises(ConfigError, match=r"replaced by another run"):
        r1.write(tmp_path / "B")  # would copy r2's steps as r1's
    assert not (tmp_path / "B").exists()
    assert len(r2.to_pandas()["steps"]) != own  # r2's own steps are still its
    # a run without steps written into A removes steps.csv: r2 no longer has them
    llmsched.simulate(num_requests=10, **BASE).write(a)
    with pytest.raises(ConfigError, match=r"\(or removed\)"):
        r2.to_pandas()
    with pytest.raises(ConfigError, match=r"replaced by another run"):
        r2.write_parquet(tmp_path / "P")
    # a result's own folder, written again or copied elsewhere, keeps its steps
    r3 = _steps_run(20)
    r3.write(tmp_path / "C")
    r3.write(tmp_path / "C")
    r3.write(tmp_path / "D")
    assert len(r3.to_pandas()["steps"]) == own


def test_single_strings_are_one_name_or_refused():
    assert parse_slo("p99_itl_ms=100") == {"p99_itl_ms": 100.0}
    assert parse_grid("policy=orca,sarathi") == {"policy": ["orca", "sarathi"]}
    with pytest.raises(ConfigError, match=r"SLO must be METRIC=LIMIT"):
        parse_slo([5])
    with pytest.raises(ConfigError, match=r"classes must be a list of mappings .* got one mapping"):
        llmsched.simulate(classes={"tag": "a"}, num_requests=5, **BASE)
    with pytest.raises(ConfigError, match=r"seeds must be a list of whole numbers >= 0, got '01'"):
        reproduce_stability(seeds="01")
    with pytest.raises(ConfigError, match=r"seeds must be a list"):
        max_stable_rate(seeds="01", **BASE)
    with pytest.raises(ConfigError, match=r"policies must be a list of policy names"):
        reproduce_stability(policies=[1])


def test_a_single_policy_name_runs_that_policy(tmp_path):
    out = max_stable_rate(policies="orca", num_requests=200, tol=0.5, progress=False, cost_model="paper")
    assert [row["policy"] for row in out] == ["orca"]
    res = run_sweep(
        None,
        "policy=orca",
        search="max-stable-rate",
        slo="p99_itl_ms=1e9",
        tol=0.5,
        num_requests=200,
        progress=False,
        plots=False,
        cost_model="paper",
    )
    assert len(res.search) == 1 and res.search[0]["policy"] == "orca"


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: run_sweep(None, 5), r"grid must be a mapping"),
        (lambda: run_sweep(None, None, out_dir=5, **BASE), r"must be a folder's path .* got 5"),
        (lambda: max_stable_rate(seeds=0, **BASE), r"seeds must be a list of whole numbers >= 0, got 0"),
        (lambda: reproduce_stability(seeds=0), r"seeds must be a list"),
        (lambda: reproduce_stability(out_dir=None), r"must be a folder's path .* got None"),
        (lambda: llmsched.make_scheduler(policy_options=[1]), r"policy_options must be a mapping"),
        (lambda: llmsched.make_scheduler(admission_options=[1]), r"admission_options must be a mapping"),
        (lambda: llmsched.make_scheduler(admission=None), r"admission must be a policy's name"),
        (lambda: llmsched.make_scheduler(foo=1), r"unknown make_scheduler argument 'foo' \(known: .*b_max"),
        (lambda: SimConfig(foo=1), r"unknown configuration option 'foo' \(known: .*b_max"),
        (lambda: WorkloadSpec(foo=1), r"unknown workload option 'foo' \(known: .*rate"),
        (lambda: SimConfig.from_dict({"workload": {"rat": 1}}), r"unknown workload option 'rat'; did you mean 'rate'"),
        # a misspelt option of the run comes first, before the workload's keys
        (
            lambda: SimConfig.from_dict({"polcy": "x", "workload": {"rat": 1}}),
            r"unknown configuration option 'polcy'; did you mean 'policy'",
        ),
        # a workload key at the top of a config (the known keys did not say where it goes)
        (
            lambda: SimConfig.from_dict({"num_requests": 50}),
            r"'num_requests' is a workload option: put it under 'workload:'",
        ),
        (lambda: simulate_serverless(SERVERLESS, foo=1), r"unknown option 'foo' \(known: .*max_time_s"),
        (lambda: simulate_network(NETWORK, foo=1), r"unknown option 'foo' \(known: .*num_jobs"),
        (lambda: llmsched.simulate_network(NETWORK, foo=1), r"unknown option 'foo'"),
        (lambda: llmsched.simulate(progress=5, num_requests=5, **BASE), r"progress must be a function"),
        (lambda: simulate_serverless(SERVERLESS, progress=5), r"progress must be a function"),
        (lambda: simulate_serverless(SERVERLESS, fast="no"), r"fast must be true or false, got 'no'"),
        (lambda: simulate_network(NETWORK, fast="no"), r"fast must be true or false, got 'no'"),
        (lambda: Trace(["a"], [1], [1]), r"trace arrival_s must be numbers"),
        (lambda: Trace([True], [1], [1]), r"trace arrival_s must be numbers"),
        (lambda: llmsched.simulate(duration_s="10", **BASE), r"duration_s must be a number, got '10'"),
        (lambda: llmsched.simulate(b_max="512", num_requests=5, **BASE), r"b_max must be a number"),
        (
            lambda: run_sweep(None, None, search="max-stable-rate", search_hi=math.inf, **BASE),
            r"search_hi must be a finite number > 0, got inf",
        ),
        (lambda: reproduce_stability(load=np.float32(20)), r"load must be a fraction of .* got 20.0$"),
        (lambda: reproduce_stability(tol=np.float32(2)), r"tol must be in \(0, 1\)"),
    ],
)
def test_bad_arguments_are_config_errors(call, msg):
    with pytest.raises(ConfigError, match=msg):
        call()


def test_numpy_numbers_are_numbers():
    r = llmsched.simulate(max_time_s=np.float32(2), sample_interval_s=np.float32(0.5), num_requests=50, **BASE)
    assert type(r.config["max_time_s"]) is float and r.config["max_time_s"] == 2.0
    assert r.summary["sim_end_s"] <= 2.5
    json.dumps(r.config["sample_interval_s"])
    res = simulate_network(NETWORK, num_jobs=20, max_time_s=np.float32(1))
    assert res.stats is not None


def test_a_dict_grid_reads_strings_as_the_command_line_does():
    assert parse_grid({"rate": ["3", "4.5"], "policy": ["orca"]}) == {"rate": [3, 4.5], "policy": ["orca"]}
    res = run_sweep({"cost_model": "paper", "verdict": False, "workload": {"num_requests": 10}}, {"rate": ["3"]})
    assert res.rows[0]["rate"] == 3 and not isinstance(res.rows[0]["rate"], str)


@pytest.mark.parametrize(
    "option", [dict(max_time_s=5), dict(sample_interval_s=0.01), dict(verdict=False), dict(fast=False)]
)
def test_cluster_network_refuses_run_options(option):
    with pytest.raises(ConfigError, match=rf"cluster_network does not take {next(iter(option))} .*simulate_network"):
        cluster_network(replicas=2, num_requests=20, **option, **BASE_NO_VERDICT)
    assert cluster_network(replicas=2, num_requests=20, **BASE_NO_VERDICT) is not None


BASE_NO_VERDICT = dict(cost_model="paper", rate=5)
TWO_CLASSES = [{"tag": "a", "share": 1}, {"tag": "b", "share": 3}]


@pytest.mark.parametrize("arrival", ["deterministic", "gamma"])
def test_cluster_network_refuses_classes_that_would_split_a_non_poisson_stream(arrival):
    # each class becomes its own job type and arrival stream: two deterministic streams at
    # rate x share are not one deterministic stream whose requests draw a class
    with pytest.raises(ConfigError, match=rf"2 workload classes needs poisson arrivals.*own {arrival} stream"):
        cluster_network(replicas=2, num_requests=20, arrival=arrival, classes=TWO_CLASSES, **BASE_NO_VERDICT)


def test_cluster_network_splits_poisson_classes_and_keeps_one_class_streams_whole():
    net = cluster_network(replicas=2, num_requests=20, classes=TWO_CLASSES, **BASE_NO_VERDICT)
    assert {j.name: j.arrival.rate for j in net.jobs} == {"a": 1.25, "b": 3.75}
    for arrival in ("deterministic", "gamma"):
        one = [{"tag": "only", "share": 2}]
        net = cluster_network(replicas=2, num_requests=20, arrival=arrival, classes=one, **BASE_NO_VERDICT)
        assert [(j.name, type(j.arrival).__name__.lower(), j.arrival.rate) for j in net.jobs] == [
            ("only", arrival, 5.0)
        ]


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(rate="10"), r"arrival rate \(rate\) must be a finite number >= 0, got '10'"),
        (dict(rate=[10]), r"\(rate\) must be a finite number"),
        (dict(rate=True), r"\(rate\) must be a finite number"),
        (dict(cached_prompt="10"), r"\(cached_prompt\) must be a number >= 0"),
        (dict(cached_prompt=None), r"\(cached_prompt\) must be a number >= 0"),
        (dict(foo=1), r"unknown capacity argument 'foo'"),
        (dict(mean_prompt="200"), r"mean_prompt must be a number of tokens, got '200'"),
        (dict(mean_output=None), r"mean_output must be a number of tokens, got None"),
        (dict(mean_output=math.inf), r"mean_output must be a finite number of tokens up to 1,073,741,824"),
        (dict(mean_prompt=1e300), r"mean_prompt must be a finite number of tokens up to"),
    ],
)
def test_capacity_refuses_bad_arguments(kw, msg):
    args = {"mean_prompt": 200, "mean_output": 101, **kw}
    with pytest.raises(ConfigError, match=msg):
        capacity("paper", 512, **args)


def test_theory_helpers_refuse_bad_arguments():
    cost = make_cost_model("paper")
    with pytest.raises(ConfigError, match=r"mean_prompt must be a number"):
        work_per_request("200", 100)
    with pytest.raises(ConfigError, match=r"capacity must be a finite number, got 'x'"):
        stability_verdict(np.arange(100.0), np.ones(100), capacity="x")
    with pytest.raises(ConfigError, match=r"mean_prompt must be a number"):
        stability_region("profile:h200-llama-3-8b", 512, 16, mean_prompt="200", mean_output=101)
    with pytest.raises(ConfigError, match=r"mix must be a LengthMix"):
        capacity("profile:h200-llama-3-8b", 512, 200, 101, mix=[1, 2])
    with pytest.raises(ConfigError, match=r"b_max must be a positive integer, got 0"):
        peak_token_capacity(cost, 0)
    for b in (-1, 0, 1.5):
        with pytest.raises(ConfigError, match=r"b \(a step's tokens\) must be a whole number >= 1"):
            step_time_at_budget(cost, b)
    assert step_time_at_budget(cost, 512) == pytest.approx(cost.load_time(512))
    # one mean without the other was silently ignored (a prefill-only step's time)
    with pytest.raises(ConfigError, match=r"give both mean_prompt and mean_output"):
        token_capacity("profile:h200-llama-3-8b", 512, 200)
    assert token_capacity("profile:h200-llama-3-8b", 512, 200, 101) != token_capacity("profile:h200-llama-3-8b", 512)


def test_capacity_checks_each_input_once_and_its_helpers_still_check_theirs(monkeypatch):
    from llmsched.theory import bounds

    calls = {"check_mean_lengths": 0, "_check_cached": 0}
    for name in calls:
        checked = getattr(bounds, name)

        def counted(*args, _name=name, _checked=checked):
            calls[_name] += 1
            return _checked(*args)

        monkeypatch.setattr(bounds, name, counted)
    profile = make_cost_model("profile:h200-llama-3-8b")
    rep = capacity(profile, 512, 1000, 200, cached_prompt=100)
    assert calls == {"check_mean_lengths": 1, "_check_cached": 1}
    assert rep.step_time_at_b_max_s == step_time_at_budget(profile, 512, 1000, 200, 100)
    assert rep.peak_token_capacity == peak_token_capacity(profile, 512, 1000, 200, 100)[0]
    for helper in (step_time_at_budget, peak_token_capacity):
        with pytest.raises(ConfigError, match=r"\(cached_prompt\) must be a number >= 0 and below the mean prompt"):
            helper(profile, 512, 1000, 200, 1000)


def test_an_unknown_keyword_lists_every_keyword_the_function_takes():
    import inspect

    for func, first in ((llmsched.make_scheduler, {}), (simulate_serverless, SERVERLESS), (simulate_network, NETWORK)):
        with pytest.raises(ConfigError) as e:
            func(*([first] if first else []), foo=1)
        known = str(e.value).partition("(known: ")[2].removesuffix(")").split(", ")
        assert known == sorted(set(inspect.signature(func).parameters) - {"unknown"})


def test_numpy_numbers_in_theory_give_python_numbers():
    rep = capacity("paper", 512, np.float32(200), np.float32(101), rate=np.float32(3))
    d = rep.to_dict()
    json.dumps(d)
    assert all(type(v) is float for k, v in d.items() if k in ("mean_prompt", "rate", "critical_rate"))
    assert rep.critical_rate == capacity("paper", 512, 200, 101).critical_rate
    v = stability_verdict(np.arange(100.0), np.ones(100), capacity=np.float32(100))
    assert v.verdict == "stable" and type(v.capacity_per_s) is float


def test_a_generator_of_policy_names_is_read_once():
    from llmsched.analysis.sweep import max_stable_rate

    out = max_stable_rate(policies=(p for p in ["orca"]), num_requests=200, tol=0.5, progress=False, cost_model="paper")
    assert [row["policy"] for row in out] == ["orca"]


def test_parquet_must_be_true_or_false(tmp_path):
    """`parquet="no"` is truthy: simulate and SimResult.write wrote the Parquet tables."""
    run = dict(cost_model="paper", prompt="const:100", output="const:10", num_requests=5, rate=2)
    with pytest.raises(ConfigError, match=r"^parquet must be true or false, got 'no'$"):
        llmsched.simulate(out_dir=tmp_path / "a", parquet="no", **run)
    assert not (tmp_path / "a").exists()
    res = llmsched.simulate(**run)
    with pytest.raises(ConfigError, match=r"^parquet must be true or false, got 'no'$"):
        res.write(tmp_path / "b", parquet="no")
    assert not (tmp_path / "b").exists()
    assert not any(f.suffix == ".parquet" for f in res.write(tmp_path / "c", parquet=False).iterdir())


@pytest.mark.parametrize("spec", [None, 3, ["paper"]])
def test_a_cost_model_that_is_no_name_says_so(spec):
    # str() made None "unknown cost model 'none'" and 3 "unknown cost model '3'"
    with pytest.raises(ConfigError, match=r"^cost model must be a name \(paper, profile, \.\.\.\) or a CostModel, got"):
        make_cost_model(spec)
