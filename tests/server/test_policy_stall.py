"""A batch policy that plans nothing while requests are unfinished: the server used to wait
forever (the client hung, nothing logged, /health 200). Now the requests end with a 500
naming the policy, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest
from srv_helpers import running_server

from llmsched.core.engine_api import SamplingParams
from llmsched.core.plan import StepPlan
from llmsched.core.request import Request
from llmsched.policies import BATCH_POLICIES, BatchPolicy, make_scheduler, register_batch_policy
from llmsched.server.backends import SchedulerOptions
from llmsched.sim.virtual import VirtualEngine

CLIENT_TIMEOUT = 15  # the old code hung: the client gives up and the test fails


def _stall(self, p):
    """Admits, then plans nothing once a request runs."""
    if p.state.running:
        return StepPlan()
    p.admit_waiting()
    return p.plan()


def _idle(self, p):
    """Never admits."""
    p.take_decodes()
    p.take_running_prefills()
    return p.plan()


def _short_only(self, p):
    """Serves prompts of under 20 tokens; a longer one waits forever."""
    p.take_decodes()
    p.take_running_prefills()
    if all(r.prompt < 20 for r in p.state.waiting):
        p.admit_waiting()
    return p.plan()


def _patient(self, p):
    """Plans nothing twice before each admission (a policy that waits a step or two)."""
    p.take_decodes()
    p.take_running_prefills()
    if p.state.waiting and not p.state.running:
        self.waited = getattr(self, "waited", 0) + 1
        if self.waited <= 2:
            return StepPlan()
        self.waited = 0
    p.admit_waiting()
    return p.plan()


@pytest.fixture(scope="module", autouse=True)
def policies():
    names = []
    for name, build in (
        ("test-stall", _stall),
        ("test-idle", _idle),
        ("test-short-only", _short_only),
        ("test-patient", _patient),
    ):
        register_batch_policy(type(name, (BatchPolicy,), {"name": name, "build": build}))
        names.append(name)
    yield
    for name in names:
        BATCH_POLICIES.pop(name, None)


def complete(base: str, prompt, stream: bool = False) -> httpx.Response:
    body = {"model": "llmsched-sim", "prompt": prompt, "max_tokens": 5, "stream": stream}
    return httpx.post(base + "/v1/completions", json=body, timeout=CLIENT_TIMEOUT)


def check_stall_error(r: httpx.Response, policy: str) -> None:
    assert r.status_code == 500, r.text
    msg = r.json()["error"]["message"]
    assert f"batch policy {policy!r} planned no work" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("policy", ["test-stall", "test-idle"])
def test_a_stalling_policy_fails_the_request_and_the_server_stays_up(policy, caplog):
    with running_server(policy=policy, cost="const:5") as (base, _srv):
        with caplog.at_level("ERROR", logger="llmsched.server"):
            check_stall_error(complete(base, "hello"), policy)
        assert [r.getMessage() for r in caplog.records if policy in r.getMessage()], "one log line names the policy"
        assert httpx.get(base + "/health", timeout=CLIENT_TIMEOUT).status_code == 200
        # a streamed request too, and a later one: the server still answers
        body = complete(base, [1, 2, 3], stream=True).text
        assert f"batch policy {policy!r} planned no work" in body
        check_stall_error(complete(base, "hello again"), policy)


def test_the_server_serves_the_next_request_after_a_stall():
    with running_server(policy="test-short-only", cost="const:5") as (base, _srv):
        check_stall_error(complete(base, list(range(50))), "test-short-only")
        r = complete(base, [1, 2, 3])
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5


def test_a_policy_that_waits_a_step_or_two_is_served():
    with running_server(policy="test-patient", cost="const:5") as (base, _srv):
        for _ in range(3):
            r = complete(base, [1, 2, 3])
            assert r.status_code == 200, r.text


def test_a_request_still_to_join_at_its_arrival_step_is_not_a_stall():
    """The virtual GPU holds a request until the step boundary at its arrival: while one is
    held, an empty plan is no stall (that step may run it)."""
    eng = VirtualEngine(make_scheduler("test-idle"), "const:5", realtime=False)
    eng.add_request("a", range(3), SamplingParams(max_tokens=2))
    assert eng.step() == []
    assert eng.stalled()  # in the state, nothing planned, nothing due
    eng._pending.append(Request(99, 10**9, 3, 2))  # (a request due after the clock)
    assert not eng.stalled()


def test_the_engine_backend_fails_a_stalling_policy_too(tmp_path):
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import make_engine_backend

    model_dir = make_tiny_model(tmp_path / "model")
    backend = make_engine_backend(
        str(model_dir),
        SchedulerOptions(policy="test-stall", b_max=256, max_running=16),
        max_model_len=512,
        num_blocks=128,
        block_size=16,
        seed=0,
    )
    with running_server(backend) as (base, _srv):
        body = {"model": backend.model_name, "prompt": [1, 2, 3], "max_tokens": 5}
        r = httpx.post(base + "/v1/completions", json=body, timeout=CLIENT_TIMEOUT)
        check_stall_error(r, "test-stall")
        assert httpx.get(base + "/health", timeout=CLIENT_TIMEOUT).status_code == 200
