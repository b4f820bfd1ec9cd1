"""How long a full step takes when request lengths vary (docs/stability.md "Contexts of a
full step").

A context-dependent cost model (the H200 profile) needs the contexts a step's tokens
attend to. With lengths that vary, taking them from the mean prompt and output is
optimistic: a decoded token's context is size-biased (a long output decodes many tokens
at long contexts) and so is a prefill token's (a long prompt is chunked at contexts up
to its length). A `LengthMix` holds a sample of the workload's lengths and times a step
shape `(x, y)` as an average over the steps a token-budget policy runs:

- each of the `y` decoders reads the token-weighted mean decode context
  `E[(o - 1) p + o (o - 1) / 2] / E[o - 1]` (a request with prompt `p` and output `o`
  decodes tokens 2..o at contexts p + 1 .. p + o - 1);
- the `x` prefill tokens are a window of `x` consecutive tokens of the sample's prompts
  laid end to end (chunked prefill serves the queue's prompts in order, `x` tokens a
  step): the window's pieces are its chunks, each after the tokens of its prompt before
  it. The stream (up to `STREAM_PROMPTS` prompts taken evenly through the sample) is
  circular, and the step time is averaged over `WINDOWS` windows spread evenly over it;
- `x / E[p]` prompts complete per step (their first tokens are sampled), rounded.

Measured against the simulator (steps of Sarathi-Serve under overload, all at `b_max`;
`benchmarks/capacity_accuracy.py`), this predicts the full steps' token rate within 0.4%
on six workloads where the mean contexts were 2-8% optimistic (docs/stability.md). With a
prefix cache, the sample may say how many tokens of each prompt the cache serves
(`cached`): the stream then holds each prompt's uncached tokens only, each piece after its
cached prefix (a chunk attends to the cached tokens before it); decoders read the same
contexts. The adaptive policy does not use a mix.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .errors import ConfigError

__all__ = ["LengthMix", "STREAM_PROMPTS", "WINDOWS"]

#: prompts of the sample laid end to end as the prefill stream (taken evenly through it)
STREAM_PROMPTS = 10_000
#: windows a prefill load is averaged over (evenly spread over the stream)
WINDOWS = 256
#: windows for a cost model whose step time is not a sum over its chunks (each shape is
#: then timed window by window)
GENERIC_WINDOWS = 32
#: prefill loads up to this are timed exactly; above it on a geometric grid (ratio
#: `KNOT_RATIO`) and interpolated, so that a region or a scan of every load stays cheap
EXACT_LOADS = 256
KNOT_RATIO = 1.01
_LOG_RATIO = math.log(KNOT_RATIO)


def _knot(k: int) -> int:
    """The k-th load of the interpolation grid (k >= 0)."""
    return max(EXACT_LOADS, int(round(EXACT_LOADS * KNOT_RATIO**k)))


class _PerCost:
    """What a `LengthMix` computed for one cost model: {prefill load x: mean chunk time of
    its windows}, and the prefix sums of the stream's whole prompts' chunk times."""

    __slots__ = ("means", "whole")

    def __init__(self):
        self.means: dict[int, float] = {}
        self.whole: list[float] | None = None

    def whole_sums(self, chunk_time, prompts: np.ndarray, base: list[int]) -> list[float]:
        """[0, t(p_0), t(p_0) + t(p_1), ...] of the stream's whole pieces (each after its
        cached prefix, `base`)."""
        if self.whole is None:
            times = [chunk_time(p, b) for p, b in zip(prompts.tolist(), base)]
            self.whole = np.concatenate([[0.0], np.cumsum(times)]).tolist()
        return self.whole


class LengthMix:
    """A sample of a workload's (prompt, output) lengths, for timing step shapes (module
    docstring). `prompts` and `outputs`: equal-length sequences of positive integers;
    `cached` (optional, the same length): the prompt tokens a prefix cache serves each
    request, from 0 to its prompt less one (the last prompt token is always computed)."""

    def __init__(self, prompts, outputs, cached=None):
        p = np.asarray(prompts)
        o = np.asarray(outputs)
        if p.ndim != 1 or p.shape != o.shape or not len(p):
            raise ConfigError("a length mix needs equal, non-empty sequences of prompt and output lengths")
        if not (np.issubdtype(p.dtype, np.number) and np.issubdtype(o.dtype, np.number)):
            raise ConfigError("prompt and output lengths must be numbers")
        if not (np.all(np.isfinite(p)) and np.all(np.isfinite(o)) and p.min() >= 1 and o.min() >= 1):
            raise ConfigError("prompt lengths and output lengths must be >= 1 token")
        c = np.zeros(len(p), dtype=np.int64) if cached is None else np.asarray(cached)
        if c.shape != p.shape or not np.issubdtype(c.dtype, np.number) or not np.all(np.isfinite(c)):
            raise ConfigError("cached prompt tokens must be numbers, one per request of the length mix")
        c = np.rint(c).astype(np.int64)
        if c.min() < 0 or np.any(c > np.rint(p) - 1):
            raise ConfigError("cached prompt tokens must be from 0 to the prompt's length less one")
        pf = p.astype(np.float64)
        of = o.astype(np.float64)
        self.mean_prompt = float(pf.mean())
        self.mean_output = float(of.mean())
        decodes = float((of - 1.0).sum())
        # the mean context of a decoded token (a request with no decode tokens has none)
        self.decode_context = (
            float(((of - 1.0) * pf + of * (of - 1.0) / 2.0).sum()) / decodes if decodes > 0 else self.mean_prompt
        )
        n = len(pf)
        # the prefill stream: up to STREAM_PROMPTS prompts taken evenly through the sample
        # (a trace's first rows need not be typical), in their order
        pick = np.arange(n) if n <= STREAM_PROMPTS else (np.arange(STREAM_PROMPTS) * n) // STREAM_PROMPTS
        self.mean_cached = float(c.mean())
        base = c[pick]
        stream = np.rint(pf[pick]).astype(np.int64) - base  # each prompt's uncached tokens
        self._prompts = stream
        self._base_list = base.tolist()
        self._ends = np.cumsum(stream)
        self._total = int(self._ends[-1])
        self._start_list = (self._ends - stream).tolist()  # (indexing a list is what the loops do)
        self._end_list = self._ends.tolist()
        self._stream_mean = float(stream.mean())
        # what each cost model's timing of the stream computed (`_PerCost`)
        self._costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def describe(self) -> dict:
        d = {
            "mean_prompt": self.mean_prompt,
            "mean_output": self.mean_output,
            "decode_context": self.decode_context,
        }
        if self.mean_cached:
            d["mean_cached_prompt"] = self.mean_cached
        return d

    # ---- windows of the prefill stream -------------------------------------------------
    # The stream is circular: a window may run past its end into its start again (any
    # number of times, for a budget larger than the sample's prompts), so every window is
    # timed from the same prompts whatever the load.
    def _windows(self, x: int):
        """Per window of `x` tokens: its start `u` (in the first lap), the prompt `i0`
        holding it, the position `r` of its last token within its lap, the prompt `i1`
        holding that one and its index counted over the laps (`g1 = lap * n + i1`)."""
        total = self._total
        k = np.arange(WINDOWS, dtype=np.float64)
        u = ((k + 0.5) * total / WINDOWS).astype(np.int64)
        i0 = np.searchsorted(self._ends, u, side="right")
        lap, r = np.divmod(u + (x - 1), total)
        i1 = np.searchsorted(self._ends, r, side="right")
        return u, i0, r, i1, lap * len(self._prompts) + i1

    def _window_parts(self, x: int, count: int | None = None):
        """Per window of `x` tokens (`count` of them spread over all, default all): (its first
        piece, its last piece or None when one prompt holds it all, the lap-counted indices
        of the whole prompts between as a range, the prompts it completes). A piece is
        (tokens, context before it)."""
        u, i0, r, i1, g1 = self._windows(x)
        idx = range(len(u)) if count is None else np.linspace(0, len(u) - 1, count).astype(np.int64).tolist()
        starts, ends, base = self._start_list, self._end_list, self._base_list
        u, i0, r, i1, g1 = u.tolist(), i0.tolist(), r.tolist(), i1.tolist(), g1.tolist()
        for j in idx:
            a, s, last, t, g = u[j], i0[j], r[j], i1[j], g1[j]
            closes = int(ends[t] == last + 1)  # the window ends its last prompt
            if g == s:
                yield (x, a - starts[s] + base[s]), None, range(0), closes
            else:
                first = (ends[s] - a, a - starts[s] + base[s])
                yield first, (last + 1 - starts[t], base[t]), range(s + 1, g), g - s + closes

    def window_chunks(self, x: int, count: int | None = None) -> list[tuple[list[tuple[int, int]], int]]:
        """`count` (default all) of the windows of `x` prefill tokens, spread over the
        stream: each as ([(chunk tokens, context before it)], prompts it completes)."""
        x = int(x)
        if x <= 0:
            return [([], 0)]
        prompts = self._prompts.tolist()
        base = self._base_list
        n = len(prompts)
        out = []
        for first, last, between, done in self._window_parts(x, count):
            chunks = [first] + [(prompts[h % n], base[h % n]) for h in between]
            if last is not None:
                chunks.append(last)
            out.append((chunks, done))
        return out

    def _chunk_mean_exact(self, cost, x: int) -> float:
        """Mean over the windows of x tokens of their chunks' time (`cost.chunk_time`), the
        whole prompts inside a window summed from prefix sums over the stream."""
        ct = cost.chunk_time
        n = len(self._prompts)
        whole = None
        total = 0.0
        windows = 0
        for first, last, between, _ in self._window_parts(x):
            windows += 1
            total += ct(*first)
            if last is not None:
                total += ct(*last)
            if between:
                if whole is None:
                    whole = self._per_cost(cost).whole_sums(ct, self._prompts, self._base_list)
                hi, lo = divmod(between.stop, n), divmod(between.start, n)
                total += (hi[0] - lo[0]) * whole[n] + whole[hi[1]] - whole[lo[1]]
        return total / windows

    def _per_cost(self, cost) -> _PerCost:
        cache = self._costs.get(cost)
        if cache is None:
            cache = self._costs[cost] = _PerCost()
        return cache

    def chunk_mean(self, cost, x: int) -> float:
        """Mean chunk time (seconds, `cost.chunk_time`) of a step's `x` prefill tokens:
        exact up to `EXACT_LOADS` tokens, above it interpolated between loads on a grid of
        ratio `KNOT_RATIO`."""
        x = int(x)
        if x <= 0:
            return 0.0
        cache = self._per_cost(cost).means
        if x <= EXACT_LOADS:
            v = cache.get(x)
            if v is None:
                v = cache[x] = self._chunk_mean_exact(cost, x)
            return v
        # the grid knots around x: EXACT_LOADS * KNOT_RATIO^k, rounded
        k = int(math.log(x / EXACT_LOADS) / _LOG_RATIO)
        lo = _knot(k)
        while lo > x:
            k -= 1
            lo = _knot(k)
        hi = _knot(k + 1)
        while hi <= x:
            k += 1
            lo, hi = hi, _knot(k + 1)
        a = cache.get(lo)
        if a is None:
            a = cache[lo] = self._chunk_mean_exact(cost, lo)
        if x == lo:
            return a
        b = cache.get(hi)
        if b is None:
            b = cache[hi] = self._chunk_mean_exact(cost, hi)
        return a + (b - a) * (x - lo) / (hi - lo)

    # ---- the timer -----------------------------------------------------------------------
    def timer(self, cost):
        """`t(x, y)`: the mean step time of `x` prefill and `y` decode tokens (module
        docstring) under `cost`, a context-dependent CostModel."""
        step_time = cost.step_time
        ctx = self.decode_context
        per_prompt = self._stream_mean
        additive = cost.chunk_time(1, 0) is not None
        if not additive:
            # a model whose step time is not a sum over its chunks: each shape timed over
            # a few windows, chunk by chunk
            windows: dict[int, list] = {}

            def generic(x, y) -> float:
                x, y = int(x), int(y)
                ws = windows.get(x)
                if ws is None:
                    ws = windows[x] = self.window_chunks(x, GENERIC_WINDOWS)
                d = int(round(y * ctx))
                return sum(float(step_time(x, y, d, chunks, y + done)) for chunks, done in ws) / len(ws)

            return generic

        def time_of(x, y) -> float:
            x, y = int(x), int(y)
            d = int(round(y * ctx))
            if not x:
                return float(step_time(0, y, d, [], y))
            # x / E[p] prompts complete a step (their first tokens are sampled)
            return float(step_time(x, y, d, [], y + int(round(x / per_prompt)))) + self.chunk_mean(cost, x)

        return time_of
