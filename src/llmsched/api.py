"""`llmsched.simulate(...)`: one call from a configuration to a `SimResult`.

A configuration names the policy, limits, cost model and workload. It can come from
keyword arguments, a dict, or a YAML file; every run writes it back (`config.json`)
next to its results so any figure can be regenerated.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .core.checks import check_bool, check_progress, quoted_number, strict_keywords
from .core.constraints import check_prefix_block_size, k_max_binds
from .core.cost import make_cost_model, recorded_cost_model, warn_fast_steps, warn_past_grid
from .core.errors import BlockSizeUnusedWarning as BlockSizeUnusedWarning  # re-exported (docs)
from .core.errors import ConfigError, check_known, warn, warn_block_size_unused
from .core.paths import check_out_dir, check_run_dir
from .core.request import NS, check_sample_interval, check_seconds
from .core.version import __version__
from .core.yamlfile import read_yaml
from .policies import paced_by_slo, scheduler_policy_capacity
from .policies.spec import SchedulerSpec
from .sim.result import SimResult, check_inputs_not_replaced, new_steps_file
from .sim.simulator import STEPS_HEADER, check_run_inputs, simulate_trace
from .theory import INCONCLUSIVE, UNSTABLE, LengthMix, capacity, stability_verdict
from .theory.verdict import MIN_JUDGED_ARRIVALS as MIN_JUDGED_ARRIVALS  # re-exported (tests, docs)
from .theory.verdict import burst_factor, guard_time_of, service_steps, short_window_time_s
from .workload import Trace, WorkloadSpec, make_trace
from .workload.arrivals import MAX_REQUESTS, count_over_the_limit, loose_rate
from .workload.blocks import DEFAULT_BLOCK_SIZE
from .workload.spec import (
    DEFAULT_WORKLOAD,
    arrivals_held,
    check_trace_blocks,
    class_shares,
    one_spelling,
    override_workload,
    with_defaults,
)

if TYPE_CHECKING:
    from .workload.network import NetworkSpec

_WORKLOAD_KEYS = {f.name for f in fields(WorkloadSpec)}
# what a run writes into its config.json beside its options (accepted back, then ignored)
OUTPUT_ONLY_KEYS = ("cost_model_resolved", "scheduler", "provenance")


# workload options that are real numbers, and those that are whole numbers: an option is
# kept as its kind (`numbers_as_kind`), so `rate: 2` and `--rate 2` (2.0) are one value in
# a configuration, its config.json and a sweep point's key
FLOAT_WORKLOAD_OPTIONS = frozenset(("rate", "cv", "time_scale", "duration_s", "think_time_s"))
INT_WORKLOAD_OPTIONS = frozenset(("num_requests", "seed", "system_prompt"))
# every option given in seconds or per second, a sweep's `load` too: each a float
FLOAT_OPTIONS = FLOAT_WORKLOAD_OPTIONS | {"max_time_s", "sample_interval_s", "load"}


def option_number(name: str, v, floats=FLOAT_WORKLOAD_OPTIONS, ints=INT_WORKLOAD_OPTIONS):
    """`v` as its option's kind of number: an integer given for a real-valued option
    (`floats`) as a float, a whole float given for an integer option (`ints`) as an int;
    anything else (a bool, a string, a fraction for an integer option, a number too large
    for a float, a float past 2**53) unchanged, for the option's own check to judge."""
    if isinstance(v, bool):
        return v
    if name in floats and isinstance(v, (int, np.integer)):
        try:
            return float(v)
        except OverflowError:
            return v
    if name in ints and isinstance(v, (float, np.floating)) and abs(v) < 2**53 and v == int(v):
        return int(v)  # (past 2**53 a float is no number written: its own check refuses it)
    return v


def numbers_as_kind(d: dict) -> dict:
    """A configuration mapping (`SimConfig.to_dict()`) with its time options and its
    workload's numeric options as their kind of number (`option_number`): a copy."""
    out = dict(d)
    for name in ("max_time_s", "sample_interval_s"):
        if name in out:
            out[name] = option_number(name, out[name], floats=(name,))
    if isinstance(out.get("workload"), dict):
        out["workload"] = {k: option_number(k, v) for k, v in out["workload"].items()}
    return out


# the workload a run's config.json records for a Trace object given to `simulate`: its
# summary numbers (`Trace.describe`), not its requests, which the run's requests.csv holds
CALLER_TRACE = "given by the caller"


def _caller_trace_run(d) -> bool:
    """Whether `d` is the config.json of a run given a Trace object (`CALLER_TRACE`)."""
    wl = d.get("workload") if isinstance(d, Mapping) and "provenance" in d else None
    return isinstance(wl, dict) and wl.get("trace") == CALLER_TRACE


def caller_trace_message(folder: str) -> str:
    return (
        f"this config.json is of a run whose trace came from the caller (a Trace object given to simulate), "
        f"which it does not record: rerun it with --trace {os.path.join(folder, 'requests.csv')} (the requests "
        "as the run took them; with this --config, the run's other options)"
    )


def _without_caller_workload(config, drop: Callable[[Mapping], bool] = _caller_trace_run):
    """`config` (a YAML path, a mapping, a SimConfig) as `build_config` reads it when the
    workload is given anew (a trace): without its workload where `drop` says so (by
    default a caller-trace run's config.json, `CALLER_TRACE`, whose workload the new one
    replaces); any other config as it is."""
    if isinstance(config, (str, os.PathLike)):
        d = read_yaml(config, "config")
    elif isinstance(config, Mapping):
        d = config
    else:
        return config
    if not (isinstance(d, Mapping) and drop(d)):
        return config
    return {k: v for k, v in d.items() if k != "workload"}


def _is_run_config(d: Mapping) -> bool:
    """Whether `d` is a run's own config.json (it has the `provenance` a run writes)."""
    return "provenance" in d


def _given_of(given: dict, workload: dict) -> dict:
    """The workload options given: `given`, or where `workload` (the completed options) was
    changed since, its values except those equal to a default not given."""
    if with_defaults(given, DEFAULT_WORKLOAD) == workload:
        return dict(given)
    return {k: v for k, v in workload.items() if k in given or k not in DEFAULT_WORKLOAD or v != DEFAULT_WORKLOAD[k]}


# what a configuration that is no single server's declares, by its layout
LAYOUTS = {
    "network": (
        "a network's configuration (servers and jobs: a --network file, or a network run's config.json)",
        "llmsched.simulate_network",
    ),
    "serverless": (
        "a serverless platform's configuration (cluster and models: a --serverless file, or a serverless run's "
        "config.json)",
        "llmsched.sim.serverless_result.simulate_serverless",
    ),
}


def config_layout(d) -> str | None:
    """'network' for a mapping with a network's `servers` or `jobs`, 'serverless' for one
    with a platform's `cluster` or `models` (no option of one server's is either), else None."""
    if not isinstance(d, dict):
        return None
    if "servers" in d or "jobs" in d:
        return "network"
    if "cluster" in d or "models" in d:
        return "serverless"
    return None


# each SimConfig by the id of the completed workload dict it made (`set_workload`): a
# config made with that very dict (`dataclasses.replace`) takes the options it was given,
# which the dict alone does not tell (a default request count given, or completed?)
_WORKLOAD_OF: weakref.WeakValueDictionary[int, SimConfig] = weakref.WeakValueDictionary()


@strict_keywords("configuration option")
@dataclass
class SimConfig:
    """Everything a simulation run depends on."""

    policy: str = "sarathi"
    policy_options: dict = field(default_factory=dict)
    admission: str = "fcfs"
    admission_options: dict = field(default_factory=dict)
    b_max: int = 512
    k_max: int | None = None
    kv_capacity: int | None = None
    max_running: int | None = None
    prefix_caching: bool = False  # reuse the KV of cached prompt prefixes (docs/prefix-caching.md)
    block_size: int = 16  # tokens per KV block, the prefix cache's unit
    cost_model: str = "profile:h200-llama-3-8b"
    workload: dict = field(default_factory=dict)  # the options given; completed by the defaults that apply
    fast: bool = True
    max_time_s: float | None = None
    sample_interval_s: float | None = None
    record_steps: bool = False
    verdict: bool = True
    slo: dict = field(default_factory=dict)  # per-request limits in ms: ttft_ms, tpot_ms, itl_ms, e2el_ms

    def __post_init__(self):
        wl = self.workload
        source = _WORKLOAD_OF.get(id(wl))
        if source is not None and source.workload is wl:
            # another config's own workload, as `dataclasses.replace` passes it: the options
            # that config was given (its edits since included), so the copy runs its workload
            self.set_workload(source.given_workload())
            return
        if isinstance(wl, dict) and DEFAULT_WORKLOAD.keys() <= wl.keys():
            # a completed workload no living config owns (a copy of one, a config.json's):
            # its values equal to a default not given count as not given (given_workload's
            # rule), so a duration given later drops the default request count as before;
            # unless that would change it (a count kept with a duration: config.json)
            given = _given_of({}, wl)
            if with_defaults(given, DEFAULT_WORKLOAD) == wl:
                wl = given
        self.set_workload(wl)

    def set_workload(self, given: dict | None) -> None:
        """Set the workload options given; `workload` becomes them completed by the defaults
        that apply (`workload.spec.with_defaults`: none to a trace replay, no request count
        to a duration, no rate to an arrival that names its own)."""
        if given is None:
            given = {}
        if not isinstance(given, dict):
            raise ConfigError(f"workload must be a mapping (arrival, rate, prompt, output, ...), got {given!r:.60}")
        # kept apart from the defaults: an override (build_config) decides anew which apply
        self._workload_given = {k: option_number(k, v) for k, v in given.items() if v is not None}
        self.workload = with_defaults(self._workload_given, DEFAULT_WORKLOAD)
        _WORKLOAD_OF[id(self.workload)] = self

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        owner = _WORKLOAD_OF.get(id(self.workload))
        if owner is None or owner.workload is not self.workload:  # (a pickled or deep copy's own dict)
            _WORKLOAD_OF[id(self.workload)] = self

    def given_workload(self) -> dict:
        """The workload options given, without the defaults. A workload changed after
        construction (`cfg.workload[k] = v`, `dataclasses.replace`) counts as given except
        its values that equal a default not given, so the rules of `with_defaults` (no
        request count to a duration, ...) still apply to it. A workload set to None is
        the default workload, as `set_workload(None)` makes it; one that is no mapping is a
        ConfigError."""
        wl = self.workload
        if wl is None:
            return {}
        if not isinstance(wl, dict):
            raise ConfigError(f"workload must be a mapping (arrival, rate, prompt, output, ...), got {wl!r:.60}")
        return _given_of(self._workload_given, wl)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SimConfig:
        """A configuration from a mapping: a YAML file's, or a run's own `config.json` (known
        by its `provenance`; its output-only keys are ignored, elsewhere they are unknown). A
        `workload` section is completed by the default workload's options that apply to it,
        as the flags are (`set_workload`)."""
        if not isinstance(d, dict):
            raise ConfigError("a configuration must be a mapping of option names to values")
        layout = config_layout(d)
        if layout is not None:  # (its keys are no option of one server's: say what it is instead)
            what, function = LAYOUTS[layout]
            judged = ", `llmsched capacity --network FILE` judges it" if layout == "network" else ""
            raise ConfigError(
                f"this is {what}, not one server's: `llmsched simulate --{layout} FILE` runs it{judged} "
                f"({function} in Python)"
            )
        if {"key", "config", "summary"} <= set(d) and isinstance(d["config"], dict):
            # a sweep's point record holds a config; "unknown option 'config'" hid that
            raise ConfigError(
                "this is a sweep's point record (key, config, summary), not a configuration: write its "
                "'config' mapping to a file of its own to rerun that point"
            )
        if "provenance" in d:  # a run's own config.json: drop what describes the run's outputs
            if _caller_trace_run(d):
                raise ConfigError(caller_trace_message("DIR"))
            d = {k: v for k, v in d.items() if k not in OUTPUT_ONLY_KEYS}
        # (the constructor refuses an unknown option too, but this runs before the workload's
        # keys are checked: a misspelt option of the run stays the first error)
        misplaced = next((k for k in d if k not in _CONFIG_KEYS and k in _WORKLOAD_KEYS), None)
        if misplaced is not None:  # (a workload key at the top: the list of known keys does not say where it goes)
            raise ConfigError(f"{misplaced!r} is a workload option: put it under 'workload:' in the configuration")
        check_known("configuration option", d, _CONFIG_KEYS)
        if isinstance(d.get("workload"), dict):
            check_known("workload option", d["workload"], _WORKLOAD_KEYS)
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> SimConfig:
        d = read_yaml(path, "config")
        if _caller_trace_run(d):  # (the message names the run's own folder)
            raise ConfigError(caller_trace_message(os.path.dirname(str(path)) or "."))
        return cls.from_dict(d)

    def to_dict(self) -> dict:
        return asdict(self)

    def scheduler_spec(self) -> SchedulerSpec:
        """The policy, admission and limits of the run (its first eight fields)."""
        return SchedulerSpec.from_mapping(self)


_CONFIG_KEYS = {f.name for f in fields(SimConfig)}
# options that are numbers: a string given for one as a keyword is refused, not read
NUMBER_OPTIONS = frozenset(
    ("b_max", "k_max", "kv_capacity", "max_running", "max_time_s", "sample_interval_s")
    + ("rate", "cv", "time_scale", "num_requests", "duration_s", "seed", "system_prompt", "think_time_s")
)


def build_config(config: SimConfig | dict | str | os.PathLike | None = None, **overrides) -> SimConfig:
    """A SimConfig from a config (object, dict or YAML path) plus keyword overrides;
    workload keys (rate, prompt, output, num_requests, arrival, ...) go to the workload.
    A config.json of a run given a Trace object is refused unless a trace or workload is
    given anew (`caller_trace_message`): it records no requests."""
    if overrides.get("trace") is not None or overrides.get("workload") is not None:
        config = _without_caller_workload(config)
    if config is None:
        cfg = SimConfig()
    elif isinstance(config, SimConfig):
        cfg = SimConfig.from_dict({**config.to_dict(), "workload": config.given_workload()})
    elif isinstance(config, Mapping):
        cfg = SimConfig.from_dict(dict(config))
    elif isinstance(config, (str, os.PathLike)):
        cfg = SimConfig.from_yaml(config)
    else:
        raise ConfigError(f"config must be a SimConfig, a mapping or a YAML path, got {type(config).__name__}")
    given = None
    wl_over = {}
    for k, v in overrides.items():
        if v is None:
            continue
        if k in NUMBER_OPTIONS and isinstance(v, (str, bytes)):  # (a file's: _check_types, WorkloadSpec)
            raise ConfigError(f"{k} must be a number, got {v!r:.60}")
        if k in _CONFIG_KEYS and k != "workload":
            setattr(cfg, k, v)
        elif k == "workload":
            given = v
        elif k in _WORKLOAD_KEYS:
            wl_over[k] = v
        else:
            raise ConfigError(f"unknown option {k!r}")
    if given is not None:
        cfg.set_workload(given)
        _refuse_workload_twice(given, wl_over)
    if wl_over:
        cfg.set_workload(override_workload(cfg.given_workload(), wl_over))
    _check_types(cfg)
    return cfg


def _refuse_workload_twice(given: dict, over: dict) -> None:
    """A workload option given both as a keyword and in the `workload` mapping of the same
    call, with different values, is a ConfigError naming both: the keyword won, silently
    (`simulate(trace="a.csv", workload={"trace": "b.csv"})` replayed a.csv), whatever the
    spellings (`trace="a.csv"` beside `{"arrival": "trace:b.csv"}`, `rate=3` beside
    `{"arrival": "poisson:5"}`: `workload.spec.one_spelling`). (A config's workload is
    another matter: a keyword replaces it, as a flag replaces a file's.)"""

    def same(k: str, a, b) -> bool:
        if k == "trace" and isinstance(a, (str, os.PathLike)) and isinstance(b, (str, os.PathLike)):
            return os.path.realpath(a) == os.path.realpath(b)  # one file, two spellings
        return a == b

    theirs_of = {gk: one_spelling({gk: gv}) for gk, gv in given.items() if gv is not None}
    for k, v in over.items():
        mine = one_spelling({k: v})
        for gk, theirs in theirs_of.items():
            gv = given[gk]
            for key in mine.keys() & theirs.keys():
                if None not in (mine[key], theirs[key]) and not same(key, mine[key], theirs[key]):
                    raise ConfigError(
                        f"{k}={v!r} and workload={{{gk!r}: {gv!r}}} contradict each other: give {key} once"
                    )


def check_slo(slo) -> dict:
    """Per-request service-level objectives in ms (as `vllm bench serve --goodput`): a
    request meets them when its TTFT, its TPOT (its mean inter-token latency: `itl_ms`
    is the same limit, and `itl_p99_ms` an older name of `itl_ms`, not a p99) and its
    end-to-end latency are within the limits given. A run statistic such as
    `p99_itl_ms` (a sweep's rate-search SLO) is refused with the per-request name of the
    same quantity (`llmsched.core.slo`)."""
    if slo is None or (isinstance(slo, dict) and not slo):
        return {}
    from .core.slo import check_request_slo  # noqa: PLC0415 - its patterns cost start-up time

    return check_request_slo(slo)


def git_commit(start: Path) -> str | None:
    """The commit checked out in the git work tree holding `start`, read from `.git` (no git
    process: a run's start-up matters), or None outside one."""
    try:
        for d in (start, *start.parents):
            dot = d / ".git"
            if dot.is_dir():
                gitdir = dot
            elif dot.is_file():  # a linked work tree: "gitdir: PATH"
                text = dot.read_text().strip()
                if not text.startswith("gitdir:"):
                    return None
                gitdir = (d / text[len("gitdir:") :].strip()).resolve()
            else:
                continue
            head = (gitdir / "HEAD").read_text().strip()
            if not head.startswith("ref:"):
                return head or None  # a detached head
            ref = head[len("ref:") :].strip()
            common = gitdir
            if (gitdir / "commondir").is_file():
                common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
            for base in (gitdir, common):
                if (base / ref).is_file():
                    return (base / ref).read_text().strip() or None
            if (common / "packed-refs").is_file():
                for line in (common / "packed-refs").read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
            return None
    except OSError:
        return None
    return None


def provenance() -> dict:
    """Who made a run and how: llmsched's version and git commit (when it runs from a git
    checkout), the UTC time and the command line."""
    commit = git_commit(Path(__file__).resolve().parent)
    return {
        "llmsched_version": __version__,
        "git_commit": commit,
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command_line": list(sys.argv),
    }


def _check_types(cfg: SimConfig) -> None:
    """Every option has the type it needs (YAML makes it easy to write `b_max: true`)."""
    for name in ("b_max", "k_max", "kv_capacity", "max_running"):
        v = getattr(cfg, name)
        if v is None and name != "b_max":  # the others may be unset (no cap)
            continue
        if isinstance(v, (bool, str, bytes)):  # (`b_max: "512"` in YAML is text, as a network file says)
            raise ConfigError(f"{name} must be a positive integer, got {v!r:.60}{quoted_number(v)}")
        if not isinstance(v, (int, np.integer)):
            try:
                fv = float(v)
                if not math.isfinite(fv) or fv != int(fv):
                    raise ValueError
            except (TypeError, ValueError):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}") from None
            v = int(fv)
        setattr(cfg, name, int(v))
    times = {"max_time_s": lambda v: check_seconds("max_time_s", v), "sample_interval_s": check_sample_interval}
    for name, check in times.items():  # (seconds as a float: 60 and 60.0 are one value)
        setattr(cfg, name, option_number(name, check(getattr(cfg, name)), floats=(name,)))
    if isinstance(cfg.block_size, np.integer):  # a numpy integer is an integer here
        cfg.block_size = int(cfg.block_size)
    cfg.block_size = check_prefix_block_size(cfg.block_size)
    for name in ("fast", "verdict", "record_steps", "prefix_caching"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(cfg, name)!r}")
    for name in ("policy", "admission", "cost_model"):
        if not isinstance(getattr(cfg, name), str):
            raise ConfigError(f"{name} must be a name (a string), got {getattr(cfg, name)!r}")
    for name in ("policy_options", "admission_options"):
        if not isinstance(getattr(cfg, name), dict):
            raise ConfigError(f"{name} must be a mapping of option names to values, got {getattr(cfg, name)!r}")


def _setup(cfg: SimConfig):
    """A run's SLOs, scheduler (bound to its cost model) and cost model."""
    from .core.slo import itl_limit_ms  # noqa: PLC0415 - as check_slo

    slo = check_slo(cfg.slo)
    spec = cfg.scheduler_spec()
    itl = itl_limit_ms(slo)
    if itl is not None and paced_by_slo(spec.admission, spec.admission_options):
        # TWP and DynamicBatch pace to the user's ITL objective (an explicit target wins)
        spec = spec.replace(admission_options={**spec.admission_options, "itl_target_ms": itl})
    scheduler = spec.build()
    cost = make_cost_model(cfg.cost_model)
    scheduler.bind_cost_model(cost)
    return slo, scheduler, cost


def check_config(
    config: SimConfig | dict | str | os.PathLike | None = None, *, traces: dict | None = None, **overrides
) -> SimConfig:
    """Check a configuration as `simulate` would before its run, without running it: the
    options, SLOs, scheduler and cost model, the workload (a trace or length file read, a
    synthetic one drawn) and the run options against it. Raises the ConfigError `simulate`
    would; returns the configuration. `traces`: a dict the caller keeps to check many
    configurations (a sweep's points): each workload is drawn once in it."""
    cfg = build_config(config, **overrides)
    _, scheduler, _ = _setup(cfg)
    key = json.dumps([cfg.workload, cfg.block_size], sort_keys=True, default=str)
    trace = None if traces is None else traces.get(key)
    if cfg.prefix_caching:  # (the run cuts a trace's block ids to the cache's blocks: refused here as there)
        check_trace_blocks(WorkloadSpec.from_dict(cfg.workload), cfg.block_size)
    if trace is None:
        trace = make_trace(WorkloadSpec.from_dict(cfg.workload), cfg.block_size, blocks=False)  # (the check reads none)
        if traces is not None:
            traces[key] = trace
    check_run_inputs(trace, scheduler, cfg.max_time_s, cfg.sample_interval_s)
    return cfg


def simulate(
    config: SimConfig | dict | str | os.PathLike | None = None,
    *,
    trace: Trace | str | os.PathLike | None = None,
    out_dir: str | os.PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
    parquet: bool = False,
    **overrides,
) -> SimResult:
    """Run one simulation and return its `SimResult`; with `out_dir`, also write its files
    (with `parquet`, the Parquet tables too, before summary.json, which a write puts last).

    Examples: `simulate(policy="orca", rate=10, num_requests=1000, cost_model="paper")`,
    `simulate("run.yaml", out_dir="results")`, `simulate(trace=my_trace, b_max=256)`.

    `trace` is a trace file's path or a dataset's name (replayed as the workload, so the
    workload options such as `num_requests`, `duration_s`, `rate` and `time_scale` apply
    to it), or a `Trace` object, run as it is (checked again and copied: the result keeps
    its lengths whatever the caller's arrays become): it brings its own requests, so a
    workload option given with it, as a keyword or in `config`, is refused (ConfigError;
    cut or rescale the Trace instead, e.g. `Trace.head`, `Trace.until`,
    `Trace.time_scaled`), except `rate`, which is ignored with a warning; the workload a
    run's own config.json records (that run's, which made its requests.csv) is not applied.

    `overrides`: any of SimConfig's fields and the workload's keys (listed below), as in
    a config file; an unknown one is a ConfigError, and so is a workload option given both
    as a keyword (`trace` included) and in `workload=` with another value, in any spelling
    (`rate=3` beside `workload={"arrival": "poisson:5"}`, `trace=` beside `trace:F`).
    """
    check_progress(progress)
    if check_bool(parquet, "parquet") and out_dir is None:  # (parquet="no" is truthy: it wrote the tables)
        raise ConfigError("parquet=True writes Parquet tables into out_dir: give out_dir")
    if out_dir is not None:
        check_out_dir(out_dir)  # before the run, not after it
        check_run_dir(out_dir, "single-server")  # not over another run's or the user's files
    # a run's own config.json records the workload that made its requests, not one to apply
    # to a trace given now (a rerun with its requests.csv: the file, or Trace.from_csv of it;
    # the file took the config's rate, laws and count, and ran other requests at other times)
    if isinstance(trace, (str, os.PathLike)):  # a trace file: part of the workload
        overrides["trace"], trace = str(trace), None
        config = _without_caller_workload(config, _is_run_config)
    elif trace is not None:
        _check_trace_object(trace, overrides)
        trace = _rebuilt(trace)
        config = _without_caller_workload(config, _is_run_config)
    cfg = build_config(config, **overrides)
    if out_dir is not None:  # (a trace in out_dir named requests.csv: the run would replace it)
        check_inputs_not_replaced(out_dir, "single-server", cfg.to_dict())
    if trace is not None:
        _check_config_workload(cfg, warned=overrides.get("rate") is not None)
    slo, scheduler, cost = _setup(cfg)
    spec = None
    if trace is None:
        spec = WorkloadSpec.from_dict(cfg.workload)
        # block ids (where it has them) at the cache's block size, when a cache reads them
        trace = make_trace(spec, cfg.block_size, blocks=cfg.prefix_caching)
        workload_desc = spec.to_dict()
    else:
        workload_desc = {"trace": CALLER_TRACE, **trace.describe()} if hasattr(trace, "describe") else {}
        if overrides.get("rate") is not None:
            warn(f"rate={overrides['rate']} is ignored: the caller's trace sets the arrival times")
    replay = workload_desc.get("arrival", "trace") == "trace"  # a trace's own clock, not rescaled
    replay = replay and workload_desc.get("rate") is None and workload_desc.get("time_scale", 1.0) == 1.0
    # what the run refuses, before the warnings (a refused run prints its one line only)
    check_run_inputs(trace, scheduler, cfg.max_time_s, cfg.sample_interval_s)
    warn_implausible(cost, cfg, trace, replay=replay)
    # (a class mix draws its classes over one gamma stream, whose arrivals are the requests;
    # with turns they are the conversations)
    if spec is not None and spec.arrival == "gamma":
        unit = "conversations" if spec.turns is not None else "requests"
        loose = loose_rate(spec.cv or 1.0, arrivals_held(spec, trace), unit)
        if loose:
            warn(loose)
    if cfg.prefix_caching and getattr(trace, "block_ids", None) is None:
        warn(f"prefix caching has nothing to hit: {_no_block_ids(workload_desc)}, so every prompt is a miss")
    elif cfg.prefix_caching and _no_full_block(trace, cfg.block_size):
        warn(
            f"prefix caching has nothing to hit: no prompt is longer than one {cfg.block_size}-token block "
            "(a hit is whole blocks and leaves the prompt's last token to compute), so every prompt is a miss "
            "(a smaller block size would find the shared prefixes)"
        )
    elif cfg.prefix_caching and (short := _system_prompt_under_block(spec, cfg.block_size)):
        warn(
            f"prefix caching has nothing to hit: every system prompt is shorter than one {cfg.block_size}-token "
            f"block (the longest: {short} tokens), and without --turns "
            "requests share only the blocks wholly inside one, so every prompt is a miss "
            "(a block size at most the system prompt would share it)"
        )
    steps_tmp = None
    steps_file = None
    if cfg.record_steps:
        folder = Path(out_dir) if out_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        fd, steps_tmp = new_steps_file(folder)
        steps_file = os.fdopen(fd, "w", buffering=1 << 20)
        steps_file.write(STEPS_HEADER)
    t0 = time.perf_counter()
    try:
        stats = simulate_trace(
            trace,
            scheduler,
            cost,
            fast=cfg.fast,
            max_time_s=cfg.max_time_s,
            sample_interval_s=cfg.sample_interval_s,
            steps_file=steps_file,
            progress=progress,
            checked=True,  # (above, before the warnings)
        )
    except BaseException:
        if steps_file is not None:
            steps_file.close()
            steps_tmp.unlink(missing_ok=True)
        raise
    wall = time.perf_counter() - t0
    if steps_file is not None:
        steps_file.close()
    if hasattr(cost, "extrapolation") and not (cfg.k_max or cfg.max_running) and stats.batch_hist:
        # without a cap nothing bounds the decode batch before the run (b_max would warn for
        # batches no run reaches): the largest one it ran, its rows at the longest context
        # (the contexts themselves were judged before the run: only the batch's phrases)
        far = [
            f
            for f in cost.extrapolation(0, max(stats.batch_hist), longest_context(trace))
            if f.startswith(("decode batch", "decode_attn"))
        ]
        if far:
            warn(f"profile {cost.label!r} was extrapolated far past its grid: {'; '.join(far)} in this run")
    config_out = {
        **cfg.to_dict(),
        "cost_model": recorded_cost_model(cfg.cost_model),
        "workload": workload_desc,
        "cost_model_resolved": cost.describe(),
        "scheduler": scheduler.describe(),
        "provenance": provenance(),
    }
    result = SimResult(
        config_out,
        stats,
        np.asarray(trace.arrival_s),
        np.asarray(trace.prompt),
        np.asarray(trace.output),
        getattr(trace, "tag", None),
        wall_s=wall,
    )
    if steps_tmp is not None:
        result.own_steps(steps_tmp)
    result.slo = slo
    if cfg.verdict:
        result.stability = _stability_fields(result, cost, cfg, scheduler)
    if out_dir is not None:
        result.write(out_dir, parquet=parquet)
    return result


if simulate.__doc__ is not None:  # (python -OO drops docstrings)
    simulate.__doc__ = simulate.__doc__.rstrip() + (
        f"\n\n    SimConfig's fields: {', '.join(f.name for f in fields(SimConfig))}.\n"
        f"    Workload keys: {', '.join(f.name for f in fields(WorkloadSpec))}.\n"
    )


def _check_trace_object(trace, overrides: dict) -> None:
    """Refuse a `trace` that is no Trace (nor an object with its `arrival_s`, `prompt` and
    `output` arrays), and workload options given with a Trace object (but `rate`, ignored
    with a warning): its requests are run as they are."""
    if not isinstance(trace, Trace) and not all(hasattr(trace, a) for a in ("arrival_s", "prompt", "output")):
        raise ConfigError(
            f"trace must be a Trace (llmsched.workload.Trace), a trace file's path or a dataset's name, "
            f"got {type(trace).__name__}"
        )
    for k, v in overrides.items():
        if v is not None and k != "rate" and (k in _WORKLOAD_KEYS or k == "workload"):
            raise ConfigError(
                f"a Trace object brings its own requests: {k} does not apply to it; cut or rescale the "
                "Trace itself (Trace.head, Trace.until, Trace.time_scaled) or pass the trace file's path instead"
            )


def _rebuilt(trace) -> Trace:
    """The caller's trace as a new Trace, through its checks and on copies of its lengths
    and tags: an object with a Trace's arrays, or a Trace whose arrays were reassigned or
    changed since it was made, is run as checked, and the run's SimResult (whose summary is
    computed when first read) keeps the lengths it ran, whatever the caller's arrays become."""
    return Trace(
        trace.arrival_s,
        trace.prompt,
        trace.output,
        tag=getattr(trace, "tag", None),
        block_ids=getattr(trace, "block_ids", None),
        block_ptr=getattr(trace, "block_ptr", None),
        block_size=getattr(trace, "block_size", DEFAULT_BLOCK_SIZE),
    )


def _check_config_workload(cfg: SimConfig, warned: bool) -> None:
    """Refuse workload options a configuration gives with a Trace object, as `simulate`
    refuses them as keywords (a `rate` is ignored with a warning, as a keyword `rate` is):
    they would be dropped without a word."""
    given = cfg.given_workload()
    refused = [k for k in given if k != "rate"]
    if refused:
        raise ConfigError(
            f"a Trace object brings its own requests: the configuration's workload options ({', '.join(refused)}) "
            "do not apply to it; drop them, cut or rescale the Trace itself (Trace.head, Trace.until, "
            "Trace.time_scaled) or pass the trace file's path instead"
        )
    if "rate" in given and not warned:  # (`warned`: a keyword rate, whose own warning says it)
        warn(f"the configuration's rate={given['rate']} is ignored: the caller's trace sets the arrival times")


def _no_full_block(trace, block_size: int) -> bool:
    """Whether no prompt of `trace` can hit a block of `block_size` tokens: a hit is whole
    blocks short of the prompt's last token (`ServerState.admission_need`)."""
    prompt = getattr(trace, "prompt", None)
    return prompt is not None and len(prompt) > 0 and int(np.max(prompt)) <= block_size


def _system_prompt_under_block(spec: WorkloadSpec | None, block_size: int) -> int:
    """The longest system prompt of a synthetic one-turn workload (`spec`; None: a
    caller's trace) whose system prompts are all shorter than one block of `block_size`
    tokens, else 0: its requests share only the blocks wholly inside a system prompt
    (`stream_blocks`: every other block is its request's own), so none of them hits."""
    if spec is None or spec.turns is not None or spec.arrival == "trace":
        return 0
    default = spec.system_prompt or 0
    sizes = [default if c.system_prompt is None else c.system_prompt for c in spec.classes or ()] or [default]
    longest = max(sizes)
    return longest if longest < block_size else 0


def _no_block_ids(workload: dict) -> str:
    """Why a workload's requests carry no prefix-cache block ids, for the warning."""
    if workload.get("arrival") == "trace":
        return (
            f"trace {workload.get('trace')} has no block ids (a block_ids@B column or Mooncake's hash_ids; "
            "Azure and BurstGPT traces have none)"
        )
    if "arrival" in workload:
        return "the synthetic workload shares no prefixes (give it --system-prompt N or --turns)"
    return "the trace has no block ids"


#: the warning of a block size given without a prefix cache (`BlockSizeUnusedWarning`)
def unused_block_sizes(cfgs) -> list[int]:
    """The block sizes given (not the default) to configurations `cfgs` when none of them
    has a prefix cache, for the warning; [] when one has, or none was given."""
    if any(c.prefix_caching for c in cfgs):
        return []
    return sorted({c.block_size for c in cfgs if c.block_size != SimConfig.block_size})


MIN_TRACE_RATE = 0.01  # req/s: a replayed trace slower than this probably has its times in ms


def warn_implausible(cost, cfg: SimConfig, trace, replay: bool) -> None:
    """Warn (one line each, the run goes on) about inputs that are valid but probably not
    meant: a step under 0.1 ms, a replayed trace under 0.01 req/s, a profile cost model
    used far past its measured grid, a block size without prefix caching."""
    unused = unused_block_sizes([cfg])
    if unused:
        warn_block_size_unused(unused)
    warn_fast_steps(cost, cfg.cost_model)
    arrival = np.asarray(trace.arrival_s, dtype=np.float64)
    if replay and len(arrival) > 1:
        span = float(arrival[-1] - arrival[0])
        rate = (len(arrival) - 1) / span if span > 0 else math.inf
        if rate < MIN_TRACE_RATE:
            warn(
                f"the trace's mean arrival rate is {rate:.3g} req/s, under {MIN_TRACE_RATE} req/s: are its arrival "
                "times in seconds? (--time-scale K or --rate R rescales a trace)"
            )
    if hasattr(cost, "extrapolation"):
        warn_profile_reach(cost, cfg, longest_context(trace), len(trace.prompt))


def longest_context(trace) -> int:
    """The longest context a request of `trace` reaches: its prompt + output - 1 (0 for none)."""
    need = np.asarray(trace.prompt, dtype=np.int64) + np.asarray(trace.output, dtype=np.int64) - 1
    return int(need.max()) if len(need) else 0


def warn_profile_reach(cost, cfg: SimConfig, context: int, requests: int | None = None) -> None:
    """Warn when a measured profile is used more than twice past its grid: the token load
    and prefill chunk at `cfg.b_max`, the decode batch where `k_max` or `max_running` caps it
    (at most `requests`, when given), the context up to `context` tokens (the longest
    request's prompt + output - 1). No-op for other cost models (`simulate` and `capacity`)."""
    if not hasattr(cost, "extrapolation"):  # a measured profile (no import of core.profile for the others)
        return
    # the decode batch only where a cap sets it: without one, b_max bounds it far above what runs
    caps = [x for x in (cfg.k_max, cfg.max_running) if x]
    bounds = [*caps, cfg.b_max, *([requests] if requests is not None else [])]
    batch = min(bounds) if caps else 0
    warn_past_grid(cost, cfg.b_max, batch, context)


def config_policy_capacity(
    cfg: SimConfig, best: float, fill: float, region_exact: bool | None = None, admission=None
) -> float | None:
    """The token rate (tokens/s) the configuration's scheduler serves under a backlog, where
    theory says it: `policies.scheduler_policy_capacity`'s rule (`fill`, full steps of
    b_max, for a work-conserving policy without a binding cap; `best`, lambda*'s steps, for
    adaptive unless `region_exact` is False; None behind an admission or a running cap that
    holds work back, and with a finite KV capacity). The one rule of `simulate`'s summary,
    a rate search's groups and a network's servers. `admission`: the run's admission
    policy, already built (its running cap included), judged as it is rather than made
    again from the configuration's names (a registered factory is called once per run)."""
    return scheduler_policy_capacity(cfg, best, fill, region_exact, admission)


def _burst_factor(cfg: SimConfig) -> float:
    """(1 + cv^2) / 2 for gamma arrivals with cv > 1 (a relaxation time that many times a
    Poisson stream's), else 1."""
    try:
        spec = WorkloadSpec.from_dict(cfg.workload)
    except ConfigError:
        return 1.0
    return burst_factor(spec.cv if spec.arrival == "gamma" and spec.cv is not None else 1.0)


def guard_time_s(result: SimResult, b_max: int) -> tuple[float | None, bool]:
    """The time scale of the verdict's short-window guard (`stability_verdict`'s
    decode_time_s: a window under MIN_DECODE_TIMES of it needs proportionally faster growth
    to be called unstable), and whether the floor below set it: a request's service time
    if every step served it, the run's mean step time times its steps
    (`theory.verdict.service_steps`: ceil(mean prompt / b_max) prefill steps, the first
    token among them, then mean output - 1 decode steps); but no less than the time in
    which MIN_JUDGED_ARRIVALS / MIN_DECODE_TIMES requests arrive
    (`theory.verdict.short_window_time_s`, which a network's verdicts share), so that a
    judged window of 20 holds MIN_JUDGED_ARRIVALS arrivals: over fewer, the arrivals' own
    surplus (about sqrt(n) of n) passes for growth of a stable queue, and a prefill-heavy
    workload's service time (a step or a few) is far shorter than that. (None, False)
    before any step."""
    st = result.stats
    if not st.steps or not len(result.output):
        return None, False
    steps = service_steps(float(result.prompt.mean()), float(result.output.mean()), b_max)
    return short_window_time_s(st.busy_ns / NS / st.steps * steps, result.offered_rate)


def _longest_prefill(result: SimResult) -> int:
    """The most prompt tokens a request of this run computes at its first admission: its
    prompt less the prefix the cache served it then (`RunStats.prefix_hits`, 0 for a
    request never admitted), the whole prompt without a prefix cache. The region's cap on
    a request's prefill per step (`max_prefill_per_request`); recomputation after a
    preemption is not work, as `cached_prompt_tokens_per_request` counts it."""
    prompt = np.asarray(result.prompt, dtype=np.int64)
    hits = result.stats.prefix_hits
    if hits is None or len(hits) != len(prompt):
        return int(prompt.max())
    return int((prompt - np.asarray(hits, dtype=np.int64)).max())


def _workload_hits(result: SimResult) -> tuple[np.ndarray | None, int]:
    """Each request's prompt tokens found cached at its first admission, as theorem 2 takes
    them (not work), and how many requests that rests on (those the run admitted). A
    request never admitted (a `max_time_s` stop) found nothing yet, which says nothing
    about what it would find: it counts at the admitted requests' hit rate (their cached
    share of their prompt tokens), rounded down and below its prompt. None without a
    prefix cache."""
    st = result.stats
    hits = st.prefix_hits
    prompt = np.asarray(result.prompt, dtype=np.int64)
    if hits is None or len(hits) != len(prompt):
        return None, 0
    hits = np.asarray(hits, dtype=np.int64)
    admitted = np.asarray(st.queue_ns) >= 0  # first scheduled
    k = int(admitted.sum())
    if 0 < k < len(prompt):
        share = int(hits[admitted].sum()) / int(prompt[admitted].sum())
        rest = ~admitted
        hits = hits.copy()
        hits[rest] = np.minimum(np.floor(share * prompt[rest]).astype(np.int64), prompt[rest] - 1)
    return hits, k


def _stability_fields(result: SimResult, cost, cfg: SimConfig, scheduler) -> dict:
    """Theorem 2's capacity for this workload and the run's stability verdict."""
    out: dict[str, Any] = {}
    arrivals = result.arrival_ns / NS  # as the clock took them (a replay of requests.csv: the same)
    n = len(arrivals)
    rate = result.offered_rate
    # with prefix caching, the prompt tokens a request finds cached when first admitted are
    # not work (hits again after a preemption only save the recomputation, no part of it)
    # (a request the run never admitted: at the admitted ones' hit rate, `_workload_hits`)
    pc = result.stats.prefix
    hits, measured = _workload_hits(result) if pc is not None else (None, 0)
    if hits is not None:
        cached = int(hits.sum()) / n if n else 0.0
    else:
        cached = pc["first_admission_hit_tokens"] / n if pc is not None and n else 0.0
    capped = k_max_binds(cfg.b_max, cfg.k_max)
    try:
        rep = capacity(
            cost,
            cfg.b_max,
            float(result.prompt.mean()),
            float(result.output.mean()),
            k_max=cfg.k_max,
            rate=rate,
            cached_prompt=cached,
            peak=False,  # not reported here, and its scan of every load is slow at large budgets
            # with a binding cap, no request of this run supplies more prefill in a step than
            # it computes at its first admission: its prompt less the prefix it found cached
            # (a request never admitted: its whole prompt)
            max_prefill_per_request=_longest_prefill(result) if capped and n else None,
            # the run's own lengths, each prompt's uncached tokens after the prefix it found cached
            mix=None if cost.load_only else LengthMix(result.prompt, result.output, hits),
        )
    except ConfigError:
        return out
    if pc is not None:
        out["cached_prompt_tokens_per_request"] = cached
        if hits is not None:
            out["cached_prompt_measured_requests"] = measured  # whose own hits it averages
    out["token_capacity"] = rep.token_capacity
    out["critical_rate"] = rep.critical_rate
    out["offered_rate"] = rate
    # offered_rate x work per request (net of the prompt tokens found cached at first
    # admission): over token_capacity, the utilisation where lambda* = token_capacity / work
    out["offered_work_rate"] = rep.offered_tokens_per_s
    out["utilisation"] = rep.utilisation
    # this run's policy at its own limit, where theory says it (`config_policy_capacity`)
    limit = config_policy_capacity(
        cfg, rep.effective_capacity, rep.fill_capacity, rep.region_exact, scheduler.admission
    )
    offered = rep.offered_tokens_per_s
    out["policy_critical_rate"] = None if limit is None else limit / rep.work_per_request
    out["policy_utilisation"] = None if limit is None or offered is None else offered / limit
    # the backlog counts a waiting request's whole prompt (the prefix the cache serves it
    # leaves the backlog only at admission: core.state), so a saturated server drains
    # gross / work backlog tokens per token of work: the growth predicted in work tokens,
    # and the threshold's capacity, are scaled into the backlog's units
    units = (rep.work_per_request + cached) / rep.work_per_request if cached else 1.0
    # the fluid growth of this policy's backlog; where its limit is unknown, the growth at
    # lambda*'s steps (the best policy's, so a lower bound on this one's)
    growth = (
        max(0.0, offered - limit) if limit is not None and offered is not None else rep.predicted_growth_tokens_per_s
    )
    out["predicted_backlog_growth_tokens_per_s"] = growth * units if growth is not None else None
    ts = result.timeseries
    t, w = ts["time_s"], ts["backlog_tokens"]
    keep = t <= float(arrivals.max())  # judge while requests arrive, not while the queue drains
    # the time scale of the short-window guard (`guard_time_s`); bursty arrivals relax
    # (1 + cv^2) / 2 times more slowly (Kingman): the judged window must be as much longer
    # for its 20 service times to mean as much (docs/stability.md)
    burst = _burst_factor(cfg)
    service, floored = guard_time_s(result, cfg.b_max)
    decode_time = service * burst if service is not None else None
    decode_of = "request" if burst == 1 else f"burst-scaled ((1 + cv^2) / 2 = {burst:.3g}) request"
    time_of = guard_time_of(floored)
    try:
        v = stability_verdict(
            t[keep],
            w[keep],
            # growth is material relative to what this server processes: the run's policy's
            # own limit where theory gives it (adaptive: lambda*'s steps, which can serve far
            # more than full steps where b / t(b) peaks below b_max), else what a policy
            # filling the budget gets (CapacityReport.fill_capacity), as a network judges;
            # in the backlog's units
            capacity=(limit if limit is not None else rep.fill_capacity) * units,
            predicted_growth_tokens_per_s=out["predicted_backlog_growth_tokens_per_s"],
            decode_time_s=decode_time,
            decode_of=decode_of,
            time_of=time_of,
            # above lambda* no policy is stable (theorem 2), above its own limit no such policy:
            # a backlog that does not grow there is draining (`LOAD_MARGIN`)
            load=out["policy_utilisation"] if out["policy_utilisation"] is not None else rep.utilisation,
            # a trace whose arrivals thin out in the judged half (a late straggler) says nothing
            arrival_times=arrivals,
            # a rise of under one request's work (in the backlog's units) over the judged
            # window is a light load's chance, not growth, as a network's replica judges it;
            # not under a binding cap, where requests pile up with a few tokens each
            # (`_judge_requests` judges the slow drift then)
            min_rise=None if capped else rep.work_per_request + cached,
        )
    except ConfigError as e:  # too few samples to judge
        out.update(stable=None, verdict=INCONCLUSIVE, verdict_reason=f"too short: {e}")
        return out
    out["stable"] = v.stable  # True, False, or None when inconclusive
    out["verdict"] = v.verdict
    out["verdict_reason"] = v.reason
    out["backlog_growth_tokens_per_s"] = v.growth_per_s
    out["backlog_growth_ci"] = [v.ci_low, v.ci_high]
    out["verdict_conclusive"] = bool(v.conclusive)
    out["verdict_threshold_tokens_per_s"] = v.threshold_per_s
    if capped and rep.critical_rate > 0:
        _judge_requests(
            out, v, t[keep], (ts["waiting_requests"] + ts["running_requests"])[keep], rep, cfg, decode_time, time_of
        )
    return out


#: with a binding k_max, requests in the system growing faster than this share of lambda*
#: make a run whose tokens drift slowly unstable (`_judge_requests`; docs/stability.md)
REQUESTS_GROWTH_SHARE = 0.25


def _judge_requests(out: dict, tokens, t, in_system, rep, cfg: SimConfig, decode_time, time_of: str) -> None:
    """With a binding k_max, the number of requests in the system judged too, against
    REQUESTS_GROWTH_SHARE * lambda* requests/s: when decode slots are the bottleneck the
    requests that pile up are decoders with a few tokens left each, a backlog that grows
    in requests far faster than in tokens. It decides only a token verdict of slow drift
    (the growth's interval above 0, the growth below the threshold): unstable when the
    requests grow past their threshold with an interval above 0; any other token verdict
    stands. (The share is far above the tokens' 2%: near the region's boundary a stable
    policy's decoders take long to reach their level, and over a short run grow by up to
    16% of lambda* a second: docs/stability.md.)"""
    r = stability_verdict(
        t,
        in_system,
        capacity=rep.critical_rate,
        eps=REQUESTS_GROWTH_SHARE,
        decode_time_s=decode_time,
        time_of=time_of,
        what="the number of requests in the system",
        unit="requests",
        rate_format=".3g",
    )
    out["requests_verdict"] = r.verdict
    out["requests_growth_per_s"] = r.growth_per_s
    out["requests_growth_ci"] = [r.ci_low, r.ci_high]
    out["requests_threshold_per_s"] = r.threshold_per_s
    drift = tokens.verdict == INCONCLUSIVE and tokens.ci_low > 0
    if drift and r.verdict == UNSTABLE:
        out.update(
            stable=False,
            verdict=UNSTABLE,
            verdict_conclusive=bool(r.conclusive),
            verdict_reason=(
                f"{r.reason} (k_max {cfg.k_max} < b_max {cfg.b_max}: decoders pile up holding few tokens each; "
                f"the token backlog alone: {tokens.verdict})"
            ),
        )


def simulate_network(network, **options):
    """Simulate a network of servers and job routes (a `NetworkSpec`, a mapping or a YAML
    path); see `llmsched.sim.network_result.simulate_network` for the options."""
    # the network modules load only when asked for: single-server runs start faster
    from .sim.network_result import simulate_network as run  # noqa: PLC0415

    return run(network, **options)


def cluster_network(
    config: SimConfig | dict | str | os.PathLike | None = None, *, replicas: int, router: str = "jsq", **overrides
) -> NetworkSpec:
    """The network of one server with `replicas` copies of the configured scheduler and
    cost model behind `router`, fed by the configured synthetic workload (each workload
    class becomes a job type with its share of the rate and its system prompt, so several
    classes need Poisson arrivals, the one process that splits into such streams). With
    prefix caching each replica keeps its own cache. The run's own options (`max_time_s`,
    `sample_interval_s`, `fast`) are `simulate_network`'s: given here as keywords they are
    refused (a `config`'s are left to the caller, as the command line does); per-request
    SLOs and recorded steps are for one server and refused."""
    from .workload.network import NetworkSpec  # noqa: PLC0415 - see simulate_network

    for k in ("max_time_s", "sample_interval_s", "fast", "verdict"):
        if overrides.get(k) is not None:
            what = "a network judges each server itself" if k == "verdict" else "an option of the run"
            raise ConfigError(
                f"cluster_network does not take {k} ({what}): pass the run's options to "
                "simulate_network(cluster_network(...), max_time_s=..., sample_interval_s=..., fast=...)"
            )
    cfg = build_config(config, **overrides)
    if cfg.slo:
        raise ConfigError("slo (goodput against per-request limits) is for one server; a cluster reports no goodput")
    if cfg.record_steps:
        raise ConfigError("record_steps is for one server; a cluster writes calls.csv and per-replica outputs")
    unused = unused_block_sizes([cfg])  # (the cluster's servers leave it out: said here, as one server says it)
    if unused:
        warn_block_size_unused(unused)
    # the scheduler and cost model are checked as one server checks them, in its words: the
    # network's would name 'servers.cluster', a key of the generated spec no user wrote
    cfg.scheduler_spec().build()
    make_cost_model(cfg.cost_model)
    spec = WorkloadSpec.from_dict(cfg.workload)
    if spec.arrival not in ("poisson", "gamma", "deterministic"):
        raise ConfigError(
            "--replicas takes a synthetic workload (poisson, gamma or deterministic arrivals); "
            "a trace's arrival times replay on one server only (a --network file's job types take "
            "synthetic arrivals too; --prompt/--output replay:PATH replays a file's lengths)"
        )
    if spec.turns is not None:
        raise ConfigError(
            "--turns is for one server: describe multi-turn jobs in a --network file "
            "(a loop of calls with context: grow, docs/networks.md)"
        )
    if spec.classes and len(spec.classes) > 1 and spec.arrival != "poisson":
        # a network job type has its own arrival stream and no node that picks a class by
        # share, so each class would arrive as its own stream; only a Poisson stream splits exactly
        raise ConfigError(
            f"--replicas with {len(spec.classes)} workload classes needs poisson arrivals: a cluster gives "
            f"each class its own {spec.arrival} stream at rate x share, not one {spec.arrival} stream whose "
            "requests draw a class (use poisson, one class, or one server)"
        )
    if spec.num_requests is not None and spec.num_requests > MAX_REQUESTS and spec.duration_s is None:
        # (in the request count's words, before the network's num_jobs check says it in its own)
        raise count_over_the_limit(spec.num_requests)
    rate = spec.rate * spec.time_scale  # time_scale k: arrivals k times as fast
    arrival = {"process": spec.arrival, "rate": rate}
    if spec.cv is not None and spec.arrival == "gamma":
        arrival["cv"] = spec.cv
    classes = spec.classes or [None]
    shares = class_shares(spec.classes) if spec.classes else [1.0]
    total = sum(shares)
    jobs = {}
    for c, share in zip(classes, shares):
        prompt = c.prompt if c is not None and c.prompt is not None else spec.prompt
        output = c.output if c is not None and c.output is not None else spec.output
        name = c.tag if c is not None else "request"
        system = c.system_prompt if c is not None and c.system_prompt is not None else spec.system_prompt
        jobs[name] = {
            "arrival": {**arrival, "rate": rate * (share / total if c is not None else 1.0)},
            "system_prompt": system or 0,
            "route": [
                {"call": {"server": "cluster", "prompt": prompt.to_str(), "output": output.to_str(), "class": name}}
            ],
        }
    sched = cfg.scheduler_spec().to_dict()
    if not sched["prefix_caching"]:
        del sched["prefix_caching"], sched["block_size"]
    server = {
        **sched,
        "cost_model": cfg.cost_model,
        "replicas": replicas,
        "router": router,
    }
    try:
        network = NetworkSpec.from_dict(
            {
                "servers": {"cluster": server},
                "jobs": jobs,
                "num_jobs": spec.num_requests,
                "duration_s": spec.duration_s,
                "seed": spec.seed,
            }
        )
    except ConfigError as e:  # (replicas, router: named without the generated spec's key)
        raise ConfigError(str(e).removeprefix("servers.cluster: ")) from None
    given = overrides.get("kv_capacity") is not None
    network.kv_capacity_from = "kv_capacity= of cluster_network" if given else "kv_capacity of cluster_network's config"
    return network
