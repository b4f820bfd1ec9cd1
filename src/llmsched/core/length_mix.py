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
  circular, and the step time is the mean over the windows from every token of it,
  summed in closed form per prompt (a cost model whose step time is not a sum over its
  chunks: over `GENERIC_WINDOWS` windows spread evenly). That takes a model's own
  `chunk_time_sums` (the profile's) and pieces of at most `EXACT_EDGES` tokens; a model
  with `chunk_time` alone, or longer pieces (long prompts at large loads), is averaged over
  `WINDOWS` windows spread evenly, exactly up to `EXACT_LOADS` tokens and interpolated
  between loads on a grid above (as before 2026-12-02);
- `x / E[p]` prompts complete per step (their first tokens are sampled): a time-share of
  the steps completing the whole numbers around it.

Every window counts, so the timing is no sample: removing cached tokens removes their time
and no more (docs/stability.md; 256 windows, the sample this replaced, put lambda* with
caching up to a few percent below lambda* without).

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
#: windows of the prefill stream a step is timed over for a cost model whose step time is
#: not a sum over its chunks (each shape is then timed window by window; a sum over chunks
#: is averaged over every window, exactly)
GENERIC_WINDOWS = 32
#: windows `window_chunks` lists by default, evenly spread over the stream; also the
#: sample a load is averaged over where it is not summed over every window (below)
WINDOWS = 256
#: the exact sum over every window walks each piece length m up to min(load - 1, longest
#: prompt): past this many, a load is interpolated between loads of the grid below
#: (sampled past it), so that long prompts with large loads stay cheap
EXACT_EDGES = 8192
#: the interpolation grid: exact up to `EXACT_LOADS` tokens, above it loads on a geometric
#: grid of ratio `KNOT_RATIO`
EXACT_LOADS = 256
KNOT_RATIO = 1.01
_LOG_RATIO = math.log(KNOT_RATIO)
#: `LengthMix.of_means`: a mean prompt's fraction of a token as a ratio k / n, n at most this
MEANS_DENOMINATOR = 256


def _knot(k: int) -> int:
    """The k-th load of the interpolation grid (k >= 0)."""
    return max(EXACT_LOADS, int(round(EXACT_LOADS * KNOT_RATIO**k)))


def _sums_every_window(cost) -> bool:
    """Whether `cost` sums its chunk times over contexts itself (`chunk_time_sums`, as the
    profile does in closed form): the mean over every window is then cheap. A model that
    only defines `chunk_time` is averaged over `WINDOWS` windows (the default sums would
    call it once per context per prompt per load)."""
    from .cost import CostModel  # noqa: PLC0415

    return type(cost).chunk_time_sums is not CostModel.chunk_time_sums


class _PerCost:
    """What a `LengthMix` computed for one cost model: {prefill load x: mean chunk time of
    its windows}, the prefix sums of the stream's whole prompts' chunk times (`whole`,
    `whole_by_len`: weighted by their lengths) and of the edge pieces' (`edges`)."""

    __slots__ = ("means", "whole", "whole_by_len", "edges", "whole_list", "sums")

    def __init__(self, sums: bool):
        self.sums = sums  # `_sums_every_window`
        self.means: dict[int, float] = {}
        self.whole: np.ndarray | None = None
        self.whole_by_len: np.ndarray | None = None
        self.edges: list[float] = [0.0]
        self.whole_list: list[float] | None = None  # the stream's whole prompts, in its order

    def whole_sums(self, chunk_time, prompts: np.ndarray, base: list[int]) -> list[float]:
        """[0, t(p_0), t(p_0) + t(p_1), ...] of the stream's whole pieces (each after its
        cached prefix, `base`), in the stream's order."""
        if self.whole_list is None:
            times = [chunk_time(p, b) for p, b in zip(prompts.tolist(), base)]
            self.whole_list = np.concatenate([[0.0], np.cumsum(times)]).tolist()
        return self.whole_list


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
        # the longest context a request of the sample reaches (its last output token's)
        self.longest_context = int(np.rint((pf + of).max())) - 1
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
        order = np.argsort(stream, kind="stable")
        self._sorted_len, self._sorted_base = stream[order], base[order]
        self._longest = int(self._sorted_len[-1])
        # what each cost model's timing of the stream computed (`_PerCost`)
        self._costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def of_means(cls, mean_prompt: float, mean_output: float, cached: float = 0.0) -> LengthMix:
        """The mix of lengths that do not vary, at the given means (>= 1 token each): every
        output `mean_output` tokens (a fraction only moves the decoders' mean context), the
        prompts the two whole numbers around `mean_prompt`, in the proportion (within
        1 / MEANS_DENOMINATOR of a token) that makes their mean `mean_prompt`, spread evenly
        through the stream; `cached` (a prefix cache's tokens per request) rounded, at most
        each prompt's length less one. Means given instead of a workload are timed with it
        (`representative_timer`, `theory.capacity`), as the lengths they describe are."""
        from fractions import Fraction  # noqa: PLC0415

        p, o = float(mean_prompt), float(mean_output)
        lo = math.floor(p)
        share = Fraction(p - lo).limit_denominator(MEANS_DENOMINATOR)
        n, k = share.denominator, share.numerator  # k of every n prompts hold lo + 1 tokens
        i = np.arange(n)
        prompts = lo + ((i + 1) * k // n - i * k // n)
        hits = np.minimum(int(round(float(cached))), prompts - 1) if cached else None
        return cls(prompts, np.full(n, o), hits)

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

    def _per_cost(self, cost) -> _PerCost:
        cache = self._costs.get(cost)
        if cache is None:
            cache = self._costs[cost] = _PerCost(_sums_every_window(cost))
        return cache

    # ---- the mean over every window ------------------------------------------------------
    # Summed over every start u of the circular stream, the pieces a window of x tokens cuts
    # from one prompt of L uncached tokens after b cached ones are (with the laps it lies in
    # the same as over all integers u): windows starting at its token j hold (min(L - j, x),
    # b + j); windows starting before it hold its first min(L, k) tokens, k = 1 .. x - 1.
    # So per prompt: x tokens at each context b .. b + L - x (when L >= x), the last m
    # tokens and the first m tokens for each m = 1 .. min(L, x - 1), and the whole prompt
    # x - 1 - L times more (when L < x - 1). The mean over the T starts is their sum / T.
    def _edge_sum(self, cost, cache: _PerCost, m_top: int) -> float:
        """Sum over m = 1 .. m_top of every prompt's last and first m tokens' chunk times
        (prompts of at least m tokens), extended as far as asked."""
        lens, base = self._sorted_len, self._sorted_base
        edges = cache.edges
        while len(edges) <= m_top:
            m = len(edges)
            k = int(np.searchsorted(lens, m, side="left"))  # the prompts of m tokens or more
            ends = base[k:] + lens[k:] - m
            edges.append(edges[-1] + float(cost.chunk_times(m, ends).sum() + cost.chunk_times(m, base[k:]).sum()))
        return edges[m_top]

    def _window_sum(self, cost, x: int) -> float:
        """The chunk times of the windows of `x` tokens from every start, summed."""
        cache = self._per_cost(cost)
        lens, base = self._sorted_len, self._sorted_base
        if cache.whole is None:
            times = np.array([cost.chunk_time(n, b) for n, b in zip(lens.tolist(), base.tolist())], dtype=float)
            cache.whole = np.concatenate([[0.0], np.cumsum(times)])
            cache.whole_by_len = np.concatenate([[0.0], np.cumsum(times * lens)])
        top = self._longest
        if x - 1 > top:  # no prompt holds a window: every one is whole x - 1 - L times more
            whole = (x - 1) * float(cache.whole[-1]) - float(cache.whole_by_len[-1])
            return self._edge_sum(cost, cache, top) + whole
        k = int(np.searchsorted(lens, x, side="left"))  # prompts of x tokens or more from k
        inside = float(cost.chunk_time_sums(x, base[k:], base[k:] + lens[k:] - x + 1).sum()) if k < len(lens) else 0.0
        edge = self._edge_sum(cost, cache, min(x - 1, top))
        j = int(np.searchsorted(lens, x - 1, side="left"))  # prompts under x - 1 tokens below j
        whole = (x - 1) * float(cache.whole[j]) - float(cache.whole_by_len[j])
        return inside + edge + whole

    def _sampled_mean(self, cost, x: int) -> float:
        """Mean over `WINDOWS` windows of `x` tokens of their chunks' time, the whole
        prompts inside a window summed from prefix sums over the stream."""
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

    def _mean_at(self, cost, cache: _PerCost, x: int) -> float:
        """The mean at a load of the grid (or any load timed exactly), cached."""
        means = cache.means
        v = means.get(x)
        if v is None:
            if not (cache.sums and min(x - 1, self._longest) <= EXACT_EDGES):
                v = means[x] = self._sampled_mean(cost, x)
            elif x - 1 > self._longest:  # linear in x past the longest prompt: not kept
                return self._window_sum(cost, x) / self._total
            else:
                v = means[x] = self._window_sum(cost, x) / self._total
        return v

    def chunk_mean(self, cost, x: int) -> float:
        """Mean chunk time (seconds, `cost.chunk_time`) of a step's `x` prefill tokens: the
        mean over the windows of `x` tokens from every start of the stream, exactly, for a
        model with its own `chunk_time_sums` (the profile) while the pieces are at most
        `EXACT_EDGES` tokens long. Otherwise exact (over every window, or `WINDOWS` of them
        for a model without the sums) up to `EXACT_LOADS` tokens and interpolated above
        between loads on a grid of ratio `KNOT_RATIO`."""
        x = int(x)
        if x <= 0:
            return 0.0
        return self._chunk_mean(cost, self._per_cost(cost), x)

    def _chunk_mean(self, cost, cache: _PerCost, x: int) -> float:
        v = cache.means.get(x)
        if v is not None:
            return v
        if x <= EXACT_LOADS or (cache.sums and min(x - 1, self._longest) <= EXACT_EDGES):
            return self._mean_at(cost, cache, x)
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
        a = self._mean_at(cost, cache, lo)
        if x == lo:
            return a
        b = self._mean_at(cost, cache, hi)
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

        chunk_mean, cache = self._chunk_mean, self._per_cost(cost)

        def time_of(x, y) -> float:
            x, y = int(x), int(y)
            d = int(round(y * ctx))
            if not x:
                return float(step_time(0, y, d, [], y))
            # x / E[p] prompts complete a step on average (their first tokens are sampled):
            # a time-share of the steps completing the whole numbers around it
            done = x / per_prompt
            lo = int(done)
            share = done - lo
            t = float(step_time(x, y, d, [], y + lo))
            if share:
                t += share * (float(step_time(x, y, d, [], y + lo + 1)) - t)
            return t + chunk_mean(cost, cache, x)

        return time_of
