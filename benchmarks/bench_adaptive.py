"""Long runs of the `adaptive` policy close to the k_max region's boundary (issue #12 item 2).

Paper cost model, b_max 512, k_max 16, constant prompt and output lengths, Poisson
arrivals at `--loads` times the region's critical rate lambda*. The default cases are the
issue's (prompt 1024, output 128: the counterexample `llmsched capacity --cost-model paper
--b-max 512 --k-max 16 --find-counterexample` confirms and docs/stability.md documents)
and four more of that search's candidates whose critical rate the cap sets. For every
run it prints the verdict, the backlog growth with its interval, and the decode backlog:
the slope of the decoding-request count over the second half of the arrivals (per 1,000
s) and its mean over each quarter of them.

    python benchmarks/bench_adaptive.py                          # 60,000 requests, 2 seeds, 2 workers
    python benchmarks/bench_adaptive.py --cases 1024:128 --num-requests 20000 --seeds 0
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _cli import comma_list, config_errors, out_file, positive_float, positive_int, seed_int, write_json

from llmsched.api import simulate
from llmsched.theory import capacity

B_MAX, K_MAX = 512, 16
CASES = ("1024:128", "1024:64", "1024:256", "2048:128", "512:128")


def lengths(text: str) -> tuple[int, int]:
    """An argparse type: a case, `PROMPT:OUTPUT` token counts."""
    parts = text.split(":")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected PROMPT:OUTPUT token counts, got {text!r}")
    prompt, output = (positive_int(v) for v in parts)
    return prompt, output


def _mean(values: np.ndarray) -> float:
    """nan for no values (a quarter of a short run without a sample), without numpy's warning."""
    return float(values.mean()) if values.size else float("nan")


def run(case: tuple[int, int], load: float, seed: int, n: int) -> dict:
    prompt, output = case
    lam = capacity("paper", B_MAX, prompt, output, k_max=K_MAX).critical_rate
    t0 = time.perf_counter()
    res = simulate(
        policy="adaptive:cost=paper",
        cost_model="paper",
        b_max=B_MAX,
        k_max=K_MAX,
        prompt=f"const:{prompt}",
        output=f"const:{output}",
        rate=load * lam,
        num_requests=n,
        seed=seed,
    )
    s = res.summary
    ts = res.timeseries
    t, dec = ts["time_s"], ts["decoding_requests"]
    end = float(res.arrival_s.max())
    half = (t >= end / 2) & (t <= end)
    slope = 1000 * float(np.polyfit(t[half], dec[half], 1)[0]) if half.sum() >= 3 else float("nan")
    quarters = [_mean(dec[(t >= end * q / 4) & (t < end * (q + 1) / 4)]) for q in range(4)]
    return {
        "case": f"{prompt}:{output}",
        "load": load,
        "seed": seed,
        "num_requests": n,
        "critical_rate": lam,
        "rate": load * lam,
        "verdict": s["verdict"],
        "verdict_reason": s["verdict_reason"],
        # None where the run is too short to measure the growth (too few backlog samples
        # while requests arrive: the verdict is then inconclusive, its reason says why)
        "growth_tokens_per_s": s.get("backlog_growth_tokens_per_s"),
        "growth_ci": s.get("backlog_growth_ci"),
        "threshold_tokens_per_s": s.get("verdict_threshold_tokens_per_s"),
        "decoders_slope_per_1000s": slope,
        "decoders_by_quarter": quarters,
        "p99_ttft_ms": s["p99_ttft_ms"],
        "completed": s["completed"],
        "wall_s": time.perf_counter() - t0,
    }


def _growth(r: dict) -> str:
    """The growth with its interval, or n/a where the run was too short to measure it."""
    if r["growth_tokens_per_s"] is None:
        return f"{'n/a':>24}"
    lo, hi = r["growth_ci"]
    return f"{r['growth_tokens_per_s']:>7.1f} [{lo:>6.1f}, {hi:>6.1f}]"


def format_row(r: dict) -> str:
    q = "/".join(f"{v:.0f}" for v in r["decoders_by_quarter"])
    return (
        f"{r['case']:>13} {r['load']:>5.2f} {r['seed']:>4} {r['verdict']:>12} "
        f"{_growth(r)}  {r['decoders_slope_per_1000s']:>14.1f}  "
        f"{q:<20} {r['p99_ttft_ms'] / 1000:>10.1f} {r['wall_s']:>6.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cases",
        type=comma_list(lengths),
        default=[lengths(c) for c in CASES],
        help="PROMPT:OUTPUT,... (constant lengths)",
    )
    ap.add_argument(
        "--loads", type=comma_list(positive_float), default=[0.95, 0.98], help="fractions of the region's lambda*"
    )
    ap.add_argument("--seeds", type=comma_list(seed_int), default=[0, 1])
    ap.add_argument("--num-requests", type=positive_int, default=60000)
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--json", type=out_file, help="write the rows to this file")
    a = ap.parse_args()
    jobs = [(c, lo, s, a.num_requests) for c in a.cases for lo in a.loads for s in a.seeds]
    print(
        f"{'prompt:output':>13} {'load':>5} {'seed':>4} {'verdict':>12} {'growth tok/s [95% CI]':>24} "
        f"{'decoders/1000s':>14}  decoders by quarter   {'p99 TTFT s':>10} {'wall s':>6}"
    )
    rows = []
    t0 = time.perf_counter()
    with config_errors("bench_adaptive"), ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(run, *zip(*jobs)):
            rows.append(r)
            print(format_row(r), flush=True)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("stable", "inconclusive", "unstable")}
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    unmeasured = [r for r in rows if r["growth_tokens_per_s"] is None]
    if unmeasured:
        print(f"growth n/a in {len(unmeasured)} runs: {unmeasured[0]['verdict_reason']} (raise --num-requests)")
    if a.json:
        write_json(a.json, rows, indent=1)


if __name__ == "__main__":
    main()
