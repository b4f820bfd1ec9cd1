"""Simulator speed and memory, end to end and with the output files a user gets.

Default scenario (issue 2): ShareGPT lengths, Poisson arrivals at 90% of capacity, Sarathi
with b_max = 512, the H200 Llama-3-8B profile. `--scenario const` is pyserq's workload
instead: 1000 prompt and 201 output tokens for every request, 85% of capacity, the paper
cost model. Each size runs in fresh processes, so peak RSS is each run's own.

    python benchmarks/bench_simulator.py                 # 100k requests
    python benchmarks/bench_simulator.py --sizes 100000 1000000
    python benchmarks/bench_simulator.py --scenario const --sizes 100000
    python benchmarks/bench_simulator.py --policy orca --load 0.9

Two measurements per size:

- in process (one child): `llmsched.simulate(...)` with its summary and stability verdict
  (what `llmsched simulate --out ''` computes), then `result.write(DIR)`, the files of
  `--out DIR` (summary.json, config.json, requests.csv, timeseries.csv, three histograms).
  Reported: the event loop alone (`loop`), the whole call (`no output`), writing the files
  (`write`) and both (`with output`), and the child's peak RSS.
- the command line (two more children): `python -m llmsched simulate ... --quiet` with
  `--out ''` and with `--out DIR`, timed from the parent: interpreter start, imports,
  workload generation, simulation, verdict and files; what a user waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from _cli import positive_float, positive_int, run_child
from _memory import peak_rss_kb

SCENARIOS = {  # name -> (prompt law, output law, cost model, load)
    "sharegpt": ("sharegpt", "sharegpt", "profile:h200-llama-3-8b", 0.9),
    "const": ("const:1000", "const:201", "paper", 0.85),
}


def _capacity():
    try:
        from llmsched.theory import capacity
    except ImportError:  # before the theory package
        from llmsched.analysis.capacity import capacity
    return capacity


def one_run(
    n: int, policy: str, load: float, b_max: int, cost: str, prompt: str, output: str, exact: bool, out_dir: str
) -> dict:
    import numpy as np

    import llmsched
    from llmsched.workload import WorkloadSpec, make_trace

    probe = make_trace(
        WorkloadSpec(arrival="poisson", rate=1.0, prompt=prompt, output=output, num_requests=min(n, 200_000), seed=1)
    )
    try:  # the contexts of the lengths' mix, as `llmsched capacity` times them (since 2026-12-01)
        from llmsched.theory import LengthMix

        mix = {"mix": LengthMix(probe.prompt, probe.output)}
    except ImportError:  # an older llmsched: the mean lengths' contexts
        mix = {}
    rep = _capacity()(cost, b_max, float(np.mean(probe.prompt)), float(np.mean(probe.output)), **mix)
    rate = load * rep.critical_rate
    del probe
    t0 = time.perf_counter()
    trace = make_trace(WorkloadSpec(arrival="poisson", rate=rate, prompt=prompt, output=output, num_requests=n, seed=1))
    t1, c1 = time.perf_counter(), time.process_time()
    r = llmsched.simulate(trace=trace, policy=policy, b_max=b_max, cost_model=cost, fast=not exact)
    s = r.summary
    t2, c2 = time.perf_counter(), time.process_time()
    r.write(out_dir)
    t3, c3 = time.perf_counter(), time.process_time()
    peak_mb = peak_rss_kb() / 1024  # (VmHWM: this child's own, not its parent's)
    return {
        "requests": n,
        "policy": policy,
        "load": load,
        "rate": rate,
        "exact": exact,
        "cost_model": cost,
        "prompt": prompt,
        "output": output,
        "workload_s": t1 - t0,
        "loop_s": r.wall_s,
        "no_output_s": t2 - t1,
        "no_output_cpu_s": c2 - c1,
        "write_s": t3 - t2,
        "write_cpu_s": c3 - c2,
        "with_output_s": t3 - t1,
        "with_output_cpu_s": c3 - c1,
        "requests_per_s": n / (t3 - t1),
        "steps": s["steps"],
        "steps_per_s": s["steps"] / r.wall_s,
        "peak_rss_mb": peak_mb,
        "completed": s["completed"],
        "mean_ttft_ms": s["mean_ttft_ms"],
        "simulated_s": s["duration"],
    }


def cli_command(res: dict, b_max: int, exact: bool, out: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "llmsched",
        "simulate",
        "--policy",
        res["policy"],
        "--b-max",
        str(b_max),
        "--cost-model",
        res["cost_model"],
        "--prompt",
        res["prompt"],
        "--output",
        res["output"],
        "--rate",
        repr(res["rate"]),
        "--num-requests",
        str(res["requests"]),
        "--seed",
        "1",
        "--quiet",
        "--out",
        out,
    ]
    return cmd + (["--exact"] if exact else [])


def time_cli(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one command (CPU: user + system of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd).returncode
    if rc:  # the command line printed its own one-line error
        sys.exit(rc)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[100_000])
    ap.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default="sharegpt",
        help="lengths, cost model and load (each can be overridden below)",
    )
    ap.add_argument("--policy", default="sarathi")
    ap.add_argument("--load", type=positive_float)
    ap.add_argument("--b-max", type=positive_int, default=512)
    ap.add_argument("--cost-model")
    ap.add_argument("--prompt")
    ap.add_argument("--output")
    ap.add_argument("--exact", action="store_true", help="disable the fast path")
    ap.add_argument("--no-cli", action="store_true", help="skip the command-line runs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    prompt, output, cost, load = SCENARIOS[args.scenario]
    prompt, output = args.prompt or prompt, args.output or output
    cost = args.cost_model or cost
    load = args.load if args.load is not None else load
    if args.child:
        res = one_run(args.sizes[0], args.policy, load, args.b_max, cost, prompt, output, args.exact, args.out_dir)
        print(json.dumps(res))
        return
    work = tempfile.mkdtemp(prefix="bench-simulator-")
    try:
        for n in args.sizes:
            out_dir = os.path.join(work, f"inproc_{n}")
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--sizes",
                str(n),
                "--policy",
                args.policy,
                "--load",
                repr(load),
                "--b-max",
                str(args.b_max),
                "--cost-model",
                cost,
                "--prompt",
                prompt,
                "--output",
                output,
                "--out-dir",
                out_dir,
            ] + (["--exact"] if args.exact else [])
            out = run_child(cmd, "bench_simulator").stdout
            res = json.loads(out.strip().splitlines()[-1])
            shutil.rmtree(out_dir, ignore_errors=True)
            print(
                f"{res['requests']:>9,} requests  {res['policy']:<8} load {res['load']:.0%}  "
                f"loop {res['loop_s']:7.2f} s  no output {res['no_output_s']:7.2f} s  "
                f"write {res['write_s']:5.2f} s  with output {res['with_output_s']:7.2f} s  "
                f"{res['requests_per_s']:9,.0f} req/s  {res['steps_per_s']:9,.0f} steps/s  "
                f"peak RSS {res['peak_rss_mb']:7,.0f} MB  ({res['steps']:,} steps, "
                f"{res['simulated_s']:,.0f} s simulated)",
                flush=True,
            )
            if not args.no_cli:
                cli_dir = os.path.join(work, f"cli_{n}")
                res["cli_no_output_s"], res["cli_no_output_cpu_s"] = time_cli(
                    cli_command(res, args.b_max, args.exact, "")
                )
                res["cli_with_output_s"], res["cli_with_output_cpu_s"] = time_cli(
                    cli_command(res, args.b_max, args.exact, cli_dir)
                )
                with open(os.path.join(cli_dir, "summary.json")) as fh:
                    cli_steps = json.load(fh)["steps"]
                if cli_steps != res["steps"]:
                    raise SystemExit(f"the command line ran another workload: {cli_steps} steps, not {res['steps']}")
                shutil.rmtree(cli_dir, ignore_errors=True)
                res["cli_command"] = " ".join(cli_command(res, args.b_max, args.exact, "DIR"))
                print(
                    f"{'':>9}  command line, end to end: --out '' {res['cli_no_output_s']:7.2f} s "
                    f"(cpu {res['cli_no_output_cpu_s']:.2f} s), --out DIR {res['cli_with_output_s']:7.2f} s "
                    f"(cpu {res['cli_with_output_cpu_s']:.2f} s)",
                    flush=True,
                )
            print(json.dumps(res), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
