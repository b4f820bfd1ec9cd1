"""A serverless run's results: per model and overall metrics, per-instance records, files.

`write(out)` lays out:
- `summary.json`: overall and per model: requests, completed, request throughput, TTFT
  mean/p50/p95/p99, ITL mean/p99/CV, e2e latency mean/p99, cold starts (count of those
  that finished, total and mean time, loads finished per storage tier; instances still
  starting at a time limit counted apart), GPU-seconds (time instances held GPUs, loading and
  keep-alive included), busy GPU-seconds, instances used and peak concurrent instances,
  migrations; with per-request objectives (`slo`), goodput and its share;
- `config.json`: the platform as parsed (`cluster`, `models`, `workload`, `platform`)
  and the run's options (`run`: `max_time_s`, `fast`, `slo`, as the run used them; `slo`
  the summary's where `r.slo` was set after the run, the run's then under
  `provenance.slo_of_run`, which a rerun ignores): reproduces the run; and `schedulers`:
  each model's scheduler as it ran, its admission policy's derived constants included
  (`admission.resolved` for TWP, as a single-server run's `scheduler`; ignored when the
  file is read back);
- `requests.csv`: `id,model,instance,arrival_s,prompt_tokens,output_tokens,queue_s,ttft_s,
  tpot_s,e2e_s,preemptions,migrations,cold_start,arrived,finished` (instance: the one that
  finished it, or where it was last; cold_start 1 if it waited for an instance to start;
  arrived 0 for a request after a `max_time_s` stop; tpot_s rounded up to the ns, as
  goodput compares it);
- `instances.csv`: one row per instance: where it ran, when it was created, got its GPU,
  loaded (and from which tier), became ready and stopped (and why), requests routed and
  completed, steps, busy time, GPU-seconds, mean ITL.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..core.checks import check_run_switches
from ..core.cost import make_cost_model, warn_fast_steps, warn_past_grid
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.paths import (
    begin_simulate_write,
    check_out_dir,
    check_run_dir,
    end_simulate_write,
    make_run_dir,
    writes_alone,
)
from ..core.request import NS, check_seconds
from ..core.slo import check_request_slo
from ..workload.serverless import RunOptions, ServerlessSpec, load_serverless, make_serverless_requests
from .csv_rows import IntField, names_field, seconds_field, time_text, write_csv, write_file
from .histogram import GapHistogram
from .result import (
    SloAfterRun,
    _seconds,
    _tpot,
    check_inputs_not_replaced,
    clear_other_run,
    goodput,
    meets_slo,
    per_second,
    run_duration,
    tpot_ceil_ns,
)
from .serverless import ServerlessStats, check_requests, check_schedulers, run_serverless

REQUEST_COLUMNS = (
    "id",
    "model",
    "instance",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "queue_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "preemptions",
    "migrations",
    "cold_start",
    "arrived",
    "finished",
)
INSTANCE_COLUMNS = (
    "instance",
    "model",
    "node",
    "gpu",
    "created_s",
    "gpu_from_s",
    "load_start_s",
    "loaded_s",
    "ready_s",
    "stop_s",
    "tier",
    "cold_start_s",
    "stop_reason",
    "routed",
    "completed",
    "migrated_out",
    "steps",
    "busy_s",
    "gpu_seconds",
    "mean_itl_ms",
    "admission",
    "kv_capacity",
)


def _pct(ms: np.ndarray, name: str, ps=(50, 95, 99)) -> dict:
    if not len(ms):
        return {f"mean_{name}_ms": None, **{f"p{p}_{name}_ms": None for p in ps}}
    out = {f"mean_{name}_ms": float(ms.mean())}
    for p, v in zip(ps, np.percentile(ms, ps)):
        out[f"p{p}_{name}_ms"] = float(v)
    return out


def _itl(h: GapHistogram) -> dict:
    if not h.count:
        return {"mean_itl_ms": None, "p50_itl_ms": None, "p99_itl_ms": None, "itl_cv": None, "itl_count": 0}
    p50, p99 = h.percentiles((50, 99))
    return {
        "mean_itl_ms": h.mean / 1e6,
        "p50_itl_ms": p50 / 1e6,
        "p99_itl_ms": p99 / 1e6,
        "itl_cv": h.std / h.mean,
        "itl_count": int(h.count),
    }


def _peak(intervals: list[tuple[int, int]]) -> int:
    """Most intervals [start, stop) open at once."""
    marks = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda x: (x[0], x[1]))
    peak = cur = 0
    for _, d in marks:
        cur += d
        peak = max(peak, cur)
    return peak


class ServerlessResult(SloAfterRun):
    """What `simulate_serverless` returns. `r.slo = {...}` after the run reports goodput
    under those limits (checked as `slo=` is); `write` then records them as config.json's
    `run.slo`, the run's own under `provenance.slo_of_run` (the objectives only measure: the
    steps are the same)."""

    def __init__(self, stats: ServerlessStats, config: dict, wall_s: float = 0.0, slo: dict | None = None):
        self.stats = stats
        self.config = config
        self.wall_s = wall_s
        # per-request objectives in ms (ttft_ms, tpot_ms, itl_ms, e2el_ms): goodput, overall and per model
        self.slo = dict(slo or {})
        self._summary: dict | None = None

    # ---- per request (seconds; NaN where not reached) ----------------------------------
    def _s(self, ns: np.ndarray) -> np.ndarray:
        return _seconds(ns)

    @property
    def finished(self) -> np.ndarray:
        return self.stats.e2e_ns >= 0

    @property
    def ttft_s(self) -> np.ndarray:
        return self._s(self.stats.ttft_ns)

    @property
    def e2e_s(self) -> np.ndarray:
        return self._s(self.stats.e2e_ns)

    @property
    def tpot_s(self) -> np.ndarray:
        """Each request's mean inter-token gap (NaN unless it finished with 2+ tokens)."""
        return _tpot(self.finished, self.stats.output, self.e2e_s, self.ttft_s)

    @property
    def model(self) -> np.ndarray:
        """Each request's model name."""
        return np.asarray(self.stats.models, dtype=object)[self.stats.req_model]

    @property
    def instances(self) -> list[dict]:
        """One record per instance (times in ns, as instances.csv in seconds)."""
        return self.stats.instances

    # ---- summary -------------------------------------------------------------------------
    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = self._make_summary()
        return self._summary

    def _block(self, sel: np.ndarray, itl: GapHistogram, rows: list[dict], duration: float, slo_ok) -> dict:
        """The summary of the requests `sel` selects; `slo_ok`: `meets_slo` over every
        request (None without objectives)."""
        st = self.stats
        done = sel & self.finished
        ttft = st.ttft_ns[done & (st.ttft_ns >= 0)] / 1e6
        e2e = st.e2e_ns[done] / 1e6
        out = {
            "num_requests": int(sel.sum()),
            "arrived": int((sel & st.arrived).sum()),
            "completed": int(done.sum()),
            "unfinished": int(sel.sum() - done.sum()),
            "request_throughput": per_second(int(done.sum()), duration),
            "output_throughput": per_second(int(st.output[done].sum()), duration),
        }
        out.update(_pct(ttft, "ttft"))
        out.update(_itl(itl))
        e = _pct(e2e, "e2el", (50, 99))
        out.update(e)
        if slo_ok is not None:
            out.update(goodput(slo_ok & sel, done, duration))
        cold = [r for r in rows if r["ready_ns"] >= 0]
        cold_ns = [r["ready_ns"] - r["created_ns"] for r in cold]
        gpu_ns = [r["stop_ns"] - r["gpu_from_ns"] for r in rows if r["gpu_from_ns"] >= 0]
        busy = sum(r["busy_ns"] for r in rows)
        out.update(
            {
                "cold_starts": len(cold),
                "cold_starts_unfinished": len(rows) - len(cold),
                "cold_start_time_s": sum(cold_ns) / NS,
                "mean_cold_start_s": (sum(cold_ns) / len(cold_ns) / NS) if cold_ns else None,
                "max_cold_start_s": (max(cold_ns) / NS) if cold_ns else None,
                "requests_waiting_cold_start": int((st.cold.astype(bool) & sel).sum()),
                "loads_by_tier": {
                    t: sum(1 for r in rows if r["tier"] == t and r["loaded_ns"] >= 0) for t in ("dram", "ssd", "remote")
                },
                "gpu_seconds": sum(gpu_ns) / NS,
                "busy_gpu_seconds": busy / NS,
                "gpu_busy_fraction": (busy / sum(gpu_ns)) if sum(gpu_ns) else None,
                "instances_used": len(rows),
                "peak_instances": _peak([(r["gpu_from_ns"], r["stop_ns"]) for r in rows if r["gpu_from_ns"] >= 0]),
                "migrations": int(st.migrations[sel].sum()),
                "preemptions": int(st.preemptions[sel].sum()),
            }
        )
        return out

    def _make_summary(self) -> dict:
        st = self.stats
        spec: ServerlessSpec = st.spec
        done = self.finished
        first = float(st.arrival_ns.min()) / NS if len(st.arrival_ns) else None
        last = float((st.arrival_ns + st.e2e_ns)[done].max()) / NS if done.any() else None
        duration = run_duration(first, last, st.end_ns / NS)
        everyone = np.ones(len(st.arrival_ns), dtype=bool)
        s = {
            "scheduler": spec.platform.scheduler,
            "router": spec.platform.routing,
            "gpus": spec.num_gpus,
            "duration": duration,
        }
        slo_ok = None
        if self.slo:
            s["slo"] = dict(self.slo)
            slo_ok = meets_slo(self.slo, done, st.ttft_ns, st.e2e_ns, st.output)
        s.update(self._block(everyone, st.itl, st.instances, duration, slo_ok))
        s["peak_gpus_in_use"] = int(st.peak_gpus)
        s["migrated_tokens"] = int(st.migrated_tokens)
        s["steps"] = int(st.steps)
        s["sim_end_s"] = st.end_ns / NS
        s["wall_s"] = self.wall_s
        s["models"] = {}
        for i, name in enumerate(st.models):
            rows = [r for r in st.instances if r["model"] == name]
            block = {
                "admission": spec.admission(name),
                "max_instances": spec.max_instances(name),
                "kv_capacity": {g.name: spec.kv_capacity(name, g) for g in spec.nodes if spec.fits(name, g)},
            }
            block.update(self._block(st.req_model == i, st.model_itl[name], rows, duration, slo_ok))
            s["models"][name] = block
        return s

    # ---- files ---------------------------------------------------------------------------
    @writes_alone("simulate")
    def write(self, out_dir: str | os.PathLike) -> Path:
        check_out_dir(out_dir)  # a file there, an unwritable folder: one line, not an OSError
        check_inputs_not_replaced(out_dir, "serverless", self.config)
        out = make_run_dir(out_dir)
        clear_other_run(out, "serverless")
        summary = to_jsonable(self.summary)  # (before the earlier run's files go)
        # the earlier run's files go first, summary.json (the run's proof) comes last: a
        # write that stops never leaves a folder that mixes two runs
        begin_simulate_write(out, "serverless")
        config, _ = self._slo_config(self.config, "run")  # the summary's SLO
        write_file(out / "config.json", lambda f: json.dump(to_jsonable(config), f, indent=2))
        write_file(out / "requests.csv", self._write_requests)
        write_file(out / "instances.csv", self._write_instances)
        end_simulate_write(out, lambda p: p.write_text(json.dumps(summary, indent=2)))
        return out

    def _write_requests(self, f, block: int = 1 << 16) -> None:
        """requests.csv, `block` rows at a time (memory stays flat), each block's text
        built as one byte matrix (`csv_rows.format_rows`)."""
        st = self.stats

        def fields(lo: int, hi: int) -> list:
            sl = slice(lo, hi)
            e2e, ttft, out = st.e2e_ns[sl], st.ttft_ns[sl], st.output[sl]
            tpot = tpot_ceil_ns(out, e2e, ttft)
            inst = st.instance[sl]
            return [
                IntField(np.arange(lo, hi)),
                names_field(st.models, st.req_model[sl]),
                IntField(inst, inst >= 0),
                seconds_field(st.arrival_ns[sl]),
                IntField(st.prompt[sl]),
                IntField(out),
                seconds_field(st.queue_ns[sl]),
                seconds_field(ttft),
                seconds_field(tpot),
                seconds_field(e2e),
                IntField(st.preemptions[sl]),
                IntField(st.migrations[sl]),
                IntField(st.cold[sl]),
                IntField(st.arrived[sl].astype(np.int64)),
                IntField((e2e >= 0).astype(np.int64)),
            ]

        write_csv(f, ",".join(REQUEST_COLUMNS), len(st.arrival_ns), fields, block)

    def _write_instances(self, f) -> None:
        f.write(",".join(INSTANCE_COLUMNS) + "\n")
        for r in self.stats.instances:
            cold = r["ready_ns"] - r["created_ns"] if r["ready_ns"] >= 0 else -1
            gpu = r["stop_ns"] - r["gpu_from_ns"] if r["gpu_from_ns"] >= 0 else -1
            itl = "" if r["itl_mean_ns"] is None else f"{r['itl_mean_ns'] / 1e6:.6f}"
            vals = [
                r["instance"],
                r["model"],
                r["node"],
                r["gpu"],
                time_text(r["created_ns"]),
                time_text(r["gpu_from_ns"]),
                time_text(r["load_start_ns"]),
                time_text(r["loaded_ns"]),
                time_text(r["ready_ns"]),
                time_text(r["stop_ns"]),
                r["tier"],
                time_text(cold),
                r["stop_reason"],
                r["routed"],
                r["completed"],
                r["migrated_out"],
                r["steps"],
                time_text(r["busy_ns"]),
                time_text(gpu),
                itl,
                r["admission"],
                "" if r["kv_capacity"] is None else r["kv_capacity"],
            ]
            f.write(",".join(str(v) for v in vals) + "\n")


def simulate_serverless(
    config,
    out_dir: str | os.PathLike | None = None,
    *,
    scheduler: str | None = None,
    fast: bool | None = None,
    max_time_s: float | None = None,
    scale: float | None = None,
    num_requests: int | None = None,
    seed: int | None = None,
    slo: dict | None = None,
    progress=None,
    **unknown,
) -> ServerlessResult:
    """Simulate a serverless platform (a `ServerlessSpec`, a mapping, or a YAML path); with
    `out_dir`, also write its files. `scheduler` replaces the platform scheduler (fcfs,
    round-robin, priority, dynamicbatch, twp, serverlessllm), `scale` multiplies every
    arrival rate, `num_requests` and `seed` override the workload's. `slo`: per-request
    objectives in ms (`ttft_ms`, `tpot_ms`, `itl_ms`, `e2el_ms`, as `simulate(slo=...)`):
    the summary reports goodput overall and per model (TWP's ITL target stays the
    platform file's). `fast`, `max_time_s` and `slo` left out (None) are the file's
    (`run:`, which a run's config.json records; default: fast, no limit, no objectives)."""
    check_run_switches(True if fast is None else fast, progress, unknown, simulate_serverless)
    for name, v in (("scale", scale), ("num_requests", num_requests), ("seed", seed)):
        if isinstance(v, (str, bytes)):  # as simulate's number options: a number, not its text
            raise ConfigError(f"{name} must be a number, got {v!r:.60}")
    max_time_s = check_seconds("max_time_s", max_time_s)
    slo = check_request_slo(slo) if slo else {}
    if out_dir is not None:
        check_out_dir(out_dir)  # before the run, not after it
        check_run_dir(out_dir, "serverless")  # not over another run's or the user's files
    # a copy of a caller's spec, whole: the summary reads its platform, models and nodes when
    # first asked (an edit after the call, e.g. the next scheduler of a loop, changed it)
    spec = copy.deepcopy(config) if isinstance(config, ServerlessSpec) else load_serverless(config)
    if any(v is not None for v in (scheduler, scale, num_requests, seed)):
        spec = spec.replaced(scheduler=scheduler, scale=scale, num_requests=num_requests, seed=seed)
    # the run's options: those given, else the file's; config.json records them
    given = spec.run
    run = RunOptions(
        max_time_s=given.max_time_s if max_time_s is None else max_time_s,
        fast=given.fast if fast is None else fast,
        slo=slo or dict(given.slo),
    )
    spec = replace(spec, run=run)  # (not the caller's spec: a copy with these options)
    if out_dir is not None:  # (its trace in out_dir named requests.csv: the run would replace it)
        check_inputs_not_replaced(out_dir, "serverless", spec.to_dict())
    try:
        check_schedulers(spec)  # policy names and options: the file's errors, as load_serverless's
        reqs = make_serverless_requests(spec)  # its trace's, and requests its KV caches cannot hold
        check_requests(spec, reqs)
    except ConfigError as e:
        if isinstance(config, (str, os.PathLike)):
            raise ConfigError(f"{Path(config).name}: {e}") from None
        raise
    for label in dict.fromkeys(m.cost_model for m in spec.models.values()):
        warn_fast_steps(make_cost_model(label), label)  # (as one server's run does)
    said: set[str] = set()  # a profile far past its grid, as one server's run says it (before the run)
    need = reqs.prompt + reqs.output - 1
    for i, name in enumerate(reqs.models):
        mine = need[reqs.model == i]
        if len(mine):
            m = spec.models[name]
            warn_past_grid(make_cost_model(m.cost_model), m.b_max, m.k_max or 0, int(mine.max()), said=said)
    t0 = time.perf_counter()
    stats = run_serverless(
        spec, fast=run.fast, max_time_s=run.max_time_s, requests=reqs, progress=progress, check=False
    )
    wall = time.perf_counter() - t0
    result = ServerlessResult(stats, {**spec.to_dict(), "schedulers": stats.schedulers}, wall_s=wall, slo=run.slo)
    if out_dir is not None:
        result.write(out_dir)
    return result


__all__ = ["ServerlessResult", "simulate_serverless"]
