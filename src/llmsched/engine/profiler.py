"""`llmsched profile`: measure this machine's step-time tables for the engine and write
them in the combined profile CSV format that `--cost-model profile:PATH` reads
(`llmsched.core.profile`).

Two stages, both through the engine's own step path (`ModelRunner.execute`):

1. Tables (`Bench`). Every grid point is a real step of the runner, timed in passes:
   each pass visits every point once, in a fresh random order, and runs it three times
   back to back (the first untimed); a point's value is its median over all passes. A
   burst of load on a shared machine then costs one sample of every point instead of
   skewing a few points outright.
   - linear(tokens): a step of `tokens` prefill tokens with attention skipped (embedding,
     every layer's norms, projections, MLP, rotary, the step's tensor building), mode
     `eager`; on CUDA with graphs also `graph` rows (decode-only steps replayed from
     CUDA graphs, attention and LM head taken out);
   - lm_head(tokens): logits over `tokens` rows and greedy sampling;
   - decode_attn(batch, context): what a decode-only step of `batch` sequences with mean
     context `context` costs beyond linear(batch) + lm_head(batch), divided by the layer
     count: ONE layer's paged attention with its share of the per-step setup (block
     tables, masks, cache writes). By default the contexts are spread evenly over
     0..2 x context (narrower where that passes max_model_len: c - w .. c + w, w =
     max_model_len - c), as serving mixes them: the SDPA decode path pads a batch's
     gather to its longest context, so there mixed lengths cost more than equal ones (the CPU
     float32 kernel reads each decoder's own context: the same either way);
     `spread=False`: equal;
   - prefill_attn(chunk, context): likewise for one prefill chunk after `context` cached
     tokens;
   - step: a few whole steps end to end, for `validate_steps`.
   The grids of loads reach the largest the engine makes and stop there (`load_limits`,
   `reach_budget`): b_max tokens in a step or a chunk, one LM-head row and one decoder
   per running sequence; a profile covers the loads of a run at that budget, and none it
   never makes. Contexts past max_model_len come down to what a sequence holds
   (a decode context to max_model_len, a chunk's to max_model_len - chunk).
2. Calibration (`fit_calibration`): a synthetic workload (`calibration_trace`: Poisson
   arrivals, random prompt and output lengths; not any trace one validates on) replayed
   in real time through the engine exactly as `llmsched validate` replays a trace, in
   segments between the table passes. Each real step's plan is timed by the tables:
   - `scale`: median of (real forward time / table time) over the steps that followed
     another step at once (the table passes and a run of similar steps warm the caches
     differently; on the tiny CPU model the scale comes out 0.9-1.1);
   - host time per step, `fixed + per_row * sampled rows`: the start-to-start time of
     back-to-back steps minus their forward time (planning, state updates, token
     emission, detokenization, stop checks, the replay loop), fitted robustly.
   The written tables are `scale` x the stage-1 values, with `fixed` added to every
   linear row and `per_row` x rows to every lm_head row, so the composed cost model
   predicts a step as the real run takes it. The first step after an idle wait takes
   another time, usually more (its ratio to the calibrated time is reported as
   `after_idle_ratio`); the cost model has no term for that.
   `calibrate=False` skips the real run: scale 1, host time from a closed batch of
   requests (`measure_overhead`).

On CPU nothing overlaps, so simulate with `profile:PATH,overlap=0` (the default overlap
of 1 subtracts the attention launch floor, which only hides behind a busy GPU).
"""

from __future__ import annotations

import csv
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from ..core.checks import as_real
from ..core.cost import make_cost_model
from ..core.engine_api import MAX_MEASURE_S, DefaultMaxModelLen, SamplingParams, default_max_running
from ..core.errors import ConfigError, warn
from ..core.paths import atomic_write
from ..core.profile import COMBINED_FILE

COLUMNS = (
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

CPU_GRID = dict(
    tokens=[1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512],
    batches=[1, 2, 4, 8, 16, 32, 64],
    contexts=[16, 64, 128, 256, 512],
    chunks=[16, 32, 64, 128, 256],
    chunk_contexts=[0, 128, 512],
    lm_tokens=[1, 2, 4, 8, 16, 32, 64, 256],
)
CUDA_GRID = dict(
    tokens=[1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192],
    batches=[1, 2, 4, 8, 16, 32, 64, 128, 256],
    contexts=[128, 512, 1024, 2048, 4096, 8192],
    chunks=[64, 128, 256, 512, 1024, 2048],
    chunk_contexts=[0, 1024, 4096],
    lm_tokens=[1, 8, 32, 64, 128, 256, 512, 1024],
)


def load_limits(b_max: int, max_num_seqs: int) -> dict:
    """The largest load on each load axis of the grids that a step of the engine makes:
    `b_max` tokens in a step (linear's `tokens`) or in one prefill chunk (`chunks`), and
    one sampled row (`lm_tokens`) and one decoder (`batches`) per running sequence, each
    with at least one token."""
    running = min(b_max, max_num_seqs)
    return {"tokens": b_max, "chunks": b_max, "lm_tokens": running, "batches": running}


def reach_budget(points, top: int) -> list[int]:
    """A load grid fitted to its largest load `top`: its points up to `top`, `top`
    itself, and doublings of its largest point on the way up to `top`, so that a profile
    covers every load the engine makes (and none it never makes) with no long stretch to
    interpolate over."""
    points = sorted(set(points))
    out = {p for p in points if p <= top} | {top}
    p = points[-1] if points else top
    while 0 < p and 2 * p < top:
        p *= 2
        out.add(p)
    return sorted(out)


class _Seq:
    """The two fields the runner reads from a sequence."""

    __slots__ = ("token_ids", "blocks")

    def __init__(self, token_ids, blocks):
        self.token_ids = token_ids
        self.blocks = blocks


class Bench:
    """Timing of many calls in passes: `add(key, fn)` registers a call; each `run_pass()`
    goes over all calls in a fresh random order and runs every call `1 + inner` times back
    to back, the first untimed (a shape is timed with the caches it warmed, as in a run of
    similar steps); `medians()` gives each key's median over all passes, in milliseconds.
    Spreading a point's samples over passes keeps a burst of load on a shared machine
    from skewing any one point."""

    def __init__(self, runner, inner: int = 2, seed: int = 0):
        self.runner, self.inner = runner, inner
        self.rng = random.Random(seed)
        self.calls: dict = {}
        self.times: dict = {}
        self.passes = 0

    def add(self, key, fn) -> None:
        self.calls.setdefault(key, fn)
        self.times.setdefault(key, [])

    def run_pass(self, timed: bool = True) -> None:
        sync = self.runner.synchronize
        keys = list(self.calls)
        self.rng.shuffle(keys)
        for k in keys:
            fn = self.calls[k]
            fn()
            sync()
            if not timed:
                continue
            for _ in range(self.inner):
                t0 = time.perf_counter()
                fn()
                sync()
                self.times[k].append(time.perf_counter() - t0)
        self.passes += timed

    def medians(self) -> dict:
        return {k: statistics.median(v) * 1e3 for k, v in self.times.items() if v}


def _blocks(start: int, n: int, num_blocks: int) -> list[int]:
    return [(start + i) % num_blocks for i in range(n)]


def fit_host(rows, host) -> tuple[float, float]:
    """Robust line `host = fixed + per_row * rows`: the median host time at each distinct
    row count, then least squares through those medians (weighted by the square root of
    how many steps each holds); a negative slope falls back to the overall median.
    Seconds in, seconds out."""
    import numpy as np  # noqa: PLC0415

    xs, ys = np.asarray(rows, dtype=float), np.asarray(host, dtype=float)
    if not len(ys):
        return 0.0, 0.0
    ux = np.unique(xs)
    if len(ux) < 2:
        return max(0.0, float(np.median(ys))), 0.0
    med = np.array([np.median(ys[xs == u]) for u in ux])
    w = np.sqrt([np.sum(xs == u) for u in ux])
    slope, fixed = np.polyfit(ux, med, 1, w=w)
    if slope < 0:
        return max(0.0, float(np.median(ys))), 0.0
    return max(0.0, float(fixed)), float(slope)


def measure_overhead(engine, requests: int = 16, prompt: int = 24) -> tuple[float, float]:
    """Host time per step outside the forward pass (planning, state updates, token
    emission, detokenization, stop checks) on a closed batch of requests, fitted as
    `fixed + per_row * sampled rows`; returns (fixed, per_row) in seconds. (The
    calibration run measures this in real time; this is the fallback without one.)"""

    vocab = engine.config.vocab_size
    prompt = max(1, min(prompt, engine.max_model_len // 2, engine.kv_capacity // 2))
    for i in range(requests):  # staggered lengths: the decode batch shrinks step by step
        out = max(1, min(4 + 2 * i, engine.max_model_len - prompt, engine.kv_capacity + 1 - prompt))
        p = SamplingParams(max_tokens=out, temperature=0, ignore_eos=True)
        engine.add_request(f"profile-overhead-{i}", [(7 * i + j) % vocab for j in range(prompt)], p)
    xs, ys = [], []
    while engine.has_unfinished_requests():
        engine.step()
        xs.append(engine.last_sampled)
        ys.append(engine.last_overhead_s)
    return fit_host(xs[1:], ys[1:])


def calibration_trace(
    engine,
    cost,
    *,
    target_s: float = 2.5,
    utilization: float = 0.7,
    seed: int = 0,
    min_requests: int = 6,
    max_requests: int = 64,
):
    """A synthetic workload for the calibration run: Poisson arrivals, prompts uniform in
    [8, P] and outputs uniform in [4, O] tokens (P = 256 and O = 48 where the engine's
    length and KV limits allow), at the rate that would keep the engine busy
    `utilization` of the time if requests ran one at a time (by `cost`), and about
    `target_s` seconds long. It has nothing to do with any trace one validates on."""
    import numpy as np  # noqa: PLC0415

    limit = max(2, min(engine.max_model_len, engine.kv_capacity + 1))
    o_max = max(1, min(48, limit // 4))
    p_max = max(1, min(256, limit - o_max))
    p_lo, o_lo = min(8, p_max), min(4, o_max)
    p_mean, o_mean = (p_lo + p_max) / 2, (o_lo + o_max) / 2
    per_request = cost.step_time(int(p_mean), 0, 0, [(int(p_mean), 0)], 1) + o_mean * cost.step_time(
        0, 1, int(p_mean + o_mean / 2), [], 1
    )
    rate = utilization / max(per_request, 1e-6)
    n = int(min(max_requests, max(min_requests, round(rate * target_s))))
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    return SimpleNamespace(
        arrival_s=arrival - arrival[0],
        prompt=rng.integers(p_lo, p_max + 1, n),
        output=rng.integers(o_lo, o_max + 1, n),
        tag=None,
    )


def fit_calibration(steps, cost) -> dict:
    """Fit the calibration from the `StepRecord`s of real-time runs and `cost`, the
    uncalibrated tables (forward time only):
    - `scale`: median of real forward time / table time over the steps that followed
      another step at once (1 if there are fewer than 5);
    - `fixed_s`, `per_row_s`: host time per step (start to next start, minus the
      forward time) as `fixed + per_row * sampled rows` (`fit_host`);
    - `after_idle_ratio`: median real forward / (scale x table time) over the first
      steps after an idle wait (usually above 1; the cost model cannot tell them apart)."""
    import numpy as np  # noqa: PLC0415

    pred = np.array([cost.step_time(*s.args) for s in steps], dtype=float)
    fwd = np.array([s.forward_s for s in steps], dtype=float)
    busy = np.array([not s.after_idle for s in steps], dtype=bool)
    ok = pred > 0
    sel = busy & ok
    scale = float(np.median(fwd[sel] / pred[sel])) if sel.sum() >= 5 else 1.0
    rows, host = [], []
    for s in steps:
        if s.cycle_s is not None and not s.after_idle:
            rows.append(s.args[4])
            host.append(max(0.0, s.cycle_s - s.forward_s))
    fixed, per_row = fit_host(rows, host)
    cold = ~busy & ok
    return {
        "scale": scale,
        "fixed_s": fixed,
        "per_row_s": per_row,
        "steps": len(steps),
        "busy_steps": int(sel.sum()),
        "after_idle_steps": int(cold.sum()),
        "after_idle_ratio": float(np.median(fwd[cold] / pred[cold]) / scale) if cold.any() else None,
    }


def _longer_sequences(r, need: int) -> str:
    """What to do when the grid needs sequences of `need` tokens: raise --max-model-len,
    unless the model's own positions are shorter (--max-model-len may not exceed them)."""
    longest = r.cfg.max_len
    if need <= longest:
        return f"raise --max-model-len to at least {need}"
    return (
        f"the model's own limit is {longest} token{'' if longest == 1 else 's'} "
        "(max_position_embeddings in its config.json), too short to profile"
    )


def _check_grid_fits(r, g: dict, dec_points: list, pre_points: list, longest_decoder: int) -> None:
    """Refuse, before any timing, an engine too small for the grid's smallest decode or
    prefill point: the profile would hold no decode_attn or prefill_attn rows, and
    `--cost-model profile:PATH` refuses such a file (measuring one takes minutes).
    `longest_decoder`: the longest context of the smallest decode batch (spread contexts)."""
    if dec_points and pre_points:
        return
    if not dec_points:
        b = min(g["batches"])
        if b > r.max_num_seqs:
            raise ConfigError(
                f"the profile grid's smallest decode batch ({b}) exceeds max_num_seqs {r.max_num_seqs}: "
                "raise --max-running/--max-num-seqs"
            )
        if b > r.b_max:
            raise ConfigError(
                f"the profile grid's smallest decode batch ({b}) exceeds b_max {r.b_max}, the most tokens "
                "of a step: raise --b-max"
            )
        what, need = f"decode batch ({b} x context {min(g['contexts'])})", longest_decoder
        kv_need = b * -(-need // r.block_size) * r.block_size  # whole blocks per decoder
        kv_room = min(r.num_blocks * r.block_size, r.workspace_tokens)
    else:
        what, need = "prefill chunk", min(g["chunks"]) + min(g["chunk_contexts"])
        kv_need, kv_room = need, r.num_blocks * r.block_size
    if need > r.max_model_len:
        raise ConfigError(
            f"the profile grid's smallest {what} needs sequences of {need} tokens, over max_model_len "
            f"{r.max_model_len}: {_longer_sequences(r, need)}"
        )
    raise ConfigError(
        f"the profile grid's smallest {what} needs {kv_need} tokens of KV cache, over the {kv_room} "
        f"there are: raise {r.kv_size_knob[1]}"  # (the flag that sized the cache: CUDA ignores --kv-cache-gb)
    )


def _check_two_decode_batches(r, dec_points: list, batches: list, step_kv) -> None:
    """Refuse, before any timing, an engine that fits one decode batch size of the grid:
    `--cost-model profile:PATH` refuses a decode_attn table of one batch size, which
    cannot extrapolate to larger batches. The error names what keeps out the grid's next
    batch size (`batches`): the running cap, the token budget or the KV cache, by
    `step_kv(b)`: (the longest context, the KV tokens) of its smallest step (the contexts
    fit max_model_len by construction)."""
    fitting = sorted({b for b, _ in dec_points})
    if len(fitting) != 1:
        return
    larger = [b for b in batches if b > fitting[0]]
    if not larger:
        raise ConfigError(f"the profile grid has one decode batch size ({fitting[0]}); a profile needs two")
    b = min(larger)
    _, kv_need = step_kv(b)
    kv_room = min(r.num_blocks * r.block_size, r.workspace_tokens)
    if b > min(r.b_max, r.max_num_seqs):
        if r.b_max < r.max_num_seqs:  # the budget caps the batch before the running cap does
            limit, fix = f"b_max {r.b_max}", "raise --b-max"
        else:
            limit, fix = f"max_num_seqs {r.max_num_seqs}", "raise --max-running/--max-num-seqs"
    else:
        limit = f"its KV cache of {kv_room} tokens: a batch of {b} needs {kv_need}"
        fix = f"raise {r.kv_size_knob[1]}"
    raise ConfigError(
        f"only one decode batch size of the profile grid ({fitting[0]}) fits this engine ({limit}); "
        f"a profile needs two: {fix}"
    )


def check_measure_seconds(calibrate_s, min_s) -> None:
    """`calibrate_s` above 0 and `min_s` (None: the device's default) at least 0, both at
    most MAX_MEASURE_S (nan and inf are refused)."""
    c = as_real(calibrate_s)
    if c is None or not 0 < c <= MAX_MEASURE_S:
        raise ConfigError(
            f"calibrate_s must be a number of seconds above 0 and at most {MAX_MEASURE_S:g}, got {calibrate_s!r}"
        )
    m = None if min_s is None else as_real(min_s)
    if min_s is not None and (m is None or not 0 <= m <= MAX_MEASURE_S):
        raise ConfigError(f"min_s (--tables-s) must be a number of seconds from 0 to {MAX_MEASURE_S:g}, got {min_s!r}")


def profile_engine(
    engine,
    *,
    reps: int = 3,
    warmup: int = 1,
    grid: dict | None = None,
    model_name: str = "engine",
    progress=None,
    calibrate: bool = True,
    calibrate_s: float = 2.5,
    min_s: float | None = None,
    max_passes: int = 25,
    spread: bool = True,
    seed: int = 0,
    info: dict | None = None,
) -> list[dict]:
    """Measure the tables on a ready, idle `LLMEngine`; returns CSV rows as dicts.

    `grid` replaces entries of `CPU_GRID`/`CUDA_GRID`; the load axes are then fitted to
    the engine's b_max and max_num_seqs (`load_limits`, `reach_budget`).
    Every table entry is timed through the engine's real step path
    (`ModelRunner.execute`) by a `Bench`: at least `reps` passes after `warmup` untimed
    ones, more until `min_s` seconds after the first (calibration included; default 3 on
    CPU, 10 on CUDA) or `max_passes`.
    linear(b) is a step of b prefill tokens with attention skipped; an attention entry is
    what a step with that attention costs beyond linear and the LM head, per layer (so
    per-step setup such as block tables and masks counts as it does in real steps).
    `spread`: a decode batch of mean context c is measured with its contexts spread
    evenly over 0..2c (the expected order statistics of uniform lengths; narrower where
    2c passes max_model_len), as serving mixes them; on the SDPA decode path, which pads
    every decoder's gather to the longest context of the batch, that costs more than
    equal lengths of the same mean (the CPU float32 kernel reads each decoder's own
    context). False measures equal contexts.

    `calibrate`: a real-time calibration run of about `calibrate_s` seconds in three
    segments, between the table passes (so both see the same state of a shared
    machine), then `fit_calibration`; the tables are scaled and the host time added.
    Without it, host time comes from `measure_overhead` and the scale is 1. `info`, a
    dict, receives the pass count and the calibration results."""
    import torch  # noqa: PLC0415

    from .replaying import replay  # noqa: PLC0415
    from .sampler import sample  # noqa: PLC0415

    check_measure_seconds(calibrate_s, min_s)
    if engine.has_unfinished_requests():
        raise RuntimeError("profile an idle engine")
    r = engine.runner
    cfg = engine.config
    L = cfg.num_layers
    g = dict(CUDA_GRID if r.cuda else CPU_GRID)
    g.update(grid or {})
    grid_batches = sorted(set(g["batches"]))
    for axis, top in load_limits(r.b_max, r.max_num_seqs).items():
        # a decode grid whose smallest batch is over the cap is refused below, naming the cap
        if axis != "batches" or grid_batches[0] <= top:
            g[axis] = reach_budget(g[axis], top)
    bs, nb = r.block_size, r.num_blocks
    cap_tokens = nb * bs
    if min_s is None:
        min_s = 10.0 if r.cuda else 3.0
    bench = Bench(r, seed=seed)
    say = progress or (lambda msg: None)
    info = {} if info is None else info
    greedy = SamplingParams(temperature=0)
    vocab = cfg.vocab_size
    eps = 1e-4
    gen = torch.Generator(device=r.device).manual_seed(seed)

    def contexts(batch, ctx):
        """Spread evenly over ctx - w .. ctx + w, w = ctx where max_model_len allows."""
        w = min(ctx, r.max_model_len - ctx)
        if not spread or batch == 1 or w <= 0:
            return [ctx] * batch
        cs = [max(1, round(ctx - w + 2 * w * (i + 1) / (batch + 1))) for i in range(batch)]
        cs[-1] += ctx * batch - sum(cs)  # the mean exactly ctx
        return cs

    def decoders(batch, ctx, first_block=0):
        out = []
        for i, c in enumerate(contexts(batch, ctx)):
            nblk = -(-c // bs)
            out.append(_Seq([(i + j) % vocab for j in range(c)], _blocks(first_block, nblk, nb)))
            first_block += nblk
        return out

    def chunk(c, ctx, samples, first_block=0):
        return (
            _Seq([j % vocab for j in range(c + ctx)], _blocks(first_block, -(-(c + ctx) // bs), nb)),
            ctx,
            c,
            samples,
        )

    def linear_chunks(load):
        """`load` prefill tokens at context 0 as chunks of at most max_model_len tokens."""
        out, first = [], 0
        for start in range(0, load, r.max_model_len):
            n = min(r.max_model_len, load - start)
            out.append(chunk(n, 0, False, first_block=first))
            first += -(-n // bs)
        return out

    def step_call(decs, chunks, skip=False):
        params = [greedy] * (len(decs) + sum(1 for ch in chunks if ch[3]))
        gens = [None] * len(params)
        return lambda: r.execute(decs, chunks, params, gens, skip_attention=skip)

    def lm_call(n):
        hidden = torch.randn(n, cfg.hidden_size, generator=gen, device=r.device).to(r.dtype)

        def lm():
            with torch.inference_mode():
                return sample(r.model.logits(hidden), [greedy] * n, [None] * n)

        return lm

    # ---- the steps the tables need -----------------------------------------------------------
    def step_kv(b, c=None):
        """(the longest context, the KV tokens: whole blocks of it per decoder) of the decode
        step of batch b at mean context c (default the grid's smallest)."""
        top = max(contexts(b, min(g["contexts"]) if c is None else c))
        return top, b * -(-top // bs) * bs

    def fits(b, c):
        top, kv = step_kv(b, c)
        return top <= r.max_model_len and kv <= min(cap_tokens, r.workspace_tokens)

    # contexts past max_model_len come down to it (no sequence holds more), so a small
    # max_model_len keeps the grid's range of contexts up to that length
    g["contexts"] = sorted({min(c, r.max_model_len) for c in g["contexts"]})
    dec_points = [
        (b, c)
        for b in sorted(set(g["batches"]))
        if b <= min(r.max_num_seqs, r.b_max)
        for c in g["contexts"]
        if fits(b, c)
    ]
    seq_room = min(r.max_model_len, cap_tokens)
    # `--cost-model profile:PATH` refuses a prefill_attn table of one chunk size (at context
    # 0 it is all launch floor, so it cannot scale to larger chunks): where only one chunk of
    # the grid fits (b_max 16 fits the CPU grid's 16, the CUDA grid's 64 cut to 16), half of it too
    fit = sorted({c for c in g["chunks"] if c <= seq_room})
    if len(fit) == 1 and fit[0] >= 2:
        g["chunks"] = sorted(set(g["chunks"]) | {fit[0] // 2})
    pre_points = [
        (c, x)
        for c in g["chunks"]
        if c <= seq_room
        for x in sorted({min(x, seq_room - c) for x in g["chunk_contexts"]})
    ]
    _check_grid_fits(r, g, dec_points, pre_points, max(contexts(min(g["batches"]), min(g["contexts"]))))
    _check_two_decode_batches(r, dec_points, grid_batches, step_kv)
    if len({c for c, _ in pre_points}) == 1:  # a chunk of one token: b_max or max_model_len 1
        raise ConfigError(
            f"only one prefill chunk size ({pre_points[0][0]}) fits this engine (b_max {r.b_max}, "
            f"max_model_len {r.max_model_len}); a profile needs two: "
            + ("raise --b-max" if r.b_max < 2 else _longer_sequences(r, 2))
        )
    step_points = [
        p
        for p in ((64, 0, 0, 0), (16, 64, 4, 64), (0, 0, 16, 256), (128, 0, 8, 128), (0, 0, 1, 64), (32, 256, 32, 64))
        if not (
            p[2] > r.max_num_seqs
            or p[0] + p[2] > r.b_max
            or max(p[0] + p[1], p[3]) > r.max_model_len
            or p[2] * p[3] + p[0] + p[1] > cap_tokens
            or (p[2] and not fits(p[2], p[3]))
        )
    ]
    # a load over max_model_len is several sequences' chunks (the KV cache holds them all)
    lin_out = [b for b in g["tokens"] if b <= cap_tokens]
    lin_sizes = set(lin_out) | {b for b, _ in dec_points} | {c for c, _ in pre_points}
    lm_sizes = set(g["lm_tokens"]) | {b for b, _ in dec_points}
    for b in sorted(lin_sizes):
        bench.add(("linear", b), step_call([], linear_chunks(b), skip=True))
    for n in sorted(lm_sizes):
        bench.add(("lm_head", n), lm_call(n))
    for b, c in dec_points:
        bench.add(("decode", b, c), step_call(decoders(b, c), []))
    for c, x in pre_points:
        bench.add(("prefill", c, x), step_call([], [chunk(c, x, False)]))
    for c, cctx, nd, dctx in step_points:
        decs = decoders(nd, dctx) if nd else []
        chs = [chunk(c, cctx, True, first_block=sum(len(d.blocks) for d in decs))] if c else []
        bench.add(("step", c, cctx, nd, dctx), step_call(decs, chs))

    def raw_tables(ms, report: bool = False, scale: float = 1.0):
        """Forward-time tables (no host time) from the medians so far. A difference of
        medians that `scale` (the calibration's) takes below `eps` ms (timing noise: a step
        timed no slower than its linear part) is set to `eps / scale`, so that the file
        holds `eps`; `report`: warn, one line per table, when that happened."""
        clamped: dict[str, list[int]] = {}  # table -> [clamped, entries]
        # clamped before scaling, a scale under 1 wrote 0.00009 where the warning says 0.0001
        least = eps / scale if scale > 0 else eps

        def floor_at_eps(table: str, v: float) -> float:
            n = clamped.setdefault(table, [0, 0])
            n[1] += 1
            if v < least:
                n[0] += 1
                return least
            return v

        lin = {k[1]: v for k, v in ms.items() if k[0] == "linear"}
        lm = {k[1]: v for k, v in ms.items() if k[0] == "lm_head"}
        dec = {(b, c): floor_at_eps("decode_attn", (ms[("decode", b, c)] - lin[b] - lm[b]) / L) for b, c in dec_points}
        pre = {(c, x): floor_at_eps("prefill_attn", (ms[("prefill", c, x)] - lin[c]) / L) for c, x in pre_points}
        graph = {}
        if r.graphs is not None and dec:
            # CUDA graphs: decode-only steps replayed from graphs at the shortest context; the
            # attention above its launch floor and the LM head are taken out (the cost model
            # adds them back)
            floor = min(dec.values())
            ctx = min(c for _, c in dec)
            for b in sorted(set(g["batches"])):
                if (b, ctx) in dec:
                    graph[b] = floor_at_eps(
                        "linear (graph)", ms[("decode", b, ctx)] - L * max(0.0, dec[(b, ctx)] - floor) - lm[b]
                    )
        steps = {k[1:]: v for k, v in ms.items() if k[0] == "step"}
        if report:
            for table, (n, total) in clamped.items():
                if n:
                    warn(
                        f"{n} of {total} {table} entries came out below {eps} ms (a step timed no slower "
                        f"than its linear part: timing noise) and were set to {eps} ms; profile again with "
                        "more passes (--tables-s, --reps) or on a quieter machine"
                    )
        return lin, lm, dec, pre, graph, steps

    def rows_for(ms, scale: float, fixed_ms: float, row_ms: float, report: bool = False) -> list[dict]:
        lin, lm, dec, pre, graph, steps = raw_tables(ms, report, scale)
        rows: list[dict] = []

        def row(table, v, **kw):
            d = {"table": table, "model": model_name, "ms": f"{v:.5f}", "layers": L}
            d.update(kw)
            rows.append(d)

        for b in lin_out:
            row("linear", scale * lin[b] + fixed_ms, mode="eager", tokens=b)
        for n in g["lm_tokens"]:
            row("lm_head", scale * lm[n] + n * row_ms, tokens=n)
        for (b, c), v in dec.items():
            row("decode_attn", max(eps, scale * v), batch=b, context=c)
        for (c, x), v in pre.items():
            row("prefill_attn", max(eps, scale * v), chunk=c, context=x)
        for b, v in graph.items():
            row("linear", max(eps, scale * v) + fixed_ms, mode="graph", tokens=b)
        for (c, cctx, nd, dctx), v in steps.items():
            sampled = nd + (1 if c else 0)
            row(
                "step",
                scale * v + fixed_ms + sampled * row_ms,
                prefill_chunk=c,
                prefill_context=cctx,
                decodes=nd,
                decode_context=dctx,
            )
        return rows

    def cost_of(rows):

        with tempfile.TemporaryDirectory(prefix="llmsched-profile-") as tmp:
            path = write_profile(rows, Path(tmp) / "profile.csv")
            return make_cost_model(f"profile:{path}" + ("" if r.cuda else ",overlap=0"))

    # ---- timing: table passes, with the calibration run's segments between them -------------
    t_start = time.perf_counter()
    for _ in range(warmup):
        bench.run_pass(timed=False)
    bench.run_pass()
    cal_steps: list = []
    segments = 3 if calibrate else 0
    if segments:
        first = cost_of(rows_for(bench.medians(), 1.0, 0.0, 0.0))
        for k in range(segments):
            trace = calibration_trace(engine, first, target_s=calibrate_s / segments, seed=seed + k)
            replay(engine, trace, seed=seed + k, steps=cal_steps)
            bench.run_pass()
    while bench.passes < reps or (time.perf_counter() - t_start < min_s and bench.passes < max_passes):
        bench.run_pass()
    ms = bench.medians()
    info["passes"] = bench.passes
    info["seconds"] = time.perf_counter() - t_start
    say(
        f"{len(ms)} steps timed in {bench.passes} passes"
        + (f" and a {len(cal_steps)}-step calibration run" if segments else "")
        + f" ({info['seconds']:.1f} s)"
    )
    if segments:
        cal = fit_calibration(cal_steps, cost_of(rows_for(ms, 1.0, 0.0, 0.0)))
        scale, fixed_s, per_row_s = cal["scale"], cal["fixed_s"], cal["per_row_s"]
        cold = "-" if cal["after_idle_ratio"] is None else f"{cal['after_idle_ratio']:.2f} x"
        say(
            f"calibration: real steps take {scale:.3f} x the table time, + {fixed_s * 1e3:.3f} ms + "
            f"{per_row_s * 1e6:.1f} us per sampled row of host time; the first step after an idle "
            f"wait takes {cold} the calibrated table time (not modelled)"
        )
    else:
        scale = 1.0
        fixed_s, per_row_s = measure_overhead(engine)
        cal = {"scale": 1.0, "fixed_s": fixed_s, "per_row_s": per_row_s}
        say(
            f"host time per step: {fixed_s * 1e3:.3f} ms + {per_row_s * 1e6:.1f} us per sampled row "
            f"(closed batch, no calibration run)"
        )
    info["calibration"] = cal
    return rows_for(ms, scale, fixed_s * 1e3, per_row_s * 1e3, report=True)


def write_profile(rows: list[dict], out) -> Path:
    folder = str(out).endswith(("/", os.sep))  # (Path drops a trailing slash)
    out = Path(out)
    if folder or out.is_dir():
        out = out / COMBINED_FILE
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(path: Path) -> None:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in COLUMNS})

    # (a rename of our own replaced a FIFO, a device or a symbolic link with a plain file)
    atomic_write(out, write)
    return out


def profile(
    model,
    out,
    *,
    device: str = "cpu",
    dtype=None,
    max_num_seqs: int | None = None,
    b_max: int = 512,
    block_size: int = 16,
    kv_cache_gb: float | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    reps: int = 3,
    warmup: int = 1,
    grid: dict | None = None,
    progress=None,
    num_threads: int | None = None,
    calibrate: bool = True,
    calibrate_s: float = 2.5,
    min_s: float | None = None,
    spread: bool = True,
) -> dict:
    """Build an engine for `model` (folder or ModelConfig), measure, write `out` (a CSV
    file; a folder gets `profile.csv`). Returns a summary dict."""
    from .engine import LLMEngine  # noqa: PLC0415
    from .loader import ModelConfig  # noqa: PLC0415

    # each named with its value (`--warmup -1` was told "reps must be >= 1 and warmup >= 0")
    if reps < 1:
        raise ConfigError(f"reps must be >= 1, got {reps}")
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {warmup}")
    check_measure_seconds(calibrate_s, min_s)
    t0 = time.perf_counter()
    dev = str(device)
    if max_num_seqs is None:
        max_num_seqs = default_max_running(dev)
    if max_model_len is None and not dev.startswith("cuda"):
        max_model_len = DefaultMaxModelLen(2048)  # at most the model's
    engine = LLMEngine(
        model,
        device=device,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        b_max=b_max,
        block_size=block_size,
        kv_cache_gb=kv_cache_gb,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        num_threads=num_threads,
    )
    name = "engine" if isinstance(model, ModelConfig) else (Path(model).resolve().name or "engine")
    info: dict = {}
    rows = profile_engine(
        engine,
        reps=reps,
        warmup=warmup,
        grid=grid,
        model_name=name,
        progress=progress,
        calibrate=calibrate,
        calibrate_s=calibrate_s,
        min_s=min_s,
        spread=spread,
        info=info,
    )
    path = write_profile(rows, out)
    return {
        "path": str(path),
        "model": name,
        "layers": engine.config.num_layers,
        "device": str(engine.runner.device),
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "rows": len(rows),
        "seconds": time.perf_counter() - t0,
        "passes": info.get("passes"),
        "calibration": info.get("calibration"),
        "cost_model": f"profile:{path}" + ("" if engine.runner.cuda else ",overlap=0"),
    }
