"""Offline CPU throughput of the llmsched engine, side by side with vLLM's CPU build.

Both engines get the same model folder, the same prompts (random token ids), greedy
decoding with ignore_eos (so every request produces exactly --output-len tokens), the
same token budget per step (b_max = vLLM's max_num_batched_tokens), the same running
cap (max_num_seqs) and, by default, the same number of compute threads (all cores but
one: what vLLM's CPU backend binds by default). vLLM runs in its own virtualenv
(--vllm-python), as a subprocess that stays up: both engines are loaded and warmed up
first, then their timed runs alternate (ours, vLLM, then vLLM, ours, ...), so that both
see the same load of a shared machine; `ratio_per_pair` compares the runs made back to
back. The load average before and after is recorded, and each run's CPU seconds (ours:
this process; vLLM: its process and children, via psutil).

vLLM binds its model worker to one core and keeps the other cores for its front-end
process, so on a shared machine it also gets more CPU time than our one process (its
second process overlaps the host work with the compute). `--cpus 1` pins both engines,
vLLM's whole process tree included, to the same CPU list, for a same-hardware comparison.

    python benchmarks/engine_cpu_throughput.py --vllm-python VENV/bin/python --out results/engine_cpu.json
    python benchmarks/engine_cpu_throughput.py --model DIR --num-prompts 64 --no-vllm
    python benchmarks/engine_cpu_throughput.py --prefix-caching --shared-prefix 96   # both with caching on

Without --model a small Llama-shaped random model is written to a temporary folder
(hidden 256, 4 layers, 8 heads / 4 KV heads, MLP 768, byte-level BPE tokenizer), removed
at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _cli import config_errors, fail, out_file_in_new_folder, positive_int, write_json

from llmsched.policies import make_scheduler

VLLM_SCRIPT = r"""
import json, sys, time

def main():
    with open(sys.argv[1]) as f:  # a file: the prompt sets are too long for a command line
        cfg = json.load(f)
    from vllm import LLM, SamplingParams
    llm = LLM(model=cfg["model"], dtype="float32", max_model_len=cfg["max_model_len"],
              max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["b_max"],
              enforce_eager=cfg["enforce_eager"], enable_prefix_caching=cfg["prefix_caching"],
              block_size=cfg["block_size"], gpu_memory_utilization=cfg["memory_utilization"], seed=0)
    sets = [[{"prompt_token_ids": p} for p in ps] for ps in cfg["prompt_sets"]]
    sp = SamplingParams(max_tokens=cfg["output_len"], temperature=0, ignore_eos=True)
    llm.generate(sets[0][:4], sp, use_tqdm=False)
    import vllm, torch
    print("VLLM_READY " + json.dumps({"vllm": vllm.__version__, "torch": torch.__version__,
                                      "threads": torch.get_num_threads()}), flush=True)
    import psutil
    me = psutil.Process()

    def cpu():  # CPU seconds of this process and its children (vLLM's engine core)
        total = 0.0
        for p in [me] + me.children(recursive=True):
            try:
                c = p.cpu_times()
                total += c.user + c.system
            except psutil.Error:
                pass
        return total

    for line in sys.stdin:  # one timed run per "run I" line, on prompt set I
        word, _, i = line.partition(" ")
        if word != "run":
            break
        c, t = cpu(), time.perf_counter()
        out = llm.generate(sets[int(i)], sp, use_tqdm=False)
        dt, dc = time.perf_counter() - t, cpu() - c
        n = sum(len(o.outputs[0].token_ids) for o in out)
        print("VLLM_RUN " + json.dumps({"seconds": dt, "cpu_seconds": dc, "output_tokens": n}), flush=True)

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


def prompts_for(vocab: int, n: int, length: int, seed: int = 0, shared: list[int] | None = None) -> list[list[int]]:
    """n random prompts of `length` tokens; with `shared`, each starts with those tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    head = list(shared or [])
    return [head + rng.integers(3, vocab, length - len(head)).tolist() for _ in range(n)]


def prompt_sets(vocab: int, args) -> list[list[list[int]]]:
    """One prompt set per timed run, plus the warm-up's (set 0). Without prefix caching
    every run takes the same prompts. With it, each set has new random tokens after a
    `--shared-prefix` common to all sets, so a run reuses that prefix, not the prompts of
    the run before it (every prompt would then be a whole-prompt hit)."""
    import numpy as np

    if not args.prefix_caching:
        ps = prompts_for(vocab, args.num_prompts, args.prompt_len)
        return [ps] * (args.repeats + 1)
    shared = np.random.default_rng(12345).integers(3, vocab, args.shared_prefix).tolist()
    return [prompts_for(vocab, args.num_prompts, args.prompt_len, seed, shared) for seed in range(args.repeats + 1)]


def summarize(runs: list[dict], prompt_tokens: int) -> dict:
    rates = [r["output_tokens"] / r["seconds"] for r in runs]
    best = max(range(len(runs)), key=lambda i: rates[i])
    return {
        "runs": runs,
        "output_tok_per_s_median": statistics.median(rates),
        "output_tok_per_s_best": rates[best],
        "total_tok_per_s_median": statistics.median((r["output_tokens"] + prompt_tokens) / r["seconds"] for r in runs),
        # output tokens per CPU second of the engine's processes: less sensitive to the
        # load of a shared machine than wall-clock throughput (vLLM runs two processes)
        "output_tok_per_cpu_s_median": statistics.median(r["output_tokens"] / r["cpu_seconds"] for r in runs),
    }


class Ours:
    """The llmsched engine in this process, loaded and warmed up once."""

    def __init__(self, model: str, sets, args):
        from llmsched.core.engine_api import SamplingParams
        from llmsched.engine import LLM

        self.llm = LLM(
            model,
            scheduler=args.scheduler,
            b_max=args.b_max,
            max_num_seqs=args.num_prompts,
            max_model_len=args.prompt_len + args.output_len + 16,
            num_threads=args.threads,
            prefix_caching=args.prefix_caching,
            block_size=args.block_size,
        )
        self.sets = sets
        self.sp = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
        self.llm.generate(sets[0][:4], self.sp)

    def run(self, i: int) -> dict:
        steps0 = self.llm.engine.steps
        c, t = time.process_time(), time.perf_counter()
        out = self.llm.generate(self.sets[i], self.sp)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        return {
            "seconds": dt,
            "cpu_seconds": dc,
            "output_tokens": sum(len(o.token_ids) for o in out),
            "steps": self.llm.engine.steps - steps0,
        }


class VllmWorker:
    """vLLM's offline LLM in a subprocess of its own virtualenv; one timed run per `run()`."""

    def __init__(self, model: str, sets, args):
        self.error = None
        self.proc = None
        self.info: dict = {}
        self.enforce_eager = not args.vllm_compile
        cfg = {
            "model": model,
            "prompt_sets": sets,
            "prefix_caching": args.prefix_caching,
            "block_size": args.block_size,
            "output_len": args.output_len,
            "b_max": args.b_max,
            "max_num_seqs": args.num_prompts,
            "max_model_len": args.prompt_len + args.output_len + 16,
            "enforce_eager": self.enforce_eager,
            "memory_utilization": 0.3,
        }
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gb), TOKENIZERS_PARALLELISM="false")
        self.dir = tempfile.mkdtemp(prefix="llmsched-vllm-")
        script = os.path.join(self.dir, "run_vllm.py")
        with open(script, "w") as f:
            f.write(VLLM_SCRIPT)
        cfg_file = os.path.join(self.dir, "config.json")
        write_json(cfg_file, cfg)
        self.stderr = open(os.path.join(self.dir, "stderr.txt"), "w+")
        self.timeout = args.vllm_timeout
        cpus = parse_cpus(args.cpus)
        if cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = args.cpus
        self.proc = subprocess.Popen(
            [args.vllm_python, script, cfg_file],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        line = self._line("VLLM_READY ")
        if line is not None:
            self.info = json.loads(line)

    def _line(self, prefix: str):
        """The rest of the next stdout line that starts with `prefix`; None (and
        `self.error`) if vLLM exits or stays silent for --vllm-timeout seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.error = f"vLLM gave no answer within {self.timeout} s"
                self.close()
                return None
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.stderr.seek(0)
                tail = [x for x in self.stderr.read().splitlines() if "Error" in x or "error" in x][-3:]
                self.error = f"vLLM exited with code {self.proc.returncode}: " + " | ".join(tail)
                self.close()
                return None
            if line.startswith(prefix):
                return line[len(prefix) :]

    def run(self, i: int) -> dict | None:
        if self.error:
            return None
        self.proc.stdin.write(f"run {i}\n")
        self.proc.stdin.flush()
        line = self._line("VLLM_RUN ")
        return None if line is None else json.loads(line)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = None


def parse_cpus(text: str | None) -> set[int]:
    """'1' or '0,2-3' -> {cpu ids}; None -> empty (no pinning). `text` was checked by
    `cpu_list` when the arguments were read."""
    out: set[int] = set()
    for part in (text or "").split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def cpu_list(text: str) -> str:
    """An argparse type: `--cpus` as given ('1', '0,2-3'), checked: each part a CPU id or an
    ascending range of them, every CPU one this process may run on (else an OSError from
    sched_setaffinity once the model is written)."""
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        if not a.isdigit() or (dash and not b.isdigit()) or (dash and int(b) < int(a)):
            raise argparse.ArgumentTypeError(f"expected CPU ids or ranges such as 1 or 0,2-3, got {text!r}")
    allowed = os.sched_getaffinity(0)
    missing = sorted(parse_cpus(text) - allowed)
    if missing:
        raise argparse.ArgumentTypeError(f"CPU {missing[0]} is not one this process may run on ({_ranges(allowed)})")
    return text


def _ranges(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and spans[-1][1] == cpu - 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def measure(model: str, args) -> dict:
    import torch

    from llmsched.engine.loader import read_config

    sets = prompt_sets(read_config(model).vocab_size, args)
    load0 = os.getloadavg()
    if args.cpus:
        os.sched_setaffinity(0, parse_cpus(args.cpus))
    ours = Ours(model, sets, args)
    vllm = None if args.no_vllm else VllmWorker(model, sets, args)
    ours_runs, vllm_runs = [], []
    try:
        for i in range(args.repeats):  # alternate who goes first: ours, vLLM, vLLM, ours, ...
            for who in ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours"):
                if who == "ours":
                    ours_runs.append(ours.run(i + 1))
                elif vllm is not None:
                    r = vllm.run(i + 1)
                    if r is not None:
                        vllm_runs.append(r)
    finally:
        if vllm is not None:
            vllm.close()
    n_prompt = sum(map(len, sets[1]))
    result = {
        "model": args.model or "generated (hidden 256, 4 layers, 8/4 heads, MLP 768)",
        "num_prompts": args.num_prompts,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "b_max": args.b_max,
        "prefix_caching": args.prefix_caching,
        "shared_prefix": args.shared_prefix if args.prefix_caching else 0,
        "block_size": args.block_size,
        "cpu_count": os.cpu_count(),
        "cpus": args.cpus,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "ours": dict(
            summarize(ours_runs, n_prompt),
            threads=torch.get_num_threads(),
            torch=torch.__version__,
            scheduler=args.scheduler,
            attention="c-kernel" if ours.llm.engine.runner.decode_kernel is not None else "torch",
            prefix_cache=ours.llm.engine.state.prefix_stats(),
        ),
    }
    print(
        f"llmsched: {result['ours']['output_tok_per_s_median']:.0f} output tok/s "
        f"({result['ours']['threads']} threads, {result['ours']['attention']} decode attention)",
        file=sys.stderr,
    )
    if vllm is None:
        return result
    if not vllm_runs:
        result["vllm"] = {"error": vllm.error or "no vLLM run finished"}
        print(f"vLLM: {result['vllm']['error']}", file=sys.stderr)
        return result
    v = result["vllm"] = dict(
        summarize(vllm_runs, n_prompt),
        vllm=vllm.info.get("vllm"),
        torch=vllm.info.get("torch"),
        driver_torch_threads=vllm.info.get("threads"),
        enforce_eager=vllm.enforce_eager,
        error=vllm.error,
    )
    rate = [r["output_tokens"] / r["seconds"] for r in ours_runs]
    result["ratio_per_pair"] = [a / (w["output_tokens"] / w["seconds"]) for a, w in zip(rate, vllm_runs)]
    result["ratio_ours_over_vllm"] = result["ours"]["output_tok_per_s_median"] / v["output_tok_per_s_median"]
    result["cpu_ratio_ours_over_vllm"] = (
        result["ours"]["output_tok_per_cpu_s_median"] / v["output_tok_per_cpu_s_median"]
    )
    print(
        f"vLLM {v['vllm']}: {v['output_tok_per_s_median']:.0f} output tok/s; ratio of medians "
        f"{result['ratio_ours_over_vllm']:.2f}; per pair "
        + ", ".join(f"{x:.2f}" for x in result["ratio_per_pair"])
        + f"; per CPU second {result['cpu_ratio_ours_over_vllm']:.2f}",
        file=sys.stderr,
    )
    return result


def run(args) -> dict:
    """`measure` on --model, else on a small random model written for the run (removed after)."""
    make_scheduler(args.scheduler, b_max=args.b_max)  # a bad name refused before a model is written and loaded
    if args.model is not None:
        return measure(args.model, args)
    tmp = tempfile.mkdtemp(prefix="llmsched-bench-")
    try:
        return measure(make_model(os.path.join(tmp, "model")), args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (default: a small random Llama-shaped model)")
    ap.add_argument("--num-prompts", type=positive_int, default=64)
    ap.add_argument("--prompt-len", type=positive_int, default=128)
    ap.add_argument("--output-len", type=positive_int, default=64)
    ap.add_argument("--b-max", type=positive_int, default=2048, help="token budget per step (both engines)")
    ap.add_argument("--scheduler", default="sarathi", help="llmsched policy (vLLM V1 schedules like sarathi)")
    ap.add_argument("--threads", type=positive_int, default=None, help="our torch threads (default: cores - 1)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed runs of each engine, alternating")
    ap.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    ap.add_argument("--vllm-kv-gb", type=positive_int, default=1, help="VLLM_CPU_KVCACHE_SPACE (GiB, integer)")
    ap.add_argument("--vllm-compile", action="store_true", help="let vLLM use torch.compile (default: eager)")
    ap.add_argument(
        "--vllm-timeout", type=positive_int, default=1200, help="seconds vLLM may take to start or for one run"
    )
    ap.add_argument(
        "--cpus", type=cpu_list, help="pin both engines to these CPUs, e.g. 1 or 0,2-3 (default: no pinning)"
    )
    ap.add_argument("--prefix-caching", action="store_true", help="both engines with prefix caching on")
    ap.add_argument(
        "--shared-prefix", type=int, default=96, help="with --prefix-caching: tokens every prompt starts with"
    )
    ap.add_argument(
        "--block-size",
        type=positive_int,
        default=32,
        help="KV block size in tokens, both engines (vLLM CPU: a multiple of 32)",
    )
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", type=out_file_in_new_folder, help="write the result JSON here")
    args = ap.parse_args(argv)
    if args.prefix_caching and not 0 <= args.shared_prefix < args.prompt_len:
        ap.error(f"--shared-prefix must be in [0, --prompt-len), got {args.shared_prefix}")

    if not args.no_vllm and not os.path.exists(args.vllm_python):  # before the model is written and run
        fail("engine_cpu_throughput", f"no vLLM interpreter at {args.vllm_python} (--vllm-python, or --no-vllm)")
    with config_errors("engine_cpu_throughput"):
        result = run(args)
    text = json.dumps(result, indent=2)
    if args.out:
        write_json(args.out, result, indent=2)  # (its folder made)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
