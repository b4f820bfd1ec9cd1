"""Tests of llmsched.workload.network: the network data model, YAML parsing, validation
(one ConfigError line naming the place), the shipped examples and `scaled()`."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import one_line_error

from llmsched.core.errors import ConfigError
from llmsched.workload.arrivals import Deterministic, Gamma, Poisson, make_arrival_process
from llmsched.workload.lengths import Constant, Geometric
from llmsched.workload.network import (
    ROUTERS,
    Call,
    Delay,
    DelayLaw,
    Fork,
    JobType,
    Loop,
    NetworkSpec,
    ServerSpec,
    iter_calls,
    load_network,
    parse_delay_law,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "networks"
SHIPPED = ("tandem", "agent_dag", "fork_join", "rybko_stolyar", "cluster")

# The example of the issue: every kind of node.
BASE = yaml.safe_load("""
servers:
  s1: {policy: sarathi, b_max: 512, cost_model: paper, replicas: 1, router: jsq, priority: [A.3]}
  s2: {policy: sarathi, b_max: 512, cost_model: "paper:c=11.28,a=35.47,b0=128"}
jobs:
  A:
    arrival: {process: poisson, rate: 1.0}
    route:
      - call: {server: s1, prompt: const:100, output: const:10}
      - delay: exponential:0.5
      - fork:
          - [{call: {server: s2, prompt: geometric:200, output: geometric:50}}]
          - [{call: {server: s1, prompt: const:50, output: const:20, context: true}}]
      - loop: {repeat_prob: 0.3, body: [{call: {server: s2, prompt: const:10, output: const:5, context: true}}]}
num_jobs: 10000
seed: 0
""")


def spec_with(edit=None) -> dict:
    d = copy.deepcopy(BASE)
    if edit is not None:
        edit(d)
    return d


def error_of(d) -> str:
    with pytest.raises(ConfigError) as e:
        NetworkSpec.from_dict(d)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def route(d):
    return d["jobs"]["A"]["route"]


# ------------------------------------------------------------------------- the model
def test_parse_the_issue_example():
    net = NetworkSpec.from_dict(spec_with())
    assert list(net.servers) == ["s1", "s2"]
    s1 = net.servers["s1"]
    assert isinstance(s1, ServerSpec) and s1.name == "s1" and s1.replicas == 1 and s1.router == "jsq"
    assert s1.priority == ["A.3"]
    assert net.servers["s2"].cost_model == "paper:c=11.28,a=35.47,b0=128"
    (job,) = net.jobs
    assert isinstance(job, JobType) and job.name == "A"
    assert isinstance(job.arrival, Poisson) and job.arrival.rate == 1.0
    kinds = [type(n) for n in job.route]
    assert kinds == [Call, Delay, Fork, Loop]
    call = job.route[0]
    assert call.server == "s1" and call.prompt == Constant(100) and call.output == Constant(10)
    assert call.context is False and call.cls == "A.1"
    assert job.route[1].law == DelayLaw("exponential", 0.5)
    fork = job.route[2]
    assert len(fork.branches) == 2 and fork.branches[0][0].prompt == Geometric(200)
    assert fork.branches[1][0].context is True
    loop = job.route[3]
    assert loop.repeat_prob == 0.3 and loop.times is None and loop.body[0].cls == "A.4"
    assert net.num_jobs == 10000 and net.duration_s is None and net.seed == 0
    assert net.call_classes() == ["A.1", "A.2", "A.3", "A.4"]
    assert [c.cls for c in iter_calls(job.route)] == ["A.1", "A.2", "A.3", "A.4"]
    assert net.class_servers() == {"A.1": {"s1"}, "A.2": {"s2"}, "A.3": {"s1"}, "A.4": {"s2"}}


def test_server_defaults_and_scheduler_fields():
    d = spec_with(lambda d: d["servers"].update(s3={}))
    s3 = NetworkSpec.from_dict(d).servers["s3"]
    assert (s3.policy, s3.admission, s3.b_max, s3.k_max, s3.kv_capacity, s3.max_running) == (
        "sarathi",
        "fcfs",
        512,
        None,
        None,
        None,
    )
    assert (s3.cost_model, s3.replicas, s3.router, s3.router_options, s3.priority) == ("paper", 1, "jsq", {}, [])
    s = ServerSpec(
        "x",
        policy="orca",
        b_max=256,
        k_max=16,
        kv_capacity=4096,
        max_running=8,
        policy_options={"a": 1},
        admission="spf",
    ).validate()
    assert s.scheduler_fields() == {
        "policy": "orca",
        "admission": "spf",
        "b_max": 256,
        "k_max": 16,
        "kv_capacity": 4096,
        "max_running": 8,
        "policy_options": {"a": 1},
        "admission_options": {},
    }


def test_explicit_class_names_and_shared_classes():
    def edit(d):
        route(d)[0]["call"]["class"] = "plan"
        route(d)[3]["loop"]["body"][0]["call"]["class"] = "plan"  # a class may span servers
        d["servers"]["s1"]["priority"] = ["plan"]

    net = NetworkSpec.from_dict(spec_with(edit))
    assert net.call_classes() == ["plan", "A.2", "A.3"]
    assert net.class_servers()["plan"] == {"s1", "s2"}


def test_arrival_processes():
    def edit(d):
        d["jobs"]["B"] = {
            "arrival": {"process": "gamma", "rate": 2, "cv": 3},
            "route": [{"call": {"server": "s1", "prompt": 10, "output": 2}}],
        }
        d["jobs"]["C"] = {
            "arrival": {"process": "deterministic", "rate": 0.5},
            "route": {"call": {"server": "s2", "prompt": 10, "output": 2}},
        }  # one node

    net = NetworkSpec.from_dict(spec_with(edit))
    a, b, c = (j.arrival for j in net.jobs)
    assert isinstance(a, Poisson)
    assert isinstance(b, Gamma) and b.rate == 2 and b.cv == 3
    assert isinstance(c, Deterministic) and c.rate == 0.5
    assert net.job("C").calls()[0].cls == "C.1"


def test_fork_branch_written_as_one_node_and_fork_mapping_form():
    def edit(d):
        route(d)[2] = {
            "fork": {
                "branches": [
                    {"call": {"server": "s2", "prompt": 5, "output": 1}},
                    [{"delay": 1}, {"call": {"server": "s1", "prompt": 5, "output": 1}}],
                ]
            }
        }

    fork = NetworkSpec.from_dict(spec_with(edit)).jobs[0].route[2]
    assert [len(b) for b in fork.branches] == [1, 2]
    assert fork.branches[1][0].law == DelayLaw("const", 1.0)


def test_loop_times_and_nested():
    def edit(d):
        route(d)[3] = {
            "loop": {
                "times": 3,
                "body": [
                    {"call": {"server": "s1", "prompt": 5, "output": 2}},
                    {"loop": {"repeat_prob": 0.5, "body": [{"call": {"server": "s2", "prompt": 5, "output": 2}}]}},
                ],
            }
        }

    loop = NetworkSpec.from_dict(spec_with(edit)).jobs[0].route[3]
    assert loop.times == 3 and loop.repeat_prob is None
    assert isinstance(loop.body[1], Loop) and loop.body[1].repeat_prob == 0.5


def test_python_construction_validates_and_names_classes():
    servers = {"g": ServerSpec("g", replicas=4, router="power-of-two", router_options={"d": 3})}
    job = JobType(
        "chat",
        Poisson(2.0),
        [
            Call("g", "geometric:100", 20),
            Delay("const:1"),
            Loop([Call("g", Constant(5), Constant(5), context=True)], times=2),
        ],
    )
    net = NetworkSpec(servers, [job], num_jobs=100)
    assert net.call_classes() == ["chat.1", "chat.2"]
    assert job.route[0].prompt == Geometric(100) and job.route[0].output == Constant(20)
    assert job.route[1].law == DelayLaw("const", 1.0)
    with pytest.raises(ConfigError, match=r"^jobs\.chat\.route\[0\]\.call: unknown server 'h'"):
        NetworkSpec(servers, [JobType("chat", Poisson(1.0), [Call("h", Constant(1), Constant(1))])])
    with pytest.raises(ConfigError, match=r"^jobs\.chat\.route\[0\]\.loop: give exactly one of times"):
        NetworkSpec(servers, [JobType("chat", Poisson(1.0), [Loop([Call("g", Constant(1), Constant(1))])])])


def test_routers_and_options():
    for r in ROUTERS:
        s = ServerSpec("x", replicas=3, router=r).validate()
        assert s.router == r
    s = ServerSpec("x", replicas=3, router="random", router_options={"weights": [1, 0, 3]}).validate()
    assert s.routing_weights() == [0.25, 0.0, 0.75]
    assert ServerSpec("x", replicas=4, router="jsq").validate().routing_weights() == [0.25] * 4
    assert ServerSpec("x", replicas=2, router="round_robin").validate().router == "round-robin"


# ------------------------------------------------------------------------- delay laws
def test_delay_laws():
    assert parse_delay_law("const:0.5") == DelayLaw("const", 0.5)
    assert parse_delay_law(2) == DelayLaw("const", 2.0)
    assert parse_delay_law("0") == DelayLaw("const", 0.0)
    e = parse_delay_law("exponential:2")
    u = parse_delay_law("uniform:1,3")
    assert (e.expected(), u.expected(), u.lo, u.hi) == (2.0, 2.0, 1.0, 3.0)
    rng = np.random.default_rng(0)
    x = e.sample(rng, 200_000)
    assert abs(x.mean() - 2.0) < 0.03
    y = u.sample(rng, 100_000)
    assert y.min() >= 1.0 and y.max() <= 3.0 and abs(y.mean() - 2.0) < 0.02
    assert np.all(parse_delay_law("const:0.25").sample(rng, 3) == 0.25)
    for s in ("const:0.5", "exponential:2", "uniform:1,3"):
        assert parse_delay_law(parse_delay_law(s).to_str()) == parse_delay_law(s)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("exponential:-1", "mean must be > 0"),
        ("exponential:0", "mean must be > 0"),
        ("const:-1", ">= 0"),
        ("uniform:3,1", "0 <= lo <= hi"),
        ("uniform:1", "two values"),
        ("gauss:1", "unknown delay law"),
        ("expnential:1", "did you mean 'exponential'"),
        ("const:abc", "must be a number"),
        ("const:nan", "finite"),
        (None, "delay must be a law"),
        # delays no clock holds (they crashed the simulator past its time sentinel)
        ("const:1e30", "const delay must be at most 1e+09 seconds"),
        (1e30, "const delay must be at most 1e+09 seconds"),
        ("exponential:1e30", "exponential delay must be at most 1e+09 seconds"),
        ("uniform:0,1e30", "uniform delay hi must be at most 1e+09 seconds"),
        ("per_token:1e30", "per_token delay must be at most 1 seconds per token"),
        ("per_token:-1", "per_token delay must be >= 0"),
    ],
)
def test_bad_delay_laws(bad, words):
    msg = error_of(spec_with(lambda d: route(d).__setitem__(1, {"delay": bad})))
    assert msg.startswith("jobs.A.route[1].delay: "), msg
    assert words in msg, msg


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "edit, where, words",
    [
        # unknown servers
        (
            lambda d: route(d)[0]["call"].update(server="s11"),
            "jobs.A.route[0].call",
            "unknown server 's11' (did you mean 's1'?); servers: s1, s2",
        ),
        (
            lambda d: route(d)[2]["fork"][0][0]["call"].update(server="gpu"),
            "jobs.A.route[2].fork[0][0].call",
            "unknown server 'gpu'",
        ),
        # unknown keys, with suggestions
        (lambda d: d.update(sever=1), "", "unknown key 'sever' in the network's top level (did you mean 'servers'?)"),
        (
            lambda d: d["servers"]["s1"].update(polcy="orca"),
            "servers.s1",
            "unknown key 'polcy' in server 's1' (did you mean 'policy'?)",
        ),
        (
            lambda d: route(d)[0]["call"].update(promt=5),
            "jobs.A.route[0].call",
            "unknown key 'promt' in a call (did you mean 'prompt'?)",
        ),
        (
            lambda d: d["jobs"]["A"].update(rout=[]),
            "jobs.A",
            "unknown key 'rout' in job type 'A' (did you mean 'route'?)",
        ),
        (lambda d: d["jobs"]["A"]["arrival"].update(rte=1), "jobs.A.arrival", "(did you mean 'rate'?)"),
        (
            lambda d: route(d)[3]["loop"].update(repeat=0.1),
            "jobs.A.route[3].loop",
            "unknown key 'repeat' in a loop (did you mean 'repeat_prob'?)",
        ),
        (
            lambda d: route(d).__setitem__(1, {"dealy": 1}),
            "jobs.A.route[1]",
            "unknown node 'dealy' (did you mean 'delay'?)",
        ),
        (lambda d: route(d).__setitem__(1, {"delay": 1, "call": {}}), "jobs.A.route[1]", "mapping with one key"),
        # loops
        (lambda d: route(d)[3]["loop"].pop("repeat_prob"), "jobs.A.route[3].loop", "give exactly one of times"),
        (lambda d: route(d)[3]["loop"].update(times=2), "jobs.A.route[3].loop", "give exactly one of times"),
        (
            lambda d: route(d)[3]["loop"].update(repeat_prob=1.0),
            "jobs.A.route[3].loop",
            "repeat_prob must be in [0, 1), got 1 (a cycle without exit",
        ),
        (lambda d: route(d)[3]["loop"].update(repeat_prob=1.5), "jobs.A.route[3].loop", "a cycle without exit"),
        (
            lambda d: route(d)[3]["loop"].update(repeat_prob=-0.1),
            "jobs.A.route[3].loop",
            "repeat_prob must be in [0, 1), got -0.1",
        ),
        (lambda d: route(d)[3]["loop"].update(repeat_prob="x"), "jobs.A.route[3].loop", "repeat_prob must be a number"),
        (
            lambda d: route(d)[3].update(loop={"times": 0, "body": [{"delay": 1}]}),
            "jobs.A.route[3].loop",
            "times must be a whole number >= 1",
        ),
        (
            lambda d: route(d)[3].update(loop={"times": 2.5, "body": [{"delay": 1}]}),
            "jobs.A.route[3].loop",
            "times must be a whole number",
        ),
        (lambda d: route(d)[3]["loop"].update(body=[]), "jobs.A.route[3].loop", "the loop body is empty"),
        (
            lambda d: route(d)[3]["loop"]["body"][0]["call"].update(server="zz"),
            "jobs.A.route[3].loop.body[0].call",
            "unknown server 'zz'",
        ),
        # routers, weights, replicas
        (
            lambda d: d["servers"]["s1"].update(router="jsqq"),
            "servers.s1",
            "unknown router 'jsqq' (did you mean 'jsq'?)",
        ),
        (lambda d: d["servers"]["s1"].update(replicas=0), "servers.s1", "replicas must be a whole number >= 1, got 0"),
        (lambda d: d["servers"]["s1"].update(replicas=-2), "servers.s1", "replicas must be a whole number >= 1"),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"weights": [1, 2, 3]}),
            "servers.s1.router_options",
            "weights must have one entry per replica (2), got 3",
        ),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"weights": [1, -2]}),
            "servers.s1.router_options",
            "weights must be >= 0",
        ),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"weights": [0, 0]}),
            "servers.s1.router_options",
            "weights are all zero",
        ),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"weights": "1,1"}),
            "servers.s1.router_options",
            "weights must be a list",
        ),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"wieghts": [1, 1]}),
            "servers.s1.router_options",
            "unknown option 'wieghts' for router random (did you mean 'weights'?)",
        ),
        (
            lambda d: d["servers"]["s1"].update(router_options={"d": 2}),
            "servers.s1.router_options",
            "router jsq takes no options",
        ),
        (
            lambda d: d["servers"]["s1"].update(router="power-of-two", router_options={"d": 0}),
            "servers.s1.router_options",
            "d (replicas sampled by power-of-two) must be a whole number >= 1",
        ),
        # other server fields
        (lambda d: d["servers"]["s1"].update(b_max=0), "servers.s1", "b_max must be a whole number >= 1"),
        (lambda d: d["servers"]["s1"].update(b_max=1 << 21), "servers.s1", "b_max must be at most 1,048,576"),
        (lambda d: d["servers"]["s1"].update(k_max="many"), "servers.s1", "k_max must be a whole number"),
        (lambda d: d["servers"]["s1"].update(cost_model="papr"), "servers.s1.cost_model", "unknown cost model 'papr'"),
        (lambda d: d["servers"]["s1"].update(cost_model="paper:c=-1"), "servers.s1.cost_model", "c >= 0"),
        (lambda d: d["servers"]["s1"].update(policy=""), "servers.s1", "policy must be a non-empty string"),
        (lambda d: d["servers"]["s1"].update(policy_options=[1]), "servers.s1", "policy_options must be a mapping"),
        (lambda d: d["servers"].update(s1=[1]), "servers.s1", "server 's1' must be a mapping"),
        # priorities
        (lambda d: d["servers"]["s1"].update(priority=["A.9"]), "servers.s1.priority", "unknown call class 'A.9'"),
        (lambda d: d["servers"]["s1"].update(priority=["A2"]), "servers.s1.priority", "(did you mean 'A.2'?)"),
        (
            lambda d: d["servers"]["s1"].update(priority=["A.2"]),
            "servers.s1.priority",
            "call class 'A.2' never visits server s1 (it runs on s2)",
        ),
        (lambda d: d["servers"]["s1"].update(priority=["A.1", "A.1"]), "servers.s1.priority", "listed twice"),
        (lambda d: d["servers"]["s1"].update(priority="A.1"), "servers.s1", "priority must be a list"),
        (
            # max-pressure serves one class at a time: the order was ignored without a word
            lambda d: (d["servers"]["s1"].update(priority=["A.1"]), d.update(control="backpressure")),
            "servers.s1.priority",
            "priorities do not apply under control: backpressure",
        ),
        # routes and forks
        (lambda d: d["jobs"]["A"].update(route=[]), "jobs.A.route", "the route is empty"),
        (lambda d: d["jobs"]["A"].update(route=None), "jobs.A", "missing 'route'"),
        (lambda d: d["jobs"]["A"].update(route=[{"delay": 1}]), "jobs.A.route", "the route has no call"),
        (lambda d: route(d)[2]["fork"].append([]), "jobs.A.route[2].fork[2]", "empty fork branch"),
        (lambda d: route(d).__setitem__(2, {"fork": []}), "jobs.A.route[2].fork", "non-empty list of branches"),
        (lambda d: route(d).__setitem__(2, {"fork": {"branch": []}}), "jobs.A.route[2].fork", "unknown key 'branch'"),
        # arrivals
        (lambda d: d["jobs"]["A"]["arrival"].update(rate=0), "jobs.A.arrival", "positive number"),
        (lambda d: d["jobs"]["A"]["arrival"].update(rate=-1), "jobs.A.arrival", "positive number"),
        (lambda d: d["jobs"]["A"]["arrival"].update(rate="fast"), "jobs.A.arrival", "must be a number"),
        (lambda d: d["jobs"]["A"]["arrival"].pop("rate"), "jobs.A.arrival", "missing 'rate'"),
        (
            lambda d: d["jobs"]["A"]["arrival"].update(process="weibull"),
            "jobs.A.arrival",
            "unknown arrival process 'weibull'",
        ),
        (lambda d: d["jobs"]["A"]["arrival"].update(cv=2), "jobs.A.arrival", "cv=2 applies to gamma arrivals only"),
        (lambda d: d["jobs"]["A"].pop("arrival"), "jobs.A", "missing 'arrival'"),
        # length laws and call fields
        (lambda d: route(d)[0]["call"].update(prompt="geometric:0"), "jobs.A.route[0].call.prompt", "geometric mean"),
        (
            lambda d: route(d)[0]["call"].update(output="foo:3"),
            "jobs.A.route[0].call.output",
            "unknown length law 'foo:3'",
        ),
        (lambda d: route(d)[0]["call"].update(prompt=0), "jobs.A.route[0].call.prompt", ">= 1"),
        (lambda d: route(d)[0]["call"].pop("output"), "jobs.A.route[0].call", "missing 'output'"),
        (lambda d: route(d)[0]["call"].update(context="yes"), "jobs.A.route[0].call", "context must be true or false"),
        # top level
        (lambda d: d.pop("servers"), "", "the network needs a 'servers' section"),
        (lambda d: d.update(jobs={}), "jobs", "at least one job type"),
        (lambda d: d.update(servers={}), "servers", "at least one server"),
        (lambda d: d.update(num_jobs=0), "num_jobs", "num_jobs must be a whole number >= 1"),
        (lambda d: d.update(duration_s=-5), "duration_s", "must be > 0"),
        (lambda d: d.update(seed=-1), "seed", "seed must be a whole number >= 0"),
        # values no simulation can hold (they hung or crashed with an overflow)
        (lambda d: d.update(duration_s=1e30), "duration_s", "must be at most 1e+09 seconds"),
        (lambda d: d["servers"]["s1"].update(replicas=1e30), "servers.s1", "replicas must be at most 4,096"),
        (lambda d: d["servers"]["s1"].update(replicas=10**30), "servers.s1", "replicas must be at most 4,096"),
        (lambda d: d["servers"]["s1"].update(k_max=10**30), "servers.s1", "k_max must be at most 1,048,576"),
        (lambda d: d["servers"]["s1"].update(max_running=1e30), "servers.s1", "max_running must be at most"),
        (lambda d: d["servers"]["s1"].update(kv_capacity=1e30), "servers.s1", "kv_capacity must be at most"),
        (lambda d: d["jobs"]["A"].update(system_prompt=1e30), "jobs.A", "system_prompt (tokens) must be at most"),
        (
            lambda d: route(d)[3]["loop"].update(repeat_prob=0.999999999),
            "jobs.A.route[3].loop",
            "repeat_prob must be at most 0.999999",
        ),
        (
            lambda d: d["jobs"]["A"].update(arrival={"process": "gamma", "rate": 1, "cv": 1e-300}),
            "jobs.A.arrival",
            "cv (coefficient of variation) must be between 0.001 and 1000",
        ),
        (
            lambda d: d["jobs"]["A"]["arrival"].update(cv=True),
            "jobs.A.arrival",
            "cv (coefficient of variation) must be a number, got True",
        ),
    ],
)
def test_validation_errors_name_the_place(edit, where, words):
    msg = error_of(spec_with(edit))
    if where:
        assert msg.startswith(where + ": "), msg
    assert words in msg, msg


@pytest.mark.parametrize(
    "arrival",
    [{"process": "trace:/x.csv", "rate": 1}, {"process": "azure-conv"}, {"process": "weibull", "rate": 1}],
)
def test_an_arrival_error_lists_only_what_a_job_type_takes(arrival):
    """A job type's arrival error listed trace:PATH and azure-conv as known while refusing
    them (a network replays no trace's arrival times)."""
    process = arrival["process"]
    msg = error_of(spec_with(lambda d: d["jobs"]["A"].update(arrival=arrival)))
    assert msg.startswith("jobs.A.arrival: ") and "poisson, gamma" in msg, msg
    assert "trace:PATH" not in msg and "known: poisson, gamma, deterministic, trace" not in msg, msg
    if process != "weibull":  # said before the missing rate, with where a trace replays
        assert "replay on one server only" in msg and "replay:PATH" in msg, msg


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        NetworkSpec.from_yaml(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("servers: {s1: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as e:
        NetworkSpec.from_yaml(bad)
    assert "\n" not in str(e.value)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="holds no settings"):
        NetworkSpec.from_yaml(empty)
    loop = tmp_path / "loop.yaml"
    d = spec_with(lambda d: route(d)[3]["loop"].update(repeat_prob=1))
    loop.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        NetworkSpec.from_yaml(loop)
    assert str(e.value).startswith("loop.yaml: jobs.A.route[3].loop: repeat_prob must be in [0, 1)")
    with pytest.raises(ConfigError, match="mapping"):
        NetworkSpec.from_dict([1, 2])


# ------------------------------------------------------------------------- examples
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_examples_parse_and_round_trip(name):
    net = NetworkSpec.from_yaml(EXAMPLES / f"{name}.yaml")
    assert net.num_jobs is not None and net.call_classes()
    again = NetworkSpec.from_dict(net.to_dict())
    assert again.to_dict() == net.to_dict()
    assert yaml.safe_load(yaml.safe_dump(net.to_dict())) == net.to_dict()
    assert load_network(str(EXAMPLES / f"{name}.yaml")).to_dict() == net.to_dict()


def test_example_shapes():
    rs = NetworkSpec.from_yaml(EXAMPLES / "rybko_stolyar.yaml")
    assert [j.name for j in rs.jobs] == ["A", "B"]
    assert [c.server for c in rs.job("A").calls()] == ["s1", "s2"]
    assert [c.server for c in rs.job("B").calls()] == ["s2", "s1"]
    # priority to the class that leaves the network through the server
    assert rs.servers["s1"].priority == ["B.2"] and rs.servers["s2"].priority == ["A.2"]
    cl = NetworkSpec.from_yaml(EXAMPLES / "cluster.yaml")
    (pool,) = cl.servers.values()
    assert pool.replicas == 8 and pool.router == "jsq"
    assert len(cl.jobs) == 1 and len(cl.jobs[0].calls()) == 1
    ag = NetworkSpec.from_yaml(EXAMPLES / "agent_dag.yaml")
    kinds = [type(n).__name__ for n in ag.jobs[0].route]
    assert kinds == ["Call", "Delay", "Fork", "Call"]
    assert all(c.context for c in ag.jobs[0].calls()[1:])
    assert len(ag.jobs[0].route[2].branches) == 2


# ------------------------------------------------------------------------- scaled
def test_scaled_multiplies_every_rate():
    def edit(d):
        d["jobs"]["B"] = {
            "arrival": {"process": "gamma", "rate": 2, "cv": 3},
            "route": [{"call": {"server": "s1", "prompt": 10, "output": 2}}],
        }
        d["jobs"]["C"] = {
            "arrival": {"process": "deterministic", "rate": 0.5},
            "route": [{"call": {"server": "s2", "prompt": 10, "output": 2}}],
        }

    net = NetworkSpec.from_dict(spec_with(edit))
    half = net.scaled(0.5)
    assert [j.arrival.rate for j in half.jobs] == [0.5, 1.0, 0.25]
    assert half.job("B").arrival.cv == 3 and isinstance(half.job("C").arrival, Deterministic)
    assert [j.arrival.rate for j in net.jobs] == [1.0, 2.0, 0.5]  # the original is unchanged
    assert half.call_classes() == net.call_classes()
    assert half.num_jobs == net.num_jobs and half.seed == net.seed
    for bad in (0, -1, float("nan"), "x"):
        with pytest.raises(ConfigError, match="scale factor"):
            net.scaled(bad)


def test_the_documented_example_parses():
    text = (Path(__file__).resolve().parents[1] / "docs" / "networks.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    net = NetworkSpec.from_dict(yaml.safe_load(block))
    assert net.to_dict() == NetworkSpec.from_dict(spec_with()).to_dict()


# ------------------------------------------------------------------ numbers, nulls, routers
@pytest.mark.parametrize(
    ("edit", "where", "key"),
    [
        (lambda d: route(d)[3]["loop"].update(repeat_prob="0.5"), "jobs.A.route[3].loop", "repeat_prob"),
        (lambda d: route(d)[3].update(loop={"times": "2", "body": [{"delay": 1}]}), "jobs.A.route[3].loop", "times"),
        (lambda d: d["jobs"]["A"]["arrival"].update(rate="1.0"), "jobs.A.arrival", "arrival rate"),
        (lambda d: d["jobs"]["A"]["arrival"].update(process="gamma", cv="2"), "jobs.A.arrival", "cv"),
        (lambda d: d["jobs"]["A"].update(system_prompt="100"), "jobs.A", "system_prompt"),
        (lambda d: d["servers"]["s1"].update(b_max="512"), "servers.s1", "b_max"),
        (lambda d: d["servers"]["s1"].update(kv_capacity="1e5"), "servers.s1", "kv_capacity"),
        (lambda d: d["servers"]["s1"].update(replicas="2"), "servers.s1", "replicas"),
        (lambda d: d["servers"]["s1"].update(prefix_caching=True, block_size="16"), "servers.s1", "block_size"),
        (
            lambda d: d["servers"]["s1"].update(replicas=2, router="random", router_options={"weights": ["1", 1]}),
            "servers.s1.router_options",
            "weight",
        ),
        (
            lambda d: d["servers"]["s1"].update(replicas=4, router="power-of-two", router_options={"d": "2"}),
            "servers.s1.router_options",
            "d (replicas sampled",
        ),
        (lambda d: d.update(num_jobs="100"), "num_jobs", "num_jobs"),
        (lambda d: d.update(duration_s="60"), "duration_s", "duration_s"),
        (lambda d: d.update(seed="3"), "seed", "seed"),
    ],
)
def test_a_number_in_quotes_is_refused_naming_its_key(edit, where, key):
    # every number of the file is read alike: a string that reads as a number was taken
    # (`repeat_prob: "0.5"` ran with 0.5) while one server's Python API refused it
    msg = error_of(spec_with(edit))
    assert msg.startswith(where + ": ") and key in msg, msg
    assert "a number in quotes" in msg, msg


def test_length_and_delay_laws_are_text_and_take_a_bare_number_in_quotes():
    def edit(d):
        route(d)[0]["call"].update(prompt="100", output="10")
        route(d)[1] = {"delay": "0.5"}

    net = NetworkSpec.from_dict(spec_with(edit))
    assert net.jobs[0].route[0].prompt == Constant(100) and net.jobs[0].route[1].law == DelayLaw("const", 0.5)


def test_a_network_file_reads_plain_exponents_as_numbers_and_refuses_quoted_ones(tmp_path):
    # PyYAML's YAML 1.1 rule reads `1e3` as a string: refusing strings must not refuse it
    text = yaml.safe_dump(spec_with()).replace("num_jobs: 10000", "num_jobs: 1e4")
    text = text.replace("rate: 1.0", "rate: 5e-1")
    f = tmp_path / "net.yaml"
    f.write_text(text + "duration_s: 1e3\n")
    net = NetworkSpec.from_yaml(f)
    assert (net.num_jobs, net.duration_s, net.jobs[0].arrival.rate) == (10000, 1000.0, 0.5)
    f.write_text(text.replace("repeat_prob: 0.3", "repeat_prob: '0.3'"))
    with pytest.raises(
        ConfigError, match=r"^net.yaml: jobs\.A\.route\[3\]\.loop: repeat_prob must be a number, got '0.3'"
    ):
        NetworkSpec.from_yaml(f)


def test_the_command_line_refuses_a_quoted_number_in_one_line(tmp_path, capsys):
    f = tmp_path / "net.yaml"
    f.write_text(yaml.safe_dump(spec_with(lambda d: route(d)[3]["loop"].update(repeat_prob="0.5"))))
    for argv in (["capacity", "--network", str(f)], ["simulate", "--network", str(f), "--out", ""]):
        one_line_error(capsys, argv, "jobs.A.route[3].loop: repeat_prob must be a number, got '0.5'")


def test_gamma_arrivals_without_cv_have_cv_1_as_on_one_server():
    net = NetworkSpec.from_dict(spec_with(lambda d: d["jobs"]["A"]["arrival"].update(process="gamma")))
    assert net.jobs[0].arrival == Gamma(1.0, 1.0) == make_arrival_process("gamma", 1.0)
    assert net.to_dict()["jobs"]["A"]["arrival"] == {"process": "gamma", "rate": 1.0, "cv": 1.0}


@pytest.mark.parametrize(
    ("edit", "where", "words"),
    [
        (lambda d: d["servers"].update(s3=None), "servers.s3", "server 's3' is empty (null)"),
        (lambda d: d["servers"]["s1"].update(router_options=None), "servers.s1", "router_options must be a mapping"),
        (lambda d: d["servers"]["s1"].update(policy_options=None), "servers.s1", "policy_options must be a mapping"),
        (
            lambda d: d["servers"]["s1"].update(admission_options=None),
            "servers.s1",
            "admission_options must be a mapping",
        ),
        (lambda d: d["jobs"].update(B=None), "jobs.B", "job type 'B' must be a mapping, got None"),
        (lambda d: d["jobs"]["A"].update(arrival=None), "jobs.A.arrival", "arrival must be a mapping, got None"),
        (lambda d: route(d)[3].update(loop=None), "jobs.A.route[3].loop", "a loop must be a mapping, got None"),
        (lambda d: route(d)[0].update(call=None), "jobs.A.route[0].call", "a call must be a mapping, got None"),
    ],
)
def test_a_null_where_a_mapping_belongs_is_refused(edit, where, words):
    # `s3:` with nothing after it was a server with every default: its settings lost to a
    # wrong indentation ran silently (and `router_options: null` was {} here but refused on
    # one server, as `policy_options: null` is)
    msg = error_of(spec_with(edit))
    assert msg.startswith(where + ": ") and words in msg, msg
    assert NetworkSpec.from_dict(spec_with(lambda d: d["servers"].update(s3={}))).servers["s3"].b_max == 512


def test_power_of_d_refuses_more_samples_than_replicas():
    def pot(replicas, **opts):
        return lambda d: d["servers"]["s1"].update(replicas=replicas, router="power-of-two", router_options=opts)

    msg = error_of(spec_with(pot(2, d=3)))
    assert msg == (
        "servers.s1.router_options: d (replicas sampled by power-of-two) must be at most the server's replicas (2), "
        "got 3"
    )
    assert NetworkSpec.from_dict(spec_with(pot(3, d=3))).servers["s1"].router_options == {"d": 3}
    assert NetworkSpec.from_dict(spec_with(pot(1))).servers["s1"].router_options == {}  # the default d = 2


def test_seeds_are_kept_exactly_however_large():
    # a seed past 2**53 went through a float: 2**53 + 1 ran as 2**53
    for seed in (2**53 + 1, 2**64 + 3, 10**30 + 1):
        assert NetworkSpec.from_dict(spec_with(lambda d, s=seed: d.update(seed=s))).seed == seed
        assert NetworkSpec.from_dict(spec_with()).with_run(seed=seed).seed == seed


def test_a_float_seed_past_2_53_is_refused_in_the_file_and_the_api(tmp_path, capsys):
    """`seed: 1e308` (a float in YAML) ran as a 309-digit seed that no one wrote, where
    `--seed 1e308` is refused; below 2**53 a whole float is exactly its integer."""
    msg = "seed must be a whole number >= 0 written as an integer, got 1e+308"
    assert error_of(spec_with(lambda d: d.update(seed=1e308))).startswith("seed: " + msg)
    assert error_of(spec_with(lambda d: d.update(seed=float(2**53)))).startswith("seed: seed must be")
    with pytest.raises(ConfigError, match="^" + re.escape(msg)):
        NetworkSpec.from_dict(spec_with()).with_run(seed=1e308)
    assert NetworkSpec.from_dict(spec_with(lambda d: d.update(seed=float(2**53 - 1)))).seed == 2**53 - 1
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump(spec_with(lambda d: d.update(seed=0))).replace("seed: 0", "seed: 1e308"))
    with pytest.raises(ConfigError, match="^n.yaml: seed: " + re.escape(msg)):
        NetworkSpec.from_yaml(path)


def test_an_explicit_class_name_that_is_another_calls_default_name_is_refused(capsys, tmp_path):
    # call 1 is named "A.2", call 2 (no class) would get the default "A.2": one class on two
    # servers, merged unseen in priorities, the report and back-pressure's successors
    d = {
        "servers": {"s1": {}, "s2": {}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {"call": {"server": "s1", "prompt": "const:10", "output": "const:1", "class": "A.2"}},
                    {"call": {"server": "s2", "prompt": "const:10", "output": "const:1"}},
                ],
            }
        },
        "num_jobs": 10,
    }
    with pytest.raises(ConfigError, match=r"jobs\.A\.route: call 2 \(on s2\).*'A\.2'.*call 1 of job A \(on s1\)"):
        NetworkSpec.from_dict(copy.deepcopy(d))
    other = copy.deepcopy(d)  # another job type's explicit name collides just the same
    other["jobs"]["B"] = copy.deepcopy(other["jobs"]["A"])
    other["jobs"]["A"]["route"][0]["call"].pop("class")
    with pytest.raises(ConfigError, match="call 1 of job B"):
        NetworkSpec.from_dict(other)
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(d))
    one_line_error(capsys, ["simulate", "--network", str(path), "--out", ""], "A.2", "call 2", "merge")
    # naming the second call too, or a call's own default name, is fine; validating again keeps the names
    named = copy.deepcopy(d)
    named["jobs"]["A"]["route"][1]["call"]["class"] = "A.1"
    net = NetworkSpec.from_dict(named)
    assert [c.cls for c in net.jobs[0].calls()] == ["A.2", "A.1"]
    own = copy.deepcopy(d)
    own["jobs"]["A"]["route"][0]["call"]["class"] = "A.1"
    net = NetworkSpec.from_dict(own)
    net.validate()
    assert [c.cls for c in net.jobs[0].calls()] == ["A.1", "A.2"]


@pytest.mark.parametrize("name", ["../../victim", "..", ".", "a/b", "a\\b", "s[1]"])
def test_a_server_name_that_is_no_folder_name_is_refused(capsys, tmp_path, name):
    """A server's name names its folder under servers/: '../../victim' wrote (and cleared
    an earlier run's files) outside --out, '..' ended in a traceback after deleting the
    run's calls.csv, and 's[1]' merged its requests.csv with replica 1 of a server 's'."""
    d = {
        "servers": {name: {}, "s": {"replicas": 2}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {"call": {"server": name, "prompt": "const:10", "output": "const:2"}},
                    {"call": {"server": "s", "prompt": "const:10", "output": "const:2"}},
                ],
            }
        },
        "num_jobs": 5,
    }
    with pytest.raises(ConfigError, match="server name"):
        NetworkSpec.from_dict(copy.deepcopy(d))
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(d))
    out = tmp_path / "sub" / "out"
    one_line_error(capsys, ["simulate", "--network", str(path), "--out", str(out)], "server name")
    assert not out.exists() and not (tmp_path / "victim").exists()
    d["servers"]["s[x]"] = d["servers"].pop(name)  # brackets without a replica number are fine
    for call in d["jobs"]["A"]["route"]:
        call["call"]["server"] = "s[x]" if call["call"]["server"] == name else "s"
    assert NetworkSpec.from_dict(d).servers["s[x]"].name == "s[x]"
