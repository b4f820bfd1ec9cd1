"""Hand-computed step compositions: constant 10 ms steps, tiny budgets.

Requests are (arrival_s, prompt, output). Entries list a step's work in plan order:
`ID:pN` is N prefill tokens of request ID, `ID:d` one decode token."""

import pytest
from helpers import entries, run

# A: 6-token prompt, 3 outputs; B: 2-token prompt, 2 outputs; C arrives at 15 ms, 4-token prompt, 1 output.
ABC = [(0.0, 6, 3), (0.0, 2, 2), (0.015, 4, 1)]


def test_sarathi_decodes_first_then_fills_with_prefill():
    res, steps = run(ABC, "sarathi", b_max=4)
    assert entries(steps) == ["0:p4", "0:p2 1:p2", "0:d 1:d 2:p2", "0:d 2:p2"]
    assert [s["start"] for s in steps] == pytest.approx([0, 0.01, 0.02, 0.03])
    assert list(res.ttft_s) == pytest.approx([0.02, 0.02, 0.04 - 0.015])
    assert list(res.e2e_s) == pytest.approx([0.04, 0.03, 0.025])


def test_orca_prefill_first_starves_decoders():
    res, steps = run(ABC, "orca", b_max=4)
    assert entries(steps) == ["0:p4", "0:p2 1:p2", "2:p4", "0:d 1:d", "0:d"]
    assert list(res.e2e_s) == pytest.approx([0.05, 0.04, 0.015])


def test_fastertransformer_prefill_waits_for_decoders():
    res, steps = run(ABC, "fastertransformer", b_max=4)
    assert entries(steps) == ["0:p4", "0:p2 1:p2", "0:d 1:d", "0:d", "2:p4"]
    assert res.ttft_s[2] == pytest.approx(0.05 - 0.015)


def test_vllm_whole_prompts_prefill_only_and_long_prompt_alone():
    # A's prompt (6) exceeds b_max (4): it runs alone, chunked; B's whole prompt fills the rest.
    res, steps = run(ABC, "vllm", b_max=4)
    assert entries(steps) == ["0:p4", "0:p2 1:p2", "2:p4", "0:d 1:d", "0:d"]
    assert [s["decode"] == 0 or s["prefill"] == 0 for s in steps] == [True] * 5


def test_vllm_never_splits_a_prompt_that_fits():
    # B (3 tokens) does not fit whole in the 1 token left after A (3): it waits a step.
    res, steps = run([(0.0, 3, 2), (0.0, 3, 1)], "vllm", b_max=4)
    assert entries(steps) == ["0:p3", "1:p3", "0:d"]


def test_vllm_chunks_a_prompt_by_the_admissions_token_limit():
    """The step's budget is min(b_max, the admission's token limit): under TWP's window of
    32 a 100-token prompt cannot fit whole, so it runs alone in chunks of the window (the
    docs said only a prompt longer than b_max is split)."""
    from llmsched.core.constraints import Constraints
    from llmsched.core.request import Request
    from llmsched.policies import TWP, VanillaVLLM
    from llmsched.policies.base import Scheduler

    sched = Scheduler(VanillaVLLM(), TWP(l_min_ms=10, b0=8, h_min=32, h0=32), Constraints(b_max=512))
    state = sched.new_state()
    state.add(Request(0, 0, 100, 3))
    plan = sched.plan(state)
    assert [(r.id, n) for r, n in plan.prefill] == [(0, 32)] and plan.decode == 0


def test_kfcfs_same_as_sarathi_under_fcfs():
    res, steps = run(ABC, "kfcfs", b_max=4)
    assert entries(steps) == ["0:p4", "0:p2 1:p2", "0:d 1:d 2:p2", "0:d 2:p2"]


def test_kfcfs_serves_the_oldest_first_under_shortest_prompt_admission():
    rows = [(0.0, 6, 3), (0.0, 2, 3)]
    _, sar = run(rows, "sarathi", admission="spf", b_max=4)
    _, kf = run(rows, "kfcfs", admission="spf", b_max=4)
    assert entries(sar) == ["1:p2 0:p2", "1:d 0:p3", "1:d 0:p1", "0:d", "0:d"]
    # K-FCFS: A is older than decoder B, so A's prefill takes the budget first.
    assert entries(kf) == ["1:p2 0:p2", "0:p4", "0:d 1:d", "0:d 1:d"]


def test_kfcfs_walks_running_requests_by_arrival_and_the_queue_in_admission_order():
    # spf admits B (1 token) and D (2) before the older C (30) and A (40): decoders B and
    # D, prefill C, waiting A. Running requests go by arrival (B, C, then D: D is younger
    # than C's prefill, which fills the budget), the queue in spf order, so the oldest, A,
    # waits for the budget C leaves; once A runs it is the oldest and takes it all.
    rows = [(0.0, 40, 1), (0.0, 1, 5), (0.0, 30, 1), (0.0, 2, 5)]
    _, kf = run(rows, "kfcfs", admission="spf", b_max=16)
    assert entries(kf)[:4] == ["1:p1 3:p2 2:p13", "1:d 2:p15", "1:d 2:p2 0:p13", "0:p16"]


def test_kmax_caps_distinct_requests():
    rows = [(0.0, 1, 3), (0.0, 1, 3), (0.0, 1, 3)]
    _, steps = run(rows, "sarathi", b_max=8, k_max=2)
    assert entries(steps) == ["0:p1 1:p1", "0:d 1:d", "0:d 1:d", "2:p1", "2:d", "2:d"]
    assert max(s["batch"] for s in steps) == 2


def test_kv_preemption_evicts_newest_and_recomputes():
    rows = [(0.0, 4, 4), (0.0, 4, 4)]
    res, steps = run(rows, "sarathi", b_max=8, kv_capacity=10)
    # B is preempted after 2 tokens and recomputes prompt + 2 tokens = 6, emitting its 3rd.
    assert entries(steps) == ["0:p4 1:p4", "0:d 1:d", "1:x 0:d", "0:d", "1:p6", "1:d"]  # 1:x: 1 preempted
    assert list(res.stats.preemptions) == [0, 1]
    assert res.summary["completed"] == 2


@pytest.mark.parametrize("fast", [True, False])
def test_a_step_that_preempts_admits_no_one(fast):
    # A and B hold all 10 KV slots at 20 ms; C (3 tokens) arrived at 15 ms. The decoders
    # need 2 slots: B (newest) is preempted and A decodes. B's freed slots are not C's:
    # B comes back first, when A's end leaves room for its 6-token recompute.
    rows = [(0.0, 4, 4), (0.0, 4, 4), (0.015, 3, 1)]
    res, steps = run(rows, "vllm", b_max=8, kv_capacity=10, fast=fast)
    assert entries(steps) == ["0:p4 1:p4", "0:d 1:d", "1:x 0:d", "0:d", "1:p6", "2:p3", "1:d"]
    assert list(res.stats.preemptions) == [0, 1, 0]
    _, steps = run(rows, "sarathi", b_max=8, kv_capacity=10, fast=fast)
    assert entries(steps)[2:5] == ["1:x 0:d", "0:d", "1:p6 2:p2"]  # not '0:d 2:p3' while B waits
    # Orca: one slot free at 10 ms, C needs 2; B is preempted for decoder A, A decodes
    _, steps = run([(0.0, 1, 4), (0.0, 2, 2), (0.0, 2, 1)], "orca", b_max=2, kv_capacity=5, fast=fast)
    assert entries(steps)[:4] == ["0:p1 1:p1", "1:p1 0:d", "1:x 0:d", "0:d"]


def test_kfcfs_serves_running_requests_oldest_first_under_kv_pressure(monkeypatch):
    # whatever was preempted, the running requests a K-FCFS step serves are the oldest ones
    import random

    from llmsched.core.request import WAITING
    from llmsched.policies.kfcfs import KFCFS

    build, bad, steps_seen = KFCFS.build, [], []

    def checked(self, p):
        plan = build(self, p)
        state, victims = p.state, {v.id for v in p.preempt}
        decoders = [r for r in state.decoders if r.id not in victims]
        served = {r.id for r in decoders[: plan.decode]} | {r.id for r, _ in plan.prefill if r.phase != WAITING}
        running = sorted(decoders + [r for r in state.prefilling if r.id not in victims], key=lambda r: r.key)
        flags = [r.id in served for r in running]
        steps_seen.append(bool(victims))
        if flags != sorted(flags, reverse=True):
            bad.append(entries)
        return plan

    monkeypatch.setattr(KFCFS, "build", checked)
    rng = random.Random(5)
    for _ in range(300):
        rows = sorted((round(rng.uniform(0, 0.05), 3), rng.randint(1, 25), rng.randint(1, 12)) for _ in range(8))
        cap = max(p + o - 1 for _, p, o in rows) + rng.randint(0, 20)
        run(rows, "kfcfs", admission="spf", b_max=rng.randint(2, 4), kv_capacity=cap)
    assert not bad and sum(steps_seen) > 100  # preempting steps were checked too


def test_admission_waits_for_kv_room():
    rows = [(0.0, 6, 2), (0.0, 6, 2)]
    _, steps = run(rows, "sarathi", b_max=16, kv_capacity=8)
    assert entries(steps) == ["0:p6", "0:d", "1:p6", "1:d"]


def test_paper_cost_model_times_steps():
    # t(b) = 11.28 + 35.47 * ceil(b / 128) ms
    _, steps = run([(0.0, 200, 2)], "sarathi", cost="paper", b_max=256)
    assert [s["duration"] for s in steps] == pytest.approx([0.01128 + 2 * 0.03547, 0.01128 + 0.03547])


def test_output_of_one_token_ends_at_prefill():
    res, steps = run([(0.0, 5, 1)], "sarathi", b_max=4)
    assert entries(steps) == ["0:p4", "0:p1"]
    assert res.ttft_s[0] == pytest.approx(0.02) and res.e2e_s[0] == pytest.approx(0.02)
    assert res.itl.count == 0


def test_running_cap_holds_back_admission():
    rows = [(0.0, 2, 3), (0.0, 2, 3), (0.0, 2, 1)]
    _, steps = run(rows, "sarathi", b_max=16, max_running=2)
    # the third request waits until one of the first two finishes
    assert entries(steps) == ["0:p2 1:p2", "0:d 1:d", "0:d 1:d", "2:p2"]


def test_shortest_prompt_first_admission_order():
    rows = [(0.0, 8, 1), (0.0, 3, 1), (0.0, 5, 1)]
    _, steps = run(rows, "sarathi", admission="spf", b_max=4)
    assert entries(steps) == ["1:p3 2:p1", "2:p4", "0:p4", "0:p4"]


def test_planner_calls_only_the_admission_methods_a_policy_overrides():
    from llmsched.core.constraints import Constraints
    from llmsched.core.request import Request
    from llmsched.policies.admission import FCFS
    from llmsched.policies.base import AdmissionPolicy, Scheduler
    from llmsched.policies.sarathi import Sarathi

    class ThreeTokens(AdmissionPolicy):
        def token_limit(self, state):
            return 3

    class OneAtATime(AdmissionPolicy):
        def may_admit(self, state, r, planner):
            return planner.n_admitted == 0

    def first_plan(admission):
        sched = Scheduler(Sarathi(), admission, Constraints(b_max=8))
        st = sched.new_state()
        for i in range(3):
            st.add(Request(i, 0, 2, 1))
        return sched, st, [(r.id, n) for r, n in sched.plan(st).prefill]

    # overrides cap the budget, or refuse the second admission
    assert first_plan(ThreeTokens())[2] == [(0, 2), (1, 1)]
    assert first_plan(OneAtATime())[2] == [(0, 2)]
    # a wrapper set on the instance after the scheduler was built is the one called
    sched, st, _ = first_plan(OneAtATime())
    calls = []
    inner = sched.admission.may_admit
    sched.admission.may_admit = lambda state, r, planner: calls.append(r.id) or inner(state, r, planner)
    assert [(r.id, n) for r, n in sched.plan(st).prefill] == [(0, 2)]
    assert calls == [0, 1]
    # inherited defaults: no cap, everyone admitted while the budget lasts
    assert first_plan(FCFS())[2] == [(0, 2), (1, 2), (2, 2)]
