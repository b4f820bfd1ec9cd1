"""A batch policy that plans nothing while requests run: the simulator's error names it
(it said only "the scheduler", not which policy)."""

from __future__ import annotations

import pytest

import llmsched
from llmsched.core.plan import StepPlan
from llmsched.policies import BATCH_POLICIES, BatchPolicy, register_batch_policy
from llmsched.sim.server import SimulationStuck


def _stall(self, p):
    if p.state.running:
        return StepPlan()
    p.admit_waiting()
    return p.plan()


@pytest.fixture
def stall():
    register_batch_policy(type("test-sim-stall", (BatchPolicy,), {"name": "test-sim-stall", "build": _stall}))
    yield "test-sim-stall"
    BATCH_POLICIES.pop("test-sim-stall", None)


def test_the_stuck_error_names_the_batch_policy(stall):
    with pytest.raises(SimulationStuck, match="batch policy 'test-sim-stall' planned no work .* requests running"):
        llmsched.simulate(
            policy=stall, cost_model="paper", prompt="const:100", output="const:10", num_requests=3, rate=2, seed=0
        )


@pytest.fixture
def idle():
    def never(self, p):
        return StepPlan()

    register_batch_policy(type("test-sim-idle", (BatchPolicy,), {"name": "test-sim-idle", "build": never}))
    yield "test-sim-idle"
    BATCH_POLICIES.pop("test-sim-idle", None)


def test_the_waiting_stuck_errors_name_the_batch_policy(idle):
    """One server, a network's server and a serverless instance whose policy never admits."""
    from pathlib import Path

    import yaml

    from llmsched.sim.network_result import simulate_network
    from llmsched.sim.serverless_result import simulate_serverless

    with pytest.raises(SimulationStuck, match="batch policy 'test-sim-idle' planned no work .* waiting"):
        llmsched.simulate(policy=idle, cost_model="paper", num_requests=3, rate=2)
    tandem = {
        "servers": {"s1": {"policy": idle, "cost_model": "paper"}},
        "jobs": {
            "j": {
                "arrival": {"process": "poisson", "rate": 2.0},
                "route": [{"call": {"server": "s1", "prompt": "const:10", "output": "const:2"}}],
            }
        },
        "num_jobs": 3,
    }
    with pytest.raises(SimulationStuck, match="batch policy 'test-sim-idle' of s1 planned no work"):
        simulate_network(tandem)
    cfg = yaml.safe_load((Path(__file__).parents[1] / "examples" / "serverless" / "small.yaml").read_text())
    for m in cfg["models"].values():
        m["policy"] = idle
    cfg["workload"]["num_requests"] = 5
    with pytest.raises(SimulationStuck, match="batch policy 'test-sim-idle' of instance .* planned no work"):
        simulate_serverless(cfg, scheduler="fcfs")
