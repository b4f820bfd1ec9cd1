"""Simulator speed and memory: simulated requests and steps per wall-second, peak memory.

Default scenario (issue 2): 100k requests, ShareGPT lengths, Poisson arrivals at 90% of
capacity, Sarathi with b_max = 512, the H200 Llama-3-8B profile. Each size runs in a fresh
process so its peak RSS is its own.

    python benchmarks/bench_simulator.py                 # 100k requests
    python benchmarks/bench_simulator.py --sizes 100000 1000000
    python benchmarks/bench_simulator.py --policy orca --load 0.9
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one_run(n: int, policy: str, load: float, b_max: int, cost: str, prompt: str, output: str,
            exact: bool) -> dict:
    import numpy as np

    import llmsched
    from llmsched.analysis.capacity import capacity
    from llmsched.workload import WorkloadSpec, make_trace

    probe = make_trace(WorkloadSpec(arrival="poisson", rate=1.0, prompt=prompt, output=output,
                                    num_requests=min(n, 200_000), seed=1))
    rep = capacity(cost, b_max, float(np.mean(probe.prompt)), float(np.mean(probe.output)))
    rate = load * rep.critical_rate
    t0 = time.perf_counter()
    trace = make_trace(WorkloadSpec(arrival="poisson", rate=rate, prompt=prompt, output=output,
                                    num_requests=n, seed=1))
    t_workload = time.perf_counter() - t0
    r = llmsched.simulate(trace=trace, policy=policy, b_max=b_max, cost_model=cost,
                          fast=not exact, verdict=False)
    s = r.summary
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"requests": n, "policy": policy, "load": load, "rate": rate, "exact": exact,
            "wall_s": r.wall_s, "workload_s": t_workload,
            "requests_per_s": n / r.wall_s, "steps": s["steps"], "steps_per_s": s["steps"] / r.wall_s,
            "peak_rss_mb": peak_mb, "completed": s["completed"], "mean_ttft_ms": s["mean_ttft_ms"],
            "simulated_s": s["duration"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--policy", default="sarathi")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--b-max", type=int, default=512)
    ap.add_argument("--cost-model", default="profile:h200-llama-3-8b")
    ap.add_argument("--prompt", default="sharegpt")
    ap.add_argument("--output", default="sharegpt")
    ap.add_argument("--exact", action="store_true", help="disable the fast path")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = one_run(args.sizes[0], args.policy, args.load, args.b_max, args.cost_model,
                      args.prompt, args.output, args.exact)
        print(json.dumps(res))
        return
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--child", "--sizes", str(n), "--policy", args.policy,
               "--load", str(args.load), "--b-max", str(args.b_max), "--cost-model", args.cost_model,
               "--prompt", args.prompt, "--output", args.output] + (["--exact"] if args.exact else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        print(f"{res['requests']:>9,} requests  {res['policy']:<8} load {res['load']:.0%}  "
              f"wall {res['wall_s']:7.2f} s  {res['requests_per_s']:9,.0f} req/s  "
              f"{res['steps_per_s']:9,.0f} steps/s  peak RSS {res['peak_rss_mb']:7,.0f} MB  "
              f"(workload {res['workload_s']:.2f} s, {res['steps']:,} steps, "
              f"{res['simulated_s']:,.0f} s simulated)")
        print(json.dumps(res))


if __name__ == "__main__":
    main()
