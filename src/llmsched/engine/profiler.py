"""`llmsched profile`: measure this machine's step-time tables for the engine and write
them in the combined profile CSV format that `--cost-model profile:PATH` reads
(`llmsched.core.profile`):

All times go through the engine's own step path (`ModelRunner.execute`):
- linear(tokens): a step of `tokens` prefill tokens with attention skipped (embedding,
  every layer's norms, projections, MLP, rotary, the step's tensor building), plus the
  engine's fixed host overhead per step (planning, state updates: fitted on a short real
  workload), mode `eager`; on CUDA with graphs also `graph` rows
  (decode-only steps replayed from CUDA graphs, attention and LM head taken out);
- lm_head(tokens): logits over `tokens` rows and greedy sampling, plus the host work per
  emitted token (emission, detokenization, stop checks; fitted on the same workload);
- decode_attn(batch, context): what a decode-only step of `batch` sequences with
  `context` tokens each costs beyond linear(batch) + lm_head(batch), divided by the
  layer count: ONE layer's paged attention with its share of the per-step setup (block
  tables, masks, cache writes);
- prefill_attn(chunk, context): likewise for one prefill chunk after `context` cached tokens;
- step: a few whole steps end to end, for `validate_steps`.
So the composed cost model reproduces measured steps at the grid points.

Each value is the median of at least `reps` timed runs after `warmup` runs (CUDA
synchronised).
On CPU nothing overlaps, so simulate with `profile:PATH,overlap=0` (the default overlap
of 1 subtracts the attention launch floor, which only hides behind a busy GPU).
"""

from __future__ import annotations

import csv
import os
import statistics
import time
from pathlib import Path

from ..core.errors import ConfigError

COLUMNS = ("table", "model", "mode", "tokens", "batch", "chunk", "context", "prefill_chunk",
           "prefill_context", "decodes", "decode_context", "ms", "layers")

CPU_GRID = dict(tokens=[1, 4, 16, 32, 64, 128, 256, 512], batches=[1, 4, 16, 64],
                contexts=[16, 128, 512], chunks=[16, 64, 256], chunk_contexts=[0, 512],
                lm_tokens=[1, 16, 64, 256])
CUDA_GRID = dict(tokens=[1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
                         4096, 6144, 8192],
                 batches=[1, 2, 4, 8, 16, 32, 64, 128, 256], contexts=[128, 512, 1024, 2048, 4096, 8192],
                 chunks=[64, 128, 256, 512, 1024, 2048], chunk_contexts=[0, 1024, 4096],
                 lm_tokens=[1, 8, 32, 64, 128, 256, 512, 1024])


class _Seq:
    """The two fields the runner reads from a sequence."""

    __slots__ = ("token_ids", "blocks")

    def __init__(self, token_ids, blocks):
        self.token_ids = token_ids
        self.blocks = blocks


class Timer:
    """Median milliseconds of a call: `warmup` untimed runs, then at least `reps` timed
    runs and, for short calls, more until about `min_s` seconds were timed (a median
    over more runs resists a noisy, shared machine)."""

    def __init__(self, runner, reps: int, warmup: int, min_s: float = 0.02, max_reps: int = 20):
        self.runner, self.reps, self.warmup = runner, reps, warmup
        self.min_s, self.max_reps = min_s, max_reps

    def __call__(self, fn) -> float:
        sync = self.runner.synchronize
        for _ in range(self.warmup):
            fn()
        sync()
        times = []
        total = 0.0
        while len(times) < self.reps or (total < self.min_s and len(times) < self.max_reps):
            t0 = time.perf_counter()
            fn()
            sync()
            dt = time.perf_counter() - t0
            times.append(dt)
            total += dt
        return statistics.median(times) * 1e3


def _blocks(start: int, n: int, num_blocks: int) -> list[int]:
    return [(start + i) % num_blocks for i in range(n)]


def measure_overhead(engine, requests: int = 16, prompt: int = 24) -> tuple[float, float]:
    """Host time per step outside the forward pass (planning, state updates, token
    emission, detokenization, stop checks), fitted on a short real workload as
    `fixed + per_row * sampled rows`; returns (fixed, per_row) in seconds."""
    import numpy as np  # noqa: PLC0415

    from ..core.engine_api import SamplingParams  # noqa: PLC0415

    vocab = engine.config.vocab_size
    for i in range(requests):  # staggered lengths: the decode batch shrinks step by step
        p = SamplingParams(max_tokens=4 + 2 * i, temperature=0, ignore_eos=True)
        engine.add_request(f"profile-overhead-{i}", [(7 * i + j) % vocab for j in range(prompt)], p)
    xs, ys = [], []
    while engine.has_unfinished_requests():
        engine.step()
        xs.append(engine.last_sampled)
        ys.append(engine.last_overhead_s)
    xs, ys = np.array(xs[1:], dtype=float), np.array(ys[1:])
    if len(xs) < 3 or np.ptp(xs) == 0:
        return float(np.median(ys)) if len(ys) else 0.0, 0.0
    # a robust line: medians of the host time per distinct row count, then least squares
    ux = np.unique(xs)
    med = np.array([np.median(ys[xs == u]) for u in ux])
    slope, fixed = np.polyfit(ux, med, 1)
    if slope < 0:
        return float(np.median(ys)), 0.0
    return max(0.0, float(fixed)), float(slope)


def profile_engine(engine, *, reps: int = 3, warmup: int = 1, grid: dict | None = None,
                   model_name: str = "engine", progress=None) -> list[dict]:
    """Measure the tables on a ready, idle `LLMEngine`; returns CSV rows as dicts.

    Everything is timed through the engine's real step path (`ModelRunner.execute`).
    linear(b) is a step of b prefill tokens with attention skipped; an attention entry is
    what a step with that attention costs beyond linear and the LM head, per layer (so
    per-step setup such as block tables and masks counts as it does in real steps)."""
    import torch  # noqa: PLC0415

    from ..core.engine_api import SamplingParams  # noqa: PLC0415
    from .sampler import sample  # noqa: PLC0415

    if engine.has_unfinished_requests():
        raise RuntimeError("profile an idle engine")
    r = engine.runner
    cfg = engine.config
    L = cfg.num_layers
    g = dict(CUDA_GRID if r.cuda else CPU_GRID)
    g.update(grid or {})
    bs, nb = r.block_size, r.num_blocks
    cap_tokens = nb * bs
    timer = Timer(r, reps, warmup)
    rows: list[dict] = []
    say = progress or (lambda msg: None)
    greedy = SamplingParams(temperature=0)
    vocab = cfg.vocab_size
    eps = 1e-4

    def row(table, ms, **kw):
        d = {"table": table, "model": model_name, "ms": f"{ms:.5f}", "layers": L}
        d.update(kw)
        rows.append(d)

    def decoders(batch, ctx, first_block=0):
        nblk = -(-ctx // bs)
        return [_Seq([(i + j) % vocab for j in range(ctx)], _blocks(first_block + i * nblk, nblk, nb))
                for i in range(batch)]

    def chunk(c, ctx, samples, first_block=0):
        return (_Seq([j % vocab for j in range(c + ctx)], _blocks(first_block, -(-(c + ctx) // bs), nb)),
                ctx, c, samples)

    def step_ms(decs, chunks, skip=False):
        params = [greedy] * (len(decs) + sum(1 for ch in chunks if ch[3]))
        gens = [None] * len(params)
        return timer(lambda: r.execute(decs, chunks, params, gens, skip_attention=skip))

    fixed_s, per_row_s = measure_overhead(engine)
    overhead_ms, row_ms = fixed_s * 1e3, per_row_s * 1e3
    say(f"host overhead per step: {overhead_ms:.3f} ms + {row_ms * 1e3:.1f} us per sampled row")

    lin_raw: dict[int, float] = {}
    lm_raw: dict[int, float] = {}
    gen = torch.Generator(device=r.device).manual_seed(0)

    def linear(b):
        if b not in lin_raw:
            lin_raw[b] = step_ms([], [chunk(b, 0, False)], skip=True)
        return lin_raw[b]

    def lm_head(n):
        if n not in lm_raw:
            hidden = torch.randn(n, cfg.hidden_size, generator=gen, device=r.device).to(r.dtype)

            def lm():
                with torch.inference_mode():
                    return sample(r.model.logits(hidden), [greedy] * n, [None] * n)
            lm_raw[n] = timer(lm)
        return lm_raw[n]

    for b in sorted(set(g["tokens"])):
        if b <= r.max_model_len:
            row("linear", linear(b) + overhead_ms, mode="eager", tokens=b)
    say("linear done")
    for n in sorted(set(g["lm_tokens"])):
        row("lm_head", lm_head(n) + n * row_ms, tokens=n)
    say("lm head done")

    # attention tables hold what a step costs beyond linear(b) and lm_head(sampled), per
    # layer: the attention itself and its per-step setup, so that the composed model
    # reproduces measured steps at the grid points
    dec_ms: dict[tuple[int, int], float] = {}
    for batch in sorted(set(g["batches"])):
        if batch > r.max_num_seqs:
            continue
        for ctx in sorted(set(g["contexts"])):
            if ctx > r.max_model_len or batch * ctx > min(cap_tokens, r.workspace_tokens):
                continue
            full = step_ms(decoders(batch, ctx), [])
            ms = max(eps, (full - linear(batch) - lm_head(batch)) / L)
            dec_ms[(batch, ctx)] = ms
            row("decode_attn", ms, batch=batch, context=ctx)
    say("decode attention done")

    for c in sorted(set(g["chunks"])):
        for ctx in sorted(set(g["chunk_contexts"])):
            if c + ctx > min(r.max_model_len, cap_tokens):
                continue
            ms = max(eps, (step_ms([], [chunk(c, ctx, False)]) - linear(c)) / L)
            row("prefill_attn", ms, chunk=c, context=ctx)
    say("prefill attention done")

    # CUDA graphs: decode-only steps replayed from graphs at the shortest context; the
    # attention above its launch floor and the LM head are taken out (the cost model adds
    # them back)
    if r.graphs is not None and dec_ms:
        floor = min(dec_ms.values())
        ctx = min(c for _, c in dec_ms)
        for batch in sorted(set(g["batches"])):
            if batch > r.max_num_seqs or (batch, ctx) not in dec_ms:
                continue
            ms = step_ms(decoders(batch, ctx), [])
            lin = ms - L * max(0.0, dec_ms[(batch, ctx)] - floor) - lm_head(batch)
            row("linear", max(lin, eps) + overhead_ms, mode="graph", tokens=batch)
        say("graph rows done")

    # whole steps, end to end, for `validate_steps`
    for c, cctx, nd, dctx in ((64, 0, 0, 0), (16, 64, 4, 64), (0, 0, 16, 256), (128, 0, 8, 128),
                              (0, 0, 1, 64), (32, 256, 32, 64)):
        if nd > r.max_num_seqs or max(c + cctx, dctx) > r.max_model_len or nd * dctx + c + cctx > cap_tokens:
            continue
        decs = decoders(nd, dctx) if nd else []
        chs = [chunk(c, cctx, True, first_block=nd * -(-dctx // bs))] if c else []
        row("step", step_ms(decs, chs) + overhead_ms, prefill_chunk=c, prefill_context=cctx,
            decodes=nd, decode_context=dctx)
    return rows


def write_profile(rows: list[dict], out) -> Path:
    out = Path(out)
    if out.is_dir():
        out = out / "profile.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    os.replace(tmp, out)
    return out


def profile(model, out, *, device: str = "cpu", dtype=None, max_num_seqs: int | None = None,
            b_max: int = 512, block_size: int = 16, kv_cache_gb: float | None = None,
            max_model_len: int | None = None, enforce_eager: bool = False, reps: int = 3,
            warmup: int = 1, grid: dict | None = None, progress=None, num_threads: int | None = None) -> dict:
    """Build an engine for `model` (folder or ModelConfig), measure, write `out` (a CSV
    file; a folder gets `profile.csv`). Returns a summary dict."""
    from .engine import LLMEngine  # noqa: PLC0415
    from .loader import ModelConfig  # noqa: PLC0415

    if reps < 1 or warmup < 0:
        raise ConfigError("reps must be >= 1 and warmup >= 0")
    t0 = time.perf_counter()
    dev = str(device)
    if max_num_seqs is None:
        max_num_seqs = 256 if dev.startswith("cuda") else 64
    if max_model_len is None and not dev.startswith("cuda"):
        max_model_len = 2048
    engine = LLMEngine(model, device=device, dtype=dtype, max_num_seqs=max_num_seqs, b_max=b_max,
                       block_size=block_size, kv_cache_gb=kv_cache_gb, max_model_len=max_model_len,
                       enforce_eager=enforce_eager, num_threads=num_threads)
    name = "engine" if isinstance(model, ModelConfig) else (Path(model).resolve().name or "engine")
    rows = profile_engine(engine, reps=reps, warmup=warmup, grid=grid, model_name=name, progress=progress)
    path = write_profile(rows, out)
    return {"path": str(path), "model": name, "layers": engine.config.num_layers,
            "device": str(engine.runner.device), "dtype": str(engine.runner.dtype).replace("torch.", ""),
            "rows": len(rows), "seconds": time.perf_counter() - t0,
            "cost_model": f"profile:{path}" + ("" if engine.runner.cuda else ",overlap=0")}
