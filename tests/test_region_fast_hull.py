"""The region's hull and candidates in numpy give exactly the regions, and the adaptive
policy's plans, of the per-point Python code they replaced (kept below as the reference),
and the adaptive policy solves a region once per cost model: at b_max 1,000,000 it took
37-72 s before its first step (docs/performance.md)."""

import math
import time

import numpy as np
import pytest

import llmsched
import llmsched.core.region as region
import llmsched.policies.adaptive as adaptive
from llmsched.core.cost import make_cost_model
from llmsched.core.region import convex_hull, feasible_shape, stability_region


def old_convex_hull(points):
    """The monotone chain as it was: np.unique, then a Python scan over every point."""
    pts = np.unique(np.asarray(points, dtype=float).reshape(-1, 2), axis=0)
    if len(pts) <= 2:
        return pts
    scale = max(1.0, float(np.abs(pts).max()))
    tol = 1e-12 * scale * scale

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2:
                (ox, oy), (ax, ay) = out[-2], out[-1]
                if (ax - ox) * (p[1] - oy) - (ay - oy) * (p[0] - ox) <= tol:
                    out.pop()
                else:
                    break
            out.append((p[0], p[1]))
        return out

    seq = [tuple(p) for p in pts]
    lower = half(seq)
    upper = half(seq[::-1])
    return np.array(lower[:-1] + upper[:-1], dtype=float)


def old_load_only_candidates(cost, b_max, k_max, pmax):
    """The load-only candidates as they were: `load_time` per load, a binary search for all."""
    b = np.arange(1, b_max + 1, dtype=np.int64)
    t = np.array([cost.load_time(int(v)) for v in b], dtype=float)
    ycap = b if k_max is None else np.minimum(b, k_max)
    feas0 = feasible_shape(b, 0, b_max, k_max, pmax)
    lo = np.zeros_like(b)
    hi = np.where(feas0, ycap, 0)
    while np.any(lo < hi):
        active = lo < hi
        mid = (lo + hi + 1) // 2
        ok = feasible_shape(b - mid, mid, b_max, k_max, pmax)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid - 1, hi)
    bb, yy, tt = b[feas0], lo[feas0], t[feas0]
    return np.concatenate([bb, bb - yy]), np.concatenate([np.zeros_like(yy), yy]), np.concatenate([tt, tt])


def old_reach(cost, load, b_max):
    """The adaptive policy's raise of a vertex's load, as it was: one load at a time."""
    t0 = cost.load_time(load) * (1 + 1e-12)
    while load < b_max and cost.load_time(load + 1) <= t0:
        load += 1
    return load


@pytest.fixture
def old_code(monkeypatch):
    """Within `with old_code():` the region runs the reference code."""
    import contextlib

    @contextlib.contextmanager
    def use():
        with monkeypatch.context() as m:
            m.setattr(region, "convex_hull", old_convex_hull)
            m.setattr(region, "_load_only_candidates", old_load_only_candidates)
            m.setattr(adaptive, "_same_time_reach", old_reach)
            yield

    return use


def _same_region(a, b):
    assert np.array_equal(a.vertices, b.vertices)
    assert np.array_equal(a.vertex_shapes, b.vertex_shapes, equal_nan=True)
    assert np.array_equal(a.points, b.points) and np.array_equal(a.shapes, b.shapes)


def test_hull_equals_the_old_scan_on_point_sets():
    rng = np.random.default_rng(7)
    sets = [
        np.zeros((1, 2)),
        np.array([[0, 0], [1, 1], [2, 2]]),
        np.array([[0, 0], [1, 0], [0, 1], [0.2, 0.2], [1, 0]]),
        rng.random((5000, 2)),
        np.round(rng.random((5000, 2)) * 20) / 4,  # a grid: duplicates and collinear runs
        np.column_stack([np.arange(3000.0), np.zeros(3000)]),  # all on a line
    ]
    u = np.linspace(0, 1, 4001)
    sets.append(np.column_stack([np.cos(u), np.sin(u)]) * 1e4)  # every point a vertex
    sets.append(np.column_stack([u, u * u]))  # a convex chain below, a chord above
    sets.append(np.column_stack([u, u * (1 - u) + 1e-14 * rng.random(len(u))]))  # near-collinear noise
    for pts in sets:
        pts = np.vstack([pts, [[0.0, 0.0]]])
        assert np.array_equal(convex_hull(pts), old_convex_hull(pts))


# the repository's load-only models (docs, examples, benchmarks), and one whose every load
# serves at the same rate (near-coincident candidates at the region's corners)
LOAD_ONLY = [
    "const:10",
    "paper",
    "paper:variant=max",
    "paper:c=11,a=35",
    "paper:c=1,a=2",
    "linear:c=20,a=0.1",
    "linear:c=10,a=0.05",
    "linear:c=10,a=0.01",
    "paper:c=0,a=1,b0=1",
]


@pytest.mark.parametrize("spec", LOAD_ONLY)
@pytest.mark.parametrize("b_max", [1, 2, 127, 128, 129, 4096, 20_000])
def test_load_only_regions_equal_the_old_code(old_code, spec, b_max):
    cost = make_cost_model(spec)
    for k_max, pmax in [(None, None), (1, None), (2, None), (16, None), (16, 100), (256, 500), (b_max, None)]:
        new = stability_region(cost, b_max, k_max, max_prefill_per_request=pmax)
        with old_code():
            old = stability_region(cost, b_max, k_max, max_prefill_per_request=pmax)
        _same_region(new, old)


@pytest.mark.parametrize(
    "spec", ["profile:h200-llama-3-8b", "profile:h200-llama-3.2-1b", "profile:h200-llama-3.2-1b,mode=eager"]
)
@pytest.mark.parametrize("b_max", [16, 100, 512, 8192])
def test_profile_regions_equal_the_old_code(old_code, spec, b_max):
    cost = make_cost_model(spec)
    for k_max, pmax in [(None, None), (4, None), (64, 1000)]:
        new = stability_region(cost, b_max, k_max, mean_prompt=900, mean_output=200, max_prefill_per_request=pmax)
        with old_code():
            old = stability_region(cost, b_max, k_max, mean_prompt=900, mean_output=200, max_prefill_per_request=pmax)
        _same_region(new, old)


@pytest.mark.parametrize("spec", LOAD_ONLY + ["profile:h200-llama-3.2-1b"])
@pytest.mark.parametrize("b_max, k_max", [(512, None), (512, 8), (4096, 2), (20_000, 64)])
def test_adaptive_candidates_equal_the_old_code(old_code, spec, b_max, k_max):
    cost = make_cost_model(spec)
    new, _ = adaptive._solve(cost, b_max, k_max, None, 700.0, 120.0)
    with old_code():
        old, _ = adaptive._solve(cost, b_max, k_max, None, 700.0, 120.0)
    assert new == old


@pytest.mark.parametrize("spec", ["const:10", "paper:variant=max", "linear:c=5,a=0.02", "profile:h200-llama-3.2-1b"])
def test_adaptive_runs_equal_the_old_code(old_code, spec):
    kw = dict(policy="adaptive", cost_model=spec, b_max=4096, k_max=8, rate=20, num_requests=150, verdict=False, seed=3)
    new = llmsched.simulate(**kw)
    with old_code():
        old = llmsched.simulate(**kw)
    assert {**new.summary, "wall_s": 0} == {**old.summary, "wall_s": 0}
    assert list(new.request_rows()) == list(old.request_rows())


def test_adaptive_solves_a_region_once_per_cost_model(monkeypatch):
    """The simulator binds its model twice (the scheduler's maker, then the run): the
    second found it solved."""
    solved = []
    real = adaptive._solve

    def counted(cost, *key):
        solved.append((id(cost), *key))
        return real(cost, *key)

    monkeypatch.setattr(adaptive, "_solve", counted)
    llmsched.simulate(policy="adaptive", cost_model="const:10", b_max=512, rate=5, num_requests=5, verdict=False)
    assert len(solved) == len(set(solved)) == 2  # the default paper model at build, then const:10


def test_adaptive_at_a_budget_of_a_million_tokens_starts_in_seconds():
    # 37 s of CPU before the first step on the development VM (three solves, each a Python
    # scan over two million points); about 1.5 s now: the bound leaves room for a busy machine
    t = time.process_time()
    r = llmsched.simulate(
        policy="adaptive",
        cost_model="const:10",
        b_max=1_000_000,
        rate=5,
        num_requests=20,
        prompt="const:100",
        output="const:10",
    )
    assert r.summary["completed"] == 20
    assert time.process_time() - t < 10.0
    assert math.isfinite(r.summary["mean_ttft_ms"])
