"""One server's load and arrival-share rules on network verdicts (docs/networks.md,
"Judging a network"): a `stable` call on a replica's backlog or on the network's work is
inconclusive when the offered load is above LOAD_MARGIN times the limit (the replica's
policy's; the network's: its most loaded server's, from the traffic equations), or when the
judged window holds too few of the arrivals."""

import pytest

from llmsched.sim.network_result import server_policy_load, simulate_network
from llmsched.theory.network import traffic
from llmsched.workload.network import NetworkSpec, load_network


def run(name: str, load: float, num_jobs: int, seed: int):
    """An example network with its bottleneck at `load` of its capacity."""
    spec = load_network(f"examples/networks/{name}.yaml")
    return simulate_network(spec, scale=load * traffic(spec).critical_scale, num_jobs=num_jobs, seed=seed)


def one_server(arrival: dict, load: float, num_jobs: int, seed: int):
    """One Sarathi server (paper model, b_max 512), prefill-heavy calls (geometric 400 / 20:
    a decode time of about 1 s, so the short-window rule stays off), at `load` of its capacity."""
    spec = {
        "servers": {"pool": {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}},
        "jobs": {
            "q": {
                "arrival": arrival,
                "route": [{"call": {"server": "pool", "prompt": "geometric:400", "output": "geometric:20"}}],
            }
        },
    }
    return simulate_network(spec, scale=load * traffic(spec).critical_scale, num_jobs=num_jobs, seed=seed)


def test_an_overloaded_agent_is_not_called_stable_on_its_work():
    """agent_dag at 1.15 times its capacity, 300 jobs, seed 15: the network's work fell over
    the judged window (growth -272 tokens/s, interval -551 to 8) and was called stable."""
    s = run("agent_dag", 1.15, 300, 15).summary
    work = s["network_work_verdict"]
    assert work["backlog_growth_ci"][1] < work["threshold_tokens_per_s"]  # the interval alone: stable
    assert work["verdict"] == "inconclusive"
    assert work["load"] == pytest.approx(1.15)
    assert "115% of the network's limit, at server writer (over 102%)" in work["reason"]
    assert s["verdict"] != "stable"


def test_an_overloaded_replica_is_not_called_stable():
    """One server at 1.1 times its capacity, 400 jobs, seed 12: its replica's backlog and the
    network's work show no material growth; both were called stable."""
    s = one_server({"process": "poisson", "rate": 1.0}, 1.1, 400, 12).summary
    rep = s["servers"]["pool"]["replicas"]["pool"]
    assert rep["verdict"] == "inconclusive"
    assert "110% of the policy's limit (over 102%)" in rep["verdict_reason"]
    assert s["network_work_verdict"]["verdict"] == "inconclusive"
    assert "110% of the network's limit, at server pool" in s["network_work_verdict"]["reason"]
    assert s["verdict"] == "inconclusive"


def test_a_lull_in_the_arrivals_is_not_called_stable():
    """Gamma arrivals of cv 10 at 40%, 1,000 jobs, seed 28: the judged window's second half
    (a quarter of the arrivals' time) holds 43 of 998 arrivals; the backlog there shrank and
    was called stable, on the replica and on the network's work."""
    s = one_server({"process": "gamma", "rate": 1.0, "cv": 10}, 0.4, 1000, 28).summary
    rep = s["servers"]["pool"]["replicas"]["pool"]
    for reason in (rep["verdict_reason"], s["network_work_verdict"]["reason"]):
        assert reason.startswith("the arrival rate changed: 43 of 998 arrivals in the judged window's second half")
    assert rep["verdict"] == s["network_work_verdict"]["verdict"] == s["verdict"] == "inconclusive"


def test_an_underloaded_network_is_still_stable():
    s = run("agent_dag", 0.7, 2000, 4).summary
    assert s["network_work_verdict"]["verdict"] == "stable"
    assert s["network_work_verdict"]["load"] == pytest.approx(0.7)
    assert s["verdict"] == "stable"


def test_a_cyclic_network_known_unstable_stays_unstable():
    """Rybko-Stolyar, priority to the exiting classes, each server at 86.9%: unstable."""
    res = simulate_network("examples/networks/rybko_stolyar.yaml", scale=1.1, num_jobs=3000, seed=0)
    s = res.summary
    assert res.traffic.cycle is not None
    assert s["network_work_verdict"]["verdict"] == "unstable" and s["verdict"] == "unstable"


def test_prefix_cache_hits_count_as_no_work():
    """agent_loop: the traffic equations offer its pool 127.5% counting every prompt token;
    its caches save about 82% of that work, and the run is stable (docs/networks.md)."""
    res = simulate_network("examples/networks/agent_loop.yaml")
    assert res.traffic.server("agent").utilisation > 1.2
    assert res.policy_loads()["agent"] == pytest.approx(
        res.traffic.server("agent").utilisation * (1 - res.saved_work_share("agent"))
    )
    assert res.policy_loads()["agent"] < 0.3
    assert res.summary["verdict"] == "stable" and res.summary["network_work_verdict"]["verdict"] == "stable"


def test_a_policy_without_a_known_limit_is_judged_against_lambda_star():
    """A work-conserving policy's limit is its full steps' capacity; FasterTransformer's is
    unknown (lambda* only bounds it), so is a policy's under back-pressure."""
    spec = NetworkSpec.from_yaml("examples/networks/agent_dag.yaml")
    rep = traffic(spec)
    load = rep.server("writer")
    assert server_policy_load(load, spec.servers["writer"]) == pytest.approx(
        load.offered_tokens_per_s / load.fill_capacity
    )
    assert server_policy_load(load, spec.servers["writer"], "backpressure") == pytest.approx(load.utilisation)
    spec.servers["writer"].policy = "fastertransformer"
    assert server_policy_load(load, spec.servers["writer"]) == pytest.approx(load.utilisation)
    spec.servers["writer"].policy = "sarathi"
    spec.servers["writer"].kv_capacity = 100_000  # preemptions: no theorem's limit
    assert server_policy_load(load, spec.servers["writer"]) == pytest.approx(load.utilisation)


def test_a_replica_gets_its_routing_share_of_the_load():
    """Random routing with weights 3:1 at 1.1 times the pool's capacity (the busiest replica's):
    the light replica is offered a third of the busy one's load, and is judged stable."""
    spec = {
        "servers": {
            "pool": {
                "policy": "sarathi",
                "b_max": 512,
                "cost_model": "paper",
                "replicas": 2,
                "router": "random",
                "router_options": {"weights": [3, 1]},
            }
        },
        "jobs": {
            "q": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [{"call": {"server": "pool", "prompt": "geometric:400", "output": "geometric:20"}}],
            }
        },
    }
    res = simulate_network(spec, scale=1.1 * traffic(spec).critical_scale, num_jobs=3000, seed=0)
    busy, light = res.replicas()
    assert res._replica_load(busy, "pool", 0) == pytest.approx(1.1)
    assert res._replica_load(light, "pool", 1) == pytest.approx(1.1 / 3)
    assert light.stability["verdict"] == "stable"
