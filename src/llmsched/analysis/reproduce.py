"""`llmsched reproduce stability`: paper 1's headline experiment.

At a load below theorem 2's bound, the non-work-conserving FasterTransformer and vanilla
vLLM let their queues grow while Orca, Sarathi-Serve and K-FCFS stay bounded; and each
policy's empirical maximum stable rate (bisection on the rate with the runs' stability
verdicts) set against the theoretical bound lambda* = b_max / t(b_max) / (m_p + m_o - 1).

Workloads (`workload`):
- `synthetic` (default): the paper cost model (CodeLlama-34B on an A100: c = 11.28 ms,
  a = 35.47 ms, b0 = 128), b_max = 512, Poisson arrivals, geometric prompt (mean 200)
  and output (mean 101) lengths, load 0.9. Under two minutes on two cores.
- `sharegpt`: the H200 Llama-3-8B profile, b_max = 2048, ShareGPT lengths, Poisson.
- `azure`: the H200 profile, b_max = 2048, the Azure conversation trace (its arrivals,
  rescaled to the rate, and its lengths).
Any of cost model, b_max, load and request counts can be overridden.

Outputs in `out_dir`: `queue.png` (requests in the system and unfinished work over time,
one line per policy), `table.csv`, `table.json`, and the search's points under
`search/` (resumable: a rerun reuses them, a rerun of a run that was interrupted
included: its search/points/ prove the folder an earlier run's, `core.paths.RESUME_PROOFS`).
The search's probes are the first files written, queue.png and the tables the last; the
folder is marked (`core.paths.INCOMPLETE_MARK`) from before the search until table.json is
in place, and an earlier run's files go only after the search, before the first new file.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..api import simulate
from ..core.checks import as_real, check_policy_names, check_seeds, first_repeat, strict_arguments
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.palette import color_of
from ..core.paths import (
    begin_reproduce_write,
    check_run_dir,
    end_reproduce_write,
    mark_reproduce_search,
    prepare_run_dir,
    writes_alone,
    writing_stability_search,
)
from ..policies import canonical_policy_name, make_batch_policy
from ..workload import WorkloadSpec, make_trace
from .figures import new_figure, save_figure
from .points import check_point, critical_rate_of, resolve_point
from .runner import Backend
from .sweep import max_stable_rate
from .tables import write_table

__all__ = ["reproduce_stability", "PRESETS", "POLICIES"]

POLICIES = ("fastertransformer", "vllm", "orca", "sarathi", "kfcfs")
PRESETS = {
    "synthetic": dict(cost_model="paper", b_max=512, arrival="poisson", prompt="geometric:200", output="geometric:101"),
    "sharegpt": dict(
        cost_model="profile:h200-llama-3-8b", b_max=2048, arrival="poisson", prompt="sharegpt", output="sharegpt"
    ),
    "azure": dict(cost_model="profile:h200-llama-3-8b", b_max=2048, arrival="azure-conv"),
}
# (requests in the queue runs, requests per search probe, seeds, tolerance)
SIZES = {
    "synthetic": (20000, 10000, (0, 1), 0.02),
    "sharegpt": (8000, 4000, (0,), 0.03),
    "azure": (8000, 4000, (0,), 0.03),
}
# --quick (tests): half the queue runs of the full size, short search probes. Synthetic:
# 10,000, long enough for a conclusive verdict at load 0.9 (about 15 relaxation times in
# the judged half); ShareGPT and Azure 4,000, whose verdicts at 0.9 are the full runs'
# (stable but FasterTransformer; inconclusive but FasterTransformer, unstable). Quick runs
# of 10,000 on all three were longer than the full ones there (and on Azure reached the
# trace's burst: every policy unstable).
QUICK = {w: (n // 2, 1500, (0,), 0.1) for w, (n, *_) in SIZES.items()}


def queue_run(cfg_dict: dict) -> dict:
    """One run for the queue figure: its summary and a thinned time series."""
    res = simulate(dict(cfg_dict))
    ts = res.timeseries
    t = ts["time_s"]
    step = max(1, len(t) // 1500)
    keep = slice(None, None, step)
    return {
        "summary": to_jsonable(res.summary),
        "time_s": t[keep].tolist(),
        "in_system": (ts["waiting_requests"] + ts["running_requests"])[keep].tolist(),
        "waiting": ts["waiting_requests"][keep].tolist(),
        "backlog_tokens": ts["backlog_tokens"][keep].tolist(),
        "arrival_end_s": float(np.max(res.arrival_s)),
    }


def _policy_info(name: str) -> tuple[str, bool]:
    cls = make_batch_policy(name)  # ConfigError for an unknown name (aliases are fine)
    return cls.name, bool(cls.work_conserving)


@strict_arguments
@writes_alone("reproduce stability")
def reproduce_stability(
    workload: str = "synthetic",
    *,
    cost_model: str | None = None,
    b_max: int | None = None,
    load: float = 0.9,
    num_requests: int | None = None,
    search_requests: int | None = None,
    seeds: Sequence[int] | None = None,
    tol: float | None = None,
    quick: bool = False,
    search: bool = True,
    policies: Sequence[str] = POLICIES,
    out_dir="reproduce-stability",
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool | None = None,
) -> dict:
    """Run the experiment (see the module docstring); returns {"rows": table rows,
    "critical_rate", "files", "config", "wall_s", "search_failed": {policy spec: the
    rate of the failed probe that stopped its search (no answer)}}."""
    t0 = time.perf_counter()
    if workload not in PRESETS:
        raise ConfigError(f"unknown workload {workload!r} (known: {', '.join(PRESETS)})")
    real = as_real(load)  # (shown as 20.0, not np.float32(20.0))
    if real is None or not 0 < real < 10:
        # (the bound named: 'a positive fraction' read as wrong for --load 50)
        raise ConfigError(
            f"load must be a fraction of the critical rate above 0 and below 10, got {load if real is None else real!r}"
        )
    load = real
    if tol is not None and (as_real(tol) is None or not 0 < as_real(tol) < 1):
        raise ConfigError(f"tol must be in (0, 1), got {tol!r}")
    tol = None if tol is None else as_real(tol)
    if not search and (search_requests is not None or tol is not None):
        raise ConfigError("search_requests and tol set the rate search: they have no effect with search=False")
    n_queue, n_search, d_seeds, d_tol = (QUICK if quick else SIZES)[workload]
    n_queue = n_queue if num_requests is None else num_requests
    n_search = search_requests if search_requests is not None else (n_search if num_requests is None else num_requests)
    seeds = check_seeds(d_seeds if seeds is None else seeds)
    tol = d_tol if tol is None else tol
    policies = check_policy_names(policies)
    if not policies:
        raise ConfigError("give at least one policy")
    # (its runs twice, its rows twice; in any case or by an alias, as the CLI's `--policies`)
    dup = first_repeat([canonical_policy_name(p).lower() for p in policies])
    if dup is not None:
        raise ConfigError(f"policy {dup!r} is given twice")
    base = dict(PRESETS[workload])
    if cost_model is not None:
        base["cost_model"] = cost_model
    if b_max is not None:
        base["b_max"] = b_max
    check_run_dir(out_dir, "reproduce stability")  # not over another run's outputs

    # lambda* of the first seed's sample of the queue runs' requests: the table's
    # critical_rate, rate and max_stable_load from one lambda*, whichever seeds ran
    cfg0 = resolve_point(None, base, {"num_requests": n_queue, "seed": seeds[0]})
    lam = critical_rate_of(cfg0)
    rate = load * lam
    # the queue runs stop when the arrivals do: the verdict looks only at that window and
    # an unstable policy would otherwise spend most of the run draining
    span = float(make_trace(WorkloadSpec.from_dict({**cfg0.workload, "rate": rate}), blocks=False).arrival_s.max())
    jobs, traces = [], {}
    for p in policies:
        _policy_info(p.partition(":")[0])
        c = resolve_point(
            None,
            base,
            {"policy": p, "rate": rate, "num_requests": n_queue, "seed": seeds[0], "max_time_s": span * 1.001 + 1e-3},
        )
        check_point(c, traces)  # a refused policy spec leaves no folder behind
        jobs.append((p, c.to_dict()))
    out = prepare_run_dir(out_dir, "reproduce stability")
    queue: dict[str, dict] = {}
    with Backend(backend, workers, address) as be:
        for p, r in be.run(jobs, queue_run):
            queue[p] = r

    # the folder is marked before the search writes its first probe (into search/, a
    # sweep's folder: its points/ are records keyed by their configuration, which a rerun
    # reuses); the earlier run's files stay until the search is done (a search can run for
    # hours: a Ctrl-C in it loses none of them), then go before this run writes its own
    # (`begin_reproduce_write`), the folder marked until table.json, written last, is in
    # place: a run that stops leaves no new file beside an earlier run's, and a run stopped
    # in the search leaves a folder its rerun takes and resumes
    mark_reproduce_search(out, "reproduce stability")
    found = {}
    if search:
        with writing_stability_search(out / "search"):
            res = max_stable_rate(
                None,
                policies=policies,
                seeds=seeds,
                tol=tol,
                out_dir=out / "search",
                backend=backend,
                workers=workers,
                address=address,
                progress=progress,
                num_requests=n_search,
                **base,
            )
        found = {r["policy"]: r for r in res}
    # (the search's files, just written, stay; without the search an earlier run's search/ goes)
    begin_reproduce_write(out, "reproduce stability", keep=("search",) if search else ())
    files = [_plot_queue(queue, policies, out / "queue.png", load, lam, workload, cfg0)]
    rows = []
    for p in policies:
        name, wc = _policy_info(p.partition(":")[0])
        s = queue[p]["summary"]
        f = found.get(p, {})
        # with no probe judged stable the search's row holds the first rate judged unstable,
        # an upper bound, flagged `max_stable_upper_bound` (as search.csv has it); None with
        # every probe inconclusive (no answer)
        rate_found = f.get("max_stable_rate")
        # a share of this table's lambda* (the search's bisection used its own, of its
        # probes' requests: for a trace, the first N of it, so another lambda* for another N)
        load_found = None if rate_found is None else rate_found / lam
        rows.append(
            {
                "policy": name,
                # the spec as given: `adaptive` and `adaptive:cost=paper` are two rows
                "policy_spec": p,
                "work_conserving": wc,
                "load": load,
                "rate": rate,
                "stable_at_load": s.get("stable"),
                "verdict_at_load": s.get("verdict"),
                "verdict_reason": s.get("verdict_reason"),
                "backlog_growth_tokens_per_s": s.get("backlog_growth_tokens_per_s"),
                # at the run's end (the thinned series' last sample may come earlier)
                "in_system_at_end": s["arrived"] - s["completed"] if "arrived" in s else None,
                "critical_rate": lam,
                "max_stable_rate": rate_found,
                "max_stable_load": load_found,
                "search_critical_rate": f.get("critical_rate"),
                # (None without a search) true: every probe was stable up to the widest
                # rate searched, the max stable rate is that rate, a lower bound
                "max_stable_lower_bound": bool(f.get("max_stable_lower_bound")) if f else None,
                # true: no probe was stable, the max stable rate is below the first rate
                # judged unstable, which max_stable_rate holds (an upper bound)
                "max_stable_upper_bound": bool(f.get("max_stable_upper_bound")) if f else None,
                # probes judged neither way (too short): with none stable, the rate is below them
                "inconclusive_low": f.get("inconclusive_low"),
                "inconclusive_high": f.get("inconclusive_high"),
                "unstable_rate": f.get("unstable_rate"),
            }
        )
    meta = {
        "workload": workload,
        "cost_model": cfg0.cost_model,
        "b_max": cfg0.b_max,
        "workload_config": {k: v for k, v in cfg0.workload.items() if v is not None and k != "rate"},
        "load": load,
        "rate": rate,
        "queue_requests": n_queue,
        "search_requests": n_search,
        "seeds": list(seeds),
        "tol": tol,
        "token_capacity": queue[policies[0]]["summary"].get("token_capacity"),
    }
    files += write_table(rows, out, "table")
    text = json.dumps({"meta": meta, "rows": rows}, indent=2, default=str)
    # the run's proof, whole or not at all, written last; the folder's mark goes with it
    files.append(end_reproduce_write(out, "reproduce stability", lambda p: p.write_text(text)))
    # (a failed probe leaves the row's max stable rate empty, as an all-inconclusive search
    # does: the caller must tell them apart)
    failed = {p: found[p]["failed_rate"] for p in policies if found.get(p, {}).get("failed_rate") is not None}
    return {
        "rows": rows,
        "critical_rate": lam,
        "files": files,
        "config": meta,
        "wall_s": time.perf_counter() - t0,
        "search_failed": failed,
    }


def queue_styles(policies) -> list[tuple[str, str]]:
    """(colour, line style) of each policy's line in queue.png: its palette colour; a style
    of its own for each of four lines in a row (policies that run alike, vLLM and Orca on
    a trace, draw one curve, and a solid line hid the one under it), and never a style
    its colour already has (one policy twice, with other options): past the four named
    styles, dash patterns of their own (a colour's ninth line repeats)."""
    named = ("-", "--", ":", "-.")
    more = ((0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2, 2, 2)))
    used: dict[str, list] = {}
    out = []
    for i, p in enumerate(policies):
        c = color_of(p, i)
        taken = used.setdefault(c, [])
        order = named[i % 4 :] + named[: i % 4] + more
        ls = next((d for d in order if d not in taken), order[0])
        taken.append(ls)
        out.append((c, ls))
    return out


def _plot_queue(queue: dict, policies, path: Path, load: float, lam: float, workload: str, cfg) -> str:
    fig, axes = new_figure(2, width=7.0)
    for p, (c, ls) in zip(policies, queue_styles(policies)):
        q = queue[p]
        s = q["summary"]
        # the full spec: `adaptive` and `adaptive:cost=paper` are two lines
        label = f"{p} ({s.get('verdict') or 'no verdict'})"
        axes[0].plot(q["time_s"], q["in_system"], ls=ls, lw=1.2, label=label, color=c)
        axes[1].plot(q["time_s"], [max(v, 0) for v in q["backlog_tokens"]], ls=ls, lw=1.2, label=label, color=c)
    axes[0].set_ylabel("requests in the system")
    axes[1].set_ylabel("unfinished work (tokens)")
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.set_yscale("symlog", linthresh=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{workload}: load {load:g} of lambda* = {lam:.3g} req/s ({cfg.cost_model}, b_max {cfg.b_max})", fontsize=9
    )
    return save_figure(fig, path)


def format_rate(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.3g}"
