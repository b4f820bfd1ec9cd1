"""DynamicBatch (`dynamicbatch`): AIMD on a hand sequence, the cap on admissions and steps,
and the simulator end to end."""

from __future__ import annotations

import pytest
from helpers import trace

import llmsched
from llmsched.core import ConfigError, StepFeedback, StepPlan, make_cost_model
from llmsched.core.constraints import Constraints
from llmsched.core.request import Request
from llmsched.core.state import ServerState
from llmsched.policies import ADMISSION_POLICIES, DynamicBatch, make_admission_policy, make_scheduler
from llmsched.sim.simulator import simulate_trace


def _fb(start, duration, decode=1):
    return StepFeedback(start, duration, StepPlan(decode, []), [], [], lambda: [], [])


def _policy(**kw):
    opts = dict(itl_target_ms=20, alpha=1.0, beta=0.5, delta=1, c_min=2, c_max=40, c0=16)
    opts.update(kw)
    p = DynamicBatch(**opts)
    st = ServerState(Constraints(b_max=128))
    p._resolve(st)
    return p, st


def test_aimd_on_a_hand_sequence():
    p, st = _policy()
    caps = []
    t = 0.0
    for ms in (10, 10, 30, 30, 10, 10, 10, 30, 30, 30, 30):
        p.observe(st, _fb(t, ms / 1e3))
        t += ms / 1e3
        caps.append(p.cap)
    # +1 below the target, floor(cap / 2) above it, never below c_min
    assert caps == [17, 18, 9, 4, 5, 6, 7, 3, 2, 2, 2]
    for _ in range(60):
        p.observe(st, _fb(t, 0.005))
        t += 0.005
    assert p.cap == 40  # c_max


def test_ewma_smooths_single_slow_steps():
    p, st = _policy(alpha=0.25)
    t = 0.0
    for ms in (10, 10, 10, 46):  # l = 10, 10, 10, 19: below the target
        p.observe(st, _fb(t, ms / 1e3))
        t += ms / 1e3
    assert p.cap == 20
    p.observe(st, _fb(t, 0.030))  # l = 21.75 > 20
    assert p.cap == 10


def test_default_target_is_one_and_a_half_batch_one_decode_steps():
    p = DynamicBatch()
    p.bind_cost_model(make_cost_model("paper"))
    p._resolve(ServerState(Constraints(b_max=512)))
    assert p.itl_target() == pytest.approx(1.5 * 0.04675)
    assert p.C_max == 512 and p.cap == 512  # starts uncapped
    q = DynamicBatch()
    q._resolve(ServerState(Constraints(b_max=512, k_max=32)))
    assert q.C_max == 32 and q.itl_target() is None  # no cost model: measured
    q.observe(ServerState(Constraints(b_max=512, k_max=32)), _fb(0.0, 0.008))
    assert q.itl_target() == pytest.approx(0.012)


def test_c_max_above_the_step_room_is_cut_to_it():
    """A step holds at most min(b_max, k_max) requests: a c_max of 1,000 used to start the
    cap there, so that it halved 1000, 500, 250, 125 before it bound (62) on a slow step."""
    st = ServerState(Constraints(b_max=512, k_max=64))
    p = make_admission_policy("dynamicbatch", c_max=1000, l_min_ms=10, alpha=1.0)
    assert p.batch_limit(st) == 64 and p.C_max == 64 and p.describe()["resolved"]["C_max"] == 64
    p.observe(st, _fb(0.0, 0.030))  # over the 15 ms target: the first cut binds
    assert p.batch_limit(st) == 32
    for _ in range(40):
        p.observe(st, _fb(0.0, 0.005))
    assert p.cap == 64
    q = make_admission_policy("dynamicbatch", c_min=100, c_max=1000, c0=500)
    assert q.batch_limit(ServerState(Constraints(b_max=48))) == 48  # c_min and c0 too
    # a c0 below c_min starts at c_min (docs/twp.md), as TWP's h0 at the nearer bound
    low = make_admission_policy("dynamicbatch", c_min=8, c_max=32, c0=2, l_min_ms=10)
    assert low.batch_limit(ServerState(Constraints(b_max=48))) == 8


def test_cap_bounds_admissions_but_never_pauses_running_requests():
    sched = make_scheduler(
        "sarathi", admission="dynamicbatch", b_max=64, admission_options=dict(c0=3, itl_target_ms=1000)
    )
    st = sched.new_state()
    for i in range(5):
        st.add(Request(i, 0, 4, 5))
    plan = sched.plan(st)
    assert [(r.id, n) for r, n in plan.prefill] == [(0, 4), (1, 4), (2, 4)]
    st.begin_step(plan, 0)
    st.end_step(plan, 10**7)
    sched.admission.cap = 1.0  # the cap drops below the running set
    plan = sched.plan(st)
    assert plan.decode == 3 and plan.prefill == []  # all three still decode, none joins
    assert sched.admission.batch_limit(st) == 3


def test_idle_server_admits_the_head_even_at_the_smallest_cap():
    sched = make_scheduler(
        "sarathi", admission="dynamicbatch", b_max=16, admission_options=dict(c0=1, c_min=1, itl_target_ms=1)
    )
    st = sched.new_state()
    st.add(Request(0, 0, 40, 3))
    plan = sched.plan(st)
    assert [(r.id, n) for r, n in plan.prefill] == [(0, 16)]


def test_registered_and_bad_options():
    assert ADMISSION_POLICIES["dynamicbatch"] is DynamicBatch
    assert isinstance(make_admission_policy("dynamic-batch"), DynamicBatch)
    for opts, match in [
        ({"cap": 3}, "unknown option 'cap'"),
        ({"c_min": 0}, "c_min must be"),
        ({"beta": 0}, "beta must be"),
        ({"delta": -1}, "delta must be"),
        ({"c_min": 9, "c_max": 3}, "must not exceed"),
        ({"itl_target_ms": "fast"}, "itl_target_ms must be a number"),
        ({"c_max": 10**400}, "c_max must be an integer >= 1 and < 1e308"),  # (was an OverflowError)
    ]:
        with pytest.raises(ConfigError, match=match):
            make_admission_policy("dynamicbatch", **opts)


def test_simulation_loses_nothing_and_respects_the_cap():
    rows = [(0.002 * i, 30 + (37 * i) % 200, 5 + (11 * i) % 60) for i in range(300)]
    sched = make_scheduler("sarathi", admission="dynamicbatch", b_max=256)
    sched.bind_cost_model(make_cost_model("paper:c=5,a=3,b0=32"))
    db = sched.admission
    plan = sched.plan
    caps = []

    def checked(state):
        p = plan(state)
        assert p.batch_size <= max(int(db.cap), state.n_running)
        caps.append(int(db.cap))
        return p

    sched.plan = checked
    stats = simulate_trace(trace(rows), sched, make_cost_model("paper:c=5,a=3,b0=32"))
    assert stats.unfinished == 0 and (stats.e2e_ns >= 0).all()
    assert min(caps) < 256 and len(set(caps)) > 5  # the cap moved


def test_end_to_end_through_the_api():
    r = llmsched.simulate(
        admission="dynamicbatch",
        admission_options={"itl_target_ms": 100},
        cost_model="paper",
        rate=4,
        prompt="geometric:100",
        output="geometric:50",
        num_requests=300,
        seed=2,
    )
    assert r.summary["completed"] == 300
    assert r.config["scheduler"]["admission"]["itl_target_ms"] == 100


def test_an_idle_server_resets_the_itl_meter():
    """After `went_idle` (a decoder joins an idle server without a prefill) the next step's
    ITL sample is its own duration, not the idle gap since the last step."""
    p, st = _policy()
    p.observe(st, _fb(0.0, 0.010))
    p.went_idle()
    p.observe(st, _fb(5.0, 0.010))
    assert p.l_ewma == pytest.approx(0.010)
    q, st = _policy()
    q.observe(st, _fb(0.0, 0.010))
    q.observe(st, _fb(5.0, 0.010))
    assert q.l_ewma == pytest.approx(5.0)  # without it: from the last step's end to this one's


@pytest.mark.parametrize("name", ["twp", "dynamicbatch"])
def test_went_idle_forgets_the_last_step_of_either_itl_admission(name):
    scheduler = make_scheduler("sarathi", name, b_max=128)
    meter = scheduler.admission.meter
    meter.prev_end, meter.prev_emitted = 1.0, True
    scheduler.went_idle()
    assert meter.prev_end is None and meter.prev_emitted is False


def test_c_max_is_cut_to_a_running_cap_that_wraps_the_policy():
    """--max-running 8 lets at most 8 requests run: C_max used to stay min(b_max, k_max) = 512,
    recorded so in config.json, and the cap halved 512, 256, ... 16 before it bound."""
    st = ServerState(Constraints(b_max=512))
    capped = make_admission_policy("dynamicbatch", max_running=8, l_min_ms=10, alpha=1.0)
    inner = capped.inner
    assert capped.batch_limit(st) == 8 and inner.C_max == 8 and inner.cap == 8
    assert capped.describe()["resolved"]["C_max"] == 8 and capped.describe()["max_running"] == 8
    capped.observe(st, _fb(0.0, 0.030))  # over the 15 ms target: the first cut binds
    assert capped.batch_limit(st) == 4
    capped.reset()  # the running cap is an option: a new run keeps it
    assert capped.batch_limit(st) == 8 and inner.C_max == 8
    # a running cap above the step room changes nothing; nested caps: the tighter one
    assert make_admission_policy("dynamicbatch", max_running=1000).batch_limit(st) == 512
    from llmsched.policies import RunningCap

    nested = RunningCap(make_admission_policy("dynamicbatch", max_running=20), 6)
    assert nested.batch_limit(st) == 6
    r = llmsched.simulate(admission="dynamicbatch", max_running=8, num_requests=50, seed=1)
    assert r.config["scheduler"]["admission"]["resolved"]["C_max"] == 8
