"""A network simulation's results: end-to-end job latency, per-call and per-server metrics,
a stability verdict per replica, per server and for the whole network, and the files.

`write(out)` lays out:
- `summary.json`: jobs (count, throughput, latency mean/p50/p90/p99/max, per job type),
  every server (offered load against capacity from the traffic equations, call metrics,
  verdict, under back-pressure its buffer counted, and the buffer's growth; with
  prefix caching its `prefix_cache` hits and evictions, per replica and summed) and the
  network's verdict (and `prefix_cache` over every caching server);
- `config.json`: the network as parsed, with the run's options (`run`: `max_time_s`,
  `sample_interval_s`, `fast`, those given): reproduces the run;
- `jobs.csv`: one row per job of the workload: `job,type,arrival_s,finish_s,latency_s,calls,
  arrived,finished` (`calls`: the calls the job has made, its rows in calls.csv, also for a
  job still unfinished when max_time_s stopped the run; `arrived` 0 for a job due at or
  after that stop, which never arrived, as one server's requests.csv lists them);
- `calls.csv`: one row per LLM call made (every one arrived: a route makes no call at or
  after the stop): `call,job,class,server,replica,arrival_s,prompt_tokens,output_tokens,
  queue_s,ttft_s,e2e_s,preemptions,finished`;
- `servers/<replica>/`: the single-server files of each replica (summary.json,
  requests.csv, timeseries.csv, histograms).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import replace
from itertools import repeat
from pathlib import Path

import numpy as np

from ..core.checks import as_real, check_run_switches
from ..core.constraints import k_max_binds
from ..core.cost import make_cost_model, warn_fast_steps, warn_past_grid
from ..core.errors import ConfigError, warn_block_size_unused
from ..core.jsonio import to_jsonable
from ..core.length_mix import LengthMix
from ..core.paths import (
    begin_simulate_write,
    check_out_dir,
    check_run_dir,
    end_simulate_write,
    make_run_dir,
    writes_alone,
)
from ..core.prefix_cache import hit_rate
from ..core.request import NS, check_sample_interval, check_seconds
from ..policies import scheduler_policy_capacity
from ..theory import INCONCLUSIVE, STABLE, UNSTABLE, capacity, stability_verdict
from ..theory.network import check_schedulers, route_delay_s, traffic
from ..theory.verdict import burst_factor, guard_time_of, service_steps, short_window_time_s
from ..workload.arrivals import Deterministic, Gamma
from ..workload.blocks import DEFAULT_BLOCK_SIZE
from ..workload.network import load_network
from .csv_rows import IntField, names_field, seconds_field, write_csv, write_file
from .network import CallOverCapacity, NetworkStats, run_network
from .result import SimResult, check_inputs_not_replaced, clear_other_run, per_second, run_duration
from .simulator import RunStats

LATENCY_PERCENTILES = (50, 90, 99)


def _a(col, dtype=np.int64) -> np.ndarray:
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def _split_codes(codes: np.ndarray, k: int) -> list[np.ndarray]:
    """The indices of the entries of `codes` equal to each of 0 .. k-1, ascending (each
    exactly `np.flatnonzero(codes == i)`), from one stable sort instead of k scans; codes
    outside 0 .. k-1 are in no group."""
    if len(codes) and k < np.iinfo(np.int16).max:
        # (16-bit keys: numpy's stable sort is then a radix sort, several times faster)
        codes = np.clip(codes, -1, k).astype(np.int16)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(k + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(k)]


def group_indices(values, names) -> dict[str, np.ndarray]:
    """Each of `names`' indices among `values` (a list of strings), ascending: for each name
    exactly `np.flatnonzero(np.asarray(values, dtype=object) == name)`, from one pass over
    `values` (a dict look-up each) and one stable sort, instead of one scan per name. A
    value not among `names` is in no group."""
    names = list(dict.fromkeys(names))
    code = {n: i for i, n in enumerate(names)}
    other = len(names)
    codes = np.fromiter(map(code.get, values, repeat(other)), dtype=np.intp, count=len(values))
    return dict(zip(names, _split_codes(codes, len(names))))


def _latency_stats(prefix: str, ns: np.ndarray) -> dict:
    ms = ns / 1e6
    if len(ms) == 0:
        return {f"{k}_{prefix}_ms": None for k in ("mean", *(f"p{p}" for p in LATENCY_PERCENTILES), "max")}
    out = {f"mean_{prefix}_ms": float(ms.mean())}
    for p, v in zip(LATENCY_PERCENTILES, np.percentile(ms, LATENCY_PERCENTILES)):
        out[f"p{p}_{prefix}_ms"] = float(v)
    out[f"max_{prefix}_ms"] = float(ms.max())
    return out


_PREFIX_COUNTS = (
    "queried_tokens",
    "hit_tokens",
    "queried_blocks",
    "hit_blocks",
    "prefill_tokens_saved",
    "first_admission_hit_tokens",
    "preempted_queried_tokens",
    "preempted_hit_tokens",
    "preempted_queried_blocks",
    "preempted_hit_blocks",
    "evictions",
    "cached_blocks",
    "free_cached_blocks",
)


def merge_prefix_stats(caches: list[dict]) -> dict:
    """Prefix-cache counters of several replicas (`PrefixCache.stats()`) added up, with the
    hit rates of the sums; `block_size` is kept when they agree (None otherwise)."""
    out: dict = {k: sum(int(c[k]) for c in caches) for k in _PREFIX_COUNTS}
    sizes = {c["block_size"] for c in caches}
    out["block_size"] = sizes.pop() if len(sizes) == 1 else None
    out["token_hit_rate"] = hit_rate(out["hit_tokens"], out["queried_tokens"])
    out["block_hit_rate"] = hit_rate(out["hit_blocks"], out["queried_blocks"])
    return out


def _combine(verdicts: list, pool: str | None = None) -> str:
    """Unstable if one of `verdicts` is, stable if all are, otherwise inconclusive; with a
    replicated server's `pool` verdict (on the replicas' summed backlog), stable also when
    that one is and no replica is unstable: replicas at a light load show slopes of a
    fraction of a token a second whose intervals exclude 0 by chance, which the pool's
    backlog, judged against the pool's capacity, averages out."""
    if any(v == UNSTABLE for v in verdicts):
        return UNSTABLE
    if verdicts and all(v == STABLE for v in verdicts):
        return STABLE
    return STABLE if pool == STABLE else INCONCLUSIVE


def _replica_fill_capacity(load) -> float:
    """One replica's share of its server's `fill_capacity`, the threshold's scale where its
    policy's own limit is unknown or is this, as one server's verdict takes it
    (`CapacityReport.fill_capacity`): theorem 2's `replica_token_capacity` wherever the
    pool's fill capacity is its theorem-2 capacity (exactly, without a rounding), less where
    a binding k_max's region serves less. (A caching server's, and the policy's own limit:
    `NetworkResult.threshold_capacities`.)"""
    if load.fill_capacity >= load.token_capacity:
        return load.replica_token_capacity
    return load.fill_capacity * load.busiest_replica_share


def _saved_share(caches: list, work: float) -> float:
    """The share of `work` (tokens) prefix caches saved: their hits at first admission (a
    preempted call re-hitting its own blocks saves only its recomputation; `caches`: the
    replicas' `prefix` statistics, None without a cache), 0 without one."""
    hits = sum(c["first_admission_hit_tokens"] for c in caches if c is not None)
    return min(1.0, hits / work) if work > 0 else 0.0


def _backlog_units(caches: list, gross: float) -> float:
    """Backlog tokens a saturated caching queue drains per token of work, as one server's
    verdict scales its threshold (`api._stability_fields`' `units`): `gross` (its admitted
    calls' prompt + output - 1, less a `cached: true` call's handed-over context, which no
    backlog counts) over that less their hits at first admission (`caches`: the prefix
    statistics, None without a cache); exactly 1.0 without a hit."""
    hits = sum(c["first_admission_hit_tokens"] for c in caches if c is not None)
    return gross / (gross - hits) if hits and gross > hits else 1.0


def server_policy_limit(server, best: float, fill: float, region_exact) -> float | None:
    """The token rate `server`'s scheduler serves under a backlog where theory says it, one
    server's rule (`policies.scheduler_policy_capacity`: `fill` for a work-conserving policy
    without a binding cap, `best`, lambda*'s steps, for adaptive), else None. `server`: its
    `ServerSpec`."""
    return scheduler_policy_capacity(server, best, fill, region_exact)


def server_policy_load(load, server, control: str = "none") -> float:
    """A server's offered load over its policy's limit, as one server's verdict takes it
    (`api._stability_fields`'s `load`): over `server_policy_limit` of its traffic's
    `capacity` and `fill_capacity`, else over lambda*'s `capacity` (`utilisation`: no
    policy serves more). Back-pressure control holds work back (a replica takes buffered
    calls one class at a time), so its servers' limits are unknown: over lambda*'s then.
    `load`: the server's `ServerLoad`, `server` its `ServerSpec`; 0 for a server without
    calls."""
    if not load.offered_tokens_per_s > 0:
        return 0.0
    limit = None
    if control != "backpressure":
        limit = server_policy_limit(server, load.capacity, load.fill_capacity, load.region_exact)
    x = load.offered_tokens_per_s / limit if limit else load.utilisation
    return min(x, sys.float_info.max)  # (a capacity of ~0: the verdicts take finite numbers)


def _last_arrival_s(job_arrival_ns: np.ndarray) -> float:
    """When the last job arrived (seconds), the end of the window the verdicts judge; -inf
    when none did (a max_time_s before the first arrival): no sample is judged, the
    verdicts are inconclusive."""
    return float(job_arrival_ns.max()) / NS if len(job_arrival_ns) else -np.inf


def _step_count(t_events: np.ndarray, w_events: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Sum of the `w_events` at times <= each grid time."""
    if len(t_events) == 0:
        return np.zeros(len(grid))
    order = np.argsort(t_events, kind="stable")
    cum = np.cumsum(w_events[order])
    idx = np.searchsorted(t_events[order], grid, side="right") - 1
    return np.where(idx >= 0, cum[np.maximum(idx, 0)], 0.0)


def decode_time_s(sims, outputs: np.ndarray) -> float | None:
    """How long a call decodes at a server if every step served it: its replicas' mean
    step time times the mean output of its calls less one, as a single server's verdict
    computes it (`api._stability_fields`); None before any step or call."""
    steps = sum(sim.steps for sim in sims)
    if not steps or len(outputs) == 0:
        return None
    return sum(sim.busy for sim in sims) / NS / steps * max(0.0, float(outputs.mean()) - 1.0)


def service_time_s(sims, prompts: np.ndarray, outputs: np.ndarray, b_max: int) -> float | None:
    """How long a call takes at a server if every step served it: its replicas' mean step
    time times its steps (`theory.verdict.service_steps`: ceil(mean prefilled prompt /
    b_max) prefill steps, the first token among them, then mean output - 1 decode steps),
    as a single server's verdict counts a request's (`api.guard_time_s`); `prompts` are
    the tokens the calls prefill (less a `cached` call's handed-over context). None
    before any step or call."""
    steps = sum(sim.steps for sim in sims)
    if not steps or len(outputs) == 0:
        return None
    n = service_steps(float(prompts.mean()), float(outputs.mean()), b_max)
    return sum(sim.busy for sim in sims) / NS / steps * n


def _rate(arrival_s: np.ndarray) -> float | None:
    """Arrivals a second: (n - 1) over their span, as `SimResult.offered_rate`; None for
    fewer than two or all at once."""
    if len(arrival_s) < 2:
        return None
    span = float(arrival_s.max() - arrival_s.min())
    return (len(arrival_s) - 1) / span if span > 0 else None


def _arrival_cv(arrival) -> float:
    """A job type's arrivals' coefficient of variation: a gamma process's cv, 0 for
    deterministic arrivals, 1 for Poisson."""
    if isinstance(arrival, Gamma):
        return float(arrival.cv)
    return 0.0 if isinstance(arrival, Deterministic) else 1.0


def _mixed_burst_factor(types: np.ndarray, jobs) -> float:
    """`theory.verdict.burst_factor` of the job types' arrival streams merged in proportion
    to their counts in `types` (job-type indices into `jobs`), at their squared cvs'
    average so weighted (a superposition's index of dispersion); 1 for no arrivals. One
    stream of cv c: (1 + c^2) / 2 for c > 1, as one server's `api._burst_factor`."""
    cvs = [_arrival_cv(job.arrival) for job in jobs]
    counts = np.bincount(types, minlength=len(cvs))
    n = float(np.sum(counts))
    if not n > 0:
        return 1.0
    cv2 = float(np.dot(counts, np.square(cvs))) / n
    return burst_factor(float(np.sqrt(cv2)))


def _burst_scaled(burst: float, what: str) -> str:
    """The reason's name for a guard time scaled by `burst` (`stability_verdict`'s
    decode_of), as one server's: "burst-scaled ((1 + cv^2) / 2 = 2.5) call"."""
    return what if burst == 1 else f"burst-scaled ((1 + cv^2) / 2 = {burst:.3g}) {what}"


def network_backlog(result) -> dict:
    """Unfinished work over time, per server and for the whole network, with a verdict on
    the network's.

    Per server: the sum of its replicas' backlogs (remaining prefill + decode tokens of the
    calls at the replica) and, under back-pressure, the work of the calls waiting in its
    buffer (counted from delivery to the call's first step, which its release precedes by
    at most a step or two; the replicas' own series do not see the buffer). The network's:
    the servers', plus the work (prompt + output - 1, less a `cached` call's handed-over
    context) of every call a job in the network has still to make (counted from the job's
    arrival to the call's delivery). Every
    call's length is known from the run, so this is exact up to that release. The verdict
    judges the network's work while jobs arrive, with the threshold at 2% of the
    bottleneck's capacity (a caching bottleneck's in the backlog's units, `backlog_units`)
    (an overloaded bottleneck at load rho adds (rho - 1) times its capacity a second, as one
    server would) and the short-window rule counted in job
    decode times (`NetworkResult.job_decode_time_s`) plus its expected delays
    (`NetworkResult.job_delay_s`: a call still to come counts from the job's arrival,
    through the delays before it), times the jobs' arrivals' burst factor
    (`NetworkResult.job_burst_factor`, as one server's). Returns {"time_s", "servers": {name:
    array}, "buffers": {name: array} (under back-pressure, each server's buffer alone; else
    empty), "network": array, "verdict": {...}, "arrival_end_s"} (`arrival_end_s`: the last
    job's arrival, None when no job arrived before max_time_s; the verdict is then
    inconclusive)."""
    st = result.stats
    reps = result.replicas()
    series = [r.timeseries for r in reps]
    longest = max(series, key=lambda s: len(s["time_s"]))
    grid = np.asarray(longest["time_s"], dtype=float)
    servers: dict[str, np.ndarray] = {}
    for rep, ts in zip(st.replicas, series):
        if len(ts["time_s"]):
            w = np.interp(grid, np.asarray(ts["time_s"], dtype=float), np.asarray(ts["backlog_tokens"], dtype=float))
        else:  # a replica that never ran a step before the run stopped holds no backlog
            w = np.zeros(len(grid))
        servers[rep["server"]] = servers.get(rep["server"], 0.0) + w
    # a cached call's handed-over context is never prefilled here (as the traffic equations
    # and the replica's own backlog count it)
    work = (_a(st.call_prompt) - _a(st.call_cached) + _a(st.call_output) - 1).astype(float)
    call_at = _a(st.call_arrival) / NS
    job_at = _a(st.job_arrival)[_a(st.call_job)] / NS
    pending = _step_count(np.concatenate([job_at, call_at]), np.concatenate([work, -work]), grid)
    buffers: dict[str, np.ndarray] = {}
    if getattr(st.spec, "control", "none") == "backpressure":
        # a call waits in its server's buffer from delivery until a replica takes it
        queue = _a(st.call_queue)
        start = np.where(queue >= 0, _a(st.call_arrival) + queue, np.iinfo(np.int64).max) / NS
        calls_of = result.server_calls()
        for name in servers:
            sel = calls_of[name]
            buffers[name] = _step_count(
                np.concatenate([call_at[sel], start[sel]]), np.concatenate([work[sel], -work[sel]]), grid
            )
            servers[name] = servers[name] + buffers[name]
    total = sum(servers.values()) + pending
    last = _last_arrival_s(result.job_arrival_ns[result.job_arrived])
    keep = grid <= last
    # threshold scale: what the bottleneck's policy serves under a backlog (its own limit,
    # else full steps of b_max: `threshold_capacities`): an overloaded
    # bottleneck at load rho adds (rho - 1) times that a second, to the work of the jobs
    # queued before it (their calls upstream of it are done), as one server would
    # (with prefix caching, in the work's units: the bottleneck's `backlog_units`, as the
    # servers' backlogs and the calls still to come count every prompt token)
    cap = None
    if result.traffic is not None:
        neck = result.traffic.bottleneck
        cap = result.threshold_capacities(neck)[1] * result.backlog_units(neck)
    # the network's work counts a job's whole work from its arrival until its last call
    # ends, delays included (a call still to come counts from the job's arrival), so its
    # short window is measured in job times: its calls' service times and its expected
    # delays, not call ones; no less than 25 of the jobs' arrival gaps, as one server's
    decode = result.job_decode_time_s()
    service = result.job_service_time_s()
    delay = result.job_delay_s()
    arrived = result.job_arrival_ns[result.job_arrived] / NS
    scale, floored = None, False
    # bursty job arrivals relax (1 + cv^2) / 2 times more slowly (Kingman): the window must
    # be as much longer, as one server's (`api._stability_fields`)
    burst = result.job_burst_factor()
    if service is not None or delay:
        scale, floored = short_window_time_s((service or 0.0) + delay, _rate(arrived))
        scale *= burst
    # above the network's limit (a server offered more than its policy serves) work that does
    # not grow is draining (`LOAD_MARGIN`); jobs that thinned out in the judged window say
    # nothing of the load (`MIN_ARRIVAL_SHARE`): one server's rules
    limit = result.network_load()
    specs = result.stats.spec.servers.values()
    capped = any(k_max_binds(srv.b_max, srv.k_max) for srv in specs)  # (`NetworkResult._min_rise`)
    load, load_of = (None, "") if limit is None else (limit[0], f"the network's limit, at server {limit[1]}")
    try:
        v = stability_verdict(
            grid[keep],
            total[keep],
            capacity=cap,
            decode_time_s=scale,
            decode_of=_burst_scaled(burst, "delay-inclusive job" if delay else "job"),
            time_of=guard_time_of(floored),
            load=load,
            load_of=load_of,
            arrival_times=arrived,
            # (a rise of under one job's work is no growth: `stability_verdict`'s min_rise)
            min_rise=float(work.sum()) / len(arrived) if len(arrived) and not capped else None,
            rise_of="job",
        )
        verdict = {
            "verdict": v.verdict,
            "stable": v.stable,
            "reason": v.reason,
            "backlog_growth_tokens_per_s": v.growth_per_s,
            "backlog_growth_ci": [v.ci_low, v.ci_high],
            "threshold_tokens_per_s": v.threshold_per_s,
            "mean_backlog_tokens": v.mean_backlog,
            "decode_time_s": decode,
            "service_time_s": service,
            "delay_s": delay,
            "guard_time_s": scale,
            "burst_factor": burst,
            "load": load,
        }
    except ConfigError as e:
        verdict = {"verdict": INCONCLUSIVE, "stable": None, "reason": f"too short: {e}"}
    return {
        "time_s": grid,
        "servers": servers,
        "buffers": buffers,
        "network": total,
        "verdict": verdict,
        "arrival_end_s": last if np.isfinite(last) else None,
    }


class NetworkResult:
    """What `llmsched.simulate_network` returns."""

    def __init__(self, stats: NetworkStats, traffic, config: dict, wall_s: float = 0.0):
        self.stats = stats
        self.traffic = traffic
        self.config = config
        self.wall_s = wall_s
        self._summary: dict | None = None
        self._replicas: list[SimResult] | None = None
        self._decode_times: dict[str, float | None] | None = None
        self._service_times: dict[str, float | None] | None = None
        self._server_load_memo: dict[str, float] | None = None
        # each server's and each call class's calls (indices, ascending): one grouping
        # pass each, not one scan of every call per server or class
        self._server_calls: dict[str, np.ndarray] | None = None
        self._class_calls: dict[str, np.ndarray] | None = None
        self._saved_shares: dict[str, float | None] = {}
        self._units: dict[str, float] = {}
        self._fills: dict[str, tuple[float, float]] = {}
        self._burst_factors: dict[str, float] | None = None

    def __getstate__(self) -> dict:
        """A copy (pickle, a multiprocessing worker's result) keeps what the replicas'
        simulators measured (`replicas`, `decode_times`), not the live simulators."""
        self.replicas()
        self.decode_times()
        self.service_times()
        state = self.__dict__.copy()
        state["_server_calls"] = state["_class_calls"] = None  # (recomputed from the stats)
        reps = [{k: v for k, v in rep.items() if k != "sim"} for rep in self.stats.replicas]
        state["stats"] = replace(self.stats, replicas=reps)
        return state

    # ---- per job ---------------------------------------------------------------------
    @property
    def job_arrival_ns(self) -> np.ndarray:
        return _a(self.stats.job_arrival)

    @property
    def job_finish_ns(self) -> np.ndarray:
        return _a(self.stats.job_finish)

    @property
    def job_arrived(self) -> np.ndarray:
        """True for the jobs that arrived; False for those a max_time_s stop kept from
        arriving (due at or after it), as one server's `SimResult.arrived`."""
        arr, stop = self.job_arrival_ns, self.stats.stop_ns
        return np.ones(len(arr), dtype=bool) if stop is None else arr < stop

    @property
    def job_latency_s(self) -> np.ndarray:
        fin, arr = self.job_finish_ns, self.job_arrival_ns
        out = (fin - arr) / NS
        return np.where(fin >= 0, out, np.nan)

    # ---- per server ------------------------------------------------------------------
    def server_calls(self) -> dict[str, np.ndarray]:
        """Each server's calls: their indices in the per-call columns, ascending (what
        `np.asarray(stats.call_server, dtype=object) == name` selects), grouped once."""
        if self._server_calls is None:
            st = self.stats
            names = [*st.spec.servers, *(rep["server"] for rep in st.replicas)]
            self._server_calls = group_indices(st.call_server, names)
        return self._server_calls

    def class_calls(self) -> dict[str, np.ndarray]:
        """Each call class's calls (indices, ascending), grouped once as `server_calls`."""
        if self._class_calls is None:
            st = self.stats
            self._class_calls = group_indices(st.call_class, st.spec.call_classes())
        return self._class_calls

    def _server_sims(self) -> dict[str, list]:
        """Each server's replicas' simulators, in replica order."""
        sims: dict[str, list] = {}
        for r in self.stats.replicas:
            sims.setdefault(r["server"], []).append(r["sim"])
        return sims

    def decode_times(self) -> dict[str, float | None]:
        """Each server's decode time (`decode_time_s`), from all its replicas' steps and
        all its calls' outputs: pooled, so a replica that served few calls gets its
        server's estimate, not a noisy one of its own."""
        if self._decode_times is None:
            output = _a(self.stats.call_output)
            calls = self.server_calls()
            self._decode_times = {
                name: decode_time_s(sims, output[calls[name]]) for name, sims in self._server_sims().items()
            }
        return self._decode_times

    def service_times(self) -> dict[str, float | None]:
        """Each server's call service time (`service_time_s`), pooled over its replicas'
        steps and all its calls, as `decode_times`."""
        if self._service_times is None:
            st = self.stats
            prompt = _a(st.call_prompt) - _a(st.call_cached)
            output = _a(st.call_output)
            calls = self.server_calls()
            self._service_times = {
                name: service_time_s(sims, prompt[calls[name]], output[calls[name]], st.spec.servers[name].b_max)
                for name, sims in self._server_sims().items()
            }
        return self._service_times

    def guard_time(self, server: str, arrival_s: np.ndarray) -> tuple[float | None, str]:
        """The short-window guard's time scale for a queue of `server`'s calls arriving at
        `arrival_s` (a replica's, a pool's): the server's call service time, floored at 25
        of those calls' arrival gaps (`theory.verdict.short_window_time_s`, as one server's
        `api.guard_time_s`), times the server's `burst_factors` (bursty arrivals relax
        more slowly, as one server's `api._stability_fields` scales it), and its name for
        the reason (`stability_verdict`'s time_of)."""
        service = self.service_times()[server]
        if service is None:
            return None, "service"
        scale, floored = short_window_time_s(service, _rate(arrival_s))
        return scale * self.burst_factors()[server], guard_time_of(floored)

    def burst_factors(self) -> dict[str, float]:
        """Each server's burst factor (`theory.verdict.burst_factor`, (1 + cv^2) / 2 for
        gamma arrivals of cv > 1, else 1): of the arrivals of the job types whose calls it
        served, their squared cvs weighted by those calls (`_mixed_burst_factor`); a
        server only Poisson jobs call gets 1."""
        if self._burst_factors is None:
            st = self.stats
            call_type = _a(st.job_type)[_a(st.call_job)]
            groups = self.server_calls()
            self._burst_factors = {
                name: _mixed_burst_factor(call_type[groups[name]], st.spec.jobs)
                for name in dict.fromkeys(rep["server"] for rep in st.replicas)
            }
        return self._burst_factors

    def job_burst_factor(self) -> float:
        """The burst factor of the jobs' arrivals (`_mixed_burst_factor` over the job types,
        weighted by the jobs of each that arrived): the network's work's guard's."""
        return _mixed_burst_factor(_a(self.stats.job_type)[self.job_arrived], self.stats.spec.jobs)

    def job_service_time_s(self) -> float | None:
        """How long a job's calls take, one after another: each server's calls per job
        times its call service time (`service_times`), summed (as `job_decode_time_s`);
        None before any call ran."""
        jobs = int(self.job_arrived.sum())
        calls = self.server_calls()
        times = [len(calls[name]) / jobs * d for name, d in self.service_times().items() if d and jobs]
        return float(sum(times)) if times else None

    def job_decode_time_s(self) -> float | None:
        """How long a job's calls decode, one after another: each server's calls per job
        times its decode time, summed (a fork's branches add up, so this bounds a forked
        job's decode time from above); None before any call decoded."""
        jobs = int(self.job_arrived.sum())
        calls = self.server_calls()
        times = [len(calls[name]) / jobs * d for name, d in self.decode_times().items() if d and jobs]
        return float(sum(times)) if times else None

    def job_delay_s(self) -> float:
        """A job's expected time in its route's delays (`theory.network.route_delay_s`: think,
        tool and transfer time, occupying no server), over the job types in proportion to
        the jobs of each that arrived; 0 without delays or arrivals."""
        st = self.stats
        types = _a(st.job_type)[self.job_arrived]
        if not len(types):
            return 0.0
        counts = np.bincount(types, minlength=len(st.spec.jobs))
        return float(
            sum(n * route_delay_s(job.route, job.system_prompt) for n, job in zip(counts, st.spec.jobs)) / len(types)
        )

    def saved_work_share(self, server: str) -> float | None:
        """The share of a caching server's work (its admitted calls' prompt + output - 1
        tokens, every prompt token counted, as the traffic equations count it) its replicas'
        prefix caches saved (`_saved_share`); None for a server without prefix caching.
        Computed once per server (`policy_loads` asks for every server's, per pool verdict)."""
        if server not in self._saved_shares:
            self._saved_shares[server] = self._saved_work_share(server)
        return self._saved_shares[server]

    def _saved_work_share(self, server: str) -> float | None:
        st = self.stats
        caches = [r.stats.prefix for r in self.replicas() if r.config["server"] == server]
        caches = [c for c in caches if c is not None]
        if not caches:
            return None
        # over the calls admitted (first scheduled): a run cut by max_time_s holds calls that
        # never reached a cache, which its hits say nothing of (counted as misses, they made
        # the share 0.02 instead of 0.49)
        calls = self.server_calls().get(server, np.zeros(0, dtype=np.intp))
        calls = calls[_a(st.call_queue)[calls] >= 0]
        work = int((_a(st.call_prompt)[calls] + _a(st.call_output)[calls] - 1).sum())
        return _saved_share(caches, work)

    def backlog_units(self, server: str) -> float:
        """A caching server's backlog tokens per token of work (`_backlog_units`), over its
        replicas' admitted calls and hits; 1.0 without prefix caching. The threshold's
        capacity is scaled by it: a replica's backlog counts a waiting call's whole prompt
        and drops its cached prefix only at admission (`core.state`), so a saturated pool
        drains that many backlog tokens per token of work, as one server's verdict says
        (docs/stability.md). Measured from the run's hits, as one server's `units` is: the
        traffic equations do not model hits (their `mean_cached_prompt` is a `cached: true`
        call's handed-over context, which no backlog counts)."""
        if server not in self._units:
            caches = [r.stats.prefix for r in self.replicas() if r.config["server"] == server]
            units = 1.0
            if any(c is not None for c in caches):
                gross = self._backlog_work(self._admitted(server)).sum()
                units = _backlog_units(caches, float(gross))
            self._units[server] = units
        return self._units[server]

    def threshold_capacities(self, server: str) -> tuple[float, float] | None:
        """The capacity a server's verdicts' thresholds scale with, one replica's and the
        pool's (tokens of work a second; times `backlog_units` for the thresholds), by one
        server's rule (`api._stability_fields`): its policy's own limit where theory gives
        it (`server_policy_limit`: adaptive's lambda*'s steps, which serve far more than
        full steps where b / t(b) peaks below b_max; under back-pressure too), else its
        fill capacity; from the
        traffic equations (`capacity`, `fill_capacity`, `_replica_fill_capacity`), for a
        caching server from the run's admitted calls instead (`_hit_capacity`), the pool's
        the replica's over the busiest replica's share. None without a traffic report."""
        if self.traffic is None:
            return None
        if server not in self._fills:
            load, srv = self.traffic.server(server), self.stats.spec.servers[server]
            share = load.busiest_replica_share
            fills = (_replica_fill_capacity(load), load.fill_capacity)
            best, exact = load.capacity, load.region_exact
            rep = self._hit_capacity(server) if srv.prefix_caching else None
            if rep is not None:
                fills = (rep.fill_capacity, rep.fill_capacity / share)
                best, exact = rep.effective_capacity / share, rep.region_exact
            # under back-pressure too: the replicas' steps are their policy's, whatever holds
            # calls in the buffers (adaptive on paper:variant=max, 2 replicas: the pool's
            # threshold was 2% of full steps', 1.5 tokens/s, against lambda*'s steps' 454)
            limit = server_policy_limit(srv, best, fills[1], exact)
            # (a limit that is the fill capacity keeps its replica's exact share)
            self._fills[server] = fills if limit is None or limit == fills[1] else (limit * share, limit)
        return self._fills[server]

    def _hit_capacity(self, server: str):
        """Theorem 2's `CapacityReport` for one replica of a caching server, as one server's
        verdict computes it (`api._stability_fields`): the prompt tokens its calls found
        cached at their first admission (`call_hit`), like a `cached: true` call's
        handed-over context, are no work, and a context-dependent model times the steps
        with the calls' own lengths and hits. The traffic equations count every hit as
        prefill work: their steps are prefill-heavier, and serve more tokens a second, than
        the run's, so the thresholds were above one server's (docs/stability.md). Over the
        admitted calls (as `backlog_units`); None without one, or where no capacity can
        be computed (the traffic equations' then)."""
        st = self.stats
        srv = st.spec.servers[server]
        calls = self._admitted(server)
        if not len(calls):
            return None
        prompt, output = _a(st.call_prompt)[calls], _a(st.call_output)[calls]
        cached = _a(st.call_cached)[calls] + _a(st.call_hit)[calls]
        cost = make_cost_model(srv.cost_model)
        try:
            return capacity(
                cost,
                srv.b_max,
                float(prompt.mean()),
                float(output.mean()),
                k_max=srv.k_max,
                cached_prompt=float(cached.mean()),
                peak=False,
                # (a binding cap: no call prefills more in a step than it computed at admission)
                max_prefill_per_request=int((prompt - cached).max()) if k_max_binds(srv.b_max, srv.k_max) else None,
                mix=None if cost.load_only else LengthMix(prompt, output, cached),
            )
        except ConfigError:
            return None

    def policy_loads(self) -> dict[str, float]:
        """Each server's offered load over its policy's limit (`server_policy_load`), net of
        the work its prefix caches saved in the run (the traffic equations count every
        prompt token; one server's verdict likewise counts its measured hits as no work);
        {} without a traffic report."""
        loads = self._server_loads()
        return {name: load * (1.0 - (self.saved_work_share(name) or 0.0)) for name, load in loads.items()}

    def _server_loads(self) -> dict[str, float]:
        """Each server's offered load over its policy's limit (`server_policy_load`, every
        prompt token counted), computed once per result (a registered admission factory is
        called once per server, not once per replica); {} without a traffic report."""
        if self._server_load_memo is None:
            spec = self.stats.spec
            control = getattr(spec, "control", "none")
            self._server_load_memo = (
                {}
                if self.traffic is None
                else {n: server_policy_load(self.traffic.server(n), srv, control) for n, srv in spec.servers.items()}
            )
        return self._server_load_memo

    def network_load(self) -> tuple[float, str] | None:
        """The network's offered load over its limit, and the server that sets it: the
        largest of the servers' `policy_loads` (every arrival rate scaled by 1 / that load
        puts that server at its policy's limit: the network's throughput limit); None
        without a traffic report."""
        loads = self.policy_loads()
        if not loads:
            return None
        name = max(loads, key=loads.get)
        return loads[name], name

    # ---- per replica -----------------------------------------------------------------
    def replicas(self) -> list[SimResult]:
        """One `SimResult` per replica, over the calls it served."""
        if self._replicas is None:
            st = self.stats
            rep_of = _a(st.call_replica)
            arrival = _a(st.call_arrival)
            prompt, output = _a(st.call_prompt), _a(st.call_output)
            ttft, e2e, queue = _a(st.call_ttft), _a(st.call_e2e), _a(st.call_queue)
            pre = _a(st.call_preempt)
            classes = np.asarray(st.call_class, dtype=object)
            out = []
            # (each replica's calls from one grouping pass, not one scan per replica)
            for rep, sel in zip(st.replicas, _split_codes(rep_of, len(st.replicas))):
                sim = rep["sim"]
                stats = RunStats(
                    n=len(sel),
                    ttft_ns=ttft[sel],
                    e2e_ns=e2e[sel],
                    queue_ns=queue[sel],
                    preemptions=pre[sel].astype(np.int32),
                    itl=sim.itl,
                    load_hist=sim.load_hist,
                    b_max=sim.state.b_max,
                    batch_hist=sim.batch_hist,
                    steps=sim.steps,
                    busy_ns=sim.busy,
                    end_ns=st.end_ns,
                    timeseries=sim.series.cols,
                    unfinished=int((e2e[sel] < 0).sum()),
                    prefix=sim.state.prefix_stats(),
                )
                # the replica's scheduler as it ran, as one server's config.json records it
                # (TWP's and DynamicBatch's resolved constants: docs/twp.md)
                config = {"replica": rep["name"], "server": rep["server"], "scheduler": sim.scheduler.describe()}
                res = SimResult(
                    config,
                    stats,
                    arrival[sel] / NS,
                    prompt[sel],
                    output[sel],
                    classes[sel],
                )
                units = 1.0
                if stats.prefix is not None:
                    # a replica's own calls and hits (a router may send it more or fewer hits
                    # than its pool's share), admitted ones only, as `backlog_units`
                    adm = sel[queue[sel] >= 0]
                    units = _backlog_units([stats.prefix], float(self._backlog_work(adm).sum()))
                res.stability = self._replica_verdict(
                    res, rep["server"], rep.get("index", 0), units, self._min_rise(rep["server"], sel)
                )
                out.append(res)
            self._replicas = out
        return self._replicas

    def _replica_load(self, res: SimResult, server: str, index: int) -> float | None:
        """A replica's offered load over its policy's limit: its server's (`server_policy_load`)
        times the replica's share of the server's calls over the busiest replica's (the
        pool's capacity is the busiest replica's divided by its share), net of the work the
        replica's own prefix cache saved; None without a traffic report."""
        if self.traffic is None:
            return None
        srv, load = self.stats.spec.servers[server], self.traffic.server(server)
        pool = self._server_loads()[server]
        shares = srv.routing_weights()
        share = shares[index] / load.busiest_replica_share if 0 <= index < len(shares) else 1.0
        admitted = np.asarray(res.stats.queue_ns) >= 0  # (as `saved_work_share`)
        work = float((res.prompt[admitted].astype(float) + res.output[admitted] - 1).sum())
        return pool * share * (1.0 - _saved_share([res.stats.prefix], work))

    def _buffer_growth(self, server: str, time_s: np.ndarray, buffer: np.ndarray, last: float) -> dict:
        """The growth (tokens/s) of `server`'s back-pressure buffer while jobs arrive, with
        its 95% interval, fitted as a queue's verdict fits its backlog's (`_queue_verdict`);
        None when the window is too short to fit."""
        v = self._queue_verdict(
            server,
            time_s,
            buffer,
            last,
            capacity=None,
            arrivals=_a(self.stats.call_arrival)[self.server_calls()[server]] / NS,
            load=None,
        )
        return {
            "buffer_growth_tokens_per_s": v.get("backlog_growth_tokens_per_s"),
            "buffer_growth_ci": v.get("backlog_growth_ci"),
        }

    def _pool_verdict(self, server: str, time_s: np.ndarray, backlog: np.ndarray, last: float) -> dict:
        """A replicated server's verdict on its pool's backlog (its replicas' summed, as
        `network_backlog` counts it), and under back-pressure any server's, its buffer's
        work counted (the replicas' backlogs leave the buffer out), judged as
        one server with the pool's limit would be (`threshold_capacities`, `_queue_verdict`):
        its offered load over its limit (`policy_loads`: the busiest replica's), its calls'
        arrivals."""
        fills = self.threshold_capacities(server)
        return self._queue_verdict(
            server,
            time_s,
            backlog,
            last,
            # in the backlog's units (`backlog_units`; 1 without prefix caching)
            capacity=fills[1] * self.backlog_units(server) if fills is not None else None,
            arrivals=_a(self.stats.call_arrival)[self.server_calls()[server]] / NS,
            load=self.policy_loads().get(server),
            rise=self._min_rise(server, self.server_calls()[server]),
        )

    def _min_rise(self, server: str, calls: np.ndarray) -> float | None:
        """The mean work `calls` bring a queue's backlog, in its units (prompt + output - 1,
        less a `cached: true` call's handed-over context: a hit leaves the backlog only at
        admission); None for none. A verdict's `min_rise`: a fitted rise of less than one
        call over the judged window is no growth. None where `server`'s k_max binds: there
        decoders with a few tokens left each pile up in a backlog that rises slowly in
        tokens (one server judges its requests in the system then: `api._judge_requests`)."""
        srv = self.stats.spec.servers[server]
        if not len(calls) or k_max_binds(srv.b_max, srv.k_max):
            return None
        return float(self._backlog_work(calls).mean())

    def _backlog_work(self, calls: np.ndarray) -> np.ndarray:
        """The tokens each of `calls` brings its queue's backlog: prompt + output - 1, less
        a `cached: true` call's handed-over context (no backlog counts it); a prefix-cache
        hit is counted (it leaves the backlog only at admission)."""
        st = self.stats
        return _a(st.call_prompt)[calls] - _a(st.call_cached)[calls] + _a(st.call_output)[calls] - 1

    def _admitted(self, server: str) -> np.ndarray:
        """`server`'s calls that were admitted (as `saved_work_share` counts them)."""
        calls = self.server_calls().get(server, np.zeros(0, dtype=np.intp))
        return calls[_a(self.stats.call_queue)[calls] >= 0]

    def _replica_verdict(
        self, res: SimResult, server: str, index: int = 0, units: float = 1.0, rise: float | None = None
    ) -> dict:
        """A replica's verdict on its own backlog (`_queue_verdict`), against its share of
        its server's limit (`threshold_capacities`) times its backlog's `units`
        (`_backlog_units` of its own calls; 1 without prefix caching) and its own load
        (`_replica_load`); in one server's keys (`verdict_reason`, and the threshold `h` as
        `verdict_threshold_tokens_per_s`, which docs/stability.md says a summary.json
        carries), which its `SimResult.summary` carries."""
        last = _last_arrival_s(self.job_arrival_ns[self.job_arrived])
        if res.stats.n == 0 and np.isfinite(last):
            # jobs ran but none called here: no queue can grow, so leave the verdict to the others
            return {"stable": True, "verdict": STABLE, "verdict_reason": "no calls: no queue formed"}
        fills = self.threshold_capacities(server)
        ts = res.timeseries
        v = self._queue_verdict(
            server,
            ts["time_s"],
            ts["backlog_tokens"],
            last,
            capacity=fills[0] * units if fills is not None else None,
            arrivals=res.arrival_ns / NS,
            load=self._replica_load(res, server, index),
            rise=rise,
        )
        keys = (
            "stable",
            "verdict",
            "verdict_reason",
            "backlog_growth_tokens_per_s",
            "backlog_growth_ci",
            "verdict_threshold_tokens_per_s",
        )
        return {k: v[k.replace("verdict_", "")] for k in keys if k.replace("verdict_", "") in v}

    def _queue_verdict(
        self,
        server: str,
        time_s: np.ndarray,
        backlog: np.ndarray,
        last: float,
        *,
        capacity: float | None,
        arrivals: np.ndarray,
        load: float | None,
        rise: float | None = None,
    ) -> dict:
        """The verdict on one queue of `server`'s calls (a replica's backlog, or a
        replicated server's pool's), judged as one server's: while jobs arrive (up to
        `last`), against `capacity` (the threshold's scale; None when not positive), the
        short-window guard in the server's call service times, burst-scaled (`guard_time`,
        from the queue's `arrivals`), and the load (`LOAD_MARGIN`) and arrival-share
        (`MIN_ARRIVAL_SHARE`) rules on `load` and `arrivals`, and a rise of under `rise`
        (one call's mean work) over the judged window no growth (`stability_verdict`'s
        min_rise). {"verdict", "stable",
        "reason", "backlog_growth_tokens_per_s", "backlog_growth_ci",
        "threshold_tokens_per_s"}; inconclusive "too short" when the series is."""
        keep = time_s <= last  # judge while jobs arrive, not while the queues drain
        scale, time_of = self.guard_time(server, arrivals)
        try:
            v = stability_verdict(
                time_s[keep],
                backlog[keep],
                capacity=capacity if capacity and capacity > 0 else None,
                decode_time_s=scale,
                decode_of=_burst_scaled(self.burst_factors()[server], "call"),
                time_of=time_of,
                # above its policy's limit a backlog that does not grow is draining
                # (`LOAD_MARGIN`), and one whose calls thinned out in the judged window says
                # nothing (`MIN_ARRIVAL_SHARE`), as for one server
                load=load,
                arrival_times=arrivals,
                # (a rise of under one of its calls' work is no growth: light-load chance)
                min_rise=rise,
                rise_of="call",
            )
        except ConfigError as e:
            return {"verdict": INCONCLUSIVE, "stable": None, "reason": f"too short: {e}"}
        return {
            "verdict": v.verdict,
            "stable": v.stable,
            "reason": v.reason,
            "backlog_growth_tokens_per_s": v.growth_per_s,
            "backlog_growth_ci": [v.ci_low, v.ci_high],
            "threshold_tokens_per_s": v.threshold_per_s,
        }

    # ---- summary ---------------------------------------------------------------------
    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = self._make_summary()
        return self._summary

    def _make_summary(self) -> dict:
        st = self.stats
        arr, fin = self.job_arrival_ns, self.job_finish_ns
        done = fin >= 0
        arrived = self.job_arrived
        lat = (fin - arr)[done]
        first = float(arr[arrived].min()) / NS if arrived.any() else None  # None: no job arrived before max_time_s
        duration = run_duration(first, float(fin[done].max()) / NS if done.any() else None, st.end_ns / NS)
        types = _a(st.job_type)
        s = {
            "num_jobs": int(len(arr)),
            "arrived_jobs": int(arrived.sum()),
            "completed_jobs": int(done.sum()),
            "unfinished_jobs": int((~done).sum()),
            "duration": duration,
            "job_throughput": per_second(int(done.sum()), duration),
            "num_calls": int(len(st.call_arrival)),
            "steps": int(st.steps),
            "wall_s": self.wall_s,
        }
        s.update(_latency_stats("job_latency", lat))
        s["mean_calls_per_job"] = float(_a(st.job_calls)[done].mean()) if done.any() else None
        s["job_types"] = {}
        for ti, name in enumerate(st.job_type_names):
            sel = (types == ti) & done
            s["job_types"][name] = {
                "jobs": int((types == ti).sum()),
                "arrived": int(((types == ti) & arrived).sum()),
                "completed": int(sel.sum()),
                **_latency_stats("job_latency", (fin - arr)[sel]),
            }
        # (the servers' and the network's unfinished work, once: the pools' verdicts read it)
        backlog = network_backlog(self)
        last = _last_arrival_s(self.job_arrival_ns[self.job_arrived])
        servers = {}
        for res, rep in zip(self.replicas(), st.replicas):
            srv = servers.setdefault(rep["server"], {"replicas": {}})
            rs = res.summary
            srv["replicas"][rep["name"]] = {
                k: rs.get(k)
                for k in (
                    "num_requests",
                    "completed",
                    "mean_ttft_ms",
                    "p99_ttft_ms",
                    "mean_itl_ms",
                    "p99_itl_ms",
                    "itl_cv",
                    "mean_e2el_ms",
                    "p99_e2el_ms",
                    "busy_fraction",
                    "preemptions",
                    "stable",
                    "verdict",
                    "verdict_reason",
                    "backlog_growth_tokens_per_s",
                    "backlog_growth_ci",
                )
            }
            if rs.get("prefix_cache") is not None:
                srv["replicas"][rep["name"]]["prefix_cache"] = rs["prefix_cache"]
        calls_of = self.server_calls()
        e2e_all, ttft_all = _a(st.call_e2e), _a(st.call_ttft)
        for name, srv in servers.items():
            calls = calls_of[name]
            e2e = e2e_all[calls]
            ttft = ttft_all[calls]
            ok = e2e >= 0
            srv["calls"] = len(calls)
            srv["completed_calls"] = int(ok.sum())
            srv.update(_latency_stats("ttft", ttft[ok & (ttft >= 0)]))
            srv.update(_latency_stats("e2el", e2e[ok]))
            caches = [r["prefix_cache"] for r in srv["replicas"].values() if "prefix_cache" in r]
            if caches:
                srv["prefix_cache"] = merge_prefix_stats(caches)
            srv["decode_time_s"] = self.decode_times()[name]
            srv["service_time_s"] = self.service_times()[name]
            srv["burst_factor"] = self.burst_factors()[name]
            pool = None
            verdicts = [r["verdict"] for r in srv["replicas"].values()]
            buffered = name in backlog["buffers"]
            if len(srv["replicas"]) > 1 or buffered:
                # the pool's backlog: under back-pressure the server's buffer too, calls
                # routed here that no replica has taken yet, which the replicas' backlogs
                # leave out (max-pressure holds them back): a server whose buffer grows is
                # unstable, however flat its replicas' backlogs
                srv["pool_verdict"] = self._pool_verdict(name, backlog["time_s"], backlog["servers"][name], last)
                pool = srv["pool_verdict"]["verdict"]
                if buffered:
                    verdicts.append(pool)
            srv["verdict"] = _combine(verdicts, pool)
            srv["stable"] = {STABLE: True, UNSTABLE: False}.get(srv["verdict"])
            if buffered:  # how fast the buffer alone grew over the same judged window
                srv.update(self._buffer_growth(name, backlog["time_s"], backlog["buffers"][name], last))
            if self.traffic is not None:
                load = self.traffic.server(name)
                srv.update(
                    offered_tokens_per_s=load.offered_tokens_per_s,
                    capacity_tokens_per_s=load.capacity,
                    utilisation=load.utilisation,
                    fill_capacity_tokens_per_s=load.fill_capacity,
                    fill_utilisation=load.fill_utilisation,
                )
            if "prefix_cache" in srv:
                # the traffic equations count every prompt token as work; the run measured
                # the share of this server's work its caches saved (hits at first admission:
                # a preempted call re-hitting its own blocks saves only its recomputation)
                share = self.saved_work_share(name)
                srv["prefix_saved_work_share"] = share
                if self.traffic is not None:
                    srv["utilisation_net_of_hits"] = srv["utilisation"] * (1.0 - share)
        s["servers"] = servers
        caches = [srv["prefix_cache"] for srv in servers.values() if "prefix_cache" in srv]
        if caches:
            s["prefix_cache"] = merge_prefix_stats(caches)
        class_calls = self.class_calls()
        s["classes"] = {}
        for cls in st.spec.call_classes():
            sel = class_calls[cls]
            e2e, ttft = e2e_all[sel], ttft_all[sel]
            ok = e2e >= 0
            s["classes"][cls] = {
                "calls": len(sel),
                "completed": int(ok.sum()),
                **_latency_stats("ttft", ttft[ok & (ttft >= 0)]),
                **_latency_stats("e2el", e2e[ok]),
            }
        if self.traffic is not None:
            s["bottleneck"] = self.traffic.bottleneck
            s["max_utilisation"] = self.traffic.max_utilisation
            s["critical_scale"] = self.traffic.critical_scale
            s["critical_scale_exact"] = self.traffic.critical_scale_exact
            s["max_critical_scale"] = self.traffic.max_critical_scale
            s["traffic_stable"] = self.traffic.stable
        # a network whose routes cycle through servers can oscillate between servers whose own
        # backlogs show no steady slope (Rybko-Stolyar): there the network's total unfinished
        # work (calls still to come included) is judged too; feed-forward networks are stable
        # when every server is, but under back-pressure a server's calls wait in buffers its
        # replicas' backlogs leave out (the network's work counts them)
        work = backlog["verdict"]
        s["network_work_verdict"] = work
        verdicts = [srv["verdict"] for srv in servers.values()]
        if (self.traffic is not None and self.traffic.cycle) or st.spec.control == "backpressure":
            verdicts.append(work["verdict"])
        s["verdict"] = _combine(verdicts)
        s["stable"] = {STABLE: True, UNSTABLE: False}.get(s["verdict"])
        return s

    # ---- files -----------------------------------------------------------------------
    @writes_alone("simulate")
    def write(self, out_dir: str | os.PathLike) -> Path:
        check_out_dir(out_dir)  # a file there, an unwritable folder: one line, not an OSError
        check_inputs_not_replaced(out_dir, "network", self.config)
        out = make_run_dir(out_dir)
        clear_other_run(out, "network")
        st = self.stats
        summary = to_jsonable(self.summary)  # (before the earlier run's files go)
        # the earlier run's files (its replicas' folders too) go first, summary.json (the
        # run's proof) comes last: a write that stops never leaves a folder mixing two runs
        begin_simulate_write(out, "network")
        write_file(out / "config.json", lambda f: json.dump(to_jsonable(self.config), f, indent=2))
        arr, fin = self.job_arrival_ns, self.job_finish_ns
        done, arrived = fin >= 0, self.job_arrived
        lat = np.where(done, fin - arr, -1)
        type_names = list(st.job_type_names)
        types, calls_per_job = _a(st.job_type), _a(st.job_calls)
        write_file(
            out / "jobs.csv",
            lambda f: write_csv(
                f,
                "job,type,arrival_s,finish_s,latency_s,calls,arrived,finished",
                len(arr),
                lambda lo, hi: [
                    IntField(np.arange(lo, hi)),
                    names_field(type_names, types[lo:hi]),
                    seconds_field(arr[lo:hi]),
                    seconds_field(fin[lo:hi]),
                    seconds_field(lat[lo:hi]),
                    IntField(calls_per_job[lo:hi]),
                    IntField(arrived[lo:hi].astype(np.int64)),
                    IntField(done[lo:hi].astype(np.int64)),
                ],
            ),
        )
        e2e = _a(st.call_e2e)
        reps = [r["name"] for r in st.replicas] + [""]  # the last: a call no replica took
        rep_idx = _a(st.call_replica)
        rep_codes = np.where(rep_idx >= 0, rep_idx, len(reps) - 1)
        classes, class_codes = _codes(st.call_class)
        servers_of, server_codes = _codes(st.call_server)
        job, arrival, prompt, output = _a(st.call_job), _a(st.call_arrival), _a(st.call_prompt), _a(st.call_output)
        queue, ttft, preempt = _a(st.call_queue), _a(st.call_ttft), _a(st.call_preempt)
        write_file(
            out / "calls.csv",
            lambda f: write_csv(
                f,
                "call,job,class,server,replica,arrival_s,prompt_tokens,output_tokens,queue_s,ttft_s,e2e_s,"
                "preemptions,finished",
                len(e2e),
                lambda lo, hi: [
                    IntField(np.arange(lo, hi)),
                    IntField(job[lo:hi]),
                    names_field(classes, class_codes[lo:hi]),
                    names_field(servers_of, server_codes[lo:hi]),
                    names_field(reps, rep_codes[lo:hi]),
                    seconds_field(arrival[lo:hi]),
                    IntField(prompt[lo:hi]),
                    IntField(output[lo:hi]),
                    seconds_field(queue[lo:hi]),
                    seconds_field(ttft[lo:hi]),
                    seconds_field(e2e[lo:hi]),
                    IntField(preempt[lo:hi]),
                    IntField((e2e[lo:hi] >= 0).astype(np.int64)),
                ],
            ),
        )
        servers = out / "servers"  # (an older run's replicas: removed by begin_simulate_write)
        for res, rep in zip(self.replicas(), st.replicas):
            res.write(servers / rep["name"])
        end_simulate_write(out, lambda p: p.write_text(json.dumps(summary, indent=2)))
        return out


def _codes(values) -> tuple[list[str], np.ndarray]:
    """The distinct strings of `values` and each value's index among them: exactly
    `np.unique(np.asarray(values, dtype=str), return_inverse=True)`, with the sort over the
    distinct values only (a dict look-up per value, not a sort of every call's string)."""
    distinct = list(dict.fromkeys(values))
    names, inverse = np.unique(np.asarray(distinct, dtype=str), return_inverse=True)
    code = dict(zip(distinct, inverse.reshape(-1).tolist()))
    return names.tolist(), np.fromiter(map(code.__getitem__, values), dtype=np.intp, count=len(values))


__all__ = ["NetworkResult", "decode_time_s", "merge_prefix_stats", "simulate_network"]


def warn_implausible_servers(spec) -> None:
    """What one server's run warns of, for each server: a block size without its prefix
    cache, a cost model whose steps are faster than any GPU's (once per cost model)."""
    for name, server in spec.servers.items():
        if not server.prefix_caching and server.block_size != DEFAULT_BLOCK_SIZE:
            warn_block_size_unused([server.block_size], f"servers.{name}: ", "prefix_caching: true")
    for label in dict.fromkeys(server.cost_model for server in spec.servers.values()):
        warn_fast_steps(make_cost_model(label), label)


def warn_profile_reach_servers(stats: NetworkStats) -> None:
    """One server's warning of a profile used more than twice past its grid, for each server
    of a network after its run: at its `b_max`, at the decode batch its cap allows (else the
    largest one a replica ran) and at the longest context of its calls (prompt + output - 1).
    Once per distinct message; a server that got no call is not judged."""
    spec = stats.spec
    costs = {name: make_cost_model(server.cost_model) for name, server in spec.servers.items()}
    measured = [name for name, cost in costs.items() if hasattr(cost, "extrapolation")]
    if not measured:  # (no pass over the calls for the formula models)
        return
    calls = group_indices(stats.call_server, measured)
    need = _a(stats.call_prompt) + _a(stats.call_output) - 1
    ran: dict[str, int] = {}  # the largest decode batch each server's replicas ran
    for rep in stats.replicas:
        hist = rep["sim"].batch_hist
        ran[rep["server"]] = max(ran.get(rep["server"], 0), max(hist, default=0))
    said: set[str] = set()
    for name in measured:
        server = spec.servers[name]
        if not len(calls[name]):
            continue
        caps = [x for x in (server.k_max, server.max_running) if x]
        batch = min(caps) if caps else ran.get(name, 0)
        warn_past_grid(costs[name], server.b_max, batch, int(need[calls[name]].max()), ran=True, said=said)


def simulate_network(
    network,
    *,
    out_dir: str | os.PathLike | None = None,
    fast: bool | None = None,
    max_time_s: float | None = None,
    sample_interval_s: float | None = None,
    scale: float | None = None,
    num_jobs: int | None = None,
    seed: int | None = None,
    progress=None,
    **unknown,
) -> NetworkResult:
    """Simulate a network (a `NetworkSpec`, a dict, or a YAML path); with `out_dir`, also
    write its files. `scale` multiplies every arrival rate; `num_jobs` and `seed` override
    the file's. `fast`, `max_time_s` and `sample_interval_s` left out (None) are the
    file's (`run:`, which a run's config.json records; default: fast, no limit, the
    automatic interval)."""
    check_run_switches(True if fast is None else fast, progress, unknown, simulate_network)
    max_time_s = check_seconds("max_time_s", max_time_s)
    sample_interval_s = check_sample_interval(sample_interval_s)
    if out_dir is not None:
        check_out_dir(out_dir)  # before the run, not after it
        check_run_dir(out_dir, "network")  # not over another run's or the user's files, before the run
    spec = load_network(network)
    # the run's options: those given, else the file's; config.json records them
    given = {"max_time_s": max_time_s, "sample_interval_s": sample_interval_s, "fast": fast}
    run = {**spec.run, **{k: v for k, v in given.items() if v is not None}}
    # a copy, not the caller's: its servers and jobs too (the summary reads the servers'
    # b_max, policies and weights when first asked: a caller's edit after the call changed it)
    spec = replace(spec, servers=copy.deepcopy(spec.servers), jobs=copy.deepcopy(spec.jobs), run=run)
    check_schedulers(spec, network)  # before the run, naming the server and the file
    warn_implausible_servers(spec)
    if out_dir is not None:  # (a length table in out_dir named requests.csv: the run would replace it)
        check_inputs_not_replaced(out_dir, "network", spec.to_dict())
    if scale is not None:
        factor = as_real(scale)
        if factor is None or not factor > 0:
            raise ConfigError(f"scale must be a positive number, got {scale!r}")
        scale = factor
        spec = spec.scaled(scale)
    if num_jobs is not None or seed is not None:
        spec = spec.with_run(num_jobs=num_jobs, seed=seed)  # checked; the caller's spec unchanged
    # a file's errors found here (not while reading it) are named with it, as its other errors are
    where = f"{os.path.basename(os.fspath(network))}: " if isinstance(network, (str, os.PathLike)) else ""
    if spec.num_jobs is None and spec.duration_s is None:
        raise ConfigError(f"{where}give num_jobs or duration_s to stop the job arrivals")
    t0 = time.perf_counter()
    try:
        stats = run_network(spec, progress=progress)  # (the run's options: spec.run)
    except CallOverCapacity as e:
        if spec.kv_capacity_from is not None:  # (a cluster's command line names its flag instead)
            raise e.named(spec.kv_capacity_from, f"request {e.job}") from None
        if not where:
            raise
        raise ConfigError(f"{where}{e}") from None
    wall = time.perf_counter() - t0
    warn_profile_reach_servers(stats)
    result = NetworkResult(stats, traffic(spec), spec.to_dict(), wall_s=wall)
    if out_dir is not None:
        result.write(out_dir)
    return result
