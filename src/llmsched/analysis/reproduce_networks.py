"""`llmsched reproduce clusters | agents | rybko-stolyar`: the network experiments of
issue #9 (paper 1: parallel servers behind a router, DAG and fork-join routes, the
Rybko-Stolyar counterexample). Each function runs its simulations, writes a table
(CSV + JSON) and figures (PNG) into `out_dir`, and returns a JSON-ready dict; `quick`
runs a reduced version in seconds (tests).

- `reproduce_clusters`: one Sarathi server (paper cost model, b_max 512) of 4, 8 and 16
  replicas behind each router (`random`, `round-robin`, `power-of-two`, `jsq`,
  `least-tokens`), Poisson arrivals at 50% to 98% of the pool's capacity (the traffic
  equations' `critical_scale`). Measured: p50/p99 job latency, p99 TTFT, and the stability
  verdict of every replica, of the server (the simulator's) and of the pool's total
  backlog. Figures `clusters_p99.png` (p99 job latency against load, one line per router,
  one panel per replica count) and `clusters_ttft.png` (p99 TTFT).
- `reproduce_agents`: an agent DAG (planner -> tool delay -> two parallel worker calls on
  a 2-replica pool -> answer, resending the context; `examples/networks/agent_dag.yaml`)
  and a fork-join workflow (three parallel calls on three servers, then a merge call that
  resends them), every server Sarathi, at 90% and 110% of the bottleneck's capacity; then
  the same networks with every server running FasterTransformer (not work-conserving) at
  loads from 2% to 90%. Figure `agents_backlog.png`: unfinished work of each server over
  time, Sarathi against FasterTransformer at the same load.
- `reproduce_rybko_stolyar`: two servers, two job types with reverse routes (A: a short
  call at s1 then a long call at s2; B: the reverse), prefill-only calls (one output
  token). Priority at each server to the class that leaves the network through it
  (s1: B.2, s2: A.2) against the reverse priorities (s1: A.1, s2: B.1), and, when the
  network simulator offers it, back-pressure (max-pressure) control. Figure
  `rybko_stolyar_backlog.png`: unfinished work at s1 and s2 over time per order, while
  jobs arrive (the window the verdicts judge), as `rybko_stolyar_backlog.csv`; the
  table's `peak_backlog_s1_while_arriving_tokens` (and s2) is each server's largest
  backlog in that window, and the summary's `backlog_peaks_by_tenth_while_arriving` its
  largest in each tenth of it (from every sample; the thinned series keeps those samples).

Verdicts. The simulator judges each replica on its own backlog; a server is unstable if
one of its replicas is (`NetworkResult`). Every network run also judges the **network's
unfinished work** (`network_backlog`, the summary's `network_work_verdict`): the
servers' backlogs plus the work of the calls the jobs in the network have still to make
(and, under back-pressure, of the calls waiting in a server's buffer), with the same
test (`theory.stability_verdict`, threshold 2% of the bottleneck's capacity). The
network's `verdict` combines its servers' and, when the routes cycle through servers,
that one too: a network that is unstable only through oscillation between servers
(Rybko-Stolyar) can look stable or inconclusive server by server while its total work
grows steadily (docs/networks.md, "Judging a network").
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core.checks import (
    check_count,
    check_distinct,
    check_list,
    check_names,
    check_reals,
    check_seeds,
    strict_arguments,
)
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.palette import color_of
from ..core.paths import (
    atomic_write,
    begin_reproduce_write,
    check_run_dir,
    end_reproduce_write,
    prepare_run_dir,
    writes_alone,
)
from ..policies import make_batch_policy
from ..sim.network_result import network_backlog, simulate_network
from ..theory import INCONCLUSIVE, STABLE, UNSTABLE
from ..theory.network import traffic
from ..workload import network as _network_spec
from ..workload.arrivals import MAX_REQUESTS
from .figures import new_figure, plain_log_ticks, save_figure, symlog_y
from .runner import Backend
from .tables import write_table

__all__ = [
    "reproduce_clusters",
    "reproduce_agents",
    "reproduce_rybko_stolyar",
    "cluster_network",
    "agent_dag_network",
    "fork_join_network",
    "rybko_stolyar_network",
    "network_backlog",
    "run_network_point",
    "ROUTERS",
    "CLUSTER_WORKLOADS",
    "RS_ORDERS",
    "backpressure_available",
]

ROUTERS = ("random", "round-robin", "power-of-two", "jsq", "least-tokens")

#: (prompt law, output law) of the cluster workloads. `prefill-heavy` (default): long
#: prompts, short answers (retrieval, summarisation, classification), where a call's
#: latency is mostly its wait for prefill budget, which the router controls.
#: `synthetic`: `reproduce stability`'s workload, decode-heavy (mean 200 / 101 tokens).
CLUSTER_WORKLOADS = {
    "prefill-heavy": ("geometric:400", "geometric:20"),
    "synthetic": ("geometric:200", "geometric:101"),
}

SERIES_POINTS = 1500  # time-series points kept per run for figures and CSV
_BACKPRESSURE = "backpressure"


def backpressure_available() -> bool:
    """Whether the network simulator offers back-pressure (max-pressure) control
    (`control: backpressure` in the network file)."""
    return _BACKPRESSURE in getattr(_network_spec, "CONTROLS", ())


# ----------------------------------------------------------------------------- networks
def _server(policy: str, b_max: int, cost_model: str, **kw) -> dict:
    return {"policy": policy, "b_max": b_max, "cost_model": cost_model, **kw}


def cluster_network(
    replicas: int,
    router: str,
    *,
    prompt: str = "geometric:400",
    output: str = "geometric:20",
    policy: str = "sarathi",
    b_max: int = 512,
    cost_model: str = "paper",
) -> dict:
    """One server of `replicas` replicas behind `router`; one job type making one call
    (Poisson, 1 job/s: scale it)."""
    return {
        "servers": {"pool": _server(policy, b_max, cost_model, replicas=replicas, router=router)},
        "jobs": {
            "chat": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [{"call": {"server": "pool", "prompt": prompt, "output": output}}],
            }
        },
    }


def agent_dag_network(policy: str = "sarathi", *, b_max: int = 512, cost_model: str = "paper") -> dict:
    """The agent of `examples/networks/agent_dag.yaml` with every server running `policy`:
    a planner call, a tool delay (exponential, mean 0.5 s), two worker calls in parallel
    on a 2-replica JSQ pool that resend the plan, and an answer call that resends
    everything (1 job/s: scale it)."""
    return {
        "servers": {
            "planner": _server(policy, b_max, cost_model),
            "workers": _server(policy, b_max, cost_model, replicas=2, router="jsq"),
            "writer": _server(policy, b_max, cost_model),
        },
        "jobs": {
            "agent": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {
                        "call": {
                            "server": "planner",
                            "prompt": "geometric:300",
                            "output": "geometric:100",
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
                                        "prompt": "geometric:200",
                                        "output": "geometric:150",
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
                                        "output": "geometric:80",
                                        "context": True,
                                        "class": "code",
                                    }
                                }
                            ],
                        ]
                    },
                    {
                        "call": {
                            "server": "writer",
                            "prompt": "const:50",
                            "output": "geometric:250",
                            "context": True,
                            "class": "answer",
                        }
                    },
                ],
            }
        },
    }


def fork_join_network(policy: str = "sarathi", *, b_max: int = 512, cost_model: str = "paper") -> dict:
    """Fork-join (after `examples/networks/fork_join.yaml`, with Poisson arrivals and one
    policy everywhere): three parallel calls on servers a, b, c; the join waits for all
    three; a merge call resends their prompts and outputs (1 job/s: scale it)."""
    return {
        "servers": {k: _server(policy, b_max, cost_model) for k in ("a", "b", "c", "merge")},
        "jobs": {
            "split": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {
                        "fork": [
                            [{"call": {"server": "a", "prompt": "geometric:400", "output": "geometric:100"}}],
                            [{"call": {"server": "b", "prompt": "geometric:400", "output": "geometric:100"}}],
                            [{"call": {"server": "c", "prompt": "geometric:200", "output": "geometric:50"}}],
                        ]
                    },
                    {"call": {"server": "merge", "prompt": "const:100", "output": "geometric:200", "context": True}},
                ],
            }
        },
    }


WORKFLOWS = {"dag": agent_dag_network, "fork-join": fork_join_network}

#: Rybko-Stolyar orders: the priority lists of s1 and s2 (or the network control).
RS_ORDERS = {
    "exit": {"s1": ["B.2"], "s2": ["A.2"]},  # priority to the class leaving through the server
    "entry": {"s1": ["A.1"], "s2": ["B.1"]},  # priority to the class entering the network there
    "fcfs": {"s1": [], "s2": []},
    _BACKPRESSURE: {"s1": [], "s2": []},  # max-pressure control, no static priority
}
RS_LABELS = {
    "exit": "priority to the exiting classes (s1: B.2, s2: A.2)",
    "entry": "priority to the entering classes (s1: A.1, s2: B.1)",
    "fcfs": "no priority (FCFS)",
    _BACKPRESSURE: "back-pressure (max-pressure)",
}


def rybko_stolyar_network(
    order: str = "exit",
    *,
    load: float = 0.85,
    short: int = 128,
    long: int = 1024,
    output: int = 1,
    b_max: int = 512,
    cost_model: str = "paper",
) -> dict:
    """Two servers s1, s2 (Sarathi), two job types with reverse routes: A makes a short
    call (`short` prompt tokens) at s1, then a long call (`long`) at s2; B a short call at
    s2, then a long one at s1; every call has `output` output tokens (1: prefill only).
    Both job types arrive (Poisson) at the rate that offers each server `load` of its
    capacity. `order` picks the priorities (`RS_ORDERS`): `exit`, `entry`, `fcfs` or
    `backpressure`."""
    if order not in RS_ORDERS:
        raise ConfigError(f"unknown Rybko-Stolyar order {order!r} (known: {', '.join(RS_ORDERS)})")
    if order == _BACKPRESSURE and not backpressure_available():
        raise ConfigError("this network simulator has no back-pressure control (control: backpressure)")
    if not (isinstance(load, (int, float)) and load > 0):
        raise ConfigError(f"load must be a positive fraction of a server's capacity, got {load!r}")
    prio = RS_ORDERS[order]
    d = {
        "servers": {s: _server("sarathi", b_max, cost_model, priority=list(prio[s])) for s in ("s1", "s2")},
        "jobs": {
            name: {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {"call": {"server": first, "prompt": f"const:{short}", "output": f"const:{output}"}},
                    {"call": {"server": second, "prompt": f"const:{long}", "output": f"const:{output}"}},
                ],
            }
            for name, first, second in (("A", "s1", "s2"), ("B", "s2", "s1"))
        },
    }
    if order == _BACKPRESSURE:
        d["control"] = _BACKPRESSURE
    rate = load / traffic(d).max_utilisation
    for jd in d["jobs"].values():
        jd["arrival"]["rate"] = rate
    return d


# ------------------------------------------------------------------------------ one run
def _a(col) -> np.ndarray:
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)


def _kept_samples(n: int, extra, points: int = SERIES_POINTS) -> np.ndarray:
    """The samples of a series of `n` kept for figures and CSV: every k-th (about `points`
    in all) and those of `extra` (each server's peaks: a thinned series would miss them)."""
    step = max(1, int(math.ceil(n / points)))
    return np.union1d(np.arange(0, n, step), np.asarray([i for i in extra if i is not None], dtype=np.int64))


def _tenth_peaks(t: np.ndarray, w: np.ndarray, end: float, parts: int = 10) -> tuple[list, list]:
    """The largest value of `w` in each tenth of [0, `end`] (by time; None where no sample
    falls) and the samples that hold them: the growing peaks of an unstable oscillation."""
    values, where = [], []
    for i in range(parts):
        lo, hi = i * end / parts, (i + 1) * end / parts
        sel = np.flatnonzero((t >= lo) & ((t <= hi) if i == parts - 1 else (t < hi)))
        if len(sel):
            j = int(sel[np.argmax(w[sel])])
            values.append(float(w[j]))
            where.append(j)
        else:
            values.append(None)
            where.append(None)
    return values, where


def run_network_point(arg: dict) -> dict:
    """One simulation (module level, for the process pool): `arg` holds `network` (a
    mapping), `scale`, `num_jobs`, `seed` and `series` (keep thinned time series). Returns
    the measurements the experiments tabulate."""
    t0 = time.perf_counter()
    res = simulate_network(arg["network"], scale=arg.get("scale"), num_jobs=arg["num_jobs"], seed=arg["seed"])
    s = res.summary
    nb = network_backlog(res)
    # the window the verdicts judge, while jobs arrive: the peaks and the series are of
    # it (after the last arrival a backlog drains, and an unstable one may first grow on)
    end = nb["arrival_end_s"]
    t = np.asarray(nb["time_s"], dtype=float)
    win = t <= end if end is not None else np.zeros(len(t), dtype=bool)
    backlog = {name: np.asarray(w, dtype=float)[win] for name, w in nb["servers"].items()}
    servers = {}
    for name, srv in s["servers"].items():
        reps = srv["replicas"]
        growth = [r.get("backlog_growth_tokens_per_s") for r in reps.values()]
        growth = [g for g in growth if g is not None]
        servers[name] = {
            "verdict": srv["verdict"],
            "utilisation": srv.get("utilisation"),
            "replica_verdicts": [r.get("verdict") for r in reps.values()],
            "backlog_growth_tokens_per_s": sum(growth) if growth else None,
            "p99_ttft_ms": srv.get("p99_ttft_ms"),
            "mean_ttft_ms": srv.get("mean_ttft_ms"),
            "p99_e2el_ms": srv.get("p99_e2el_ms"),
            # (from every sample, not the thinned series')
            "peak_backlog_while_arriving_tokens": float(backlog[name].max()) if win.any() else None,
        }
    out = {
        "num_jobs": s["num_jobs"],
        "completed_jobs": s["completed_jobs"],
        "duration_s": s["duration"],
        "arrival_end_s": nb["arrival_end_s"],
        "mean_job_latency_ms": s.get("mean_job_latency_ms"),
        "p50_job_latency_ms": s.get("p50_job_latency_ms"),
        "p90_job_latency_ms": s.get("p90_job_latency_ms"),
        "p99_job_latency_ms": s.get("p99_job_latency_ms"),
        "verdict": s["verdict"],
        "servers": servers,
        "network": nb["verdict"],
        "bottleneck": s.get("bottleneck"),
        "max_utilisation": s.get("max_utilisation"),
        "critical_scale": s.get("critical_scale"),
        "wall_s": time.perf_counter() - t0,
    }
    if arg.get("series"):
        tw, network = t[win], np.asarray(nb["network"], dtype=float)[win]
        tenths = {k: _tenth_peaks(tw, w, end) for k, w in backlog.items()} if win.any() else {}
        # every server's peak in each tenth (its largest among them) and the network's stay
        # in the thinned series: its figure and CSV show the peaks the table and summary give
        extra = [j for _, where in tenths.values() for j in where] + ([int(np.argmax(network))] if win.any() else [])
        keep = _kept_samples(len(tw), extra)
        out["series"] = {
            "time_s": tw[keep].tolist(),
            "servers": {k: w[keep].tolist() for k, w in backlog.items()},
            "network": network[keep].tolist(),
        }
        out["backlog_peaks_by_tenth"] = {k: values for k, (values, _) in tenths.items()}
    return to_jsonable(out)


def _run_all(jobs: list, backend: str, workers: int | None, address: str | None) -> dict:
    results = {}
    with Backend(backend, workers, address) as be:
        for key, r in be.run(jobs, run_network_point):
            results[key] = r
    return results


def _check_loads(loads, what: str = "loads") -> list[float]:
    return check_reals(loads, what, "positive fractions of the capacity")


def _counts(verdicts: Sequence[str]) -> str:
    """'stable/inconclusive/unstable' counts."""
    return "/".join(str(sum(v == k for v in verdicts)) for k in (STABLE, INCONCLUSIVE, UNSTABLE))


def _finish(out: Path, kind: str, rows: list[dict], meta: dict) -> list[str]:
    """table.csv (and .parquet), then table.json, the run's proof, written last (whole or
    not at all); the folder's mark (`begin_reproduce_write`) goes with it."""
    files = write_table(rows, out, "table")
    text = json.dumps(to_jsonable({"meta": meta, "rows": rows}), indent=2, default=str)
    files.append(end_reproduce_write(out, kind, lambda p: p.write_text(text)))
    return files


def _series_csv(path: Path, runs: list[tuple[str, dict]]) -> str:
    """Long-format CSV of the backlog series while jobs arrive (the verdicts' window),
    thinned (every k-th sample, and the samples of each server's peaks): run,time_s,
    <server>...,network, unfinished work in tokens. Written whole or not at all
    (`atomic_write`), as every other file of the run: a write that stops (a full disk,
    Ctrl-C) leaves no cut file under its name."""
    names = sorted({k for _, r in runs for k in r["series"]["servers"]})
    lines = ["run,time_s," + ",".join(names) + ",network"]
    for label, r in runs:
        ser = r["series"]
        cols = [ser["servers"].get(k, [0.0] * len(ser["time_s"])) for k in names]
        for i, t in enumerate(ser["time_s"]):
            lines.append(f"{label},{t:.3f}," + ",".join(f"{c[i]:.0f}" for c in cols) + f",{ser['network'][i]:.0f}")
    text = "\n".join(lines) + "\n"
    atomic_write(path, lambda p: p.write_text(text))
    return str(path)


_MARK = {STABLE: "o", INCONCLUSIVE: "s", UNSTABLE: "x"}


# ------------------------------------------------------------------------------ clusters
# jobs per run by default (clusters: per replica), as `reproduce --help` states them (a
# test holds them equal), and with quick
NUM_JOBS = {"clusters": 5000, "agents": 10000, "rybko-stolyar": 20000}
QUICK_JOBS = {"clusters": 1000, "agents": 2000, "rybko-stolyar": 3000}


def _job_count(num_jobs, kind: str, quick: bool, per: int = 1, unit: str = "") -> int:
    """`num_jobs` (or `kind`'s default), checked; `per` runs' jobs to one of it (replicas),
    within the arrivals' limit, before the folder is made (a run refused it after, leaving
    an empty folder and an error naming `per` times the number given)."""
    n = (QUICK_JOBS if quick else NUM_JOBS)[kind] if num_jobs is None else check_count(num_jobs, "num_jobs")
    if n * per > MAX_REQUESTS:
        raise ConfigError(f"num_jobs must be at most {MAX_REQUESTS // per:,}{unit}, got {n:,}")
    return n


@strict_arguments
@writes_alone("reproduce clusters")
def reproduce_clusters(
    *,
    out_dir="reproduce-clusters",
    quick: bool = False,
    replicas: Sequence[int] | None = None,
    routers: Sequence[str] | None = None,
    loads: Sequence[float] | None = None,
    num_jobs: int | None = None,
    seeds: Sequence[int] | None = None,
    workload: str = "prefill-heavy",
    policy: str = "sarathi",
    b_max: int = 512,
    cost_model: str = "paper",
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> dict:
    """Routers on a pool of replicas (see the module docstring). `num_jobs`: jobs per
    replica (so that every replica sees as many calls whatever the pool's size; default
    5000, quick 1000). Full: replicas 4, 8, 16; loads 0.5 to 0.98; all five routers; seed
    0. Quick: 4 replicas, random and JSQ, loads 0.5 and 0.9. Returns {"rows", "summary",
    "files", "config", "wall_s"}; a row per (replicas, router, load, seed)."""
    t0 = time.perf_counter()
    if workload not in CLUSTER_WORKLOADS:
        raise ConfigError(f"unknown cluster workload {workload!r} (known: {', '.join(CLUSTER_WORKLOADS)})")
    # (`is None`, not `or`: an empty list or 0 is refused, not run as the default)
    if replicas is None:
        replicas = (4,) if quick else (4, 8, 16)
    replicas = [check_count(r, "replicas") for r in check_list(replicas, "replicas", "whole numbers >= 1")]
    check_distinct(replicas, "replicas")
    routers = check_names((("random", "jsq") if quick else ROUTERS) if routers is None else routers, "routers")
    check_distinct(routers, "routers")
    for r in routers:
        if r not in ROUTERS:
            raise ConfigError(f"unknown router {r!r} (known: {', '.join(ROUTERS)})")
    loads = _check_loads(((0.5, 0.9) if quick else (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)) if loads is None else loads)
    check_distinct(loads, "loads")
    n_max = max(replicas)
    per_replica = _job_count(num_jobs, "clusters", quick, n_max, f" jobs per replica with {n_max} replicas")
    seeds = check_seeds(seeds if seeds is not None else (0,))
    prompt, output = CLUSTER_WORKLOADS[workload]
    make_batch_policy(policy)  # (the runs would refuse it, after the folder was made)
    check_run_dir(out_dir, "reproduce clusters")  # not over another run's outputs

    jobs, caps = [], {}
    for n in replicas:
        for router in routers:
            net = cluster_network(
                n, router, prompt=prompt, output=output, policy=policy, b_max=b_max, cost_model=cost_model
            )
            rep = traffic(net)
            caps[n] = (rep.critical_scale, rep.server("pool").token_capacity)
            for load in loads:
                for seed in seeds:
                    jobs.append(
                        (
                            (n, router, load, seed),
                            {
                                "network": net,
                                "scale": load * rep.critical_scale,
                                "num_jobs": per_replica * n,
                                "seed": seed,
                            },
                        )
                    )
    out = prepare_run_dir(out_dir, "reproduce clusters")  # (after the checks: a refusal leaves no folder)
    res = _run_all(jobs, backend, 1 if (quick and workers is None) else workers, address)
    rows = []
    for (n, router, load, seed), _arg in jobs:
        r = res[(n, router, load, seed)]
        pool = r["servers"]["pool"]
        rows.append(
            {
                "replicas": n,
                "router": router,
                "load": load,
                "seed": seed,
                "rate": load * caps[n][0],
                "jobs": r["num_jobs"],
                "mean_job_latency_ms": r["mean_job_latency_ms"],
                "p50_job_latency_ms": r["p50_job_latency_ms"],
                "p90_job_latency_ms": r["p90_job_latency_ms"],
                "p99_job_latency_ms": r["p99_job_latency_ms"],
                "p99_ttft_ms": pool["p99_ttft_ms"],
                "verdict": r["verdict"],
                "replica_verdicts": _counts(pool["replica_verdicts"]),
                "pool_backlog_verdict": r["network"]["verdict"],
                "pool_backlog_growth_tokens_per_s": r["network"].get("backlog_growth_tokens_per_s"),
                "utilisation": pool["utilisation"],
                "wall_s": r["wall_s"],
            }
        )
    summary = _cluster_summary(rows, replicas, routers, loads)
    meta = {
        "workload": workload,
        "prompt": prompt,
        "output": output,
        "policy": policy,
        "b_max": b_max,
        "cost_model": cost_model,
        "replicas": replicas,
        "routers": routers,
        "loads": loads,
        "jobs_per_replica": per_replica,
        "seeds": list(seeds),
        "critical_rate": {str(n): c[0] for n, c in caps.items()},
        "pool_token_capacity": {str(n): c[1] for n, c in caps.items()},
    }
    begin_reproduce_write(out, "reproduce clusters")
    files = [
        _plot_clusters(
            rows, replicas, routers, "p99_job_latency_ms", "p99 job latency (ms)", out / "clusters_p99.png", meta
        ),
        _plot_clusters(rows, replicas, routers, "p99_ttft_ms", "p99 TTFT (ms)", out / "clusters_ttft.png", meta),
    ]
    files += _finish(out, "reproduce clusters", rows, {**meta, "summary": summary})
    return {"rows": rows, "summary": summary, "files": files, "config": meta, "wall_s": time.perf_counter() - t0}


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _cluster_summary(rows: list[dict], replicas, routers, loads) -> dict:
    """Verdict counts below capacity, and per (replicas, load) each router's p99 (mean
    over seeds), the best router and JSQ against random."""
    verdicts = {k: sum(r["verdict"] == k for r in rows) for k in (STABLE, INCONCLUSIVE, UNSTABLE)}
    pool = {k: sum(r["pool_backlog_verdict"] == k for r in rows) for k in (STABLE, INCONCLUSIVE, UNSTABLE)}
    table = []
    for n in replicas:
        for load in loads:
            sel = [r for r in rows if r["replicas"] == n and r["load"] == load]
            p99 = {rt: _mean(r["p99_job_latency_ms"] for r in sel if r["router"] == rt) for rt in routers}
            ttft = {rt: _mean(r["p99_ttft_ms"] for r in sel if r["router"] == rt) for rt in routers}
            known = {k: v for k, v in p99.items() if v is not None}
            entry = {
                "replicas": n,
                "load": load,
                "p99_job_latency_ms": p99,
                "p99_ttft_ms": ttft,
                "best_router": min(known, key=known.get) if known else None,
                "verdicts": {rt: [r["verdict"] for r in sel if r["router"] == rt] for rt in routers},
            }
            if p99.get("jsq") and p99.get("random"):
                entry["jsq_vs_random_p99"] = p99["jsq"] / p99["random"]
            table.append(entry)
    return {"simulator_verdicts": verdicts, "pool_backlog_verdicts": pool, "by_load": table}


def _plot_clusters(rows, replicas, routers, metric: str, ylabel: str, path: Path, meta: dict) -> str:
    fig, axes = new_figure(len(replicas), width=7.0 if len(replicas) == 1 else 6.0)
    for ax, n in zip(axes, replicas):
        for i, rt in enumerate(routers):
            pts = {}
            for r in rows:
                if r["replicas"] == n and r["router"] == rt and r.get(metric) is not None:
                    pts.setdefault(r["load"], []).append(r)
            xs = sorted(pts)
            ys = [_mean(r[metric] for r in pts[x]) for x in xs]
            (line,) = ax.plot(xs, ys, "-", lw=1.3, label=rt, color=color_of(rt))
            for x, y in zip(xs, ys):
                vs = {r["verdict"] for r in pts[x]}
                v = UNSTABLE if UNSTABLE in vs else (INCONCLUSIVE if INCONCLUSIVE in vs else STABLE)
                ax.plot(
                    [x], [y], _MARK[v], color=line.get_color(), ms=5, mfc=line.get_color() if v == STABLE else "none"
                )
        ax.set_yscale("log")
        plain_log_ticks(ax, "y")  # (2x10^2, 3x10^2, ... overlapped under a decade)
        ax.set_xlabel("offered load (fraction of the pool's capacity)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{n} replicas", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].plot([], [], "ko", ms=5, label="stable")
    axes[0].plot([], [], "ks", ms=5, mfc="none", label="inconclusive")
    axes[0].plot([], [], "kx", ms=5, label="unstable (some replica)")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{meta['policy']} replicas ({meta['cost_model']}, b_max {meta['b_max']}), "
        f"{meta['workload']} workload (prompt {meta['prompt']}, output {meta['output']}), "
        f"{meta['jobs_per_replica']} jobs per replica",
        fontsize=8,
    )
    return save_figure(fig, path)


# -------------------------------------------------------------------------------- agents
@strict_arguments
@writes_alone("reproduce agents")
def reproduce_agents(
    *,
    out_dir="reproduce-agents",
    quick: bool = False,
    workflows: Sequence[str] | None = None,
    loads: Sequence[float] | None = None,
    ft_loads: Sequence[float] | None = None,
    plot_load: float = 0.9,
    num_jobs: int | None = None,
    seeds: Sequence[int] | None = None,
    b_max: int = 512,
    cost_model: str = "paper",
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> dict:
    """Agent workflows under Sarathi and FasterTransformer (see the module docstring).
    Loads are fractions of the bottleneck's capacity (`scale = load * critical_scale` of
    the traffic equations). `loads`: Sarathi's (default 0.9 and 1.1); `ft_loads`:
    FasterTransformer's (default 0.02, 0.05, 0.1, 0.3, 0.6, 0.9; quick 0.9); `plot_load`:
    the load of the backlog figure (added to both lists). `num_jobs`: jobs per run
    (default 10000, quick 2000). Quick: the DAG only. Returns {"rows", "summary", "files",
    "config", "wall_s"}."""
    t0 = time.perf_counter()
    workflows = check_names((("dag",) if quick else tuple(WORKFLOWS)) if workflows is None else workflows, "workflows")
    check_distinct(workflows, "workflows")
    for w in workflows:
        if w not in WORKFLOWS:
            raise ConfigError(f"unknown workflow {w!r} (known: {', '.join(WORKFLOWS)})")
    plot_load = _check_loads([plot_load], "plot_load")[0]
    loads = check_distinct(_check_loads((0.9, 1.1) if loads is None else loads), "loads")
    loads = sorted(set(loads) | {plot_load})
    if ft_loads is None:
        ft_loads = (0.9,) if quick else (0.02, 0.05, 0.1, 0.3, 0.6, 0.9)
    ft_loads = check_distinct(_check_loads(ft_loads, "ft_loads"), "ft_loads")
    ft_loads = sorted(set(ft_loads) | {plot_load})  # (the plot's load joins both lists)
    n_jobs = _job_count(num_jobs, "agents", quick)
    seeds = check_seeds(seeds if seeds is not None else (0,))
    check_run_dir(out_dir, "reproduce agents")  # not over another run's outputs

    jobs, info = [], {}
    for w in workflows:
        base = traffic(WORKFLOWS[w]("sarathi", b_max=b_max, cost_model=cost_model))
        info[w] = {
            "bottleneck": base.bottleneck,
            "critical_scale": base.critical_scale,
            "utilisation_at_scale_1": {s.name: s.utilisation for s in base.servers},
        }
        for policy, grid in (("sarathi", loads), ("fastertransformer", ft_loads)):
            net = WORKFLOWS[w](policy, b_max=b_max, cost_model=cost_model)
            for load in grid:
                for seed in seeds:
                    jobs.append(
                        (
                            (w, policy, load, seed),
                            {
                                "network": net,
                                "scale": load * base.critical_scale,
                                "num_jobs": n_jobs,
                                "seed": seed,
                                "series": load == plot_load and seed == seeds[0],
                            },
                        )
                    )
    out = prepare_run_dir(out_dir, "reproduce agents")  # (after the checks: a refusal leaves no folder)
    res = _run_all(jobs, backend, 1 if (quick and workers is None) else workers, address)
    rows = []
    for (w, policy, load, seed), _arg in jobs:
        r = res[(w, policy, load, seed)]
        srv = r["servers"]
        rows.append(
            {
                "workflow": w,
                "policy": policy,
                "load": load,
                "seed": seed,
                "scale": load * info[w]["critical_scale"],
                "bottleneck": info[w]["bottleneck"],
                "jobs": r["num_jobs"],
                "verdict": r["verdict"],
                "network_backlog_verdict": r["network"]["verdict"],
                "network_backlog_growth_tokens_per_s": r["network"].get("backlog_growth_tokens_per_s"),
                "server_verdicts": " ".join(f"{k}:{v['verdict']}" for k, v in srv.items()),
                "server_utilisation": " ".join(f"{k}:{v['utilisation']:.3f}" for k, v in srv.items()),
                "server_backlog_growth_tokens_per_s": " ".join(
                    f"{k}:{v['backlog_growth_tokens_per_s']:.1f}"
                    for k, v in srv.items()
                    if v["backlog_growth_tokens_per_s"] is not None
                ),
                "mean_job_latency_ms": r["mean_job_latency_ms"],
                "p99_job_latency_ms": r["p99_job_latency_ms"],
                "wall_s": r["wall_s"],
            }
        )
    summary = {}
    for w in workflows:

        def verdicts(policy, w=w):
            return {
                ld: sorted(
                    {r["verdict"] for r in rows if r["workflow"] == w and r["policy"] == policy and r["load"] == ld}
                )
                for ld in (loads if policy == "sarathi" else ft_loads)
            }

        ft = verdicts("fastertransformer")
        stable_ft = [ld for ld, vs in ft.items() if vs == [STABLE]]
        unstable_ft = [ld for ld, vs in ft.items() if UNSTABLE in vs]
        summary[w] = {
            **info[w],
            "sarathi": verdicts("sarathi"),
            "fastertransformer": ft,
            "ft_largest_stable_load": max(stable_ft) if stable_ft else None,
            "ft_smallest_unstable_load": min(unstable_ft) if unstable_ft else None,
        }
    meta = {
        "workflows": workflows,
        "b_max": b_max,
        "cost_model": cost_model,
        "loads": loads,
        "ft_loads": ft_loads,
        "plot_load": plot_load,
        "num_jobs": n_jobs,
        "seeds": list(seeds),
    }
    series = [
        (f"{w}/{p}@{plot_load:g}", res[(w, p, plot_load, seeds[0])])
        for w in workflows
        for p in ("sarathi", "fastertransformer")
    ]
    begin_reproduce_write(out, "reproduce agents")
    files = [
        _plot_agents(series, workflows, plot_load, out / "agents_backlog.png"),
        _series_csv(out / "agents_backlog.csv", series),
    ]
    files += _finish(out, "reproduce agents", rows, {**meta, "summary": summary})
    return {"rows": rows, "summary": summary, "files": files, "config": meta, "wall_s": time.perf_counter() - t0}


def _grid_figure(nrows: int, ncols: int, width: float = 11.0, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(width, height * nrows), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [[fig.add_subplot(nrows, ncols, i * ncols + j + 1) for j in range(ncols)] for i in range(nrows)]


def _backlog_panel(ax, r: dict, title: str, log: bool) -> None:
    ser = r["series"]
    t = ser["time_s"]
    for name, w in ser["servers"].items():
        v = r["servers"][name]["verdict"]
        ax.plot(t, [max(x, 0.0) for x in w], lw=1.1, label=f"{name} (simulator's verdict: {v})")
    ax.plot(
        t, ser["network"], "k--", lw=0.9, label=f"network, incl. calls to come (verdict: {r['network']['verdict']})"
    )
    if log:
        symlog_y(ax, linthresh=1000)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("unfinished work (tokens)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)


def _plot_agents(series: list, workflows, load: float, path: Path) -> str:
    fig, axes = _grid_figure(len(workflows), 2)
    for i, w in enumerate(workflows):
        for j, p in enumerate(("sarathi", "fastertransformer")):
            r = dict(series)[f"{w}/{p}@{load:g}"]
            _backlog_panel(axes[i][j], r, f"{w}, {p}, {load:g} of the bottleneck's capacity: {r['verdict']}", log=True)
    return save_figure(fig, path)


# ------------------------------------------------------------------------ Rybko-Stolyar
@strict_arguments
@writes_alone("reproduce rybko-stolyar")
def reproduce_rybko_stolyar(
    *,
    out_dir="reproduce-rybko-stolyar",
    quick: bool = False,
    orders: Sequence[str] | None = None,
    load: float = 0.85,
    short: int = 128,
    long: int = 1024,
    output: int = 1,
    num_jobs: int | None = None,
    seeds: Sequence[int] | None = None,
    scan_loads: Sequence[float] | None = None,
    b_max: int = 512,
    cost_model: str = "paper",
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> dict:
    """The Rybko-Stolyar network under each order (see the module docstring and
    `rybko_stolyar_network`). `orders`: default `exit`, `entry` and, when the simulator
    offers it, `backpressure`. `load`: each server's offered load (default 0.85; with
    short 128 and long 1024 tokens the two exiting classes then need 1.51 of one server).
    `num_jobs`: jobs per run (default 20000, quick 3000). `scan_loads`: further loads at
    which every order runs (first seed, no figure of its own series; default 0.5, 0.6,
    0.7, 0.8; quick none): the exiting classes need `2 * load * long / (short + long)` of
    one server, 1 at load 0.5625 with the defaults. Returns {"rows", "scan", "summary",
    "files", "config", "wall_s"}."""
    t0 = time.perf_counter()
    if orders is None:
        orders = ("exit", "entry") + ((_BACKPRESSURE,) if backpressure_available() else ())
    orders = check_names(orders, "orders")
    check_distinct(orders, "orders")
    n_jobs = _job_count(num_jobs, "rybko-stolyar", quick)
    seeds = check_seeds(seeds if seeds is not None else (0,))
    if scan_loads is None:
        scan_loads = () if quick else (0.5, 0.6, 0.7, 0.8)
    scan_loads = check_reals(scan_loads, "scan_loads", "positive fractions of the capacity", empty=True)
    check_distinct(scan_loads, "scan_loads")
    check_run_dir(out_dir, "reproduce rybko-stolyar")  # not over another run's outputs
    nets, theory = {}, {}
    for o in orders:
        net = rybko_stolyar_network(
            o, load=load, short=short, long=long, output=output, b_max=b_max, cost_model=cost_model
        )
        nets[o] = net
        rep = traffic(net)
        s1, s2 = rep.server("s1"), rep.server("s2")
        exit_load = (
            rep.class_load("s1", "B.2").offered_tokens_per_s / s1.capacity
            + rep.class_load("s2", "A.2").offered_tokens_per_s / s2.capacity
        )
        theory[o] = {
            "rate_per_job_type": net["jobs"]["A"]["arrival"]["rate"],
            "utilisation": {"s1": s1.utilisation, "s2": s2.utilisation},
            "exiting_classes_load": exit_load,
            "entering_classes_load": (
                rep.class_load("s1", "A.1").offered_tokens_per_s / s1.capacity
                + rep.class_load("s2", "B.1").offered_tokens_per_s / s2.capacity
            ),
            "traffic_verdict": rep.verdict,
            "cycle": rep.cycle,
        }
    scan_loads = [x for x in scan_loads if x != load]
    jobs = [
        ((o, seed), {"network": nets[o], "num_jobs": n_jobs, "seed": seed, "series": seed == seeds[0]})
        for o in orders
        for seed in seeds
    ]
    jobs += [
        (
            (o, "scan", x),
            {
                "network": rybko_stolyar_network(
                    o, load=x, short=short, long=long, output=output, b_max=b_max, cost_model=cost_model
                ),
                "num_jobs": n_jobs,
                "seed": seeds[0],
            },
        )
        for o in orders
        for x in scan_loads
    ]
    out = prepare_run_dir(out_dir, "reproduce rybko-stolyar")  # (after the checks: a refusal leaves no folder)
    res = _run_all(jobs, backend, 1 if (quick and workers is None) else workers, address)
    rows = []
    for key, _arg in jobs:
        if len(key) != 2:
            continue
        o, seed = key
        r = res[(o, seed)]
        srv = r["servers"]
        rows.append(
            {
                "order": o,
                "seed": seed,
                "priority_s1": " ".join(RS_ORDERS[o]["s1"]),
                "priority_s2": " ".join(RS_ORDERS[o]["s2"]),
                "control": _BACKPRESSURE if o == _BACKPRESSURE else "none",
                "utilisation_s1": theory[o]["utilisation"]["s1"],
                "utilisation_s2": theory[o]["utilisation"]["s2"],
                "exiting_classes_load": theory[o]["exiting_classes_load"],
                "jobs": r["num_jobs"],
                "network_backlog_verdict": r["network"]["verdict"],
                "network_backlog_growth_tokens_per_s": r["network"].get("backlog_growth_tokens_per_s"),
                "network_backlog_growth_ci": r["network"].get("backlog_growth_ci"),
                "verdict": r["verdict"],
                "verdict_s1": srv["s1"]["verdict"],
                "verdict_s2": srv["s2"]["verdict"],
                "backlog_growth_s1_tokens_per_s": srv["s1"]["backlog_growth_tokens_per_s"],
                "backlog_growth_s2_tokens_per_s": srv["s2"]["backlog_growth_tokens_per_s"],
                "peak_backlog_s1_while_arriving_tokens": srv["s1"]["peak_backlog_while_arriving_tokens"],
                "peak_backlog_s2_while_arriving_tokens": srv["s2"]["peak_backlog_while_arriving_tokens"],
                "mean_job_latency_ms": r["mean_job_latency_ms"],
                "p99_job_latency_ms": r["p99_job_latency_ms"],
                "wall_s": r["wall_s"],
            }
        )
    scan = []
    for o in orders:
        for x in sorted(set(scan_loads) | {load}):
            r = res[(o, "scan", x)] if x != load else res[(o, seeds[0])]
            scan.append(
                {
                    "order": o,
                    "load": x,
                    "exiting_classes_load": 2 * x * long / (short + long),
                    "network_backlog_verdict": r["network"]["verdict"],
                    "network_backlog_growth_tokens_per_s": r["network"].get("backlog_growth_tokens_per_s"),
                    "verdict": r["verdict"],
                    "p99_job_latency_ms": r["p99_job_latency_ms"],
                }
            )
    peaks = {o: res[(o, seeds[0])]["backlog_peaks_by_tenth"] for o in orders}
    summary = {
        o: {
            **theory[o],
            "network_backlog_verdicts": [r["network_backlog_verdict"] for r in rows if r["order"] == o],
            "simulator_verdicts": [r["verdict"] for r in rows if r["order"] == o],
            "backlog_peaks_by_tenth_while_arriving": peaks[o],
            "by_load": {s["load"]: s["network_backlog_verdict"] for s in scan if s["order"] == o},
        }
        for o in orders
    }
    meta = {
        "orders": orders,
        "load": load,
        "short": short,
        "long": long,
        "output": output,
        "num_jobs": n_jobs,
        "seeds": list(seeds),
        "scan_loads": scan_loads,
        "b_max": b_max,
        "cost_model": cost_model,
        "backpressure_available": backpressure_available(),
    }
    series = [(o, res[(o, seeds[0])]) for o in orders]
    begin_reproduce_write(out, "reproduce rybko-stolyar")
    files = [
        _plot_rs(series, out / "rybko_stolyar_backlog.png", meta),
        _series_csv(out / "rybko_stolyar_backlog.csv", series),
    ]
    if scan_loads:
        files.append(_plot_rs_scan(scan, orders, out / "rybko_stolyar_loads.png", meta))
        files += write_table(scan, out, "loads")
    files += _finish(out, "reproduce rybko-stolyar", rows, {**meta, "summary": summary})
    return {
        "rows": rows,
        "scan": scan,
        "summary": summary,
        "files": files,
        "config": meta,
        "wall_s": time.perf_counter() - t0,
    }


def _plot_rs_scan(scan: list, orders, path: Path, meta: dict) -> str:
    fig, (ax,) = new_figure()
    for o in orders:
        pts = sorted(
            (s["load"], s["network_backlog_growth_tokens_per_s"], s["network_backlog_verdict"])
            for s in scan
            if s["order"] == o and s["network_backlog_growth_tokens_per_s"] is not None
        )
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=1.3, label=RS_LABELS[o])
        for x, y, v in pts:
            ax.plot([x], [y], _MARK[v], color=line.get_color(), ms=6, mfc=line.get_color() if v == STABLE else "none")
    edge = (meta["short"] + meta["long"]) / (2 * meta["long"])
    ax.axvline(edge, color="gray", ls=":", lw=1, label="exiting classes need exactly one server")
    ax.axhline(0, color="gray", lw=0.6)
    ax.plot([], [], "ko", ms=5, label="stable")
    ax.plot([], [], "ks", ms=5, mfc="none", label="inconclusive")
    ax.plot([], [], "kx", ms=5, label="unstable")
    ax.set_xlabel("load offered to each server (fraction of its capacity)")
    ax.set_ylabel("growth of the network's unfinished work (tokens/s)")
    ax.set_title(f"Rybko-Stolyar: network backlog growth by order ({meta['num_jobs']} jobs a run)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _plot_rs(series: list, path: Path, meta: dict) -> str:
    fig, axes = _grid_figure(1, len(series), width=5.2 * len(series), height=4.2)
    for ax, (o, r) in zip(axes[0], series):
        _backlog_panel(ax, r, f"{RS_LABELS[o]}: {r['network']['verdict']}", log=False)
    fig.suptitle(
        f"Rybko-Stolyar: each server offered {meta['load']:g} of its capacity; calls of "
        f"{meta['short']} / {meta['long']} prompt tokens, {meta['output']} output token(s); "
        f"{meta['num_jobs']} jobs",
        fontsize=8,
    )
    return save_figure(fig, path)
