"""Networks of LLM servers: clusters and AI-agent workflows described in one YAML file.

A network has **servers** (each a pool of `replicas` identical replicas behind a router,
every replica running one scheduler) and **job types** (each with its own arrival process
and a **route**: the calls its jobs make, with think/tool delays, parallel forks and
loops). `docs/networks.md` documents the YAML format with a complete example and the
model (paper 1, "Throughput-optimal scheduling for LLM inference and AI agents":
parallel servers, multi-class, DAG and fork-join routes, cyclic routes of the
Rybko-Stolyar type).

Data model (what the simulator and `llmsched.theory.network` read):

- `ServerSpec`: a server's scheduler fields (the eight of `policies.spec.SchedulerSpec`,
  see `scheduler_fields()`), its cost model spec, `replicas`, `router`,
  `router_options` and `priority` (call classes served first at this server, in order).
- Route nodes (`Node`): `Call(server, prompt, output, context, cls)`, `Delay(law)`,
  `Fork(branches)` (branches run in parallel, the join waits for all), and
  `Loop(body, times | repeat_prob)`.
- `JobType(name, arrival, route)`, `NetworkSpec(servers, jobs, num_jobs, duration_s,
  seed)`.

Context (`Call.context`): a job's *context* on an execution path is the sum, over the
calls already made on that path, of each call's new prompt tokens plus its output
tokens. A call with `context: true` resends it: its prompt is the context so far plus
`prompt` new tokens. A fork's branches each start from the context at the fork; after
the join the context is the fork's context plus every branch's additions. Each pass of a
loop starts from the context the previous pass left. A job type with `context: grow`
resends it on every call; with `system_prompt: N` every call of the type starts with the
same N tokens (not part of the context), so its prompt is N + resent context + new tokens.
With prefix caching (`ServerSpec.prefix_caching`) these prompts carry block ids
(`sim.network`): a call's leading blocks are those of the job's earlier prompts and outputs
it resends, and the system prompt's blocks are shared by every job of the type.

Call classes: every call has a class name (`cls`), by default `"{job}.{i}"` with `i`
counting the job's calls from 1 in document order (depth first: a fork's branches in
order, a loop's body once). Calls may share an explicit class name (`class:` in YAML);
an explicit name that is the default of a call without one is refused.

Validation: building a `NetworkSpec` (from Python or from a mapping / YAML file) checks
everything and raises `ConfigError` with one line naming the place, e.g.
`jobs.A.route[3].loop: repeat_prob must be in [0, 1) ...`. Route indices are 0-based.
Numbers must be numbers (a string such as "0.5" is refused; length and delay laws are
text), and a mapping may not be null (`s3:` with nothing after it).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..core.checks import FLOAT_SEED_LIMIT, as_real
from ..core.checks import quoted_number as _quoted
from ..core.constraints import MAX_B_MAX, MAX_KV_TOKENS, MAX_REQUESTS_PER_STEP
from ..core.cost import make_cost_model, recorded_cost_model
from ..core.errors import ConfigError, closest
from ..core.request import MAX_SECONDS, check_sample_interval, check_seconds
from ..core.yamlfile import read_yaml
from .arrivals import (
    MAX_REQUESTS,
    ArrivalProcess,
    Deterministic,
    Gamma,
    Poisson,
    make_arrival_process,
)
from .blocks import DEFAULT_BLOCK_SIZE, check_block_size
from .csvio import CSV_UNSAFE, MAX_LENGTH
from .lengths import LengthLaw, _fmt, parse_length_law

__all__ = [
    "ROUTERS",
    "Call",
    "Delay",
    "DelayLaw",
    "Fork",
    "JOB_CONTEXTS",
    "JobType",
    "Loop",
    "NetworkSpec",
    "Node",
    "ServerSpec",
    "iter_calls",
    "load_network",
    "parse_delay_law",
]

#: Routers a server with replicas may use.
ROUTERS = ("random", "round-robin", "jsq", "least-tokens", "power-of-two")

_SCHEDULER_FIELDS = (
    "policy",
    "admission",
    "b_max",
    "k_max",
    "kv_capacity",
    "max_running",
    "policy_options",
    "admission_options",
)
_PREFIX_FIELDS = ("prefix_caching", "block_size")
_SERVER_KEYS = _SCHEDULER_FIELDS + _PREFIX_FIELDS + ("cost_model", "replicas", "router", "router_options", "priority")
_TOP_KEYS = ("servers", "jobs", "num_jobs", "duration_s", "seed", "control", "run")
# a run's options that change its results: a run's config.json records them (`NetworkSpec.run`)
RUN_KEYS = ("max_time_s", "sample_interval_s", "fast")
CONTROLS = ("none", "backpressure")
_JOB_KEYS = ("arrival", "route", "system_prompt", "context")
#: A job type's `context`: "per-call" (each call's own `context` flag says whether it resends
#: the job's context) or "grow" (every call resends it: an agent's conversation that grows)
JOB_CONTEXTS = ("per-call", "grow")
_ARRIVAL_KEYS = ("process", "rate", "cv")
_CALL_KEYS = ("server", "prompt", "output", "context", "cached", "class")
_LOOP_KEYS = ("body", "times", "repeat_prob")
_NODE_KINDS = ("call", "delay", "fork", "loop")
_MAX_LOOP_TIMES = 1_000_000
#: Forks and loops inside one another in a route, at most (the parser, the checks and the
#: simulator walk a route recursively; a real route nests a few levels).
MAX_ROUTE_NESTING = 100
#: Nodes in one job type's route, at most, counting each use of a YAML alias: a 2 KB file
#: of aliases nested ten to a level unfolded into ten million nodes and never finished parsing.
MAX_ROUTE_NODES = 100_000
#: The longest KV-transfer delay per context token (seconds; a real transfer takes ~1e-5).
MAX_PER_TOKEN_S = 1.0
#: Replicas in one server's pool (every replica builds its own scheduler).
MAX_REPLICAS = 1 << 12


# ------------------------------------------------------------------------------ helpers
def _at(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}" if where else message)


class _Located:
    """Context manager re-raising a ConfigError from a nested parser with a location."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if kind is not None and issubclass(kind, ConfigError):
            msg = str(err)
            if not msg.startswith(self.where + ":"):
                raise _at(self.where, msg) from None
        return False


def _suggest(name: str, known) -> str:
    close = closest(name, known)
    return f" (did you mean '{close}'?)" if close else ""


def _check_keys(d: dict, allowed, where: str, what: str) -> None:
    for k in d:
        if k not in allowed:
            raise _at(where, f"unknown key '{k}' in {what}{_suggest(k, allowed)}; known: {', '.join(allowed)}")


def _mapping(value, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise _at(where, f"{what} must be a mapping, got {_show(value)}")
    for k in value:
        if not isinstance(k, str):
            raise _at(where, f"keys of {what} must be strings, got {k!r}")
    return value


def _show(value) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def _seed(value, where: str, what: str = "seed") -> int:
    """A seed: a whole number >= 0 (`_whole`), kept exactly however large as an integer; a
    float only below 2**53. `seed: 1e308` (a float in YAML) ran as a 309-digit seed that
    no one wrote, where `--seed 1e308` is refused."""
    x = as_real(value)
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() and x >= FLOAT_SEED_LIMIT:
        raise _at(
            where,
            f"{what} must be a whole number >= 0 written as an integer, got {_show(value)} "
            "(a float of 2**53 or more is not exact: write its digits)",
        )
    return _whole(value, where, what, minimum=0)


def _whole(
    value, where: str, what: str, minimum: int = 1, optional: bool = False, maximum: int | None = None
) -> int | None:
    """A whole number (an int, or a float or numpy number with no fraction), exact however
    large; never a string, a bool or None (unless `optional`)."""
    if value is None and optional:
        return None
    x = as_real(value)
    if isinstance(x, float):
        x = int(x) if math.isfinite(x) and x == math.floor(x) else None
    if x is None or x < minimum:
        raise _at(where, f"{what} must be a whole number >= {minimum}, got {_show(value)}{_quoted(value)}")
    if maximum is not None and x > maximum:
        raise _at(where, f"{what} must be at most {maximum:,}, got {_show(value)}")
    return x


def _job_count(value, duration_s: float | None, where: str) -> int | None:
    """num_jobs, bounded when it alone stops the arrivals (a duration_s stops them first)."""
    n = _whole(value, where, "num_jobs", optional=True)
    if n is not None and duration_s is None and n > MAX_REQUESTS:
        raise _at(where, f"num_jobs must be at most {MAX_REQUESTS:,} (or give a duration_s), got {_show(value)}")
    return n


def _as_number(value, text: bool) -> int | float | None:
    """`value` as a number (`as_real`); a string only with `text` (a number inside a law's
    text, such as uniform:1,3): a number in quotes in a file is text, not a number."""
    x = as_real(value)
    if x is None and text and isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            pass
    return x


def _number(value, where: str, what: str, text: bool = False) -> float:
    """A finite number as a float (see `_as_number`), never a bool or None."""
    x = _as_number(value, text)
    if x is None:
        raise _at(where, f"{what} must be a number, got {_show(value)}{'' if text else _quoted(value)}")
    try:
        f = float(x)
    except OverflowError:  # an int past the largest float
        f = math.inf
    if not math.isfinite(f):
        raise _at(where, f"{what} must be a finite number, got {_show(value)}")
    return f


def _name(value, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _at(where, f"{what} must be a non-empty string, got {_show(value)}")
    s = value.strip()
    if any(c in s for c in CSV_UNSAFE):
        raise _at(where, f"{what} {s!r} must not contain commas, quotes, newlines or carriage returns")
    return s


def _server_name(value, where: str) -> str:
    """A server name, which also names its folder under the run's servers/ (a replica's:
    NAME[k]): no path separators, not `.` or `..`, and not ending in `[k]`, which would
    collide with a replica of another server."""
    s = _name(value, where, "server name")
    if "/" in s or "\\" in s or "\0" in s or s in (".", ".."):
        raise _at(
            where, f"server name {s!r} names its output folder: it must not contain '/' or '\\' nor be '.' or '..'"
        )
    if re.fullmatch(r".*\[\d+\]", s):
        raise _at(where, f"server name {s!r} must not end in [k]: replicas of a server are named NAME[k]")
    return s


# ---------------------------------------------------------------------------- delay laws
@dataclass(frozen=True)
class DelayLaw:
    """Think or tool time in seconds between calls.

    `const` (every delay `mean` seconds; 0 allowed), `exponential` (mean `mean` > 0),
    `uniform` (between `lo` and `hi`, 0 <= lo <= hi; `mean` is set to their midpoint) or
    `per_token` (`mean` seconds per token of the job's context at that point, its system
    prompt included: a KV-cache transfer between a prefill and a decode server). String
    forms: `const:S` (or a bare
    number S), `exponential:MEAN`, `uniform:LO,HI`, `per_token:S`."""

    kind: str
    mean: float = 0.0
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self):
        kind = str(self.kind).strip().lower()
        kind = {"constant": "const", "fixed": "const", "exp": "exponential"}.get(kind, kind)
        if kind not in ("const", "exponential", "uniform", "per_token"):
            raise ConfigError(
                f"unknown delay law '{self.kind}'{_suggest(kind, ('const', 'exponential', 'uniform', 'per_token'))} "
                "(known: const:S, exponential:MEAN, uniform:LO,HI, per_token:S; seconds)"
            )
        object.__setattr__(self, "kind", kind)
        if kind == "uniform":
            lo = _number(self.lo, "", "uniform delay lo")
            hi = _number(self.hi, "", "uniform delay hi")
            if lo < 0 or hi < lo:
                raise ConfigError(f"uniform delay needs 0 <= lo <= hi seconds, got uniform:{lo:g},{hi:g}")
            if hi > MAX_SECONDS:
                raise ConfigError(f"uniform delay hi must be at most {MAX_SECONDS:g} seconds, got {hi:g}")
            object.__setattr__(self, "lo", lo)
            object.__setattr__(self, "hi", hi)
            object.__setattr__(self, "mean", (lo + hi) / 2.0)
            return
        if self.lo is not None or self.hi is not None:
            raise ConfigError(f"a {kind} delay takes a mean only, not lo/hi")
        m = _number(self.mean, "", f"{kind} delay")
        if kind in ("const", "per_token") and m < 0:
            raise ConfigError(f"{kind} delay must be >= 0 seconds, got {m:g}")
        if kind == "exponential" and m <= 0:
            raise ConfigError(f"exponential delay mean must be > 0 seconds, got {m:g}")
        if kind == "per_token" and m > MAX_PER_TOKEN_S:
            raise ConfigError(f"per_token delay must be at most {MAX_PER_TOKEN_S:g} seconds per token, got {m:g}")
        if m > MAX_SECONDS:
            raise ConfigError(f"{kind} delay must be at most {MAX_SECONDS:g} seconds, got {m:g}")
        object.__setattr__(self, "mean", m)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n delays in seconds (float64)."""
        if self.kind in ("const", "per_token"):  # per_token: seconds per context token
            return np.full(n, self.mean, dtype=np.float64)
        if self.kind == "exponential":
            return rng.exponential(self.mean, n)
        return rng.uniform(self.lo, self.hi, n)

    def expected(self) -> float:
        return self.mean

    def to_str(self) -> str:
        """The law as it parses back exactly (config.json reruns the same delays)."""
        if self.kind == "uniform":
            return f"uniform:{_fmt(self.lo)},{_fmt(self.hi)}"
        return f"{self.kind}:{_fmt(self.mean)}"

    def __str__(self) -> str:
        return self.to_str()


def parse_delay_law(spec) -> DelayLaw:
    """A DelayLaw from `const:S`, `exponential:MEAN`, `uniform:LO,HI`, a bare number of
    seconds (constant) or a DelayLaw."""
    if isinstance(spec, DelayLaw):
        return spec
    if isinstance(spec, bool) or spec is None:
        raise ConfigError(
            f"delay must be a law such as const:0.5, exponential:2 or uniform:1,3 (seconds), got {_show(spec)}"
        )
    if isinstance(spec, (int, float, np.integer, np.floating)):
        return DelayLaw("const", float(spec))
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"delay must be a law such as const:0.5, exponential:2 or uniform:1,3 (seconds), got {_show(spec)}"
        )
    s = spec.strip()
    try:
        return DelayLaw("const", float(s))
    except ValueError:
        pass
    kind, _, rest = s.partition(":")
    args = [a.strip() for a in rest.split(",")] if rest.strip() else []
    kind_l = kind.strip().lower()
    if kind_l == "uniform":
        if len(args) != 2:
            raise ConfigError(f"delay law '{s}' needs two values: uniform:LO,HI (seconds)")
        return DelayLaw(
            "uniform",
            lo=_number(args[0], "", f"delay law '{s}': lo", text=True),
            hi=_number(args[1], "", f"delay law '{s}': hi", text=True),
        )
    if kind_l in ("const", "constant", "fixed", "exponential", "exp", "per_token"):
        if len(args) != 1:
            raise ConfigError(f"delay law '{s}' needs one value, e.g. {kind_l}:0.5 (seconds)")
        return DelayLaw(kind_l, _number(args[0], "", f"delay law '{s}'", text=True))
    return DelayLaw(kind_l)  # raises: unknown delay law


# ---------------------------------------------------------------------------- route nodes
@dataclass
class Call:
    """One LLM call at `server`: `prompt` new prompt tokens and `output` output tokens.
    With `context=True` the prompt also holds the job's context so far (module doc); with
    `cached=True` too, that context arrives with its KV cache already computed (another
    server prefilled it: disaggregated prefill and decode), so only the new prompt tokens
    are prefilled here, while the whole prompt occupies the KV cache.
    `cls`: the call's class name ("" until the network assigns `"{job}.{i}"`)."""

    server: str
    prompt: LengthLaw
    output: LengthLaw
    context: bool = False
    cls: str = ""
    cached: bool = False


@dataclass
class Delay:
    """Think or tool time between calls (seconds)."""

    law: DelayLaw


@dataclass
class Fork:
    """Parallel branches; the join waits for all of them."""

    branches: list


@dataclass
class Loop:
    """`body` visited `times` times, or repeated after each pass with probability
    `repeat_prob` (0 <= p < 1; the number of passes is geometric with mean 1/(1-p))."""

    body: list
    times: int | None = None
    repeat_prob: float | None = None


Node = Call | Delay | Fork | Loop


def iter_calls(route) -> Iterator[Call]:
    """The calls of a route in document order (depth first; a loop's body once)."""
    for node in route:
        if isinstance(node, Call):
            yield node
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from iter_calls(branch)
        elif isinstance(node, Loop):
            yield from iter_calls(node.body)


# ------------------------------------------------------------------------------ servers
@dataclass
class ServerSpec:
    """One server: a pool of `replicas` identical replicas behind `router`, each running
    the scheduler given by the first eight fields (`policies.spec.SchedulerSpec`) and
    timed by `cost_model` (a spec string for `llmsched.core.cost.make_cost_model`).

    `router`: random | round-robin | jsq | least-tokens | power-of-two.
    `router_options`: for `random`, `weights` (one non-negative number per replica, not
    all zero; default equal); for `power-of-two`, `d` (replicas sampled, 1 to `replicas`,
    default 2: the one replica of a pool of one). Other routers take no options.
    `priority`: call classes served first at this server, highest first; classes not
    listed come after them, in FCFS order.
    `prefix_caching`, `block_size`: every replica keeps its own prefix cache (its own
    KV accounting, as separate vLLM instances do) in blocks of `block_size` tokens."""

    name: str
    policy: str = "sarathi"
    admission: str = "fcfs"
    b_max: int = 512
    k_max: int | None = None
    kv_capacity: int | None = None
    max_running: int | None = None
    policy_options: dict = field(default_factory=dict)
    admission_options: dict = field(default_factory=dict)
    cost_model: str = "paper"
    replicas: int = 1
    router: str = "jsq"
    router_options: dict = field(default_factory=dict)
    priority: list = field(default_factory=list)
    prefix_caching: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE

    def scheduler_fields(self) -> dict:
        """The `SchedulerSpec` fields as a dict: policy, admission, b_max, k_max,
        kv_capacity, max_running, policy_options, admission_options, and with prefix
        caching on, prefix_caching and block_size."""
        d = {k: (dict(getattr(self, k)) if k.endswith("_options") else getattr(self, k)) for k in _SCHEDULER_FIELDS}
        if self.prefix_caching:
            d.update(prefix_caching=True, block_size=self.block_size)
        return d

    def routing_weights(self) -> list[float]:
        """Share of this server's calls each replica receives in the long run under a
        static router (random: the normalised weights; every other router balances the
        replicas, so equal shares)."""
        w = self.router_options.get("weights") if self.router == "random" else None
        if w is None:
            return [1.0 / self.replicas] * self.replicas
        total = float(sum(w))
        return [float(x) / total for x in w]

    def validate(self, where: str | None = None) -> ServerSpec:
        """Check and normalise the fields in place; ConfigError names `where`."""
        where = where or f"servers.{self.name}"
        self.name = _server_name(self.name, where)
        for k in ("policy", "admission"):
            v = getattr(self, k)
            if not isinstance(v, str) or not v.strip():
                raise _at(
                    where,
                    f"{k} must be a non-empty string such as {'sarathi' if k == 'policy' else 'fcfs'}, got {_show(v)}",
                )
            setattr(self, k, v.strip())
        self.b_max = _whole(self.b_max, where, "b_max", maximum=MAX_B_MAX)
        self.k_max = _whole(self.k_max, where, "k_max", optional=True, maximum=MAX_REQUESTS_PER_STEP)
        self.kv_capacity = _whole(self.kv_capacity, where, "kv_capacity", optional=True, maximum=MAX_KV_TOKENS)
        self.max_running = _whole(self.max_running, where, "max_running", optional=True, maximum=MAX_REQUESTS_PER_STEP)
        for k in ("policy_options", "admission_options", "router_options"):
            v = getattr(self, k)
            if not isinstance(v, dict):  # None too: one server's configuration refuses it as well
                raise _at(where, f"{k} must be a mapping of option names to values, got {_show(v)}")
        if not isinstance(self.cost_model, str) or not self.cost_model.strip():
            raise _at(
                where,
                f"cost_model must be a spec string such as paper or "
                f'"paper:c=11.28,a=35.47,b0=128", got {_show(self.cost_model)}',
            )
        self.cost_model = self.cost_model.strip()
        with _Located(f"{where}.cost_model"):
            make_cost_model(self.cost_model)
        self.replicas = _whole(self.replicas, where, "replicas", maximum=MAX_REPLICAS)
        if not isinstance(self.router, str):
            raise _at(where, f"router must be one of {', '.join(ROUTERS)}, got {_show(self.router)}")
        r = self.router.strip().lower().replace("_", "-")
        r = {
            "round_robin": "round-robin",
            "roundrobin": "round-robin",
            "power-of-d": "power-of-two",
            "least_tokens": "least-tokens",
        }.get(r, r)
        if r not in ROUTERS:
            raise _at(where, f"unknown router '{self.router}'{_suggest(r, ROUTERS)}; known: {', '.join(ROUTERS)}")
        self.router = r
        self._validate_router_options(where)
        if self.priority is None:
            self.priority = []
        if isinstance(self.priority, str) or not isinstance(self.priority, (list, tuple)):
            raise _at(where, f"priority must be a list of call classes (highest first), got {_show(self.priority)}")
        prio = [_name(c, f"{where}.priority", "a priority entry") for c in self.priority]
        dup = sorted({c for c in prio if prio.count(c) > 1})
        if dup:
            raise _at(f"{where}.priority", f"class '{dup[0]}' is listed twice")
        self.priority = prio
        if not isinstance(self.prefix_caching, bool):
            raise _at(where, f"prefix_caching must be true or false, got {_show(self.prefix_caching)}")
        if isinstance(self.block_size, str):
            raise _at(
                where,
                f"block_size must be a whole number of tokens, got {_show(self.block_size)}{_quoted(self.block_size)}",
            )
        with _Located(where):
            self.block_size = check_block_size(self.block_size, "block_size")
        return self

    def _validate_router_options(self, where: str) -> None:
        opts, at = self.router_options, f"{where}.router_options"
        allowed = {"random": ("weights",), "power-of-two": ("d",)}.get(self.router, ())
        for k in opts:
            if k not in allowed:
                extra = f"known: {', '.join(allowed)}" if allowed else f"router {self.router} takes no options"
                raise _at(at, f"unknown option '{k}' for router {self.router}{_suggest(k, allowed)}; {extra}")
        if "weights" in opts:
            w = opts["weights"]
            if isinstance(w, (str, dict)) or not isinstance(w, (list, tuple)):
                raise _at(at, f"weights must be a list with one number per replica, got {_show(w)}")
            if len(w) != self.replicas:
                raise _at(at, f"weights must have one entry per replica ({self.replicas}), got {len(w)}")
            vals = [_number(x, at, "each weight") for x in w]
            if any(x < 0 for x in vals):
                raise _at(at, f"weights must be >= 0, got {_show(list(w))}")
            if not sum(vals) > 0:
                raise _at(at, "weights are all zero: no replica would receive calls")
            if not math.isfinite(sum(vals)):
                raise _at(at, f"weights must sum to a finite number (scale them down), got {_show(list(w))}")
            opts["weights"] = vals
        if "d" in opts:
            d = _whole(opts["d"], at, "d (replicas sampled by power-of-two)")
            if d > self.replicas:  # (the default 2 is not checked: a pool of one has one to pick)
                raise _at(
                    at,
                    f"d (replicas sampled by power-of-two) must be at most the server's replicas "
                    f"({self.replicas}), got {d}",
                )
            opts["d"] = d

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in _SERVER_KEYS if k not in _PREFIX_FIELDS or self.prefix_caching}
        for k in ("policy_options", "admission_options", "router_options"):
            d[k] = dict(d[k])
        d["priority"] = list(self.priority)
        d["cost_model"] = recorded_cost_model(self.cost_model)
        return d


# ------------------------------------------------------------------------------ jobs
@dataclass
class JobType:
    """Jobs of one type: their arrival process (`rate` jobs per second) and route.

    `system_prompt`: tokens every call of the type starts with, the same for every job of
    the type (its blocks are shared by all of them), before the resent context and the
    call's new prompt. `context`: "per-call" (each call's `context` flag decides) or
    "grow" (every call resends the job's context, as if each had `context: true`)."""

    name: str
    arrival: ArrivalProcess
    route: list
    system_prompt: int = 0
    context: str = "per-call"

    def calls(self) -> list[Call]:
        return list(iter_calls(self.route))


@dataclass
class NetworkSpec:
    """A network: servers by name, job types, the stopping rule and the seed.

    `num_jobs`: jobs to simulate, all job types together; `duration_s`: stop arrivals
    after this time; either, both (whichever comes first) or neither (fine for the
    traffic equations; a simulation needs one). Construction validates everything and
    assigns default class names to calls without one (`Call.cls` is set in place).
    `control`: "none" (each server serves its calls by its own policy and priority
    list), or "backpressure" (max-pressure: each server's router picks a call's replica on
    delivery, the call waits in that replica's buffer for its class, and at each step
    boundary a replica takes new work from the class whose buffered calls exceed the
    largest buffer of a class it feeds by the most, weighed by its service rate in calls
    per token of work)."""

    servers: dict
    jobs: list
    num_jobs: int | None = None
    duration_s: float | None = None
    seed: int = 0
    control: str = "none"
    # options of the run (`RUN_KEYS`) that a run's config.json records; an argument given
    # to `simulate_network` replaces the file's
    run: dict = field(default_factory=dict)
    # a spec `llmsched.cluster_network` built: what set its server's KV capacity as the
    # caller gave it (its keyword, its config's key), which a call over the capacity names
    # (servers.cluster.kv_capacity is the generated spec's key, not the caller's); each of
    # its jobs is one request. Not part of the network (nor of its YAML form)
    kv_capacity_from: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        self.validate()

    # -------------------------------------------------------------- construction
    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> NetworkSpec:
        p = Path(path)
        data = read_yaml(p, "network")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{p.name}: {e}") from None

    @classmethod
    def from_dict(cls, d: Any) -> NetworkSpec:
        """A network from a mapping of the YAML form (docs/networks.md)."""
        d = _mapping(d, "", "a network")
        _check_keys(d, _TOP_KEYS, "", "the network's top level")
        for k in ("servers", "jobs"):
            if k not in d or d[k] is None:
                raise ConfigError(f"the network needs a '{k}' section")
        servers_raw = _mapping(d["servers"], "servers", "servers")
        if not servers_raw:
            raise ConfigError("servers: the network needs at least one server")
        servers = {}
        for name, sd in servers_raw.items():
            where = f"servers.{name}"
            if sd is None:  # `s3:` with nothing after it: settings lost or indented wrongly
                raise _at(where, f"server '{name}' is empty (null): give its settings, or {{}} for every default")
            sd = _mapping(sd, where, f"server '{name}'")
            _check_keys(sd, _SERVER_KEYS, where, f"server '{name}'")
            servers[name] = ServerSpec(name=name, **sd)
        jobs_raw = _mapping(d["jobs"], "jobs", "jobs")
        if not jobs_raw:
            raise ConfigError("jobs: the network needs at least one job type")
        jobs = [_parse_job(name, jd) for name, jd in jobs_raw.items()]
        return cls(
            servers=servers,
            jobs=jobs,
            num_jobs=d.get("num_jobs"),
            duration_s=d.get("duration_s"),
            seed=d.get("seed", 0),
            control=d.get("control", "none"),
            run=d.get("run"),
        )

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        self.run = _run_options(self.run)
        if self.control not in CONTROLS:
            raise _at("control", f"unknown network control {self.control!r} (known: {', '.join(CONTROLS)})")
        if not isinstance(self.servers, dict) or not self.servers:
            raise ConfigError("servers: the network needs at least one server")
        for key, s in self.servers.items():
            if not isinstance(s, ServerSpec):
                raise _at(f"servers.{key}", f"expected a ServerSpec, got {_show(s)}")
            s.validate(f"servers.{key}")
            if s.name != key:
                raise _at(f"servers.{key}", f"the server's name is '{s.name}', not '{key}'")
        if isinstance(self.jobs, dict):
            self.jobs = list(self.jobs.values())
        if not isinstance(self.jobs, (list, tuple)) or not self.jobs:
            raise ConfigError("jobs: the network needs at least one job type")
        self.jobs = list(self.jobs)
        names = set()
        for job in self.jobs:
            if not isinstance(job, JobType):
                raise ConfigError(f"jobs: expected JobType objects, got {_show(job)}")
            job.name = _name(job.name, "jobs", "job type name")
            if job.name in names:
                raise _at(f"jobs.{job.name}", "this job type name is used twice")
            names.add(job.name)
            where = f"jobs.{job.name}"
            if not isinstance(job.arrival, ArrivalProcess):
                raise _at(f"{where}.arrival", f"expected an arrival process, got {_show(job.arrival)}")
            if not isinstance(job.route, (list, tuple)) or not job.route:
                raise _at(f"{where}.route", "the route is empty: a job type needs at least one call")
            job.route = list(job.route)
            self._check_route(job.route, f"{where}.route")
            if not job.calls():
                raise _at(f"{where}.route", "the route has no call: a job type needs at least one call")
            job.system_prompt = _whole(
                job.system_prompt, where, "system_prompt (tokens)", minimum=0, maximum=MAX_LENGTH
            )
            job.context = _job_context(job.context, where)
            if job.context == "grow":
                for call in job.calls():
                    call.context = True
        self._name_classes()
        self._check_priorities()
        if self.duration_s is not None:
            self.duration_s = _number(self.duration_s, "duration_s", "duration_s")
            if self.duration_s <= 0:
                raise ConfigError(f"duration_s: must be > 0 seconds, got {self.duration_s:g}")
            if self.duration_s > MAX_SECONDS:
                raise ConfigError(f"duration_s: must be at most {MAX_SECONDS:g} seconds, got {self.duration_s:g}")
        self.num_jobs = _job_count(self.num_jobs, self.duration_s, "num_jobs")
        self.seed = _seed(0 if self.seed is None else self.seed, "seed")

    def _name_classes(self) -> None:
        """Default class names for calls without one; a default name that another call
        has explicitly is refused (the two calls would merge into one class unseen)."""
        explicit: dict[str, str] = {}
        for job in self.jobs:
            for i, call in enumerate(job.calls(), start=1):
                if call.cls:
                    explicit.setdefault(call.cls, f"call {i} of job {job.name} (on {call.server})")
        for job in self.jobs:
            for i, call in enumerate(job.calls(), start=1):
                if call.cls:
                    continue
                name = f"{job.name}.{i}"
                if name in explicit:
                    raise _at(
                        f"jobs.{job.name}.route",
                        f"call {i} (on {call.server}) has no class and its default name '{name}' is the class "
                        f"given to {explicit[name]}: the two would merge into one class; give call {i} a class "
                        "or rename the other",
                    )
                call.cls = name

    def _check_route(self, route: list, where: str, _path: tuple = ()) -> None:
        """`_path`: the ids of the forks and loops around `route`."""
        for i, node in enumerate(route):
            at = f"{where}[{i}]"
            if isinstance(node, (Fork, Loop)):
                _check_nesting(node, at, _path)
            if isinstance(node, Call):
                at = f"{at}.call"
                if not isinstance(node.server, str) or node.server not in self.servers:
                    raise _at(
                        at,
                        f"unknown server '{node.server}'{_suggest(node.server, self.servers)}; "
                        f"servers: {', '.join(self.servers)}",
                    )
                for role in ("prompt", "output"):
                    with _Located(f"{at}.{role}"):
                        setattr(node, role, parse_length_law(getattr(node, role), role))
                if not isinstance(node.context, bool):
                    raise _at(at, f"context must be true or false, got {_show(node.context)}")
                if node.cls is None:
                    node.cls = ""
                if node.cls:
                    node.cls = _name(node.cls, at, "class")
            elif isinstance(node, Delay):
                if not isinstance(node.law, DelayLaw):
                    with _Located(f"{at}.delay"):
                        node.law = parse_delay_law(node.law)
            elif isinstance(node, Fork):
                at = f"{at}.fork"
                if not isinstance(node.branches, (list, tuple)) or not node.branches:
                    raise _at(at, "a fork needs at least one branch (a list of branches, each a list of nodes)")
                node.branches = list(node.branches)
                for j, branch in enumerate(node.branches):
                    if not isinstance(branch, (list, tuple)) or not branch:
                        raise _at(f"{at}[{j}]", "empty fork branch: each branch needs at least one node")
                    node.branches[j] = list(branch)
                    self._check_route(node.branches[j], f"{at}[{j}]", (*_path, id(node)))
            elif isinstance(node, Loop):
                at = f"{at}.loop"
                if (node.times is None) == (node.repeat_prob is None):
                    raise _at(
                        at,
                        "give exactly one of times (fixed passes) or repeat_prob "
                        "(repeat after each pass with that probability)",
                    )
                if node.times is not None:
                    node.times = _whole(node.times, at, "times")
                    if node.times > _MAX_LOOP_TIMES:
                        raise _at(at, f"times must be at most {_MAX_LOOP_TIMES:,}, got {node.times}")
                else:
                    p = _number(node.repeat_prob, at, "repeat_prob")
                    if not 0.0 <= p < 1.0:
                        raise _at(
                            at,
                            f"repeat_prob must be in [0, 1), got {p:g}"
                            + (" (a cycle without exit: the loop would never end)" if p >= 1 else ""),
                        )
                    if 1.0 / (1.0 - p) > _MAX_LOOP_TIMES:
                        raise _at(
                            at,
                            f"repeat_prob must be at most {1 - 1 / _MAX_LOOP_TIMES:g} "
                            f"(a mean of {_MAX_LOOP_TIMES:,} passes, as for times), got {p!r}",
                        )
                    node.repeat_prob = p
                if not isinstance(node.body, (list, tuple)) or not node.body:
                    raise _at(at, "the loop body is empty: it needs at least one node")
                node.body = list(node.body)
                self._check_route(node.body, f"{at}.body", (*_path, id(node)))
            else:
                raise _at(at, f"a route node must be a Call, Delay, Fork or Loop, got {_show(node)}")

    def _check_priorities(self) -> None:
        visits = self.class_servers()
        for key, s in self.servers.items():
            if s.priority and self.control == "backpressure":
                # max-pressure hands a replica one class at a time: an order among classes
                # would never apply (the run was the same whichever class came first)
                raise _at(
                    f"servers.{key}.priority",
                    "priorities do not apply under control: backpressure (max-pressure picks the class "
                    "a replica serves); drop the priority or use control: none",
                )
            for c in s.priority:
                if c not in visits:
                    raise _at(f"servers.{key}.priority", f"unknown call class '{c}'{_suggest(c, visits)}")
                if key not in visits[c]:
                    raise _at(
                        f"servers.{key}.priority",
                        f"call class '{c}' never visits server {key} (it runs on {', '.join(sorted(visits[c]))})",
                    )

    # -------------------------------------------------------------- queries
    def call_classes(self) -> list[str]:
        """Every call class, once, in order of job types and then document order."""
        out: list[str] = []
        seen = set()
        for job in self.jobs:
            for call in job.calls():
                if call.cls not in seen:
                    seen.add(call.cls)
                    out.append(call.cls)
        return out

    def class_servers(self) -> dict[str, set]:
        """For each call class, the servers its calls run on."""
        out: dict[str, set] = {}
        for job in self.jobs:
            for call in job.calls():
                out.setdefault(call.cls, set()).add(call.server)
        return out

    def job(self, name: str) -> JobType:
        for j in self.jobs:
            if j.name == name:
                return j
        raise ConfigError(f"unknown job type '{name}'{_suggest(name, [j.name for j in self.jobs])}")

    def scaled(self, factor: float) -> NetworkSpec:
        """A copy with every job type's arrival rate multiplied by `factor` (> 0); routes
        and servers are shared with this spec (treat specs as read-only)."""
        f = _number(factor, "", "scale factor")
        if not f > 0:
            raise ConfigError(f"scale factor must be > 0, got {f:g}")
        jobs = [JobType(j.name, _scaled_arrival(j.arrival, f), j.route, j.system_prompt, j.context) for j in self.jobs]
        return NetworkSpec(
            servers=dict(self.servers),
            jobs=jobs,
            num_jobs=self.num_jobs,
            duration_s=self.duration_s,
            seed=self.seed,
            control=self.control,
            run=dict(self.run),
            kv_capacity_from=self.kv_capacity_from,
        )

    def with_run(self, *, num_jobs=None, seed=None) -> NetworkSpec:
        """A copy that simulates `num_jobs` jobs and uses `seed` (None: keep this spec's),
        checked as the file's are, with one-line errors naming the argument (numpy would
        raise its own errors on a negative or fractional count or seed). This spec is not
        changed; routes and servers are shared (treat specs as read-only)."""
        n = self.num_jobs if num_jobs is None else _job_count(num_jobs, self.duration_s, "")
        s = self.seed if seed is None else _seed(seed, "")
        return replace(self, servers=dict(self.servers), jobs=list(self.jobs), num_jobs=n, seed=s)

    def to_dict(self) -> dict:
        """The YAML form (from_dict(to_dict()) gives an equal network, but that the files it
        names are absolute paths: a run's config.json, read from any folder)."""
        out: dict = {
            "servers": {k: {kk: vv for kk, vv in s.to_dict().items() if kk != "name"} for k, s in self.servers.items()},
            "jobs": {j.name: _job_dict(j) for j in self.jobs},
        }
        if self.num_jobs is not None:
            out["num_jobs"] = self.num_jobs
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        out["seed"] = self.seed
        if self.control != "none":
            out["control"] = self.control
        if self.run:
            out["run"] = dict(self.run)
        return out


def _run_options(run) -> dict:
    """`run:` of a network file: the options of the run that a run's `config.json` records
    (`max_time_s`, `sample_interval_s`: seconds or null; `fast`: true or false), checked;
    {} when absent."""
    if run is None:
        return {}
    run = _mapping(run, "run", "run")
    _check_keys(run, RUN_KEYS, "run", "run")
    out = {}
    checks = (("max_time_s", lambda v: check_seconds("max_time_s", v)), ("sample_interval_s", check_sample_interval))
    for key, check in checks:
        if run.get(key) is not None:
            try:
                out[key] = check(run[key])
            except ConfigError as e:
                raise _at(f"run.{key}", str(e)) from None
    if "fast" in run:
        if not isinstance(run["fast"], bool):
            raise _at("run.fast", f"must be true or false, got {_show(run['fast'])}")
        out["fast"] = run["fast"]
    return out


def load_network(spec) -> NetworkSpec:
    """A NetworkSpec from a NetworkSpec, a mapping or a YAML path."""
    if isinstance(spec, NetworkSpec):
        return spec
    if isinstance(spec, dict):
        return NetworkSpec.from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return NetworkSpec.from_yaml(spec)
    raise ConfigError(f"expected a network (NetworkSpec, mapping or YAML path), got {_show(spec)}")


# ------------------------------------------------------------------------------ parsing
def _job_context(value, where: str) -> str:
    if value not in JOB_CONTEXTS:
        raise _at(
            where,
            f"unknown context {_show(value)}{_suggest(str(value), JOB_CONTEXTS)}; known: {', '.join(JOB_CONTEXTS)} "
            "(grow: every call resends the job's context)",
        )
    return value


def _parse_job(name, jd) -> JobType:
    where = f"jobs.{name}"
    name = _name(name, "jobs", "job type name")
    jd = _mapping(jd, where, f"job type '{name}'")
    _check_keys(jd, _JOB_KEYS, where, f"job type '{name}'")
    if "arrival" not in jd:
        raise _at(where, "missing 'arrival' (e.g. arrival: {process: poisson, rate: 1.0})")
    if "route" not in jd or jd["route"] is None:
        raise _at(where, "missing 'route' (a list of call, delay, fork and loop nodes)")
    arrival = _parse_arrival(jd["arrival"], f"{where}.arrival")
    context = _job_context(jd.get("context", "per-call"), where)
    route = jd["route"]
    if isinstance(route, dict):  # a single node
        route = [route]
    return JobType(
        name=name,
        arrival=arrival,
        route=_parse_route(route, f"{where}.route", grow=context == "grow"),
        system_prompt=jd.get("system_prompt", 0),
        context=context,
    )


def _parse_arrival(a, where: str) -> ArrivalProcess:
    a = _mapping(a, where, "arrival")
    _check_keys(a, _ARRIVAL_KEYS, where, "arrival")
    process = a.get("process", "poisson")
    if not isinstance(process, str):
        raise _at(where, f"process must be poisson, gamma or deterministic, got {_show(process)}")
    if process.strip().lower().split(":", 1)[0] in ("trace", "azure-conv"):
        # one server's arrival forms, which take no rate: said before a missing rate is
        raise _at(
            where,
            f"process {process!r}: a job type's arrivals are poisson, gamma or deterministic; a trace's "
            "arrival times replay on one server only (a call's lengths can replay a file: replay:PATH)",
        )
    if "rate" not in a:
        raise _at(where, "missing 'rate' (jobs per second)")
    rate, cv = a["rate"], a.get("cv")
    _number(rate, where, "arrival rate (jobs per second)")  # refuses strings, bools, inf
    if cv is not None:
        _number(cv, where, "cv (coefficient of variation)")
    with _Located(where):
        return make_arrival_process(process, as_real(rate), as_real(cv))  # gamma without cv: cv 1, as for one server


def _check_nesting(node, where: str, path: tuple) -> None:
    """A fork or loop (a node mapping, or a Fork or Loop) met inside the forks and loops
    whose ids are `path`: refused when it is one of them (a YAML alias inside its own
    anchor: the route would never end) or nests deeper than MAX_ROUTE_NESTING."""
    if id(node) in path:
        raise _at(
            where,
            "the route refers to itself here (an alias such as *r inside the node or list it names, &r): "
            "a route must be finite; repeat calls with a loop's times or repeat_prob",
        )
    if len(path) >= MAX_ROUTE_NESTING:
        top = where.partition("]")[0] + "]"  # the route's top node (the full path names every level)
        raise _at(
            top, f"forks and loops nest more than {MAX_ROUTE_NESTING} deep inside it (a route nests at most that)"
        )


def _parse_route(route, where: str, grow: bool = False, _path: tuple = (), _nodes: list | None = None) -> list:
    """`grow`: the job type's context is "grow" (a call may not turn it off); `_path`: the
    ids of the fork and loop mappings around `route`; `_nodes`: [nodes parsed so far in
    the job type's route] (MAX_ROUTE_NODES)."""
    if _nodes is None:
        _nodes = [0]
    if not isinstance(route, (list, tuple)):
        raise _at(where, f"must be a list of nodes (call, delay, fork, loop), got {_show(route)}")
    if not route:
        raise _at(where, "the route is empty: it needs at least one node")
    return [_parse_node(n, f"{where}[{i}]", grow, _path, _nodes) for i, n in enumerate(route)]


def _parse_node(n, where: str, grow: bool = False, _path: tuple = (), _nodes: list | None = None) -> Node:
    if _nodes is not None:
        _nodes[0] += 1
        if _nodes[0] > MAX_ROUTE_NODES:
            top = where.partition("]")[0] + "]"
            raise _at(
                top,
                f"the route has more than {MAX_ROUTE_NODES:,} nodes (each use of a YAML alias counts its "
                "nodes again); repeat calls with a loop's times or repeat_prob",
            )
    if not isinstance(n, dict) or len(n) != 1:
        raise _at(where, f"each route node must be a mapping with one key ({', '.join(_NODE_KINDS)}), got {_show(n)}")
    ((kind, value),) = n.items()
    if kind not in _NODE_KINDS:
        raise _at(where, f"unknown node '{kind}'{_suggest(kind, _NODE_KINDS)}; known: {', '.join(_NODE_KINDS)}")
    at = f"{where}.{kind}"
    if kind in ("fork", "loop"):
        _check_nesting(n, where, _path)
        _path = (*_path, id(n))
    if kind == "call":
        c = _mapping(value, at, "a call")
        _check_keys(c, _CALL_KEYS, at, "a call")
        for k in ("server", "prompt", "output"):
            if k not in c:
                raise _at(at, f"missing '{k}'")
        if not isinstance(c["server"], str):
            raise _at(at, f"server must be a server name, got {_show(c['server'])}")
        laws = {}
        for role in ("prompt", "output"):
            with _Located(f"{at}.{role}"):
                laws[role] = parse_length_law(c[role], role)
        ctx = c.get("context", grow)
        if not isinstance(ctx, bool):
            raise _at(at, f"context must be true or false, got {_show(ctx)}")
        if grow and not ctx:
            raise _at(at, "context: false in a job type whose context is grow (every call resends the context)")
        cached = c.get("cached", False)
        if not isinstance(cached, bool):
            raise _at(at, f"cached must be true or false, got {_show(cached)}")
        if cached and not ctx:
            raise _at(at, "cached: true needs context: true (it says the resent context's KV cache arrives ready)")
        cls = c.get("class")
        if cls is not None:
            cls = _name(cls, at, "class")
        return Call(
            server=c["server"], prompt=laws["prompt"], output=laws["output"], context=ctx, cls=cls or "", cached=cached
        )
    if kind == "delay":
        with _Located(at):
            return Delay(parse_delay_law(value))
    if kind == "fork":
        branches = value
        if isinstance(value, dict):
            _check_keys(value, ("branches",), at, "a fork")
            branches = value.get("branches")
        if not isinstance(branches, (list, tuple)) or not branches:
            raise _at(at, "a fork needs a non-empty list of branches, each a list of nodes")
        out = []
        for j, b in enumerate(branches):
            if isinstance(b, dict):  # a one-node branch written without brackets
                b = [b]
            if not isinstance(b, (list, tuple)) or not b:
                raise _at(f"{at}[{j}]", "empty fork branch: each branch needs at least one node")
            out.append(_parse_route(b, f"{at}[{j}]", grow, _path, _nodes))
        return Fork(out)
    lp = _mapping(value, at, "a loop")
    _check_keys(lp, _LOOP_KEYS, at, "a loop")
    if ("times" in lp) == ("repeat_prob" in lp):
        raise _at(
            at, "give exactly one of times (fixed passes) or repeat_prob (repeat after each pass with that probability)"
        )
    if "body" not in lp or lp["body"] in (None, []):
        raise _at(at, "the loop body is empty: it needs at least one node")
    body = lp["body"]
    if isinstance(body, dict):
        body = [body]
    return Loop(
        body=_parse_route(body, f"{at}.body", grow, _path, _nodes),
        times=lp.get("times"),
        repeat_prob=lp.get("repeat_prob"),
    )


# ------------------------------------------------------------------------------ output
def _scaled_arrival(a: ArrivalProcess, f: float) -> ArrivalProcess:
    """The same process at `f` times the rate (Poisson, Gamma and Deterministic are frozen
    dataclasses whose `rate` is re-checked by `replace`)."""
    if not isinstance(a, (Poisson, Gamma, Deterministic)):
        raise ConfigError(f"cannot scale the rate of arrival process {_show(a)}")
    return replace(a, rate=a.rate * f)


def _job_dict(j: JobType) -> dict:
    d: dict = {"arrival": _arrival_dict(j.arrival)}
    if j.system_prompt:
        d["system_prompt"] = j.system_prompt
    if j.context != "per-call":
        d["context"] = j.context
    d["route"] = [_node_dict(n) for n in j.route]
    return d


def _arrival_dict(a: ArrivalProcess) -> dict:
    d = a.to_dict()
    out = {"process": d.pop("arrival"), "rate": d.pop("rate")}
    out.update(d)
    return out


def _node_dict(n) -> dict:
    if isinstance(n, Call):
        d = {"server": n.server, "prompt": n.prompt.recorded(), "output": n.output.recorded()}
        if n.context:
            d["context"] = True
        if n.cached:
            d["cached"] = True
        if n.cls:
            d["class"] = n.cls
        return {"call": d}
    if isinstance(n, Delay):
        return {"delay": n.law.to_str()}
    if isinstance(n, Fork):
        return {"fork": [[_node_dict(m) for m in b] for b in n.branches]}
    d = {"body": [_node_dict(m) for m in n.body]}
    if n.times is not None:
        d["times"] = n.times
    else:
        d["repeat_prob"] = n.repeat_prob
    return {"loop": d}
