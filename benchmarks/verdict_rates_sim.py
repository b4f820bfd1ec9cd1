"""False-verdict rates of the per-run stability verdict on REAL simulator runs.

Each run: Poisson arrivals at a known load rho = lambda / lambda* (theorem 2's critical
rate), the paper cost model (c = 11.28 ms, a = 35.47 ms, b0 = 128), b_max = 512,
geometric prompt (mean 200) and output (mean 101) lengths, so w = 300 tokens and
lambda* = 11.14 requests/s. The verdict is the one `llmsched.simulate` writes into
summary.json (`verdict`: stable, unstable or inconclusive), i.e. `api._stability_fields`
on the run's unfinished-work series. Truth: rho < 1 stable, rho > 1 unstable (theorem 2,
work-conserving policies).

Usage:
    python benchmarks/verdict_rates_sim.py [--seeds 20] [--requests 5000 20000]
        [--policies sarathi orca] [--loads 0.7 0.85 0.95 1.05 1.15] [--json out.json]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from _cli import config_errors, out_file, positive_float, positive_int, write_json

from llmsched.policies import make_scheduler
from llmsched.theory import capacity

COST, B_MAX, PROMPT, OUTPUT = "paper", 512, "geometric:200", "geometric:101"


def one(args):
    policy, load, n, seed = args
    from llmsched.api import simulate  # noqa: PLC0415

    lam = capacity(COST, B_MAX, 200.0, 101.0).critical_rate
    r = simulate(
        policy=policy,
        cost_model=COST,
        b_max=B_MAX,
        rate=load * lam,
        num_requests=n,
        prompt=PROMPT,
        output=OUTPUT,
        seed=seed,
    )
    s = r.summary
    return dict(
        policy=policy,
        load=load,
        requests=n,
        seed=seed,
        stable=s.get("stable"),
        verdict=s.get("verdict"),
        reason=s.get("verdict_reason"),
        growth=s.get("backlog_growth_tokens_per_s"),
        ci=s.get("backlog_growth_ci"),
        conclusive=s.get("verdict_conclusive"),
        utilisation=s.get("utilisation"),
        span_s=float(r.arrival_s.max() - r.arrival_s.min()),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=positive_int, default=20)
    ap.add_argument("--requests", type=positive_int, nargs="+", default=[5000, 20000])
    ap.add_argument("--policies", nargs="+", default=["sarathi", "orca"])
    ap.add_argument("--loads", type=positive_float, nargs="+", default=[0.7, 0.85, 0.95, 1.05, 1.15])
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--json", type=out_file, help="write every run's verdict here")
    a = ap.parse_args(argv)
    jobs = [(p, load, n, s) for p in a.policies for n in a.requests for load in a.loads for s in range(a.seeds)]
    t0 = time.perf_counter()
    with config_errors("verdict_rates_sim"):
        for p in a.policies:  # a bad name refused now, not after the runs of the policies before it
            make_scheduler(p, b_max=B_MAX)
        with ProcessPoolExecutor(a.workers) as ex:
            runs = list(ex.map(one, jobs, chunksize=4))
    wall = time.perf_counter() - t0
    print(f"{len(runs)} runs in {wall:.0f} s")
    print("| policy | requests | " + " | ".join(f"rho={x:g}" for x in a.loads) + " |")
    print("|---|---|" + "---|" * len(a.loads))
    for p in a.policies:
        for n in a.requests:
            cells = []
            for load in a.loads:
                rs = [r for r in runs if r["policy"] == p and r["requests"] == n and r["load"] == load]
                wrong = sum(r["verdict"] == ("stable" if load > 1 else "unstable") for r in rs)
                unsure = sum(r["verdict"] == "inconclusive" for r in rs)
                cells.append(f"{wrong / len(rs):.2f} / {unsure / len(rs):.2f}")
            print(f"| {p} | {n} | " + " | ".join(cells) + " |")
    print(
        "(per cell: false-verdict rate / inconclusive rate. False: called unstable below the "
        "bound, or stable above it; arrival span = requests / rate, e.g. 5000 requests at "
        "rho = 0.85 last 528 s)"
    )
    if a.json:
        write_json(a.json, runs, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
