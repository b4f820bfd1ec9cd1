"""How close lambda*'s token capacity C is to what the simulator's full steps serve, for a
context-dependent cost model (the H200 profiles) on workloads whose lengths vary.

For each workload: C = b_max / t(b_max) as `llmsched capacity` computes it (the steps
timed with the contexts of the workload's length mix, `core.length_mix`), `capacity`
given the workload's mean lengths (timed as constant lengths at them), and the
measured rate: an overloaded `simulate` run (Sarathi, `--rate` = `--overload` x lambda*,
steps recorded) whose steps from 20% of its arrival window to its end are all full, their
tokens over their busy time. Theorem 2 says a work-conserving policy's full steps serve C,
so measured / C should be 1.

    python benchmarks/capacity_accuracy.py                    # seven workloads, 8,000 requests
    python benchmarks/capacity_accuracy.py --num-requests 3000 --cases default const
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _cli import config_errors, out_file, positive_float, positive_int, seed_int, write_json

from llmsched import simulate
from llmsched.api import build_config
from llmsched.theory import cached_workload_mix, capacity, workload_mix

#: name -> (options of `simulate`, b_max, cost model)
CASES = {
    "default": ({}, 512, "profile:h200-llama-3-8b"),
    "const": ({"prompt": "const:1011", "output": "const:255"}, 512, "profile:h200-llama-3-8b"),
    "default-2048": ({}, 2048, "profile:h200-llama-3-8b"),
    "sharegpt": ({"prompt": "sharegpt", "output": "sharegpt"}, 512, "profile:h200-llama-3-8b"),
    "azure": ({"prompt": "azure-conv", "output": "azure-conv"}, 512, "profile:h200-llama-3-8b"),
    "llama-1b": ({}, 512, "profile:h200-llama-3.2-1b"),
    # a shared 2,048-token system prompt served by the prefix cache: the uncached tokens
    # are timed after it (`theory.cached_workload_mix`); "C means" takes the mean lengths
    "system-prompt-cached": ({"system_prompt": 2048, "prefix_caching": True}, 512, "profile:h200-llama-3-8b"),
}


def full_step_rate(options: dict, b_max: int, cost: str, rate: float) -> tuple[float, float]:
    """(tokens per busy second over the judged steps, share of them that are full)."""
    r = simulate(**options, b_max=b_max, cost_model=cost, rate=rate, record_steps=True)
    s = np.genfromtxt(r.steps_path, delimiter=",", skip_header=1, usecols=(1, 2, 3, 4))
    start, dur, pf, dc = s.T
    end = float(r.arrival_s.max())
    sel = (start > 0.2 * end) & (start < end)
    full = float((pf[sel] + dc[sel] == b_max).mean())
    return float((pf[sel] + dc[sel]).sum() / dur[sel].sum()), full


def measure(args) -> None:
    rows = []
    print(
        f"{'workload':14s} {'b_max':>6s} {'C mix':>9s} {'C means':>9s} {'measured':>9s} {'mix/meas':>9s} "
        f"{'means/meas':>10s} {'full':>5s} {'wall':>6s}"
    )
    for name in args.cases:
        opts, b_max, cost = CASES[name]
        options = {**opts, "num_requests": args.num_requests, "seed": args.seed}
        cfg = build_config(None, **options, b_max=b_max, cost_model=cost)
        workload = cfg.workload
        t0 = time.perf_counter()
        # (as a sweep point's lambda*: `analysis.points`)
        lengths = cached_workload_mix(workload, cfg.block_size) if cfg.prefix_caching else workload_mix(workload)
        mp, mo, cached = lengths.mean_prompt, lengths.mean_output, lengths.mean_cached
        mix = capacity(cost, b_max, mp, mo, cached_prompt=cached, mix=lengths, peak=False)
        means = capacity(cost, b_max, mp, mo, cached_prompt=cached, peak=False)
        measured, full = full_step_rate(options, b_max, cost, args.overload * mix.critical_rate)
        row = {
            "workload": name,
            "b_max": b_max,
            "cost_model": cost,
            "mean_prompt": mp,
            "mean_output": mo,
            "C_mix": mix.token_capacity,
            "C_means": means.token_capacity,
            "measured": measured,
            "full_share": full,
            "mix_over_measured": mix.token_capacity / measured,
            "means_over_measured": means.token_capacity / measured,
            "wall_s": time.perf_counter() - t0,
        }
        rows.append(row)
        print(
            f"{name:14s} {b_max:6d} {row['C_mix']:9.0f} {row['C_means']:9.0f} {measured:9.0f} "
            f"{row['mix_over_measured']:9.3f} {row['means_over_measured']:10.3f} {full:5.2f} {row['wall_s']:5.1f}s",
            flush=True,
        )
    if args.json:
        write_json(args.json, rows, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--num-requests", type=positive_int, default=8000)
    ap.add_argument("--overload", type=positive_float, default=1.3, help="offered rate over lambda* (default 1.3)")
    ap.add_argument("--seed", type=seed_int, default=0)
    ap.add_argument("--json", type=out_file, help="also write the rows to this JSON file")
    args = ap.parse_args()
    with config_errors("capacity_accuracy"):
        measure(args)


if __name__ == "__main__":
    main()
