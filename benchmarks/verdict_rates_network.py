"""Verdicts of network runs at known loads: how often short stable runs are called unstable,
and whether overloaded runs still are.

Each run: one of the example networks (`examples/networks/NAME.yaml`) with every arrival
rate scaled so the bottleneck server runs at `load` of its capacity (the traffic
equations' `critical_scale` times the load), `jobs` jobs, seeds 0..N-1. Counted: the
network's verdict in summary.json (`verdict`: unstable if a server is, stable if every
server is) and the verdict on the network's total unfinished work
(`network_work_verdict`). Truth: load < 1 stable, load > 1 unstable (every server here
is work-conserving Sarathi-Serve or Orca, and the routes are feed-forward). `--cv X`
replaces every job type's arrivals with gamma arrivals of the same rate and cv X (bursty
for X > 1; the networks' own arrivals otherwise).

Usage:
    python benchmarks/verdict_rates_network.py [--networks tandem agent_dag]
        [--seeds 20] [--jobs 300 1000] [--loads 0.45 0.7] [--cv 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _cli import config_errors, out_file, positive_float, positive_int, write_json

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "networks"
VERDICTS = ("stable", "inconclusive", "unstable")


def one(args):
    name, load, jobs, seed, cv = args
    from dataclasses import replace  # noqa: PLC0415

    from llmsched.sim.network_result import simulate_network  # noqa: PLC0415
    from llmsched.theory.network import traffic  # noqa: PLC0415
    from llmsched.workload.arrivals import Gamma  # noqa: PLC0415
    from llmsched.workload.network import load_network  # noqa: PLC0415

    spec = load_network(EXAMPLES / f"{name}.yaml")
    if cv is not None:
        spec = replace(spec, jobs=[replace(j, arrival=Gamma(j.arrival.rate, cv)) for j in spec.jobs])
    scale = load * traffic(spec).critical_scale
    s = simulate_network(spec, scale=scale, num_jobs=jobs, seed=seed).summary
    work = s["network_work_verdict"]
    return dict(
        network=name,
        load=load,
        jobs=jobs,
        seed=seed,
        cv=cv,
        verdict=s["verdict"],
        servers={k: v["verdict"] for k, v in s["servers"].items()},
        decode_time_s={k: v.get("decode_time_s") for k, v in s["servers"].items()},
        job_decode_time_s=work.get("decode_time_s"),
        work_verdict=work["verdict"],
        work_reason=work.get("reason"),
        work_growth=work.get("backlog_growth_tokens_per_s"),
    )


def counts(verdicts: list) -> str:
    return "/".join(str(verdicts.count(x)) for x in VERDICTS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--networks",
        nargs="+",
        choices=sorted(p.stem for p in EXAMPLES.glob("*.yaml")),
        default=["tandem", "agent_dag"],
    )
    ap.add_argument("--seeds", type=positive_int, default=20)
    ap.add_argument("--jobs", type=positive_int, nargs="+", default=[300, 1000])
    ap.add_argument("--loads", type=positive_float, nargs="+", default=[0.45, 0.7])
    ap.add_argument("--cv", type=positive_float, help="gamma arrivals of this cv for every job type")
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--json", type=out_file, help="write every run's verdicts here")
    a = ap.parse_args(argv)
    todo = [(w, load, n, s, a.cv) for w in a.networks for n in a.jobs for load in a.loads for s in range(a.seeds)]
    t0 = time.perf_counter()
    with config_errors("verdict_rates_network"), ProcessPoolExecutor(a.workers) as ex:
        runs = list(ex.map(one, todo, chunksize=4))
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s")
    print("| network, jobs | " + " | ".join(f"load {x:g}: network / network's work" for x in a.loads) + " |")
    print("|---|" + "---|" * len(a.loads))
    for w in a.networks:
        for n in a.jobs:
            cells = []
            for load in a.loads:
                rs = [r for r in runs if r["network"] == w and r["jobs"] == n and r["load"] == load]
                cells.append(f"{counts([r['verdict'] for r in rs])} / {counts([r['work_verdict'] for r in rs])}")
            print(f"| {w}, {n:,} | " + " | ".join(cells) + " |")
    print("(per cell: runs called stable/inconclusive/unstable)")
    if a.json:
        write_json(a.json, runs, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
