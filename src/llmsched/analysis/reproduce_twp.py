"""`llmsched reproduce twp`: paper 2's Table III and figures on our serverless runtime.

Paper 2 ("Stable token-level scheduling for serverless LLM inference"; docs/twp.md)
compares Token Window Pacing with five platform schedulers (FCFS, Round-Robin, Priority,
DynamicBatch, ServerlessLLM) at low, medium and high load. We run the six of them on the
platform of `examples/serverless/twp_repro.yaml` (2 nodes x 4 H200 GPUs, four models with
Zipf 1.2 popularity; `BASE_PLATFORM` here is the same file as a mapping) under two
workloads:

- `azure`: the Azure conversation trace (its arrivals, rescaled to the rate, and its
  lengths), each request's model drawn by popularity;
- `sharegpt`: ShareGPT prompt and output lengths, bursty gamma arrivals (`cv`, default 3).

**Load** is the offered rate over the platform's *static-allocation capacity*
(`platform_capacity`): each model m with traffic share p_m, mean prompt and output
lengths of its requests and the theorem 2 critical rate lambda_m of one instance
(`llmsched.theory.capacity`, the model's cost model and b_max) gets n_m >= 1 GPUs
(at most its max_instances, sum at most the GPUs), chosen to maximise
min_m n_m lambda_m / p_m (greedy on the bottleneck, optimal for this max-min); the
capacity is that minimum. It ignores cold starts and the platform's scale-out rule, so a
platform can saturate below load 1.

Outputs in `out_dir`:
- `table.csv` (one row per workload, load, scheduler and seed: every metric),
  `table3.csv` (paper 2's Table III: throughput req/s, P99 latency, TTFT, ITL, CV of
  ITL, averaged over seeds), `ablation.csv`, `slo.csv`, `stability.csv`, `result.json`;
- figures `ttft.png` (TTFT P50/P95/P99), `itl_cdf.png` (the distribution of every
  inter-token gap), `tpot_box.png` (each request's mean gap), `throughput.png`,
  `itl_cv.png`, `ablation.png`, `stability.png`.

Seeds: the main runs (`table.csv`, `table3.csv`, the figures of the schedulers) run every
seed given; the ablation, the SLO runs and the stability runs run only the first seed
(`seeds[0]`), whatever the others, and the platform's capacity (the loads' rates) is
that of the first seed's workload.

Beyond the paper:
- **Goodput** (`goodput`): the share of requests that finish with TTFT <= the TTFT SLO
  and a mean inter-token gap (TPOT = (e2e - TTFT) / (output - 1)) <= the ITL SLO, and
  those requests per second. The runtime records each request's TTFT and completion,
  not each gap, so the ITL condition is on the request's mean gap; a request with one
  output token has no gap and meets any ITL SLO. TWP then runs with the SLO as its
  target (`itl_target_ms`) and is compared with the other schedulers on goodput.
- **TWP against the stability region** (`stability`): on one server
  (`llmsched.simulate`), FCFS and TWP (default target and a user SLO) at 0.5-0.95 of
  the critical rate of `llmsched.theory.capacity`, without and with a batch-size cap
  `k_max` (then the critical rate is the 2-D region's); the runs' verdicts say whether
  pacing turns a load the region calls stable into an unstable one.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core.checks import check_count, check_distinct, check_names, check_reals, check_seeds, strict_arguments
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.palette import color_of, group_styles
from ..core.paths import begin_reproduce_write, check_run_dir, end_reproduce_write, prepare_run_dir, writes_alone
from ..core.request import NS
from ..theory import LengthMix, capacity
from ..workload.serverless import (
    ServerlessSpec,
    load_serverless,
    make_serverless_requests,
)
from .figures import new_figure, plain_log_ticks, save_figure
from .runner import Backend
from .tables import write_table

__all__ = [
    "ABLATION",
    "BASE_PLATFORM",
    "DEFAULT_LOADS",
    "SCHEDULERS",
    "SLO_TARGETS_MS",
    "WORKLOADS",
    "goodput",
    "platform_capacity",
    "reproduce_twp",
    "workload_section",
]

SCHEDULERS = ("fcfs", "round-robin", "priority", "dynamicbatch", "serverlessllm", "twp")
LABELS = {
    "fcfs": "FCFS",
    "round-robin": "Round-Robin",
    "priority": "Priority",
    "dynamicbatch": "DynamicBatch",
    "serverlessllm": "ServerlessLLM",
    "twp": "TWP",
}
CONVENTIONAL = ("fcfs", "round-robin", "priority", "dynamicbatch")
WORKLOADS = ("azure", "sharegpt")
DEFAULT_LOADS = (0.3, 0.6, 0.9)
LOAD_NAMES = ("low", "medium", "high")
#: TWP options varied one at a time from the defaults (docs/twp.md "Parameters").
ABLATION = {"beta": (0.3, 0.8), "delta": (2, 32), "itl_target_ms": (10, 15, 25), "h_min": (64, 512)}
#: ITL SLOs (ms) given to TWP as its target, with goodput at each.
SLO_TARGETS_MS = (10.0, 15.0, 25.0)
TTFT_SLO_MS = 2000.0
# (requests per run, stability-run requests) full / quick
SIZES = {"full": (6000, 10000), "quick": (300, 1500)}

#: examples/serverless/twp_repro.yaml as a mapping (a test holds them equal).
BASE_PLATFORM = {
    "cluster": {
        "remote_bandwidth_gbps": 1.25,
        "nodes": [
            {
                "name": "node",
                "count": 2,
                "gpus": 4,
                "gpu_memory_gb": 141,
                "dram_gb": 128,
                "dram_bandwidth_gbps": 24,
                "ssd_gb": 1024,
                "ssd_bandwidth_gbps": 5,
                "ssd": ["chat-8b", "assistant-8b", "code-8b", "mini-1b"],
            }
        ],
    },
    "models": {
        "chat-8b": {"weights_gb": 16, "kv_bytes_per_token": 131072, "cost_model": "profile:h200-llama-3-8b"},
        "assistant-8b": {"weights_gb": 16, "kv_bytes_per_token": 131072, "cost_model": "profile:h200-llama-3-8b"},
        "code-8b": {"weights_gb": 16, "kv_bytes_per_token": 131072, "cost_model": "profile:h200-llama-3-8b"},
        "mini-1b": {"weights_gb": 2.5, "kv_bytes_per_token": 32768, "cost_model": "profile:h200-llama-3.2-1b"},
    },
    "workload": {"trace": "azure-conv", "rate": 40, "popularity": "zipf:1.2", "num_requests": 4000, "seed": 0},
    "platform": {
        "scheduler": "twp",
        "router": "least-loaded",
        "init_s": 2.0,
        "keep_alive_s": 30,
        "scale_out_tokens": 8192,
        "max_instances": 4,
        "serverlessllm": {"load_speedup": 2.0, "migration": True, "alpha_s_per_token": 0.01, "beta_s": 0.1},
    },
}


# ------------------------------------------------------------------------------ pieces
def workload_section(
    workload: str, rate: float, num_requests: int, seed: int = 0, *, popularity="zipf:1.2", cv: float = 3.0
) -> dict:
    """The `workload` section of a platform for one of `WORKLOADS` at `rate` req/s."""
    if workload == "azure":
        return {
            "trace": "azure-conv",
            "rate": float(rate),
            "popularity": popularity,
            "num_requests": int(num_requests),
            "seed": int(seed),
        }
    if workload == "sharegpt":
        return {
            "arrival": "gamma",
            "cv": float(cv),
            "rate": float(rate),
            "popularity": popularity,
            "prompt": "sharegpt",
            "output": "sharegpt",
            "num_requests": int(num_requests),
            "seed": int(seed),
        }
    raise ConfigError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")


def platform_capacity(spec, samples: int = 20000) -> dict:
    """The static-allocation capacity of a platform for its workload (module docstring):
    {"critical_rate": req/s, "gpus", "models": {name: {share, mean_prompt, mean_output,
    instance_rate, instances}}}. Shares and mean lengths are those of `samples` requests
    drawn from the workload (a trace: up to `samples` of its rows)."""
    spec = load_serverless(spec)
    probe = spec.replaced(num_requests=samples)
    reqs = make_serverless_requests(probe, warn_short=False)  # ("up to": a shorter trace is drawn whole)
    n = len(reqs)
    gpus = spec.num_gpus
    models = {}
    for i, name in enumerate(reqs.models):
        sel = reqs.model == i
        k = int(sel.sum())
        if not k:
            continue
        m = spec.models[name]
        mp, mo = float(reqs.prompt[sel].mean()), float(reqs.output[sel].mean())
        mix = LengthMix(reqs.prompt[sel], reqs.output[sel])
        lam = capacity(m.cost_model, m.b_max, mp, mo, k_max=m.k_max, mix=mix, peak=False).critical_rate
        fit = sum(g.count * g.gpus for g in spec.nodes if spec.fits(name, g))
        cap = min(fit, spec.max_instances(name) or fit)
        models[name] = {
            "share": k / n,
            "mean_prompt": mp,
            "mean_output": mo,
            "instance_rate": lam,
            "instances": 1,
            "max_instances": cap,
        }
    if len(models) > gpus:
        raise ConfigError(
            f"{len(models)} models have traffic but the platform has {gpus} GPUs: "
            "the static allocation needs one GPU per model"
        )

    def rate_of(d):
        return d["instances"] * d["instance_rate"] / d["share"]

    for _ in range(gpus - len(models)):
        grow = [d for d in models.values() if d["instances"] < d["max_instances"]]
        if not grow:
            break
        min(grow, key=rate_of)["instances"] += 1
    return {"critical_rate": min(rate_of(d) for d in models.values()), "gpus": gpus, "models": models}


def goodput(
    ttft_s, tpot_s, finished, duration_s: float, *, ttft_slo_ms: float | None = None, itl_slo_ms: float | None = None
) -> dict:
    """Goodput of one run from per-request arrays: `ttft_s` and `tpot_s` (seconds; NaN
    where not reached, or `tpot_s` NaN for a one-token output: no gap), `finished`
    (bool). A request is good when it finished, its TTFT <= `ttft_slo_ms` and its mean
    inter-token gap <= `itl_slo_ms` (a missing SLO always holds; a request without a gap
    meets any ITL SLO). Returns {"good", "requests", "share" (good / requests), "rps"
    (good / duration_s)}. (On float seconds: the experiment's own runs compare on the
    clock's integer ns, `sim.result.meets_slo`, where a TPOT of exactly the SLO meets it.)"""
    ttft = np.asarray(ttft_s, dtype=np.float64)
    tpot = np.asarray(tpot_s, dtype=np.float64)
    ok = np.asarray(finished, dtype=bool).copy()
    if not (ttft.shape == tpot.shape == ok.shape):
        raise ValueError("ttft_s, tpot_s and finished must have the same length")
    if ttft_slo_ms is not None:
        with np.errstate(invalid="ignore"):
            ok &= ttft * 1e3 <= ttft_slo_ms
    if itl_slo_ms is not None:
        with np.errstate(invalid="ignore"):
            ok &= np.isnan(tpot) | (tpot * 1e3 <= itl_slo_ms)
    return _good_of(ok, duration_s)


def _good_of(ok: np.ndarray, duration_s: float) -> dict:
    good = int(ok.sum())
    n = int(ok.shape[0])
    return {
        "good": good,
        "requests": n,
        "share": good / n if n else math.nan,
        "rps": good / duration_s if duration_s > 0 else math.nan,
    }


def request_tpot_s(stats) -> np.ndarray:
    """Each request's mean inter-token gap (s): (e2e - TTFT) / (output - 1); NaN for
    unfinished requests and one-token outputs."""
    e2e, ttft, out = stats.e2e_ns, stats.ttft_ns, stats.output
    tpot = np.full(len(e2e), np.nan)
    ok = (e2e >= 0) & (ttft >= 0) & (out > 1)
    tpot[ok] = (e2e[ok] - ttft[ok]) / (out[ok] - 1) / NS
    return tpot


CDF_QS = tuple(np.round(np.concatenate([np.arange(0, 99, 1.0), np.arange(99, 100.01, 0.1)]), 3).tolist())
BOX_QS = (5, 25, 50, 75, 95)


def _with_twp_options(platform: dict, options: dict) -> dict:
    d = copy.deepcopy(platform)
    for m in d["models"].values():
        m["admission_options"] = {"twp": dict(options)}
    return d


def run_platform(job: dict) -> dict:
    """Worker: one serverless run (`job`: platform mapping, scheduler, SLO pairs); its
    summary (per model kept), the ITL distribution, TPOT quantiles and goodput."""
    from ..sim.result import meets_slo
    from ..sim.serverless_result import simulate_serverless

    t0 = time.perf_counter()
    res = simulate_serverless(job["platform"], scheduler=job["scheduler"])
    s = to_jsonable(res.summary)
    h = res.stats.itl
    cdf = [float(v) / 1e6 for v in h.percentiles(CDF_QS)] if h.count else []
    tpot = request_tpot_s(res.stats)
    fin = res.finished
    tp = tpot[~np.isnan(tpot)] * 1e3
    box = [float(v) for v in np.percentile(tp, BOX_QS)] if len(tp) else []
    good = {}
    st = res.stats
    for ttft_slo, itl_slo in job.get("slos", ()):
        # on the clock's integer ns, as a run's own goodput (`simulate_serverless(slo=...)`)
        slo = {k: v for k, v in (("ttft_ms", ttft_slo), ("itl_ms", itl_slo)) if v is not None}
        ok = meets_slo(slo, np.asarray(fin, dtype=bool), st.ttft_ns, st.e2e_ns, st.output)
        good[f"{ttft_slo:g}/{itl_slo:g}"] = _good_of(ok, s["duration"])
    return {"summary": s, "itl_cdf_ms": cdf, "tpot_box_ms": box, "goodput": good, "wall_s": time.perf_counter() - t0}


def run_single(job: dict) -> dict:
    """Worker: one single-server run for the stability sweep; its verdict and summary."""
    from ..api import simulate

    t0 = time.perf_counter()
    r = simulate(dict(job))
    s = r.summary
    keep = (
        "verdict",
        "verdict_reason",
        "stable",
        "utilisation",
        "critical_rate",
        "request_throughput",
        "backlog_growth_tokens_per_s",
        "p99_itl_ms",
        "itl_cv",
        "median_ttft_ms",
        "p99_ttft_ms",
        "total_token_throughput",
        "completed",
        "num_requests",
    )
    out = {k: s.get(k) for k in keep}
    out["wall_s"] = time.perf_counter() - t0
    return to_jsonable(out)


# ------------------------------------------------------------------------------ experiment
@strict_arguments
@writes_alone("reproduce twp")
def reproduce_twp(
    *,
    out_dir="reproduce-twp",
    quick: bool = False,
    workloads: Sequence[str] | None = None,
    schedulers: Sequence[str] | None = None,
    loads: Sequence[float] | None = None,
    num_requests: int | None = None,
    seeds: Sequence[int] | None = None,
    platform=None,
    cv: float = 3.0,
    ablation: bool = True,
    slo: bool = True,
    slo_targets_ms: Sequence[float] | None = None,
    ttft_slo_ms: float = TTFT_SLO_MS,
    stability: bool = True,
    stability_requests: int | None = None,
    stability_loads: Sequence[float] | None = None,
    k_max: int = 64,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> dict:
    """Paper 2's Table III, its figures, TWP's ablation, goodput under ITL SLOs and the
    stability sweep (module docstring). `loads`: fractions of `platform_capacity`
    (default 0.3, 0.6, 0.9: low, medium, high); `num_requests` per run (default 6000,
    quick 300); `seeds` (default 0); `platform`: a YAML path or mapping replacing
    `BASE_PLATFORM` (its workload section is replaced); `cv`: the ShareGPT workload's
    gamma arrivals; `k_max`: the batch-size cap of the stability sweep's capped runs.
    Quick: every scheduler on both workloads at loads 0.3 and 0.9, one ablation value
    per parameter, one SLO, the stability sweep at 0.5 and 0.9. Returns {"table3",
    "rows", "claims", "ablation", "slo", "stability", "capacity", "distributions" (each
    run's ITL percentiles and TPOT quantiles), "files", "config", "wall_s"}."""
    t0 = time.perf_counter()
    # (one name is a list of one; an empty list is refused below, naming what is missing)
    workloads = check_names(WORKLOADS if workloads is None else workloads, "workloads", empty=True)
    for w in workloads:
        if w not in WORKLOADS:
            raise ConfigError(f"unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    schedulers = check_names(SCHEDULERS if schedulers is None else schedulers, "schedulers", empty=True)
    for s in schedulers:
        if s not in SCHEDULERS:
            raise ConfigError(f"unknown platform scheduler {s!r} (known: {', '.join(SCHEDULERS)})")
    loads = ((0.3, 0.9) if quick else DEFAULT_LOADS) if loads is None else loads
    loads = check_reals(loads, "loads", "positive fractions of the platform's capacity (below 10)", 10, empty=True)
    # a repeat would run its cells again: duplicate rows, Table III averaging them as seeds
    for what, key, values in (
        ("workload", "workloads", workloads),
        ("platform scheduler", "schedulers", schedulers),
        ("load", "loads", loads),
    ):
        if not values:
            raise ConfigError(f"give at least one {what}")
        check_distinct(values, key)
    n_req, n_stab = SIZES["quick" if quick else "full"]
    n_req = n_req if num_requests is None else check_count(num_requests, "num_requests")
    n_stab = n_stab if stability_requests is None else check_count(stability_requests, "stability_requests")
    k_max = check_count(k_max, "k_max")
    ttft_slo_ms = check_reals([ttft_slo_ms], "ttft_slo_ms", "a positive number")[0]
    # a seed given twice would run every run again and count it twice in Table III's averages
    seeds = list(check_seeds((0,) if seeds is None else seeds))
    slo_targets = ((15.0,) if quick else SLO_TARGETS_MS) if slo_targets_ms is None else slo_targets_ms
    slo_targets = check_reals(slo_targets, "slo_targets_ms", "positive numbers", empty=True)
    check_distinct(slo_targets, "slo_targets_ms")
    stab_loads = (
        ((0.5, 0.9) if quick else (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)) if stability_loads is None else stability_loads
    )
    stab_loads = check_reals(stab_loads, "stability_loads", "positive numbers below 10", 10, empty=True)
    check_distinct(stab_loads, "stability_loads")
    base = load_serverless(BASE_PLATFORM if platform is None else platform).to_dict()
    check_run_dir(out_dir, "reproduce twp")  # not over another run's outputs
    load_names = {x: (LOAD_NAMES[i] if len(loads) == 3 else f"load {x:g}") for i, x in enumerate(sorted(loads))}

    # capacity and the rate of every load, per workload
    caps, rates = {}, {}
    for w in workloads:
        d = copy.deepcopy(base)
        d["workload"] = workload_section(w, 1.0, n_req, seeds[0], cv=cv)
        caps[w] = platform_capacity(ServerlessSpec.from_dict(d))
        for x in loads:
            rates[w, x] = x * caps[w]["critical_rate"]

    def platform_at(w, x, seed, twp_options=None):
        d = copy.deepcopy(base)
        d["workload"] = workload_section(w, rates[w, x], n_req, seed, cv=cv)
        return _with_twp_options(d, twp_options) if twp_options else d

    slo_pairs = [(ttft_slo_ms, float(t)) for t in slo_targets]
    jobs = []
    for w in workloads:
        for x in loads:
            for seed in seeds:
                for s in schedulers:
                    jobs.append(
                        (
                            ("main", w, x, seed, s, ""),
                            {"platform": platform_at(w, x, seed), "scheduler": s, "slos": slo_pairs},
                        )
                    )
    high = max(loads)
    w_abl = workloads[0]
    abl_grid = {k: v[:1] for k, v in ABLATION.items()} if quick else ABLATION
    if ablation:
        for param, values in abl_grid.items():
            for v in values:
                jobs.append(
                    (
                        ("ablation", w_abl, high, seeds[0], "twp", f"{param}={v:g}"),
                        {
                            "platform": platform_at(w_abl, high, seeds[0], {param: v}),
                            "scheduler": "twp",
                            "slos": slo_pairs,
                        },
                    )
                )
    if slo:
        for t in slo_targets:
            jobs.append(
                (
                    ("slo", w_abl, high, seeds[0], "twp", f"itl_target_ms={t:g}"),
                    {
                        "platform": platform_at(w_abl, high, seeds[0], {"itl_target_ms": float(t)}),
                        "scheduler": "twp",
                        "slos": slo_pairs,
                    },
                )
            )
    stab_jobs = _stability_jobs(stab_loads, n_stab, seeds[0], k_max, slo_targets) if stability else []

    out = prepare_run_dir(out_dir, "reproduce twp")  # (after the checks: a refusal leaves no folder)
    results: dict = {}
    stab_results: dict = {}
    with Backend(backend, workers, address) as be:
        for key, r in be.run(jobs, run_platform):
            results[key] = r
        for key, r in be.run(stab_jobs, run_single):
            stab_results[key] = r

    # ---- tables
    rows = []
    for w in workloads:
        for x in loads:
            for seed in seeds:
                for s in schedulers:
                    rows.append(_row(("main", w, x, seed, s, ""), results, rates, load_names))
    table3 = _table3(rows, workloads, loads, schedulers, load_names)
    claims = _claims(table3, workloads, loads, schedulers)
    abl_rows = []
    if ablation:
        abl_rows.append(
            {**_row(("main", w_abl, high, seeds[0], "twp", ""), results, rates, load_names), "variant": "defaults"}
            if "twp" in schedulers
            else None
        )
        abl_rows = [r for r in abl_rows if r]
        for param, values in abl_grid.items():
            for v in values:
                key = ("ablation", w_abl, high, seeds[0], "twp", f"{param}={v:g}")
                abl_rows.append({**_row(key, results, rates, load_names), "variant": f"{param}={v:g}"})
    slo_rows = (
        _slo_rows(results, rates, load_names, schedulers, slo_targets, slo_pairs, w_abl, high, seeds[0]) if slo else []
    )
    stab_rows = [dict(zip(("k_max", "admission", "load"), key), **r) for key, r in stab_results.items()]
    stab_rows.sort(key=lambda r: (r["k_max"] or 0, r["admission"], r["load"]))

    # an earlier run's files go first (its ablation, SLO or stability files too), the
    # folder marked until result.json, written last, is in place: a run that stops leaves
    # no new table beside an earlier run's figures or result.json
    begin_reproduce_write(out, "reproduce twp")
    files = []
    files += write_table(rows, out, "table")
    files += write_table(table3, out, "table3")
    if abl_rows:
        files += write_table(abl_rows, out, "ablation")
    if slo_rows:
        files += write_table(slo_rows, out, "slo")
    if stab_rows:
        files += write_table(stab_rows, out, "stability")
    files += _figures(results, rows, table3, workloads, loads, schedulers, seeds, load_names, out)
    if abl_rows:
        files.append(_plot_ablation(abl_rows, out / "ablation.png", w_abl, high))
    if stab_rows:
        files.append(_plot_stability(stab_rows, out / "stability.png"))
    meta = {
        "workloads": workloads,
        "schedulers": schedulers,
        "loads": loads,
        "num_requests": n_req,
        "seeds": seeds,
        "cv": cv,
        "quick": quick,
        "ttft_slo_ms": ttft_slo_ms,
        "slo_targets_ms": slo_targets,
        "stability_requests": n_stab,
        "stability_loads": stab_loads,
        "k_max": k_max,
        "rates": {f"{w}@{x:g}": rates[w, x] for (w, x) in rates},
        "platform": base,
    }
    result = {
        "table3": table3,
        "rows": rows,
        "claims": claims,
        "ablation": abl_rows,
        "slo": slo_rows,
        "stability": stab_rows,
        "capacity": caps,
        "config": meta,
        "distributions": {
            "itl_cdf_percentiles": list(CDF_QS),
            "tpot_box_percentiles": list(BOX_QS),
            "runs": [
                {
                    "kind": k[0],
                    "workload": k[1],
                    "load": k[2],
                    "seed": k[3],
                    "scheduler": k[4],
                    "variant": k[5],
                    "itl_cdf_ms": r["itl_cdf_ms"],
                    "tpot_box_ms": r["tpot_box_ms"],
                }
                for k, r in results.items()
            ],
        },
    }
    text = json.dumps(to_jsonable(result), indent=2, default=str)
    # the run's proof, whole or not at all, written last; the folder's mark goes with it
    files.append(end_reproduce_write(out, "reproduce twp", lambda p: p.write_text(text)))
    result["files"] = files
    result["wall_s"] = time.perf_counter() - t0
    return to_jsonable(result)


def _row(key, results, rates, load_names) -> dict:
    _, w, x, seed, s, _ = key
    r = results[key]
    m = r["summary"]
    row = {
        "workload": w,
        "load": x,
        "load_name": load_names.get(x, f"load {x:g}"),
        "rate": rates[w, x],
        "scheduler": s,
        "seed": seed,
        "throughput_rps": m["request_throughput"],
        "p99_latency_ms": m["p99_e2el_ms"],
        "mean_ttft_ms": m["mean_ttft_ms"],
        "p50_ttft_ms": m["p50_ttft_ms"],
        "p95_ttft_ms": m["p95_ttft_ms"],
        "p99_ttft_ms": m["p99_ttft_ms"],
        "mean_itl_ms": m["mean_itl_ms"],
        "p50_itl_ms": m["p50_itl_ms"],
        "p99_itl_ms": m["p99_itl_ms"],
        "itl_cv": m["itl_cv"],
        "mean_e2el_ms": m["mean_e2el_ms"],
        "completed": m["completed"],
        "num_requests": m["num_requests"],
        "output_throughput": m["output_throughput"],
        "cold_starts": m["cold_starts"],
        "cold_start_time_s": m["cold_start_time_s"],
        "gpu_seconds": m["gpu_seconds"],
        "peak_instances": m["peak_instances"],
        "migrations": m["migrations"],
        "preemptions": m["preemptions"],
        "duration_s": m["duration"],
        "wall_s": r["wall_s"],
    }
    for k, g in r["goodput"].items():
        row[f"goodput_share@{k}"] = g["share"]
        row[f"goodput_rps@{k}"] = g["rps"]
    return row


TABLE3_METRICS = (
    "throughput_rps",
    "p99_latency_ms",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "itl_cv",
)


def _table3(rows, workloads, loads, schedulers, load_names) -> list[dict]:
    out = []
    for w in workloads:
        for x in loads:
            for s in schedulers:
                sel = [r for r in rows if r["workload"] == w and r["load"] == x and r["scheduler"] == s]
                row = {
                    "workload": w,
                    "load": load_names[x],
                    "load_fraction": x,
                    "rate": sel[0]["rate"],
                    "scheduler": LABELS[s],
                    "seeds": len(sel),
                }
                for k in TABLE3_METRICS:
                    vals = [r[k] for r in sel if r[k] is not None]
                    row[k] = float(np.mean(vals)) if vals else None
                out.append(row)
    return out


def _claims(table3, workloads, loads, schedulers) -> list[dict]:
    """Per workload and load: TWP's throughput gain over ServerlessLLM and over the best
    and worst conventional scheduler, and its P99 latency, TTFT and ITL CV against them."""
    out = []
    if "twp" not in schedulers:
        return out
    for w in workloads:
        for x in loads:
            by = {r["scheduler"]: r for r in table3 if r["workload"] == w and r["load_fraction"] == x}
            t = by[LABELS["twp"]]
            c = {"workload": w, "load": t["load"], "load_fraction": x}
            conv = [by[LABELS[s]] for s in CONVENTIONAL if s in schedulers]
            if "serverlessllm" in schedulers:
                sl = by[LABELS["serverlessllm"]]
                for k in ("throughput_rps", "p99_latency_ms", "p99_ttft_ms", "p99_itl_ms", "itl_cv"):
                    c[f"{k}_vs_serverlessllm"] = _ratio(t[k], sl[k])
            if conv:
                for k in ("throughput_rps", "p99_latency_ms", "p99_ttft_ms", "p99_itl_ms", "itl_cv"):
                    vals = [r[k] for r in conv if r[k] is not None]
                    c[f"{k}_vs_best_conventional"] = _ratio(t[k], max(vals) if k == "throughput_rps" else min(vals))
                    c[f"{k}_vs_worst_conventional"] = _ratio(t[k], min(vals) if k == "throughput_rps" else max(vals))
            out.append(c)
    return out


def _ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b - 1.0


def _slo_rows(results, rates, load_names, schedulers, targets, slo_pairs, w, x, seed) -> list[dict]:
    """Goodput at each ITL SLO: every scheduler of the main runs (at its own defaults)
    and TWP with the SLO as its target."""
    out = []
    for ttft_slo, itl_slo in slo_pairs:
        k = f"{ttft_slo:g}/{itl_slo:g}"
        cands = [(s, "defaults", ("main", w, x, seed, s, "")) for s in schedulers]
        cands.append(("twp", f"itl_target_ms={itl_slo:g}", ("slo", w, x, seed, "twp", f"itl_target_ms={itl_slo:g}")))
        for s, variant, key in cands:
            if key not in results:
                continue
            r = results[key]
            m = r["summary"]
            g = r["goodput"][k]
            out.append(
                {
                    "workload": w,
                    "load": x,
                    "load_name": load_names.get(x),
                    "rate": rates[w, x],
                    "ttft_slo_ms": ttft_slo,
                    "itl_slo_ms": itl_slo,
                    "scheduler": s,
                    "variant": variant,
                    "goodput_share": g["share"],
                    "goodput_rps": g["rps"],
                    "good": g["good"],
                    "requests": g["requests"],
                    "throughput_rps": m["request_throughput"],
                    "p99_ttft_ms": m["p99_ttft_ms"],
                    "mean_itl_ms": m["mean_itl_ms"],
                    "p99_itl_ms": m["p99_itl_ms"],
                    "itl_cv": m["itl_cv"],
                }
            )
    return out


# ------------------------------------------------------------------------------ stability
def _stability_jobs(stab_loads, n, seed, k_max, slo_targets) -> list:
    """Single-server runs: FCFS, TWP (defaults) and TWP with the middle SLO as target, at
    each load of the critical rate, without and with `k_max`. Each run stops when the
    arrivals do (the verdict judges that window)."""
    from ..workload import WorkloadSpec, make_trace
    from .points import resolve_point

    slo_t = sorted(slo_targets)[len(slo_targets) // 2] if slo_targets else None
    admissions = [("fcfs", None), ("twp", None)]
    if slo_t is not None:
        admissions.append(("twp", {"itl_target_ms": float(slo_t)}))
    jobs = []
    for cap in (None, k_max):
        for x in stab_loads:
            for adm, opts in admissions:
                fixed = {"num_requests": n, "seed": seed, "admission": adm, "load": float(x)}
                if cap is not None:
                    fixed["k_max"] = int(cap)
                if opts:
                    fixed["admission_options"] = dict(opts)
                cfg = resolve_point(None, fixed, {})
                span = float(make_trace(WorkloadSpec.from_dict(cfg.workload), blocks=False).arrival_s.max())
                cfg.max_time_s = span * 1.001 + 1e-3
                name = adm if not opts else f"twp itl_target_ms={slo_t:g}"
                jobs.append(((cap, name, float(x)), cfg.to_dict()))
    return jobs


# ------------------------------------------------------------------------------ figures
def _grid(rows: int, cols: int):
    """A figure with rows x cols panels (workloads by loads): (figure, flat list of axes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(4.2 * cols, 3.6 * rows), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(rows * cols)]


def _pick_seed(results, kind, w, x, seeds, s):
    return results[(kind, w, x, seeds[0], s, "")]


def _load_phrase(name: str) -> str:
    """A load's name in a title: `low load` for a named one, `load 0.3` as it is."""
    return f"{name} load" if name in LOAD_NAMES else name


def _figures(results, rows, table3, workloads, loads, schedulers, seeds, load_names, out: Path) -> list[str]:
    files = []
    nw = len(workloads)
    labels = [LABELS[s] for s in schedulers]
    xs = np.arange(len(schedulers))

    # TTFT P50/P95/P99 per scheduler, one panel per workload x load
    fig, axes = _grid(nw, len(loads))
    i = 0
    for w in workloads:
        for x in loads:
            ax = axes[i]
            i += 1
            t3 = {r["scheduler"]: r for r in table3 if r["workload"] == w and r["load_fraction"] == x}
            shown = []
            for j, (p, key) in enumerate((("P50", "p50_ttft_ms"), ("P95", None), ("P99", "p99_ttft_ms"))):
                if key is None:
                    vals = [
                        np.mean(
                            [
                                r["p95_ttft_ms"]
                                for r in rows
                                if r["workload"] == w and r["load"] == x and r["scheduler"] == s
                            ]
                        )
                        for s in schedulers
                    ]
                else:
                    vals = [t3[LABELS[s]][key] for s in schedulers]
                ax.bar(xs + (j - 1) * 0.27, [max(v or 0, 1e-3) for v in vals], width=0.27, label=p)
                shown += [v for v in vals if v]
            ax.set_yscale("log")
            if shown:  # bars rise from a third of the smallest: each height tells its value
                ax.set_ylim(bottom=min(shown) / 3)
            plain_log_ticks(ax, "y")
            ax.set_xticks(xs)
            ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
            ax.set_title(f"{w}, {_load_phrase(load_names[x])}", fontsize=9)
            ax.set_ylabel("TTFT (ms)")
            ax.grid(alpha=0.3, axis="y", which="both")
    axes[0].legend(fontsize=7)
    files.append(save_figure(fig, out / "ttft.png"))

    # ITL CDF (every inter-token gap), one panel per workload x load
    fig, axes = _grid(nw, len(loads))
    i = 0
    for w in workloads:
        for x in loads:
            ax = axes[i]
            i += 1
            for s in schedulers:
                cdf = _pick_seed(results, "main", w, x, seeds, s)["itl_cdf_ms"]
                if cdf:
                    ax.plot(
                        cdf,
                        np.asarray(CDF_QS) / 100.0,
                        lw=1.2,
                        label=LABELS[s],
                        ls="-" if s == "twp" else "--",
                        color=color_of(s),
                    )
            ax.set_xscale("log")
            plain_log_ticks(ax, "x")  # (2x10^0, 3x10^0, ... overlapped under a decade)
            ax.set_xlabel("inter-token gap (ms)")
            ax.set_ylabel("fraction of gaps (every token,\nunfinished requests included)", fontsize=7)
            ax.set_title(f"{w}, {_load_phrase(load_names[x])}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    files.append(save_figure(fig, out / "itl_cdf.png"))

    # per-request mean gap (TPOT) box plots from the stored quantiles
    fig, axes = _grid(nw, len(loads))
    i = 0
    for w in workloads:
        for x in loads:
            ax = axes[i]
            i += 1
            stats = []
            for s in schedulers:
                b = _pick_seed(results, "main", w, x, seeds, s)["tpot_box_ms"]
                if b:
                    stats.append(
                        {
                            "whislo": b[0],
                            "q1": b[1],
                            "med": b[2],
                            "q3": b[3],
                            "whishi": b[4],
                            "label": LABELS[s],
                            "fliers": [],
                        }
                    )
            if stats:
                ax.bxp(stats, showfliers=False)
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
            ax.set_ylabel("finished request's mean inter-token gap (ms)\nbox 25-75%, whiskers 5-95%", fontsize=7)
            ax.set_title(f"{w}, {_load_phrase(load_names[x])}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
    files.append(save_figure(fig, out / "tpot_box.png"))

    # throughput and ITL CV: grouped bars per load, one panel per workload
    for metric, ylabel, name in (
        ("throughput_rps", "throughput (req/s)", "throughput.png"),
        ("itl_cv", "CV of inter-token latency", "itl_cv.png"),
    ):
        fig, axes = new_figure(nw, width=6.0)
        for ax, w in zip(axes, workloads):
            width = 0.8 / len(schedulers)
            lx = np.arange(len(loads))
            for j, s in enumerate(schedulers):
                vals = [
                    next(
                        r[metric]
                        for r in table3
                        if r["workload"] == w and r["load_fraction"] == x and r["scheduler"] == LABELS[s]
                    )
                    or 0
                    for x in loads
                ]
                ax.bar(
                    lx + (j - (len(schedulers) - 1) / 2) * width, vals, width=width, label=LABELS[s], color=color_of(s)
                )
            ax.set_xticks(lx)
            ax.set_xticklabels([load_names[x] for x in loads])
            ax.set_ylabel(ylabel)
            ax.set_title(w, fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        axes[0].legend(fontsize=7)
        files.append(save_figure(fig, out / name))
    return files


def _plot_ablation(abl_rows, path: Path, w, x) -> str:
    fig, axes = new_figure(3, width=5.0)
    names = [r["variant"] for r in abl_rows]
    ys = np.arange(len(names))
    for ax, (k, lab) in zip(
        axes, (("p99_itl_ms", "ITL P99 (ms)"), ("itl_cv", "ITL CV"), ("p99_ttft_ms", "TTFT P99 (ms)"))
    ):
        ax.barh(ys, [r[k] or 0 for r in abl_rows], color=["tab:gray" if n == "defaults" else "tab:blue" for n in names])
        ax.set_yticks(ys)
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xlabel(lab)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"TWP ablation: {w}, load {x:g} of the platform's capacity", fontsize=9)
    return save_figure(fig, path)


def _plot_stability(stab_rows, path: Path) -> str:
    caps = sorted({r["k_max"] or 0 for r in stab_rows})
    fig, axes = new_figure(len(caps), width=5.5)
    marks = {"stable": "o", "unstable": "x", "inconclusive": "s"}
    for ax, cap in zip(axes, caps):
        sel = [r for r in stab_rows if (r["k_max"] or 0) == cap]
        admissions = sorted({r["admission"] for r in sel})
        # one colour per policy; twp and twp with an ITL target told apart by the line (the
        # marker is the verdict)
        for adm, style in zip(admissions, group_styles(admissions)):
            pts = sorted((r for r in sel if r["admission"] == adm), key=lambda r: r["load"])
            xs = [r["load"] for r in pts]
            ys = [(r["request_throughput"] or 0) / (r["critical_rate"] or 1) for r in pts]
            (line,) = ax.plot(xs, ys, lw=1.0, label=adm, color=style["color"], ls=style["linestyle"])
            for xx, yy, r in zip(xs, ys, pts):
                ax.plot([xx], [yy], marks.get(r["verdict"], "^"), color=line.get_color(), ms=6, fillstyle="none")
        ax.plot(
            [min(r["load"] for r in sel), max(r["load"] for r in sel)],
            [min(r["load"] for r in sel), max(r["load"] for r in sel)],
            ":",
            color="gray",
            lw=0.8,
            label="offered",
        )
        ax.set_xlabel("offered load (rate / critical rate)")
        ax.set_ylabel("served (throughput / critical rate)")
        ax.set_title(
            f"one server, {'no k_max' if not cap else f'k_max = {cap}'}  (o stable, x unstable, s inconclusive)",
            fontsize=8,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)
