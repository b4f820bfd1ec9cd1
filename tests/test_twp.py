"""Token Window Pacing (`twp`): hand cases on a tiny state, the simulator end to end, and
the same decisions in the simulator, the virtual GPU and the PyTorch engine."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from helpers import tiny_llama_config, trace

import llmsched
from llmsched.core import ConfigError, StepFeedback, StepPlan, make_cost_model
from llmsched.core.constraints import Constraints
from llmsched.core.request import NS, Request
from llmsched.core.state import ServerState
from llmsched.policies import ADMISSION_POLICIES, TWP, list_policies, make_admission_policy, make_scheduler
from llmsched.policies.base import AdmissionPolicy, Scheduler
from llmsched.sim.simulator import simulate_trace
from llmsched.workload import WorkloadSpec, make_trace


def _resolved(policy: TWP, b_max=512, k_max=None):
    policy._resolve(ServerState(Constraints(b_max=b_max, k_max=k_max)))
    return policy


def _state(b_max=128, waiting=0):
    st = ServerState(Constraints(b_max=b_max))
    for i in range(waiting):
        st.add(Request(i, 0, 10, 5))
    return st


def _fb(start, duration, decode=1, prefill=None, first_tokens=()):
    plan = StepPlan(decode, prefill or [])
    return StepFeedback(start, duration, plan, [], list(first_tokens), lambda: [], [])


# ---- l_min, B_0 and the derived defaults, by hand ---------------------------------------
def test_paper_model_knee_and_defaults():
    # t(b) = 11.28 + 35.47 ceil(b / 128) ms: t(1) = t(128) = 46.75 ms, t(129) = 82.22 ms.
    p = TWP()
    p.bind_cost_model(make_cost_model("paper"))
    _resolved(p)
    assert p.l_min_s == pytest.approx(0.04675)
    assert p.B_0 == 128  # 82.22 > 1.2 * 46.75 = 56.1
    assert p.itl_target() == pytest.approx(1.5 * 0.04675)
    assert p.B_max == 128  # decode of 129..256 takes 82.22 > L* = 70.1 ms
    assert p.W_0 == 128 and p.H_min == 128 and p.H_max == 512
    assert p.window == 128 and p.delta_tokens == 8  # H_0 = H_min, delta = b_max / 64


def test_small_paper_model_by_hand():
    # c = 10, a = 5, b0 = 16: t(1..16) = 15 ms, t(17..32) = 20, t(33..48) = 25, t(49..64) = 30
    p = _resolved(TWP(cost="paper:c=10,a=5,b0=16"), b_max=128)
    assert p.l_min_s == pytest.approx(0.015)
    assert p.B_0 == 16  # 20 > 1.2 * 15 = 18
    assert p.B_max == 32  # L* = 22.5 ms: t(32) = 20, t(33) = 25
    assert p.W_0 == 16 and p.H_min == 32 and p.H_max == 128 and p.delta_tokens == 2
    q = _resolved(TWP(cost="paper:c=10,a=5,b0=16", itl_target_ms=30, eps=0.5), b_max=128)
    assert q.B_0 == 32  # 20 <= 1.5 * 15 = 22.5 < 25
    assert q.B_max == 64  # t(64) = 30 <= 30
    assert q.H_min == 64


def test_linear_model_and_k_max_cap():
    # t(b) = 10 + 0.1 b ms: l_min = 10.1; B_0: 10 + 0.1 n <= 12.12 -> 21; L* = 15.15 -> 51
    p = _resolved(TWP(cost="linear:c=10,a=0.1"))
    assert (p.B_0, p.B_max, p.W_0, p.H_min) == (21, 51, 21, 51)
    q = _resolved(TWP(cost="linear:c=10,a=0.1"), k_max=40)
    assert (q.B_0, q.B_max, q.H_min) == (21, 40, 40)


def test_context_dependent_model_uses_decode_shape():
    prof = make_cost_model("profile")
    p = _resolved(TWP(cost=prof, context=512))
    l1 = prof.step_time(0, 1, 512, [], 1)
    assert p.l_min_s == pytest.approx(l1)
    n = p.B_0
    assert prof.step_time(0, n, n * 512, [], n) <= 1.2 * l1 < prof.step_time(0, n + 1, (n + 1) * 512, [], n + 1)
    m = p.B_max
    assert prof.step_time(0, m, m * 512, [], m) <= 1.5 * l1 < prof.step_time(0, m + 1, (m + 1) * 512, [], m + 1)
    assert p.H_min == max(p.B_max, p.W_0)


def _first_over(time_of, bound, cap):
    """The largest n <= cap with time_of(m) <= bound for m = 1..n, size by size."""
    n = 1
    while n < cap and time_of(n + 1) <= bound:
        n += 1
    return n


class _Dip(llmsched.core.cost.CostModel):
    """A context-dependent step time that passes 1.2 x its batch-1 time at 6 decoders and
    falls back below it at 7 and after: a bisection would find a batch past the first rise."""

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        b = prefill_tokens + decode_tokens
        return 0.010 + (0.005 if b == 6 else 0.0) + 1e-6 * b + 1e-9 * decode_context


@pytest.mark.parametrize("spec", ["profile", "profile:h200-llama-3.2-1b,monotone=0,mode=eager", "dip"])
def test_knees_are_the_first_batch_past_the_bound_size_by_size(spec):
    """B_0, B_max and W_0 stop at the first size over their bound, as a scan of every size
    one at a time does, for non-monotone times too (monotone=0 keeps the tables' dips)."""
    model = _Dip() if spec == "dip" else make_cost_model(spec)
    for ctx, eps, target in ((1024, 0.2, None), (0, 0.5, 40.0), (5000, 0.05, 8.0)):
        p = _resolved(TWP(cost=model, context=ctx, eps=eps, itl_target_ms=target), b_max=4096)
        decode = lambda n: model.step_time(0, n, n * ctx, [], n)  # noqa: E731
        assert p.B_0 == _first_over(decode, (1 + eps) * p.l_min_s, 4096)
        within = _first_over(decode, p.itl_target(), 4096)
        assert p.B_max == max(p.B_0, within)
        assert p.W_0 == _first_over(model.load_time, (1 + eps) * model.load_time(1), 4096)
    if spec == "dip":
        assert _resolved(TWP(cost=model), b_max=64).B_0 == 5


def test_a_model_timing_each_size_is_not_asked_past_the_first_size_over_the_bound():
    """A model of its own tables (no vectorised `decode_times` / `load_times`) is timed one
    size at a time, as before: never past the first batch or load over the bound (a scan
    in chunks asked for batches past its table, which it cannot time)."""

    class Table(llmsched.core.cost.CostModel):
        def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
            b = prefill_tokens + decode_tokens
            if b > 40:
                raise IndexError(f"no row for {b} tokens")
            return 0.010 * (1 + b // 20) + 1e-9 * decode_context

    p = _resolved(TWP(cost=Table(), itl_target_ms=25), b_max=4096)
    assert (p.B_0, p.B_max, p.W_0) == (19, 39, 19)


@pytest.mark.parametrize(
    "spec", ["profile", "profile:h200-llama-3.2-1b,monotone=0,overlap=0.5", "profile:h200-llama-3-8b,mode=graph"]
)
def test_vectorised_decode_times_equal_step_time_bit_for_bit(spec):
    model = make_cost_model(spec)
    n = np.concatenate([np.arange(1, 1100), np.arange(1100, 40_000, 37), [8191, 8192, 8193, 10**6]])
    for ctx in (0, 128, 1000, 1024, 131_072, 10**7):
        want = [model.step_time(0, int(k), int(k) * ctx, [], int(k)) for k in n]
        assert model.decode_times(n, ctx).tolist() == want


def test_a_large_budget_and_target_time_decode_batches_without_one_call_a_size(monkeypatch):
    """b_max 1,000,000 with a 100 s target: B_max is the budget, found by timing every
    batch up to it; one step_time call a batch took 19-61 s before the first step."""
    model = make_cost_model("profile")
    calls = []
    one = model.step_time
    monkeypatch.setattr(model, "step_time", lambda *a: calls.append(a) or one(*a))
    p = _resolved(TWP(cost=model, itl_target_ms=1e5), b_max=1_000_000)
    assert p.B_max == 1_000_000 and p.B_0 == _first_over(lambda n: one(0, n, n * 1024, [], n), 1.2 * p.l_min_s, 100)
    assert len(calls) < 1000


def test_explicit_measurements_use_the_roofline():
    p = _resolved(TWP(l_min_ms=10, b0=16))
    assert p.l_min_s == pytest.approx(0.010)
    assert p.B_max == 24  # floor(16 * 15 / 10)
    assert p.W_0 == 16 and p.H_min == 24


@pytest.mark.parametrize(
    "l_min_ms, b0, target_ms, want", [(3, 16, 9, 48), (10, 10, 22, 22), (6.6, 32, None, 48), (10, 16, 14.9, 23)]
)
def test_the_roofline_batch_at_a_whole_quotient_is_not_rounded_down(l_min_ms, b0, target_ms, want):
    """floor(B_0 L* / l_min) in floats gave 47 for 16 * 9 / 3 (47.99999...): a batch of 48
    takes exactly the 9 ms target on the roofline, so B_max is 48."""
    p = _resolved(TWP(l_min_ms=l_min_ms, b0=b0, itl_target_ms=target_ms))
    assert p.B_max == want


def test_explicit_options_win_and_are_clamped_to_the_budget():
    p = _resolved(TWP(cost="paper", max_active=10, h_min=20, h_max=4096, h0=1), b_max=256)
    assert (p.B_max, p.H_min, p.H_max, p.window) == (10, 20, 256, 20)
    # past the budget, max_active and h_min are cut to it as h_max is (B_max was 100000)
    q = _resolved(TWP(cost="paper", max_active=100_000, h_min=600), b_max=256)
    assert (q.B_max, q.H_min, q.H_max) == (256, 256, 256)


def test_the_active_set_fits_a_small_largest_window():
    """h_max below the default B_max: B_max follows it, so the window still holds one decode
    token per active request (H_min had dropped to h_max, under B_max)."""
    p = _resolved(TWP(cost="paper", h_max=10), b_max=512)
    assert (p.B_max, p.H_min, p.H_max) == (10, 10, 10)
    assert _resolved(TWP(cost="paper", h_max=10, max_active=50), b_max=512).B_max == 10
    # measured mode (no cost model: the engine, the server) too; B_max was k_max, 64
    assert _resolved(TWP(h_max=10), b_max=512, k_max=64).B_max == 10
    assert _resolved(TWP(cost="paper"), b_max=512).B_max == 128


def test_measured_mode_records_the_load_knee_it_uses_as_w0():
    """Without a cost model (the engine) B_0 and W_0 are both the largest load observed
    within (1 + eps) l_min; describe() gave W_0 as None while H_min followed the knee."""
    p = _resolved(TWP(), b_max=512)
    assert p.measured
    st = _state(b_max=512)
    r = Request(0, 0, 400, 5)
    t = 0.0
    for duration, decode, prefill in ((0.010, 1, None), (0.011, 1, [(r, 49)]), (0.030, 1, [(r, 199)])):
        p.observe(st, _fb(t, duration, decode=decode, prefill=prefill))
        t += duration
    resolved = p.describe()["resolved"]
    assert resolved["l_min_ms"] == pytest.approx(10)
    assert resolved["B_0"] == resolved["W_0"] == p.H_min == 50  # 11 ms <= 1.2 x 10 ms; 30 ms is not
    # given b0 (and still measuring l_min), W_0 is that B_0
    q = _resolved(TWP(b0=32), b_max=512)
    assert q.measured and q.describe()["resolved"]["W_0"] == 32


def test_measured_mode_floors_the_window_at_max_active_as_cut():
    """A max_active above the server's room is cut to it (B_max); the window's floor, which
    holds one decode token per active request, follows the cut value (it took the option
    as given: with k_max 8, max_active 100 gave B_max 8 but H_min 100)."""
    p = _resolved(TWP(max_active=100), b_max=512, k_max=8)
    assert p.measured and p.B_max == 8
    assert p.H_min == 8 and p.window == 8 and p.describe()["resolved"]["H_min"] == 8
    q = _resolved(TWP(max_active=6), b_max=512, k_max=8)
    assert (q.B_max, q.H_min) == (6, 6)


# ---- the window ------------------------------------------------------------------------
def _hand_policy(**kw):
    opts = dict(cost="paper", h0=64, h_min=16, h_max=128, delta=4, alpha=1.0, itl_target_ms=20, beta=0.5)
    opts.update(kw)
    return _resolved(TWP(**opts), b_max=128)


def test_window_shrinks_when_itl_exceeds_target_down_to_h_min():
    p = _hand_policy()
    st = _state()
    t = 0.0
    for expected in (32, 16, 16):
        p.observe(st, _fb(t, 0.025))  # 25 ms > 20 ms
        t += 0.025
        assert p.window == expected
    assert p.token_limit(st) == 16


def test_window_grows_with_queue_depth_up_to_h_max():
    grow = {}
    for q in (0, 10, 50):
        p = _hand_policy()
        p.observe(_state(waiting=q), _fb(0.0, 0.010))  # 10 ms <= 20 ms
        grow[q] = p.window - 64
    assert grow[0] == pytest.approx(4)  # delta * (1 + ln 1)
    assert grow[10] == pytest.approx(4 * (1 + math.log(11)))
    assert grow[0] < grow[10] < grow[50]
    p = _hand_policy()
    st = _state(waiting=50)
    t = 0.0
    for _ in range(20):
        p.observe(st, _fb(t, 0.010))
        t += 0.010
    assert p.window == 128 and p.token_limit(st) == 128


def test_ewma_decides_not_the_last_sample():
    p = _hand_policy(alpha=0.5, itl_target_ms=25)
    st = _state()
    p.observe(st, _fb(0.0, 0.010))  # l = 10: grow to 68
    p.observe(st, _fb(0.010, 0.030))  # l = 20: grow to 72
    assert p.window == 72 and p.l_ewma == pytest.approx(0.020)
    p.observe(st, _fb(0.040, 0.040))  # l = 30 > 25: shrink
    assert p.window == 36 and p.l_ewma == pytest.approx(0.030)


def test_itl_sample_is_the_gap_since_the_previous_token():
    p = _hand_policy()
    st = _state()
    p.observe(st, _fb(1.000, 0.010))  # no previous step: its duration
    assert p.l_ewma == pytest.approx(0.010)
    p.observe(st, _fb(1.013, 0.010))  # 3 ms of host time in between
    assert p.l_ewma == pytest.approx(0.013)
    p.observe(st, _fb(1.023, 0.004, decode=0))  # a prefill-only step: no sample
    assert p.l_ewma == pytest.approx(0.013)
    p.observe(st, _fb(5.000, 0.010))  # after a step that emitted nothing
    assert p.l_ewma == pytest.approx(0.010)
    r = Request(0, 0, 5, 5)
    p.observe(st, _fb(6.000, 0.010, decode=0, first_tokens=[r]))
    p.observe(st, _fb(6.012, 0.010))  # its next token: 2 ms host + 10 ms
    assert p.l_ewma == pytest.approx(0.012)


def test_window_never_pauses_active_decoders():
    p = _hand_policy(h_min=4, h0=4)
    st = ServerState(Constraints(b_max=128))
    assert p.token_limit(st) == 4
    st._dec = [object()] * 9  # nine active decoders (read through n_decoding)
    assert p.token_limit(st) == 9


# ---- admission -------------------------------------------------------------------------
def _plan(sched, state):
    plan = sched.plan(state)
    return [(r.id, n) for r, n in plan.prefill], plan


def test_admission_stops_at_b_max():
    sched = make_scheduler(
        "sarathi", admission="twp", b_max=64, admission_options=dict(cost="paper", max_active=2, h_min=64)
    )
    st = sched.new_state()
    for i in range(4):
        st.add(Request(i, 0, 4, 3))
    chunks, _ = _plan(sched, st)
    assert chunks == [(0, 4), (1, 4)]


def test_admission_stops_when_the_active_work_cannot_drain_within_the_horizon():
    # window 64, horizon 1 step: admit while K + w(r) <= 64, w = prompt + output - 1
    opts = dict(cost="paper", h_min=64, h_max=64, horizon_steps=1, max_active=100)
    sched = make_scheduler("sarathi", admission="twp", b_max=64, admission_options=opts)
    st = sched.new_state()
    for i, (p, o) in enumerate([(10, 11), (10, 31), (4, 1), (20, 10)]):  # work 20, 40, 4, 29
        st.add(Request(i, 0, p, o))
    chunks, plan = _plan(sched, st)
    assert chunks == [(0, 10), (1, 10), (2, 4)]  # 20 + 40 + 4 = 64; + 29 > 64
    k_at_admission = None
    for step in range(1, 10):
        st.begin_step(plan, step * 10**7)
        st.end_step(plan, (step + 1) * 10**7)
        k = st.outstanding_tokens  # 40, then 2 decode tokens a step
        chunks, plan = _plan(sched, st)
        if chunks:
            k_at_admission = k
            break
        assert k + 29 > 64
    assert k_at_admission == 34 and chunks == [(3, 20)]  # 40, 38, 36 wait; 34 + 29 <= 64


def test_an_idle_server_takes_the_head_whatever_its_size():
    opts = dict(cost="paper", h_min=64, h_max=64, horizon_steps=2, max_active=100)
    sched = make_scheduler("sarathi", admission="twp", b_max=64, admission_options=opts)
    st = sched.new_state()
    st.add(Request(0, 0, 10, 100))  # work 109 (horizon: 2 * 64 = 128)
    st.add(Request(1, 0, 15, 10))  # work 24: 109 + 24 > 128, waits
    chunks, _ = _plan(sched, st)
    assert chunks == [(0, 10)]


def test_waiting_request_with_nothing_running_is_always_admitted():
    sched = make_scheduler(
        "sarathi", admission="twp", b_max=32, admission_options=dict(cost="paper", horizon_steps=0.001, max_active=1)
    )
    st = sched.new_state()
    st.add(Request(0, 0, 500, 500))
    chunks, _ = _plan(sched, st)
    assert chunks == [(0, 32)]


# ---- options ----------------------------------------------------------------------------
def test_registered_and_listed():
    assert ADMISSION_POLICIES["twp"] is TWP
    assert isinstance(make_admission_policy("token-window-pacing"), TWP)
    assert ("admission", "twp") in [(k, n) for k, n, _ in list_policies()]


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"foo": 1}, "unknown option 'foo'"),
        ({"beta": 1.0}, "beta must be a number > 0 and < 1"),
        ({"beta": "abc"}, "beta must be a number"),
        ({"alpha": 0}, "alpha must be"),
        ({"h_min": 0}, "h_min must be an integer >= 1"),
        ({"h_min": 2.5}, "h_min must be an integer"),
        ({"max_active": True}, "max_active must be an integer"),
        ({"h_min": 100, "h_max": 10}, "must not exceed"),
        ({"itl_target_ms": -1}, "itl_target_ms must be a number > 0"),
        ({"horizon_steps": float("inf")}, "horizon_steps"),
        ({"cost": "nope"}, "twp: cost: unknown cost model"),
        # an int past a float's range: refused, not an OverflowError (a traceback on the CLI)
        ({"h_min": 10**400}, r"h_min must be an integer >= 1 and < 1e308, got 1000"),
        ({"delta": 10**400}, r"delta must be a number > 0 and < 1e308"),
        ({"alpha": 10**400}, r"alpha must be a number > 0 and <= 1, got 1000"),
    ],
)
def test_bad_options_are_config_errors(opts, match):
    with pytest.raises(ConfigError, match=match):
        make_admission_policy("twp", **opts)


def test_cli_options_reach_the_policy_and_errors_exit_2(tmp_path, capsys):
    from llmsched.cli import main

    args = [
        "simulate",
        "--admission",
        "twp",
        "--admission-option",
        "itl_target_ms=40",
        "--cost-model",
        "paper",
        "--num-requests",
        "50",
        "--rate",
        "5",
        "--prompt",
        "const:50",
        "--output",
        "const:20",
        "--out",
        str(tmp_path / "o"),
        "--json",
    ]
    assert main(args) == 0
    import json

    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    adm = cfg["scheduler"]["admission"]
    assert adm["name"] == "twp" and adm["itl_target_ms"] == 40 and adm["resolved"]["B_0"] == 128
    assert main(args[:3] + ["--admission-option", "nope=1"] + args[5:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "admission policy 'twp': unknown option 'nope'" in err[0]
    assert main(args[:3] + ["--admission-option", "h_min=1" + "0" * 400] + args[5:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "twp: h_min must be an integer >= 1 and < 1e308" in err[0] and len(err[0]) < 200


# ---- the simulator, end to end ----------------------------------------------------------
BURSTY = dict(
    cost_model="paper",
    arrival="gamma",
    cv=4,
    rate=6,
    prompt="geometric:200",
    output="geometric:100",
    num_requests=1500,
    seed=3,
)


def _spy(sched):
    """Check every plan against the window; returns the list of (load, window, running)."""
    twp = sched.admission
    plan = sched.plan
    seen = []

    def checked(state):
        p = plan(state)
        window = twp.token_limit(state)
        running = state.n_running + sum(1 for r, _ in p.prefill if r.phase == 0)
        seen.append((p.tokens, window, running, int(twp.window), state.n_decoding))
        return p

    sched.plan = checked
    return seen


def test_simulation_loses_nothing_and_every_step_stays_in_the_window():
    t = make_trace(WorkloadSpec.from_dict({k: v for k, v in BURSTY.items() if k != "cost_model"}))
    sched = make_scheduler("sarathi", admission="twp")
    sched.bind_cost_model(make_cost_model("paper"))
    seen = _spy(sched)
    stats = simulate_trace(t, sched, make_cost_model("paper"), fast=False)  # a plan per step
    assert stats.unfinished == 0 and (stats.e2e_ns >= 0).all()
    twp = sched.admission
    assert stats.steps == len(seen)
    for load, limit, running, window, decoding in seen:
        assert decoding <= twp.B_max <= window == limit  # decoders always fit the window
        assert load <= window
        assert running <= twp.B_max
    windows = {w for _, _, _, w, _ in seen}
    assert min(windows) == twp.H_min and max(windows) > twp.H_min  # it moved


def _fast_and_exact(t, cost, bound=True, admission_options=None, **limits):
    """Run `t` step by step and on the fast path; returns, for each, (stats, steps.csv,
    plans made, final window, final ITL EWMA)."""
    runs = {}
    for fast in (False, True):
        sched = make_scheduler("sarathi", admission="twp", admission_options=admission_options, **limits)
        if bound:  # as the simulator's users run it; unbound, TWP measures l_min and B_0
            sched.bind_cost_model(make_cost_model(cost))
        plans = []
        plan = sched.plan
        sched.plan = lambda state, plan=plan, plans=plans: plans.append(1) or plan(state)
        buf = io.StringIO()
        stats = simulate_trace(t, sched, make_cost_model(cost), fast=fast, steps_file=buf)
        runs[fast] = (stats, buf.getvalue(), len(plans), sched.admission.window, sched.admission.l_ewma)
    return runs[False], runs[True]


@pytest.mark.parametrize("bound", [True, False], ids=["cost-model", "measured"])
@pytest.mark.parametrize("cost", ["paper", "profile"])
def test_fast_path_repeats_plans_and_changes_nothing(cost, bound):
    """TWP repeats a plan while its window leaves it unchanged (its feedback replayed step
    by step), with or without a queue: the steps, their times, the window and every
    metric equal the step-by-step run."""
    t = make_trace(WorkloadSpec.from_dict({k: v for k, v in BURSTY.items() if k != "cost_model"}))
    exact_run, fast_run = _fast_and_exact(t, cost, bound)
    (exact, exact_steps, exact_plans, *exact_end), (fast, fast_steps, fast_plans, *fast_end) = exact_run, fast_run
    assert exact_plans == exact.steps and fast_plans < 0.8 * exact_plans  # it did skip steps
    assert fast_steps == exact_steps and fast_end == exact_end
    assert np.array_equal(fast.ttft_ns, exact.ttft_ns) and np.array_equal(fast.e2e_ns, exact.e2e_ns)
    assert fast.steps == exact.steps


class _TWPByStep(TWP):
    """TWP fed through the default `observe_batch`: `observe_repeats`, then `observe` with
    the last step's `StepFeedback` (what the virtual GPU and the engine call)."""

    observe_batch = AdmissionPolicy.observe_batch


@pytest.mark.parametrize("bound", [True, False], ids=["cost-model", "measured"])
@pytest.mark.parametrize("cost", ["paper", "profile"])
def test_observe_batch_equals_observe_repeats_then_observe(cost, bound):
    """TWP's `observe_batch` (one call per batch, no `StepFeedback`) learns exactly what
    `observe_repeats` and `observe` learn from the same batches."""
    t = make_trace(WorkloadSpec.from_dict({k: v for k, v in BURSTY.items() if k != "cost_model"}))
    runs = []
    for admission in (TWP(), _TWPByStep()):
        ref = make_scheduler("sarathi")
        sched = Scheduler(ref.batch, admission, ref.constraints)
        if bound:
            sched.bind_cost_model(make_cost_model(cost))
        buf = io.StringIO()
        stats = simulate_trace(t, sched, make_cost_model(cost), steps_file=buf)
        runs.append((buf.getvalue(), admission.window, admission.l_ewma, admission.meter.prev_end, stats))
    (steps, *end, stats), (by_step, *by_step_end, by_step_stats) = runs
    assert steps == by_step and end == by_step_end
    assert np.array_equal(stats.ttft_ns, by_step_stats.ttft_ns) and np.array_equal(stats.e2e_ns, by_step_stats.e2e_ns)


def test_fast_path_ends_a_repeat_when_the_drained_work_lets_the_head_in():
    """With a fixed 64-token window and a 10-step horizon, the second request waits until
    the first one's remaining decode work has drained under 640 - its own work: while it
    waits the plan repeats, and the batch must end at the step where it gets in."""
    t = trace([(0.0, 10, 400), (0.0, 10, 400), (0.05, 10, 40)])
    opts = {"h_min": 64, "h_max": 64, "horizon_steps": 10}
    (exact, exact_steps, exact_plans, *exact_end), (fast, fast_steps, fast_plans, *fast_end) = _fast_and_exact(
        t, "paper", admission_options=opts
    )
    joined = np.round(t.arrival_s * 1e9).astype(np.int64) + exact.queue_ns
    assert exact.queue_ns[1] > 0 and joined[1] < exact.e2e_ns[0]  # it joined while the first decoded
    assert fast_steps == exact_steps and fast_end == exact_end
    assert np.array_equal(fast.queue_ns, exact.queue_ns) and np.array_equal(fast.e2e_ns, exact.e2e_ns)
    assert fast_plans < exact_plans / 10  # the waits were repeated, not planned step by step


@pytest.mark.parametrize("opts", [{}, {"horizon_steps": 8, "delta": 2}])
def test_serverless_fast_path_equals_step_by_step_with_arrivals_during_repeats(opts):
    """On the serverless platform a request joins the queue during a batch (which the
    arrival then cuts): the steps repeated before it saw the queue as it was when the batch
    began, in the fast path as step by step."""
    from llmsched.sim.serverless import run_serverless
    from llmsched.workload.serverless import load_serverless

    node = {"count": 1, "gpus": 1, "gpu_memory_gb": 80, "dram_gb": 50, "dram_bandwidth_gbps": 20}
    cfg = {
        "cluster": {"remote_bandwidth_gbps": 2.0, "nodes": [{**node, "ssd_gb": 100, "ssd_bandwidth_gbps": 5}]},
        "models": {
            "m": {"weights_gb": 10, "cost_model": "linear:c=5,a=0.05", "b_max": 256, "admission_options": {"twp": opts}}
        },
        "workload": {
            "arrival": "gamma",
            "cv": 3,
            "rate": 6,
            "num_requests": 600,
            "prompt": "geometric:300",
            "output": "geometric:100",
            "seed": 1,
        },
        "platform": {"scheduler": "twp", "init_s": 0, "keep_alive_s": "never"},
    }
    spec = load_serverless(cfg)
    fast, exact = run_serverless(spec), run_serverless(spec, fast=False)
    for k in ("ttft_ns", "e2e_ns", "queue_ns"):
        assert np.array_equal(getattr(fast, k), getattr(exact, k)), k
    assert fast.instances == exact.instances and fast.end_ns == exact.end_ns
    assert fast.instances[0]["steps"] > 5000


def test_twp_lowers_itl_tail_and_spread_against_fcfs_under_bursts():
    fcfs = llmsched.simulate(admission="fcfs", **BURSTY).summary
    twp = llmsched.simulate(admission="twp", **BURSTY).summary
    assert twp["completed"] == fcfs["completed"] == BURSTY["num_requests"]
    # the paper model's step times are a staircase (46.75, 82.22, 117.69, 153.16 ms, ...):
    # FCFS's p99 gap is a full 512-token step, TWP's at least one stair lower
    assert twp["p99_itl_ms"] < fcfs["p99_itl_ms"]
    assert twp["itl_cv"] < 0.6 * fcfs["itl_cv"]
    assert twp["mean_itl_ms"] < fcfs["mean_itl_ms"]
    # the price: prefill is paced, so first tokens come later (the same work gets done)
    assert twp["median_ttft_ms"] > fcfs["median_ttft_ms"]
    assert twp["total_token_throughput"] == pytest.approx(fcfs["total_token_throughput"], rel=0.02)


# ---- same decisions in every driver -----------------------------------------------------
def _recording(sched):
    """Record each plan's shape and each feedback the scheduler observes: `observe` (the
    virtual GPU, the engine) or `observe_batch` (the simulator, here step by step: one step
    a batch, whose `StepFeedback` would have this start and duration)."""
    plans, feedback = [], []
    plan, observe, observe_batch = sched.plan, sched.observe, sched.observe_batch

    def rec_plan(state):
        p = plan(state)
        if not p.is_empty():
            plans.append((p.decode, tuple((r.id, n) for r, n in p.prefill), tuple(r.id for r in p.preempt)))
        return p

    def rec_observe(state, fb):
        feedback.append((fb.start, fb.duration))
        observe(state, fb)

    def rec_observe_batch(state, p, start_ns, durations_ns, count, end_ns, *rest):
        assert count == 1
        feedback.append((start_ns / NS, (end_ns - start_ns) / NS))
        observe_batch(state, p, start_ns, durations_ns, count, end_ns, *rest)

    sched.plan, sched.observe, sched.observe_batch = rec_plan, rec_observe, rec_observe_batch
    return plans, feedback


def _replay(sched, requests, feedback):
    """Drive a fresh state with the recorded step times; returns the plans made."""
    st = sched.new_state()
    for r in requests:
        st.add(r)
    plans = []
    for start, duration in feedback:
        p = sched.plan(st)
        plans.append((p.decode, tuple((r.id, n) for r, n in p.prefill), tuple(r.id for r in p.preempt)))
        st.begin_step(p, int(round(start * 1e9)))
        served = st.decoders[: p.decode]
        st.end_step(p, int(round((start + duration) * 1e9)))
        sched.observe(
            st,
            StepFeedback(
                start, duration, p, st.finished, st.first_tokens, lambda s=served: s, [r for r, _ in st.resumed]
            ),
        )
    assert st.is_idle()
    return plans


def test_two_instances_make_the_same_plans_for_the_same_feedback():
    rows = [(0.0, 300, 40), (0.0, 50, 60), (0.0, 700, 10), (0.0, 20, 90), (0.0, 120, 30)] * 4
    t = trace([(0.0, p, o) for _, p, o in rows])
    a = make_scheduler(
        "sarathi", admission="twp", b_max=256, kv_capacity=3000, admission_options=dict(cost="paper:c=5,a=3,b0=32")
    )
    plans, feedback = _recording(a)
    stats = simulate_trace(t, a, make_cost_model("linear:c=4,a=0.05"), fast=False)  # a plan per step
    assert stats.unfinished == 0 and len(plans) == len(feedback) == stats.steps
    b = make_scheduler(
        "sarathi", admission="twp", b_max=256, kv_capacity=3000, admission_options=dict(cost="paper:c=5,a=3,b0=32")
    )
    reqs = [Request(i, 0, p, o) for i, (_, p, o) in enumerate(rows)]
    assert _replay(b, reqs, feedback) == plans
    assert len({d for d, _, _ in plans}) > 3  # not a trivial schedule


def test_virtual_gpu_runs_the_same_steps_as_the_simulator():
    from llmsched.core.engine_api import SamplingParams
    from llmsched.sim.virtual import VirtualEngine

    rng = np.random.default_rng(4)
    n = 120
    t = trace(list(zip(np.cumsum(rng.exponential(0.01, n)), rng.integers(1, 600, n), rng.integers(1, 120, n))))
    mk = lambda: make_scheduler("sarathi", admission="twp", b_max=256, kv_capacity=6000)  # noqa: E731
    ref = mk()
    ref.bind_cost_model(make_cost_model("paper"))
    ref_plans, ref_fb = _recording(ref)
    stats = simulate_trace(t, ref, make_cost_model("paper"), fast=False)  # a plan per step
    assert stats.unfinished == 0
    sched = mk()
    ve = VirtualEngine(sched, "paper", realtime=False)
    plans, fb = _recording(sched)
    i = 0
    while i < n or ve.has_unfinished_requests():
        if not ve.has_unfinished_requests():
            ve.advance_to(t.arrival_s[i])
        while i < n and int(round(t.arrival_s[i] * 1e9)) <= ve.now_ns():
            ve.add_request(
                str(i),
                range(int(t.prompt[i])),
                SamplingParams(max_tokens=int(t.output[i])),
                arrival_time=float(t.arrival_s[i]),
            )
            i += 1
        ve.step()
    assert plans == ref_plans
    assert fb == ref_fb
    assert sched.admission.window == ref.admission.window


def test_engine_runs_twp_and_its_plans_replay_from_its_feedback():
    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine.engine import LLMEngine

    cfg = tiny_llama_config()
    # no cost model in the engine: l_min and B_0 are measured from its own steps
    eng = LLMEngine(
        cfg, scheduler="sarathi", admission="twp", b_max=64, max_num_seqs=8, num_blocks=64, block_size=16, num_threads=1
    )
    plans, feedback = _recording(eng.scheduler)
    lens = [(30, 6), (5, 12), (70, 4), (12, 9), (3, 15), (44, 7), (9, 10), (25, 5), (60, 8), (2, 11)]
    for i, (p, o) in enumerate(lens):
        eng.add_request(
            str(i),
            [(7 * i + j) % 60 + 1 for j in range(p)],
            SamplingParams(max_tokens=o, temperature=0, ignore_eos=True),
        )
    produced = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            produced[o.request_id] = o.output_tokens
    assert produced == {str(i): o for i, (_, o) in enumerate(lens)}
    twp = eng.scheduler.admission.inner  # under the engine's max_num_seqs cap
    assert isinstance(twp, TWP) and twp.measured and twp._seen_l_min is not None
    assert len(plans) == len(feedback)
    # the same policy, fed the engine's step times, makes the engine's plans
    again = make_scheduler("sarathi", admission="twp", b_max=64, kv_capacity=eng.kv_capacity, max_running=8)
    reqs = [Request(i, 0, p, o) for i, (p, o) in enumerate(lens)]
    assert _replay(again, reqs, feedback) == plans


def test_b_max_is_cut_to_a_running_cap_that_wraps_the_policy():
    """--max-running 8 lets at most 8 requests run: B_max (and the knee B_0) used to stay at
    what the cost model gives under min(b_max, k_max), 128 here, and config.json said so."""
    free = _resolved(TWP(cost="paper"), b_max=512)
    assert free.B_max > 8 and free.B_0 > 8
    capped = make_admission_policy("twp", max_running=8, cost="paper")
    st = ServerState(Constraints(b_max=512))
    capped.token_limit(st)
    inner = capped.inner
    assert inner.B_max == 8 and inner.B_0 == 8
    assert inner.H_min == max(8, inner.W_0)
    res = capped.describe()["resolved"]
    assert res["B_max"] == 8 and capped.describe()["max_running"] == 8
    capped.reset()  # kept across runs
    capped.token_limit(st)
    assert inner.B_max == 8
    # measured mode (no cost model): B_max was k_max, now the running cap
    m = make_admission_policy("twp", max_running=5)
    m.token_limit(st)
    assert m.inner.B_max == 5
    r = llmsched.simulate(admission="twp", max_running=8, cost_model="paper", num_requests=50, seed=1)
    assert r.config["scheduler"]["admission"]["resolved"]["B_max"] == 8
