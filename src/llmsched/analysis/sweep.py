"""Parameter sweeps of `llmsched.simulate`: grids, parallel backends, resumable storage,
a tidy results table, figures, and rate searches (maximum stable rate, maximum rate
meeting SLOs).

- A grid maps option names to lists of values (`parse_grid(["policy=sarathi,orca",
  "rate=1:20:20", "seed=0,1"])`); its points are the cartesian product. Any option of
  `simulate` can be a grid key (configuration fields such as `policy`, `b_max`, `k_max`,
  `cost_model`, `max_time_s`, and workload fields such as `rate`, `prompt`, `output`,
  `num_requests`, `seed`, `arrival`), plus `load`: the rate as a fraction of the
  theoretical critical rate lambda* of the point's configuration
  (`analysis.capacity`; workload means by sampling, `analysis.means`).
- Every point is keyed by a hash of its full resolved configuration; its summary is
  stored in `OUT/points/KEY.json` the moment it finishes, so a rerun skips finished
  points (resume) and a different sweep sharing points reuses them.
- Backends: `local` (a process pool of `workers`, inline for one worker) and `ray`
  (`address` of an existing cluster, or a local Ray started for the sweep).
- Outputs: `results.csv` and `results.parquet` (one row per point: grid values, the
  configuration columns, every scalar summary metric), `throughput.png`,
  `latency.png`, `max_stable_rate.png`; with a search also `search.csv`/`search.json`.

The adaptive policy gets the run's cost model from the simulator; for a context-dependent
model it also needs the workload means, which a point whose policy is plain `adaptive` gets
filled in.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable

__all__ = ["parse_grid", "parse_values", "expand_grid", "resolve_point", "point_key", "run_sweep",
           "max_stable_rate", "SweepResult", "grid_keys", "parse_slo"]

KEY_VERSION = "llmsched-sweep-1"
NON_GROUP_KEYS = ("rate", "load", "seed")
_SLO_RE = re.compile(r"^(mean|median|std|p90|p95|p99|max)_(ttft|tpot|itl|e2el|queue)_ms$|^itl_cv$")


def _config_keys() -> set[str]:
    from ..api import _CONFIG_KEYS, _WORKLOAD_KEYS  # noqa: PLC0415

    return (set(_CONFIG_KEYS) | set(_WORKLOAD_KEYS)) - {"workload"}


def grid_keys() -> list[str]:
    """Names a grid (or a fixed value) may set."""
    return sorted(_config_keys() | {"load"})


# ---------------------------------------------------------------------------------------
# grid specs

def _scalar(text: str):
    t = text.strip()
    if t.lower() in ("none", "null"):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    try:
        v = json.loads(t)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v
    except json.JSONDecodeError:
        pass
    return t


def parse_values(key: str, text: str) -> list:
    """The values of one grid key: `a,b,c` (a list; use `|` instead of `,` when a value
    itself holds commas, e.g. cost models `paper:c=11,a=35|paper`), or `LO:HI:N`, N
    evenly spaced numbers from LO to HI (N >= 1; integers when the key is an integer
    option and the values are whole)."""
    text = text.strip()
    if not text:
        raise ConfigError(f"grid {key}: no values given")
    m = re.fullmatch(r"\s*([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)\s*", text)
    if m:
        try:
            lo, hi = float(m.group(1)), float(m.group(2))
            n = float(m.group(3))
        except ValueError:
            raise ConfigError(f"grid {key}: cannot read range {text!r} (use LO:HI:N)") from None
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ConfigError(f"grid {key}: range ends must be finite numbers, got {text!r}")
        if n != int(n) or n < 1:
            raise ConfigError(f"grid {key}: the number of points in {text!r} must be a whole number >= 1")
        n = int(n)
        if n == 1 and lo != hi:
            raise ConfigError(f"grid {key}: {text!r} asks for 1 point between two different ends")
        if n > 100_000:
            raise ConfigError(f"grid {key}: {n} points is too many")
        vals = [lo] if n == 1 else [lo + (hi - lo) * i / (n - 1) for i in range(n)]
        vals = [round(v, 12) for v in vals]
        if key in ("b_max", "k_max", "kv_capacity", "max_running", "num_requests", "seed"):
            if any(v != int(v) for v in vals):
                raise ConfigError(f"grid {key}: range {text!r} gives non-integer values")
            vals = [int(v) for v in vals]
        return vals
    sep = "|" if "|" in text else ","
    parts = [p.strip() for p in text.split(sep)]
    if any(p == "" for p in parts):
        raise ConfigError(f"grid {key}: empty value in {text!r}")
    return [_scalar(p) for p in parts]


def parse_grid(items: Iterable[str] | dict | None) -> dict[str, list]:
    """`["policy=sarathi,orca", "rate=1:20:20"]` (or a mapping of key -> list) into an
    ordered {key: [values]}. ConfigError on a bad spec, an unknown or repeated key."""
    if items is None:
        return {}
    known = set(grid_keys())
    out: dict[str, list] = {}
    pairs = []
    if isinstance(items, dict):
        for k, v in items.items():
            vals = list(v) if isinstance(v, (list, tuple)) else parse_values(str(k), str(v))
            pairs.append((str(k), vals))
    else:
        for item in items:
            if not isinstance(item, str) or "=" not in item:
                raise ConfigError(f"grid spec must be KEY=VALUES (e.g. rate=1:20:20 or policy=sarathi,orca), got {item!r}")
            k, v = item.split("=", 1)
            k = k.strip().replace("-", "_")
            if not k:
                raise ConfigError(f"grid spec {item!r} has no key")
            pairs.append((k, None if k not in known else parse_values(k, v)))
    for k, vals in pairs:
        k = k.replace("-", "_")
        if k not in known:
            raise ConfigError(f"unknown grid key {k!r} (known: {', '.join(sorted(known))})")
        if k in out:
            raise ConfigError(f"grid key {k!r} given twice")
        if not vals:
            raise ConfigError(f"grid {k}: no values")
        if k == "load" and any(not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 for v in vals):
            raise ConfigError("grid load: values must be positive numbers (fractions of the critical rate)")
        out[k] = vals
    if "rate" in out and "load" in out:
        raise ConfigError("grid: give either rate or load (a fraction of the critical rate), not both")
    return out


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """The cartesian product of a grid, in order (the last key varies fastest)."""
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def parse_slo(items: Iterable[str] | dict | None) -> dict[str, float]:
    """`["p99_itl_ms=100", "median_ttft_ms=2000"]` into {metric: upper limit}."""
    if not items:
        return {}
    pairs = items.items() if isinstance(items, dict) else []
    if not isinstance(items, dict):
        pairs = []
        for item in items:
            if "=" not in item:
                raise ConfigError(f"SLO must be METRIC=LIMIT (e.g. p99_itl_ms=100), got {item!r}")
            k, v = item.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out = {}
    for k, v in pairs:
        if not _SLO_RE.match(k):
            raise ConfigError(f"unknown SLO metric {k!r} (use e.g. p99_itl_ms, median_ttft_ms, p99_tpot_ms, "
                              "mean_e2el_ms, itl_cv)")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO {k}: limit must be a number, got {v!r}") from None
        if not (math.isfinite(f) and f > 0):
            raise ConfigError(f"SLO {k}: limit must be a positive number, got {v!r}")
        out[k] = f
    return out


# ---------------------------------------------------------------------------------------
# points

def critical_rate_of(cfg) -> float:
    """Theoretical critical rate lambda* (requests/s) of a SimConfig."""
    from ..theory import workload_means  # noqa: PLC0415

    mp, mo = workload_means(cfg.workload)
    if not isinstance(cfg.cost_model, str):
        return _critical_rate.__wrapped__(cfg.cost_model, cfg.b_max, cfg.k_max, mp, mo)
    return _critical_rate(cfg.cost_model, cfg.b_max, cfg.k_max, mp, mo)


@lru_cache(maxsize=1024)
def _critical_rate(cost_model: str, b_max: int, k_max, mp: float, mo: float) -> float:
    from ..theory import capacity  # noqa: PLC0415

    return capacity(cost_model, b_max, mp, mo, k_max=k_max).critical_rate


def _fill_adaptive(cfg) -> None:
    base, _, rest = str(cfg.policy).partition(":")
    if base.strip().lower() != "adaptive":
        return
    from ..core.cost import make_cost_model  # noqa: PLC0415

    if not make_cost_model(cfg.cost_model).load_only and "mean_prompt=" not in rest:
        from ..theory import workload_means  # noqa: PLC0415

        mp, mo = workload_means(cfg.workload)
        opts = [rest] if rest.strip() else []
        opts.append(f"mean_prompt={mp:.6g},mean_output={mo:.6g}")
        cfg.policy = "adaptive:" + ",".join(opts)


def resolve_point(config=None, fixed: dict | None = None, params: dict | None = None):
    """The full SimConfig of one point: `config` (a SimConfig, dict or YAML path) with
    the fixed overrides, then the point's grid values; `load` becomes a rate."""
    from ..api import build_config  # noqa: PLC0415

    over = {**(fixed or {}), **(params or {})}
    load = over.pop("load", None)
    cfg = build_config(config, **over)
    if load is not None:
        lam = critical_rate_of(cfg)
        if not (lam > 0 and math.isfinite(lam)):
            raise ConfigError(f"cannot set load={load}: the critical rate of this configuration is {lam}")
        cfg = build_config(cfg, rate=float(load) * lam)
    _fill_adaptive(cfg)
    return cfg


def point_key(cfg) -> str:
    """Hash of a point's full configuration (what its result depends on)."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    text = json.dumps({"v": KEY_VERSION, "config": d}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _validate(cfg) -> None:
    """Fail before any work on what simulate would reject (names, laws, files)."""
    from ..core.cost import make_cost_model  # noqa: PLC0415
    from ..policies import make_scheduler  # noqa: PLC0415
    from ..workload import WorkloadSpec  # noqa: PLC0415

    make_scheduler(cfg.policy, admission=cfg.admission, b_max=cfg.b_max, k_max=cfg.k_max,
                   kv_capacity=cfg.kv_capacity, max_running=cfg.max_running,
                   admission_options=cfg.admission_options)
    make_cost_model(cfg.cost_model)
    WorkloadSpec.from_dict(cfg.workload)


def run_point(cfg_dict: dict) -> dict:
    """Simulate one point (a full configuration mapping); its summary, JSON-ready."""
    from ..api import simulate  # noqa: PLC0415

    t0 = time.perf_counter()
    try:
        res = simulate(dict(cfg_dict))
    except Exception as e:  # noqa: BLE001 (a failing point is recorded, not fatal)
        return {"error": f"{type(e).__name__}: {e}", "wall_s": time.perf_counter() - t0}
    return to_jsonable(res.summary)


# ---------------------------------------------------------------------------------------
# backends

class _Backend:
    """Runs point configurations, yielding (key, summary) as each finishes."""

    def __init__(self, backend: str = "local", workers: int | None = None, address: str | None = None):
        if backend not in ("local", "ray"):
            raise ConfigError(f"unknown backend {backend!r} (known: local, ray)")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ConfigError(f"workers must be a whole number >= 1, got {workers!r}")
        self.kind = backend
        self.workers = workers or (os.cpu_count() or 1)
        self.address = address
        self._pool = None
        self._ray_started = False
        self._remote = None

    def __enter__(self):
        if self.kind == "ray":
            try:
                import ray  # noqa: PLC0415
            except ImportError:
                raise ConfigError("the ray backend needs Ray: pip install 'llmsched[sweep]'") from None
            if not ray.is_initialized():
                kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
                if self.address:
                    ray.init(address=self.address, **kw)
                else:
                    ray.init(num_cpus=self.workers, **kw)
                self._ray_started = True
            self._remote = {}
        elif self.workers > 1:
            import multiprocessing as mp  # noqa: PLC0415
            from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

            ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        if self._ray_started:
            import ray  # noqa: PLC0415

            ray.shutdown()
            self._ray_started = False

    def run(self, jobs: list[tuple[str, Any]], fn: Callable = None):
        """Yield (key, fn(arg)) for every (key, arg) job, in the order they finish.
        `fn` must be importable by name (a module-level function); default `run_point`."""
        fn = run_point if fn is None else fn
        if not jobs:
            return
        if self.kind == "ray":
            import ray  # noqa: PLC0415

            remote = self._remote.get(fn)
            if remote is None:
                remote = self._remote[fn] = ray.remote(num_cpus=1)(fn)
            refs = {remote.remote(arg): key for key, arg in jobs}
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield refs[ref], ray.get(ref)
        elif self._pool is not None:
            from concurrent.futures import as_completed  # noqa: PLC0415

            import gc  # noqa: PLC0415

            gc.freeze()  # forked workers then share the parent's heap without copying it
            try:
                futs = {self._pool.submit(fn, arg): key for key, arg in jobs}
            finally:
                gc.unfreeze()
            try:
                for f in as_completed(futs):
                    yield futs[f], f.result()
            finally:
                for f in futs:
                    f.cancel()
        else:
            for key, arg in jobs:
                yield key, fn(arg)


# ---------------------------------------------------------------------------------------
# storage

class _Store:
    def __init__(self, out_dir):
        self.dir = None if out_dir is None else Path(out_dir)
        self.mem: dict[str, dict] = {}
        if self.dir is not None:
            (self.dir / "points").mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict | None:
        if key in self.mem:
            return self.mem[key]
        if self.dir is None:
            return None
        p = self.dir / "points" / f"{key}.json"
        if not p.is_file():
            return None
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # a damaged record: simulate the point again
        if not isinstance(rec, dict) or "summary" not in rec or "error" in rec.get("summary", {}):
            return None
        self.mem[key] = rec
        return rec

    def put(self, key: str, cfg: dict, summary: dict) -> dict:

        rec = {"key": key, "config": to_jsonable(cfg), "summary": summary}
        self.mem[key] = rec
        if self.dir is not None:
            p = self.dir / "points" / f"{key}.json"
            tmp = p.with_name(f".{key}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(rec, indent=1))
            os.replace(tmp, p)
        return rec


class _Progress:
    def __init__(self, show: bool, description: str):
        self.bar = None
        if not show:
            return
        from rich.console import Console  # noqa: PLC0415
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,  # noqa: PLC0415
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True))
        self.task = self.bar.add_task(description, total=0)
        self.bar.start()

    def add(self, total: int, done: int = 0) -> None:
        if self.bar is not None:
            t = self.bar.tasks[0]
            self.bar.update(self.task, total=(t.total or 0) + total, completed=t.completed + done)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=n, **({"description": description} if description else {}))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class _Runner:
    """Shared by grid sweeps and searches: resolve, skip finished, run, store."""

    def __init__(self, backend: _Backend, store: _Store, progress: _Progress):
        self.backend, self.store, self.progress = backend, store, progress
        self.ran = 0
        self.skipped = 0
        self.errors = 0

    def run(self, cfgs: list) -> list[dict]:
        keys = [point_key(c) for c in cfgs]
        todo: dict[str, dict] = {}
        cached = 0
        for k, c in zip(keys, cfgs):
            if self.store.get(k) is not None:
                cached += 1
            elif k not in todo:
                todo[k] = c.to_dict()
        self.skipped += cached
        self.progress.add(len(cfgs), cached)
        dup = len(cfgs) - cached - len(todo)
        if dup:
            self.progress.advance(dup)
        for key, summary in self.backend.run(list(todo.items())):
            self.store.put(key, todo[key], summary)
            self.ran += 1
            if "error" in summary:
                self.errors += 1
            self.progress.advance()
        return [self.store.get(k) or self.store.mem.get(k) for k in keys]


# ---------------------------------------------------------------------------------------
# the sweep

@dataclass
class SweepResult:
    """`rows`: one dict per point (grid values, configuration columns, metrics);
    `ran`: points simulated by this call; `skipped`: points found finished;
    `search`: one dict per group when a search ran; `files`: what was written."""

    rows: list[dict]
    ran: int
    skipped: int
    errors: int = 0
    search: list[dict] | None = None
    files: list[str] = field(default_factory=list)
    out_dir: str | None = None
    wall_s: float = 0.0


def _flatten(prefix: str, v, out: dict) -> None:
    if isinstance(v, dict):
        out[prefix] = json.dumps(v, sort_keys=True)
    elif isinstance(v, (list, tuple)):
        if len(v) == 2 and all(isinstance(x, (int, float)) or x is None for x in v):
            out[f"{prefix}_low"], out[f"{prefix}_high"] = v
        else:
            out[prefix] = json.dumps(v)
    else:
        out[prefix] = v


def _row(params: dict, rec: dict, grid_keys: Sequence[str]) -> dict:
    cfg = rec["config"]
    row: dict[str, Any] = {"key": rec["key"]}
    for k in grid_keys:
        row[k] = params.get(k)
    row["policy_name"] = str(params.get("policy", cfg.get("policy"))).partition(":")[0]
    for k, v in cfg.items():
        if k == "workload":
            continue
        if k not in row:
            _flatten(k, v, row)
    for k, v in (cfg.get("workload") or {}).items():
        if k not in row:
            _flatten(k, v, row)
    for k, v in rec["summary"].items():
        name = k if k not in row else f"metric_{k}"
        _flatten(name, v, row)
    row.setdefault("error", None)
    return row


def _group_label(params: dict, group_keys: Sequence[str]) -> str:
    if not group_keys:
        return "all"
    parts = []
    for k in group_keys:
        v = params.get(k)
        parts.append(str(v) if k == "policy" else f"{k}={v}")
    return ", ".join(parts)


def run_sweep(config=None, grid: dict | Iterable[str] | None = None, *, out_dir=None,
              backend: str = "local", workers: int | None = None, address: str | None = None,
              search: str | None = None, slo: dict | Iterable[str] | None = None, tol: float = 0.02,
              search_hi: float = 1.25, plots: bool = True, progress: bool | None = None,
              **fixed) -> SweepResult:
    """Run a grid of simulations (see the module docstring). `config`: base configuration
    (SimConfig, dict or YAML path); `fixed`: option values for every point; `grid`: a
    mapping key -> values or a list of `KEY=VALUES` specs.

    `search="max-stable-rate"`: instead of gridding the rate, bisect it for every group
    (every combination of the grid's other keys; seeds are all run at each probe) to find
    the largest rate judged stable on every seed, to within `tol` * lambda*, starting
    from [0, search_hi * lambda*]; with `slo` ({metric: limit}), also the largest rate
    that is stable and meets every limit on every seed.
    """
    t0 = time.perf_counter()
    g = parse_grid(grid)
    slo_d = parse_slo(slo)
    if search not in (None, "none", "max-stable-rate"):
        raise ConfigError(f"unknown search {search!r} (known: max-stable-rate)")
    if search == "none":
        search = None
    if slo_d and not search:
        raise ConfigError("--slo needs --search max-stable-rate")
    if search and ("rate" in g or "load" in g):
        raise ConfigError("the search finds the rate: do not put rate or load in the grid")
    if not (isinstance(tol, (int, float)) and 0 < tol < 1):
        raise ConfigError(f"tol must be in (0, 1), got {tol!r}")
    if not (isinstance(search_hi, (int, float)) and search_hi > 0):
        raise ConfigError(f"search_hi must be > 0, got {search_hi!r}")
    fixed = {k.replace("-", "_"): v for k, v in fixed.items() if v is not None}
    bad = sorted(set(fixed) - set(grid_keys()))
    if bad:
        raise ConfigError(f"unknown option {bad[0]!r}")
    if search and ("rate" in fixed or "load" in fixed):
        raise ConfigError("the search finds the rate: do not fix a rate or load")
    show = sys.stderr.isatty() if progress is None else bool(progress)
    store = _Store(out_dir)
    points = expand_grid(g)
    if search:
        result = _search(config, g, fixed, points, store, backend, workers, address, slo_d, tol,
                         search_hi, show)
    else:
        cfgs = [resolve_point(config, fixed, p) for p in points]
        for c in cfgs:
            _validate(c)
        bar = _Progress(show, "sweep")
        try:
            with _Backend(backend, workers, address) as be:
                runner = _Runner(be, store, bar)
                recs = runner.run(cfgs)
        finally:
            bar.close()
        rows = [_row(p, r, list(g)) for p, r in zip(points, recs)]
        result = SweepResult(rows=rows, ran=runner.ran, skipped=runner.skipped, errors=runner.errors)
    result.out_dir = None if out_dir is None else str(out_dir)
    if out_dir is not None:
        result.files += write_table(result.rows, out_dir)
        if result.search is not None:
            result.files += write_search(result.search, out_dir)
        if plots:
            result.files += plot_sweep(result.rows, out_dir, list(g), result.search)
    result.wall_s = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------------------------
# searches

def _search(config, g, fixed, points, store, backend, workers, address, slo, tol, search_hi, show):
    seeds = g.get("seed") or [fixed.get("seed", None)]
    group_keys = [k for k in g if k not in NON_GROUP_KEYS]
    groups: list[dict] = []
    seen = set()
    for p in points:
        gp = {k: p[k] for k in group_keys}
        key = json.dumps(gp, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            groups.append(gp)
    states = []
    for gp in groups:
        base = resolve_point(config, fixed, gp)
        _validate(base)
        lam = critical_rate_of(base)
        states.append({"params": gp, "critical_rate": lam})
    bar = _Progress(show, "search")
    all_rows: list[dict] = []
    try:
        with _Backend(backend, workers, address) as be:
            runner = _Runner(be, store, bar)

            def probe(batch: list[tuple[int, float]]) -> list[list[dict]]:
                cfgs, index = [], []
                for gi, rate in batch:
                    for s in seeds:
                        params = {**states[gi]["params"], **({} if s is None else {"seed": s}), "rate": rate}
                        cfgs.append(resolve_point(config, fixed, params))
                        index.append((gi, params))
                recs = runner.run(cfgs)
                out: list[list[dict]] = [[] for _ in batch]
                pos = {gi: j for j, (gi, _) in enumerate(batch)}
                for (gi, params), rec in zip(index, recs):
                    out[pos[gi]].append(rec)
                    all_rows.append(_row(params, rec, [*group_keys, "seed", "rate"]))
                return out

            def stable(recs):
                return all(r["summary"].get("stable") is True for r in recs)

            def meets(recs):
                if not stable(recs):
                    return False
                for r in recs:
                    for k, lim in slo.items():
                        v = r["summary"].get(k)
                        if v is None or not v <= lim:
                            return False
                return True

            _bisect(states, probe, stable, "stable", tol, search_hi)
            if slo:
                _bisect(states, probe, meets, "slo", tol, None)
            ran, skipped, errors = runner.ran, runner.skipped, runner.errors
    finally:
        bar.close()
    table = []
    for st in states:
        lam = st["critical_rate"]
        row = {**st["params"], "policy_name": str(st["params"].get("policy", "")).partition(":")[0] or None,
               "critical_rate": lam, "max_stable_rate": st["stable_lo"],
               "max_stable_load": st["stable_lo"] / lam if lam else None,
               "unstable_rate": st["stable_hi"], "probes": st["stable_probes"]}
        if slo:
            row["max_slo_rate"] = st["slo_lo"]
            row["max_slo_load"] = st["slo_lo"] / lam if lam else None
            row["slo"] = json.dumps(slo, sort_keys=True)
        table.append(row)
    return SweepResult(rows=all_rows, ran=ran, skipped=skipped, errors=errors, search=table)


def _bisect(states, probe, ok, name, tol, search_hi):
    """Bisection on the rate for every group at once (one probe per group per round).
    `ok(records)` says whether a rate passes; rate 0 passes by definition.

    With `search_hi` (in units of lambda*) the upper end is probed first and, while it
    passes, widened (x1.5, at most 4 times). Without it (the SLO search) the bracket is
    [0, max stable rate]: that rate is probed first (a cached point) and, if it passes,
    is the answer; so the SLO rate never exceeds the stable rate."""
    for st in states:
        lam = st["critical_rate"]
        st[f"{name}_lo"] = 0.0
        st[f"{name}_hi"] = st["stable_lo"] if search_hi is None else search_hi * lam
        st[f"{name}_probes"] = 0
        st[f"{name}_hi_checked"] = st[f"{name}_hi"] <= 0
        st[f"{name}_grow"] = 0 if search_hi is not None else 4
    while True:
        batch = []
        for gi, st in enumerate(states):
            lam = st["critical_rate"]
            lo, hi = st[f"{name}_lo"], st[f"{name}_hi"]
            if not st[f"{name}_hi_checked"]:
                batch.append((gi, hi))
            elif hi - lo > tol * lam and hi > 0:
                batch.append((gi, 0.5 * (lo + hi)))
        if not batch:
            return
        results = probe(batch)
        for (gi, rate), recs in zip(batch, results):
            st = states[gi]
            st[f"{name}_probes"] += 1
            passed = ok(recs)
            if not st[f"{name}_hi_checked"]:
                if passed and st[f"{name}_grow"] < 4:  # the upper end is not unstable: widen
                    st[f"{name}_lo"] = rate
                    st[f"{name}_hi"] = rate * 1.5
                    st[f"{name}_grow"] += 1
                else:
                    st[f"{name}_hi_checked"] = True
                    if passed:  # passing at the largest rate allowed: that is the answer
                        st[f"{name}_lo"] = st[f"{name}_hi"] = rate
                continue
            if passed:
                st[f"{name}_lo"] = rate
            else:
                st[f"{name}_hi"] = rate


def max_stable_rate(config=None, *, policies: Sequence[str] | None = None, seeds: Sequence[int] = (0,),
                    tol: float = 0.02, slo: dict | Iterable[str] | None = None, out_dir=None,
                    backend: str = "local", workers: int | None = None, address: str | None = None,
                    search_hi: float = 1.25, progress: bool | None = None, grid: dict | None = None,
                    plots: bool = False, **fixed) -> list[dict]:
    """Each policy's empirical maximum stable rate (and, with `slo`, the maximum rate
    meeting the SLOs) by bisection on the rate using the runs' stability verdicts; one
    dict per policy (and per combination of other `grid` keys) with `critical_rate`
    (theory), `max_stable_rate`, `max_stable_load`, `unstable_rate` (the bracket's upper
    end) and the number of probes."""
    g = dict(grid or {})
    if policies is not None:
        g["policy"] = list(policies)
    g["seed"] = list(seeds)
    res = run_sweep(config, g, out_dir=out_dir, backend=backend, workers=workers, address=address,
                    search="max-stable-rate", slo=slo, tol=tol, search_hi=search_hi, progress=progress,
                    plots=plots, **fixed)
    return res.search


# ---------------------------------------------------------------------------------------
# outputs

def _columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    seen = set()
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


def _atomic_write(path: Path, writer: Callable) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer(tmp)
    os.replace(tmp, path)


def write_table(rows: list[dict], out_dir, name: str = "results") -> list[str]:
    """`NAME.csv` and (with pyarrow) `NAME.parquet`; returns the paths written."""
    import csv  # noqa: PLC0415

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = _columns(rows)
    written = []

    def w_csv(p):
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})

    _atomic_write(out / f"{name}.csv", w_csv)
    written.append(str(out / f"{name}.csv"))
    try:
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        return written
    arrays = {}
    for c in cols:
        vals = [r.get(c) for r in rows]
        kinds = {type(v) for v in vals if v is not None}
        if kinds and kinds <= {int, bool} and bool in kinds and int not in kinds:
            arrays[c] = pa.array(vals, type=pa.bool_())
        elif kinds and kinds <= {int}:
            arrays[c] = pa.array(vals, type=pa.int64())
        elif kinds and kinds <= {int, float, bool}:
            arrays[c] = pa.array([None if v is None else float(v) for v in vals], type=pa.float64())
        else:
            arrays[c] = pa.array([None if v is None else str(v) for v in vals], type=pa.string())
    table = pa.table(arrays)
    _atomic_write(out / f"{name}.parquet", lambda p: pq.write_table(table, p))
    written.append(str(out / f"{name}.parquet"))
    return written


def write_search(search: list[dict], out_dir) -> list[str]:
    out = Path(out_dir)
    paths = write_table(search, out, "search")[:1]
    _atomic_write(out / "search.json", lambda p: p.write_text(json.dumps(search, indent=2, default=str)))
    return paths + [str(out / "search.json")]


def _fig(n: int = 1, width: float = 7.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(width if n == 1 else width * 0.75 * n, 4.3), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    _atomic_write(path, lambda p: fig.savefig(p, format="png"))
    return str(path)


def _groups(rows: list[dict], grid_keys: Sequence[str]):
    gkeys = [k for k in grid_keys if k not in NON_GROUP_KEYS]
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("error"):
            continue
        out.setdefault(_group_label(r, gkeys), []).append(r)
    return out


def _x_of(rows: list[dict]):
    """x of each row: the grid's load, else the rate over the group's critical rate
    (median over its rows), else the rate; and the axis label."""
    if rows and all(r.get("load") is not None for r in rows):
        return [float(r["load"]) for r in rows], True
    lams = sorted(float(r["critical_rate"]) for r in rows if r.get("critical_rate"))
    if lams and all(r.get("rate") is not None for r in rows):
        lam = lams[len(lams) // 2]
        return [float(r["rate"]) / lam for r in rows], True
    return [None if r.get("rate") is None else float(r["rate"]) for r in rows], False


def _by_x(rows: list[dict], metric: str):
    """Mean of `metric` over seeds at each offered load."""
    pts: dict[float, list[float]] = {}
    xs_all, _ = _x_of(rows)
    for x, r in zip(xs_all, rows):
        v = r.get(metric)
        if x is None or v is None:
            continue
        pts.setdefault(round(x, 9), []).append(float(v))
    xs = sorted(pts)
    return xs, [sum(pts[x]) / len(pts[x]) for x in xs]


def _empirical_max_stable(rows: list[dict]) -> float | None:
    """Largest grid rate below which every rate (all seeds) was judged stable."""
    by_rate: dict[float, list] = {}
    for r in rows:
        if r.get("rate") is not None:
            by_rate.setdefault(float(r["rate"]), []).append(r.get("stable"))
    best = None
    for rate in sorted(by_rate):
        if all(v is True for v in by_rate[rate]):
            best = rate
        else:
            break
    return best


def plot_sweep(rows: list[dict], out_dir, grid_keys: Sequence[str], search: list[dict] | None = None) -> list[str]:
    """throughput.png, latency.png and max_stable_rate.png (see the module docstring)."""
    out = Path(out_dir)
    groups = _groups(rows, grid_keys)
    files = []
    uses_load = all(_x_of(rs)[1] for rs in groups.values()) if groups else False
    xlabel = "offered load (rate / critical rate lambda*)" if uses_load else "offered rate (requests/s)"
    if rows and search is None:
        fig, (ax,) = _fig()
        for i, (label, rs) in enumerate(groups.items()):
            xs, ys = _by_x(rs, "total_token_throughput")
            if xs:
                ax.plot(xs, ys, "o-", ms=3, label=label)
            if i == len(groups) - 1:
                xs, ys = _by_x(rs, "offered_token_rate")
                if xs:
                    ax.plot(xs, ys, ":", color="gray", lw=1, label="offered tokens/s")
        caps = [r.get("token_capacity") for r in rows if r.get("token_capacity")]
        if caps and len(set(round(c, 6) for c in caps)) == 1:
            ax.axhline(caps[0], color="gray", ls="--", lw=1, label="token capacity b_max/t(b_max)")
        if uses_load:
            ax.axvline(1.0, color="gray", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("served tokens/s (prompt + output)")
        ax.set_title("Throughput vs offered load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        files.append(_save(fig, out / "throughput.png"))

        fig, axes = _fig(2)
        for ax, metric, title in ((axes[0], "p99_ttft_ms", "p99 TTFT"), (axes[1], "p99_itl_ms", "p99 ITL")):
            for label, rs in groups.items():
                xs, ys = _by_x(rs, metric)
                if xs:
                    ax.plot(xs, ys, "o-", ms=3, label=label)
            ax.set_yscale("log")
            if uses_load:
                ax.axvline(1.0, color="gray", ls=":", lw=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{title} (ms)")
            ax.set_title(f"{title} vs offered load")
            ax.grid(alpha=0.3, which="both")
        axes[0].legend(fontsize=7)
        files.append(_save(fig, out / "latency.png"))

    bars = []
    if search is not None:
        gkeys = [k for k in grid_keys if k not in NON_GROUP_KEYS]
        for s in search:
            bars.append((_group_label(s, gkeys), s.get("max_stable_rate"), s.get("critical_rate"),
                         s.get("max_slo_rate")))
    else:
        for label, rs in groups.items():
            lam = [r.get("critical_rate") for r in rs if r.get("critical_rate")]
            bars.append((label, _empirical_max_stable(rs), lam[0] if lam else None, None))
    if bars:
        fig, (ax,) = _fig(width=max(5.0, 1.1 * len(bars) + 2))
        xs = list(range(len(bars)))
        ax.bar(xs, [b[1] or 0.0 for b in bars], color="tab:blue", alpha=0.8, label="empirical max stable rate")
        if any(b[3] is not None for b in bars):
            ax.bar([x + 0.25 for x in xs], [b[3] or 0.0 for b in bars], width=0.35, color="tab:orange",
                   label="max rate meeting SLOs")
        for x, b in zip(xs, bars):
            if b[2]:
                ax.plot([x - 0.45, x + 0.45], [b[2], b[2]], "k--", lw=1.5)
        ax.plot([], [], "k--", label="lambda* (theorem 2; with k_max the 2-D region)")
        ax.set_xticks(xs)
        ax.set_xticklabels([b[0] for b in bars], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("arrival rate (requests/s)")
        ax.set_title("Empirical maximum stable rate vs the theoretical critical rate")
        top = max([b[1] or 0.0 for b in bars] + [b[2] or 0.0 for b in bars] + [1e-9])
        ax.set_ylim(0, top * 1.3)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3, axis="y")
        files.append(_save(fig, out / "max_stable_rate.png"))
    return files
