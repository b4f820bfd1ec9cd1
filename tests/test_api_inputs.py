"""The Python API's inputs: a cached trace, a replaced config, a Trace object with workload
options, a trace of the wrong type."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import yaml

import llmsched
from llmsched.api import SimConfig, build_config
from llmsched.core.errors import ConfigError
from llmsched.workload import Trace, load_trace, make_trace


def _csv(tmp_path, n=6):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.5},10,5\n" for i in range(n)))
    return p


def test_load_trace_gives_its_own_object_not_the_cache(tmp_path):
    p = _csv(tmp_path)
    t = load_trace(p)
    t.prompt = t.prompt * 100
    t.arrival_s = np.zeros(1)
    again = load_trace(p)
    assert again is not t and again.prompt.tolist() == [10] * 6
    assert make_trace({"trace": str(p)}).prompt.tolist() == [10] * 6
    r = llmsched.simulate(cost_model="paper", trace=str(p), verdict=False)
    assert r.prompt.tolist() == [10] * 6


def test_replaced_config_keeps_the_defaults_apart():
    cfg = SimConfig(cost_model="paper")
    same = dataclasses.replace(cfg)
    assert same.given_workload() == cfg.given_workload() == {}
    a = build_config(cfg, rate=200, duration_s=30).workload
    b = build_config(same, rate=200, duration_s=30).workload
    assert a == b and "num_requests" not in b
    # a value other than its default stays given; one equal to a default counts as not
    # given (given_workload's rule), what replace changes counts as given
    cfg = SimConfig(cost_model="paper", workload={"num_requests": 4000})
    assert build_config(dataclasses.replace(cfg), duration_s=3).workload["num_requests"] == 4000
    other = dataclasses.replace(cfg, workload={"rate": 3})
    assert other.given_workload() == {"rate": 3}
    # the copy's workload is its own, and a plain mapping (YAML dumps it)
    same.workload["rate"] = 7.0
    assert cfg.workload["rate"] == 16.0
    assert type(cfg.workload) is dict and "rate: 16" in yaml.safe_dump(cfg.workload)


@pytest.mark.parametrize(
    "option",
    [{"num_requests": 2}, {"duration_s": 1.0}, {"time_scale": 2.0}, {"prompt": "fixed:5"}, {"workload": {"rate": 2}}],
)
def test_a_trace_object_refuses_workload_options(option):
    tr = Trace(np.arange(4) * 0.5, np.full(4, 10), np.full(4, 5))
    name = next(iter(option))
    with pytest.raises(ConfigError, match=rf"a Trace object brings its own requests: {name} does not apply"):
        llmsched.simulate(trace=tr, cost_model="paper", verdict=False, **option)
    # what it is told to do instead
    r = llmsched.simulate(trace=tr.head(2), cost_model="paper", verdict=False)
    assert r.summary["num_requests"] == 2


def test_a_workload_key_given_as_a_keyword_and_in_workload_differently_is_refused(tmp_path, monkeypatch):
    """`simulate(trace="a.csv", workload={"trace": "b.csv"})` replayed a.csv, silently."""
    monkeypatch.chdir(tmp_path)
    a = _csv(tmp_path)
    b = tmp_path / "b.csv"
    b.write_text(a.read_text())
    with pytest.raises(
        ConfigError, match=r"^trace='.*t\.csv' and workload=\{'trace': 'b\.csv'\} contradict each other"
    ):
        llmsched.simulate(trace=a, workload={"trace": "b.csv"}, cost_model="const:1")
    with pytest.raises(ConfigError, match=r"^num_requests=5 and workload=\{'num_requests': 10\} contradict"):
        build_config(num_requests=5, workload={"num_requests": 10})
    # the same value (one file, two spellings), or a key given once: as before
    assert llmsched.simulate(trace=a, workload={"trace": "./t.csv"}, cost_model="const:1").summary["completed"] == 6
    cfg = build_config(num_requests=5, workload={"num_requests": 5.0, "rate": 3})
    assert cfg.workload["num_requests"] == 5 and cfg.workload["rate"] == 3
    # a config's workload is replaced by a keyword, as a flag replaces a file's
    assert build_config({"workload": {"num_requests": 10}}, num_requests=5).workload["num_requests"] == 5


@pytest.mark.parametrize(
    ("keyword", "workload", "key"),
    [
        ({"trace": "t.csv"}, {"arrival": "trace:b.csv"}, "trace"),
        ({"trace": "t.csv"}, {"arrival": {"process": "trace", "path": "b.csv"}}, "trace"),
        ({"arrival": "trace:t.csv"}, {"trace": "b.csv"}, "trace"),
        ({"trace": "t.csv"}, {"arrival": "poisson:5"}, "arrival"),
        ({"rate": 3}, {"arrival": "poisson:5"}, "rate"),
        ({"rate": 3}, {"arrival": {"process": "gamma", "rate": 5, "cv": 2}}, "rate"),
        ({"cv": 3}, {"arrival": "gamma:rate=5,cv=2"}, "cv"),
    ],
)
def test_a_trace_or_rate_given_twice_in_other_spellings_is_refused(tmp_path, monkeypatch, keyword, workload, key):
    """`simulate(trace="a.csv", workload={"arrival": "trace:b.csv"})` replayed a.csv and
    `simulate(rate=3, workload={"arrival": "poisson:5"})` ran rate 3: only the same key was compared."""
    monkeypatch.chdir(tmp_path)
    a = _csv(tmp_path)
    (tmp_path / "b.csv").write_text(a.read_text())
    name, value = next(iter(keyword.items()))
    shown = f"{name}={value!r} and workload={{'arrival'" if "arrival" in workload else f"{name}={value!r} and workload="
    with pytest.raises(ConfigError, match=rf"^{re.escape(shown)}.* contradict each other: give {key} once$"):
        llmsched.simulate(**keyword, workload={**workload, "num_requests": 3}, cost_model="const:1")


def test_a_trace_or_rate_spelled_two_ways_with_one_value_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = _csv(tmp_path)
    for workload in ({"arrival": "trace:./t.csv"}, {"arrival": {"process": "trace", "path": str(a)}}):
        r = llmsched.simulate(trace="t.csv", workload=workload, cost_model="const:1")
        assert r.summary["completed"] == 6
    cfg = build_config(rate=5, workload={"arrival": "poisson:5.0", "num_requests": 3})
    assert cfg.workload["rate"] == 5
    cfg = build_config(arrival="gamma", workload={"arrival": "gamma:rate=5,cv=2"})
    spec = llmsched.WorkloadSpec.from_dict(cfg.workload)
    assert (spec.arrival, spec.rate, spec.cv) == ("gamma", 5, 2)
    # a trace rescaled to a rate: two options, no contradiction
    assert build_config(rate=3, workload={"arrival": "trace:t.csv"}).workload["rate"] == 3
    # a config's workload is replaced by a keyword, whatever its spelling
    assert build_config({"workload": {"arrival": "poisson:5"}}, rate=3).workload["rate"] == 3


def test_a_trace_of_another_type_is_refused():
    with pytest.raises(ConfigError, match=r"trace must be a Trace .*, got dict$"):
        llmsched.simulate(trace={"arrival_s": [0]}, cost_model="paper")


def test_write_into_a_file_is_a_config_error(tmp_path):
    from pathlib import Path  # noqa: PLC0415

    from llmsched.sim.network_result import simulate_network  # noqa: PLC0415
    from llmsched.sim.serverless_result import simulate_serverless  # noqa: PLC0415

    afile = tmp_path / "afile"
    afile.write_text("x")
    ex = Path(__file__).resolve().parent.parent / "examples"
    r = llmsched.simulate(cost_model="paper", num_requests=5, verdict=False)
    results = [
        r,
        simulate_serverless(str(ex / "serverless" / "small.yaml"), num_requests=20),
        simulate_network(str(ex / "networks" / "tandem.yaml"), num_jobs=10),
    ]
    for res in results:
        with pytest.raises(ConfigError, match=r"output folder '.*afile'"):
            res.write(afile)
    assert afile.read_text() == "x"


def test_region_helpers_refuse_as_their_siblings_do():
    from llmsched.core.region import representative_step_time, workload_point  # noqa: PLC0415
    from llmsched.theory.bounds import step_time_at_budget  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"mean output must be >= 1 token, got 200 and 0.5"):
        workload_point(10, 200, 0.5)
    with pytest.raises(ConfigError, match=r"mean prompt and mean output must be >= 1 token, got 0 and 5"):
        workload_point(10, 0, 5)
    with pytest.raises(ConfigError, match=r"rate must be a finite number >= 0"):
        workload_point(-1, 200, 5)
    assert workload_point(2, 200, 5) == (400, 8)
    for f in (representative_step_time, step_time_at_budget):
        with pytest.raises(TypeError, match=r"expected a CostModel, got 'paper': build one with make_cost_model"):
            f("paper", 100, 10) if f is representative_step_time else f("paper", 100)


def test_theory_caches_read_a_changed_file_anew(tmp_path, monkeypatch):
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from llmsched.analysis.points import critical_rate_of  # noqa: PLC0415
    from llmsched.core.profile import PROFILES_DIR  # noqa: PLC0415
    from llmsched.theory import workload_means  # noqa: PLC0415

    lens = tmp_path / "lens.csv"
    lens.write_text("n\n100\n100\n")
    wl = {"prompt": f"empirical:{lens}", "output": "fixed:5"}
    assert workload_means(wl, 50)[0] == pytest.approx(100)
    lens.write_text("n\n300\n300\n300\n")
    assert workload_means(wl, 50)[0] == pytest.approx(300)
    # a relative path read from another folder
    for d, n in (("a", 40), ("b", 70)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "l.csv").write_text(f"n\n{n}\n")
    rel = {"prompt": "empirical:l.csv", "output": "fixed:5"}
    monkeypatch.chdir(tmp_path / "a")
    assert workload_means(rel, 50)[0] == pytest.approx(40)
    os.chdir(tmp_path / "b")
    assert workload_means(rel, 50)[0] == pytest.approx(70)
    # a trace
    tr = _csv(tmp_path)
    wl = {"trace": str(tr)}
    assert workload_means(wl)[0] == pytest.approx(10)
    tr.write_text("arrival_s,prompt_tokens,output_tokens\n0,20,5\n1,20,5\n")
    assert workload_means(wl)[0] == pytest.approx(20)
    # a profile:PATH folder
    prof = tmp_path / "prof"
    shutil.copytree(PROFILES_DIR / "h200", prof)
    cfg = build_config(cost_model=f"profile:{prof}#llama-3-8b", prompt="fixed:100", output="fixed:10")
    first = critical_rate_of(cfg)
    assert critical_rate_of(cfg) == first
    for table in prof.glob("*.csv"):  # every measured time (the last column, ms) doubled
        head, *body = table.read_text().splitlines()
        doubled = [",".join([*r.split(",")[:-1], str(2 * float(r.split(",")[-1]))]) for r in body]
        table.write_text("\n".join([head, *doubled]) + "\n")
    assert critical_rate_of(cfg) < 0.9 * first


def test_a_saved_config_with_a_count_and_a_duration_reloads_the_same():
    """A completed workload read back (config.json, a full YAML workload) kept its
    explicit 5,000 requests next to a duration; reading defaults out of it dropped them."""
    cfg = build_config(None, duration_s=2, num_requests=5000, rate=1)
    again = SimConfig.from_dict(cfg.to_dict())
    assert again.workload == cfg.workload and again.workload["num_requests"] == 5000


@pytest.mark.parametrize("given", ["trace", "arrival"])
def test_arrival_trace_alone_over_a_replay_given_with_its_file_replays_that_file(tmp_path, monkeypatch, given):
    """`--arrival trace` (or `arrival="trace"`) beside a config or `workload=` naming the
    trace file failed with "trace arrivals need a file": the override dropped the given
    file as a new process drops it. `trace` alone now replays the file given."""
    from llmsched.cli import main

    monkeypatch.chdir(tmp_path)
    p = _csv(tmp_path, n=4)
    workload = {"trace": "t.csv"} if given == "trace" else {"arrival": "trace:t.csv"}
    run = llmsched.simulate(arrival="trace", workload=workload, cost_model="const:1")
    assert run.stats.n == 4
    assert run.config["workload"]["trace"] == str(p)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"cost_model": "const:1", "workload": workload}))
    assert main(["simulate", "--config", "c.yaml", "--arrival", "trace", "--out", "o"]) == 0
    assert len((tmp_path / "o" / "requests.csv").read_text().splitlines()) == 5
    # a new process still replaces the given replay, its file with it
    from llmsched.workload.spec import override_workload

    assert override_workload(workload, {"arrival": "poisson"}).get("trace") is None
    assert override_workload(workload, {"arrival": "trace"}) == workload  # the replay as given
