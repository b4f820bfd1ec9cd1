"""Serverless LLM platforms described in one YAML file: GPU nodes with a checkpoint
storage hierarchy, several models sharing them, their traffic, and the platform's rules
(cold starts, keep-alive, scale-out, routing, the platform scheduler).

`docs/serverless.md` documents the format with a complete example; the runtime is
`llmsched.sim.serverless`. Top-level sections:

- `cluster`: `remote_bandwidth_gbps` (the remote checkpoint store, GB/s per node) and
  `nodes`, a list of node groups (`NodeGroup`: count, gpus per node, GPU memory, host
  DRAM checkpoint cache and local SSD, each with a size in GB and a bandwidth in GB/s, and
  the checkpoints they hold at the start).
- `models`: name -> `ModelSpec` (weights in GB, KV bytes per token or a KV capacity in
  tokens, cost model spec, scheduler fields).
- `workload`: `ServerlessWorkload` (one total rate split by popularity, a rate per model,
  or a trace with a `model` column).
- `platform`: `PlatformSpec` (scheduler, router, cold-start constant, keep-alive,
  scale-out threshold, instance limits, ServerlessLLM's parameters).
- `run` (optional): `RunOptions`, the options of the run itself that a run's
  `config.json` records so that it reproduces the run (`max_time_s`, `fast`, `slo`).

Every error is one `ConfigError` line naming its place, e.g.
`cluster.nodes[0].ssd_bandwidth_gbps: must be a number > 0, got -1`.
Sizes are GB (10^9 bytes), bandwidths GB/s, times seconds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..core.checks import as_real
from ..core.checks import quoted_number as _quoted
from ..core.constraints import MAX_KV_TOKENS
from ..core.cost import make_cost_model, recorded_cost_model
from ..core.errors import ConfigError
from ..core.names import ADMISSION_ALIASES, ADMISSION_NAMES
from ..core.request import MAX_SECONDS, check_seconds, seconds_problem
from ..core.slo import check_request_slo
from ..core.yamlfile import read_yaml
from .arrivals import MAX_REQUESTS, make_arrival_process, refuse_short_merge, times_for_merge
from .csvio import CSV_UNSAFE, as_lengths, read_columns
from .datasets import is_dataset, recorded_file, resolve_path
from .lengths import LengthLaw, parse_length_law, sample_pair
from .network import _as_number, _at, _mapping, _seed, _show, _suggest
from .spec import _rng, load_trace, warn_short_trace
from .trace import replay_cut, replayed_times, trace_format

__all__ = [
    "PLATFORM_SCHEDULERS",
    "ROUTERS",
    "SCHEDULER_ADMISSION",
    "TIERS",
    "ModelSpec",
    "ModelTraffic",
    "NodeGroup",
    "PlatformSpec",
    "RunOptions",
    "ServerlessRequests",
    "ServerlessSpec",
    "ServerlessWorkload",
    "load_serverless",
    "scheduler_key",
    "make_serverless_requests",
]

#: Platform policies (paper 2, Table II) and the admission policy each gives every instance.
SCHEDULER_ADMISSION = {
    "fcfs": "fcfs",
    "round-robin": "fcfs",
    "priority": "spf",
    "dynamicbatch": "dynamicbatch",
    "twp": "twp",
    "serverlessllm": "fcfs",
}
PLATFORM_SCHEDULERS = tuple(SCHEDULER_ADMISSION)
_SCHEDULER_ALIASES = {
    "rr": "round-robin",
    "round_robin": "round-robin",
    "roundrobin": "round-robin",
    "spf": "priority",
    "dynamic-batch": "dynamicbatch",
    "dynamic_batch": "dynamicbatch",
    "token-window-pacing": "twp",
    "serverless-llm": "serverlessllm",
    "sllm": "serverlessllm",
}
ROUTERS = ("least-loaded", "round-robin")
TIERS = ("dram", "ssd", "remote")
# admission policy names (and aliases) a keyed `admission_options` mapping may use
_ADMISSION_NAMES = (*ADMISSION_NAMES, *ADMISSION_ALIASES)

DEFAULT_PROMPT = "lognormal:mean=1024,sigma=1.0,max=8192"
DEFAULT_OUTPUT = "geometric:mean=256,max=2048"

_TOP_KEYS = ("cluster", "models", "workload", "platform", "run")
#: what a run's config.json adds to the platform: its schedulers as they ran, and the
#: SLO of the run where `r.slo` was set after it (`provenance.slo_of_run`)
OUTPUT_ONLY_KEYS = ("schedulers", "provenance")
_CLUSTER_KEYS = ("remote_bandwidth_gbps", "nodes")
_NODE_KEYS = (
    "name",
    "count",
    "gpus",
    "gpu_memory_gb",
    "dram_gb",
    "dram_bandwidth_gbps",
    "ssd_gb",
    "ssd_bandwidth_gbps",
    "dram",
    "ssd",
)
_MODEL_KEYS = (
    "weights_gb",
    "kv_bytes_per_token",
    "kv_capacity",
    "cost_model",
    "policy",
    "admission",
    "b_max",
    "k_max",
    "policy_options",
    "admission_options",
    "max_instances",
    "keep_alive_s",
)
_WORKLOAD_KEYS = (
    "arrival",
    "rate",
    "cv",
    "popularity",
    "prompt",
    "output",
    "trace",
    "time_scale",
    "num_requests",
    "duration_s",
    "seed",
    "models",
)
_TRAFFIC_KEYS = ("share", "rate", "arrival", "cv", "prompt", "output")
_PLATFORM_KEYS = (
    "scheduler",
    "router",
    "init_s",
    "keep_alive_s",
    "scale_out_tokens",
    "max_instances",
    "gpu_memory_utilization",
    "serverlessllm",
)
_SLLM_KEYS = ("load_speedup", "migration", "alpha_s_per_token", "beta_s")
_RUN_KEYS = ("max_time_s", "fast", "slo")


# ------------------------------------------------------------------------------ helpers


def _section(value, where: str, what: str) -> dict:
    """An optional section: left out or null is empty; anything else must be a mapping
    (`platform: false`, `run: []` or `workload.models: 0` ran as if empty, and
    `serverlessllm: false` left ServerlessLLM's migration on)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        hint = ""
        if where == "platform.serverlessllm" and value is False:
            hint = " (to turn its live migration off: serverlessllm: {migration: false})"
        raise _at(where, f"{what} must be a mapping, got {_show(value)} ({type(value).__name__}){hint}")
    return _mapping(value, where, what)


def _keys(d: dict, allowed, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise _at(where, f"unknown key '{k}'{_suggest(k, allowed)}; known: {', '.join(allowed)}")


MAX_NODES = 1 << 16  # nodes of one kind
MAX_GPUS_PER_NODE = 1 << 10
# GPUs of all node groups together: the runtime holds an object per GPU and per node (a
# run of 10 requests sets up 1,048,576 GPUs in 3.6 s and 281 MB as 65,536 nodes of 16, in
# 8.4 s and 1.7 GB as 1,048,576 nodes of one; 16,777,216 GPUs took 24 s and 2.4 GB, and
# the 67,108,864 the per-group caps allow ran out of memory: docs/serverless.md)
MAX_GPUS = 1 << 20
MAX_GPU_MEMORY_GB = 1e6  # per GPU: far above any GPU, and its KV tokens stay finite


def _num(
    value,
    where: str,
    *,
    lo: float = 0.0,
    lo_open: bool = False,
    inf_ok: bool = False,
    hi: float | None = None,
    text: bool = False,
) -> float:
    """A finite number >= lo (> lo with lo_open) and <= hi; `inf_ok` also accepts inf / never.
    A string only with `text` (a number inside a spec's text, such as zipf:1.2): a quoted
    number in the file is refused, as in a network file."""
    if inf_ok and isinstance(value, str) and value.strip().lower() in ("inf", "never", "forever"):
        return math.inf
    x = _as_number(value, text)
    try:
        f = math.nan if x is None else float(x)
    except OverflowError:  # an int past the largest float
        f = math.inf
    bad = math.isnan(f) or (math.isinf(f) and not (inf_ok and f > 0)) or (f <= lo if lo_open else f < lo)
    if bad:
        cmp = ">" if lo_open else ">="
        extra = " (or never)" if inf_ok else ""
        raise _at(where, f"must be a number {cmp} {lo:g}{extra}, got {_show(value)}{'' if text else _quoted(value)}")
    if hi is not None and f > hi and not math.isinf(f):
        raise _at(where, f"must be at most {hi:g}, got {_show(value)}")
    return f


def _whole(value, where: str, minimum: int = 1, optional: bool = False, maximum: int | None = None) -> int | None:
    if value is None and optional:
        return None
    x = as_real(value)  # a quoted number is text, as in a network file
    if x is None or not (type(x) is int or (math.isfinite(x) and x.is_integer())) or x < minimum:
        raise _at(where, f"must be a whole number >= {minimum}, got {_show(value)}{_quoted(value)}")
    if maximum is not None and x > maximum:
        raise _at(where, f"must be at most {maximum:,}, got {_show(value)}")
    return int(x)


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _at(where, f"must be a non-empty string, got {_show(value)}")
    s = value.strip()
    if any(c in s for c in CSV_UNSAFE):
        raise _at(where, f"{s!r} must not contain commas, quotes, newlines or carriage returns")
    return s


def _law(value, where: str, role: str) -> LengthLaw:
    try:
        return parse_length_law(value, role)
    except ConfigError as e:
        raise _at(where, str(e)) from None


# ------------------------------------------------------------------------------ cluster
@dataclass
class NodeGroup:
    """`count` identical nodes of `gpus` GPUs each. Every node has its own host-DRAM
    checkpoint cache (`dram_gb`, read at `dram_bandwidth_gbps`) and local SSD (`ssd_gb`,
    `ssd_bandwidth_gbps`); a size of 0 means no such tier. `dram` / `ssd`: checkpoints
    (model names) each node of the group holds at the start, least recently used first."""

    name: str = "node"
    count: int = 1
    gpus: int = 1
    gpu_memory_gb: float = 80.0
    dram_gb: float = 0.0
    dram_bandwidth_gbps: float = 20.0
    ssd_gb: float = 0.0
    ssd_bandwidth_gbps: float = 4.0
    dram: list = field(default_factory=list)
    ssd: list = field(default_factory=list)

    def validate(self, where: str) -> NodeGroup:
        self.name = _name(self.name, f"{where}.name")
        self.count = _whole(self.count, f"{where}.count", maximum=MAX_NODES)
        self.gpus = _whole(self.gpus, f"{where}.gpus", maximum=MAX_GPUS_PER_NODE)
        self.gpu_memory_gb = _num(self.gpu_memory_gb, f"{where}.gpu_memory_gb", lo_open=True, hi=MAX_GPU_MEMORY_GB)
        for tier in ("dram", "ssd"):
            size = _num(getattr(self, f"{tier}_gb"), f"{where}.{tier}_gb")
            bw = _num(getattr(self, f"{tier}_bandwidth_gbps"), f"{where}.{tier}_bandwidth_gbps", lo_open=True)
            setattr(self, f"{tier}_gb", size)
            setattr(self, f"{tier}_bandwidth_gbps", bw)
            held = getattr(self, tier)
            if held is None:
                held = []
            if isinstance(held, str) or not isinstance(held, (list, tuple)):
                raise _at(f"{where}.{tier}", f"must be a list of model names, got {_show(held)}")
            names = [_name(m, f"{where}.{tier}[{i}]") for i, m in enumerate(held)]
            dup = sorted({m for m in names if names.count(m) > 1})
            if dup:
                raise _at(f"{where}.{tier}", f"model '{dup[0]}' is listed twice")
            setattr(self, tier, names)
        return self

    def node_names(self) -> list[str]:
        """Its nodes' names: the group's name alone for one node, else name0, name1, ..."""
        return [f"{self.name}{k}" for k in range(self.count)] if self.count > 1 else [self.name]

    def describe(self) -> str:
        """The group and the names it gives its nodes, for error messages."""
        if self.count == 1:
            return f"group '{self.name}' (one node, named {self.name})"
        return f"group '{self.name}' (count {self.count}: nodes {self.name}0..{self.name}{self.count - 1})"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "count": self.count,
            "gpus": self.gpus,
            "gpu_memory_gb": self.gpu_memory_gb,
            "dram_gb": self.dram_gb,
            "dram_bandwidth_gbps": self.dram_bandwidth_gbps,
            "ssd_gb": self.ssd_gb,
            "ssd_bandwidth_gbps": self.ssd_bandwidth_gbps,
            "dram": list(self.dram),
            "ssd": list(self.ssd),
        }


# ------------------------------------------------------------------------------- models
@dataclass
class ModelSpec:
    """One model: `weights_gb` (the checkpoint, loaded whole onto one GPU), its KV cache
    (`kv_capacity` tokens per instance, or `kv_bytes_per_token` and the GPU memory left
    after the weights; neither: unlimited), the `cost_model` spec timing its steps, and the
    scheduler of each instance (`policy`, `admission` [the platform scheduler's],
    `b_max`, `k_max`, `policy_options`, `admission_options`: the options of the admission
    policy in use, or a mapping from admission policy name to its options). Optional
    overrides of the platform's `max_instances` and `keep_alive_s`."""

    name: str
    weights_gb: float = 16.0
    kv_bytes_per_token: float | None = None
    kv_capacity: int | None = None
    cost_model: str = "profile:h200-llama-3-8b"
    policy: str = "sarathi"
    admission: str | None = None
    b_max: int = 512
    k_max: int | None = None
    policy_options: dict = field(default_factory=dict)
    admission_options: dict = field(default_factory=dict)
    max_instances: int | None = None
    keep_alive_s: float | None = None

    def validate(self, where: str) -> ModelSpec:
        self.weights_gb = _num(self.weights_gb, f"{where}.weights_gb", lo_open=True)
        if self.kv_bytes_per_token is not None and self.kv_capacity is not None:
            raise _at(where, "give kv_bytes_per_token or kv_capacity, not both")
        if self.kv_bytes_per_token is not None:
            self.kv_bytes_per_token = _num(self.kv_bytes_per_token, f"{where}.kv_bytes_per_token", lo_open=True)
        self.kv_capacity = _whole(self.kv_capacity, f"{where}.kv_capacity", optional=True)
        if not isinstance(self.cost_model, str) or not self.cost_model.strip():
            raise _at(
                f"{where}.cost_model",
                f"must be a cost model spec such as paper or profile:h200-llama-3-8b, got {_show(self.cost_model)}",
            )
        self.cost_model = self.cost_model.strip()
        try:
            make_cost_model(self.cost_model)
        except ConfigError as e:
            raise _at(f"{where}.cost_model", str(e)) from None
        self.policy = _name(self.policy, f"{where}.policy")
        if self.admission is not None:
            self.admission = _name(self.admission, f"{where}.admission")
        self.b_max = _whole(self.b_max, f"{where}.b_max")
        self.k_max = _whole(self.k_max, f"{where}.k_max", optional=True)
        for k in ("policy_options", "admission_options"):
            v = getattr(self, k)
            if v is None:
                v = {}
            setattr(self, k, dict(_mapping(v, f"{where}.{k}", k)))
        _check_keyed_options(self.admission_options, f"{where}.admission_options")
        self.max_instances = _whole(self.max_instances, f"{where}.max_instances", optional=True)
        if self.keep_alive_s is not None:
            self.keep_alive_s = _num(self.keep_alive_s, f"{where}.keep_alive_s", inf_ok=True, hi=MAX_SECONDS)
        return self

    def options_for(self, admission: str) -> dict:
        """The admission options that apply when the instances run `admission`."""
        opts = self.admission_options
        if any(k in _ADMISSION_NAMES for k in opts):  # keyed by policy (`_check_keyed_options`)
            keyed = {ADMISSION_ALIASES.get(k, k): v for k, v in opts.items()}
            return dict(keyed.get(ADMISSION_ALIASES.get(admission, admission), {}))
        return dict(opts)

    def keyed_admissions(self) -> list[str]:
        """The admission policies `admission_options` gives options for by name (none when
        it is flat), so that each policy's options are checked, not only the one in use."""
        return [ADMISSION_ALIASES.get(k, k) for k in self.admission_options if k in _ADMISSION_NAMES]

    def to_dict(self) -> dict:
        return {
            "weights_gb": self.weights_gb,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity": self.kv_capacity,
            "cost_model": recorded_cost_model(self.cost_model),
            "policy": self.policy,
            "admission": self.admission,
            "b_max": self.b_max,
            "k_max": self.k_max,
            "policy_options": dict(self.policy_options),
            "admission_options": dict(self.admission_options),
            "max_instances": self.max_instances,
            "keep_alive_s": _inf_out(self.keep_alive_s),
        }


def _check_keyed_options(opts: dict, where: str) -> None:
    """`admission_options` is flat (the options of the policy in use) or keyed by policy
    name, each a mapping; a mix, or a policy name with a value, is neither (`{twp: 3}` read
    as flat said `admission policy 'twp': unknown option 'twp'`)."""
    keyed = [k for k in opts if k in _ADMISSION_NAMES]
    if not keyed:
        return
    flat = [k for k in opts if k not in _ADMISSION_NAMES]
    if flat:
        raise _at(
            where,
            f"mixes options keyed by admission policy ({', '.join(map(str, keyed))}) with flat options "
            f"({', '.join(map(str, flat))}); give either {{policy: {{option: value}}}} or the options alone",
        )
    for k in keyed:
        if not isinstance(opts[k], dict):
            raise _at(
                f"{where}.{k}",
                f"the options of admission policy {k} must be a mapping (option: value), got {_show(opts[k])}",
            )


def _inf_out(x):
    return "never" if x is not None and math.isinf(x) else x


# ----------------------------------------------------------------------------- workload
@dataclass
class ModelTraffic:
    """One model's traffic. With the workload's total `rate`: `share` (its popularity
    weight, overriding `popularity`); without it: its own `rate`, `arrival` and `cv`.
    `prompt` / `output`: its length laws (default: the workload's)."""

    share: float | None = None
    rate: float | None = None
    arrival: str | None = None
    cv: float | None = None
    prompt: Any = None
    output: Any = None

    def to_dict(self) -> dict:
        return {
            "share": self.share,
            "rate": self.rate,
            "arrival": self.arrival,
            "cv": self.cv,
            "prompt": None if self.prompt is None else self.prompt.recorded(),
            "output": None if self.output is None else self.output.recorded(),
        }


@dataclass
class ServerlessWorkload:
    """The requests and the model each one asks for.

    - Shared rate: `arrival` (poisson | gamma | deterministic) at total `rate` req/s (gamma:
      `cv`); each arrival picks a model at random with probability proportional to its
      popularity: `uniform` (the default; null too), `zipf:S` (the k-th model of the
      `models` section weighs 1/k^S) or a mapping model -> weight (models left out get no
      traffic); `models.<m>.share` overrides one weight.
    - Rate per model (no total `rate`): every model listed under `models` with a `rate`
      has its own arrival process (`arrival` / `cv` default to the workload's, the cv
      only while the model keeps the workload's arrival: `process_of`); the processes
      are merged.
    - Trace: `trace` is a CSV file `arrival_s,prompt_tokens,output_tokens[,model]` (a
      `model` column names each request's model; without it, or for an Azure trace or
      `azure-conv`, models are assigned by popularity); `rate` rescales the replayed part
      (after the cut) to that mean rate, (n - 1) / (t_last - t_first) over its n requests
      (`trace.replay_cut`), or `time_scale` divides its times.
    Stopping: `num_requests` and/or `duration_s` (a trace without either is replayed whole).
    Lengths: `prompt` / `output` length laws (`llmsched.workload.lengths`), per model in
    `models.<m>`; a trace keeps its own lengths."""

    arrival: str = "poisson"
    rate: float | None = None
    cv: float | None = None
    popularity: Any = "uniform"
    prompt: Any = DEFAULT_PROMPT
    output: Any = DEFAULT_OUTPUT
    trace: str | None = None
    time_scale: float = 1.0
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0
    models: dict = field(default_factory=dict)

    def process_of(self, t: ModelTraffic) -> tuple[str, float | None]:
        """The arrival kind and cv of a model with its own rate: its own, else the
        workload's; the workload's cv only while the model keeps the workload's arrival
        (a cv given for gamma arrivals means nothing to a model that chose poisson)."""
        kind = t.arrival or self.arrival
        if t.cv is not None:
            return kind, t.cv
        return kind, self.cv if kind == self.arrival else None

    def to_dict(self) -> dict:
        pop = self.popularity if isinstance(self.popularity, str) else dict(self.popularity)
        return {
            "arrival": self.arrival,
            "rate": self.rate,
            "cv": self.cv,
            "popularity": pop,
            "prompt": self.prompt.recorded(),
            "output": self.output.recorded(),
            "trace": None if self.trace is None else recorded_file(self.trace),
            "time_scale": self.time_scale,
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "seed": self.seed,
            "models": {m: t.to_dict() for m, t in self.models.items()},
        }


# ----------------------------------------------------------------------------- platform
def scheduler_key(s, where: str) -> str:
    """A platform scheduler's name (an alias taken) as the platform runs it; else a
    ConfigError at `where`."""
    if not isinstance(s, str) or not s.strip():
        raise _at(where, f"must be one of {', '.join(PLATFORM_SCHEDULERS)}, got {_show(s)}")
    key = s.strip().lower()
    key = _SCHEDULER_ALIASES.get(key, key)
    if key not in SCHEDULER_ADMISSION:
        raise _at(
            where,
            f"unknown scheduler '{s}'{_suggest(key, PLATFORM_SCHEDULERS)}; known: {', '.join(PLATFORM_SCHEDULERS)}",
        )
    return key


@dataclass
class PlatformSpec:
    """The platform's rules.

    - `scheduler`: fcfs | round-robin | priority | dynamicbatch | twp | serverlessllm
      (docs/serverless.md gives each rule).
    - `router`: least-loaded | round-robin, how a model's requests are spread over its
      instances (default: round-robin for the round-robin scheduler, else least-loaded).
    - `init_s`: the constant part of a cold start (container and runtime start), added to
      the checkpoint load time.
    - `keep_alive_s`: an idle instance is stopped (its GPU freed) after this long; `never`
      keeps instances until the end.
    - `scale_out_tokens`: a model gets one more instance when its queued work (tokens still
      to compute for its requests) per instance exceeds this, while it has fewer than
      `max_instances` (default: no limit but the GPUs) and a GPU is free.
    - `gpu_memory_utilization`: share of a GPU's memory for weights plus KV cache (the KV
      capacity of a model with `kv_bytes_per_token`).
    - ServerlessLLM only (`serverlessllm:` mapping): `load_speedup` (its fast checkpoint
      loading, a factor on every tier's bandwidth, default 2), `migration` (live migration,
      default true), `alpha_s_per_token` (0.01) and `beta_s` (0.1): a migration of a
      request with `n` tokens so far takes `alpha * n + beta` seconds."""

    scheduler: str = "fcfs"
    router: str | None = None
    init_s: float = 1.0
    keep_alive_s: float = 60.0
    scale_out_tokens: float = 8192.0
    max_instances: int | None = None
    gpu_memory_utilization: float = 0.9
    load_speedup: float = 2.0
    migration: bool = True
    migration_alpha_s: float = 0.01
    migration_beta_s: float = 0.1

    def validate(self, where: str = "platform") -> PlatformSpec:
        key = self.scheduler = scheduler_key(self.scheduler, f"{where}.scheduler")
        if self.router is not None:
            if not isinstance(self.router, str):
                raise _at(f"{where}.router", f"must be one of {', '.join(ROUTERS)}, got {_show(self.router)}")
            r = self.router.strip().lower().replace("_", "-")
            r = {
                "rr": "round-robin",
                "roundrobin": "round-robin",
                "least-tokens": "least-loaded",
                "leastloaded": "least-loaded",
            }.get(r, r)
            if r not in ROUTERS:
                raise _at(
                    f"{where}.router",
                    f"unknown router '{self.router}'{_suggest(r, ROUTERS)}; known: {', '.join(ROUTERS)}",
                )
            if key == "round-robin" and r != "round-robin":
                raise _at(
                    f"{where}.router",
                    f"the round-robin scheduler routes in rotation; router {r} "
                    "contradicts it (drop router, or choose another scheduler)",
                )
            self.router = r
        self.init_s = _num(self.init_s, f"{where}.init_s", hi=MAX_SECONDS)
        self.keep_alive_s = _num(self.keep_alive_s, f"{where}.keep_alive_s", inf_ok=True, hi=MAX_SECONDS)
        self.scale_out_tokens = _num(self.scale_out_tokens, f"{where}.scale_out_tokens")
        self.max_instances = _whole(self.max_instances, f"{where}.max_instances", optional=True)
        u = _num(self.gpu_memory_utilization, f"{where}.gpu_memory_utilization", lo_open=True)
        if u > 1:
            raise _at(f"{where}.gpu_memory_utilization", f"must be in (0, 1], got {u:g}")
        self.gpu_memory_utilization = u
        sl = f"{where}.serverlessllm"
        self.load_speedup = _num(self.load_speedup, f"{sl}.load_speedup", lo_open=True)
        if not isinstance(self.migration, bool):
            raise _at(f"{sl}.migration", f"must be true or false, got {_show(self.migration)}")
        self.migration_alpha_s = _num(self.migration_alpha_s, f"{sl}.alpha_s_per_token", hi=MAX_SECONDS)
        self.migration_beta_s = _num(self.migration_beta_s, f"{sl}.beta_s", hi=MAX_SECONDS)
        return self

    @property
    def routing(self) -> str:
        """The router in use."""
        if self.router is not None:
            return self.router
        return "round-robin" if self.scheduler == "round-robin" else "least-loaded"

    @property
    def admission(self) -> str:
        """The admission policy the scheduler gives each instance."""
        return SCHEDULER_ADMISSION[self.scheduler]

    def to_dict(self) -> dict:
        return {
            "scheduler": self.scheduler,
            # the file's own router only: a default one follows the scheduler, so a run with
            # another scheduler (`replaced`, config.json re-read) gets that scheduler's default
            "router": self.router,
            "init_s": self.init_s,
            "keep_alive_s": _inf_out(self.keep_alive_s),
            "scale_out_tokens": self.scale_out_tokens,
            "max_instances": self.max_instances,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "serverlessllm": {
                "load_speedup": self.load_speedup,
                "migration": self.migration,
                "alpha_s_per_token": self.migration_alpha_s,
                "beta_s": self.migration_beta_s,
            },
        }


@dataclass
class RunOptions:
    """The options of a run that change its results, as `simulate_serverless` (or the
    command line) gave them: a run's `config.json` records them, so that it reproduces the
    run; a file may set them too (an argument given replaces the file's).

    - `max_time_s`: the time limit (None: none).
    - `fast`: the fast path (false: step by step, `--exact`; the same results).
    - `slo`: per-request objectives in ms (`ttft_ms`, `tpot_ms`, `itl_ms`, `e2el_ms`): the
      summary's goodput."""

    max_time_s: float | None = None
    fast: bool = True
    slo: dict = field(default_factory=dict)

    def validate(self, where: str = "run") -> RunOptions:
        problem = None if self.max_time_s is None else seconds_problem(self.max_time_s)
        if problem:
            raise _at(f"{where}.max_time_s", f"{problem} (or null), got {_show(self.max_time_s)}")
        self.max_time_s = check_seconds("max_time_s", self.max_time_s)
        if not isinstance(self.fast, bool):
            raise _at(f"{where}.fast", f"must be true or false, got {_show(self.fast)}")
        try:
            self.slo = check_request_slo(self.slo)
        except ConfigError as e:
            raise _at(f"{where}.slo", str(e)) from None
        return self

    def to_dict(self) -> dict:
        return {"max_time_s": self.max_time_s, "fast": self.fast, "slo": dict(self.slo)}


# -------------------------------------------------------------------------------- spec
@dataclass
class ServerlessSpec:
    """A whole serverless platform (module docstring). Build it with `load_serverless`
    (a mapping or a YAML path) or from the dataclasses and call `validate()`."""

    nodes: list
    models: dict
    workload: ServerlessWorkload = field(default_factory=ServerlessWorkload)
    platform: PlatformSpec = field(default_factory=PlatformSpec)
    remote_bandwidth_gbps: float = 1.0
    run: RunOptions = field(default_factory=RunOptions)

    # ---- derived values the runtime reads --------------------------------------------
    def kv_capacity(self, model: str, group: NodeGroup) -> int | None:
        """KV-cache tokens of one instance of `model` on a GPU of `group` (None: unlimited)."""
        m = self.models[model]
        if m.kv_capacity is not None:
            return m.kv_capacity
        if m.kv_bytes_per_token is None:
            return None
        free = self.platform.gpu_memory_utilization * group.gpu_memory_gb - m.weights_gb
        tokens = free * 1e9 / m.kv_bytes_per_token + 1e-9
        # past MAX_KV_TOKENS (a trillion tokens) the cache is as good as unlimited
        return MAX_KV_TOKENS if tokens >= MAX_KV_TOKENS else math.floor(tokens)

    def fits(self, model: str, group: NodeGroup) -> bool:
        """Whether one GPU of `group` holds the model: weights within the usable memory,
        with room for at least one KV token when the KV size is given in bytes."""
        m = self.models[model]
        if m.weights_gb > self.platform.gpu_memory_utilization * group.gpu_memory_gb:
            return False
        kv = self.kv_capacity(model, group)
        return kv is None or kv >= 1

    def admission(self, model: str) -> str:
        m = self.models[model]
        return m.admission if m.admission is not None else self.platform.admission

    def keep_alive_s(self, model: str) -> float:
        k = self.models[model].keep_alive_s
        return self.platform.keep_alive_s if k is None else k

    def max_instances(self, model: str) -> int:
        gpus = sum(g.count * g.gpus for g in self.nodes if self.fits(model, g))
        k = self.models[model].max_instances
        if k is None:
            k = self.platform.max_instances
        return gpus if k is None else min(k, gpus)

    @property
    def num_gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.nodes)

    # ---- validation --------------------------------------------------------------------
    def validate(self) -> ServerlessSpec:
        self.remote_bandwidth_gbps = _num(self.remote_bandwidth_gbps, "cluster.remote_bandwidth_gbps", lo_open=True)
        if isinstance(self.nodes, NodeGroup):
            self.nodes = [self.nodes]
        if not isinstance(self.nodes, (list, tuple)) or not self.nodes:
            raise _at("cluster.nodes", "needs at least one node group (count, gpus, gpu_memory_gb, ...)")
        self.nodes = [g.validate(f"cluster.nodes[{i}]") for i, g in enumerate(self.nodes)]
        total = sum(g.count * g.gpus for g in self.nodes)
        if total > MAX_GPUS:
            parts = ", ".join(f"{g.count:,} x {g.gpus:,}" for g in self.nodes[:3])
            more = f", ... ({len(self.nodes)} groups)" if len(self.nodes) > 3 else ""
            raise _at(
                "cluster.nodes",
                f"{total:,} GPUs in all (nodes x GPUs per node: {parts}{more}), more than the "
                f"{MAX_GPUS:,} a platform may have (the simulator holds every GPU and node in memory)",
            )
        names = [g.name for g in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise _at("cluster.nodes", f"node group name '{dup[0]}' is used twice")
        # two groups may still make one node name (node x 2 -> node0, node1; and node1):
        # instances.csv and every message name nodes, so each name is one node
        made_by: dict[str, int] = {}
        for i, g in enumerate(self.nodes):
            for node in g.node_names():
                j = made_by.setdefault(node, i)
                if j != i:
                    raise _at(
                        "cluster.nodes",
                        f"node name '{node}' is made twice: by cluster.nodes[{j}], {self.nodes[j].describe()}, "
                        f"and by cluster.nodes[{i}], {g.describe()}; rename one group",
                    )
        if not isinstance(self.models, dict) or not self.models:
            raise _at("models", "needs at least one model (name: {weights_gb: ..., ...})")
        for name, m in self.models.items():
            m.name = _name(name, "models")
            if m.name != name:  # (names in tiers, traces and popularity are read stripped)
                raise _at("models", f"model name {name!r} has spaces at its start or end; write it {m.name!r}")
            m.validate(f"models.{name}")
        self.platform.validate()
        for i, g in enumerate(self.nodes):
            for tier in ("dram", "ssd"):
                for j, m in enumerate(getattr(g, tier)):
                    where = f"cluster.nodes[{i}].{tier}[{j}]"
                    if m not in self.models:
                        raise _at(
                            where, f"unknown model '{m}'{_suggest(m, self.models)}; known: {', '.join(self.models)}"
                        )
                total = sum(self.models[m].weights_gb for m in getattr(g, tier))
                if total > getattr(g, f"{tier}_gb") + 1e-9:
                    raise _at(
                        f"cluster.nodes[{i}].{tier}",
                        f"the listed checkpoints take {total:g} GB, more than {tier}_gb = {getattr(g, f'{tier}_gb'):g}",
                    )
        for name, m in self.models.items():
            if not any(self.fits(name, g) for g in self.nodes):
                biggest = max(g.gpu_memory_gb for g in self.nodes)
                u = self.platform.gpu_memory_utilization
                if m.weights_gb <= u * biggest:  # the weights fit: not one KV token beside them
                    raise _at(
                        f"models.{name}",
                        f"no GPU is large enough: one KV token ({m.kv_bytes_per_token:g} bytes) does not fit "
                        f"beside {m.weights_gb:g} GB of weights in the largest GPU's {u:g} x {biggest:g} GB",
                    )
                raise _at(
                    f"models.{name}",
                    f"no GPU is large enough: {m.weights_gb:g} GB of weights "
                    f"(plus KV cache) but the largest GPU offers {u:g} x {biggest:g} GB",
                )
        self._check_load_times()
        self.workload = _validate_workload(self.workload, self.models)
        if self.run is None:
            self.run = RunOptions()
        self.run = self.run.validate()
        return self

    def _check_load_times(self) -> None:
        """The slowest load of each model stays a time we can clock (of the tiers that can
        hold the checkpoint: the remote store always); under the platform's scheduler, whose
        loads ServerlessLLM speeds up."""
        speedup = self.platform.load_speedup if self.platform.scheduler == "serverlessllm" else 1.0
        for name, m in self.models.items():
            for i, g in enumerate(self.nodes):
                tiers = [
                    (g.dram_gb, g.dram_bandwidth_gbps),
                    (g.ssd_gb, g.ssd_bandwidth_gbps),
                    (m.weights_gb, self.remote_bandwidth_gbps),
                ]
                slowest = min(bw for size, bw in tiers if size >= m.weights_gb) * speedup
                if self.fits(name, g) and m.weights_gb / slowest > MAX_SECONDS:
                    raise _at(
                        f"models.{name}",
                        f"loading {m.weights_gb:g} GB at {slowest:g} GB/s (cluster.nodes[{i}]) takes "
                        f"{m.weights_gb / slowest:g} s, more than {MAX_SECONDS:g} s",
                    )

    # ---- forms ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "cluster": {
                "remote_bandwidth_gbps": self.remote_bandwidth_gbps,
                "nodes": [g.to_dict() for g in self.nodes],
            },
            "models": {n: m.to_dict() for n, m in self.models.items()},
            "workload": self.workload.to_dict(),
            "platform": self.platform.to_dict(),
            "run": self.run.to_dict(),
        }

    @classmethod
    def from_dict(cls, d) -> ServerlessSpec:
        d = _mapping(d if d is not None else {}, "", "a serverless platform")
        # a run's config.json records the schedulers it built from the models: output only
        d = {k: v for k, v in d.items() if k not in OUTPUT_ONLY_KEYS}
        _keys(d, _TOP_KEYS, "")
        for k in ("cluster", "models"):
            if d.get(k) is None:
                raise _at(k, f"missing section '{k}'")
        cluster = _mapping(d["cluster"], "cluster", "cluster")
        _keys(cluster, _CLUSTER_KEYS, "cluster")
        raw_nodes = cluster.get("nodes")
        if isinstance(raw_nodes, dict):
            raw_nodes = [raw_nodes]
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise _at("cluster.nodes", "needs a list of node groups (count, gpus, gpu_memory_gb, ...)")
        nodes = []
        for i, nd in enumerate(raw_nodes):
            where = f"cluster.nodes[{i}]"
            nd = _mapping(nd, where, "a node group")
            _keys(nd, _NODE_KEYS, where)
            nodes.append(NodeGroup(**{"name": f"node{i}" if len(raw_nodes) > 1 else "node", **nd}))
        models = {}
        for name, md in _mapping(d["models"], "models", "models").items():
            where = f"models.{name}"
            md = _mapping(md if md is not None else {}, where, f"model '{name}'")
            _keys(md, _MODEL_KEYS, where)
            if "weights_gb" not in md:
                raise _at(where, "missing weights_gb (checkpoint size in GB)")
            models[name] = ModelSpec(name=name, **md)
        wd = _section(d.get("workload"), "workload", "workload")
        _keys(wd, _WORKLOAD_KEYS, "workload")
        wd = dict(wd)
        traffic = {}
        for mname, td in _section(wd.pop("models", None), "workload.models", "workload.models").items():
            where = f"workload.models.{mname}"
            td = _mapping(td if td is not None else {}, where, f"traffic of '{mname}'")
            _keys(td, _TRAFFIC_KEYS, where)
            traffic[mname] = ModelTraffic(**td)
        workload = ServerlessWorkload(**wd, models=traffic)
        pd = dict(_section(d.get("platform"), "platform", "platform"))
        _keys(pd, _PLATFORM_KEYS, "platform")
        sl = _section(pd.pop("serverlessllm", None), "platform.serverlessllm", "serverlessllm")
        _keys(sl, _SLLM_KEYS, "platform.serverlessllm")
        platform = PlatformSpec(
            **pd,
            **{
                k: v
                for k, v in (
                    ("load_speedup", sl.get("load_speedup")),
                    ("migration", sl.get("migration")),
                    ("migration_alpha_s", sl.get("alpha_s_per_token")),
                    ("migration_beta_s", sl.get("beta_s")),
                )
                if v is not None
            },
        )
        rd = _section(d.get("run"), "run", "run")
        _keys(rd, _RUN_KEYS, "run")
        spec = cls(
            nodes=nodes,
            models=models,
            workload=workload,
            platform=platform,
            remote_bandwidth_gbps=cluster.get("remote_bandwidth_gbps", 1.0),
            run=RunOptions(**rd),
        )
        return spec.validate()

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> ServerlessSpec:
        p = Path(path)
        data = read_yaml(p, "serverless")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{p.name}: {e}") from None

    def replaced(
        self,
        *,
        scheduler: str | None = None,
        scale: float | None = None,
        num_requests: int | None = None,
        seed: int | None = None,
    ) -> ServerlessSpec:
        """A copy with another platform scheduler, every arrival rate times `scale`, or
        another request count or seed."""
        spec = ServerlessSpec.from_dict(self.to_dict())
        if scheduler is not None:
            spec.platform.scheduler = scheduler_key(scheduler, "scheduler")
            if spec.platform.scheduler == "round-robin":
                spec.platform.router = None
            spec.platform.validate()
            spec._check_load_times()  # (ServerlessLLM's faster loads may have passed where another's do not)
        w = spec.workload
        if scale is not None:
            k = _num(scale, "scale", lo_open=True)
            if w.trace is not None and w.rate is None:
                w.time_scale *= k
            if w.rate is not None:
                w.rate *= k
            for t in w.models.values():
                if t.rate is not None:
                    t.rate *= k
        if num_requests is not None:
            w.num_requests = _whole(num_requests, "num_requests")
        if seed is not None:
            w.seed = _seed(seed, "")
        spec.workload = _validate_workload(w, spec.models)
        return spec


def _validate_workload(w: ServerlessWorkload, models: dict) -> ServerlessWorkload:
    where = "workload"
    if isinstance(w, dict):
        w = ServerlessWorkload(**w)
    w = replace(w, models=dict(w.models))
    if w.popularity is None:  # `popularity: null` is the default, as when left out
        w.popularity = "uniform"
    if w.trace is not None:
        if not isinstance(w.trace, str) or not w.trace.strip():
            raise _at(f"{where}.trace", f"must be a file path or azure-conv, got {_show(w.trace)}")
        try:
            resolve_path(w.trace.strip())
        except ConfigError as e:
            # as in a --config or --network file: from where the command runs
            path = w.trace.strip()
            relative = not (Path(path).is_absolute() or is_dataset(path))
            hint = " (a relative path is read from the current directory)" if relative else ""
            raise _at(f"{where}.trace", f"{e}{hint}") from None
        w.trace = w.trace.strip()
    if not isinstance(w.arrival, str):
        raise _at(f"{where}.arrival", f"must be poisson, gamma or deterministic, got {_show(w.arrival)}")
    w.arrival = w.arrival.strip().lower()
    if w.arrival == "azure-conv" or w.arrival.startswith("trace"):
        raise _at(f"{where}.arrival", f"a trace is given as {where}.trace (a file or azure-conv), not as arrival")
    if w.trace is not None:
        # a trace keeps its own times and lengths: a law given for them would do nothing
        if w.arrival != "poisson":
            raise _at(
                f"{where}.arrival",
                "a trace keeps its own arrival times (rate or time_scale rescales them): leave arrival out",
            )
        for k, default in (("prompt", DEFAULT_PROMPT), ("output", DEFAULT_OUTPUT)):
            # (as written, or as a run's config.json records the default)
            if _law(getattr(w, k), f"{where}.{k}", k).to_str() != _law(default, where, k).to_str():
                raise _at(f"{where}.{k}", f"a trace keeps its own {k} lengths: leave {k} out")
        for m, t in w.models.items():
            for k in ("prompt", "output"):
                if getattr(t, k) is not None:
                    raise _at(f"{where}.models.{m}.{k}", f"a trace keeps its own {k} lengths: leave {k} out")
    if w.rate is not None:
        w.rate = _num(w.rate, f"{where}.rate", lo_open=True)
    if w.cv is not None:
        w.cv = _num(w.cv, f"{where}.cv", lo_open=True)
    w.time_scale = _num(w.time_scale, f"{where}.time_scale", lo_open=True)
    w.num_requests = _whole(w.num_requests, f"{where}.num_requests", optional=True)
    if w.num_requests is not None and w.num_requests > MAX_REQUESTS:
        raise _at(f"{where}.num_requests", f"at most {MAX_REQUESTS:,}, got {w.num_requests:,}")
    if w.duration_s is not None:
        w.duration_s = _num(w.duration_s, f"{where}.duration_s", lo_open=True, hi=MAX_SECONDS)
    w.seed = _seed(w.seed, f"{where}.seed")
    w.prompt = _law(w.prompt, f"{where}.prompt", "prompt")
    w.output = _law(w.output, f"{where}.output", "output")
    for m, t in w.models.items():
        at = f"{where}.models.{m}"
        if m not in models:
            raise _at(at, f"unknown model '{m}'{_suggest(m, models)}; known: {', '.join(models)}")
        if t.share is not None:
            t.share = _num(t.share, f"{at}.share")
        if t.rate is not None:
            t.rate = _num(t.rate, f"{at}.rate", lo_open=True)
        if t.cv is not None:
            t.cv = _num(t.cv, f"{at}.cv", lo_open=True)
        if t.arrival is not None:
            if not isinstance(t.arrival, str):
                raise _at(f"{at}.arrival", f"must be poisson, gamma or deterministic, got {_show(t.arrival)}")
            t.arrival = t.arrival.strip().lower()
        if t.prompt is not None:
            t.prompt = _law(t.prompt, f"{at}.prompt", "prompt")
        if t.output is not None:
            t.output = _law(t.output, f"{at}.output", "output")
        if w.rate is not None or w.trace is not None:
            for k in ("rate", "arrival", "cv"):
                if getattr(t, k) is not None:
                    raise _at(
                        f"{at}.{k}",
                        f"a model's own {k} needs per-model rates (no workload.rate or trace); "
                        "with a total rate give the model a share instead",
                    )
        elif t.share is not None:
            raise _at(
                f"{at}.share",
                "a share splits workload.rate, which is not given (give workload.rate, or a rate per model)",
            )
    if w.trace is None:
        if w.time_scale != 1.0:
            # (it was accepted and recorded, and did nothing)
            raise _at(f"{where}.time_scale", "divides a trace's times; synthetic arrivals take their rate (rate)")
        if w.rate is None:
            own = [m for m, t in w.models.items() if t.rate is not None]
            if not own:
                raise _at(
                    where, "needs a total rate (with popularity), a rate per model under workload.models, or a trace"
                )
            if not (isinstance(w.popularity, str) and w.popularity.strip().lower() == "uniform"):
                raise _at(
                    f"{where}.popularity",
                    "splits a total rate (workload.rate) or a trace among the models; with a rate per model it does "
                    "nothing: leave it out",
                )
        else:
            _check_process(w.arrival, w.rate, w.cv, where)
        if w.rate is None and w.cv is not None:
            # the workload's own cv and arrival, blamed on the workload: a model that keeps
            # them was named for the workload's mistake (any positive rate checks the pair)
            _check_process(w.arrival, 1.0, w.cv, where)
        for m, t in w.models.items():
            if t.rate is not None:
                kind, cv = w.process_of(t)
                _check_process(kind, t.rate, cv, f"{where}.models.{m}")
        if w.num_requests is None and w.duration_s is None:
            raise _at(where, "needs num_requests or duration_s to know when to stop")
    elif w.cv is not None:
        raise _at(f"{where}.cv", "applies to gamma arrivals, not to trace replay")
    elif w.rate is not None and w.time_scale != 1.0:
        raise _at(where, "give either rate (rescale the trace to this mean rate) or time_scale, not both")
    if w.rate is not None or w.trace is not None:
        _shares(w, models)  # checks popularity
    return w


def _check_process(kind, rate, cv, where):
    try:
        make_arrival_process(kind, rate, cv)
    except ConfigError as e:
        raise _at(where, str(e)) from None


def _shares(w: ServerlessWorkload, models: dict) -> np.ndarray:
    """Popularity weights of the models (in `models` order), normalised."""
    names = list(models)
    pop = w.popularity
    where = "workload.popularity"
    if isinstance(pop, str):
        kind, _, rest = pop.strip().lower().partition(":")
        if kind == "uniform" and not rest:
            weights = np.ones(len(names))
        elif kind == "zipf":
            s = _num(rest.strip() or "1", f"{where} (zipf exponent)", text=True)
            with np.errstate(over="ignore"):  # a huge exponent: the tail's weights are 0
                weights = 1.0 / np.arange(1, len(names) + 1, dtype=np.float64) ** s
        else:
            raise _at(where, f"must be uniform, zipf:S or a mapping model -> weight, got {_show(pop)}")
    elif isinstance(pop, dict):
        weights = np.zeros(len(names))
        for m, v in _mapping(pop, where, "workload.popularity").items():
            if m not in models:
                raise _at(f"{where}.{m}", f"unknown model '{m}'{_suggest(m, models)}; known: {', '.join(names)}")
            weights[names.index(m)] = _num(v, f"{where}.{m}")
    else:
        raise _at(where, f"must be uniform, zipf:S or a mapping model -> weight, got {_show(pop)}")
    for m, t in w.models.items():
        if t.share is not None:
            weights[names.index(m)] = t.share
    with np.errstate(over="ignore"):  # (a sum past the largest float is refused below)
        total = float(weights.sum())
    if not total > 0:
        raise _at(where, "every model has weight 0: no request could be made")
    if math.isinf(total):
        # (each weight is finite, their sum is not: the shares were inf / inf = nan, and
        # numpy's model draw a ValueError traceback)
        raise _at(where, "the weights must sum to a finite number (scale them down): their sum overflows")
    return weights / total


# ----------------------------------------------------------------------------- requests
@dataclass
class ServerlessRequests:
    """The requests of a serverless workload, in arrival order: `arrival_s`, `prompt`,
    `output` and `model` (an index into `models`)."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    model: np.ndarray
    models: list

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def make_serverless_requests(spec: ServerlessSpec, *, warn_short: bool = True) -> ServerlessRequests:
    """Draw (or read) the requests of `spec.workload`; deterministic for its seed. Random
    streams: arrivals, model choice and each model's lengths draw from separate child
    seeds, so a model's lengths do not change with the rate or the other models.
    `warn_short=False`: a trace with fewer requests than `num_requests` is read whole
    without a warning (for a caller that asks for "up to" that many)."""
    w = spec.workload
    names = list(spec.models)
    if w.trace is not None:
        arrival, prompt, output, model = _trace_requests(spec, warn_short)
    elif w.rate is not None:
        proc = make_arrival_process(w.arrival, w.rate, w.cv)
        arrival = proc.times(_rng(w.seed, 0), w.num_requests, w.duration_s)
        model = _rng(w.seed, 1).choice(len(names), size=len(arrival), p=_shares(w, spec.models))
        prompt = output = None
    else:
        parts, short = [], []  # short: the models whose arrivals stop at the clock
        for i, m in enumerate(names):
            t = w.models.get(m)
            if t is None or t.rate is None:
                continue
            kind, cv = w.process_of(t)
            proc = make_arrival_process(kind, t.rate, cv)
            try:
                times, cut = times_for_merge(proc, lambda i=i: _rng(w.seed, 0, i), w.num_requests, w.duration_s)
            except ConfigError as e:
                raise ConfigError(f"workload.models.{m}: {e}") from None
            if cut:
                short.append(f"workload.models.{m}")
            parts.append(np.column_stack([times, np.full(len(times), i, dtype=np.float64)]))
        merged = np.concatenate(parts)
        merged = merged[np.lexsort((merged[:, 1], merged[:, 0]))]
        if w.num_requests is not None:
            refuse_short_merge(", ".join(short), len(merged), w.num_requests, "requests")
            merged = merged[: w.num_requests]
        arrival, model = merged[:, 0].copy(), merged[:, 1].astype(np.int64)
        prompt = output = None
    n = len(arrival)
    if n == 0:
        raise ConfigError("workload: no request arrives (check rate, duration_s and popularity)")
    model = np.asarray(model, dtype=np.int64)
    if prompt is None:
        prompt = np.empty(n, dtype=np.int64)
        output = np.empty(n, dtype=np.int64)
        for i, m in enumerate(names):
            idx = np.flatnonzero(model == i)
            if not len(idx):
                continue
            t = w.models.get(m)
            plaw = t.prompt if t is not None and t.prompt is not None else w.prompt
            olaw = t.output if t is not None and t.output is not None else w.output
            prompt[idx], output[idx] = sample_pair(plaw, olaw, _rng(w.seed, 2, i), _rng(w.seed, 3, i), len(idx))
    return ServerlessRequests(
        np.asarray(arrival, dtype=np.float64),
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
        model,
        names,
    )


def _check_no_popularity(w: ServerlessWorkload) -> None:
    """A trace's `model` column names each request's model: popularity and shares, which
    draw one, would do nothing."""
    if not (isinstance(w.popularity, str) and w.popularity.strip().lower() == "uniform"):
        raise ConfigError(
            "has a model column naming each request's model: workload.popularity does nothing; leave it out"
        )
    for m, t in w.models.items():
        if t.share is not None:
            raise ConfigError(
                f"has a model column naming each request's model: workload.models.{m}.share does nothing; leave it out"
            )


def _trace_requests(spec: ServerlessSpec, warn_short: bool = True):
    w = spec.workload
    names = list(spec.models)
    path = resolve_path(w.trace)
    where = "workload.trace"
    try:
        fmt = trace_format(path)
        model = None
        if fmt == "plain":
            cols = read_columns(
                path, {"arrival_s": "float", "prompt_tokens": "float", "output_tokens": "float"}, {"model": "str"}
            )
            arrival = cols["arrival_s"]
            if not len(arrival):
                raise ConfigError(f"trace file {path} has no data rows")
            if not (np.isfinite(arrival).all() and arrival.min() >= 0):
                # (named the row: "must be times >= 0" for a nan sent users looking for a sign)
                row = int(np.flatnonzero(~(np.isfinite(arrival) & (arrival >= 0)))[0])
                got = float(arrival[row])
                raise ConfigError(
                    f"trace file {path}: arrival_s must be finite times >= 0, got {got!r} in data row {row + 1}"
                )
            prompt = as_lengths(cols["prompt_tokens"], path, "prompt_tokens")
            output = as_lengths(cols["output_tokens"], path, "output_tokens")
            if "model" in cols:
                _check_no_popularity(w)
                index = {m: i for i, m in enumerate(names)}
                labels = cols["model"]
                model = np.empty(len(labels), dtype=np.int64)
                for j, lab in enumerate(labels.tolist()):
                    k = index.get(lab)
                    if k is None:
                        raise ConfigError(
                            f"row {j + 1} names unknown model '{lab}'{_suggest(lab, names)}; known: {', '.join(names)}"
                        )
                    model[j] = k
            order = np.argsort(arrival, kind="stable")
            arrival, prompt, output = arrival[order], prompt[order], output[order]
            if model is not None:
                model = model[order]
        else:
            t = load_trace(path, None)  # lengths and times only: no block ids cut to 16 tokens
            arrival, prompt, output = t.arrival_s.copy(), t.prompt.copy(), t.output.copy()
    except ConfigError as e:
        raise _at(where, str(e)) from None
    # the same rule as one server's trace replay: with a rate, the replayed part runs at it
    try:
        k, n = replay_cut(
            arrival, rate=w.rate, time_scale=w.time_scale, num_requests=w.num_requests, duration_s=w.duration_s
        )
    except ConfigError as e:
        raise _at(where, str(e)) from None
    if warn_short:
        warn_short_trace(f"{where}: the trace", len(arrival), w.num_requests, n)
    arrival = replayed_times(arrival, k, n, where, "workload.time_scale K divides them")
    prompt, output = prompt[:n], output[:n]
    if model is None:
        model = _rng(w.seed, 1).choice(len(names), size=n, p=_shares(w, spec.models))
    else:
        model = model[:n]
    return arrival, prompt, output, model


def load_serverless(spec) -> ServerlessSpec:
    """A ServerlessSpec from a ServerlessSpec, a mapping or a YAML path."""
    if isinstance(spec, ServerlessSpec):
        return spec
    if isinstance(spec, dict):
        return ServerlessSpec.from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return ServerlessSpec.from_yaml(spec)
    raise ConfigError(f"expected a serverless platform (ServerlessSpec, mapping or YAML path), got {_show(spec)}")
