"""Sweep benchmark: a 200-point grid (5 policies x 20 rates x 2 seeds, 20k requests each).

Workload: the paper cost model (c = 11.28 ms, a = 35.47 ms, b0 = 128), b_max = 512,
Poisson arrivals, geometric prompt (mean 200) and output (mean 101) lengths; rates
from 0.3 to 1.25 of the critical rate lambda* = 11.154 req/s (`llmsched capacity
--cost-model paper --b-max 512 --prompt geometric:200 --output geometric:101`), so about a quarter of
the points are overloaded (and FasterTransformer, unstable at every rate here, is
overloaded at all of them). Unstable runs drain a long queue after the last arrival;
`--max-time-factor F` stops every run at F times the longest arrival span of the grid
(that of the lowest load, requests / (0.3 lambda*)), one cap for all points, which bounds
only the drains (default: none; the drain of these runs is cheap in the simulator's fast
path).

Runs the same grid with each backend into OUT/BACKEND (an earlier sweep's outputs there
cleared first, other files kept; every folder checked before the first runs) and reports
wall time and the speed-up over one worker; checks that every backend gives the same
results table.

Usage:
    python benchmarks/bench_sweep.py [--backends local1 local ray] [--requests 20000]
        [--workers 2] [--out /tmp/bench_sweep] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import os
import time

from _cli import config_errors, out_dir, out_file, positive_float, positive_int, write_json

from llmsched.analysis.sweep import run_sweep
from llmsched.core.paths import check_out_dir, check_run_dir, clear_stale

POLICIES = ["fastertransformer", "vllm", "orca", "sarathi", "kfcfs"]
BACKENDS = ("local1", "local", "ray")
# `llmsched capacity --cost-model paper --b-max 512 --prompt geometric:200 --output geometric:101`
LAMBDA_STAR = 11.154


def grid(n_rates: int = 20, seeds=(0, 1)) -> dict:
    lo, hi = 0.3, 1.25
    loads = [round(lo + (hi - lo) * i / (n_rates - 1), 6) for i in range(n_rates)]
    return {"policy": POLICIES, "load": loads, "seed": list(seeds)}


def _two_or_more(text: str) -> int:
    v = positive_int(text)
    if v < 2:  # the grid spans 0.3 to 1.25 of lambda*: two ends
        raise argparse.ArgumentTypeError(f"{text} must be at least 2")
    return v


def table(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.pop("wall_s", None)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--backends",
        nargs="+",
        choices=BACKENDS,
        default=list(BACKENDS),
        help="local1 = one worker (inline), local = process pool, ray = local Ray",
    )
    ap.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1)
    ap.add_argument("--requests", type=positive_int, default=20000)
    ap.add_argument("--rates", type=_two_or_more, default=20, help="rates in the grid (at least 2)")
    ap.add_argument("--max-time-factor", type=positive_float, default=None)
    ap.add_argument("--out", type=out_dir, default="/tmp/bench_sweep")
    ap.add_argument("--json", type=out_file)
    a = ap.parse_args(argv)
    g = grid(a.rates)
    n_points = len(g["policy"]) * len(g["load"]) * len(g["seed"])
    fixed = dict(cost_model="paper", b_max=512, prompt="geometric:200", output="geometric:101", num_requests=a.requests)
    if a.max_time_factor:
        # arrival span of the slowest point: n / (lowest rate); a per-point cap would need
        # a per-point value, so cap at F times the longest span (bounds only the drains)
        lam = LAMBDA_STAR
        fixed["max_time_s"] = a.max_time_factor * a.requests / (min(g["load"]) * lam)
    with config_errors("bench_sweep"):
        # every backend's folder before the first runs (one in the way of the second
        # backend was refused after the first's runs); a sweep's own is rerun over
        for b in a.backends:
            check_out_dir(os.path.join(a.out, b))
            check_run_dir(os.path.join(a.out, b), "sweep")
    results = {}
    tables = {}
    for b in a.backends:
        out = os.path.join(a.out, b)
        # a fresh grid, not a resumed one: an earlier sweep's outputs go, nothing else
        # (the folder was removed whole, a file of the user's in it too)
        clear_stale(out, "sweep", written=())
        kind, workers = ("local", 1) if b == "local1" else (b, a.workers)
        t0 = time.perf_counter()
        res = run_sweep(None, g, out_dir=out, backend=kind, workers=workers, progress=False, **fixed)
        wall = time.perf_counter() - t0
        assert res.ran == n_points, (res.ran, n_points)
        # the wall time of the simulations alone (no pool or Ray start-up): sum of per-point wall_s
        sim = sum(r.get("wall_s") or 0 for r in res.rows)
        results[b] = {
            "wall_s": wall,
            "points": n_points,
            "workers": workers,
            "sum_point_wall_s": sim,
            "errors": res.errors,
        }
        tables[b] = table(os.path.join(out, "results.csv"))
        print(
            f"{b:7s} workers={workers}: {n_points} points in {wall:6.1f} s "
            f"(sum of per-point simulation times {sim:6.1f} s)",
            flush=True,
        )
    base = results.get("local1", {}).get("wall_s")
    if base:
        for b, r in results.items():
            r["speedup_vs_one_worker"] = base / r["wall_s"]
            print(f"speed-up of {b} over one worker: {base / r['wall_s']:.2f}x")
    names = list(tables)
    for b in names[1:]:
        same = tables[b] == tables[names[0]]
        results[b]["same_table_as_" + names[0]] = same
        print(f"{b} table identical to {names[0]}: {same}")
    if a.json:
        write_json(a.json, results, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
