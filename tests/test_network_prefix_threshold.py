"""A caching server's verdict thresholds in a network are one server's: its fill capacity
counts the prompt tokens its calls found cached as no work, as `simulate --prefix-caching`
does. Before, they took the traffic equations' fill capacity, which counts every hit as
prefill work: for a context-dependent cost model such steps are prefill-heavy and serve
more tokens a second than the run's, and the threshold (that capacity times the backlog's
units) came out 1.8 times one server's on the same calls (8,517 against 4,718 tokens/s
here: profile:h200-llama-3-8b, a 2,048-token system prompt that nearly every call hits)."""

import pytest

from llmsched import simulate
from llmsched.sim.network_result import simulate_network

PROFILE = "profile:h200-llama-3-8b"
N = 1000


def network() -> dict:
    server = {"policy": "sarathi", "b_max": 512, "cost_model": PROFILE, "prefix_caching": True, "block_size": 16}
    call = {"call": {"server": "s", "prompt": "const:100", "output": "const:50"}}
    job = {"arrival": {"process": "poisson", "rate": 20}, "route": [call], "system_prompt": 2048}
    return {"servers": {"s": server}, "jobs": {"A": job}, "num_jobs": N, "seed": 1}


def test_a_caching_replicas_threshold_is_one_servers():
    res = simulate_network(network())
    s = res.summary
    assert s["servers"]["s"]["prefix_saved_work_share"] > 0.9  # (the system prompt: a hit for nearly every call)
    one = simulate(
        policy="sarathi",
        b_max=512,
        cost_model=PROFILE,
        rate=20,
        prompt="const:100",
        output="const:50",
        system_prompt=2048,
        prefix_caching=True,
        block_size=16,
        num_requests=N,
        seed=1,
    ).summary
    # the network's work (one call a job, at this one-replica server) is judged against the
    # replica's threshold: its fill capacity with the hits as no work, times its backlog's units
    work = s["network_work_verdict"]["threshold_tokens_per_s"]
    assert work == pytest.approx(one["verdict_threshold_tokens_per_s"], rel=0.01)
    assert work == pytest.approx(0.02 * res.threshold_capacities("s")[0] * res.backlog_units("s"), rel=1e-12)


def test_a_caching_pools_threshold_is_its_replicas_over_the_busiest_share():
    spec = network()
    spec["servers"]["s"]["replicas"] = 2
    res = simulate_network(spec)
    units = res.backlog_units("s")
    pool = res.summary["servers"]["s"]["pool_verdict"]["threshold_tokens_per_s"]
    # (the traffic equations, counting every hit as prefill work, give a far larger one)
    assert pool < 0.02 * res.traffic.server("s").fill_capacity * units / 1.5
    fill = res.threshold_capacities("s")
    assert fill[1] == pytest.approx(2 * fill[0], rel=1e-12)
    assert pool == pytest.approx(0.02 * fill[1] * units, rel=1e-12)
