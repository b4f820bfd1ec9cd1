"""`WorkloadSpec`: a whole workload in a few fields, and `make_trace(spec) -> Trace`.

Arrivals (`arrival`):
    poisson | gamma | deterministic      synthetic, at `rate` req/s (gamma also `cv`);
                                         inline parameters allowed: poisson:5,
                                         gamma:rate=5,cv=2, deterministic:rate=5
    trace:PATH | trace (with `trace`)    replay a trace file (plain or Azure CSV); replay:PATH
                                         is the same, and every name any case
    azure-conv                           replay the named Azure conversation trace
For a trace, `time_scale` k divides arrival times (k times the rate); alternatively `rate`
rescales the replayed part (after the cut below) to that mean rate, (n - 1) / (t_last -
t_first) over its n requests (`trace.replay_cut`). Lengths come from the trace unless `prompt` /
`output` give a length law (each may be overridden alone).

Stopping: `num_requests` and/or `duration_s` (arrivals at or before duration_s, in the
replayed, already time-scaled clock); with both, whichever is reached first. A synthetic
workload needs at least one; a trace without either is replayed whole.

Randomness: `numpy.random.default_rng` on child seeds of `seed`, one stream per purpose
(arrivals; class assignment; prompt and output lengths of each class), so changing the
rate or the arrival process never changes the lengths drawn, and the first n lengths do
not depend on how many requests are made.

Classes: `classes=[{"tag": "chat", "share": 0.7, "prompt": ..., "output": ...}, ...]`
assigns each request a class at random with probability share / sum of shares; a class's
laws default to the workload's `prompt` / `output` (or, for a trace, its own lengths).

Shared prefixes (synthetic arrivals only; `workload.conversations`, docs/workloads.md):
`system_prompt` N tokens (also per class) start every request of the class, on top of the
prompt law; `turns` (a length law) with `think_time_s` makes multi-turn conversations, one
per arrival of the process, turn k + 1 arriving an exponential think time after turn k
arrives and resending turns 1..k. `trace_model` / `trace_log_type` filter a BurstGPT trace.
`make_trace(spec, block_size)` gives the requests block ids at that block size.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, fields, replace

import numpy as np

from ..core.checks import FLOAT_SEED_LIMIT, quoted_number, strict_keywords
from ..core.errors import ConfigError, warn
from ..core.request import MAX_SECONDS
from .arrivals import MAX_RATE, MAX_REQUESTS, check_cv, check_rate, make_arrival_process
from .blocks import DEFAULT_BLOCK_SIZE, check_block_size, reblock, reblock_ratio
from .conversations import conversation_turns, stream_blocks
from .csvio import CSV_UNSAFE, MAX_LENGTH
from .datasets import is_dataset, recorded_file, resolve_path
from .lengths import LengthLaw, named_length_law, sample_pair
from .trace import FORMATS, Trace, read_trace, replay_cut, replayed_times, trace_format

__all__ = [
    "WorkloadSpec",
    "WorkloadClass",
    "make_trace",
    "load_trace",
    "replays_trace",
    "with_defaults",
    "DEFAULT_WORKLOAD",
    "without_inline_rate",
    "one_spelling",
    "SYNTHETIC_ARRIVALS",
]

SYNTHETIC_ARRIVALS = ("poisson", "gamma", "deterministic")
_ARRIVAL_ALIASES = {"exponential": "poisson", "constant": "deterministic", "replay": "trace"}

# Stream roles for numpy SeedSequence spawn keys.
_ARRIVALS, _CLASSES, _PROMPT, _OUTPUT, _TURNS, _THINK = 0, 1, 2, 3, 4, 5


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _refuse_text(value, what: str, kind: str = "a number") -> None:
    """A string (or bytes) given for a number is a ConfigError naming `what`: `rate: "5"` in
    a YAML file is text, refused as a network or serverless file refuses it (it ran as 5)."""
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{what} must be {kind}, got {value!r:.60}{quoted_number(value)}")


def _whole_seed(seed) -> int:
    """A seed as an int: a whole number >= 0, kept exactly however large (a float seed must
    be finite and whole; a string is refused)."""
    _refuse_text(seed, "seed", "a whole number >= 0")
    bad = ConfigError(f"seed must be a whole number >= 0, got {seed!r:.60}")
    if isinstance(seed, bool):  # float(True) == 1: a bool is no seed
        raise bad
    if isinstance(seed, (int, np.integer)):
        value = int(seed)
    else:
        try:
            value = float(seed)
        except (TypeError, ValueError):
            raise bad from None
        if isinstance(value, float):
            if not value.is_integer():  # (inf and nan are not)
                raise bad
            if value >= FLOAT_SEED_LIMIT:  # not the number written: its digits are wanted
                raise ConfigError(
                    f"seed must be a whole number >= 0 written as an integer, got {seed!r:.60} "
                    "(a float of 2**53 or more is not exact: write its digits)"
                )
            value = int(value)
    if value < 0:
        raise bad
    return value


def _opt_float(value, what: str, positive: bool = True, hi: float | None = None, text: bool = False) -> float | None:
    """A positive finite number as a float (None stays None); a string only with `text` (a
    number inside an arrival's text, poisson:5)."""
    if value is None:
        return None
    if not text:
        _refuse_text(value, what)
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(f) or (positive and f <= 0):
        raise ConfigError(f"{what} must be a positive number, got {value!r}")
    if hi is not None and f > hi:
        raise ConfigError(f"{what} must be at most {hi:g}, got {value!r}")
    return f


def _opt_tokens(value, what: str) -> int | None:
    """A whole number of tokens >= 0 (None stays None)."""
    if value is None:
        return None
    _refuse_text(value, what, "a whole number of tokens >= 0")
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a whole number of tokens >= 0, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a whole number of tokens >= 0, got {value!r}") from None
    if not math.isfinite(f) or f != math.floor(f) or not 0 <= f <= MAX_LENGTH:
        raise ConfigError(f"{what} must be a whole number of tokens in 0..{MAX_LENGTH}, got {value!r}")
    return int(f)


def _opt_count(value, what: str) -> int | None:
    if value is None:
        return None
    _refuse_text(value, what, "a whole number >= 1")
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a whole number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a whole number, got {value!r}") from None
    if not math.isfinite(f) or f != math.floor(f) or f < 1:
        raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")
    return int(f)


@dataclass
class WorkloadClass:
    """One request class of a mix: a tag, a share and (optionally) its own length laws."""

    tag: str
    share: float = 1.0
    prompt: LengthLaw | str | None = None
    output: LengthLaw | str | None = None
    system_prompt: int | None = None  # tokens every request of the class starts with

    def __post_init__(self):
        if not isinstance(self.tag, str) or not self.tag.strip():
            raise ConfigError(f"class tag must be a non-empty string, got {self.tag!r}")
        self.tag = self.tag.strip()
        if any(c in self.tag for c in CSV_UNSAFE):
            raise ConfigError(f"class tag {self.tag!r} must not contain commas, quotes, newlines or carriage returns")
        self.share = _opt_float(self.share, f"share of class '{self.tag}'")
        for role in ("prompt", "output"):
            if getattr(self, role) is not None:
                setattr(self, role, named_length_law(getattr(self, role), f"{role} of class '{self.tag}'", role))
        self.system_prompt = _opt_tokens(self.system_prompt, f"system_prompt of class '{self.tag}'")

    def to_dict(self) -> dict:
        return {
            "tag": self.tag,
            "share": self.share,
            "prompt": None if self.prompt is None else self.prompt.recorded(),
            "output": None if self.output is None else self.output.recorded(),
            "system_prompt": self.system_prompt,
        }

    @classmethod
    def from_dict(cls, d) -> WorkloadClass:
        if isinstance(d, WorkloadClass):
            return d
        if not isinstance(d, dict):
            raise ConfigError(f"each class must be a mapping with tag, share, prompt, output; got {d!r}")
        known = {"tag", "share", "prompt", "output", "system_prompt"}
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"unknown key '{extra[0]}' in workload class (known: {', '.join(sorted(known))})")
        if "tag" not in d:
            raise ConfigError("each workload class needs a 'tag'")
        return cls(d["tag"], d.get("share", 1.0), d.get("prompt"), d.get("output"), d.get("system_prompt"))


@strict_keywords("workload option")
@dataclass
class WorkloadSpec:
    """A workload: arrivals, length laws, stopping rule, seed and optional class mix.

    Construction validates and normalises (ConfigError on bad input): `arrival` becomes
    one of poisson, gamma, deterministic, trace (with the path in `trace`); `prompt` /
    `output` become `LengthLaw` objects; `classes` a list of `WorkloadClass`."""

    arrival: str | None = None
    rate: float | None = None
    cv: float | None = None
    trace: str | None = None
    time_scale: float = 1.0
    prompt: LengthLaw | str | int | None = None
    output: LengthLaw | str | int | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0
    classes: list | None = None
    trace_model: str | None = None
    trace_log_type: str | None = None
    system_prompt: int | None = None
    turns: LengthLaw | str | int | None = None
    think_time_s: float | None = None

    def __post_init__(self):
        self.rate = _opt_float(self.rate, "arrival rate (requests per second)")
        self.cv = _opt_float(self.cv, "cv (coefficient of variation of inter-arrival times)")
        self.time_scale = _opt_float(1.0 if self.time_scale is None else self.time_scale, "time_scale")
        self.num_requests = _opt_count(self.num_requests, "num_requests")
        self.duration_s = _opt_float(self.duration_s, "duration_s")
        self.seed = _whole_seed(self.seed)
        if self.trace is not None:  # (a list or a number was looked for as a file: "file ['a.csv'] does not exist")
            self.trace = os.fspath(self.trace) if isinstance(self.trace, os.PathLike) else self.trace
            if not isinstance(self.trace, str) or not self.trace.strip():
                raise ConfigError(f"trace must be a trace file's path or a dataset's name, got {self.trace!r:.60}")
        self._normalise_arrival()
        for name in ("trace_model", "trace_log_type"):
            v = getattr(self, name)
            if isinstance(v, (list, tuple)):
                v = ",".join(str(x) for x in v)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ConfigError(f"{name} must be a name (or names separated by commas), got {v!r}")
            setattr(self, name, None if v is None else v.strip())
        for role in ("prompt", "output"):
            if getattr(self, role) is not None:
                setattr(self, role, named_length_law(getattr(self, role), role, role))
        self.system_prompt = _opt_tokens(self.system_prompt, "system_prompt")
        if self.turns is not None:
            self.turns = named_length_law(self.turns, "turns", "turns")
        # a turn past the arrival clock's end (MAX_SECONDS) was silently never simulated
        self.think_time_s = _opt_float(self.think_time_s, "think_time_s", hi=MAX_SECONDS)
        if self.classes is not None:
            if isinstance(self.classes, (str, bytes, dict)) or not hasattr(self.classes, "__iter__"):
                got = "one mapping (put it in a list)" if isinstance(self.classes, dict) else repr(self.classes)
                raise ConfigError(f"classes must be a list of mappings with tag, share, prompt, output; got {got:.60}")
            self.classes = [WorkloadClass.from_dict(c) for c in self.classes]
            if not self.classes:
                self.classes = None
            else:
                tags = [c.tag for c in self.classes]
                dup = {t for t in tags if tags.count(t) > 1}
                if dup:
                    raise ConfigError(f"class tag '{sorted(dup)[0]}' is used twice")
        self._check_complete()

    # ------------------------------------------------------------------ checks
    def _normalise_arrival(self):
        a = self.arrival
        if a is None:
            self.arrival = "trace" if self.trace is not None else "poisson"
            return
        kind, rest = _arrival_kind(a)
        if kind == "trace":
            if rest:
                if self.trace is not None and str(self.trace) != rest:
                    raise ConfigError(f"two trace files given: arrival '{a.strip()}' and trace '{self.trace}'")
                self.trace = rest
            if self.trace is None:
                raise ConfigError("trace arrivals need a file: arrival trace:PATH (or azure-conv)")
            self.arrival = "trace"
            return
        if kind not in SYNTHETIC_ARRIVALS:
            raise ConfigError(
                f"unknown arrival process '{a.strip()}' (known: poisson, gamma, deterministic, trace:PATH, azure-conv)"
            )
        for k, val in _inline_params(a, kind, rest).items():
            old = getattr(self, k)
            if old is not None and old != val:
                raise ConfigError(
                    f"{k} given twice with different values: {old:g} and {val:g} in arrival '{a.strip()}'"
                )
            setattr(self, k, val)
        self.arrival = kind

    def _check_complete(self):
        shared = bool(self.system_prompt) or any(c.system_prompt for c in self.classes or ())
        if self.arrival == "trace" and (shared or self.turns is not None):
            raise ConfigError("system_prompt and turns describe synthetic requests; a trace replays its own prompts")
        if self.turns is not None and self.think_time_s is None:
            raise ConfigError(
                "multi-turn conversations need think_time_s (--think-time): mean seconds from a turn to the next"
            )
        if self.think_time_s is not None and self.turns is None:
            raise ConfigError(
                "think_time_s (--think-time) applies to multi-turn conversations only (give turns, --turns)"
            )
        if self.arrival != "trace" and (self.trace_model is not None or self.trace_log_type is not None):
            raise ConfigError("trace_model and trace_log_type apply to trace replay only")
        if self.trace is not None and self.arrival != "trace":
            raise ConfigError(
                f"a trace file is given but arrival is '{self.arrival}' (use arrival trace, or drop trace)"
            )
        if self.arrival == "trace":
            resolve_path(self.trace)
            if self.cv is not None:
                raise ConfigError("cv applies to gamma arrivals only, not to trace replay")
            if self.trace_model is not None or self.trace_log_type is not None:
                fmt = trace_format(resolve_path(self.trace))
                if fmt != "burstgpt":
                    raise ConfigError(
                        f"trace_model and trace_log_type filter BurstGPT traces only; {self.trace} is {FORMATS[fmt]}"
                    )
            if self.rate is not None and self.time_scale != 1.0:
                raise ConfigError(
                    "give either rate (rescale the trace to this mean rate) or time_scale for trace replay, not both"
                )
            return
        make_arrival_process(self.arrival, self.rate if self.rate is not None else 1.0, self.cv)
        if self.rate is None:
            raise ConfigError(f"{self.arrival} arrivals need a rate (requests per second)")
        if self.rate * self.time_scale > MAX_RATE:
            raise ConfigError(
                f"rate {self.rate:g} req/s at time_scale {self.time_scale:g} offers {self.rate * self.time_scale:.3g} "
                f"req/s, over {MAX_RATE:g} (one a nanosecond, the simulator's clock tick)"
            )
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError(f"{self.arrival} arrivals need num_requests or duration_s to know when to stop")
        for role in ("prompt", "output"):
            if getattr(self, role) is None and (
                not self.classes or any(getattr(c, role) is None for c in self.classes)
            ):
                raise ConfigError(
                    f"{self.arrival} arrivals need {'an' if role == 'output' else 'a'} {role} length law "
                    f"(e.g. {role} lognormal:mean=1000,sigma=1 or sharegpt)"
                )

    # ------------------------------------------------------------------ dict form
    def to_dict(self) -> dict:
        """Plain-data form (strings and numbers), accepted back by `from_dict`; the files
        it names are absolute paths (a run's config.json, read from any folder)."""
        return {
            "arrival": self.arrival,
            "rate": self.rate,
            "cv": self.cv,
            "trace": None if self.trace is None else recorded_file(self.trace),
            "time_scale": self.time_scale,
            "prompt": None if self.prompt is None else self.prompt.recorded(),
            "output": None if self.output is None else self.output.recorded(),
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "seed": self.seed,
            "classes": None if self.classes is None else [c.to_dict() for c in self.classes],
            "trace_model": self.trace_model,
            "trace_log_type": self.trace_log_type,
            "system_prompt": self.system_prompt,
            "turns": None if self.turns is None else self.turns.recorded(),
            "think_time_s": self.think_time_s,
        }

    @classmethod
    def from_dict(cls, d) -> WorkloadSpec:
        """From a mapping (e.g. a YAML `workload:` section). Unknown keys are errors.
        `arrival` may also be a mapping such as {process: gamma, rate: 5, cv: 2}."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise ConfigError(f"workload must be a mapping of settings, got {type(d).__name__}")
        d = _spread_arrival(d)
        known = [f.name for f in fields(cls)]
        for k in d:
            if k not in known:
                raise ConfigError(f"unknown workload key '{k}' (known: {', '.join(known)})")
        return cls(**d)

    def checked(self) -> WorkloadSpec:
        """A re-validated copy (fields may have been changed after construction)."""
        return replace(
            self,
            classes=None
            if self.classes is None
            else [c if isinstance(c, WorkloadClass) else WorkloadClass.from_dict(c) for c in self.classes],
        )


def _arrival_kind(a) -> tuple[str, str]:
    """(kind, rest) of an arrival string: the kind lower-cased with its aliases resolved
    ('trace' also for a named trace such as azure-conv, which becomes rest), rest the
    text after the first ':', stripped."""
    if not isinstance(a, str) or not a.strip():
        raise ConfigError(
            f"arrival must be a string such as poisson, gamma, deterministic, trace:PATH or azure-conv; got {a!r}"
        )
    a = a.strip()
    kind, _, rest = a.partition(":")
    kind = kind.strip().lower()
    kind = _ARRIVAL_ALIASES.get(kind, kind)
    if is_dataset(a) and not rest:
        kind, rest = "trace", a.lower()
    return kind, rest.strip()


def _inline_params(text: str, kind: str, rest: str) -> dict:
    """The parameters written after a synthetic arrival's name: poisson:5, gamma:rate=5,cv=2."""
    if not rest:
        return {}
    keys = ("rate", "cv") if kind == "gamma" else ("rate",)
    out = {}
    for i, part in enumerate(p.strip() for p in rest.split(",")):
        k, eq, v = part.partition("=")
        k, v = (k.strip().lower(), v.strip()) if eq else ("rate" if i == 0 else "", k.strip())
        if k not in keys:
            raise ConfigError(f"cannot read '{part}' in arrival '{text.strip()}' (allowed: {', '.join(keys)})")
        val = _opt_float(v, f"{k} in arrival '{text.strip()}'", text=True)
        if out.get(k, val) != val:
            raise ConfigError(
                f"{k} given twice with different values: {out[k]:g} and {val:g} in arrival '{text.strip()}'"
            )
        out[k] = val
    return out


def _spread_arrival(d: dict) -> dict:
    """A copy of a workload mapping whose `arrival` mapping ({process: gamma, rate: 5,
    cv: 2} or {process: trace, path: F}) is spread into the workload's own keys."""
    d = dict(d)
    arr = d.get("arrival")
    if not isinstance(arr, dict):
        return d
    arr = {str(k).lower(): v for k, v in arr.items()}
    kind = arr.pop("process", None) or arr.pop("kind", None) or arr.pop("type", None)
    for k in list(arr):
        if k in ("path", "file"):
            arr["trace"] = arr.pop(k)
    for k, v in arr.items():
        if k not in ("rate", "cv", "trace", "time_scale"):
            raise ConfigError(f"unknown key '{k}' in workload arrival (known: process, rate, cv, trace, time_scale)")
        if d.get(k) is not None and d[k] != v:
            shown = [f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in (d[k], v)]
            raise ConfigError(f"workload {k} given twice with different values: {shown[0]} and {shown[1]} in arrival")
        d[k] = v
    d["arrival"] = kind
    return d


def replays_trace(workload: dict) -> bool:
    """Whether a workload mapping replays a trace, read as `WorkloadSpec` reads it: a
    `trace` key, or an arrival in any of its spellings (trace:F, replay:F, Trace:F, a
    named trace such as azure-conv, the mapping {process: trace, path: F})."""
    d = _spread_arrival(workload)
    if d.get("trace"):
        return True
    return d.get("arrival") is not None and _arrival_kind(d["arrival"])[0] == "trace"


def without_inline_rate(workload: dict) -> dict:
    """A copy of a workload mapping whose arrival names no rate of its own (poisson:5 ->
    poisson, gamma:rate=5,cv=2 -> gamma with cv 2, {process: gamma, rate: 5}), and no
    `rate`: for a caller that sets the rate itself (a sweep's point, a search's probe)."""
    d = _spread_arrival(workload)
    d.pop("rate", None)
    if d.get("arrival") is not None and not replays_trace(d):
        d = _named_params(d, drop=("rate",))
    return d


def one_spelling(workload: dict) -> dict:
    """A copy of a workload mapping with its arrival spelled one way, to compare two
    spellings: the arrival mapping spread, a synthetic arrival's inline parameters as keys
    (poisson:5 -> {arrival: poisson, rate: 5}), a replay as {arrival: trace, trace: F}
    whether written trace:F, azure-conv, {process: trace, path: F} or a `trace` key alone."""
    d = _spread_arrival(workload)
    a = d.get("arrival")
    if a is None:
        if d.get("trace") is not None:
            d["arrival"] = "trace"
        return d
    kind, rest = _arrival_kind(a)
    if kind == "trace":
        d["arrival"] = "trace"
        if rest and d.get("trace") is None:
            d["trace"] = rest
        return d
    return _named_params(d) if kind in SYNTHETIC_ARRIVALS else d


def _synthetic_kind(workload: dict) -> str | None:
    """The synthetic arrival process (poisson, gamma, deterministic) a spread workload
    mapping names, or None (none named, a trace replay, an unknown name)."""
    a = workload.get("arrival")
    if a is None or replays_trace(workload):
        return None
    kind = _arrival_kind(a)[0]
    return kind if kind in SYNTHETIC_ARRIVALS else None


def _named_params(workload: dict, drop: tuple[str, ...] = ()) -> dict:
    """A spread workload mapping with its arrival's inline parameters (gamma:rate=5,cv=2)
    moved to its own keys: {arrival: gamma, rate: 5, cv: 2}; those in `drop` left out."""
    a = workload["arrival"]
    kind, rest = _arrival_kind(a)
    d = {**workload, "arrival": kind}
    for k, v in _inline_params(a, kind, rest).items():
        if k in drop:
            continue
        if d.get(k) is not None and d[k] != v:
            raise ConfigError(f"{k} given twice with different values: {d[k]:g} and {v:g} in arrival '{a.strip()}'")
        d[k] = v
    return d


def override_workload(given: dict, over: dict) -> dict:
    """The workload options `given` with those of `over` (flags, keyword overrides) put in
    their place. An override of the arrival process, trace, rate, cv or time scale keeps
    the parameters the given arrival names (gamma:rate=5,cv=2, {process: gamma, rate: 5,
    cv: 2}, {process: trace, path: F, rate: 2}) that the override does not name itself, as
    it keeps the same options given as keys: one rule whatever their spelling. A new
    process replaces the given one with its trace file; a cv of a gamma arrival is dropped,
    not carried, when the override replaces gamma by another process (a cv applies to
    gamma only)."""
    over = {k: v for k, v in over.items() if v is not None}
    if not {"arrival", "trace", "rate", "cv", "time_scale"} & over.keys():
        return {**given, **over}
    base = _spread_arrival(given)
    new = _spread_arrival(over)
    base_kind = _synthetic_kind(base)
    new_kind = _synthetic_kind(new)
    # (the inline parameters of an arrival stand beside its keys, which an override replaces)
    if base_kind is not None:
        base = _named_params(base)
    if new_kind is not None:
        new = _named_params(new)
    if new.get("arrival") is not None and _replays_given(new["arrival"], base):
        del new["arrival"]  # `trace` alone, over a replay given with its file: that file replays
    if new.get("arrival") is not None:  # a new process: the given one's trace file goes with it
        base.pop("trace", None)
    elif new.get("trace") is not None:  # a trace file: it replays, whatever process was given
        base.pop("arrival", None)
    else:
        new_kind = base_kind
    if base_kind == "gamma" and new_kind != "gamma" and "cv" not in new:
        base.pop("cv", None)
    return {**base, **new}


def _replays_given(arrival, given: dict) -> bool:
    """Whether an override's `arrival` is `trace` with no file while the `given` workload
    names one (its `trace` key, or trace:F / a dataset as its arrival)."""
    if not isinstance(arrival, str) or _arrival_kind(arrival) != ("trace", ""):
        return False
    if given.get("trace") is not None:
        return True
    a = given.get("arrival")
    if not isinstance(a, str):
        return False
    kind, path = _arrival_kind(a)
    return kind == "trace" and path != ""


# the workload options a run (llmsched.simulate, a configuration) takes when not given, and
# those `llmsched.theory.workload_means` samples with (`with_defaults`)
DEFAULT_WORKLOAD = {
    "arrival": "poisson",
    "rate": 16.0,
    "prompt": "lognormal:mean=1024,sigma=1.0,max=8192",
    "output": "geometric:mean=256,max=2048",
    "num_requests": 5000,
    "seed": 0,
}


def with_defaults(workload: dict, defaults: dict) -> dict:
    """The workload options given (None: not given) completed by the `defaults` that apply
    to them: none to a trace replay (it has its own times and lengths), no request count
    to a workload given a duration (the duration stops its arrivals), no rate to an
    arrival that names its own (poisson:5, {process: gamma, rate: 5}): a default never
    stands against a value given."""
    given = {k: v for k, v in workload.items() if v is not None}
    if replays_trace(given):
        return given
    skip = {"num_requests"} if given.get("duration_s") is not None else set()
    d = _spread_arrival(given)
    a = d.get("arrival")
    if d.get("rate") is not None or (a is not None and "rate" in _inline_params(a, *_arrival_kind(a))):
        skip.add("rate")
    return {**{k: v for k, v in defaults.items() if k not in skip}, **given}


# ---------------------------------------------------------------------------- traces
_TRACE_CACHE: dict[tuple, Trace] = {}


def warn_short_trace(trace: str, have: int, num_requests: int | None, replayed: int) -> None:
    """Warn when `num_requests` asks `trace` (its name in the message) for more requests
    than the `have` it holds and the replay takes them all (`replayed`), fewer than asked
    (not when a duration cuts it shorter anyway)."""
    if num_requests is not None and num_requests > have and replayed == have:
        warn(f"{trace} has {have:,} requests: num_requests={num_requests:,} replays them all", stacklevel=4)


def load_trace(
    path: str | os.PathLike,
    block_size: int | None = DEFAULT_BLOCK_SIZE,
    model: str | None = None,
    log_type: str | None = None,
) -> Trace:
    """Read a trace file (any format of `trace.FORMATS`) or a named dataset; cached per
    file version and options. Each call returns a new Trace sharing the cached read-only
    arrays (reassigning its attributes leaves the cache as it is); `make_trace` returns
    fresh arrays."""
    p = resolve_path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size, block_size, model, log_type)
    t = _TRACE_CACHE.get(key)
    if t is None:
        t = read_trace(p, block_size, model=model, log_type=log_type)
        for a in (t.arrival_s, t.prompt, t.output, t.tag, t.block_ids, t.block_ptr):
            if a is not None:
                a.setflags(write=False)
        if len(_TRACE_CACHE) >= 4:
            _TRACE_CACHE.clear()
        _TRACE_CACHE[key] = t
    return copy.copy(t)


def _check_reblock(base: Trace, block_size: int) -> None:
    """ConfigError, as reading at `block_size` would give, where the trace's block ids
    cannot be cut to `block_size`-token cache blocks. Only where a prefix cache reads them:
    without one the block size is not used (and warned of as such: `api.warn_implausible`)."""
    if base.block_ids is not None and base.block_size != block_size:
        reblock_ratio(base.block_size, block_size)


def check_trace_blocks(spec: WorkloadSpec, block_size: int) -> None:
    """What `make_trace(spec, block_size)` refuses of a replayed trace's block ids, for a
    check that builds the requests without them (`blocks=False`)."""
    if spec.arrival == "trace":
        _check_reblock(load_trace(spec.trace, None, spec.trace_model, spec.trace_log_type), block_size)


def make_trace(spec: WorkloadSpec | dict, block_size: int = DEFAULT_BLOCK_SIZE, *, blocks: bool = True) -> Trace:
    """Build the requests a workload spec describes (deterministic for `spec.seed`), with
    prefix-cache block ids for `block_size`-token blocks where the workload has them (a
    trace's own ids, a shared system prompt, multi-turn conversations); `blocks=False`:
    without them (the same requests, when only their lengths are wanted)."""
    block_size = check_block_size(block_size)
    if isinstance(spec, dict):
        spec = WorkloadSpec.from_dict(spec)
    elif isinstance(spec, WorkloadSpec):
        spec = spec.checked()
    else:
        raise ConfigError(f"make_trace needs a WorkloadSpec or a mapping, got {type(spec).__name__}")

    base: Trace | None = None
    if spec.arrival == "trace":
        # read (and cached) with its block ids as the file has them: only the replayed
        # requests' ids are cut to the cache's blocks below, and only when they are wanted
        base = load_trace(spec.trace, None, spec.trace_model, spec.trace_log_type)
        if blocks:
            _check_reblock(base, block_size)
        # with a rate, the replayed part (not the whole trace) runs at that mean rate
        try:
            k, n = replay_cut(
                base.arrival_s,
                rate=spec.rate,
                time_scale=spec.time_scale,
                num_requests=spec.num_requests,
                duration_s=spec.duration_s,
            )
        except ConfigError as e:
            raise ConfigError(f"trace {spec.trace}: {e}") from None
        warn_short_trace(f"trace {spec.trace}", len(base.arrival_s), spec.num_requests, n)
        # (the hint names the option given: with a rate, time_scale is not one)
        hint = (
            f"--rate {spec.rate:g} sets the divisor: ask for a higher rate"
            if spec.rate is not None
            else "--time-scale K divides them"
        )
        arrival = replayed_times(base.arrival_s, k, n, f"trace {spec.trace}", hint)
    else:
        k = spec.time_scale
        arrival = _synthetic_arrivals(spec)
        n = len(arrival)
    if n == 0:
        what = f"duration_s={spec.duration_s}" if spec.duration_s is not None else "the trace"
        raise ConfigError(f"the workload is empty: no request arrives within {what}")
    if n > MAX_REQUESTS:
        raise ConfigError(f"the workload would hold {n:,} requests, over the limit of {MAX_REQUESTS:,}")

    cls = _classes(spec, n)
    if spec.classes and base is not None and base.tag is not None:
        cls = _traced_classes(spec, base.tag[:n], cls)
    if spec.turns is not None:
        return _conversations(spec, arrival, cls, k, block_size, blocks)
    prompt, output = _lengths(spec, cls, n, base)
    if spec.classes:
        tag = np.array([c.tag for c in spec.classes])[cls]
    else:
        tag = None if base is None or base.tag is None else base.tag[:n].copy()
    system = _system_prompts(spec)
    if system.any():
        prompt += system[cls]
        if int(prompt.max()) > MAX_LENGTH:
            raise ConfigError(
                f"a prompt with its system prompt has {int(prompt.max()):,} tokens, over {MAX_LENGTH:,}: "
                "use a shorter system prompt or prompt law"
            )
    out = Trace(np.array(arrival, dtype=np.float64), prompt, output, tag, block_size=block_size)
    if not blocks:
        return out
    if system.any():
        # each request a conversation of one turn
        ids, ptr = stream_blocks(np.arange(n), prompt, cls, system, spec.seed, block_size)
        out = out.with_blocks(ids, ptr, block_size)
    elif base is not None and base.block_ids is not None:
        # the trace's ids, cut to the full blocks of both the (possibly redrawn) prompts
        # and the trace's own: a partial last source block's id stands for its tokens
        # only, so a longer prompt must not make it a full block (at any block size)
        head = base.slice(0, n)
        cap = np.minimum(prompt, head.prompt)
        ids, ptr = reblock(head.block_ids, head.block_ptr, cap, base.block_size, block_size)
        out = out.with_blocks(ids, ptr, block_size)
    return out


def _synthetic_arrivals(spec: WorkloadSpec) -> np.ndarray:
    """The times of a synthetic arrival process: requests, or with turns conversations."""
    proc = make_arrival_process(spec.arrival, check_rate(spec.rate), None if spec.cv is None else check_cv(spec.cv))
    k = spec.time_scale
    arrival = proc.times(
        _rng(spec.seed, _ARRIVALS),
        spec.num_requests,
        spec.duration_s,
        time_scale=k,  # the clock's limit and duration_s apply to the times divided by k
    )
    return arrival / k if k != 1.0 else arrival


def arrivals_held(spec: WorkloadSpec, trace: Trace) -> int:
    """How many arrivals of a synthetic workload's process `trace` (`make_trace(spec)`)
    holds: its requests, or with turns its conversations (those whose first turn, the
    conversation's earliest, comes by its last request)."""
    if spec.turns is None or not len(trace):
        return len(trace)
    return int(np.searchsorted(_synthetic_arrivals(spec), trace.arrival_s[-1], side="right"))


def _traced_classes(spec: WorkloadSpec, tags: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """The class of each replayed request of a tagged trace: the class its tag names, the
    `drawn` one (by share) for a request without a tag; a tag that no class names is
    refused (a redrawn tag would move a request to another class's statistics)."""
    names = np.array([c.tag for c in spec.classes])
    order = np.argsort(names)
    tagged = tags != ""
    pos = np.searchsorted(names[order], tags[tagged])
    pos = np.minimum(pos, len(names) - 1)
    found = names[order][pos] == tags[tagged]
    if not found.all():
        row = int(np.flatnonzero(tagged)[np.argmin(found)])
        raise ConfigError(
            f"trace {spec.trace}: request {row + 1} (in arrival order) has tag {str(tags[row])!r}, "
            f"which no class names (classes: {', '.join(names)}): "
            "give it a class, or drop classes to keep the trace's tags"
        )
    cls = drawn.copy()
    cls[tagged] = order[pos]
    return cls


def class_shares(classes) -> list[float]:
    """The classes' shares, each divided by the largest where their sum overflows: shares
    near the float limit (1e308 twice) gave numpy's choice p = 0 (a traceback) and a
    cluster's classes rate 0; as fractions of the largest they make the same mix."""
    shares = [c.share for c in classes]
    if not math.isfinite(sum(shares)):
        top = max(shares)
        shares = [s / top for s in shares]
    return shares


def _classes(spec: WorkloadSpec, n: int) -> np.ndarray:
    """Each request's (or conversation's) class index, drawn by share."""
    if not spec.classes:
        return np.zeros(n, dtype=np.int64)
    shares = np.array(class_shares(spec.classes), dtype=np.float64)
    return _rng(spec.seed, _CLASSES).choice(len(shares), size=n, p=shares / shares.sum())


def _system_prompts(spec: WorkloadSpec) -> np.ndarray:
    """System-prompt tokens per class (a class's own, else the workload's, else 0)."""
    default = spec.system_prompt or 0
    classes = spec.classes or [None]
    return np.array(
        [default if c is None or c.system_prompt is None else c.system_prompt for c in classes], dtype=np.int64
    )


def _lengths(spec: WorkloadSpec, cls: np.ndarray, n: int, base: Trace | None) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of n requests of classes `cls`, one random stream per
    class and role (a trace supplies whatever no law overrides)."""
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    if spec.classes:
        groups = [
            (
                j,
                np.flatnonzero(cls == j),
                spec.prompt if c.prompt is None else c.prompt,
                spec.output if c.output is None else c.output,
            )
            for j, c in enumerate(spec.classes)
        ]
    else:
        groups = [(0, slice(0, n), spec.prompt, spec.output)]
    for j, idx, plaw, olaw in groups:
        m = len(range(n)[idx]) if isinstance(idx, slice) else len(idx)
        if m == 0:
            continue
        rp, ro = _rng(spec.seed, _PROMPT, j), _rng(spec.seed, _OUTPUT, j)
        if plaw is not None and olaw is not None:
            prompt[idx], output[idx] = sample_pair(plaw, olaw, rp, ro, m)
            continue
        # checked by WorkloadSpec: a missing law only happens with a trace
        prompt[idx] = plaw.sample(rp, m) if plaw is not None else base.prompt[:n][idx]
        output[idx] = olaw.sample(ro, m) if olaw is not None else base.output[:n][idx]
    return prompt, output


def _conversations(
    spec: WorkloadSpec, starts: np.ndarray, conv_cls: np.ndarray, k: float, block_size: int, blocks: bool = True
) -> Trace:
    """Multi-turn conversations starting at `starts` (one per arrival of the process).

    Turn counts follow `spec.turns`; turn t + 1 arrives an exponential think time (mean
    `think_time_s`, divided by time_scale like every time) after turn t *arrives*: an
    open-loop trace cannot know when turn t finishes. Each turn draws its new text from
    the prompt law and its output from the output law; its prompt is the class's system
    prompt, all earlier turns' new text and outputs, then its new text. Requests are in
    arrival order; num_requests keeps the first ones, duration_s those arriving by then
    (the first turns of num_requests conversations always cover the first num_requests
    arrivals, since a later conversation starts after all of them)."""
    m = len(starts)
    turns = spec.turns.sample(_rng(spec.seed, _TURNS), m)
    total = int(turns.sum())
    if total > 4 * MAX_REQUESTS:
        raise ConfigError(f"the conversations would hold {total:,} requests, over the limit of {MAX_REQUESTS:,}")
    think = _rng(spec.seed, _THINK).exponential(spec.think_time_s, total - m)
    conv, _, offset = conversation_turns(turns, think)
    arrival = starts[conv] + offset / k
    cls = conv_cls[conv]
    new_text, output = _lengths(spec, cls, total, None)
    # prompt of turn t = system + text and outputs of turns < t + its own text
    done = np.cumsum(new_text + output)
    first = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(turns, out=first[1:])
    before = np.concatenate(([0], done))[first[:-1]][conv]  # what earlier conversations added
    system = _system_prompts(spec)
    prompt = system[cls] + done - before - output
    if int(prompt.max()) > MAX_LENGTH:
        raise ConfigError(
            f"a conversation's prompt grows to {int(prompt.max()):,} tokens, over {MAX_LENGTH:,}: "
            "use fewer turns or shorter lengths"
        )
    order = np.argsort(arrival, kind="stable")
    keep = order.shape[0]
    if spec.num_requests is not None:
        keep = min(keep, spec.num_requests)
    order = order[:keep]
    if spec.duration_s is not None:
        order = order[arrival[order] <= spec.duration_s]
    if order.shape[0] > MAX_REQUESTS:
        raise ConfigError(f"the workload would hold {order.shape[0]:,} requests, over the limit of {MAX_REQUESTS:,}")
    tag = np.array([c.tag for c in spec.classes])[cls[order]] if spec.classes else None
    if not blocks:
        return Trace(arrival[order], prompt[order], output[order], tag, block_size=block_size)
    ids, ptr = stream_blocks(conv[order], prompt[order], conv_cls, system, spec.seed, block_size)
    return Trace(arrival[order], prompt[order], output[order], tag, ids, ptr, block_size)
