"""Deeply nested and self-referring routes: back-pressure's successors in linear time (a
loop's body was walked twice, so each level of nesting doubled the time of every network
run), and one-line errors for a route that refers to itself (a YAML alias inside its own
anchor recursed forever), a route nested past MAX_ROUTE_NESTING and a YAML file nested
past what PyYAML can read (both were RecursionError tracebacks)."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from helpers import one_line_error

from llmsched.core.errors import ConfigError
from llmsched.sim.network import run_network, successors
from llmsched.workload.arrivals import Poisson
from llmsched.workload.lengths import Constant
from llmsched.workload.network import MAX_ROUTE_NESTING, Call, JobType, Loop, NetworkSpec, ServerSpec

CALL = {"server": "s", "prompt": "const:10", "output": "const:5"}


def _call(cls: str) -> dict:
    return {"call": {**CALL, "class": cls}}


def _nested(depth: int, control: str = "none") -> dict:
    """A network whose one call sits inside `depth` loops of one pass each."""
    node = {"call": dict(CALL)}
    for _ in range(depth):
        node = {"loop": {"times": 1, "body": [node]}}
    return {
        "servers": {"s": {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}},
        "jobs": {"A": {"arrival": {"process": "poisson", "rate": 1.0}, "route": [node]}},
        "num_jobs": 3,
        "control": control,
    }


def test_successors_of_nested_loops_are_the_hand_sets():
    d = _nested(0)
    d["jobs"]["A"]["route"] = [
        _call("a"),
        {
            "loop": {
                "times": 2,
                "body": [
                    _call("b"),
                    {"loop": {"times": 3, "body": [{"delay": "const:0.1"}, _call("c")]}},
                    {"delay": "const:0.1"},
                ],
            }
        },
        _call("d"),
    ]
    # a loop whose body makes no call: what follows it comes right after the call before it
    d["jobs"]["B"] = {
        "arrival": {"process": "poisson", "rate": 1.0},
        "route": [
            {"loop": {"times": 2, "body": [_call("e"), {"loop": {"times": 2, "body": [{"delay": "const:0.1"}]}}]}},
            _call("f"),
        ],
    }
    spec = NetworkSpec.from_dict(d)
    assert successors(spec) == {
        "a": {"b"},
        "b": {"c"},
        "c": {"c", "b", "d"},  # the inner loop again, the outer loop's next pass, or on
        "d": set(),
        "e": {"e", "f"},
        "f": set(),
    }


def test_successors_skip_a_fork_branch_without_calls():
    """The join waits for every branch: after a fork whose other branch only waits, the
    next call follows the branch's call, never the call before the fork (back-pressure
    weighed `a` against `c`'s queue, which `a` does not feed), and a loop over such a fork
    starts with the fork's call."""
    d = _nested(0)
    tool = [{"delay": "const:0.1"}]
    d["jobs"]["A"]["route"] = [_call("a"), {"fork": [[_call("b")], tool]}, _call("c")]
    d["jobs"]["B"] = {
        "arrival": {"process": "poisson", "rate": 1.0},
        "route": [{"loop": {"times": 2, "body": [{"fork": [[_call("e")], tool]}, _call("f")]}}],
    }
    assert successors(NetworkSpec.from_dict(d)) == {"a": {"b"}, "b": {"c"}, "c": set(), "e": {"f"}, "f": {"e"}}


@pytest.mark.timeout(60)
def test_successors_take_linear_time_in_the_nesting():
    # depth 22 took 3 s (2**22 walks of the call), depth 50 never ended
    spec = NetworkSpec.from_dict(_nested(60))
    t = time.perf_counter()
    assert successors(spec) == {"A.1": {"A.1"}}  # as before: any loop may repeat, even times: 1
    assert time.perf_counter() - t < 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("control", ["none", "backpressure"])
def test_a_network_nested_60_deep_runs_in_well_under_a_second(control, tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text(json.dumps(_nested(60, control)))  # JSON is YAML in flow style
    spec = NetworkSpec.from_yaml(path)
    t = time.perf_counter()
    stats = run_network(spec)
    assert time.perf_counter() - t < 1.0
    assert len(stats.call_arrival) == 3
    from llmsched.cli import main  # noqa: PLC0415

    assert main(["simulate", "--network", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0


RECURSIVE = """
servers:
  s: {policy: sarathi, b_max: 512, cost_model: paper}
jobs:
  A:
    arrival: {process: poisson, rate: 1}
    route: &r
      - call: {server: s, prompt: const:10, output: const:5}
      - loop: {times: 2, body: *r}
num_jobs: 3
"""

# the loop's node mapping inside its own body, and a fork's inside a branch
SELF_NODE = RECURSIVE.replace(
    """    route: &r
      - call: {server: s, prompt: const:10, output: const:5}
      - loop: {times: 2, body: *r}""",
    """    route:
      - call: {server: s, prompt: const:10, output: const:5}
      - &n {loop: {times: 2, body: [{call: {server: s, prompt: const:1, output: const:1}}, *n]}}""",
)
SELF_FORK = RECURSIVE.replace(
    """    route: &r
      - call: {server: s, prompt: const:10, output: const:5}
      - loop: {times: 2, body: *r}""",
    """    route:
      - call: {server: s, prompt: const:10, output: const:5}
      - &f {fork: [[{call: {server: s, prompt: const:1, output: const:1}}], *f]}""",
)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (RECURSIVE, "jobs.A.route[1].loop.body[1]"),
        (SELF_NODE, "jobs.A.route[1].loop.body[1]"),
        (SELF_FORK, "jobs.A.route[1].fork[1][0]"),
    ],
)
def test_a_route_that_refers_to_itself_is_one_line(text, where, tmp_path, capsys):
    path = tmp_path / "net.yaml"
    path.write_text(text)
    for argv in (["simulate", "--network", str(path), "--out", ""], ["capacity", "--network", str(path)]):
        one_line_error(capsys, argv, f"net.yaml: {where}: the route refers to itself")
    with pytest.raises(ConfigError, match="refers to itself"):
        NetworkSpec.from_dict(yaml.safe_load(text))


def test_a_route_built_in_python_that_contains_itself_is_refused():
    call = Call(server="s", prompt=Constant(10), output=Constant(5))
    loop = Loop(body=[call], times=2)
    loop.body.append(loop)
    job = JobType(name="A", arrival=Poisson(1.0), route=[loop])
    with pytest.raises(ConfigError, match=r"jobs\.A\.route\[0\]\.loop\.body\[1\]: the route refers to itself"):
        NetworkSpec(servers={"s": ServerSpec(name="s")}, jobs=[job], num_jobs=3)


def test_routes_nest_at_most_max_route_nesting(tmp_path, capsys):
    NetworkSpec.from_dict(_nested(MAX_ROUTE_NESTING))
    msg = f"jobs.A.route[0]: forks and loops nest more than {MAX_ROUTE_NESTING} deep"
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        NetworkSpec.from_dict(_nested(MAX_ROUTE_NESTING + 1))
    # a mapping deeper than Python's recursion limit: the same error, no RecursionError
    with pytest.raises(ConfigError, match="nest more than"):
        NetworkSpec.from_dict(_nested(2000))
    path = tmp_path / "deep.yaml"
    path.write_text(json.dumps(_nested(MAX_ROUTE_NESTING + 1)))
    one_line_error(capsys, ["simulate", "--network", str(path), "--out", ""], f"deep.yaml: {msg}")


def test_a_yaml_file_nested_past_the_readers_limit_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    # PyYAML's composer recursed past Python's limit from ~165 loops (flow or block style)
    route = "{loop: {times: 1, body: [" * 400 + "{call: {server: s, prompt: const:1, output: const:1}}" + "]}}" * 400
    path.write_text(f"servers: {{s: {{}}}}\njobs: {{A: {{arrival: {{rate: 1}}, route: [{route}]}}}}\nnum_jobs: 3\n")
    for argv in (["simulate", "--network", str(path), "--out", ""], ["capacity", "--network", str(path)]):
        one_line_error(capsys, argv, f"network file '{path}' nests too deeply")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("a: " + "[" * 2000 + "]" * 2000)
    one_line_error(capsys, ["simulate", "--config", str(cfg), "--out", ""], "config file", "nests too deeply")


def test_a_route_unfolding_past_max_route_nodes_is_refused(capsys, tmp_path):
    """Aliases used ten times a level, seven levels deep: a 2 KB file unfolds into ten
    million nodes, and parsing it never finished."""
    from llmsched.workload.network import MAX_ROUTE_NODES

    call = "{call: {server: s, prompt: 'const:10', output: 'const:2'}}"

    def level(i: int) -> str:
        if i == 0:
            return f"&l0 [{call}]"
        loop = "{loop: {times: 1, body: BODY}}"
        first = loop.replace("BODY", level(i - 1))
        return f"&l{i} [{', '.join([first] + [loop.replace('BODY', f'*l{i - 1}')] * 9)}]"

    path = tmp_path / "laughs.yaml"
    path.write_text(f"servers: {{s: {{}}}}\njobs: {{A: {{arrival: {{rate: 1}}, route: {level(7)}}}}}\nnum_jobs: 3\n")
    t0 = time.perf_counter()
    one_line_error(capsys, ["simulate", "--network", str(path), "--out", ""], f"more than {MAX_ROUTE_NODES:,} nodes")
    one_line_error(capsys, ["capacity", "--network", str(path)], "nodes")
    assert time.perf_counter() - t0 < 30
    path.write_text(f"servers: {{s: {{}}}}\njobs: {{A: {{arrival: {{rate: 1}}, route: {level(3)}}}}}\nnum_jobs: 3\n")
    assert len(NetworkSpec.from_yaml(path).jobs[0].calls()) == 1000  # 10 ** 3 calls: fine
