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
