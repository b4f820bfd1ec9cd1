"""False-verdict rates of `llmsched.theory.stability_verdict` on synthetic runs.

Synthetic run: the unfinished work of a slotted queue fed like an M/M/1 queue of work,
W_k = max(0, W_{k-1} + A_k - C * dt): each slot of dt seconds (one b_max step of the
paper model, 0.15316 s) drains C * dt tokens (C = 512 / 0.15316 tokens/s) and receives
Poisson(lambda * dt) requests with exponential work of mean `work` tokens, lambda =
rho * C / work. W is sampled every `every` slots. Also: white noise around a level and
a pure linear trend plus noise.

Usage:
    python benchmarks/verdict_rates.py [--runs 200] [--seed 1] [--json out.json]
    python benchmarks/verdict_rates.py --fixed-b-table   # regenerate verdict.FIXED_B_CV
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib

import numpy as np
from _cli import out_file, positive_int, seed_int, write_json

from llmsched.theory.verdict import FIXED_B_GRID, stability_verdict

DT = 0.15316
CAPACITY = 512 / DT
WORK = 300.0


def synthetic_backlog(rng, rho, steps=4000, every=10, capacity=CAPACITY, work=WORK, dt=DT):
    lam = rho * capacity / work
    n = rng.poisson(lam * dt, steps)
    arrivals = rng.gamma(n.astype(float), work)  # sum of n exponentials (0 when n = 0)
    s = np.cumsum(arrivals - capacity * dt)
    w = s - np.minimum(0.0, np.minimum.accumulate(s))  # Lindley recursion, W_0 = 0
    t = dt * np.arange(1, steps + 1)
    return t[every - 1 :: every], w[every - 1 :: every]


def white_noise(rng, samples=400, duration=600.0, level=5000.0, sd=500.0):
    t = np.linspace(0, duration, samples)
    return t, level + sd * rng.standard_normal(samples)


def trend(rng, slope, samples=400, duration=600.0, sd=500.0):
    t = np.linspace(0, duration, samples)
    return t, slope * t + sd * rng.standard_normal(samples)


CASES = [
    # (name, generator(rng) -> (t, w), truly unstable: True / False / None for "either")
    *[
        (
            f"queue rho={rho} T={steps * DT:.0f}s",
            (lambda rng, rho=rho, steps=steps: synthetic_backlog(rng, rho, steps)),
            None if rho == 1.0 else rho > 1.0,
        )
        for steps in (1000, 4000, 16000)
        for rho in (0.5, 0.85, 0.95, 1.0, 1.05, 1.15, 1.5)
    ],
    ("white noise", white_noise, False),
    ("trend 0.05 C + noise", lambda rng: trend(rng, 0.05 * CAPACITY), True),
    ("trend 0.005 C + noise (below h)", lambda rng: trend(rng, 0.005 * CAPACITY), False),
]


def measure(runs: int, seed: int, methods=("hac", "batch")) -> list[dict]:
    """Per case and method: the share of runs called stable, unstable and inconclusive, and
    the false-verdict rate (called stable when truly unstable, or unstable when truly
    stable; an inconclusive verdict is not false, it is counted apart)."""
    rows = []
    for name, gen, truth in CASES:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        series = [gen(rng) for _ in range(runs)]
        for method in methods:
            counts = {"stable": 0, "unstable": 0, "inconclusive": 0}
            for t, w in series:
                counts[stability_verdict(t, w, capacity=CAPACITY, method=method).verdict] += 1
            share = {k: v / runs for k, v in counts.items()}
            false = None if truth is None else (share["stable"] if truth else share["unstable"])
            rows.append(
                {
                    "case": name,
                    "method": method,
                    "runs": runs,
                    "stable_fraction": share["stable"],
                    "unstable_fraction": share["unstable"],
                    "inconclusive_fraction": share["inconclusive"],
                    "truth": None if truth is None else ("unstable" if truth else "stable"),
                    "false_verdict_rate": false,
                }
            )
    return rows


def fixed_b_table(n=400, reps=40000, seed=7, chunk=4000):
    """Monte Carlo |t| quantiles for the trend slope, Bartlett kernel, M = b n."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=float)
    tc = t - t.mean()
    sxx = tc @ tc
    lags = np.arange(n, dtype=float)
    nfft = 1 << int(math.ceil(math.log2(2 * n)))
    stats_by_b = {b: [] for b in FIXED_B_GRID if b > 0}
    for _ in range(reps // chunk):
        e = rng.standard_normal((chunk, n))
        e -= e.mean(axis=1, keepdims=True)
        beta = (e @ tc) / sxx
        resid = e - beta[:, None] * tc[None, :]
        u = resid * tc[None, :]
        f = np.fft.rfft(u, nfft, axis=1)
        gam = np.fft.irfft(f * np.conj(f), nfft, axis=1)[:, :n]
        for b in stats_by_b:
            k = np.clip(1 - lags / (b * n), 0, None)
            omega = gam[:, 0] + 2 * gam[:, 1:] @ k[1:]
            stats_by_b[b].append(np.abs(beta) * sxx / np.sqrt(omega))
    out = {}
    for alpha in (0.10, 0.05, 0.01):
        from scipy.stats import norm

        row = [float(norm.ppf(1 - alpha / 2))]
        for b in stats_by_b:
            row.append(float(np.quantile(np.concatenate(stats_by_b[b]), 1 - alpha)))
        out[alpha] = row
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=positive_int, default=200)
    ap.add_argument("--seed", type=seed_int, default=1)
    ap.add_argument("--json", type=out_file, default=None)
    ap.add_argument("--fixed-b-table", action="store_true")
    a = ap.parse_args(argv)
    if a.fixed_b_table:
        tab = fixed_b_table()
        print("FIXED_B_CV = {")
        for alpha, row in tab.items():
            print(f"    {alpha:.2f}: np.array([{', '.join(f'{v:.3f}' for v in row)}]),")
        print("}")
        return 0
    t0 = time.time()
    rows = measure(a.runs, a.seed)
    print(
        f"{'case':40s} {'method':6s} {'stable':>7s} {'inconcl.':>8s} {'unstable':>8s} {'truth':>9s} {'false rate':>10s}"
    )
    for r in rows:
        fr = "-" if r["false_verdict_rate"] is None else f"{r['false_verdict_rate']:.3f}"
        print(
            f"{r['case']:40s} {r['method']:6s} {r['stable_fraction']:7.3f} {r['inconclusive_fraction']:8.3f} "
            f"{r['unstable_fraction']:8.3f} {str(r['truth']):>9s} {fr:>10s}"
        )
    print(f"({a.runs} runs per case, {time.time() - t0:.1f} s)")
    if a.json:
        summary = {
            "runs": a.runs,
            "seed": a.seed,
            "capacity_tokens_per_s": CAPACITY,
            "work_per_request": WORK,
            "rows": rows,
        }
        write_json(a.json, summary, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
