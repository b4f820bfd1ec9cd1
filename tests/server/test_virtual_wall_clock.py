"""The virtual GPU converts a request's `time.time()` stamp by its age when it is added,
not by an offset fixed when the engine was built: a wall clock stepped (or slewed) since
then made every stamp late, and each request arriving during a step missed the next one."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from llmsched.core import ConfigError, make_cost_model
from llmsched.core.engine_api import SamplingParams
from llmsched.policies import make_scheduler
from llmsched.sim.simulator import simulate_trace
from llmsched.sim.virtual import VirtualEngine


def _trace(n, seed):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(
        arrival_s=np.cumsum(rng.exponential(0.05, n)),
        prompt=rng.integers(1, 300, n),
        output=rng.integers(1, 30, n),
        tag=None,
    )


HOST_NS = 200_000  # the host wakes 0.2 ms after each step's end, as a real one does


class _Clocks:
    """A monotonic clock that `sleep` advances (overshooting by the host's delay), and a
    wall clock that runs with it at an offset a test may step."""

    def __init__(self):
        self.t = 1000.0
        self.wall_offset = 1.7e9

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s + HOST_NS / 1e9

    def wall(self):
        return self.t + self.wall_offset


@pytest.mark.parametrize("wall_step_s", [0.05, -0.05, 0.0])
def test_ttft_matches_the_simulator_after_the_wall_clock_steps(monkeypatch, wall_step_s):
    t = _trace(n=120, seed=2)
    mk = lambda: make_scheduler("sarathi", b_max=256)  # noqa: E731
    ref = simulate_trace(t, mk(), make_cost_model("paper"), fast=False)
    c = _Clocks()
    monkeypatch.setattr(time, "time", c.wall)
    ve = VirtualEngine(mk(), "paper", clock=c.clock, sleep=c.sleep)
    c.wall_offset += wall_step_s  # NTP steps the wall clock after the server started
    t0 = c.t + 0.05
    arr = t0 + t.arrival_s
    first = {}
    i, n = 0, len(arr)
    while i < n or ve.has_unfinished_requests():
        if not ve.has_unfinished_requests() and c.t < arr[i]:
            c.t = float(arr[i])  # idle until the next arrival
        while i < n and arr[i] <= c.t:
            # stamped by the server at its arrival, added by the driver after the step
            stamp = float(arr[i]) + c.wall_offset
            ve.add_request(str(i), range(int(t.prompt[i])), SamplingParams(max_tokens=int(t.output[i])), stamp)
            i += 1
        for o in ve.step():
            first.setdefault(int(o.request_id), c.t - arr[int(o.request_id)])
    ttft = np.array([first[k] for k in range(n)]) * 1e9
    # the host's 0.2 ms after each step's end is in each measured TTFT
    diff = ttft - HOST_NS - ref.ttft_ns
    assert np.abs(diff).max() < 1000, diff  # (under 1 us: rounding of the float clocks)
    assert ve.stats()["late_steps"] == 0


def test_arrival_time_must_be_finite():
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:10")
    for bad in (float("nan"), float("inf"), "1.0"):
        with pytest.raises(ConfigError, match="arrival_time"):
            ve.add_request("a", range(8), SamplingParams(max_tokens=2), bad)


def test_arrival_ns_is_on_the_engine_clock():
    c = _Clocks()
    ve = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:10", clock=c.clock, sleep=c.sleep)
    c.t += 1.0
    ve.add_request("a", range(8), SamplingParams(max_tokens=1), arrival_ns=600_000_000)
    ve.add_request("b", range(8), SamplingParams(max_tokens=1), arrival_ns=5_000_000_000)  # later than now
    out = {o.request_id: o for o in ve.step()}
    assert out["a"].timings[0] == 0.6 and out["b"].timings[0] == 1.0
