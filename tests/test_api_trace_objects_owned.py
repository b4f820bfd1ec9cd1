"""A Trace object given to `simulate` is checked again and copied; a configuration's
workload options given with one are refused; `dataclasses.replace` keeps a config's
workload; a summary read before `slo` was set is computed anew."""

import dataclasses
import json
import types
import warnings

import numpy as np
import pytest

import llmsched
from llmsched import SimConfig
from llmsched.api import build_config
from llmsched.core.errors import ConfigError, InputWarning
from llmsched.workload import Trace, WorkloadSpec, make_trace


def _trace(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(0.2, n)), rng.integers(10, 300, n), rng.integers(1, 50, n)


def test_a_result_keeps_its_lengths_when_the_callers_arrays_change(tmp_path):
    """The Trace kept the caller's int64 arrays and the result the Trace's: a buffer reused
    for a second run changed the first result's lengths, its (lazy) summary and requests.csv."""
    arrival, prompt, output = _trace()
    want_in = int(prompt.sum())
    r = llmsched.simulate(trace=Trace(arrival, prompt, output), cost_model="paper")
    prompt[:] = 1  # the caller's buffer, reused
    assert int(r.prompt.sum()) == want_in and r.summary["total_input_tokens"] == want_in
    # the Trace's own arrays changed in place after the run: the result is its own too
    t = Trace(arrival, np.full(len(arrival), 7), output)
    r2 = llmsched.simulate(trace=t, cost_model="paper")
    t.prompt[:] = 3
    r2.write(tmp_path / "w")
    rows = (tmp_path / "w" / "requests.csv").read_text().splitlines()
    assert rows[1].split(",")[3] == "7" and r2.summary["total_input_tokens"] == 7 * len(arrival)


def test_a_trace_copies_its_lengths_and_tags():
    prompt, tag = np.array([5, 6], dtype=np.int64), np.array(["a", "b"])
    t = Trace([0.0, 1.0], prompt, [1, 1], tag=tag)
    prompt[0], tag[0] = 99, "z"
    assert t.prompt.tolist() == [5, 6] and t.tag.tolist() == ["a", "b"]


def test_a_uint64_length_past_int64_is_too_large_not_negative():
    with pytest.raises(ConfigError, match=r"prompt lengths are too large \(9223372036854775808 tokens\)"):
        Trace([0.0], np.array([2**63], dtype=np.uint64), [1])


def _run(trace):
    return llmsched.simulate(trace=trace, cost_model="paper")


def test_trace_like_objects_and_changed_traces_are_checked_again():
    """A Trace-like object, or a Trace whose arrays were reassigned, ran unchecked: fractional
    lengths were truncated in the run but summed whole in the summary, a list of tags was
    an AttributeError, a short column numpy's broadcast ValueError."""
    ns = types.SimpleNamespace(arrival_s=np.array([0.0, 0.5]), prompt=np.array([100.7, 200.2]), output=[3, 2])
    with pytest.raises(ConfigError, match="prompt lengths must be whole numbers"):
        _run(ns)
    t = Trace([0.0, 0.5, 1.0], [100, 200, 50], [10, 3, 2])
    t.prompt = np.array([100.7, 200.2, 50.9])
    with pytest.raises(ConfigError, match="prompt lengths must be whole numbers"):
        _run(t)
    t = Trace([0.0, 0.5, 1.0], [100, 200, 50], [10, 3, 2])
    t.prompt = np.array([100, 200])
    with pytest.raises(ConfigError, match="trace columns differ in length"):
        _run(t)
    t = Trace([0.0, 0.5, 1.0], [100, 200, 50], [10, 3, 2])
    t.tag = ["x", "y"]
    with pytest.raises(ConfigError, match="tag column has 2 entries for 3 requests"):
        _run(t)
    ns = types.SimpleNamespace(arrival_s=[0.0, 0.5, 1.0], prompt=[100, 200, 50], output=[10, 3, 2], tag=["a", "b", "a"])
    r = _run(ns)
    assert r.summary["total_input_tokens"] == 350 and r.summary["tags"]["a"]["num_requests"] == 2


def test_a_configs_workload_options_with_a_trace_object_are_refused_not_dropped():
    """They were dropped without a word: 500 requests ran at 1x for num_requests 10, time_scale 4."""
    t = Trace(*_trace(20))
    with pytest.raises(ConfigError, match=r"workload options \(num_requests, time_scale\) do not apply"):
        llmsched.simulate({"cost_model": "paper", "workload": {"num_requests": 10, "time_scale": 4}}, trace=t)
    with pytest.raises(ConfigError, match=r"workload options \(num_requests, duration_s\)"):
        llmsched.simulate(SimConfig(cost_model="paper", workload={"num_requests": 10, "duration_s": 5}), trace=t)
    with pytest.warns(InputWarning, match="rate=3.0 is ignored"):
        r = llmsched.simulate({"cost_model": "paper", "workload": {"rate": 3}}, trace=t)
    assert len(r.prompt) == 20
    # a config without workload options, as before
    assert len(llmsched.simulate(SimConfig(cost_model="paper"), trace=t).prompt) == 20


def test_a_runs_config_json_reruns_with_its_requests_csv_as_a_trace_object(tmp_path):
    first = llmsched.simulate(cost_model="paper", rate=5, num_requests=30, time_scale=2, out_dir=tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = llmsched.simulate(
            str(tmp_path / "a" / "config.json"), trace=Trace.from_csv(tmp_path / "a" / "requests.csv")
        )
        again_dict = llmsched.simulate(
            json.loads((tmp_path / "a" / "config.json").read_text()),
            trace=Trace.from_csv(tmp_path / "a" / "requests.csv"),
        )
    for r in (again, again_dict):
        assert {k: v for k, v in r.summary.items() if k != "wall_s"} == {
            k: v for k, v in first.summary.items() if k != "wall_s"
        }


def test_replace_runs_the_workload_of_the_config_it_copies():
    """A workload edited in place (a duration added) ran its default request count once
    copied by `dataclasses.replace`: 5,000 requests instead of the duration's 10,176."""
    base = SimConfig(cost_model="paper", workload={"rate": 50, "prompt": "const:20", "output": "const:5"})
    base.workload["duration_s"] = 200.0
    for copy in (dataclasses.replace(base), dataclasses.replace(base, policy="orca")):
        assert copy.given_workload() == base.given_workload()
        assert build_config(copy).workload == build_config(base).workload
    n = len(make_trace(WorkloadSpec.from_dict(build_config(dataclasses.replace(base)).workload), blocks=False))
    assert n == len(make_trace(WorkloadSpec.from_dict(build_config(base).workload), blocks=False)) > 5000
    # a request count given with a duration stays, as before
    both = SimConfig(workload={"num_requests": 5000, "duration_s": 20.0})
    assert dataclasses.replace(both).workload["num_requests"] == 5000


def test_slo_set_after_the_summary_was_read_is_reported():
    r = llmsched.simulate(cost_model="paper", rate=5, num_requests=20)
    assert "goodput_share" not in r.summary
    r.slo = {"ttft_ms": 1e6}
    assert r.summary["goodput_share"] == 1.0
