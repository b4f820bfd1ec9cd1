"""A batch policy written outside llmsched: registered by name, its plans checked against
the step contract (a bad plan hung the simulator, corrupted its state or ran steps beyond
b_max silently), and not repeated by the fast path unless its class says it may be."""

from __future__ import annotations

import re

import pytest

import llmsched
from llmsched.core.errors import ConfigError
from llmsched.policies import BATCH_POLICIES, BatchPolicy, register_batch_policy

RUN = dict(cost_model="paper", prompt="const:100", output="const:10", num_requests=30, rate=2, seed=0)


@pytest.fixture
def register():
    """Register policy classes for one test, then forget them."""
    added = []

    def add(cls):
        register_batch_policy(cls)
        added.append(cls.name)
        return cls

    yield add
    for name in added:
        BATCH_POLICIES.pop(name, None)


def orca_like(name: str, bend=None, **attrs):
    """A policy that plans as Orca does through the Planner, then lets `bend(plan, p)`
    break the contract."""

    def build(self, p):
        p.take_decodes()
        p.take_running_prefills(whole=True)
        p.admit_waiting(whole=True)
        plan = p.plan()
        return bend(plan, p) if bend else plan

    return type(name, (BatchPolicy,), {"name": name, "build": build, **attrs})


def test_a_registered_policy_runs_and_keeps_the_contract(register):
    register(orca_like("mine"))
    res = llmsched.simulate(policy="mine", **RUN)
    ref = llmsched.simulate(policy="orca", **RUN)
    assert res.summary["completed"] == 30
    assert res.summary["mean_ttft_ms"] == ref.summary["mean_ttft_ms"]  # Orca's rule, checked


def _first_chunk(plan, f):
    if plan.prefill:
        r, c = plan.prefill[0]
        plan.prefill[0] = (r, f(r, c))
    return plan


@pytest.mark.parametrize(
    "bend, message",
    [
        (lambda plan, p: None, "build() returned NoneType, not a StepPlan"),
        (lambda plan, p: _first_chunk(plan, lambda r, c: r.prefill_target + 50), "prefill tokens left"),
        (lambda plan, p: _first_chunk(plan, lambda r, c: -3), "a chunk of -3 tokens"),
        (lambda plan, p: _first_chunk(plan, lambda r, c: 2.5), "a chunk of 2.5 tokens"),
        (lambda plan, p: (setattr(plan, "decode", plan.decode + 5), plan)[1], "can decode"),
        (lambda plan, p: (plan.prefill.extend(plan.prefill[:1]), plan)[1], "two prefill chunks"),
        (lambda plan, p: (plan.preempt.extend(list(p.state.waiting)[:1]), plan)[1], "which is not running"),
    ],
)
def test_a_plan_that_breaks_the_contract_is_one_clear_error(register, bend, message):
    register(orca_like("bent", bend))
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        llmsched.simulate(policy="bent", **{**RUN, "rate": 50})
    assert "batch policy 'bent' planned a step the server cannot run" in str(info.value)


def test_take_prefill_of_a_waiting_request_is_refused(register):
    """Planner.take_prefill admitted a waiting request past the admission policy, a running
    cap and the KV check: with max_running=1, four requests ran at once."""

    def build(self, p):
        p.take_decodes()
        for r in [*p.state.prefilling, *p.state.waiting]:
            p.take_prefill(r)
        return p.plan()

    register(type("greedyx", (BatchPolicy,), {"name": "greedyx", "build": build}))
    with pytest.raises(ConfigError, match=r"waiting request \d+ a prefill chunk with take_prefill.*Planner.admit"):
        llmsched.simulate(policy="greedyx", **{**RUN, "max_running": 1, "rate": 1000})


def test_budget_batch_and_kv_limits_are_checked(register):
    def everyone(plan, p):
        for r in list(p.state.waiting):
            if all(q is not r for q, _ in plan.prefill):
                plan.prefill.append((r, r.prefill_target - r.prefilled))
        return plan

    register(orca_like("greedy", everyone))
    many = {**RUN, "rate": 1000}
    with pytest.raises(ConfigError, match="tokens, above b_max = 512"):
        llmsched.simulate(policy="greedy", **many)
    with pytest.raises(ConfigError, match="requests, above k_max = 4"):
        llmsched.simulate(policy="greedy", **many, b_max=100_000, k_max=4)
    with pytest.raises(ConfigError, match="KV slots; .* are free"):
        llmsched.simulate(policy="greedy", **many, b_max=100_000, kv_capacity=1000)


def test_a_stateful_policy_is_not_repeated_unless_it_says_so(register):
    """A policy alternating decode-only and prefill steps: on the fast path (which repeats
    a plan while only token counts change) it ran 1911 steps against 1925 step by step."""

    def build(self, p):
        self.turn = not getattr(self, "turn", False)
        p.take_decodes()
        if self.turn or not p.decode:
            p.take_running_prefills()
            p.admit_waiting()
        return p.plan()

    cls = register(type("alternate", (BatchPolicy,), {"name": "alternate", "build": build}))
    assert cls.repeatable is False and BatchPolicy.repeatable is True
    kw = {**RUN, "num_requests": 200, "rate": 5, "prompt": "uniform:10,600", "output": "uniform:5,200"}
    fast, exact = llmsched.simulate(policy="alternate", **kw), llmsched.simulate(policy="alternate", **kw, fast=False)
    assert fast.summary["steps"] == exact.summary["steps"]
    assert fast.summary["mean_ttft_ms"] == exact.summary["mean_ttft_ms"]
    declared = register(orca_like("declared", repeatable=True))
    assert declared.repeatable is True  # (a plan of the state alone: the class says so)


@pytest.mark.parametrize(
    "name, message",
    [("MyUpper", "use lower case ('myupper')"), ("", "needs a name"), ("sarathi", "a built-in policy's"),
     ("ft", "a built-in policy's"), ("a:b", "without ':'")],
)  # fmt: skip
def test_registering_a_name_that_could_not_work_is_refused(name, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        register_batch_policy(orca_like(name))
    assert name not in BATCH_POLICIES or name in ("sarathi", "ft")


@pytest.mark.parametrize(
    "given, kind, canonical",
    [(" FT ", "batch", "fastertransformer"), ("Sarathi-Serve:chunk=A,B", "batch", "sarathi:chunk=A,B"),
     ("mine", "batch", "mine"), ("Priority", "admission", "spf"), ("ft", "admission", "ft")],
)  # fmt: skip
def test_a_policy_name_is_matched_in_one_form(given, kind, canonical):
    from llmsched.policies import canonical_policy_name, make_admission_policy, make_batch_policy

    assert canonical_policy_name(given, kind) == canonical
    if kind == "admission" and canonical != given:  # a name and its alias build the same policy
        assert type(make_admission_policy(given)) is type(make_admission_policy(canonical))
    if kind == "batch" and canonical in BATCH_POLICIES:
        assert type(make_batch_policy(given)) is BATCH_POLICIES[canonical]


def test_registering_something_else_is_refused():
    from llmsched.policies import register_admission_policy

    with pytest.raises(ConfigError, match="takes a BatchPolicy subclass"):
        register_batch_policy(lambda: None)
    with pytest.raises(ConfigError, match="the factory must be callable"):
        register_admission_policy("x", 5)
    with pytest.raises(ConfigError, match="a built-in policy's"):
        register_admission_policy("fcfs", lambda **kw: None)


def test_a_copy_of_sarathi_runs_as_sarathi_under_preemption_and_spf(register):
    """The planner preempts the newest running request, which (admitted out of arrival
    order by spf) need not be the last decoder: the check said "it decodes a request it
    preempts" of the planner's own plans."""

    def build(self, p):
        p.take_decodes()
        p.take_running_prefills()
        p.admit_waiting()
        return p.plan(decode_first=True)

    register(type("sarathi-copy", (BatchPolicy,), {"name": "sarathi-copy", "build": build, "repeatable": True}))
    kw = dict(cost_model="paper", kv_capacity=3000, admission="spf", prompt="uniform:50,800",
              output="uniform:10,400", num_requests=300, rate=20, seed=1)  # fmt: skip
    mine, ref = llmsched.simulate(policy="sarathi-copy", **kw), llmsched.simulate(policy="sarathi", **kw)
    assert ref.summary["preemptions"] > 0
    for k in ("completed", "steps", "mean_ttft_ms", "preemptions"):
        assert mine.summary[k] == ref.summary[k], k


def test_numpy_counts_and_list_pairs_are_a_valid_plan(register):
    import numpy as np

    def as_numpy(plan, p):
        plan.decode = np.int64(plan.decode)
        plan.prefill[:] = [[r, np.int64(c)] for r, c in plan.prefill]
        return plan

    register(orca_like("numpy-counts", as_numpy))
    res = llmsched.simulate(policy="numpy-counts", **RUN)
    assert res.summary["completed"] == 30
    assert res.summary["mean_ttft_ms"] == llmsched.simulate(policy="orca", **RUN).summary["mean_ttft_ms"]


class _FirstVersion(BatchPolicy):
    name = "versioned"

    def build(self, p):
        p.take_decodes()
        p.take_running_prefills(whole=True)
        p.admit_waiting(whole=True)
        return p.plan()


class _SecondVersion(BatchPolicy):
    name = "versioned"

    def build(self, p):
        p.take_decodes()
        p.take_running_prefills()
        p.admit_waiting()
        return p.plan()


def test_a_resumed_sweep_reruns_a_redefined_policy(register, tmp_path):
    """A sweep's point key covered the configuration, not a registered policy's code: a
    policy redefined under its name was skipped on resume, its old results reported."""
    from llmsched.analysis import run_sweep

    run = {k: v for k, v in RUN.items() if k != "seed"}
    kw = dict(workers=1, progress=False, plots=False, out_dir=tmp_path / "sw", policy="versioned", **run)
    register(_FirstVersion)
    assert run_sweep(None, {"seed": [0]}, **kw).ran == 1
    assert run_sweep(None, {"seed": [0]}, **kw).skipped == 1  # the same code: resumed
    register(_SecondVersion)
    again = run_sweep(None, {"seed": [0]}, **kw)
    assert again.ran == 1 and again.skipped == 0


def test_a_policy_without_build_is_refused_naming_the_class_and_method(register):
    """A subclass with no `build` ran until its first step and raised a bare, empty
    NotImplementedError from `simulate`."""
    from llmsched.policies import Scheduler

    lazy = type("Lazy", (BatchPolicy,), {"name": "lazy"})
    message = "batch policy class 'Lazy' must define build(self, planner)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        register(lazy)  # at registration
    assert "lazy" not in BATCH_POLICIES
    with pytest.raises(ConfigError, match=re.escape(message)):
        Scheduler(lazy())  # a scheduler built by hand: when it is built
    with pytest.raises(ConfigError, match=re.escape("class 'Broken' must define build")):
        register(type("Broken", (BatchPolicy,), {"name": "broken", "build": None}))

    def build(self, p):  # a build that falls through to the base's: at the first call
        return super(type(self), self).build(p)

    register(type("Deferring", (BatchPolicy,), {"name": "deferring", "build": build}))
    with pytest.raises(ConfigError, match=re.escape("batch policy class 'Deferring' must define build(self, planner)")):
        llmsched.simulate(policy="deferring", **RUN)


def test_inline_options_of_a_custom_policy_are_its_init_keywords(register):
    """`policy="name:key=value"` takes the keywords `policy_options` takes (the names of
    `__init__`'s parameters) when the class sets no `option_names`: it said "this policy
    takes no options" while `policy_options={"frac": 0.5}` worked."""
    from llmsched.policies import make_batch_policy

    class Frac(BatchPolicy):
        name = "fracpol"

        def __init__(self, frac=1.0, tag="x"):
            super().__init__()
            self.frac, self.tag = frac, tag

        def build(self, p):
            p.take_decodes()
            p.take_running_prefills()
            p.admit_waiting()
            return p.plan()

    register(Frac)
    pol = make_batch_policy("fracpol:frac=0.5,tag=a,b")
    assert (pol.frac, pol.tag) == (0.5, "a,b")  # a part without a known key continues the value
    res = llmsched.simulate(policy="fracpol:frac=0.5", **RUN)
    assert res.summary["completed"] == 30
    with pytest.raises(ConfigError, match=r"key one of frac, tag, got 'x=1'"):
        make_batch_policy("fracpol:x=1")

    class Kw(Frac):
        name = "kwpol"

        def __init__(self, **opts):
            super().__init__(**opts)

    register(Kw)
    assert make_batch_policy("kwpol:frac=0.25").frac == 0.25
    # a policy without options still says so
    with pytest.raises(ConfigError, match=r"\(none: this policy takes no options\), got 'frac=1'"):
        make_batch_policy("sarathi:frac=1")


def test_an_option_given_inline_and_in_policy_options_must_agree(register):
    """`policy="mine:frac=0.1", policy_options={"frac": 0.25}` ran 0.25 silently, while the
    run's config named the policy "mine:frac=0.1"."""

    class WithFrac(orca_like("withfrac")):
        def __init__(self, frac=0.5):
            self.frac = frac

    register(WithFrac)
    with pytest.raises(ConfigError, match=r"^batch policy 'withfrac:frac=0.1': option 'frac' is given twice"):
        llmsched.simulate(policy="withfrac:frac=0.1", policy_options={"frac": 0.25}, **RUN)
    same = llmsched.simulate(policy="withfrac:frac=0.25", policy_options={"frac": 0.25}, **RUN)  # no clash
    assert same.summary["completed"] == 30
