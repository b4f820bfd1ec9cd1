"""The two-dimensional stability region of one server with a batch-size cap.

(docs/stability.md, "The batch-size cap: a two-dimensional region"; paper 1, "Throughput-
optimal scheduling for LLM inference and AI agents", observes that a cap makes it 2-D.)
It lives in `core` because the adaptive policy uses it; `llmsched.theory` exports it.

A step is a shape `(x, y)`: `x` prefill tokens and `y` decode tokens, taking `t(x, y)`
seconds. Running that shape forever serves prefill tokens at `x / t` and decode tokens at
`y / t` per second; mixing shapes in proportions of time gives any convex combination of
those rate vectors, and idling gives the origin. The stability region in the
(prefill token rate, decode token rate) plane is therefore the convex hull of the rate
vectors of all feasible shapes together with the origin. The rule below allows every
step some policy could run, so arrival rate vectors outside the region are served by no
policy (for a context-dependent model, up to its representative step times). Inside it,
a policy can serve them only where the workload's requests can build the vertices'
steps: by default one request may supply any number of prefill tokens, which requests
with shorter prompts cannot (with `k_max` 2, prompts of 100 tokens cannot make the
shape (127, 1)), so the region can hold rates no policy serves; `max_prefill_per_request`
set to the longest prompt keeps it a relaxation, and tighter.

Feasibility rule (exact; it is what `feasible_shape` computes):

- `x >= 0`, `y >= 0`, `1 <= x + y <= b_max` (token budget);
- `y <= k_max` (one decode token per request per step);
- requests in the step `= y + prefill_requests(x) <= k_max`, where
  `prefill_requests(x) = ceil(x / max_prefill_per_request)`, or, when
  `max_prefill_per_request` is None (the default: a single request may contribute any
  number of prefill tokens, as in the paper's bulk prefill), `1 if x > 0 else 0`.
  So by default a mixed step has `y <= k_max - 1`.

Without `k_max` only the token budget applies.

Step times:

- Models whose time depends on the load alone (`cost.load_only`, e.g. the paper and
  linear models): `t(x, y) = cost.load_time(x + y)`. Enumeration is then EXACT and
  O(b_max): for a fixed load `b` all feasible shapes lie on one segment
  `(b - y, y) / t(b)`, `y` in `[0, y*(b)]` (feasibility is a prefix in `y` because the
  request count `y + prefill_requests(b - y)` never decreases as `y` grows), so only its
  two end points can be hull vertices.
- Context-dependent models (`load_only = False`, e.g. the H200 profile): the step time
  of a shape depends on the contexts its tokens attend to, which the region needs a
  representative value for; `representative_step_time` takes them from the workload's
  length mix, or lengths that do not vary at its mean prompt and output (documented
  there). The shape set is then sampled on
  a grid (all shapes when it is small, otherwise about `grid` values of `y` times about
  `grid` values of `x` per `y`, always including the largest feasible `x` for each `y`,
  the values `k_max - 1` and `k_max`, and powers of two), so the region computed is an
  inner approximation of the true one (exact on the sampled shapes).

`StabilityRegion.max_scale(p, d)` is solved exactly as a linear programme over the hull
vertices (scipy HiGHS; scipy is imported when the first LP runs, not with this module).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .checks import as_int, as_real, whole_as_int
from .constraints import check_k_max
from .cost import CostModel, make_cost_model
from .errors import ConfigError
from .length_mix import LengthMix
from .request import MAX_LENGTH

__all__ = [
    "StabilityRegion",
    "stability_region",
    "feasible_shape",
    "representative_step_time",
    "representative_timer",
    "workload_point",
    "convex_hull",
]

#: Above this many candidate shapes a context-dependent model is sampled on a grid.
_FULL_ENUMERATION_LIMIT = 20_000
_DEFAULT_GRID = 129


def _check_limits(b_max, k_max, max_prefill_per_request):
    """Each a positive integer (whole floats too, as `check_k_max` and `simulate` take them)."""

    def positive(v) -> bool:
        n = as_int(whole_as_int(v))
        return n is not None and n > 0

    if not positive(b_max):
        raise ConfigError(f"b_max must be a positive integer, got {b_max!r}")
    if k_max is not None:
        check_k_max(k_max)
    if max_prefill_per_request is not None and not positive(max_prefill_per_request):
        raise ConfigError(
            f"max_prefill_per_request must be a positive integer or None, got {max_prefill_per_request!r}"
        )


def _prefill_requests(x, max_prefill_per_request):
    """Fewest requests that can supply x prefill tokens in one step (vectorised)."""
    x = np.asarray(x)
    if max_prefill_per_request is None:
        return (x > 0).astype(np.int64)
    return -(-x // int(max_prefill_per_request))  # ceil division for x >= 0


def feasible_shape(x, y, b_max: int, k_max: int | None = None, max_prefill_per_request: int | None = None):
    """Whether a step with x prefill and y decode tokens is allowed (vectorised; see the
    module docstring for the rule)."""
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    ok = (x >= 0) & (y >= 0) & (x + y >= 1) & (x + y <= b_max)
    if k_max is not None:
        ok &= (y <= k_max) & (y + _prefill_requests(np.maximum(x, 0), max_prefill_per_request) <= k_max)
    return ok


def check_mean_lengths(mean_prompt, mean_output) -> tuple[float, float]:
    """The rule for a workload's mean lengths: numbers (numpy's too, not a bool nor a
    string), mean prompt and mean output >= 1 token (every prompt holds a token; the
    prefill step emits output token 1), both finite and at most MAX_LENGTH, a request field's limit; a one-line
    ConfigError otherwise. Returns them as Python floats."""
    p, o = as_real(mean_prompt), as_real(mean_output)
    for name, v, x in (("mean_prompt", mean_prompt, p), ("mean_output", mean_output, o)):
        if x is None:
            raise ConfigError(f"{name} must be a number of tokens, got {v!r:.60}")
    if not p >= 1 or not o >= 1:
        raise ConfigError(f"mean prompt and mean output must be >= 1 token, got {p!r} and {o!r}")
    for name, x in (("mean_prompt", p), ("mean_output", o)):
        if not x <= MAX_LENGTH:
            raise ConfigError(f"{name} must be a finite number of tokens up to {MAX_LENGTH:,}, got {x:g}")
    return float(p), float(o)


def require_cost_model(cost) -> None:
    """TypeError unless `cost` is a CostModel (helpers take one; entry points build it)."""
    if not isinstance(cost, CostModel):
        raise TypeError(f"expected a CostModel, got {cost!r}: build one with make_cost_model(spec)")


def _check_means(mean_prompt, mean_output):
    if mean_prompt is None or mean_output is None:
        raise ConfigError(
            "a context-dependent cost model needs the workload's mean prompt and "
            "output lengths to pick representative contexts"
        )
    check_mean_lengths(mean_prompt, mean_output)


def representative_step_time(
    cost: CostModel,
    x: int,
    y: int,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
    mix: LengthMix | None = None,
) -> float:
    """Step time of a shape (x prefill, y decode tokens) with representative contexts.

    For a load-only model this is `cost.load_time(x + y)`. Otherwise, with `mix`, a
    `LengthMix` of the workload's lengths, the step is timed with the contexts its tokens
    see on average (size-biased decode contexts, prefill windows of the prompt stream,
    `x / E[p]` prompts completing a step as a time-share; `core.length_mix`). Without it,
    `P` and `O` the mean prompt and output lengths (tokens) are timed the same way as
    lengths that do not vary (`LengthMix.of_means`): each decoder reads `P + O / 2` cached
    tokens, the x prefill tokens are a window of a stream of prompts of `P` tokens (a
    window across two prompts pays two chunks) and `x / P` prompts complete per step. With
    varying lengths the means' contexts are optimistic (3-8% on the workloads measured).
    """
    return representative_timer(cost, mean_prompt, mean_output, mix)(x, y)


def representative_timer(
    cost: CostModel, mean_prompt: float | None, mean_output: float | None, mix: LengthMix | None = None
):
    """`representative_step_time` as a function of (x, y), its constants computed once: a
    caller timing many shapes of one workload (the region, the peak scan) builds it once."""
    require_cost_model(cost)
    if cost.load_only:
        return lambda x, y: float(cost.load_time(int(x) + int(y)))
    if mix is not None:
        return mix.timer(cost)
    _check_means(mean_prompt, mean_output)
    # lengths that do not vary, at the means, timed as their length mix is: a prefill window
    # across two prompts pays two chunks (docs/stability.md: timing one chunk was up to 22% high)
    return LengthMix.of_means(mean_prompt, mean_output).timer(cost)


def workload_point(rate: float, mean_prompt: float, mean_output: float) -> tuple[float, float]:
    """(prefill token rate, decode token rate) of `rate` requests/s: the prefill step
    emits output token 1, so decode work is `mean_output - 1` tokens per request.
    ConfigError unless the rate is finite and >= 0, the mean prompt and the mean
    output >= 1 token (as `theory.bounds.work_per_request`)."""
    if not 0 <= rate < math.inf:
        raise ConfigError(f"rate must be a finite number >= 0 requests/s, got {rate!r}")
    check_mean_lengths(mean_prompt, mean_output)
    return rate * mean_prompt, rate * (mean_output - 1.0)


# ---------------------------------------------------------------------------------------
# convex hull (Andrew's monotone chain; robust to collinear and duplicate points)

#: A chain pruned down to this many points is finished by the sequential scan.
_SCAN_POINTS = 64


def _sorted_unique(points) -> np.ndarray:
    """The distinct rows of an (n, 2) array sorted by x, then y (`np.unique(axis=0)`'s
    result: it sorted a structured view, 4x slower)."""
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    if len(pts) > 1:
        new = np.empty(len(pts), dtype=bool)
        new[0] = True
        np.any(pts[1:] != pts[:-1], axis=1, out=new[1:])
        pts = pts[new]
    return pts


def _chain(pts: np.ndarray, tol: float) -> list:
    """One half of the monotone chain over `pts` (in scan order): the points kept, each
    turn from the one before a left turn by more than `tol`.

    The scan pops a point when it and its neighbours on the stack do not turn left. A
    region's candidates are up to 2 b_max points, most on straight runs, and a scan in
    Python took 10 s a million; so first, numpy drops the points that do not turn left
    with their neighbours in the array, pass after pass while that drops many (each lies
    on or beyond the chord of two others: no vertex of the chain), and the scan finishes
    over the few left. It keeps the vertices the scan over every point kept, on every
    cost model of tests/test_region_fast_hull.py; where many candidates are collinear to
    within `tol` (`linear:c=1,a=1` at b_max 20,000 under a k_max) the scan's vertices
    depend on the order of its pops, and the two may differ (both then leave candidates
    out by up to 1e-4 of the rates: docs/performance.md)."""
    x, y = pts[:, 0], pts[:, 1]
    idx = np.arange(len(pts))
    while len(idx) > _SCAN_POINTS:
        o, a, p = idx[:-2], idx[1:-1], idx[2:]
        turn = (x[a] - x[o]) * (y[p] - y[o]) - (y[a] - y[o]) * (x[p] - x[o])
        drop = turn <= tol
        # of a run of such points the last stays for the scan, which keeps the last of
        # points that do not turn (each pops the one before): where near-coincident points
        # make a corner, one of them is its vertex, the scan's
        after = np.append(drop[1:], False)
        before = np.insert(drop[:-1], 0, False)
        drop &= after | ~before
        dropped = int(np.count_nonzero(drop))
        if dropped == 0:
            break
        keep = np.ones(len(idx), dtype=bool)
        keep[1:-1] = ~drop
        idx = idx[keep]
        if dropped * 8 < len(idx):  # a pass dropping few: the scan finishes in linear time
            break
    out: list = []
    for px, py in pts[idx].tolist():
        while len(out) >= 2:
            (ox, oy), (ax, ay) = out[-2], out[-1]
            if (ax - ox) * (py - oy) - (ay - oy) * (px - ox) <= tol:
                out.pop()
            else:
                break
        out.append((px, py))
    return out


def convex_hull(points: np.ndarray) -> np.ndarray:
    """Vertices of the convex hull of 2-D points, counter-clockwise, without collinear
    points. Works for degenerate inputs (one point, collinear points)."""
    pts = _sorted_unique(points)
    if len(pts) <= 2:
        return pts
    scale = max(1.0, float(np.abs(pts).max()))
    tol = 1e-12 * scale * scale
    lower = _chain(pts, tol)
    upper = _chain(pts[::-1], tol)
    return np.array(lower[:-1] + upper[:-1], dtype=float)


# ---------------------------------------------------------------------------------------
# the region


@dataclass
class StabilityRegion:
    """Convex hull of feasible steps' rate vectors (tokens/s) and the origin.

    `vertices`: hull vertices, counter-clockwise, (prefill rate, decode rate);
    `vertex_shapes`: for each vertex, the step `(x, y, t_seconds)` it comes from
    (`(0, 0, nan)` for the origin); `points`: all candidate rate vectors, `shapes` their
    `(x, y, t)`; `exact`: whether every feasible shape was enumerated (or, for a
    load-only model, covered exactly by segment end points).
    """

    b_max: int
    k_max: int | None
    vertices: np.ndarray
    vertex_shapes: np.ndarray
    points: np.ndarray = field(repr=False)
    shapes: np.ndarray = field(repr=False)
    exact: bool = True
    method: str = ""
    cost: dict = field(default_factory=dict)
    max_prefill_per_request: int | None = None
    mean_prompt: float | None = None
    mean_output: float | None = None

    def __post_init__(self):
        nz = self.vertices[np.any(self.vertices != 0.0, axis=1)]
        self._lp_vertices = nz
        self._scale = float(nz.max()) if len(nz) else 1.0

    # -- queries ------------------------------------------------------------------------
    def max_scale(self, prefill_rate: float, decode_rate: float) -> float:
        """Largest s >= 0 with s * (prefill_rate, decode_rate) in the region, from the LP
        max s  s.t.  s * (p, d) = sum_i w_i v_i,  sum_i w_i <= 1,  w >= 0
        over the hull vertices v_i (the origin takes the slack weight). Returns inf for
        the zero vector and 0.0 for directions the region does not reach (a negative
        component, or decode-only traffic when no feasible step has decode tokens)."""
        from scipy.optimize import linprog  # noqa: PLC0415 (heavy: only when an LP runs)

        p, d = float(prefill_rate), float(decode_rate)
        if not (math.isfinite(p) and math.isfinite(d)):
            raise ValueError(f"rates must be finite, got ({p}, {d})")
        if p == 0.0 and d == 0.0:
            return math.inf
        if p < 0.0 or d < 0.0 or len(self._lp_vertices) == 0:
            return 0.0
        v = self._lp_vertices / self._scale
        n = len(v)
        norm = max(p, d)
        target = np.array([p, d]) / norm
        c = np.zeros(n + 1)
        c[0] = -1.0
        a_eq = np.zeros((2, n + 1))
        a_eq[:, 0] = -target
        a_eq[0, 1:] = v[:, 0]
        a_eq[1, 1:] = v[:, 1]
        a_ub = np.ones((1, n + 1))
        a_ub[0, 0] = 0.0
        res = linprog(
            c, A_ub=a_ub, b_ub=[1.0], A_eq=a_eq, b_eq=[0.0, 0.0], bounds=[(0, None)] * (n + 1), method="highs"
        )
        if res.status != 0:
            raise RuntimeError(f"max_scale LP failed: {res.message}")
        return float(res.x[0]) * self._scale / norm

    def exit_face(self, prefill_rate: float, decode_rate: float) -> list[tuple[int, int]]:
        """The step shapes `(x, y)` of the hull vertices on the face where the ray through
        (prefill_rate, decode_rate) leaves the region (the steps lambda* time-shares): one
        vertex, or the two ends of an edge; [] for a direction the region does not reach."""
        s = self.max_scale(prefill_rate, decode_rate)
        if not (0.0 < s < math.inf):
            return []
        q = np.array([prefill_rate, decode_rate], dtype=float) * s
        tol = 1e-7 * self._scale
        shape = lambda i: (int(self.vertex_shapes[i][0]), int(self.vertex_shapes[i][1]))  # noqa: E731
        nonzero = [i for i, v in enumerate(self.vertices) if v[0] != 0.0 or v[1] != 0.0]
        at = [i for i in nonzero if float(np.abs(self.vertices[i] - q).max()) <= tol]
        if at:
            return [shape(i) for i in at]
        n = len(self.vertices)
        for i in range(n):
            a, b = self.vertices[i], self.vertices[(i + 1) % n]
            e, r = b - a, q - a
            length = float(np.hypot(*e))
            if length == 0.0 or abs(float(e[0] * r[1] - e[1] * r[0])) > tol * length:
                continue
            if -tol * length <= float(e @ r) <= length * length + tol * length:
                return [shape(j) for j in (i, (i + 1) % n) if j in nonzero]
        return []

    def contains(self, prefill_rate: float, decode_rate: float, tol: float = 1e-9) -> bool:
        """Whether (prefill_rate, decode_rate) tokens/s lies in the (closed) region."""
        if prefill_rate < 0 or decode_rate < 0:
            return False
        return self.max_scale(prefill_rate, decode_rate) >= 1.0 - tol

    def critical_rate(self, mean_prompt: float, mean_output: float) -> float:
        """Largest arrival rate (requests/s) whose workload point is in the region."""
        return self.max_scale(*workload_point(1.0, mean_prompt, mean_output))

    @property
    def max_throughput(self) -> float:
        """Largest total token rate (prefill + decode tokens/s) over the region."""
        return float(self.vertices.sum(axis=1).max())

    @property
    def max_prefill_rate(self) -> float:
        return float(self.vertices[:, 0].max())

    @property
    def max_decode_rate(self) -> float:
        return float(self.vertices[:, 1].max())

    def to_dict(self) -> dict:
        return {
            "b_max": int(self.b_max),
            "k_max": None if self.k_max is None else int(self.k_max),
            "max_prefill_per_request": self.max_prefill_per_request,
            "exact": bool(self.exact),
            "method": self.method,
            "cost": dict(self.cost),
            "mean_prompt": self.mean_prompt,
            "mean_output": self.mean_output,
            "max_throughput_tokens_per_s": self.max_throughput,
            "max_prefill_tokens_per_s": self.max_prefill_rate,
            "max_decode_tokens_per_s": self.max_decode_rate,
            "vertices": [
                {
                    "prefill_tokens_per_s": float(v[0]),
                    "decode_tokens_per_s": float(v[1]),
                    "prefill_tokens": int(s[0]),
                    "decode_tokens": int(s[1]),
                    "step_time_s": None if not math.isfinite(s[2]) else float(s[2]),
                }
                for v, s in zip(self.vertices, self.vertex_shapes)
            ],
        }


def _load_only_candidates(cost, b_max, k_max, pmax):
    b = np.arange(1, b_max + 1, dtype=np.int64)
    t = np.asarray(cost.load_times(b), dtype=float)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ConfigError(f"cost model {cost.name!r} gave a non-positive or non-finite step time")
    ycap = b if k_max is None else np.minimum(b, k_max)
    feas0 = feasible_shape(b, 0, b_max, k_max, pmax)
    # vectorised binary search for y*(b) = largest feasible y in [0, ycap] (a prefix),
    # none where ycap itself is feasible (every load without k_max)
    top = feasible_shape(b - ycap, ycap, b_max, k_max, pmax)
    hi = np.where(feas0, ycap, 0)
    lo = np.where(top, hi, 0)
    while np.any(lo < hi):
        active = lo < hi
        mid = (lo + hi + 1) // 2
        ok = feasible_shape(b - mid, mid, b_max, k_max, pmax)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid - 1, hi)
    ystar = lo
    keep = feas0
    bb, yy, tt = b[keep], ystar[keep], t[keep]
    xs = np.concatenate([bb, bb - yy])
    ys = np.concatenate([np.zeros_like(yy), yy])
    ts = np.concatenate([tt, tt])
    return xs, ys, ts


def _grid_values(hi: int, n: int, extra: Sequence[int] = ()) -> np.ndarray:
    if hi <= 0:
        return np.zeros(1, dtype=np.int64)
    if hi + 1 <= n:
        return np.arange(hi + 1, dtype=np.int64)
    vals = set(np.round(np.linspace(0, hi, n)).astype(np.int64).tolist())
    p = 1
    while p <= hi:
        vals.add(p)
        p *= 2
    vals.update(v for v in extra if 0 <= v <= hi)
    return np.array(sorted(vals), dtype=np.int64)


def _general_candidates(cost, b_max, k_max, pmax, mean_prompt, mean_output, grid, mix):
    if mix is None:
        _check_means(mean_prompt, mean_output)
    ymax = b_max if k_max is None else min(b_max, k_max)
    total = (ymax + 1) * (b_max + 1) - ymax * (ymax + 1) // 2  # shapes (x, y): x <= b_max - y
    exact = total <= _FULL_ENUMERATION_LIMIT and grid is None
    n = _DEFAULT_GRID if grid is None else int(grid)
    if exact:
        ys_axis = np.arange(ymax + 1, dtype=np.int64)
    else:
        extra = [] if k_max is None else [k_max - 1, k_max]
        ys_axis = _grid_values(ymax, n, extra)
    xs_l, ys_l = [], []
    for y in ys_axis:
        xhi = b_max - int(y)
        if k_max is not None:
            room = k_max - int(y)
            if room <= 0:
                xhi = 0
            elif pmax is not None:
                xhi = min(xhi, room * pmax)
        xv = np.arange(xhi + 1, dtype=np.int64) if exact else _grid_values(xhi, n, [pmax or 0])
        xs_l.append(xv)
        ys_l.append(np.full(len(xv), y, dtype=np.int64))
    xs = np.concatenate(xs_l)
    ys = np.concatenate(ys_l)
    ok = feasible_shape(xs, ys, b_max, k_max, pmax)
    xs, ys = xs[ok], ys[ok]
    time_of = representative_timer(cost, mean_prompt, mean_output, mix)
    ts = np.array([time_of(x, y) for x, y in zip(xs.tolist(), ys.tolist())], dtype=float)
    if not np.all(np.isfinite(ts)) or np.any(ts <= 0):
        raise ConfigError(f"cost model {cost.name!r} gave a non-positive or non-finite step time")
    return xs, ys, ts, exact


def stability_region(
    cost: CostModel | str,
    b_max: int,
    k_max: int | None = None,
    *,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
    max_prefill_per_request: int | None = None,
    grid: int | None = None,
    mix: LengthMix | None = None,
) -> StabilityRegion:
    """The stability region of one server (see the module docstring for the rules).

    `mean_prompt`, `mean_output` are needed only for context-dependent cost models, or
    `mix`, a `LengthMix` of the workload's lengths, which times their steps with the
    contexts varying lengths give (`representative_step_time`); `grid` forces grid
    sampling with about that many values per axis for them.
    """
    cost = make_cost_model(cost)
    _check_limits(b_max, k_max, max_prefill_per_request)
    b_max = int(b_max)
    k_max = None if k_max is None else int(k_max)
    pmax = None if max_prefill_per_request is None else int(max_prefill_per_request)
    if cost.load_only:
        xs, ys, ts = _load_only_candidates(cost, b_max, k_max, pmax)
        exact, method = True, "load-only: exact segment end points per load b"
    else:
        if mix is not None:
            mean_prompt = mix.mean_prompt if mean_prompt is None else mean_prompt
            mean_output = mix.mean_output if mean_output is None else mean_output
        xs, ys, ts, exact = _general_candidates(cost, b_max, k_max, pmax, mean_prompt, mean_output, grid, mix)
        contexts = "the contexts of the workload's lengths" if mix is not None else "representative contexts"
        method = (
            f"context-dependent: all shapes, {contexts}"
            if exact
            else f"context-dependent: grid-sampled shapes, {contexts} (inner approximation)"
        )
    pts = np.column_stack([xs / ts, ys / ts])
    shapes = np.column_stack([xs, ys, ts]).astype(float)
    hull = convex_hull(np.vstack([pts, [[0.0, 0.0]]]))
    # map vertices back to a shape (the first candidate at that exact rate vector)
    vshapes = []
    for v in hull:
        if v[0] == 0.0 and v[1] == 0.0:
            vshapes.append((0.0, 0.0, math.nan))
            continue
        i = int(np.argmin(np.abs(pts - v).sum(axis=1)))
        vshapes.append(tuple(shapes[i]))
    return StabilityRegion(
        b_max=b_max,
        k_max=k_max,
        vertices=hull,
        vertex_shapes=np.array(vshapes, dtype=float),
        points=pts,
        shapes=shapes,
        exact=exact,
        method=method,
        cost=cost.describe(),
        max_prefill_per_request=pmax,
        mean_prompt=None if cost.load_only else mean_prompt,
        mean_output=None if cost.load_only else mean_output,
    )
