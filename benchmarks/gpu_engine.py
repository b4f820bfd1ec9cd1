"""The engine on one GPU, in one short run (< 8 minutes on an H200): random
Llama-3-8B-shaped bf16 weights created on the GPU (no files).

Measures
1. HBM bandwidth (a large device copy) and the bf16 matmul rate (a large GEMM);
2. decode step time at batch 1..256 (context 512 each) against the HBM roofline
   (weight bytes + KV bytes) / bandwidth;
3. prefill throughput (one chunk of 512..8192 tokens) against the matmul rate;
4. host overhead per step (planning, state, stop checks, tensor building) with 256
   requests decoding;
5. sim vs real: a profile measured here, then a ShareGPT-length trace (Poisson arrivals)
   replayed in real time through the engine and simulated with that profile: error of
   TTFT and ITL (p50, mean, p99).
Writes JSON to --out, else $OUT/gpu_engine.json, else ./gpu_engine.json.

`--small` runs tiny shapes on the CPU in seconds (the test suite runs it). Without CUDA
the Llama-3-8B shape is refused (its float32 weights on the CPU are 32 GB) unless
`--device cpu` asks for it.

    python benchmarks/gpu_engine.py                 # CUDA, Llama-3-8B shape
    python benchmarks/gpu_engine.py --small --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _cli import fail, out_file_in_new_folder, positive_float, positive_int, write_json

SHAREGPT = "../shared/traces/sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
# lognormal fit of that file (log-space mean, std), the stand-in when it is absent
SHAREGPT_FIT = {"prompt": (7.007, 1.626), "output": (5.769, 1.001)}


def llama3_8b():
    from llmsched.engine.loader import ModelConfig

    return ModelConfig(
        arch="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        sliding_windows=[None] * 32,
        eos_token_ids=[128001],
    )


def tiny():
    from llmsched.engine.loader import ModelConfig

    return ModelConfig(
        arch="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        sliding_windows=[None] * 2,
    )


def timed(fn, sync, reps=5, warmup=2) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def hardware(torch, dev, dtype, small: bool, sync) -> dict:
    n = (64 << 20) if small else (4 << 30)
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), sync)  # noqa: F821 - `del a, b` below confuses the linter
    bw = 2 * n / t
    del a, b
    m, k, nn = (256, 256, 512) if small else (8192, 4096, 14336)
    x = torch.randn(m, k, device=dev, dtype=dtype)
    w = torch.randn(nn, k, device=dev, dtype=dtype)
    t = timed(lambda: torch.nn.functional.linear(x, w), sync)
    return {"copy_bandwidth_GBps": bw / 1e9, "matmul_TFLOPs": 2 * m * k * nn / t / 1e12, "matmul_shape": [m, k, nn]}


class FakeSeq:
    __slots__ = ("token_ids", "blocks")

    def __init__(self, token_ids, blocks):
        self.token_ids, self.blocks = token_ids, blocks


def decode_sweep(engine, batches, ctx, bw, sync) -> list[dict]:
    from llmsched.core.engine_api import SamplingParams

    r, cfg = engine.runner, engine.config
    bs = r.block_size
    nblk = -(-ctx // bs)
    greedy = SamplingParams(temperature=0)
    weight_bytes = (
        cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    ) * r.dtype_bytes
    out = []
    for b in batches:
        if b > r.max_num_seqs or b * nblk > r.num_blocks:
            continue
        seqs = [FakeSeq([1] * ctx, list(range(i * nblk, (i + 1) * nblk))) for i in range(b)]
        t = timed(lambda: r.execute(seqs, [], [greedy] * b, [None] * b), sync, reps=10, warmup=3)
        kv = b * ctx * cfg.kv_bytes_per_token(r.dtype_bytes)
        roof = (weight_bytes + kv) / bw
        out.append(
            {
                "batch": b,
                "context": ctx,
                "step_ms": t * 1e3,
                "roofline_ms": roof * 1e3,
                "roofline_fraction": roof / t,
                "tokens_per_s": b / t,
            }
        )
    return out


def prefill_sweep(engine, chunks, tflops, sync) -> list[dict]:
    r, cfg = engine.runner, engine.config
    bs = r.block_size
    out = []
    for c in chunks:
        if c > min(engine.b_max, r.max_model_len) or -(-c // bs) > r.num_blocks:
            continue
        seq = FakeSeq([1] * c, list(range(-(-c // bs))))
        t = timed(lambda: r.execute([], [(seq, 0, c, False)], [], []), sync, reps=5, warmup=2)
        flops = 2 * cfg.num_params() * c + 2 * cfg.num_layers * cfg.q_size * c * c  # weights + causal attn
        out.append(
            {
                "tokens": c,
                "ms": t * 1e3,
                "tokens_per_s": c / t,
                "TFLOPs": flops / t / 1e12,
                "matmul_fraction": flops / t / 1e12 / tflops,
            }
        )
    return out


def overhead(engine, n_running: int, ctx: int, steps: int = 20) -> dict:
    """Host time per step with n_running requests decoding (planning, state, emission)."""
    from llmsched.core.engine_api import SamplingParams

    vocab = engine.config.vocab_size
    p = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True)
    for i in range(n_running):
        engine.add_request(f"ovh-{i}", [(i + j) % vocab for j in range(ctx)], p)
    while engine.state.n_decoding < n_running or engine.state.waiting:
        engine.step()
    plan_t, step_t, fwd_t, host_t = [], [], [], []
    for _ in range(steps):
        t = time.perf_counter()
        engine.scheduler.plan(engine.state)
        plan_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.step()
        step_t.append(time.perf_counter() - t)
        fwd_t.append(engine.last_forward_s)
        host_t.append(engine.last_overhead_s)
    for i in range(n_running):
        engine.abort_request(f"ovh-{i}")
    med = statistics.median
    return {
        "running": n_running,
        "context": ctx,
        "step_ms": med(step_t) * 1e3,
        "forward_ms": med(fwd_t) * 1e3,
        "host_outside_forward_ms": med(host_t) * 1e3,
        "plan_ms": med(plan_t) * 1e3,
        "host_share": med(host_t) / med(step_t),
    }


def sharegpt_trace(n: int, rate: float, max_len: int, seed: int = 0):
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    path = Path(__file__).resolve().parent.parent / SHAREGPT
    source = "lognormal fit of ShareGPT"
    if path.is_file():
        d = np.genfromtxt(path, delimiter=",", names=True)
        idx = rng.integers(0, len(d), n)
        prompt = d["num_prefill_tokens"][idx].astype(np.int64)
        output = d["num_decode_tokens"][idx].astype(np.int64)
        source = str(path)
    else:
        prompt = np.exp(rng.normal(*SHAREGPT_FIT["prompt"], n)).astype(np.int64)
        output = np.exp(rng.normal(*SHAREGPT_FIT["output"], n)).astype(np.int64)
    prompt = np.clip(prompt, 1, max_len // 2)
    output = np.clip(output, 1, max_len - prompt)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    arrival -= arrival[0]
    return SimpleNamespace(arrival_s=arrival, prompt=prompt, output=output, tag=None), source


def sim_vs_real(engine, out_dir: Path, trace, source: str, small: bool) -> dict:
    from llmsched.analysis.validate import compare, simulate
    from llmsched.engine.profiler import profile_engine, write_profile
    from llmsched.engine.replaying import replay

    grid = None
    if small:
        grid = dict(
            tokens=[1, 8, 32, 64, 128],
            batches=[1, 4, 16],
            contexts=[16, 64, 256],
            chunks=[16, 64, 128],
            chunk_contexts=[0, 128],
            lm_tokens=[1, 16],
        )
    t = time.perf_counter()
    rows = profile_engine(engine, grid=grid, reps=3, warmup=1)
    prof = write_profile(rows, out_dir / "gpu_engine_profile.csv")
    profile_s = time.perf_counter() - t
    spec = f"profile:{prof}" + ("" if engine.runner.cuda else ",overlap=0")
    engine.set_scheduler("sarathi", b_max=engine.b_max)
    t = time.perf_counter()
    real = replay(engine, trace)
    replay_s = time.perf_counter() - t
    sim = simulate(trace, engine, "sarathi", spec)
    errs = compare(real, sim)
    return {
        "trace_source": source,
        "requests": len(trace.arrival_s),
        "mean_prompt": float(np.mean(trace.prompt)),
        "mean_output": float(np.mean(trace.output)),
        "rate_per_s": float(len(trace.arrival_s) / max(trace.arrival_s[-1], 1e-9)),
        "profile_seconds": profile_s,
        "replay_seconds": replay_s,
        "cost_model": spec,
        "ttft_p50_error": errs["ttft_p50"]["rel_error"],
        "itl_p50_error": errs["itl_p50"]["rel_error"],
        "errors": errs,
    }


def pick_device(requested: str | None, small: bool, cuda: bool) -> str:
    """--device as given, else CUDA where there is one (the tiny shapes: the CPU). Refused,
    one line and exit 2: a CUDA device that is not there, and the Llama-3-8B shape on the
    CPU unless --device cpu asks for it (32 GB of float32 weights: more than the memory of
    many machines without a GPU)."""
    if requested is None and small:
        return "cpu"
    if requested is None and not cuda:
        fail(
            "gpu_engine",
            "no CUDA device: the Llama-3-8B shape on the CPU (32 GB of float32 weights) runs only "
            "with --device cpu; --small runs tiny shapes",
        )
    if requested and requested.startswith("cuda") and not cuda:
        fail("gpu_engine", f"--device {requested}: torch finds no CUDA device")
    return requested or "cuda"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    ap.add_argument(
        "--device", default=None, help="default: cuda (--small: cpu); cpu runs the Llama-3-8B shape on the CPU"
    )
    ap.add_argument(
        "--out", type=out_file_in_new_folder, default=None, help="JSON path (default: $OUT/gpu_engine.json)"
    )
    ap.add_argument("--requests", type=positive_int, default=None, help="trace requests (default 160; 10 small)")
    ap.add_argument("--rate", type=positive_float, default=None, help="arrivals per second (default 2; 40 small)")
    ap.add_argument("--skip-validate", action="store_true")
    args = ap.parse_args(argv)

    import torch

    dev = pick_device(args.device, args.small, torch.cuda.is_available())  # before any work
    from llmsched.engine.engine import LLMEngine

    t_start = time.perf_counter()
    small = args.small
    out_path = Path(args.out or os.path.join(os.environ.get("OUT", "."), "gpu_engine.json"))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cfg = tiny() if small else llama3_8b()
    cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if cuda else torch.float32
    res: dict = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "small": small,
        "model": "tiny" if small else "llama-3-8b (random weights)",
        "params": cfg.num_params(),
    }

    def save():
        res["elapsed_s"] = time.perf_counter() - t_start
        write_json(out_path, res, indent=2)

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    res["hardware"] = hardware(torch, dev, dtype, small, sync)
    log(f"hardware: {res['hardware']}")
    save()
    engine = LLMEngine(
        cfg,
        device=dev,
        dtype=dtype,
        b_max=256 if small else 8192,
        max_num_seqs=16 if small else 256,
        max_model_len=512 if small else 8192,
        gpu_memory_utilization=0.85,
        kv_cache_gb=0.05 if small else None,
    )
    r = engine.runner
    res["engine"] = {
        "kv_blocks": r.num_blocks,
        "kv_cache_GB": r.kv_cache_bytes / 1e9,
        "kv_capacity_tokens": engine.kv_capacity,
        "cuda_graphs": r.graphs is not None,
        "dtype": str(r.dtype),
    }
    log(f"engine: {res['engine']}")
    bw = res["hardware"]["copy_bandwidth_GBps"] * 1e9
    batches = [1, 2, 4, 8, 16] if small else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    res["decode"] = decode_sweep(engine, batches, 64 if small else 512, bw, sync)
    log(
        "decode: "
        + ", ".join(f"b{d['batch']} {d['step_ms']:.2f}ms ({d['roofline_fraction']:.0%})" for d in res["decode"])
    )
    save()
    res["prefill"] = prefill_sweep(
        engine, [64, 128] if small else [512, 1024, 2048, 4096, 8192], res["hardware"]["matmul_TFLOPs"], sync
    )
    log("prefill: " + ", ".join(f"{p['tokens']} tok {p['TFLOPs']:.0f} TFLOP/s" for p in res["prefill"]))
    save()
    res["overhead"] = overhead(engine, 16 if small else 256, 32 if small else 256)
    log(f"overhead: {res['overhead']}")
    save()
    if not args.skip_validate:
        n = args.requests or (10 if small else 160)
        rate = args.rate or (40.0 if small else 2.0)
        trace, source = sharegpt_trace(n, rate, 256 if small else 8192)
        res["sim_vs_real"] = sim_vs_real(engine, out_path.parent, trace, source, small)
        sv = res["sim_vs_real"]
        log(f"sim vs real: TTFT p50 error {sv['ttft_p50_error']:+.1%}, ITL p50 error {sv['itl_p50_error']:+.1%}")
    save()
    print(json.dumps({k: res[k] for k in res if k not in ("decode", "prefill")}, indent=2, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
