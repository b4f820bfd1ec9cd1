"""`llmsched reproduce prefix-caching`: what prefix caching does to latency and capacity on
a trace that records shared prefixes (Mooncake's JSON lines with `hash_ids`).

The trace's arrivals are rescaled to `loads` x lambda*_off, theorem 2's critical rate
without caching (`llmsched.theory.capacity` with the trace's mean lengths and length mix),
and replayed through Sarathi-Serve with prefix caching off and on, under two KV capacities. For each
run: the prefix-cache hit rate (tokens, blocks), prefill tokens saved, evictions, TTFT,
throughput and the stability verdict.

Capacity gain against theorem 2: with a mean of `c` cached prompt tokens per request the
work per request falls from `p + o - 1` to `p - c + o - 1` and the representative step
holds less prefill, so lambda* rises by the ratio of theorem 2's critical rates with and
without `c` (`llmsched.theory.capacity(..., cached_prompt=c)`, each prompt's uncached
tokens timed after the prefix it found cached: `LengthMix(cached=...)`; the work ratio
`(p + o - 1) / (p - c + o - 1)` exactly when step times depend on the token load only).
The table gives that gain with `c` measured in each run and with `c` from an unbounded
cache (every block seen before is reused: an upper bound for any KV capacity), and the
runs check it: a load above 1 (unstable without caching) should be stable with caching
exactly when it is below the gain.

Outputs in `out_dir`: `table.csv` (one row per KV capacity, load and caching), and
`result.json` (the same plus the capacities and gains).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from ..api import simulate
from ..core.checks import as_real, check_distinct, strict_arguments
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.paths import (
    begin_reproduce_write,
    check_inputs_kept,
    check_run_dir,
    end_reproduce_write,
    make_run_dir,
    writes_alone,
)
from ..theory import LengthMix, capacity
from ..theory.means import ideal_cached_counts, ideal_cached_tokens
from ..workload.spec import warn_short_trace
from ..workload.trace import read_trace
from .tables import write_table

__all__ = ["reproduce_prefix_caching", "ideal_cached_tokens"]

LOADS = (0.6, 0.9, 1.3)
KV_CAPACITIES = (1_000_000, 8_000_000)
QUICK_REQUESTS = 400
KIND = "reproduce prefix-caching"


@strict_arguments
@writes_alone("reproduce prefix-caching")
def reproduce_prefix_caching(
    trace_path: str,
    *,
    out_dir: str | Path = "reproduce-prefix-caching",
    cost_model: str = "profile:h200-llama-3-8b",
    b_max: int = 2048,
    block_size: int = 512,
    loads: Sequence[float] = LOADS,
    kv_capacities: Sequence[int] = KV_CAPACITIES,
    num_requests: int | None = None,
    quick: bool = False,
    progress: bool = False,
) -> dict:
    t0 = time.perf_counter()
    if not loads or any(not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0) for x in loads):
        raise ConfigError(f"loads must be positive numbers, got {list(loads)!r}")
    whole = [as_real(k) for k in kv_capacities]
    if not whole or any(k is None or not math.isfinite(k) or k != int(k) for k in whole):
        raise ConfigError(f"kv_capacities must be whole numbers of tokens, got {list(kv_capacities)!r}")
    # (before the check against the trace's largest request, which read -5 as a capacity too small)
    bad = [int(k) for k in whole if k < 1]
    if bad:
        raise ConfigError(f"KV capacities must be at least 1 token, got {bad[0]}")
    # a repeat would run its cells again (duplicate rows in table.csv)
    check_distinct([int(k) for k in kv_capacities], "kv_capacities")
    check_distinct([float(x) for x in loads], "loads")
    check_run_dir(out_dir, KIND)  # not over another run's outputs, before the runs
    check_inputs_kept(out_dir, KIND, [trace_path])  # (a trace kept as out/table.csv was written over)
    trace = read_trace(trace_path, block_size=None)
    if not trace.has_blocks:
        raise ConfigError(
            f"{trace_path} carries no prompt block ids (a Mooncake trace with hash_ids has them, as does "
            "a CSV with a block_ids@B column)"
        )
    n = (QUICK_REQUESTS if quick else len(trace)) if num_requests is None else num_requests
    # (result.json recorded the number asked for, more than the trace holds and the runs used)
    warn_short_trace(f"trace {trace_path}", len(trace), num_requests, min(n, len(trace)))
    n = min(n, len(trace))
    if n < 2:
        raise ConfigError(f"the reproduction needs at least 2 requests, got {n}")
    trace = trace.head(n)
    if not math.isfinite(trace.mean_rate):  # (the shared Mooncake trace's first two share timestamp 0)
        raise ConfigError(
            f"trace {trace_path}: its first {n:,} requests have no rate to rescale to the loads (that takes "
            "two requests at different times): give more of them (--num-requests)"
        )
    need = int((trace.prompt + trace.output - 1).max())
    small = [k for k in kv_capacities if k < need]
    if small:
        raise ConfigError(f"KV capacity {small[0]} is below the largest request's {need} tokens")
    mp, mo = float(trace.prompt.mean()), float(trace.output.mean())
    mix = LengthMix(trace.prompt, trace.output)
    off = capacity(cost_model, b_max, mp, mo, mix=mix, peak=False)

    def gain(hits) -> float:
        """Theorem 2's capacity gain when the cache serves request i `hits[i]` prompt tokens
        (their mean is not work; each prompt's uncached tokens come after its cached prefix)."""
        if hits is None or not hits.any():
            return 1.0
        mix_on = LengthMix(trace.prompt, trace.output, hits)
        on = capacity(cost_model, b_max, mp, mo, cached_prompt=mix_on.mean_cached, mix=mix_on, peak=False)
        return on.critical_rate / off.critical_rate

    ideal_hits = ideal_cached_counts(trace, block_size)
    ideal = float(ideal_hits.mean())
    rows = []
    for kv in kv_capacities:
        for load in loads:
            rate = load * off.critical_rate
            scaled = trace.time_scaled(rate / trace.mean_rate)
            for on in (False, True):
                res = simulate(
                    trace=scaled,
                    policy="sarathi",
                    b_max=b_max,
                    kv_capacity=int(kv),
                    prefix_caching=on,
                    **({"block_size": block_size} if on else {}),  # (a block size without caching warns)
                    cost_model=cost_model,
                )
                s = res.summary
                pc = s.get("prefix_cache") or {}
                cached = s.get("cached_prompt_tokens_per_request", 0.0) or 0.0
                rows.append(
                    {
                        "kv_capacity": int(kv),
                        "load": float(load),
                        "rate": rate,
                        "prefix_caching": on,
                        "token_hit_rate": pc.get("token_hit_rate", 0.0),
                        "block_hit_rate": pc.get("block_hit_rate", 0.0),
                        "prefill_tokens_saved": pc.get("prefill_tokens_saved", 0),
                        "evictions": pc.get("evictions", 0),
                        "mean_ttft_ms": s["mean_ttft_ms"],
                        "p99_ttft_ms": s["p99_ttft_ms"],
                        "request_throughput": s["request_throughput"],
                        "output_throughput": s["output_throughput"],
                        "preemptions": s["preemptions"],
                        "cached_tokens_per_request": cached,
                        "capacity_gain_theory": gain(res.stats.prefix_hits),
                        "critical_rate": s.get("critical_rate"),
                        "verdict": s.get("verdict"),
                    }
                )
                if progress:
                    r = rows[-1]
                    print(
                        f"kv {kv:,} load {load:g} caching {'on ' if on else 'off'}: hit {r['token_hit_rate']:.1%}, "
                        f"TTFT {r['mean_ttft_ms'] / 1e3:,.1f} s, {r['request_throughput']:.2f} req/s, {r['verdict']}",
                        flush=True,
                    )
    out = make_run_dir(out_dir)
    # an earlier run's files go first, the folder marked until result.json, written last,
    # is in place: a run that stops leaves no new table beside an earlier run's result.json
    begin_reproduce_write(out, KIND)
    files = write_table(rows, out, "table")
    result = {
        "config": {
            "trace": str(trace_path),
            "num_requests": n,
            "cost_model": cost_model,
            "b_max": b_max,
            "block_size": block_size,
            "policy": "sarathi",
            "loads": list(loads),
            "kv_capacities": list(kv_capacities),
        },
        "mean_prompt": mp,
        "mean_output": mo,
        "critical_rate_off": off.critical_rate,
        "ideal_cached_tokens_per_request": ideal,
        "ideal_capacity_gain": gain(ideal_hits),
        "rows": rows,
    }
    result["summary"] = summary(result)
    result["wall_s"] = time.perf_counter() - t0
    result["files"] = [*files, str(out / "result.json")]
    text = json.dumps(to_jsonable(result), indent=2, default=str)
    end_reproduce_write(out, KIND, lambda p: p.write_text(text))  # the run's proof: whole, last; the mark goes
    return result


def summary(res: dict) -> dict:
    """Findings: per KV capacity, hit rate, TTFT ratio and the gain checks."""
    out = {
        "lambda* without caching (req/s)": round(res["critical_rate_off"], 4),
        "unbounded-cache hit share of prompt tokens": round(
            res["ideal_cached_tokens_per_request"] / res["mean_prompt"], 4
        ),
        "unbounded-cache capacity gain (theorem 2)": round(res["ideal_capacity_gain"], 3),
    }
    rows = res["rows"]
    for kv in res["config"]["kv_capacities"]:
        for load in res["config"]["loads"]:
            pair = {r["prefix_caching"]: r for r in rows if r["kv_capacity"] == kv and r["load"] == load}
            a, b = pair[False], pair[True]
            out[f"kv {kv:,} load {load:g}"] = (
                f"hit {b['token_hit_rate']:.1%}; "
                f"TTFT {a['mean_ttft_ms'] / 1e3:,.2f} -> {b['mean_ttft_ms'] / 1e3:,.2f} s; "
                f"{a['request_throughput']:.3f} -> {b['request_throughput']:.3f} req/s; "
                f"{a['verdict']} -> {b['verdict']}; gain (theory, measured hits) {b['capacity_gain_theory']:.2f}"
            )
    return out
