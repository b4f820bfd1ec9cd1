"""Step timing in integer ns: the profile model's fast paths (`step_timing`: `step_ns`
and `time_steps`) give exactly `int(round(step_time(...) * NS))`, step by step; models
without them (or overriding `step_time`) go through `step_time`."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from helpers import trace

from llmsched.core.cost import CostModel, LinearCostModel, StepTimer
from llmsched.core.errors import ConfigError
from llmsched.core.profile import ProfileCostModel, load_profile, shipped_profiles
from llmsched.core.request import NS
from llmsched.policies import make_scheduler
from llmsched.sim.simulator import simulate_trace

SPECS = [name + opts for name in shipped_profiles() for opts in ("", ",mode=eager", ",mode=graph,overlap=0")]


def reference_ns(model, pf, m, dctx, chunks, sampled) -> int:
    return int(round(model.step_time(pf, m, dctx, chunks, sampled) * NS))


def reference_steps(model, j0, t, limit, upto, pf, m, dctx, chunks, rems) -> tuple[list[int], int]:
    """Steps j0.. of a repeated plan, as the simulator defines them, through `step_time`."""
    durs, j = [], j0
    while j < upto and t < limit:
        sampled = m + sum(1 for (c, _), rem in zip(chunks, rems) if rem - j * c == c)
        step_chunks = [(c, ctx + j * c) for c, ctx in chunks]
        d = reference_ns(model, pf if chunks else 0, m, dctx + j * m, step_chunks, sampled)
        durs.append(d)
        t += d
        j += 1
    return durs, t


def random_shape(rng: random.Random):
    big = rng.random() < 0.15  # past the measured sizes too (tails, extrapolation)
    m = rng.choice([0, 1, 2, rng.randint(1, 64), rng.randint(1, 600), rng.randint(1, 20000 if big else 512)])
    chunks = []
    for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3, 5])):
        c = rng.choice([1, rng.randint(1, 512), rng.randint(1, 40000 if big else 4096)])
        ctx = rng.choice([0, rng.randint(0, 4096), rng.randint(0, 400000 if big else 32768)])
        chunks.append((c, ctx))
    if not m and not chunks:
        m = rng.randint(1, 300)
    mean = rng.choice([rng.randint(0, 256), rng.randint(0, 8192), rng.randint(0, 400000 if big else 65536)])
    dctx = m * mean + (rng.randint(0, m - 1) if m else 0)
    return sum(c for c, _ in chunks), m, dctx, chunks


@pytest.mark.parametrize("spec", SPECS)
def test_step_ns_is_step_time_rounded(spec):
    model = load_profile(spec)
    timer = StepTimer(model)
    assert "ProfileCostModel.step_timing.<locals>.step_ns" == timer.step_ns.__qualname__  # the fast path
    rng = random.Random(spec)
    for _ in range(3000):
        pf, m, dctx, chunks = random_shape(rng)
        sampled = rng.choice([m, m + len(chunks), rng.randint(0, m + len(chunks)), rng.randint(1, 30000)])
        assert timer.step_ns(pf, m, dctx, chunks, sampled) == reference_ns(model, pf, m, dctx, chunks, sampled)


@pytest.mark.parametrize("spec", SPECS)
def test_time_steps_equals_step_by_step_step_time(spec):
    model = load_profile(spec)
    timer = StepTimer(model)
    assert "ProfileCostModel.step_timing.<locals>.time_steps" == timer.time_steps.__qualname__  # the fast path
    rng = random.Random("batch " + spec)
    for _ in range(600):
        pf, m, dctx, chunks = random_shape(rng)
        j0 = rng.choice([0, 1, rng.randint(0, 40)])
        upto = j0 + rng.choice([1, 2, rng.randint(1, 50), rng.randint(1, 400)])
        # chunks that complete their prefill at some step of the batch (or not in it)
        rems = [c * (rng.randint(j0, upto + 2) + 1) + rng.choice([0, 0, rng.randint(0, c - 1)]) for c, _ in chunks]
        t = rng.randint(0, 10**12)
        limit = rng.choice([2**62, t + rng.randint(1, 10**9)])
        prior = [rng.randint(1, 10**8) for _ in range(j0)]
        durs = list(prior)
        end = timer.time_steps(durs, t, limit, upto, pf, m, dctx, chunks, rems)
        want, want_end = reference_steps(model, j0, t, limit, upto, pf, m, dctx, chunks, rems)
        assert durs == prior + want
        assert end == want_end
        # timed in two calls (as `extend` does), the same steps
        if len(want) > 1:
            k = rng.randint(1, len(want) - 1)
            durs = list(prior)
            mid = timer.time_steps(durs, t, limit, j0 + k, pf, m, dctx, chunks, rems)
            assert durs == prior + want[:k]
            assert timer.time_steps(durs, mid, limit, upto, pf, m, dctx, chunks, rems) == want_end
            assert durs == prior + want


def test_long_decode_batches_cross_context_breakpoints():
    for name in shipped_profiles():
        model = load_profile(name)
        timer = StepTimer(model)
        for m in (1, 3, 64, 255):
            for dctx in (0, m * 100 + 1, m * 1000):
                durs: list[int] = []
                end = timer.time_steps(durs, 0, 2**62, 5000, 0, m, dctx, [], [])
                want, want_end = reference_steps(model, 0, 0, 2**62, 5000, 0, m, dctx, [], [])
                assert (durs, end) == (want, want_end)


class Doubled(ProfileCostModel):
    """A user's variant of the profile model: its own `step_time`."""

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return 2 * super().step_time(prefill_tokens, decode_tokens, decode_context, chunks, sampled)


def test_a_model_overriding_step_time_is_timed_through_it():
    base = load_profile("h200-llama-3-8b")
    model = Doubled.__new__(Doubled)
    model.__dict__.update(base.__dict__)
    assert model.step_timing() is None
    timer = StepTimer(model)
    args = (128, 16, 16 * 3000, [(128, 500)], 17)
    assert timer.step_ns(*args) == reference_ns(model, *args)
    assert timer.step_ns(*args) != StepTimer(base).step_ns(*args)
    durs: list[int] = []
    timer.time_steps(durs, 0, 2**62, 5, 0, 16, 16 * 3000, [], [])
    assert durs == reference_steps(model, 0, 0, 2**62, 5, 0, 16, 16 * 3000, [], [])[0]


class UserModel(CostModel):
    name = "user"

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return 0.001 + 1e-6 * (prefill_tokens + decode_tokens) + 1e-9 * decode_context + 1e-7 * sampled


class DuckModel:
    """Not a CostModel subclass: no fast-path methods at all."""

    load_only = False

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return 0.002 + 1e-6 * decode_tokens


@pytest.mark.parametrize("model", [UserModel(), DuckModel()])
def test_models_without_fast_paths_use_step_time(model):
    timer = StepTimer(model)
    assert timer.step_ns(0, 4, 400, [], 4) == reference_ns(model, 0, 4, 400, [], 4)
    durs: list[int] = []
    end = timer.time_steps(durs, 0, 2**62, 6, 64, 4, 400, [(64, 10)], [128])
    assert (durs, end) == reference_steps(model, 0, 0, 2**62, 6, 64, 4, 400, [(64, 10)], [128])


def test_load_only_models_time_batches_too():
    model = LinearCostModel(c_ms=5, a_ms=0.01)
    timer = StepTimer(model)
    durs: list[int] = []
    timer.time_steps(durs, 0, 2**62, 3, 0, 10, 100, [], [])
    assert durs == [timer.load_ns(10)] * 3


class Zero(CostModel):
    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return 0.0


def zero_profile() -> ProfileCostModel:
    tables = {
        "linear": [(1, "eager", 0.0), (1024, "eager", 0.0)],
        "lm_head": [(1, 0.0), (1024, 0.0)],
        "decode_attn": [(1, 0, 0.0), (1, 4096, 0.0)],
        "prefill_attn": [(1, 0, 0.0), (1024, 0, 0.0)],
    }
    return ProfileCostModel(tables, 4)


@pytest.mark.parametrize("model", [Zero(), zero_profile()])
def test_a_non_positive_step_time_raises(model):
    timer = StepTimer(model)
    with pytest.raises(ConfigError, match="non-positive step time at load 12"):
        timer.step_ns(8, 4, 40, [(8, 0)], 5)
    with pytest.raises(ConfigError, match="non-positive step time at load 4"):
        timer.time_steps([], 0, 2**62, 3, 0, 4, 40, [], [])
    with pytest.raises(ConfigError, match="non-positive step time at load 12"):
        timer.time_steps([], 0, 2**62, 3, 8, 4, 40, [(8, 0)], [64])


class Delegate(CostModel):
    """The profile model's `step_time` behind a plain CostModel: the generic path."""

    def __init__(self, inner):
        self.inner = inner

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return self.inner.step_time(prefill_tokens, decode_tokens, decode_context, chunks, sampled)


@pytest.mark.parametrize(
    "policy,admission,limits",
    [("sarathi", "fcfs", {"b_max": 256}), ("orca", "fcfs", {}), ("sarathi", "twp", {"kv_capacity": 60000})],
)
def test_simulations_time_steps_the_same_with_and_without_the_fast_paths(policy, admission, limits):
    rng = np.random.default_rng(7)
    n = 400
    arrivals = np.sort(rng.uniform(0, 40, n))
    rows = list(zip(arrivals, rng.integers(1, 3000, n), rng.integers(1, 400, n)))
    model = load_profile("h200-llama-3.2-1b")
    out = []
    for cost in (model, Delegate(model)):
        for fast in (True, False):
            buf = io.StringIO()
            sched = make_scheduler(policy, admission=admission, **limits)
            sched.bind_cost_model(cost)
            simulate_trace(trace(rows), sched, cost, fast=fast, steps_file=buf)
            out.append(buf.getvalue())
    assert out[0] == out[2] and out[1] == out[3]
    assert out[0].count("\n") > 1000
