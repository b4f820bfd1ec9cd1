"""Adaptive's refits as jobs: a driver that defers them (the engine) gets a pure job and
installs its result later, the region in use planning until then; a driver that does not
(the simulator) has them run inside the step, as before; a region is solved once per key."""

from __future__ import annotations

from helpers import run_steps

from llmsched.core.cost import make_cost_model
from llmsched.policies import make_scheduler

PROFILE = "profile:h200-llama-3.2-1b"


def _counting(monkeypatch):
    import llmsched.core.region as region

    solved = []
    real = region.stability_region

    def counted(*a, **k):
        solved.append((a[1:3], k.get("mean_prompt"), k.get("max_prefill_per_request")))
        return real(*a, **k)

    monkeypatch.setattr(region, "stability_region", counted)
    return solved


def _run_steps(sched, prompts_by_step):
    return run_steps(sched, prompts_by_step, output=3)


def test_a_deferred_refit_is_a_job_and_the_region_in_use_plans_until_it_is_installed(monkeypatch):
    sched = make_scheduler("adaptive", b_max=512, k_max=16)
    sched.bind_cost_model(make_cost_model(PROFILE))  # context-dependent: refits as means move
    policy = sched.batch
    policy.defer_jobs = True
    before = list(policy._cands)
    solved = _counting(monkeypatch)
    _run_steps(sched, [[40]] * 3)
    assert solved == []  # no solve inside a step
    assert policy._cands == before
    key, job = policy.take_job()
    assert policy.take_job() is None  # taken once
    result = job()
    assert len(solved) == 1 and solved[0][1] != 1024.0  # the means seen, not the placeholder
    policy.install_job(key, result)
    assert policy._cands == result[0] != before

    # the same steps on a policy that runs its refits at once (the simulator's) reach the
    # region of the last refit the deferred one asked for
    ref = make_scheduler("adaptive", b_max=512, k_max=16)
    ref.bind_cost_model(make_cost_model(PROFILE))
    _run_steps(ref, [[40]] * 3)
    assert ref.batch._key == policy._key and ref.batch._cands == policy._cands


def test_a_job_from_before_a_reset_is_not_installed():
    sched = make_scheduler("adaptive", b_max=512, k_max=16)
    sched.bind_cost_model(make_cost_model(PROFILE))
    policy = sched.batch
    policy.defer_jobs = True
    fresh = list(policy._cands)
    _run_steps(sched, [[40]] * 2)
    key, job = policy.take_job()
    sched.reset()
    policy.install_job(key, job())
    assert policy._cands == fresh and policy.take_job() is None


def test_a_region_is_solved_once_per_key(monkeypatch):
    # paper model, k_max 2: the region at construction (no cap), then capped at 100 for the
    # first prompt; a second run (reset) needs the same two regions: none is solved again
    solved = _counting(monkeypatch)
    sched = make_scheduler("adaptive", b_max=512, k_max=2)
    _run_steps(sched, [[100, 100]] + [[100]] * 10)
    assert [cap for *_, cap in solved] == [None, 100]
    cands = list(sched.batch._cands)
    sched.reset()
    assert max(load for load, _ in sched.batch._cands) == 512  # the uncapped region again
    _run_steps(sched, [[100, 100]] + [[100]] * 10)
    assert sched.batch._cands == cands
    assert [cap for *_, cap in solved] == [None, 100]


class _Server:
    b_max, k_max = 512, None


def test_a_job_for_a_key_the_means_left_does_not_replace_the_region_in_use():
    """A refit for K1 ran while the means came back to K0 (solved, in use again): its result
    was installed over K0's, which planned on with K1's region until the next refit."""
    from llmsched.policies.adaptive import Adaptive

    p = Adaptive(cost="profile")
    p.bind_constraints(_Server)
    k0, c0 = p._key, list(p._cands)
    p.defer_jobs = True
    p._n, p._sum_p, p._sum_o = 1, 100, 20  # the means move: K1 deferred
    p._compute(512, None, True)
    job = p.take_job()
    p._n, p._sum_p, p._sum_o = 2, 2048, 512  # back to K0's means: its region at once
    p._compute(512, None, True)
    assert p._key == k0 and p._cands == c0
    key, solve = job
    p.install_job(key, solve())
    assert p._key == k0 and p._cands == c0  # K0's still
    assert key[1] in p._regions  # K1's kept for when its means come back


def test_a_dropped_job_is_solved_again_when_its_key_is_wanted():
    """The engine's close() dropped a running job: the policy kept its key as the one in
    use and never solved it (planning on the earlier region for good)."""
    from llmsched.policies.adaptive import Adaptive

    p = Adaptive(cost="profile")
    p.bind_constraints(_Server)
    p.defer_jobs = True
    p._n, p._sum_p, p._sum_o = 1, 100, 20
    p._compute(512, None, True)
    key, _ = p.take_job()
    p.drop_job(key)
    p._compute(512, None, True)  # the same means: the key wanted again
    again = p.take_job()
    assert again is not None and again[0][1] == key[1]


def test_the_engines_close_hands_a_running_job_back():
    from types import SimpleNamespace

    from llmsched.engine.engine import LLMEngine

    dropped = []
    batch = SimpleNamespace(drop_job=dropped.append)
    engine = SimpleNamespace(_job=(batch, "k", None), _pool=None)
    LLMEngine.close(engine)
    assert dropped == ["k"] and engine._job is None
