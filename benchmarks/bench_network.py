"""Network simulator speed and memory, end to end (simulation, summary with verdicts, and
every output file written), each case in a fresh process so that its peak RSS is its own.

Cases:
- `cluster`: one server of 16 Sarathi replicas (paper cost model, b_max 512) behind JSQ,
  1M requests at 90% of the pool's capacity (the traffic equations' critical scale),
  written with `NetworkResult.write` (jobs.csv, calls.csv, 16 replicas' files).
- `single`: the baseline: the single-server simulator (`llmsched.simulate`, the same
  Sarathi server) on as many requests of the same workload at 90% of one server's
  capacity, written with its `out_dir`. Each replica of the cluster sees the load of this
  one server, so both run about the same number of steps in total; the cluster's
  realisation of the arrivals and lengths is drawn by the network simulator, the
  baseline's by the workload generator (same laws, same count). Target: cluster wall at
  most 4x this.
- `agent`: a 5-call agent workflow (planner -> tool delay -> three worker calls in
  parallel on a 2-replica JSQ pool, resending the plan -> tool delay -> answer resending
  everything), 100k jobs at 90% of the bottleneck's capacity, written with
  `NetworkResult.write`. Target: under 60 s.
- `loop`: a tool-using agent that makes 100 passes of (tool delay, call) on one Sarathi
  server, 5,000 jobs (500k calls) at 90% of its capacity: the draws of 200 (node, pass)
  keys in use at once (`sim.network._Draws`). No target; it guards the draw cache (a cache
  too small for the keys in use redraws a block on almost every call).
- `servers` (only with `--cases servers`): 20 Sarathi servers (every fifth a 4-replica JSQ pool, s1, s8 and s15 with
  prefix caching), two job types (20 calls in tandem through every server; 10 calls at
  the even servers, resending the context), 50,000 jobs (about 750k calls) at 90% of the
  bottleneck's capacity. No target; it guards the summary's per-server and per-class work
  (`NetworkResult.server_calls`: one grouping pass, not one scan of every call per server).
Targets for memory: peak RSS under 500 MB per case.

    python benchmarks/bench_network.py                      # the four default cases, full size
    python benchmarks/bench_network.py --scale 0.01         # 10k requests / 1k jobs
    python benchmarks/bench_network.py --cases agent --scale 0.1
    python benchmarks/bench_network.py --workload prefill-heavy
    python benchmarks/bench_network.py --cases servers          # 50k jobs, 750k calls

Reported per case: `wall_s` (simulation + summary + files, inside the child), its parts
(`sim_s`, the simulation; `write_s`, the summary with its verdicts and the files: a
network's summary is computed when the files are written), `cpu_s` (the child's user +
system CPU time, whole process, imports included), `process_wall_s` (the child process
from start to exit, seen by the parent), `peak_rss_mb` (the child's VmHWM from
/proc/self/status), requests or jobs and calls, and simulated steps.
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

from _cli import out_file_in_new_folder, positive_float, run_child, seed_int, write_json
from _memory import peak_rss_kb

CASES = ("single", "cluster", "agent", "loop", "servers")
WORKLOADS = {"synthetic": ("geometric:200", "geometric:101"), "prefill-heavy": ("geometric:400", "geometric:20")}


def _peak_rss_mb() -> float:
    return peak_rss_kb() / 1024


def agent_workflow() -> dict:
    """Five calls per job: plan, three parallel workers (a 2-replica pool), answer."""
    s = {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}
    return {
        "servers": {"planner": dict(s), "workers": {**s, "replicas": 2, "router": "jsq"}, "writer": dict(s)},
        "jobs": {
            "agent": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {
                        "call": {
                            "server": "planner",
                            "prompt": "geometric:300",
                            "output": "geometric:60",
                            "class": "plan",
                        }
                    },
                    {"delay": "exponential:0.5"},
                    {
                        "fork": [
                            [
                                {
                                    "call": {
                                        "server": "workers",
                                        "prompt": "geometric:100",
                                        "output": "geometric:50",
                                        "context": True,
                                        "class": "search",
                                    }
                                }
                            ],
                            [
                                {
                                    "call": {
                                        "server": "workers",
                                        "prompt": "geometric:100",
                                        "output": "geometric:50",
                                        "context": True,
                                        "class": "code",
                                    }
                                }
                            ],
                            [
                                {
                                    "call": {
                                        "server": "workers",
                                        "prompt": "geometric:50",
                                        "output": "geometric:30",
                                        "context": True,
                                        "class": "check",
                                    }
                                }
                            ],
                        ]
                    },
                    {"delay": "exponential:0.2"},
                    {
                        "call": {
                            "server": "writer",
                            "prompt": "const:50",
                            "output": "geometric:150",
                            "context": True,
                            "class": "answer",
                        }
                    },
                ],
            }
        },
    }


def agent_loop() -> dict:
    """100 passes of (tool delay, call) per job on one server."""
    call = {"server": "llm", "prompt": "geometric:60", "output": "geometric:20", "class": "step"}
    return {
        "servers": {"llm": {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}},
        "jobs": {
            "agent": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [{"loop": {"times": 100, "body": [{"delay": "exponential:0.2"}, {"call": call}]}}],
            }
        },
    }


def twenty_servers() -> dict:
    """20 servers, two job types: 20 short calls in tandem, and 10 resending the context."""
    servers = {}
    for i in range(20):
        s = {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}
        if i % 5 == 0:
            s.update(replicas=4, router="jsq")
        if i % 7 == 1:
            s.update(prefix_caching=True)
        servers[f"s{i}"] = s
    tandem = [{"call": {"server": f"s{i}", "prompt": "geometric:40", "output": "geometric:4"}} for i in range(20)]
    resend = [
        {"call": {"server": f"s{i}", "prompt": "geometric:20", "output": "geometric:3", "context": True}}
        for i in range(0, 20, 2)
    ]
    poisson = {"process": "poisson", "rate": 1.0}
    return {
        "servers": servers,
        "jobs": {
            "A": {"arrival": poisson, "route": tandem, "system_prompt": 64},
            "B": {"arrival": dict(poisson), "route": resend},
        },
    }


def child(case: str, n: int, load: float, workload: str, seed: int, out: str) -> dict:
    t_start = time.perf_counter()
    from llmsched.analysis.reproduce_networks import cluster_network
    from llmsched.theory.network import traffic

    prompt, output = WORKLOADS[workload]
    res: dict = {"case": case, "load": load, "workload": workload}
    if case == "single":
        import llmsched

        rate = load * traffic(cluster_network(1, "jsq", prompt=prompt, output=output)).critical_scale
        t0 = time.perf_counter()
        r = llmsched.simulate(
            policy="sarathi",
            b_max=512,
            cost_model="paper",
            arrival="poisson",
            rate=rate,
            prompt=prompt,
            output=output,
            num_requests=n,
            seed=seed,
        )
        t1 = time.perf_counter()
        r.write(out)
        s = r.summary
        t2 = time.perf_counter()
        res.update(
            requests=n, calls=n, rate=rate, steps=s["steps"], verdict=s.get("verdict"), p99_e2el_ms=s.get("p99_e2el_ms")
        )
    else:
        from llmsched.sim.network_result import simulate_network

        if case == "cluster":
            net = cluster_network(16, "jsq", prompt=prompt, output=output)
        elif case == "loop":
            net = agent_loop()
        elif case == "servers":
            net = twenty_servers()
        else:
            net = agent_workflow()
        scale = load * traffic(net).critical_scale
        t0 = time.perf_counter()
        r = simulate_network(net, scale=scale, num_jobs=n, seed=seed)
        t1 = time.perf_counter()
        r.write(out)
        s = r.summary
        t2 = time.perf_counter()
        res.update(
            requests=n,
            calls=s["num_calls"],
            rate=scale,
            steps=s["steps"],
            verdict=s["verdict"],
            p99_job_latency_ms=s.get("p99_job_latency_ms"),
            bottleneck=s.get("bottleneck"),
        )
    ru = resource.getrusage(resource.RUSAGE_SELF)
    res.update(
        sim_s=t1 - t0,
        write_s=t2 - t1,
        wall_s=t2 - t0,
        child_total_s=time.perf_counter() - t_start,
        cpu_s=ru.ru_utime + ru.ru_stime,
        peak_rss_mb=_peak_rss_mb(),
        out_mb=sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs) / 2**20,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # (`servers` only when asked for: the default run is the one docs/performance.md records)
    ap.add_argument("--cases", nargs="+", choices=CASES, default=[c for c in CASES if c != "servers"])
    ap.add_argument(
        "--scale",
        type=positive_float,
        default=1.0,
        help="multiply the sizes (1M requests for single/cluster, 100k jobs for agent, 5k for loop, 50k for servers)",
    )
    ap.add_argument("--load", type=positive_float, default=0.9)
    ap.add_argument(
        "--workload",
        choices=tuple(WORKLOADS),
        default="synthetic",
        help="lengths of the single and cluster cases (default: synthetic, geometric 200 / 101)",
    )
    ap.add_argument("--seed", type=seed_int, default=1)
    ap.add_argument("--keep", help="write the outputs under this folder (default: a temporary folder, removed)")
    ap.add_argument("--json", type=out_file_in_new_folder, help="also write the results to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.load, args.workload, args.seed, args.out)))
        return
    base = args.keep or tempfile.mkdtemp(prefix="bench-network-")
    results = []
    try:
        for case in args.cases:
            full = {"agent": 100_000, "loop": 5_000, "servers": 50_000}.get(case, 1_000_000)
            n = max(100, int(round(full * args.scale)))
            out = os.path.join(base, case)
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                case,
                "--n",
                str(n),
                "--load",
                str(args.load),
                "--workload",
                args.workload,
                "--seed",
                str(args.seed),
                "--out",
                out,
            ]
            t0 = time.perf_counter()
            proc = run_child(cmd, "bench_network")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["process_wall_s"] = time.perf_counter() - t0
            results.append(res)
            what = "jobs" if case in ("agent", "loop", "servers") else "requests"
            print(
                f"{case:<8} {n:>9,} {what:<8} {res['calls']:>9,} calls  wall {res['wall_s']:8.2f} s "
                f"(sim {res['sim_s']:.2f} + summary and write {res['write_s']:.2f})  cpu {res['cpu_s']:8.2f} s  "
                f"process {res['process_wall_s']:8.2f} s  peak RSS {res['peak_rss_mb']:6.0f} MB  "
                f"{res['steps']:,} steps  verdict {res['verdict']}",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    by = {r["case"]: r for r in results}
    if "single" in by and "cluster" in by:
        ratio = by["cluster"]["wall_s"] / by["single"]["wall_s"]
        cpu_ratio = by["cluster"]["cpu_s"] / by["single"]["cpu_s"]
        print(f"cluster / single: wall {ratio:.2f}x, cpu {cpu_ratio:.2f}x (target <= 4x)")
    if args.json:
        write_json(args.json, results, indent=1)  # (its folder made: e.g. under --keep)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
