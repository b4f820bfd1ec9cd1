"""Bugs found by the network bug hunt (report-only): each test fails on the current code."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmsched
from llmsched.core.errors import ConfigError
from llmsched.theory.network import traffic
from llmsched.workload.network import NetworkSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "networks"


def test_a_caching_server_over_its_prompt_token_capacity_is_not_declared_certainly_unstable():
    # agent_loop: the traffic equations count every prompt token (127.5% of capacity), but
    # prefix-cache hits save about 85% of the prefill and the run is stable; the report's
    # verdict says "every policy's backlog grows there" and stable=False
    spec = NetworkSpec.from_yaml(EXAMPLES / "agent_loop.yaml")
    spec.num_jobs = 800
    report = traffic(spec)
    run = llmsched.simulate_network(spec).summary
    assert run["servers"]["agent"]["utilisation_net_of_hits"] < 0.5
    assert run["verdict"] == "stable"
    assert report.stable is not False
    assert "every policy's backlog grows" not in report.verdict


def test_an_explicit_class_name_does_not_silently_merge_with_another_calls_default_name():
    # the first call is named "A.2"; the second call's default name is also "A.2", so two
    # calls on two servers become one class (one row per server in the report, one class
    # in priorities and back-pressure), with no word to the user
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
    try:
        spec = NetworkSpec.from_dict(d)
    except ConfigError:
        return  # refused with one line: fine
    first, second = spec.jobs[0].calls()
    assert first.cls != second.cls, "an explicit class name collided with a default one and was merged"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
