"""Serverless runtime speed and memory, and TWP's cost per simulator step. Each case runs in
a fresh process, so that its peak RSS is its own.

Cases:
- `platform`: 32 GPUs (4 nodes x 8 H200), 8 models (six Llama-3-8B fine-tunes and two
  Llama-3.2-1B, Zipf 1.0 popularity, checkpoints on every node's SSD), 1M requests. The
  Azure conversation trace has 19,366 requests, so the requests are the trace *tiled*:
  its inter-arrival gaps and (prompt, output) pairs repeated in order until there are
  enough, rescaled to `--load` of the platform's static-allocation capacity
  (`llmsched.analysis.reproduce_twp.platform_capacity`); each request's model is drawn by
  popularity. The tiled trace is written to a CSV first (outside the timing) and the child
  runs what a user runs: `simulate_serverless` on a platform whose `workload.trace` is that
  file, then `ServerlessResult.write` (summary.json, config.json, requests.csv,
  instances.csv). Platform scheduler `--scheduler` (default fcfs). Targets: under 2
  minutes and 1 GB peak RSS.
- `overhead`: TWP's cost per simulator step. One server (the default H200 Llama-3-8B
  profile, Sarathi, b_max 512) on the Azure trace's lengths and arrivals (rescaled to
  `--overhead-load` of the critical rate; default 0.5, where TWP keeps up), six runs of
  the batch loop (`simulate_trace`; not the summary and files, which cost the same for
  every admission policy): `fcfs` and `twp` as a user runs them (the fast path: TWP
  repeats a plan while its window leaves it unchanged, replaying its feedback step by
  step), and `twp-schedule` (below); and step by step (`fast=False`): `fcfs`,
  `fcfs-hook` (FCFS marked closed-loop with an `observe` that does nothing: the
  simulator's own cost of feeding a closed-loop policy after every step) and `twp`.
  The six run interleaved `--repeat` times in one
  process on the same trace, and the least CPU time per step of each counts (on a shared
  machine the CPU time is steadier than the wall time). Reported: steps, batches (plans,
  counted in one more untimed run of each), wall and CPU time in all, per step and per
  batch, and TWP's against FCFS's. TWP's schedule is not FCFS's (a smaller token budget
  under load: more steps carry prefill, so more plans), and the simulator's cost is
  mostly per batch: per batch separates TWP's own cost from its schedule's. Target: TWP
  under 5% per step above FCFS. `twp-schedule` replays TWP's decisions (recorded in one
  more untimed run) with an admission policy that computes nothing (the simulator still
  calls its `observe_batch` once per batch, which does nothing): against `fcfs` it is the
  cost of TWP's schedule, and `twp` against it TWP's own computation.

    python benchmarks/bench_serverless.py                          # both cases, full size
    python benchmarks/bench_serverless.py --scale 0.1              # platform: 100k requests
    python benchmarks/bench_serverless.py --cases overhead --overhead-requests 20000

Reported per run: `wall_s` (simulation + summary + files, inside the child), its parts
(`sim_s`, `write_s`), `cpu_s` (the child's user + system time, imports included; the
platform case also per simulated step, `cpu_us_per_step`),
`process_wall_s` (the child seen by the parent), `peak_rss_mb` (VmHWM), steps, requests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

from _cli import config_errors, out_file_in_new_folder, positive_float, positive_int, run_child, seed_int, write_json
from _memory import peak_rss_kb

CASES = ("platform", "overhead")
OVERHEAD_RUNS = (
    ("fcfs", True),
    ("twp", True),
    ("twp-schedule", True),
    ("fcfs", False),
    ("fcfs-hook", False),
    ("twp", False),
)


def _peak_rss_mb() -> float:
    return peak_rss_kb() / 1024


def platform(trace_path: str, scheduler: str = "fcfs", seed: int = 0) -> dict:
    """The 32-GPU, 8-model platform replaying `trace_path` (rate set by the caller); `seed`
    draws each request's model."""
    big = {"weights_gb": 16, "kv_bytes_per_token": 131072, "cost_model": "profile:h200-llama-3-8b"}
    small = {"weights_gb": 2.5, "kv_bytes_per_token": 32768, "cost_model": "profile:h200-llama-3.2-1b"}
    models = {f"llama-8b-{k}": dict(big) for k in "abcdef"}
    models.update({f"llama-1b-{k}": dict(small) for k in "ab"})
    return {
        "cluster": {
            "remote_bandwidth_gbps": 1.25,
            "nodes": [
                {
                    "name": "node",
                    "count": 4,
                    "gpus": 8,
                    "gpu_memory_gb": 141,
                    "dram_gb": 256,
                    "dram_bandwidth_gbps": 24,
                    "ssd_gb": 2048,
                    "ssd_bandwidth_gbps": 5,
                    "ssd": list(models),
                }
            ],
        },
        "models": models,
        "workload": {"trace": trace_path, "rate": 1.0, "popularity": "zipf:1.0", "seed": seed},
        "platform": {"scheduler": scheduler, "init_s": 2.0, "keep_alive_s": 60, "scale_out_tokens": 8192},
    }


def azure_tiled(n: int, path: str) -> int:
    """Write `n` requests of the Azure conversation trace, tiled, as a plain CSV trace
    (arrival_s,prompt_tokens,output_tokens); returns n."""
    import numpy as np

    from llmsched.workload.datasets import resolve_path
    from llmsched.workload.spec import load_trace

    t = load_trace(resolve_path("azure-conv"))
    arr = np.asarray(t.arrival_s, dtype=np.float64)
    gaps = np.diff(arr)
    gaps = np.append(gaps, gaps.mean())  # the gap from the last request to the next tile
    reps = -(-n // len(arr))
    g = np.tile(gaps, reps)[:n]
    times = np.concatenate([[0.0], np.cumsum(g[:-1])])
    prompt = np.tile(np.asarray(t.prompt), reps)[:n]
    output = np.tile(np.asarray(t.output), reps)[:n]
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        lines = np.char.add(
            np.char.add(np.char.add(np.char.mod("%.6f", times), ","), prompt.astype(str)),
            np.char.add(",", output.astype(str)),
        )
        f.write("\n".join(lines.tolist()) + "\n")
    return n


def child_platform(trace_path: str, n: int, load: float, scheduler: str, out: str, seed: int = 0) -> dict:
    t_start = time.perf_counter()
    from llmsched.analysis.reproduce_twp import platform_capacity
    from llmsched.sim.serverless_result import simulate_serverless
    from llmsched.workload.serverless import ServerlessSpec

    d = platform(trace_path, scheduler, seed)
    cap = platform_capacity(ServerlessSpec.from_dict(d), samples=20000)
    rate = load * cap["critical_rate"]
    d["workload"]["rate"] = rate
    d["workload"]["num_requests"] = n
    t0 = time.perf_counter()
    r = simulate_serverless(d)
    s = r.summary
    t1 = time.perf_counter()
    r.write(out)
    t2 = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "case": "platform",
        "scheduler": scheduler,
        "seed": seed,
        "requests": n,
        "load": load,
        "rate": rate,
        "capacity_rps": cap["critical_rate"],
        "gpus": s["gpus"],
        "models": len(s["models"]),
        "steps": s["steps"],
        "completed": s["completed"],
        "throughput_rps": s["request_throughput"],
        "p99_ttft_ms": s["p99_ttft_ms"],
        "cold_starts": s["cold_starts"],
        "peak_instances": s["peak_instances"],
        "sim_end_s": s["sim_end_s"],
        "sim_s": t1 - t0,
        "write_s": t2 - t1,
        "wall_s": t2 - t0,
        "setup_s": t0 - t_start,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "cpu_us_per_step": (ru.ru_utime + ru.ru_stime) / max(1, s["steps"]) * 1e6,
        "peak_rss_mb": _peak_rss_mb(),
    }


def schedule_replay(decisions: dict):
    """An admission policy that replays TWP's recorded decisions (its schedule) and computes
    nothing: the simulator's cost of TWP's schedule, without TWP's own."""
    from llmsched.policies.base import AdmissionPolicy

    class ScheduleReplay(AdmissionPolicy):
        name = "twp-schedule"
        closed_loop = True
        repeats = True
        repeatable = True  # TWP's; a class written outside llmsched would not be (policies.base)
        reads_emitted = False

        def __init__(self):
            self._limit = iter(decisions["token_limit"]).__next__
            self._admit = iter(decisions["may_admit"]).__next__
            self._repeat = iter(decisions["repeat_steps"]).__next__

        def token_limit(self, state):
            return self._limit()

        def may_admit(self, state, r, planner):
            return self._admit()

        def repeat_steps(self, state, plan, start_ns, durations_ns):
            return self._repeat()

        def observe_repeats(self, state, plan, start_ns, durations_ns):
            pass

        def observe_batch(self, state, plan, *batch):
            pass  # the simulator's feedback call, and nothing computed from it

    return ScheduleReplay()


def child_overhead(n: int, load: float, seed: int, repeat: int) -> dict:
    """The single-server batch loop (`simulate_trace`: the steps, without the summary and
    files, which cost the same for every admission policy) under each of `OVERHEAD_RUNS`,
    interleaved `repeat` times in this one process on the same trace; the least CPU time
    per step of each counts. `fcfs-hook`: FCFS admission marked closed-loop with an
    `observe` that does nothing, which isolates the simulator's per-step cost of feeding a
    closed-loop policy from TWP's own."""
    from llmsched.analysis.points import resolve_point
    from llmsched.core import make_cost_model
    from llmsched.policies import make_scheduler
    from llmsched.policies.base import Scheduler
    from llmsched.sim.simulator import simulate_trace
    from llmsched.workload import WorkloadSpec, make_trace

    cfg = resolve_point(None, {"arrival": "azure-conv", "num_requests": n, "seed": seed, "load": load}, {})
    trace = make_trace(WorkloadSpec.from_dict(cfg.workload))
    cost = make_cost_model(cfg.cost_model)

    # TWP's decisions in order (token limits, admissions, repeat counts), recorded in an
    # untimed run, for `twp-schedule`
    decisions: dict[str, list] = {"token_limit": [], "may_admit": [], "repeat_steps": []}

    def scheduler(admission: str):
        if admission == "twp-schedule":
            batch = make_scheduler(cfg.policy, b_max=cfg.b_max)
            sched = Scheduler(batch.batch, schedule_replay(decisions), batch.constraints)
        else:
            sched = make_scheduler(cfg.policy, admission="twp" if admission == "twp" else "fcfs", b_max=cfg.b_max)
        if admission == "fcfs-hook":
            sched.closed_loop, sched.repeatable = True, False
            sched.admission.observe = lambda state, feedback: None
        sched.bind_cost_model(cost)
        return sched

    recorder = scheduler("twp")
    for name in decisions:
        owner = recorder if name == "repeat_steps" else recorder.admission
        decide = getattr(owner, name)

        def recorded(*args, decide=decide, seen=decisions[name]):
            seen.append(decide(*args))
            return seen[-1]

        setattr(owner, name, recorded)
    twp_steps = simulate_trace(trace, recorder, cost).steps

    # the batches (plans) each run makes, counted once in an untimed run: TWP's schedule
    # differs from FCFS's, and the simulator's cost is mostly per batch, not per step
    batches = {}
    for admission, fast in OVERHEAD_RUNS:
        sched = scheduler(admission)
        plans = [0]
        plan = sched.plan

        def counted(state, plan=plan, plans=plans):
            plans[0] += 1
            return plan(state)

        sched.plan = counted
        simulate_trace(trace, sched, cost, fast=fast)
        batches[admission, fast] = plans[0]
    best: dict = {}
    for _ in range(max(1, repeat)):
        for admission, fast in OVERHEAD_RUNS:
            sched = scheduler(admission)
            t0, c0 = time.perf_counter(), time.process_time()
            stats = simulate_trace(trace, sched, cost, fast=fast)
            t1, c1 = time.perf_counter(), time.process_time()
            if admission == "twp-schedule" and stats.steps != twp_steps:
                raise RuntimeError("the replayed schedule is not TWP's")
            key = f"{admission}{'' if fast else ' step by step'}"
            res = {
                "case": "overhead",
                "run": key,
                "requests": n,
                "load": load,
                "steps": stats.steps,
                "batches": batches[admission, fast],
                "wall_s": t1 - t0,
                "cpu_s": c1 - c0,
                "us_per_step": (t1 - t0) / stats.steps * 1e6,
                "cpu_us_per_step": (c1 - c0) / stats.steps * 1e6,
                "cpu_us_per_batch": (c1 - c0) / batches[admission, fast] * 1e6,
            }
            if key not in best or res["cpu_us_per_step"] < best[key]["cpu_us_per_step"]:
                best[key] = res
    return {"runs": list(best.values()), "repeat": repeat, "peak_rss_mb": _peak_rss_mb()}


def _run_child(args: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = run_child([sys.executable, os.path.abspath(__file__), *args], "bench_serverless")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = time.perf_counter() - t0
    return res


def main() -> None:
    with config_errors("bench_serverless"):  # e.g. the Azure trace not found
        _main()


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--scale", type=positive_float, default=1.0, help="multiply the platform case's 1M requests")
    ap.add_argument("--load", type=positive_float, default=0.7, help="platform load, of its static-allocation capacity")
    ap.add_argument("--scheduler", default="fcfs", help="platform scheduler of the platform case (default fcfs)")
    ap.add_argument("--overhead-requests", type=positive_int, default=20000, help="requests of each overhead run")
    ap.add_argument("--overhead-load", type=positive_float, default=0.5, help="load of the overhead runs (of lambda*)")
    ap.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        help="interleaved repetitions of the overhead runs (the least CPU per step counts)",
    )
    ap.add_argument(
        "--seed",
        type=seed_int,
        default=0,
        help="the platform case's model draws (by popularity); the overhead runs replay the Azure trace as it is",
    )
    ap.add_argument("--keep", help="write the outputs under this folder (default: a temporary folder, removed)")
    ap.add_argument("--json", type=out_file_in_new_folder, help="also write the results to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--trace", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from llmsched.workload.serverless import scheduler_key

    args.scheduler = scheduler_key(args.scheduler, "--scheduler")  # before the tiled trace is written
    if args.child == "platform":
        print(json.dumps(child_platform(args.trace, args.n, args.load, args.scheduler, args.out, args.seed)))
        return
    if args.child == "overhead":
        print(json.dumps(child_overhead(args.n, args.load, args.seed, args.repeat)))
        return
    base = args.keep or tempfile.mkdtemp(prefix="bench-serverless-")
    os.makedirs(base, exist_ok=True)  # a --keep folder that does not exist yet
    results = []
    try:
        if "platform" in args.cases:
            n = max(100, round(1_000_000 * args.scale))
            trace = os.path.join(base, "azure_tiled.csv")
            azure_tiled(n, trace)
            res = _run_child(
                [
                    "--child",
                    "platform",
                    "--n",
                    str(n),
                    "--trace",
                    trace,
                    "--load",
                    str(args.load),
                    "--scheduler",
                    args.scheduler,
                    "--seed",
                    str(args.seed),
                    "--out",
                    os.path.join(base, "platform"),
                ]
            )
            results.append(res)
            print(
                f"platform {res['gpus']} GPUs {res['models']} models {n:>9,} requests ({args.scheduler}, "
                f"{res['rate']:.1f} req/s = {args.load:g} x {res['capacity_rps']:.1f})  wall {res['wall_s']:7.1f} s "
                f"(sim {res['sim_s']:.1f} + write {res['write_s']:.1f})  cpu {res['cpu_s']:7.1f} s  "
                f"process {res['process_wall_s']:7.1f} s  peak RSS {res['peak_rss_mb']:6.0f} MB  "
                f"{res['steps']:,} steps ({res['cpu_us_per_step']:.1f} us of CPU each)",
                flush=True,
            )
        if "overhead" in args.cases:
            out = _run_child(
                [
                    "--child",
                    "overhead",
                    "--n",
                    str(args.overhead_requests),
                    "--load",
                    str(args.overhead_load),
                    "--seed",
                    str(args.seed),
                    "--repeat",
                    str(args.repeat),
                ]
            )
            best = {r["run"]: r for r in out["runs"]}
            for key, res in best.items():
                results.append(res)
                print(
                    f"overhead {key:<22} {res['requests']:,} requests  {res['steps']:>9,} steps  "
                    f"{res['batches']:>9,} batches  wall {res['wall_s']:6.2f} s  {res['us_per_step']:6.2f} us/step  "
                    f"cpu {res['cpu_s']:6.2f} s  {res['cpu_us_per_step']:6.2f} us/step  "
                    f"{res['cpu_us_per_batch']:6.2f} us/batch",
                    flush=True,
                )
            for twp_key, key in (
                ("twp", "fcfs"),
                ("twp-schedule", "fcfs"),
                ("twp", "twp-schedule"),
                ("twp step by step", "fcfs step by step"),
                ("twp step by step", "fcfs-hook step by step"),
            ):
                a, b = best[twp_key], best[key]

                def more(k, a=a, b=b):
                    return f"{100 * (a[k] / b[k] - 1):+.1f}%"

                print(
                    f"{twp_key} vs {key}: CPU per step {more('cpu_us_per_step')}, in all {more('cpu_s')}, "
                    f"per batch {more('cpu_us_per_batch')} ({more('batches')} batches)"
                )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        write_json(args.json, results, indent=1)  # (its folder made: e.g. under --keep)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
