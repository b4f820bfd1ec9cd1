import itertools
import json
import math
import time

import numpy as np
import pytest

from llmsched.analysis.figures import plot_region
from llmsched.core.cost import CostModel
from llmsched.core.errors import ConfigError
from llmsched.theory import convex_hull, feasible_shape, stability_region, token_capacity, workload_point


class TableModel(CostModel):
    """Load-only model with an irregular (non-monotone b/t) table, b = 1..8."""

    name = "table"
    load_only = True
    T = {1: 1.0, 2: 1.1, 3: 1.2, 4: 2.5, 5: 2.6, 6: 2.7, 7: 4.0, 8: 4.1}

    def load_time(self, b):
        return self.T[b]

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return self.load_time(prefill_tokens + decode_tokens)


class TinyCtx(CostModel):
    """Context-dependent: decode tokens cost more than prefill tokens."""

    name = "tinyctx"

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return 1.0 + 0.1 * prefill_tokens + 0.3 * decode_tokens + 0.001 * decode_context + 0.01 * sampled


def brute_points(cost, b_max, k_max, pmax=None, means=(None, None)):
    from llmsched.theory import representative_step_time

    pts = []
    for x in range(b_max + 1):
        for y in range(b_max + 1):
            if x + y == 0 or x + y > b_max:
                continue
            if k_max is not None:
                preq = 0 if x == 0 else (1 if pmax is None else math.ceil(x / pmax))
                if y > k_max or y + preq > k_max:
                    continue
            t = representative_step_time(cost, x, y, *means)
            pts.append((x / t, y / t))
    return np.array(pts)


def brute_max_scale(pts, p, d):
    """Exact for 2-D: the boundary point on the ray is a combination of <= 2 points."""
    best = 0.0
    r = np.array([p, d], dtype=float)
    for v in pts:  # single points on the ray
        if abs(v[0] * d - v[1] * p) < 1e-12 * max(1.0, abs(v).max()):
            best = max(best, float(v @ r / (r @ r)))
    for vi, vj in itertools.combinations(pts, 2):
        m = np.column_stack([vi, vj])
        if abs(np.linalg.det(m)) < 1e-14:
            continue
        a, b = np.linalg.solve(m, r)  # r = a vi + b vj; s r = (s a) vi + (s b) vj
        if a >= -1e-12 and b >= -1e-12 and a + b > 0:
            best = max(best, 1.0 / (a + b))
    return best


DIRECTIONS = [(1, 0), (0, 1), (1, 1), (3, 1), (1, 5), (200, 100), (0.2, 7)]


@pytest.mark.parametrize("k_max,pmax", [(3, None), (3, 2), (None, None), (1, None), (5, 3)])
def test_lp_matches_brute_force_load_only(k_max, pmax):
    cost = TableModel()
    reg = stability_region(cost, 8, k_max, max_prefill_per_request=pmax)
    pts = brute_points(cost, 8, k_max, pmax)
    for p, d in DIRECTIONS:
        s = reg.max_scale(p, d)
        assert s == pytest.approx(brute_max_scale(pts, p, d), rel=1e-7, abs=1e-12)
        if s > 0:
            assert reg.contains(0.999 * s * p, 0.999 * s * d)
            assert not reg.contains(1.001 * s * p, 1.001 * s * d)
    # every feasible point is inside, and the hull vertices are candidate points
    for v in pts:
        assert reg.contains(*v, tol=1e-9)


def test_lp_matches_brute_force_context_model():
    cost = TinyCtx()
    means = (4.0, 3.0)
    reg = stability_region(cost, 8, 3, mean_prompt=means[0], mean_output=means[1])
    assert reg.exact
    pts = brute_points(cost, 8, 3, None, means)
    for p, d in DIRECTIONS:
        assert reg.max_scale(p, d) == pytest.approx(brute_max_scale(pts, p, d), rel=1e-7)


def test_dense_random_combinations_never_beat_lp():
    cost = TableModel()
    reg = stability_region(cost, 8, 3)
    pts = brute_points(cost, 8, 3)
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(len(pts) + 1), size=20000)[:, :-1]  # last weight: the origin
    combos = w @ pts
    for c in combos[::50]:
        assert reg.contains(*c, tol=1e-9)
    # points along direction (1, 1): the best random combination is below the LP scale
    s = reg.max_scale(1, 1)
    on_ray = combos[np.abs(combos[:, 0] - combos[:, 1]) < 1e-3]
    assert on_ray.max() <= s * (1 + 1e-6)


def test_feasibility_rule():
    assert feasible_shape(0, 3, 8, 3)  # pure decode, 3 requests
    assert not feasible_shape(1, 3, 8, 3)  # + one prefill request = 4 > 3
    assert feasible_shape(5, 2, 8, 3)
    assert not feasible_shape(5, 2, 8, 3, max_prefill_per_request=2)  # 3 prefill requests
    assert feasible_shape(4, 1, 8, 3, max_prefill_per_request=2)
    assert not feasible_shape(6, 3, 8, None)  # over the budget
    assert not feasible_shape(0, 0, 8, None)
    assert feasible_shape(0, 8, 8, None)


def test_no_k_max_region_is_theorem_2_triangle():
    for spec, b_max in [("paper", 512), ("paper", 8192), ("linear:c=10,a=0.05", 1024)]:
        reg = stability_region(spec, b_max)
        cap = token_capacity(spec, b_max)
        assert reg.max_throughput == pytest.approx(cap)
        for p, d in DIRECTIONS:
            assert reg.max_scale(p, d) * (p + d) == pytest.approx(cap, rel=1e-9)


def test_paper_k_max_vertices_by_hand():
    reg = stability_region("paper", 512, 16)
    shapes = {(int(x), int(y)) for x, y, _ in reg.vertex_shapes}
    assert shapes == {(0, 0), (512, 0), (497, 15), (113, 15), (0, 16)}
    t128, t512 = 0.01128 + 0.03547, 0.15316
    assert reg.max_decode_rate == pytest.approx(16 / t128)
    assert reg.max_prefill_rate == pytest.approx(512 / t512)
    # the decode-heavy workload point is outside at 4 req/s, inside at 3
    assert not reg.contains(*workload_point(4.0, 200, 101))
    assert reg.contains(*workload_point(3.0, 200, 101))
    assert reg.max_scale(0, 0) == math.inf
    assert reg.max_scale(-1, 1) == 0.0 and not reg.contains(-1, 1)
    json.dumps(reg.to_dict())


def test_large_enumeration_is_fast():
    t0 = time.perf_counter()
    reg = stability_region("paper", 8192, 1024)
    s = reg.critical_rate(1000, 200)
    assert time.perf_counter() - t0 < 3.0
    assert s > 0 and reg.exact


def test_grid_sampling_is_inner_and_close():
    cost = TinyCtx()
    kw = dict(mean_prompt=50.0, mean_output=20.0)
    exact = stability_region(cost, 256, 32, **kw)
    assert exact.exact
    approx = stability_region(cost, 256, 32, grid=17, **kw)
    assert not approx.exact
    for p, d in DIRECTIONS:
        se, sa = exact.max_scale(p, d), approx.max_scale(p, d)
        assert sa <= se * (1 + 1e-9)
        assert sa >= 0.97 * se


def test_convex_hull_degenerate():
    assert len(convex_hull(np.array([[0, 0], [1, 1], [2, 2]]))) == 2
    h = convex_hull(np.array([[0, 0], [1, 0], [0, 1], [0.2, 0.2], [1, 0]]))
    assert len(h) == 3
    reg = stability_region("const:10", 1, 1)  # only (1, 0) and (0, 1)
    assert reg.max_scale(1, 1) == pytest.approx(50.0)


def test_plot_region(tmp_path):
    reg = stability_region("paper", 512, 16)
    out = plot_region(reg, workload_point(3.0, 200, 101), tmp_path / "r.png")
    data = (tmp_path / "r.png").read_bytes()
    assert out.endswith("r.png") and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_representative_step_of_means_is_the_constant_length_mix():
    """Means given instead of a workload are timed as lengths that do not vary at them (a
    `LengthMix` of one prompt and one output): a window across two prompts pays two
    chunks and x / P completions are a time-share. Until 2026-12-03 a step's prefill was
    whole prompts plus one mid-prompt chunk and completions were rounded: lambda* up to
    22% high. A large budget of many whole prompts stays cheap; a model that does not
    declare itself additive (no `chunk_time`) gets every chunk of its windows listed."""
    from llmsched.core.cost import make_cost_model
    from llmsched.core.length_mix import LengthMix
    from llmsched.core.region import representative_step_time

    prof = make_cost_model("profile")
    for x, y, mp, mo in (
        (0, 64, 1000.0, 200.0),
        (999, 0, 1000.0, 200.0),
        (1000, 3, 1000.0, 200.0),
        (1500, 3, 1000.0, 200.0),
        (65_000, 300, 1000.0, 200.0),
        (200_000, 5, 64.0, 300.0),
        (250, 6, 300.0, 11.0),
    ):
        want = LengthMix([int(mp)], [int(mo)]).timer(prof)(x, y)
        assert representative_step_time(prof, x, y, mp, mo) == pytest.approx(want, rel=1e-12, abs=0)
    # a window of 250 tokens crosses a prompt boundary 250 / 300 of the time: two chunks
    prof0 = make_cost_model("profile:h200-llama-3.2-1b,overlap=0")
    got = representative_step_time(prof0, 250, 6, 300.0, 11.0)
    ctx = 6 * (300 + 11 // 2)
    one_chunk = prof0.step_time(250, 6, ctx, [(250, 25)], 6 + 1)
    assert got > one_chunk * 1.01
    # a mean between whole numbers lies between them
    lo, mid, hi = (representative_step_time(prof, 700, 6, p, 11.0) for p in (300.0, 300.5, 301.0))
    assert min(lo, hi) < mid < max(lo, hi)

    class Listing(CostModel):
        seen: list = []

        def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
            self.seen.append(sum(n for n, _ in chunks))
            return 1e-3 * (1 + prefill_tokens + decode_tokens) + 1e-9 * len(chunks)

    m = Listing()
    representative_step_time(m, 5000, 10, 1000.0, 200.0)
    assert m.seen and set(m.seen) == {5000}


@pytest.mark.parametrize("k_max", [True, 10**30, 4.5])
def test_region_refuses_k_max_by_the_constraints_rule(k_max):
    with pytest.raises(ConfigError, match="k_max must be"):
        stability_region("paper", 512, k_max)


def test_region_takes_whole_floats_as_the_constraints_rule_does():
    """k_max 4.0 was refused, as `Constraints` refused it, while `simulate(k_max=4.0)` ran."""
    ref = stability_region("paper", 512, 4, max_prefill_per_request=256)
    got = stability_region("paper", 512.0, np.float64(4), max_prefill_per_request=256.0)
    assert (got.b_max, got.k_max, got.max_prefill_per_request) == (512, 4, 256) and type(got.k_max) is int
    assert np.array_equal(got.vertices, ref.vertices)
    with pytest.raises(ConfigError, match="b_max must be a positive integer, got 512.5"):
        stability_region("paper", 512.5)
