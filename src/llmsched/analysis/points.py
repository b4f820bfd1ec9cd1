"""One point of a sweep: its full configuration, its key, and its run.

- `resolve_point(config, fixed, params)`: the point's `SimConfig` (a grid's `load`
  becomes a rate: the one at which the point offers `load` times its critical rate
  lambda*, `critical_rate_of`; in conversations/s with `turns`, `critical_arrival_rate_of`);
- `point_key(cfg)`: a hash of that configuration, the name of its stored result;
- `check_point(cfg, traces, point)`: fail before any work on what `simulate` would
  reject, naming the grid point;
- `run_point(cfg_dict)`: simulate it and return its summary (an error is recorded in
  the summary, not raised).

A point runs exactly the options it names, as `simulate` would: plain `adaptive` gets the
run's cost model from the simulator and, for a context-dependent cost model, estimates
the workload means from the requests it sees (nothing is filled in, so a point's summary
is `simulate`'s and its `policy` column is what ran).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from functools import lru_cache

from ..api import build_config, check_config, config_policy_capacity, numbers_as_kind, simulate
from ..core.cost import make_cost_model, recorded_cost_model
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.paths import recorded_path
from ..policies import (
    ADMISSION_POLICIES,
    BATCH_POLICIES,
    policy_base_name,
    takes_option,
)
from ..theory import capacity, requests_per_rate, workload_mix
from ..theory.means import cached_workload_mix, region_prefill_cap, sample_key
from ..workload.datasets import file_stamps
from ..workload.spec import replays_trace, without_inline_rate

__all__ = [
    "resolve_point",
    "point_key",
    "check_point",
    "run_point",
    "critical_rate_of",
    "policy_critical_rate_of",
    "critical_arrival_rate_of",
    "KEY_VERSION",
]

#: Part of every key: change it when stored results stop being comparable (2: on
#: 2026-12-03 a trace's partial last block stopped counting as a hit under a longer
#: prompt, a rise of under one request's work became a stable verdict, and a time-scaled
#: deterministic arrival on the duration stopped being dropped; 3: on 2026-12-04 adaptive's
#: verdict threshold followed its own limit, the automatic sampling interval stopped thinning
#: the arrival window, and a back-pressure server's verdict came to count its buffer).
KEY_VERSION = "llmsched-sweep-3"


def critical_rate_of(cfg) -> float:
    """Theoretical critical rate lambda* (requests/s) of a SimConfig (workload means and
    length mix by sampling, `llmsched.theory.workload_means` and `workload_mix`). With
    prefix caching, the prompt tokens an unbounded cache serves are not work, and each
    prompt's uncached tokens are timed after its cached prefix
    (`llmsched.theory.cached_workload_mix`), as in the `critical_rate` a run reports from
    the hits it measured."""
    return _numbers_of(cfg)[0]


def _numbers_of(cfg) -> tuple:
    """`_critical_rate` of a SimConfig: (lambda*, effective_capacity, fill_capacity, work, region_exact)."""
    block_size = int(cfg.block_size) if cfg.prefix_caching else 0
    key = sample_key(cfg.workload)  # points that differ in their arrivals share lambda*
    if not isinstance(cfg.cost_model, str):
        return _critical_rate.__wrapped__(cfg.cost_model, cfg.b_max, cfg.k_max, key, block_size)
    # a profile:PATH is read anew when its file changes (or a relative PATH names another),
    # and so are the workload's files
    files = tuple(file_stamps({"cost_model": cfg.cost_model, "workload": cfg.workload}))
    return _critical_rate(cfg.cost_model, cfg.b_max, cfg.k_max, key, block_size, files)


def critical_arrival_rate_of(cfg) -> float:
    """The workload `rate` at which a SimConfig offers lambda* requests/s: lambda* over
    the requests per unit of rate (`llmsched.theory.requests_per_rate`: the mean turns of
    a conversation with `turns`, so conversations/s; times `time_scale` on synthetic
    arrivals). lambda* itself without either."""
    return critical_rate_of(cfg) / requests_per_rate(cfg.workload)


def policy_critical_rate_of(cfg) -> float | None:
    """The rate below which the configuration's own policy is stable, where theory says it
    (`api.config_policy_capacity`, the rule of `simulate`'s summary: fill_capacity / work for
    a work-conserving policy without a binding cap, below lambda* where b / t(b) peaks below
    b_max; lambda* for adaptive), in the unit of the workload's rate as
    `critical_arrival_rate_of`; None where lambda* only bounds it (an admission or running
    cap that holds work back, a finite kv_capacity)."""
    _, eff, fill, work, exact = _numbers_of(cfg)
    limit = config_policy_capacity(cfg, eff, fill, exact)
    return None if limit is None else limit / work / requests_per_rate(cfg.workload)


@lru_cache(maxsize=1024)
def _critical_rate(cost_model, b_max: int, k_max, workload: str, block_size: int = 0, files=()) -> tuple:
    """(lambda*, effective_capacity, fill_capacity, work per request, region_exact) of the workload's
    sample (`workload`: its key, `sample_key`); `block_size`: the prefix cache's, 0 without one."""
    w = json.loads(workload)
    mix = cached_workload_mix(w, block_size) if block_size else workload_mix(w)
    cost = make_cost_model(cost_model)
    rep = capacity(
        cost,
        b_max,
        mix.mean_prompt,
        mix.mean_output,
        k_max=k_max,
        cached_prompt=mix.mean_cached,
        mix=mix,
        peak=False,
        # (a request supplies at most its prompt as prefill in a step: as `capacity` reports it)
        max_prefill_per_request=region_prefill_cap(w, b_max, k_max),
    )
    return rep.critical_rate, rep.effective_capacity, rep.fill_capacity, rep.work_per_request, rep.region_exact


def resolve_point(config=None, fixed: dict | None = None, params: dict | None = None):
    """The full SimConfig of one point: `config` (a SimConfig, dict or YAML path) with
    the fixed overrides, then the point's grid values; `load` becomes the rate at which
    the point offers load * lambda* requests/s (`critical_arrival_rate_of`: with turns, a
    rate of conversations/s; with time_scale K on synthetic arrivals, one K times lower,
    as simulate runs rate R at R * K)."""
    over = {**(fixed or {}), **(params or {})}
    load = over.pop("load", None)
    # a rate the point sets (its grid value, its load, a search's probe) replaces one the
    # arrival names (poisson:5), as it replaces --rate
    rate = over.pop("rate", None) if params and params.get("rate") is not None else None
    cfg = build_config(config, **over)
    _keep_options_taken(cfg, params or {})
    if load is not None:
        check_rate_settable(cfg, "load")
        lam = critical_arrival_rate_of(cfg)
        if not (lam > 0 and math.isfinite(lam)):
            raise ConfigError(f"cannot set load={load}: the critical rate of this configuration is {lam}")
        rate = float(load) * lam
    if rate is not None:
        cfg = build_config(cfg, workload=without_inline_rate(cfg.given_workload()), rate=rate)
    return cfg


# a grid key naming a policy -> its kind and the key of its options
_POLICY_OPTIONS = {"admission": ("admission", "admission_options"), "policy": ("batch", "policy_options")}


def _keep_options_taken(cfg, params: dict) -> None:
    """At a point whose policy the grid sets (and not its options), the fixed options
    (a flag's, the config's) that this policy takes: `--admission-option alpha=0.3` over
    `admission=fcfs,twp` is TWP's, and FCFS takes no options. The point's config records
    the options it ran with. `check_options_taken` refuses an option no policy takes."""
    for key, (kind, options_key) in _POLICY_OPTIONS.items():
        options = getattr(cfg, options_key)
        if key in params and options_key not in params and options:
            name = getattr(cfg, key)
            setattr(cfg, options_key, {k: v for k, v in options.items() if takes_option(kind, name, k)})


def check_options_taken(config, fixed: dict, grid: dict) -> None:
    """A fixed policy option (a flag's, the config's) that no policy of the grid's list
    takes: one line before any point runs (each point keeps those its policy takes)."""
    for key, (kind, options_key) in _POLICY_OPTIONS.items():
        if key not in grid or options_key in grid:
            continue
        options = fixed.get(options_key)
        if options is None:  # (a fixed mapping replaces the config's, as on simulate's command line)
            options = getattr(build_config(config), options_key)
        names = grid[key]
        for option in sorted(options or {}):
            if not any(takes_option(kind, name, option) for name in names):
                raise ConfigError(
                    f"{options_key} {option!r}: no {kind} policy of the grid takes it ({', '.join(map(str, names))})"
                )


def check_rate_settable(cfg, what: str) -> None:
    """Refuse `what` (a grid's `load`, a search) setting the rate of a replayed trace from
    lambda* where that lambda* is of other requests than the run's, or where time_scale
    sets the trace's speed too."""
    if not replays_trace(cfg.workload):
        return
    if cfg.workload.get("duration_s") is not None:
        # the rate rescales the trace before the duration cuts it: lambda*, of the requests
        # kept at the configuration's rate, is of another set than each point runs
        raise ConfigError(
            f"{what} on a replayed trace cut by duration_s={cfg.workload['duration_s']:g} (--duration): a rate "
            "rescales the trace before the cut, so each "
            "rate keeps other requests than those lambda* is of; give num_requests (--num-requests) instead"
        )
    if float(cfg.workload.get("time_scale") or 1.0) != 1.0:
        raise ConfigError(
            f"{what} sets the replayed trace's rate, which time_scale={float(cfg.workload['time_scale']):g} "
            "(--time-scale) also sets: give one of them"
        )


def point_key(cfg) -> str:
    """Hash of a point's full configuration (what its result depends on), and of the size
    and modification time of the files it names: a resumed sweep reruns a point whose
    trace or length file changed."""
    # (an option's number as its kind: rate=2 is --rate 2.0's point, max_time_s=60 --max-time 60's)
    d = numbers_as_kind(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))
    key = {"v": KEY_VERSION, "config": _by_absolute_paths(d)}
    files = file_stamps(d)
    if files:  # (no key changes for configurations without files)
        key["files"] = files
    code = policy_code(d)
    if code:  # (nor for the built-in policies)
        key["code"] = code
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _by_absolute_paths(d: dict) -> dict:
    """`d` with the files its cost model and workload name by their absolute paths, as a
    run's config.json records them: `t.csv` and `./t.csv` (or a path from another folder)
    are one point (the point's own record keeps the path as given)."""
    out = dict(d)
    if isinstance(out.get("cost_model"), str):
        out["cost_model"] = recorded_cost_model(out["cost_model"])
    if isinstance(out.get("workload"), dict):
        out["workload"] = _recorded(out["workload"])
    return out


def _recorded(v):
    """A workload value with each file it names absolute: a path (`trace`), or one after a
    law's kind (`empirical:PATH[:COLUMN]`), in mappings and lists too (`classes`)."""
    if isinstance(v, dict):
        return {k: _recorded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_recorded(x) for x in v]
    if not isinstance(v, str):
        return v
    if os.path.isfile(v):
        return recorded_path(v)
    kind, sep, rest = v.partition(":")
    for path in (rest, rest.rsplit(":", 1)[0]) if sep else ():
        if path and os.path.isfile(path):
            return f"{kind}:{recorded_path(path)}{rest[len(path) :]}"
    return v


def policy_code(d: dict) -> dict:
    """The code of the point's policies written outside llmsched (registered in this
    process), hashed: a resumed sweep reruns a point whose policy was redefined or edited.
    It covers the registered class or factory, the classes in its MRO and, for a factory,
    those of the policy it builds: each one's name and source, and the whole source file
    of each module defining one (helpers and base classes there are the policy's code
    too). One without readable source or file (made in `python -c`) is keyed by its
    identity in this process: rerun by every new process, never reused stale."""
    out = {}
    for key, kind, table in (("policy", "batch", BATCH_POLICIES), ("admission", "admission", ADMISSION_POLICIES)):
        name = policy_base_name(str(d.get(key) or ""), kind)
        made = table.get(name)
        if made is None or _is_ours(made):
            continue
        objects = [made, *_classes(made)]
        if not isinstance(made, type):  # a factory (a function, or an object's __call__)
            objects += _classes(type(made)) + _classes(_built_class(made, d.get(f"{key}_options")))
        out[key] = hashlib.sha256(_code_text(objects).encode()).hexdigest()[:20]
    return out


def _is_ours(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "builtins" or module == "llmsched" or module.startswith("llmsched.")


def _classes(obj) -> list:
    return [c for c in obj.__mro__ if not _is_ours(c)] if isinstance(obj, type) else []


_BUILT: dict = {}  # (factory's id, options) -> (factory, the class it built), this process's


def _built_class(factory, options) -> type:
    """The class of the policy `factory` builds with `options`, built once per process
    (a factory may be costly, or print: a resumed sweep keyed each point by building it)."""
    key = (id(factory), json.dumps(options, sort_keys=True, default=str))
    hit = _BUILT.get(key)
    if hit is None or hit[0] is not factory:  # (an id reused by another factory)
        hit = _BUILT[key] = (factory, type(_built(factory, options)))
    return hit[1]


def _built(factory, options):
    """The policy `factory` builds, as the registry builds it (None when it cannot:
    its module's file is still hashed)."""
    try:
        return factory(**(options if isinstance(options, dict) else {}))
    except Exception:  # noqa: BLE001 (the run itself reports a failing factory)
        return None


def _code_text(objects: list) -> str:
    import inspect  # noqa: PLC0415
    import sys  # noqa: PLC0415

    files, named, seen = {}, [], set()
    for obj in objects:
        if _is_ours(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        try:
            # (not the script that runs the sweep: its grid would be the policy's code, and
            # a grid grown by a seed would rerun every finished point; its objects' source)
            script = getattr(module, "__name__", None) == "__main__"
            path = inspect.getsourcefile(module) if module is not None and not script else None
            if path:
                with open(path, "rb") as f:
                    files[path] = hashlib.sha256(f.read()).hexdigest()
        except (OSError, TypeError):
            path = None
        ident = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            # no source: its file's text keys it, or else (no file) its identity here
            source = "" if path else f"id {id(obj)}"
        named.append((ident, source))
    return json.dumps({"files": files, "objects": named}, sort_keys=True)


def check_point(cfg, traces: dict | None = None, point: dict | None = None) -> None:
    """Fail before any work on what simulate would reject (names, laws, SLOs, files read,
    run options): `llmsched.api.check_config`, simulate's own checks without its run
    (`traces`: shared by a sweep's points, so that each workload is drawn once). With
    `point` (the grid's values), the error begins `grid point KEY=VALUE, ...: `."""
    try:
        check_config(cfg, traces=traces)
    except ConfigError as e:
        if not point:
            raise
        # an error about one of the point's keys (`prompt: unknown length law ...`) names
        # that key first and only there
        key, sep, problem = str(e).partition(": ")
        if not (sep and key in point):
            key, problem = None, str(e)
        order = sorted(point, key=lambda k: k != key)
        where = ", ".join(f"{k}={point[k]}" for k in order)
        raise ConfigError(f"grid point {where}: {problem}") from None


def run_point(cfg_dict: dict) -> dict:
    """Simulate one point (a full configuration mapping); its summary, JSON-ready."""
    t0 = time.perf_counter()
    try:
        res = simulate(dict(cfg_dict))
    except Exception as e:  # noqa: BLE001 (a failing point is recorded, not fatal)
        return {"error": f"{type(e).__name__}: {e}", "wall_s": time.perf_counter() - t0}
    return to_jsonable(res.summary)
