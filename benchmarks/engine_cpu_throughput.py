"""Offline CPU throughput of the llmsched engine, side by side with vLLM's CPU build.

Both engines get the same model folder, the same prompts (random token ids), greedy
decoding with ignore_eos (so every request produces exactly --output-len tokens), the
same token budget per step (b_max = vLLM's max_num_batched_tokens), the same running
cap (max_num_seqs) and, by default, the same number of compute threads (all cores but
one: what vLLM's CPU backend binds by default). vLLM runs in its own virtualenv
(--vllm-python), as a subprocess.

    python benchmarks/engine_cpu_throughput.py --out results/engine_cpu.json
    python benchmarks/engine_cpu_throughput.py --model DIR --num-prompts 64 --no-vllm

Without --model a small Llama-shaped random model is written to a temporary folder
(hidden 256, 4 layers, 8 heads / 4 KV heads, MLP 768, byte-level BPE tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VLLM_SCRIPT = r"""
import json, sys, time

def main():
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    llm = LLM(model=cfg["model"], dtype="float32", max_model_len=cfg["max_model_len"],
              max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["b_max"],
              enforce_eager=cfg["enforce_eager"], enable_prefix_caching=False,
              gpu_memory_utilization=cfg["memory_utilization"], seed=0)
    prompts = [{"prompt_token_ids": p} for p in cfg["prompts"]]
    sp = SamplingParams(max_tokens=cfg["output_len"], temperature=0, ignore_eos=True)
    llm.generate(prompts[:4], sp, use_tqdm=False)
    runs = []
    for _ in range(cfg["repeats"]):
        t = time.perf_counter()
        out = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t
        runs.append({"seconds": dt, "output_tokens": sum(len(o.outputs[0].token_ids) for o in out)})
    import vllm, torch
    print("VLLM_JSON " + json.dumps({"runs": runs, "vllm": vllm.__version__, "torch": torch.__version__,
                                     "threads": torch.get_num_threads()}))

if __name__ == "__main__":
    main()
"""


def make_model(folder: str) -> str:
    from llmsched.engine.tiny import make_tiny_model

    return str(
        make_tiny_model(
            folder,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            num_kv_heads=4,
            intermediate_size=768,
            max_position_embeddings=4096,
        )
    )


def prompts_for(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]


def summarize(runs: list[dict], prompt_tokens: int) -> dict:
    rates = [r["output_tokens"] / r["seconds"] for r in runs]
    best = max(range(len(runs)), key=lambda i: rates[i])
    return {
        "runs": runs,
        "output_tok_per_s_median": statistics.median(rates),
        "output_tok_per_s_best": rates[best],
        "total_tok_per_s_median": statistics.median((r["output_tokens"] + prompt_tokens) / r["seconds"] for r in runs),
    }


def run_ours(model: str, prompts, args) -> dict:
    import torch

    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine import LLM

    llm = LLM(
        model,
        scheduler=args.scheduler,
        b_max=args.b_max,
        max_num_seqs=args.num_prompts,
        max_model_len=args.prompt_len + args.output_len + 16,
        num_threads=args.threads,
    )
    sp = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    llm.generate(prompts[:4], sp)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = llm.generate(prompts, sp)
        dt = time.perf_counter() - t
        runs.append({"seconds": dt, "output_tokens": sum(len(o.token_ids) for o in out), "steps": llm.engine.steps})
    res = summarize(runs, sum(map(len, prompts)))
    res.update(threads=torch.get_num_threads(), torch=torch.__version__, scheduler=args.scheduler)
    return res


def run_vllm(model: str, prompts, args) -> dict:
    if not os.path.exists(args.vllm_python):
        return {"error": f"no vLLM interpreter at {args.vllm_python}"}
    cfg = {
        "model": model,
        "prompts": prompts,
        "output_len": args.output_len,
        "b_max": args.b_max,
        "max_num_seqs": args.num_prompts,
        "max_model_len": args.prompt_len + args.output_len + 16,
        "repeats": args.repeats,
        "enforce_eager": not args.vllm_compile,
        "memory_utilization": 0.3,
    }
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gb), TOKENIZERS_PARALLELISM="false")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(VLLM_SCRIPT)
        script = f.name
    try:
        p = subprocess.run(
            [args.vllm_python, script, json.dumps(cfg)],
            capture_output=True,
            text=True,
            env=env,
            timeout=args.vllm_timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"vLLM did not finish within {args.vllm_timeout} s"}
    finally:
        os.unlink(script)
    for line in p.stdout.splitlines():
        if line.startswith("VLLM_JSON "):
            data = json.loads(line[len("VLLM_JSON ") :])
            res = summarize(data["runs"], sum(map(len, prompts)))
            res.update(
                vllm=data["vllm"],
                torch=data["torch"],
                driver_torch_threads=data["threads"],
                enforce_eager=cfg["enforce_eager"],
            )
            return res
    tail = [x for x in (p.stderr or "").splitlines() if "Error" in x or "error" in x][-3:]
    return {"error": f"vLLM exited with code {p.returncode}: " + " | ".join(tail)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (default: a small random Llama-shaped model)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--b-max", type=int, default=2048, help="token budget per step (both engines)")
    ap.add_argument("--scheduler", default="sarathi", help="llmsched policy (vLLM V1 schedules like sarathi)")
    ap.add_argument("--threads", type=int, default=None, help="our torch threads (default: cores - 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    ap.add_argument("--vllm-kv-gb", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE (GiB, integer)")
    ap.add_argument("--vllm-compile", action="store_true", help="let vLLM use torch.compile (default: eager)")
    ap.add_argument("--vllm-timeout", type=int, default=1200)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)

    tmp = None
    model = args.model
    if model is None:
        tmp = tempfile.mkdtemp(prefix="llmsched-bench-")
        model = make_model(os.path.join(tmp, "model"))
    from llmsched.engine.loader import read_config

    vocab = read_config(model).vocab_size
    prompts = prompts_for(vocab, args.num_prompts, args.prompt_len)
    result = {
        "model": model,
        "num_prompts": args.num_prompts,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "b_max": args.b_max,
        "cpu_count": os.cpu_count(),
        "ours": run_ours(model, prompts, args),
    }
    print(
        f"llmsched: {result['ours']['output_tok_per_s_median']:.0f} output tok/s ({result['ours']['threads']} threads)",
        file=sys.stderr,
    )
    if not args.no_vllm:
        result["vllm"] = run_vllm(model, prompts, args)
        v = result["vllm"]
        if "error" in v:
            print(f"vLLM: {v['error']}", file=sys.stderr)
        else:
            result["ratio_ours_over_vllm"] = result["ours"]["output_tok_per_s_median"] / v["output_tok_per_s_median"]
            print(
                f"vLLM {v['vllm']}: {v['output_tok_per_s_median']:.0f} output tok/s; ratio "
                f"{result['ratio_ours_over_vllm']:.2f}",
                file=sys.stderr,
            )
    text = json.dumps(result, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
