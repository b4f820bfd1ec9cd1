"""The `profile` step cost model: step times composed from measured GPU tables.

A step's time is the sum of four parts, each read from a table measured on the GPU
(`benchmarks/calibration/profile_step.py` measures them; `data/profiles/h200/` ships an H200 set):

    t = linear(b) + L * [decode_attn(D, ctx_mean) - v * floor_d]
        + sum over chunks L * [prefill_attn(c, ctx) - v * floor_p] + lm_head(sampled)

- `linear(b)`: all non-attention work of one forward pass (every layer) over the token
  load b = prefill + decode tokens (`linear.csv`). `mode` picks the rows:
  `auto` (the default) times decode-only steps with the CUDA-graph rows up to the largest
  graph row (as vLLM V0 and SGLang replay captured graphs for decode batches) and every
  other step with the eager rows; `eager` always uses eager rows (the mode `step.csv` is
  measured in, so validation uses it); `graph` uses graph rows for every step up to the
  largest graph row (like piecewise graphs in vLLM V1), eager rows above.
- `decode_attn(D, ctx_mean)`: ONE layer of decode attention for the D = decode tokens of
  the step, read at their mean context `decode_context / D` (`decode_attn.csv`), times the
  layer count L. Decode attention is memory-bound: its time is a launch floor plus a part
  proportional to the KV read, D * ctx_mean, so the mean context gives the right total
  wherever the table is linear in context (from about 1k tokens on); per-sequence
  contexts are not known to the cost model.
- `prefill_attn(c, ctx)`: ONE layer of attention for a prefill chunk of c tokens after ctx
  cached tokens (`prefill_attn.csv`), times L, for each chunk.
- `lm_head(sampled)`: the LM head over the sampled rows (`lm_head.csv`).
- `floor_d`, `floor_p`: the launch floor of a standalone attention call, the least value
  of its table (for example 0.04 ms per layer for Llama-3-8B decode at batch 1, context
  128, mostly host-side dispatch). Timed alone, an attention call costs at least this;
  inside a step whose GPU is busy the dispatch overlaps the previous kernels and only the
  work above the floor adds. `v` = `overlap` (default 1) is the fraction hidden: 1 adds
  only the part above the floor, 0 adds the standalone times. Against the end-to-end
  steps of `step.csv`, overlap 1 is right where the step is GPU-bound (Llama-3-8B: mean
  error 4.4% vs 15% with overlap 0); see docs/cost_models.md.

Interpolation and extrapolation: piecewise linear between measured points (bilinear on
the (batch, context) and (chunk, context) grids), so a grid point gives the measured value
exactly. Below the smallest measured size a table is flat (the launch floor); above the
largest it extrapolates linearly in tokens along the secant from the largest measured
point at or below half the largest size to the largest one (a secant over the upper half
is less noisy than the last interval), never with a negative slope. The one exception:
prefill attention above the largest measured chunk scales its part above the launch floor
with attention work, c * (ctx + (c + 1) / 2), since its cost is quadratic in the chunk
(the floor, where `overlap` leaves it in, is added unscaled): the ratio is applied at the
grid's contexts, followed (with `monotone=1`) by a running maximum along the context, since
the ratio falls with the context faster than the largest chunk's row rises once the chunk
is large; past the largest context the row's slope is c / c_max times the largest chunk's
(the ratio's limit), linear so that sums over contexts keep their closed form. Missing cells of a 2-D
grid (e.g. batch x context pairs too large to measure) are filled along the context axis
by the same rule, from the row's own points (`extrapolation` names a run that uses such a
row at more than twice its last measured context). A table with no second size to draw a secant from is refused (linear
eager rows, lm_head, decode_attn batches), and so is a prefill_attn table of one chunk size
(at context 0 a small chunk is all launch floor: no work to scale); a context axis of one
context is flat.

Monotone cleaning (`monotone=1`, the default): measured tables carry noise (for example
an eager 448-token row 20% above its neighbours) that would make a larger step cheaper
than a smaller one. Each 1-D table is replaced by its isotonic (pool-adjacent-violators)
non-decreasing fit and each 2-D grid by an isotonic fit along each axis followed by a
running maximum, which changes only the values that violate monotonicity; past the
largest context a row's tail slope is raised to at least every smaller row's (a row filled
flat from one measured context would otherwise undercut the rows below it). `monotone=0`
uses the raw measurements.

Spec forms for `load_profile(spec)` (also `make_cost_model("profile:" + spec)`):

- `h200-llama-3-8b` (the default) or `h200-llama-3.2-1b`: a shipped profile, named
  `<folder>-<model>` after the folders in `llmsched/data/profiles/` (in any case when no
  file or folder of that spelling exists);
- `PATH`: a folder holding the table files below for one model, or for several models
  with `PATH#MODEL` choosing one; a folder without them that holds `profile.csv` (what
  `llmsched profile --out DIR` writes) is read as that combined file;
- `PATH` to a single combined CSV file (format below), `PATH#MODEL` likewise;
- options may follow after commas: `,mode=auto|eager|graph`, `,overlap=V` (0..1),
  `,monotone=1|0`, `,layers=N` (overrides the layer count), e.g.
  `h200-llama-3.2-1b,mode=eager`. (An existing path may itself contain commas, even
  `,key=value` parts: the longest leading run of parts naming an existing file or folder,
  with its `#MODEL`, is the source; the parts after it are options.)

Folder format (all times in milliseconds, column order free, extra columns ignored; a
`model` column is optional, but once a model is in play every row of a table with one
names it; rows with the same key are averaged):

| file | required columns | optional |
|---|---|---|
| linear.csv | tokens, ms | model; mode = eager (default when absent or empty) or graph |
| lm_head.csv | tokens, ms | model |
| decode_attn.csv | batch, context, ms (ONE layer; context per sequence) | model |
| prefill_attn.csv | chunk, context, ms (ONE layer; context cached before the chunk) | model |
| step.csv | prefill_chunk, prefill_context, decodes, decode_context, ms | model |

`step.csv` is optional: whole steps measured end to end (one prefill chunk, `decodes`
decode sequences with `decode_context` tokens each, LM head over decodes + 1 if there is a
chunk), used only by `validate_steps`. Sizes (tokens, batch, chunk) must be > 0, contexts
and times >= 0 (step.csv times > 0); linear.csv needs at least one eager row. Limits: sizes and step.csv's
prefill_chunk and decodes are whole numbers of at most 1,048,576 (the largest b_max),
contexts at most 1,073,741,824 tokens (the longest prompt or output), times at most 1e6 ms
(the formula models' limit); the layer count is at most 1,024.

`profile.json` (optional, in the folder) gives the layer count per model, as JSON:

    {"format": "llmsched-profile/1",            optional, informational
     "device": "NVIDIA H200",                   optional, informational
     "layers": 32,                              optional: the layer count when the folder
                                                holds one model (or for every model)
     "models": {"llama-3-8b": {"layers": 32}}}  optional: per-model layer counts

Per-model `models.<name>.layers` wins over the top-level `layers`. Without any of these
the layer count comes from the shipped profiles' models of the same name (llama-3-8b: 32,
llama-3.2-1b: 16) or the `layers=N` option; otherwise loading fails.

Combined format: ONE CSV file holding all the tables, with a `table` column naming the
table of each row (linear, lm_head, decode_attn, prefill_attn or step) and the union of
the columns above (`table, model, mode, tokens, batch, chunk, context, prefill_chunk,
prefill_context, decodes, decode_context, ms`), cells that do not apply left empty. An
optional `layers` column gives the model's layer count on any of its rows (all non-empty
values of one model must agree). `llmsched profile` writes this format.

Bad input raises `ConfigError` naming the file and the problem in one sentence.
"""

from __future__ import annotations

import csv
import json
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate
from pathlib import Path

from .checks import whole_from_text
from .constraints import MAX_B_MAX
from .cost import MAX_STEP_MS, MIN_STEP_MS, CostModel, StepTimer, steps_by_step
from .errors import ConfigError, count_text
from .paths import recorded_path
from .request import MAX_LENGTH, NS

PROFILES_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"
DEFAULT_PROFILE = "h200-llama-3-8b"
MODES = ("auto", "eager", "graph")
META_FILE = "profile.json"
COMBINED_FILE = "profile.csv"  # the combined file `llmsched profile --out DIR` writes into DIR
MAX_LAYERS = 1024  # the largest layer count a profile takes

# table -> (file name, required key columns); every table also needs `ms`
TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "linear": ("linear.csv", ("tokens",)),
    "lm_head": ("lm_head.csv", ("tokens",)),
    "decode_attn": ("decode_attn.csv", ("batch", "context")),
    "prefill_attn": ("prefill_attn.csv", ("chunk", "context")),
    "step": ("step.csv", ("prefill_chunk", "prefill_context", "decodes", "decode_context")),
}
REQUIRED_TABLES = ("linear", "lm_head", "decode_attn", "prefill_attn")
# columns that are sizes (> 0) rather than contexts (>= 0)
_SIZES = {"tokens", "batch", "chunk"}
# columns that count tokens or sequences of one step: whole numbers of at most MAX_B_MAX (no
# step holds more tokens, and a decoder or a sampled row is a token; a 1-D table keeps a
# value per integer up to its largest size, so an unbounded one would fill the memory)
_STEP_COUNTS = _SIZES | {"prefill_chunk", "decodes"}
# columns that are contexts (tokens of one sequence): at most MAX_LENGTH
_CONTEXTS = {"context", "prefill_context", "decode_context"}
COMBINED_COLUMNS = (
    "table",
    "model",
    "mode",
    "tokens",
    "batch",
    "chunk",
    "context",
    "prefill_chunk",
    "prefill_context",
    "decodes",
    "decode_context",
    "ms",
    "layers",
)


# ---------------------------------------------------------------------------------------
# numerics: isotonic fits, piecewise-linear segments
# ---------------------------------------------------------------------------------------


def _isotonic(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    out: list[float] = []
    for m, n in blocks:
        out.extend([m] * int(n))
    return out


def _cummax(ys: Sequence[float]) -> list[float]:
    """Running maximum (`max` keeps the earlier of equal values)."""
    return list(accumulate(ys, max, initial=-math.inf))[1:]


def _anchor(xs: Sequence[float]) -> int:
    """Index of the largest point at or below half the largest (the tail secant's start)."""
    n = len(xs)
    if n < 2:
        return 0
    j = bisect_right(xs, xs[-1] / 2) - 1
    return j if 0 <= j < n - 1 else n - 2


class _Axis:
    """Breakpoints xs and what `segments` needs of them alone, computed once: a surface
    builds segments over the same context axis for every batch or chunk size it meets."""

    __slots__ = ("xs", "steps", "tail")

    def __init__(self, xs: Sequence[float]):
        self.xs = xs
        self.steps = [(x0, x1 - x0) for x0, x1 in zip(xs, xs[1:])]
        j = _anchor(xs)
        self.tail = (j, xs[-1] - xs[j]) if len(xs) >= 2 else None

    def segments(self, ys: Sequence[float]) -> tuple[list[float], list[float]]:
        """Intercepts A and slopes S with f(x) = A[i] + S[i] * x for i = bisect_right(xs, x):
        flat below xs[0], linear between points, above xs[-1] the secant from the anchor
        (`_anchor`) to the last point, never with a negative slope."""
        a, s = [ys[0]], [0.0]
        for (x0, dx), y0, y1 in zip(self.steps, ys, ys[1:]):
            k = (y1 - y0) / dx
            a.append(y0 - k * x0)
            s.append(k)
        if self.tail is None:
            k = 0.0
        else:
            j, dx = self.tail
            k = max(0.0, (ys[-1] - ys[j]) / dx)
        a.append(ys[-1] - k * self.xs[-1])
        s.append(k)
        return a, s


def _segments(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    return _Axis(xs).segments(ys)


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    a, s = _segments(xs, ys)
    i = bisect_right(xs, x)
    if 0 < i < len(xs) and x == xs[i - 1]:
        return ys[i - 1]
    return a[i] + s[i] * x


class _Curve:
    """A 1-D table: dense per-integer values up to the largest measured size, a linear
    tail above it; value 0 at size 0."""

    def __init__(self, xs: list[float], ys: list[float]):
        self.xs, self.ys = xs, ys
        self.a, self.s = _segments(xs, ys)
        self.dense = self._dense(int(math.floor(xs[-1])))
        self.tail_a, self.tail_s = self.a[-1], self.s[-1]

    def _dense(self, n: int) -> list[float]:
        """`_eval(k)` for k = 0..n (0 at 0), built a segment at a time: start-up time."""
        xs, ys, a, s = self.xs, self.ys, self.a, self.s
        dense = [0.0]
        for i in range(len(xs) + 1):
            # integers k with bisect_right(xs, k) == i: xs[i - 1] <= k < xs[i]
            hi = min(n + 1, math.ceil(xs[i])) if i < len(xs) else n + 1
            if hi > len(dense):
                ai, si = a[i], s[i]
                dense.extend([ai + si * k for k in range(len(dense), hi)])
        for x, y in zip(xs[:-1], ys[:-1]):  # as `_eval`: exact at grid points but the last
            if x == int(x) and 1 <= x <= n:
                dense[int(x)] = y
        return dense

    def _eval(self, x: float) -> float:
        i = bisect_right(self.xs, x)
        if 0 < i < len(self.xs) and x == self.xs[i - 1]:
            return self.ys[i - 1]  # exact at grid points
        return self.a[i] + self.s[i] * x

    def __call__(self, x) -> float:
        if x <= 0:
            return 0.0
        if x == int(x) and x < len(self.dense):
            return self.dense[int(x)]
        return self._eval(x)

    def values_at(self, n):
        """`self(k)` for each k >= 1 of the integer array `n` (numpy), the same floats."""
        import numpy as np  # noqa: PLC0415

        dense = np.asarray(self.dense)
        top = len(dense) - 1
        # past the dense values k lies past the largest size: `_eval`'s tail segment
        return np.where(n <= top, dense[np.minimum(n, top)], self.tail_a + self.tail_s * n.astype(float))


class _Surface:
    """A 2-D grid (rows = batch or chunk sizes, cols = contexts). `row(r)` returns the
    segments (A, S) over the context axis for size r, cached."""

    def __init__(
        self,
        rows: list[float],
        cols: list[float],
        vals: list[list[float]],
        tail: str,
        keep: float = 0.0,
        monotone: bool = False,
        last: list[float] | None = None,
    ):
        # `keep`: the part of every value that is the launch floor left in (the floor less
        # what `overlap` hides); the "work" tail scales only what lies above it.
        # `monotone`: the grid is cleaned, and so is a "work" row above it (a running maximum
        # along the context axis after scaling)
        self.rows, self.cols, self.vals, self.tail, self.keep = rows, cols, vals, tail, keep
        self.monotone = monotone
        # each row's largest measured context (its cells past it are filled): `extrapolation`
        self.last = last if last is not None else [cols[-1]] * len(rows)
        self.cache: dict = {}
        self._axis = _Axis(cols)
        # past the largest context each row follows its own tail secant; a row filled from a
        # few low contexts (flat from one) has a shallower one than the smaller row below it
        # and would time a larger batch or chunk cheaper there: with `monotone`, a row's tail
        # slope is at least every smaller row's (None where the rows' slopes already rise)
        self._tails = None
        if monotone and self._axis.tail is not None:
            j, dx = self._axis.tail
            raw = [max(0.0, (v[-1] - v[j]) / dx) for v in vals]
            if _cummax(raw) != raw:
                self._tails = _cummax(raw)

    def values(self, r: float) -> list[float]:
        R, V = self.rows, self.vals
        if r <= R[0]:
            return list(V[0])
        if r >= R[-1]:
            if r == R[-1] or len(R) == 1 and self.tail == "linear":
                return list(V[-1])
            if self.tail == "work":  # the part above the launch floor scales with attention work
                rm, keep = R[-1], self.keep  # c * (ctx + (c + 1) / 2); the floor does not
                ys = [
                    keep + max(0.0, v - keep) * (r * (x + (r + 1) / 2)) / (rm * (x + (rm + 1) / 2))
                    for x, v in zip(self.cols, V[-1])
                ]
                # the ratio falls along the context (towards r / rm) and, for a chunk well
                # above the largest, faster than the largest row rises: keep the row monotone
                return _cummax(ys) if self.monotone else ys
            j = _anchor(R)
            return [vm + max(0.0, (vm - vj) / (R[-1] - R[j])) * (r - R[-1]) for vm, vj in zip(V[-1], V[j])]
        i = bisect_right(R, r)
        lo, hi = V[i - 1], V[i]
        w = (r - R[i - 1]) / (R[i] - R[i - 1])
        if w == 0.0:
            return list(lo)
        return [p + w * (q - p) for p, q in zip(lo, hi)]

    def row(self, r):
        seg = self.cache.get(r)
        if seg is None:
            ys, R = self.values(r), self.rows
            a, s = self._axis.segments(ys)
            T = self._tails
            if T is not None and (r <= R[-1] or self.tail == "linear"):
                if r <= R[0] or r >= R[-1]:
                    k = T[0] if r <= R[0] else T[-1]
                else:
                    i = bisect_right(R, r)
                    k = T[i - 1] + (r - R[i - 1]) / (R[i] - R[i - 1]) * (T[i] - T[i - 1])
                if k > s[-1]:
                    a[-1], s[-1] = ys[-1] - k * self.cols[-1], k
            if self.tail == "work" and r > R[-1]:
                # past the largest context: the largest row's tail slope times r / rm, the
                # limit of the work ratio as the context grows (the secant of the scaled
                # row falls with r and can reach 0); linear, so sums over contexts stay exact
                k = self.row(R[-1])[1][-1] * (r / R[-1])
                a[-1], s[-1] = ys[-1] - k * self.cols[-1], k
            seg = self.cache[r] = (a, s)
        return seg

    def segments_at(self, r, i: int):
        """`row(k)`'s segment i, the arrays (A[i], S[i]), for each size k of the integer
        array `r` (numpy), with `row`'s arithmetic and so its floats; a "linear" tail only
        (the decode table's)."""
        import numpy as np  # noqa: PLC0415

        assert self.tail == "linear"
        R, V, cols = self.rows, self.vals, self.cols
        rf = r.astype(float)
        low, high = r <= R[0], r >= R[-1]
        if len(R) == 1:  # every size reads the one row (and no tail slope is raised)

            def column(j):
                return np.full(len(r), V[0][j])

        else:
            k = np.clip(np.searchsorted(R, rf, side="right"), 1, len(R) - 1)  # `values`' bisect (inner sizes)
            lo_r, hi_r = np.asarray(R, dtype=float)[k - 1], np.asarray(R, dtype=float)[k]
            w = (rf - lo_r) / (hi_r - lo_r)
            j_tail = _anchor(R)

            def column(j):  # `values(k)[j]` for each k
                vj = np.asarray([row[j] for row in V])
                p, q = vj[k - 1], vj[k]
                inner = np.where(w == 0.0, p, p + w * (q - p))
                vm, va = V[-1][j], V[j_tail][j]
                slope = (vm - va) / (R[-1] - R[j_tail])
                tail = np.where(r == R[-1], vm, vm + (slope if slope > 0.0 else 0.0) * (rf - R[-1]))
                return np.where(low, V[0][j], np.where(high, tail, inner))

        zero = np.zeros(len(r))
        if i == 0:
            return column(0), zero
        if i < len(cols):
            y0, y1 = column(i - 1), column(i)
            x0, dx = self._axis.steps[i - 1]
            s = (y1 - y0) / dx
            return y0 - s * x0, s
        last = column(len(cols) - 1)
        if self._axis.tail is None:
            s = zero
        else:
            j, dx = self._axis.tail
            s = (last - column(j)) / dx
            s = np.where(s > 0.0, s, 0.0)
        a = last - s * cols[-1]
        T = self._tails
        if T is not None:  # `row`'s raised tail slope
            T = np.asarray(T)
            t = T[k - 1] + (rf - lo_r) / (hi_r - lo_r) * (T[k] - T[k - 1])
            t = np.where(low, T[0], np.where(high, T[-1], t))
            a, s = np.where(t > s, last - t * cols[-1], a), np.where(t > s, t, s)
        return a, s

    def __call__(self, r: float, x: float) -> float:
        if r <= 0:
            return 0.0
        ys = self.values(r)
        i = bisect_right(self.cols, x)
        if 0 < i < len(self.cols) and x == self.cols[i - 1]:
            return ys[i - 1]  # exact at grid points
        a, s = self.row(r)
        return a[i] + s[i] * x


def _grid(points: Iterable[tuple[float, float, float]], monotone: bool) -> tuple[list, list, list, list]:
    """(row, col, value) points -> sorted rows, cols, a filled (and cleaned) matrix and
    each row's largest measured col."""
    by_row: dict[float, dict[float, float]] = {}
    for r, c, v in points:
        by_row.setdefault(r, {})[c] = v
    rows = sorted(by_row)
    cols = sorted({c for d in by_row.values() for c in d})
    vals = []
    for r in rows:
        d = by_row[r]
        xs = sorted(d)
        ys = [d[x] for x in xs]
        if monotone:
            ys = _isotonic(ys)
        vals.append([d[x] if x in d and not monotone else _interp(xs, ys, x) for x in cols])
    last = [max(by_row[r]) for r in rows]
    if monotone:
        for j in range(len(cols)):
            col = _isotonic([vals[i][j] for i in range(len(rows))])
            for i in range(len(rows)):
                vals[i][j] = col[i]
        vals = [_cummax(v) for v in vals]
        for j in range(len(cols)):
            col = _cummax([vals[i][j] for i in range(len(rows))])
            for i in range(len(rows)):
                vals[i][j] = col[i]
    return rows, cols, vals, last


# ---------------------------------------------------------------------------------------
# the cost model
# ---------------------------------------------------------------------------------------


class ProfileCostModel(CostModel):
    """Step time composed from measured tables (see the module docstring).

    `tables` maps table names to row tuples, times in ms:
    `linear`: (tokens, mode, ms) with mode "eager" or "graph"; `lm_head`: (tokens, ms);
    `decode_attn`: (batch, context, ms) per layer; `prefill_attn`: (chunk, context, ms) per
    layer; optional `step`: (prefill_chunk, prefill_context, decodes, decode_context, ms).
    """

    name = "profile"
    load_only = False
    layers_measured = False  # see `check_profile_layers`

    def __init__(
        self,
        tables: dict,
        layers: int,
        mode: str = "auto",
        monotone: bool = True,
        overlap: float = 1.0,
        label: str = "profile",
        source: str = "",
    ):
        if mode not in MODES:
            raise ConfigError(f"profile mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not 0.0 <= overlap <= 1.0:
            raise ConfigError(f"profile overlap must be between 0 and 1, got {overlap!r}")
        if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
            raise ConfigError(f"profile {label}: the layer count must be a positive integer, got {layers!r}")
        if layers > MAX_LAYERS:  # a larger count times steps past the simulator's clock, or overflows
            got = count_text(layers) if layers < 10**300 else f"a number of {len(str(layers))} digits"
            raise ConfigError(f"profile {label}: the layer count must be at most {MAX_LAYERS:,}, got {got}")
        self.label, self.source, self.layers, self.mode, self.monotone = label, source, layers, mode, monotone
        self.overlap = overlap
        ms, L = 1e-3, layers

        def curve(rows):
            d: dict[float, float] = {}
            for x, y in rows:
                d[x] = y * ms
            xs = sorted(d)
            if xs and xs[-1] > MAX_B_MAX:  # a curve keeps a value per integer up to its largest size
                raise ConfigError(
                    f"profile {label}: table sizes must be at most {MAX_B_MAX:,} tokens "
                    f"(the most a step can hold), got {xs[-1]:g}"
                )
            ys = [d[x] for x in xs]
            return _Curve(xs, _isotonic(ys) if monotone else ys)

        eager = [(x, y) for x, m, y in tables["linear"] if m == "eager"]
        graph = [(x, y) for x, m, y in tables["linear"] if m == "graph"]
        if not eager:
            raise ConfigError(f"profile {label}: linear table has no eager rows")
        self._eager = curve(eager)
        self._graph = curve(graph) if graph else None
        self.graph_max = int(self._graph.xs[-1]) if graph else 0
        self._lm = curve(tables["lm_head"])
        # attention grids, all layers, in seconds, less `overlap` times the launch floor (the
        # grid's least value: what a standalone call costs whatever its size)
        surfaces, self.floors = [], {}
        for table, tail in (("decode_attn", "linear"), ("prefill_attn", "work")):
            r, c, v, last = _grid(((b, x, y * ms * L) for b, x, y in tables[table]), monotone)
            floor = min(min(row) for row in v)
            self.floors[table] = floor
            v = [[max(0.0, y - overlap * floor) for y in row] for row in v]
            keep = (1.0 - overlap) * floor
            surfaces.append(_Surface(r, c, v, tail, keep=keep, monotone=monotone, last=last))
        self._dec, self._pre = surfaces
        self.steps = list(tables.get("step") or [])

        # fast-path lists indexed by the token load b: `_lin` times steps with prefill,
        # `_glin` decode-only steps (graph rows up to the largest one, in `auto` mode)
        eager_d = self._eager.dense
        if graph and mode != "eager":
            g = self._graph.dense
            merged = g + eager_d[len(g) :]
            if monotone:  # no drop where the graph rows end and the eager rows take over
                merged = _cummax(merged)
            self._glin = merged
            self._lin = merged if mode == "graph" else eager_d
        else:
            self._lin = self._glin = eager_d
        self._lmd = self._lm.dense
        self._dx, self._px = self._dec.cols, self._pre.cols
        self._drow, self._prow = self._dec.row, self._pre.row
        self._dcache, self._pcache = self._dec.cache, self._pre.cache
        self._psums: dict = {}  # chunk size -> `chunk_time_sums`'s segment sums

    # -- per-part access (for inspection, tests and tools) --------------------------------
    def linear_time(self, b, decode_only: bool = False) -> float:
        """Seconds of non-attention work at token load b (`decode_only`: a step without
        prefill, which `auto` mode times with the graph rows)."""
        if b <= 0:
            return 0.0
        lst = self._glin if decode_only else self._lin
        n = len(lst) - 1
        if b >= n:
            return max(lst[n], self._eager(b))
        k = int(b)
        if k == b:
            return lst[k]
        return lst[k] + (lst[k + 1] - lst[k]) * (b - k)

    def decode_attention_time(self, batch, mean_context) -> float:
        """Seconds of decode attention, all layers."""
        return self._dec(batch, mean_context)

    def prefill_attention_time(self, chunk, context) -> float:
        """Seconds of prefill attention for one chunk, all layers."""
        return self._pre(chunk, context)

    def chunk_time(self, chunk, context) -> float | None:
        """What `step_time` adds for one prefill chunk (its attention; the chunk's tokens
        count in the linear part through `prefill_tokens`). None if `step_time` is a
        subclass's own."""
        if not self._own_step_time():
            return None
        seg = self._pcache.get(chunk) or self._prow(chunk)
        i = bisect_right(self._px, context)
        return seg[0][i] + seg[1][i] * context

    def chunk_times(self, chunk, contexts):
        """`chunk_time` of one chunk size at each context of an integer array, vectorised."""
        import numpy as np  # noqa: PLC0415

        a, s = (np.asarray(v) for v in (self._pcache.get(chunk) or self._prow(chunk)))
        contexts = np.asarray(contexts)
        i = np.searchsorted(self._px, contexts, side="right")
        return a[i] + s[i] * contexts

    def chunk_time_sums(self, chunk, lo, hi):
        """Sum of `chunk_time(chunk, c)` over the integer contexts lo <= c < hi (arrays of
        contexts >= 0), in closed form: `chunk_time` is linear in the context between the
        grid's contexts."""
        import numpy as np  # noqa: PLC0415

        sums = self._psums.get(chunk)
        if sums is None:
            a, s = (np.asarray(v) for v in (self._pcache.get(chunk) or self._prow(chunk)))
            # segment k holds the integer contexts from `starts[k]` to `edges[k]` (excluded):
            # the first integer at or past grid context k is where `bisect_right` moves on
            edges = np.ceil(np.asarray(self._px, dtype=float)).astype(np.int64)
            starts = np.concatenate([[0], edges])
            width = edges - starts[:-1]
            per_segment = a[:-1] * width + s[:-1] * (starts[:-1] + edges - 1) * width / 2.0
            below = np.concatenate([[0.0], np.cumsum(per_segment)])
            sums = self._psums[chunk] = (a, s, edges, starts, below)
        a, s, edges, starts, below = sums

        def upto(c):
            """The sum over the contexts 0 .. c - 1."""
            c = np.asarray(c, dtype=np.int64)
            k = np.searchsorted(edges, c, side="right")
            first = starts[k]
            n = (c - first).astype(float)
            return below[k] + a[k] * n + s[k] * (first + c - 1).astype(float) * n / 2.0

        return upto(hi) - upto(lo)

    def lm_head_time(self, sampled) -> float:
        return self._lm(sampled)

    def extrapolation(self, b_max: int, max_batch: int, max_context: int, factor: float = 2.0) -> list[str]:
        """The sizes a run can reach that lie more than `factor` times past the largest
        measured ones (token load, decode batch, prefill chunk, context), as phrases; []
        when none. A size of 0 is not checked; each attention table's contexts are checked
        against its own largest context, and each batch or chunk row a run uses against its
        own largest measured context where that is short of the table's."""
        out = []
        for what, need, have in (
            ("token load (b_max)", b_max, self._eager.xs[-1]),
            ("decode batch", max_batch, self._dec.rows[-1]),
            ("prefill chunk", b_max, self._pre.rows[-1]),
            # each attention table against its own contexts: a decode table that stops at 128
            # is extrapolated at 6,000 whatever contexts the prefill table reaches
            ("decode context", max_context, self._dec.cols[-1]),
            ("prefill context", max_context, self._pre.cols[-1]),
        ):
            if need > factor * have:
                out.append(f"{what} up to {int(need):,} (measured up to {int(have):,})")
        # a row measured at fewer contexts than its table is filled from its own last points
        # (flat from one), however far the table's other rows reach: a run past such a row's
        # last measured context times the cells between on a guess
        for table, word, size, surface in (
            ("decode_attn", "batch", max_batch, self._dec),
            ("prefill_attn", "chunk", b_max, self._pre),
        ):
            if not size or not max_context:
                continue
            short = []
            for r, last in zip(surface.rows, surface.last):
                if last < surface.cols[-1] and max_context > factor * last:
                    short.append((r, last))
                if r >= size:  # the first row at or above the largest size is the last one used
                    break
            if short:
                rows = ", ".join(f"{int(r):,}" for r, _ in short)
                lasts = ", ".join(f"{int(x):,}" for _, x in short)
                out.append(
                    f"{table} {word} {rows} at contexts up to {int(max_context):,} (measured only up to "
                    f"context {lasts}; a row's cells past its last measured context are filled from its own points)"
                )
        return out

    # -- the CostModel interface ------------------------------------------------------------
    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        b = prefill_tokens + decode_tokens
        try:
            t = self._lin[b] if prefill_tokens else self._glin[b]
        except (IndexError, TypeError):
            t = self.linear_time(b, not prefill_tokens) if b > 0 else 0.0
        if decode_tokens:
            seg = self._dcache.get(decode_tokens) or self._drow(decode_tokens)
            x = decode_context / decode_tokens
            i = bisect_right(self._dx, x)
            t += seg[0][i] + seg[1][i] * x
        if chunks:
            px, pcache = self._px, self._pcache
            for c, x in chunks:
                seg = pcache.get(c) or self._prow(c)
                i = bisect_right(px, x)
                t += seg[0][i] + seg[1][i] * x
        if sampled:
            try:
                t += self._lmd[sampled]
            except (IndexError, TypeError):
                t += self._lm(sampled)
        return t

    def decode_times(self, n, context: int):
        """`CostModel.decode_times`, vectorised: `step_time`'s parts with its arithmetic."""
        import numpy as np  # noqa: PLC0415

        if not self._own_step_time():
            return super().decode_times(n, context)
        n = np.asarray(n, dtype=np.int64)
        glin = np.asarray(self._glin)
        top = len(glin) - 1
        # past the fast-path list, `linear_time(k, True)`: max(the list's last, the eager tail)
        eager = self._eager.values_at(n)
        lin = np.where(n <= top, glin[np.minimum(n, top)], np.where(eager > glin[top], eager, glin[top]))
        x = context / 1  # `step_time`'s mean context k * context / k: the same correctly rounded float
        a, s = self._dec.segments_at(n, bisect_right(self._dx, x))
        return lin + (a + s * x) + self._lm.values_at(n)

    # -- integer-ns fast paths (StepTimer) ---------------------------------------------------
    # Both compute `step_time`'s float with the same additions in the same order, so every
    # duration is `int(round(step_time(...) * NS))` bit for bit (`round` of a float is an int).
    def _own_step_time(self) -> bool:
        """Whether `step_time` is this class's (a subclass that overrides it gets no fast path)."""
        return type(self).step_time is ProfileCostModel.step_time

    def step_timing(self):
        if not self._own_step_time():
            return None
        lin, glin, linear_time = self._lin, self._glin, self.linear_time
        dcache, drow, dx = self._dcache, self._drow, self._dx
        pcache, prow, px = self._pcache, self._prow, self._px
        lmd, lm, check = self._lmd, self._lm, StepTimer._check

        def step_ns(prefill_tokens, decode_tokens, decode_context, chunks, sampled) -> int:
            b = prefill_tokens + decode_tokens
            try:
                t = lin[b] if prefill_tokens else glin[b]
            except (IndexError, TypeError):
                t = linear_time(b, not prefill_tokens) if b > 0 else 0.0
            if decode_tokens:
                seg = dcache.get(decode_tokens) or drow(decode_tokens)
                x = decode_context / decode_tokens
                i = bisect_right(dx, x)
                t += seg[0][i] + seg[1][i] * x
            if chunks:
                for c, x in chunks:
                    seg = pcache.get(c) or prow(c)
                    i = bisect_right(px, x)
                    t += seg[0][i] + seg[1][i] * x
            if sampled:
                try:
                    t += lmd[sampled]
                except (IndexError, TypeError):
                    t += lm(sampled)
            d = round(t * NS)
            return d if d > 0 else check(t, b)  # check raises

        n_dx, inf = len(dx), math.inf
        generic = steps_by_step(step_ns)
        # decode batch m -> the constant parts of its decode-only steps: linear time,
        # decode-attention segments, LM head time (a batch is timed in a few calls, often)
        decode_parts: dict[int, tuple] = {}

        def lm_time(s):
            try:
                return lmd[s]
            except (IndexError, TypeError):
                return lm(s)

        def linear(b, pf):
            try:
                return lin[b] if pf else glin[b]
            except (IndexError, TypeError):
                return linear_time(b, not pf) if b > 0 else 0.0

        def time_steps(durs, t, limit, upto, pf, m, dctx, chunks, rems) -> int:
            if chunks:
                return time_chunked(durs, t, limit, upto, pf, m, dctx, chunks, rems)
            parts = decode_parts.get(m)
            if parts is None:
                if not m:  # an empty plan (none is repeated)
                    return generic(durs, t, limit, upto, pf, m, dctx, chunks, rems)
                parts = decode_parts[m] = (linear(m, 0), *(dcache.get(m) or drow(m)), lm_time(m))
            j = len(durs)
            if j >= upto or t >= limit:
                return t
            # decode only: step j reads context dctx + j * m and samples m tokens. Its mean
            # context only grows: its segment changes only once it reaches the next breakpoint.
            t0, da, ds, t2 = parts
            num = dctx + j * m
            x = num / m
            i = bisect_right(dx, x)
            nxt = dx[i] if i < n_dx else inf
            a = da[i]
            s = ds[i]
            append = durs.append
            while True:
                if x >= nxt:
                    i = bisect_right(dx, x)
                    nxt = dx[i] if i < n_dx else inf
                    a = da[i]
                    s = ds[i]
                tt = t0 + (a + s * x) + t2  # step_time's order: linear, decode attention, LM head
                d = round(tt * NS)
                if d <= 0:
                    check(tt, m)  # raises
                append(d)
                t += d
                j += 1
                if j >= upto or t >= limit:
                    return t
                num += m
                x = num / m

        def time_chunked(durs, t, limit, upto, pf, m, dctx, chunks, rems) -> int:
            j = len(durs)
            if j >= upto or t >= limit:
                return t
            # each chunk's segments looked up once, its context grows by c a step; a chunk
            # samples a token in the step that completes its prefill (rem - j * c == c)
            # most plans hold one chunk: its loop, specialised (1.3% of the instructions of
            # the serverless benchmark at 10k requests), then the general one
            if len(chunks) == 1 and chunks[0][0] > 0:
                ((c, ctx),) = chunks
                pa, ps = pcache.get(c) or prow(c)
                k, r = divmod(rems[0] - c, c)
                last = -1 if r else k  # the step that completes the prefill
                b = pf + m
                t0 = linear(b, pf)
                if m:
                    da, ds = dcache.get(m) or drow(m)
                    t2 = lm_time(m)
                while j < upto and t < limit:
                    tt = t0  # step_time's order: linear, decode attention, chunk, LM head
                    if m:
                        x = (dctx + j * m) / m
                        i = bisect_right(dx, x)
                        tt += da[i] + ds[i] * x
                    x = ctx + j * c
                    i = bisect_right(px, x)
                    tt += pa[i] + ps[i] * x
                    if j == last:
                        tt += lm_time(m + 1)
                    elif m:
                        tt += t2
                    d = round(tt * NS)
                    if d <= 0:
                        check(tt, b)  # raises
                    durs.append(d)
                    t += d
                    j += 1
                return t
            rows = []
            done: dict[int, int] = {}
            for (c, ctx), rem in zip(chunks, rems):
                if c <= 0:  # (no such chunks)
                    return generic(durs, t, limit, upto, pf, m, dctx, chunks, rems)
                pa, ps = pcache.get(c) or prow(c)
                rows.append((c, ctx, pa, ps))
                k, r = divmod(rem - c, c)
                if not r:
                    done[k] = done.get(k, 0) + 1
            b = pf + m
            t0 = linear(b, pf)
            if m:
                da, ds = dcache.get(m) or drow(m)
                t2 = lm_time(m)
            while j < upto and t < limit:
                tt = t0  # step_time's order: linear, decode attention, chunks, LM head
                if m:
                    x = (dctx + j * m) / m
                    i = bisect_right(dx, x)
                    tt += da[i] + ds[i] * x
                for c, ctx, pa, ps in rows:
                    x = ctx + j * c
                    i = bisect_right(px, x)
                    tt += pa[i] + ps[i] * x
                k = done.get(j)
                if k is not None:
                    tt += lm_time(m + k)
                elif m:
                    tt += t2
                d = round(tt * NS)
                if d <= 0:
                    check(tt, b)  # raises
                durs.append(d)
                t += d
                j += 1
            return t

        return step_ns, time_steps

    def describe(self) -> dict:
        return {
            "name": self.name,
            "profile": self.label,
            "source": self.source,
            "layers": self.layers,
            "mode": self.mode,
            "monotone": self.monotone,
            "overlap": self.overlap,
            "graph_max_tokens": self.graph_max,
            "tokens_measured": int(self._eager.xs[-1]),
        }


def validate_steps(model: ProfileCostModel) -> list[dict]:
    """Compose the model for every row of its step table: measured vs predicted ms."""
    out = []
    for c, cctx, nd, dctx, ms in model.steps:
        c, nd = int(c), int(nd)
        pred = model.step_time(c, nd, nd * dctx, [(c, cctx)] if c else [], nd + (1 if c else 0)) * 1e3
        out.append(
            {
                "prefill_chunk": c,
                "prefill_context": cctx,
                "decodes": nd,
                "decode_context": dctx,
                "measured_ms": ms,
                "predicted_ms": pred,
                "rel_error": pred / ms - 1 if ms else math.nan,
            }
        )
    return out


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------


def _num(v: str, col: str, where: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"profile file {where}: column {col!r} holds {v!r}, which is not a number") from None
    if not math.isfinite(x) or x < 0 or (col in _SIZES and x <= 0):
        what = "a positive number" if col in _SIZES else "a non-negative number"
        raise ConfigError(f"profile file {where}: column {col!r} must be {what}, got {v!r}")
    if col == "ms":
        if x > MAX_STEP_MS:  # the formula models' limit: a step of over 1,000 s is no GPU's
            raise ConfigError(f"profile file {where}: column 'ms' must be at most {MAX_STEP_MS:g} ms, got {v!r}")
        return x
    if col in _STEP_COUNTS:
        if x != math.floor(x) or x > MAX_B_MAX:
            raise ConfigError(
                f"profile file {where}: column {col!r} must be a whole number of at most {MAX_B_MAX:,} "
                f"(no step holds more tokens), got {v!r}"
            )
    elif col in _CONTEXTS and x > MAX_LENGTH:
        raise ConfigError(
            f"profile file {where}: column {col!r} must be at most {MAX_LENGTH:,} tokens "
            f"(the longest prompt or output), got {v!r}"
        )
    return int(x) if x == int(x) else x


def _read_csv(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            rows = [
                (k + 2, {key: (val or "").strip() for key, val in r.items() if key is not None})
                for k, r in enumerate(reader)
            ]
    except FileNotFoundError:
        raise ConfigError(f"profile file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"profile file {path} cannot be read: {e}") from None
    repeated = sorted({h for h in header if h and header.count(h) > 1})
    if repeated:  # a row would keep the last of them without a word
        raise ConfigError(f"profile file {path}: column {repeated[0]!r} appears more than once in the header")
    rows = [(n, r) for n, r in rows if any(r.values())]  # skip blank lines
    return header, rows


def _table_rows(table: str, header: Sequence[str], rows, where: str, model: str | None) -> list[tuple]:
    """Parse the rows of one table (already filtered to the table) into tuples, averaging
    duplicate keys. `where` names the file."""
    keys = TABLES[table][1]
    missing = [c for c in keys + ("ms",) if c not in header]
    if missing:
        raise ConfigError(
            f"profile file {where}: {table} table lacks column(s) {', '.join(missing)} "
            f"(found: {', '.join(h for h in header if h) or 'none'})"
        )
    if model is not None and "model" in header:
        # such a row used to be dropped without a word; kept for every model it would be
        # averaged into each model's measurements
        unnamed = next((n for n, r in rows if not r.get("model", "")), None)
        if unnamed is not None:
            raise ConfigError(
                f"profile file {where} line {unnamed}: the model cell is empty; in a table with a model "
                f"column every row names its model (here {model!r})"
            )
        rows = [(n, r) for n, r in rows if r.get("model", "") == model]
    if not rows:
        raise ConfigError(
            f"profile file {where}: the {table} table has no rows"
            + (f" for model {model!r}" if model is not None and "model" in header else "")
        )
    acc: dict[tuple, list[float]] = {}
    for n, r in rows:
        at = f"{where} line {n}"
        key = tuple(_num(r.get(c, ""), c, at) for c in keys)
        if table == "linear":
            mode = (r.get("mode") or "eager").lower()
            if mode not in ("eager", "graph"):
                raise ConfigError(f"profile file {at}: mode must be eager or graph, got {mode!r}")
            key = key + (mode,)
        t = _num(r.get("ms", ""), "ms", at)
        if table == "step" and t <= 0:  # a whole step takes time; validation divides by it
            raise ConfigError(f"profile file {at}: column 'ms' of a step row must be a positive number, got {t:g}")
        if table == "linear" and t < MIN_STEP_MS:  # (every step's floor: capacity divides by its time)
            raise ConfigError(
                f"profile file {at}: column 'ms' of a linear row must be at least {MIN_STEP_MS:g} ms (a forward "
                f"pass takes time), got {t:g}"
            )
        acc.setdefault(key, []).append(t)
    _check_a_size_to_extrapolate_from(table, acc, where)
    return [k + (sum(v) / len(v),) for k, v in acc.items()]


# the size axis each table extrapolates along, and what one measured size leaves out: the
# others draw a secant between two sizes; prefill attention scales its largest chunk's part
# above the launch floor by attention work, and with one chunk (launch-bound at context 0)
# that part is nothing, or, with the floor scaled too, hundreds of times the launch cost
_SECANT_AXES = {
    "linear": ("eager token load", "every larger one would cost the same"),
    "lm_head": ("token count", "every larger one would cost the same"),
    "decode_attn": ("batch size", "every larger one would cost the same"),
    "prefill_attn": ("chunk size", "its launch floor cannot be told from its attention work"),
}


def _check_a_size_to_extrapolate_from(table: str, keys, where: str) -> None:
    """Refuse a table measured at one size: with no second point there is no slope, and
    every larger step would silently cost the same as the one measured (or, for prefill
    attention, nothing or far too much)."""
    if table not in _SECANT_AXES:
        return
    axis, why = _SECANT_AXES[table]
    sizes = {k[0] for k in keys if table != "linear" or k[1] == "eager"}
    if len(sizes) == 1:
        raise ConfigError(
            f"profile file {where}: the {table} table has one {axis} ({sizes.pop():g}), so it cannot "
            f"extrapolate ({why}); measure at least two"
        )


def _models_in(header, rows) -> list[str]:
    if "model" not in header:
        return []
    return sorted({r.get("model", "") for _, r in rows} - {""})


def _pick_model(models_seen: list[str], model: str | None, where: str) -> str | None:
    if model is None:
        if len(models_seen) > 1:
            raise ConfigError(
                f"profile {where} holds several models ({', '.join(models_seen)}); choose one with {where}#MODEL"
            )
        return models_seen[0] if models_seen else None
    if not models_seen:  # #NAME picked nothing: it only set the layer count, by a shipped name
        raise ConfigError(
            f"profile {where}#{model}: the profile names no model (no model column, or an empty one), so "
            f"#{model} picks nothing; drop it (give the layer count, if needed, as the option ,layers=N)"
        )
    if model not in models_seen:
        raise ConfigError(f"profile {where} has no model {model!r} (models: {', '.join(models_seen)})")
    return model


def _read_meta(folder: Path) -> dict:
    p = folder / META_FILE
    if not p.exists():
        return {}
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"profile file {p} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("models", {}), dict):
        raise ConfigError(f'profile file {p} must hold a JSON object with an optional "models" object')
    return meta


def _meta_layers(meta: dict, model: str | None, where: str):
    entry = meta.get("models", {}).get(model) if model is not None else None
    if entry is not None and not isinstance(entry, dict):
        raise ConfigError(f"profile file {where}: models.{model} must be a JSON object")
    layers = (entry or {}).get("layers", meta.get("layers"))
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0):
        raise ConfigError(f"profile file {where}: layers must be a positive integer, got {layers!r}")
    return layers


def _shipped() -> dict[str, tuple[Path, str]]:
    """Shipped profiles: name -> (folder, model)."""
    out = {}
    if PROFILES_DIR.is_dir():
        for folder in sorted(PROFILES_DIR.iterdir()):
            if folder.is_dir() and (folder / META_FILE).exists():
                for model in _read_meta(folder).get("models", {}):
                    out[f"{folder.name}-{model}"] = (folder, model)
    return out


def _shipped_name(source: str, shipped: dict) -> str | None:
    """The shipped profile `source` names: itself, or the one name it spells in other case
    (`H200-LLAMA-3-8B`, as cost-model kinds are read case-blind) when no file or folder of
    that name exists (a path follows the file system); None otherwise."""
    if source in shipped:
        return source
    if _exists(source):
        return None
    same = [name for name in shipped if name.lower() == source.lower()]
    return same[0] if len(same) == 1 else None


def _known_layers(model: str | None):
    if model is None:
        return None
    for folder, m in _shipped().values():
        if m == model:
            return _meta_layers(_read_meta(folder), m, str(folder / META_FILE))
    return None


def _load_folder(folder: Path, model: str | None) -> tuple[dict, str | None, int | None]:
    parsed = {}
    seen: set[str] = set()
    raw = {}
    for table, (fname, _) in TABLES.items():
        p = folder / fname
        if table not in REQUIRED_TABLES and not p.exists():
            continue
        header, rows = _read_csv(p)
        if not header:
            raise ConfigError(f"profile file {p} is empty")
        raw[table] = (header, rows, p)
        seen.update(_models_in(header, rows))
    model = _pick_model(sorted(seen), model, str(folder))
    for table, (header, rows, p) in raw.items():
        parsed[table] = _table_rows(table, header, rows, str(p), model)
    meta_path = str(folder / META_FILE)
    layers = _meta_layers(_read_meta(folder), model, meta_path)
    return parsed, model, layers


def _load_combined(path: Path, model: str | None) -> tuple[dict, str | None, int | None]:
    header, rows = _read_csv(path)
    if not header:
        raise ConfigError(f"profile file {path} is empty")
    if "table" not in header:
        raise ConfigError(
            f"profile file {path}: a combined profile CSV needs a 'table' column "
            f"(found: {', '.join(h for h in header if h) or 'none'})"
        )
    for n, r in rows:
        if r.get("table", "") not in TABLES:
            raise ConfigError(
                f"profile file {path} line {n}: unknown table {r.get('table', '')!r} (known: {', '.join(TABLES)})"
            )
    model = _pick_model(_models_in(header, rows), model, str(path))
    parsed = {}
    for table in TABLES:
        sub = [(n, r) for n, r in rows if r["table"] == table]
        if table not in REQUIRED_TABLES and not sub:
            continue
        parsed[table] = _table_rows(table, header, sub, str(path), model)
    layers = None
    if "layers" in header:
        counts = set()
        for _, r in rows:
            v = r.get("layers")
            if v and (model is None or "model" not in header or r.get("model") == model):
                # by value: a table written as floats says 2.0 where another says 2
                try:
                    n = float(v)
                except ValueError:
                    n = 0.0
                if not (math.isfinite(n) and n > 0 and n == int(n)):
                    raise ConfigError(f"profile file {path}: layers must be a positive integer, got {v!r}")
                counts.add(int(n))
        if len(counts) > 1:
            raise ConfigError(
                f"profile file {path}: the layers column disagrees with itself ({', '.join(map(str, sorted(counts)))})"
            )
        if counts:
            layers = counts.pop()
    return parsed, model, layers


def _parse_options(parts: list[str], spec: str) -> dict:
    opts: dict = {}
    for part in parts:
        part = part.strip()
        if not part:
            continue
        k, eq, v = part.partition("=")
        k, v = k.strip().lower(), v.strip()
        if not eq:
            raise ConfigError(f"profile {spec!r}: expected key=value after the profile, got {part!r}")
        if k in opts:  # the last one silently winning hides a typo in the other
            raise ConfigError(f"profile {spec!r}: {k} given twice")
        if k == "mode":
            if v.lower() not in MODES:
                raise ConfigError(f"profile {spec!r}: mode must be one of {', '.join(MODES)}, got {v!r}")
            opts["mode"] = v.lower()
        elif k == "monotone":
            if v.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ConfigError(f"profile {spec!r}: monotone must be 1 or 0, got {v!r}")
            opts["monotone"] = v.lower() in ("1", "true", "yes", "on")
        elif k == "overlap":
            try:
                opts["overlap"] = float(v)
            except ValueError:
                raise ConfigError(f"profile {spec!r}: overlap must be a number from 0 to 1, got {v!r}") from None
            if not 0.0 <= opts["overlap"] <= 1.0:
                raise ConfigError(f"profile {spec!r}: overlap must be a number from 0 to 1, got {v!r}")
        elif k == "layers":
            opts["layers"] = whole_from_text(v)  # layers=1e2 is 100, as b0=1e3 is 1000
            if opts["layers"] is None or opts["layers"] <= 0:
                raise ConfigError(f"profile {spec!r}: layers must be a positive integer, got {v!r}")
        else:
            raise ConfigError(f"profile {spec!r}: unknown option {k!r} (known: mode, monotone, overlap, layers)")
    return opts


_CACHE: dict = {}


def _path_and_model(source: str) -> tuple[str, str]:
    """PATH[#MODEL] split: the whole of `source` when it names an existing file or folder
    (a path may hold `#`: run#1/profile.csv), else at the last `#` (a model name holds none)."""
    if "#" not in source or Path(source).exists():
        return source, ""
    path, _, model = source.rpartition("#")
    return path, model


def _exists(path_text: str) -> bool:
    try:
        return bool(path_text.strip()) and Path(path_text).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _split_spec(spec: str) -> tuple[str, list[str]]:
    """A spec's source (a shipped name, or PATH[#MODEL]) and its `key=value` parts: the
    longest leading run of its comma-separated parts that names an existing file or folder
    (a path may hold commas, and `,key=value` in a folder's name: run,mode=x/), else the
    first part; the parts after it are options (a bad one is refused by name)."""
    parts = spec.split(",")

    def names_a_path(k: int) -> bool:
        path, model = _path_and_model(",".join(parts[:k]))
        return "," not in model and _exists(path)  # a model name holds no comma

    k = next((k for k in range(len(parts), 1, -1) if names_a_path(k)), 1)
    return ",".join(parts[:k]).strip() or DEFAULT_PROFILE, parts[k:]


def spec_source(spec: str) -> str:
    """The source of a profile spec without its options: a shipped name or PATH[#MODEL]."""
    return _split_spec((spec or DEFAULT_PROFILE).strip())[0]


def source_path(spec: str) -> str:
    """The PATH of a profile spec (the part after `profile:`; PATH[#MODEL][,options]), or
    a shipped profile's name."""
    return _path_and_model(_split_spec(spec)[0])[0]


def spec_options(spec: str) -> dict:
    """The options a profile spec gives (`mode`, `overlap`, ...), checked; those not given are absent."""
    spec = (spec or DEFAULT_PROFILE).strip()
    return _parse_options(_split_spec(spec)[1], spec)


def recorded_spec(spec: str) -> str:
    """`spec` as a run's config.json records it: a PATH of your own absolute
    (`core.paths.recorded_path`), a shipped name as given."""
    source, opts_parts = _split_spec((spec or DEFAULT_PROFILE).strip())
    if source in _shipped():
        return spec
    name = _shipped_name(source, _shipped())
    if name is not None:  # its own spelling, which no file in the rerun's folder can shadow
        return ",".join([name, *opts_parts])
    path_text, model = _path_and_model(source)
    return ",".join([recorded_path(path_text) + ("#" + model if model else ""), *opts_parts])


def load_profile(spec: str = DEFAULT_PROFILE) -> ProfileCostModel:
    """Load a profile cost model from a spec (see the module docstring for the forms)."""
    spec = (spec or DEFAULT_PROFILE).strip()
    shipped = _shipped()
    source, opts_parts = _split_spec(spec)
    opts = _parse_options(opts_parts, spec)
    key = None
    name = _shipped_name(source, shipped)
    if name is not None:
        folder, model = shipped[name]
        key = (name, tuple(sorted(opts.items())))
        if key in _CACHE:
            return _CACHE[key]
        tables, model, layers = _load_folder(folder, model)
        label, where = name, str(folder)
    else:
        path_text, model = _path_and_model(source)
        model = model.strip() or None
        if not path_text.strip():  # (`profile:#x` read the current folder as the profile's)
            raise ConfigError(f"profile {source!r} gives no file or folder before its '#': give PATH#MODEL")
        path = Path(recorded_path(path_text))  # absolute: describe()'s source is recorded
        if path.is_dir() and not any((path / TABLES[t][0]).exists() for t in REQUIRED_TABLES):
            if not (path / COMBINED_FILE).is_file():
                raise ConfigError(
                    f"profile folder {path} holds neither the table files "
                    f"({', '.join(TABLES[t][0] for t in REQUIRED_TABLES)}) nor {COMBINED_FILE} "
                    f"(what `llmsched profile --out {path}` writes)"
                )
            path = path / COMBINED_FILE
        if path.is_dir():
            tables, model, layers = _load_folder(path, model)
            where = str(path / META_FILE)
        elif path.is_file():
            tables, model, layers = _load_combined(path, model)
            where = str(path)
        else:
            raise ConfigError(
                f"unknown profile {source!r}: not a shipped profile "
                f"({', '.join(shipped) or 'none'}) nor an existing file or folder"
            )
        label = source
    layers = opts.get("layers", layers)
    if layers is None:
        layers = _known_layers(model)
    if layers is None:
        raise ConfigError(
            f"profile {label}: the layer count of model {model or '(unnamed)'} is unknown; "
            f'give it in {where} ("layers") or as the option ,layers=N'
        )
    m = ProfileCostModel(
        tables,
        layers,
        mode=opts.get("mode", "auto"),
        monotone=opts.get("monotone", True),
        overlap=opts.get("overlap", 1.0),
        label=label,
        source=str(where),
    )
    if key is None:
        # the user's own tables, their layer count not set by hand: it says which model they are of
        m.layers_measured = "layers" not in opts
    else:
        _CACHE[key] = m
    return m


def check_profile_layers(cost, layers: int, flag: str, model) -> None:
    """Refuse a profile of the user's own measured on a model of another layer count than
    `layers`, the model's it is used with (every step time would be that other model's,
    silently). The shipped profiles, large models' on an H200, are used as given, and so
    is a layer count the spec sets (`,layers=N`): `layers_measured` is False for them.
    `flag` precedes the profile's path in the message (`--profile `), `model` names the model."""
    if not getattr(cost, "layers_measured", False) or cost.layers == layers:
        return
    raise ConfigError(
        f"{flag}{cost.label} was measured on a model of {cost.layers} layers, but --model {model} has {layers}: "
        f"profile this model (llmsched profile --model {model} --out PATH)"
    )


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with the package."""
    return sorted(_shipped())
