"""Grid specs of a sweep: parse `KEY=VALUES` options into a grid, expand it into points,
and parse SLO limits.

- A grid maps option names to lists of values (`parse_grid(["policy=sarathi,orca",
  "rate=1:20:20", "seed=0,1"])`); its points are the cartesian product (`expand_grid`).
  Any option of `simulate` can be a key (configuration fields such as `policy`, `b_max`,
  `k_max`, `cost_model`, `max_time_s`, and workload fields such as `rate`, `prompt`,
  `output`, `num_requests`, `seed`, `arrival`), plus `load`: the rate as a fraction of
  the theoretical critical rate lambda* of the point's configuration.
- SLOs: `parse_slo(["p99_itl_ms=100"])`, upper limits on statistics of a run (its
  summary's keys; not simulate's per-request objectives, `llmsched.core.slo`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import fields

from ..api import SimConfig
from ..core.checks import as_real
from ..core.cost import make_cost_model, recorded_cost_model
from ..core.errors import ConfigError
from ..core.names import OPTION_ALIASES
from ..core.profile import DEFAULT_PROFILE
from ..core.slo import RUN_SLO_METRIC, check_request_slo, check_run_slo_name
from ..policies import canonical_policy_name
from ..workload import WorkloadSpec
from ..workload.lengths import parse_length_law

__all__ = [
    "parse_grid",
    "parse_values",
    "expand_grid",
    "parse_slo",
    "grid_keys",
    "option_keys",
    "integer_keys",
    "NON_GROUP_KEYS",
    "SLO_METRIC",
]

#: Grid keys that vary within a group of points (a policy, a b_max, ...): a search runs
#: every seed at each rate of a group, and figures draw one line per group.
NON_GROUP_KEYS = ("rate", "load", "seed")
#: Metrics an SLO may limit (milliseconds, or the ITL's coefficient of variation): a
#: statistic of each run (`llmsched.core.slo`; simulate's SLOs are per request).
SLO_METRIC = RUN_SLO_METRIC


def option_keys() -> set[str]:
    """Options of `simulate` a point can set: configuration and workload fields."""
    return ({f.name for f in fields(SimConfig)} | {f.name for f in fields(WorkloadSpec)}) - {"workload"}


def integer_keys() -> set[str]:
    """Options whose values are whole numbers (`int` or `int | None` fields: b_max,
    block_size, seed, ...): a range of them gives integers."""
    out = set()
    for cls in (SimConfig, WorkloadSpec):
        for f in fields(cls):
            kinds = {t.strip() for t in str(f.type).split("|")} - {"None"}
            if kinds == {"int"}:
                out.add(f.name)
    return out


def grid_keys() -> list[str]:
    """Names a grid (or a fixed value) may set."""
    return sorted(option_keys() | {"load"})


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
    # numbers JSON does not read (00, 0512, +2, 1., 1_000): the same values, not strings
    for pattern, number in ((_INTEGER, int), (_DECIMAL, float)):
        if pattern.fullmatch(t):
            try:
                return number(t)
            except ValueError:  # (underscores out of place: 1__0)
                break
    return t


_INTEGER = re.compile(r"[+-]?[0-9][0-9_]*")
_DECIMAL = re.compile(r"[+-]?([0-9][0-9_]*\.?[0-9_]*|\.[0-9][0-9_]*)([eE][+-]?[0-9][0-9_]*)?")


def _whole(key: str, v):
    """A whole float as an int for an integer key (seed=1.0 is seed 1). Past 2**53 only a
    seed (any integer is one): another key's value stays a float, so that its own check
    refuses it as 1e+308, not as an integer of 309 digits."""
    if type(v) is float and v.is_integer() and (key == "seed" or abs(v) < 1 << 53):
        return int(v)
    return v


def parse_values(key: str, text: str) -> list:
    """The values of one grid key: `a,b,c` (a list; use `|` instead of `,` when a value
    itself holds commas, e.g. cost models `paper:c=11,a=35|paper`; a length law alone,
    `prompt=uniform:10,100`, is one value when its parts are no laws), or `LO:HI:N`, N
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
        if key in integer_keys():
            if any(v != int(v) for v in vals):
                raise ConfigError(f"grid {key}: range {text!r} gives non-integer values")
            vals = [_whole(key, v) for v in vals]
        return vals
    if re.fullmatch(r"\s*[-+0-9.eE]+(\s*:\s*[-+0-9.eE]+){3,}\s*", text):
        raise ConfigError(f"grid {key}: cannot read range {text!r}: a range has three parts, LO:HI:N")
    if re.fullmatch(r"\s*([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)\s*", text):
        raise ConfigError(
            f"grid {key}: {text!r} is a range without its number of points: write LO:HI:N, "
            f"e.g. {text}:8 for 8 evenly spaced values"
        )
    # a mapping (slo, policy_options, ...) in YAML's flow form, `{ttft_ms: 100}`: its commas
    # are its own, so several are separated by `|`
    sep = "|" if "|" in text or text.startswith("{") else ","
    parts = [p.strip() for p in text.split(sep)]
    if any(p == "" for p in parts):
        raise ConfigError(f"grid {key}: empty value in {text!r}")
    if sep == "," and key in SPEC_KEYS:
        parts = _rejoin_spec_options(parts)
    vals = [_mapping(key, p) if p.startswith("{") else _scalar(p) for p in parts]
    if sep == "," and len(vals) > 1 and key in LENGTH_LAW_KEYS:
        return _laws_split_at_commas(key, text, vals)
    return vals


def _rejoin_spec_options(parts: list[str]) -> list[str]:
    """Values split at commas, with each `KEY=VALUE` piece joined back to the spec before
    it: no cost model or arrival spec starts with one, so `paper:c=1,a=2,const:5` is
    `paper:c=1,a=2` and `const:5` (it ran `a=2` as a point, an unknown cost model)."""
    out: list[str] = []
    for p in parts:
        if out and ":" in out[-1] and re.match(r"[A-Za-z_]\w*\s*=", p):
            out[-1] += "," + p
        else:
            out.append(p)
    return out


def _laws_split_at_commas(key: str, text: str, vals: list) -> list:
    """Length laws split at commas: as they are when each is a law; else the whole text as
    one law when it is one (`prompt=uniform:10,100`, which split was `uniform:10`, missing
    its hi, and `100`), else the error of the first that is none, saying how values holding
    commas are written."""
    bad = _LAW_ERRORS
    for i, v in enumerate(vals):
        if isinstance(v, str):
            try:
                parse_length_law(v)
            except bad as e:
                err, first = e, i
                break
    else:
        return vals
    try:
        parse_length_law(text)
    except bad:
        pass
    else:
        return [text]
    # the hint only where the split cut a law short (it rejoins with the values after it),
    # not for a value wrong in itself (an unknown dataset, a negative mean)
    parts = [p.strip() for p in text.split(",")]
    for j in range(first + 2, len(parts) + 1):
        try:
            parse_length_law(",".join(parts[first:j]))
        except bad:
            continue
        raise ConfigError(
            f"grid {key}: {err} (values holding commas are separated by |: {key}=uniform:16,2048|geometric:200)"
        )
    raise ConfigError(f"grid {key}: {err}")


def _mapping(key: str, text: str) -> dict:
    import yaml  # noqa: PLC0415 - only for a mapping's value

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"grid {key}: cannot read {text!r} as a mapping such as {{ttft_ms: 2000, itl_ms: 50}}")
    return value


def parse_grid(items: Iterable[str] | dict | None) -> dict[str, list]:
    """`["policy=sarathi,orca", "rate=1:20:20"]` (or a mapping of key -> list) into an
    ordered {key: [values]}. ConfigError on a bad spec, an unknown or repeated key."""
    if items is None:
        return {}
    if isinstance(items, str):  # one KEY=VALUES spec
        items = [items]
    if not isinstance(items, (dict, Iterable)) or isinstance(items, bytes):
        raise ConfigError(f"grid must be a mapping of key -> values or a list of KEY=VALUES specs, got {items!r:.60}")
    known = set(grid_keys())
    out: dict[str, list] = {}
    pairs = []
    if isinstance(items, dict):
        for k, v in items.items():
            if isinstance(v, (str, bytes, dict)) or not isinstance(v, Iterable):
                vals = parse_values(str(k), str(v))
            else:  # a list, tuple, range or numpy array of values; numpy numbers as Python's,
                # and strings read as the command line's grid reads them ('3' is the number 3)
                vals = [_scalar(x) if isinstance(x, str) else x if as_real(x) is None else as_real(x) for x in v]
            pairs.append((str(k), _grid_key(str(k)), vals))
    else:
        for item in items:
            if not isinstance(item, str) or "=" not in item:
                raise ConfigError(
                    f"grid spec must be KEY=VALUES (e.g. rate=1:20:20 or policy=sarathi,orca), got {item!r}"
                )
            given, v = item.split("=", 1)
            given = given.strip()
            k = _grid_key(given)
            if not k:
                raise ConfigError(f"grid spec {item!r} has no key")
            pairs.append((given, k, None if k not in known else parse_values(k, v)))
    spelled: dict[str, str] = {}  # each key as the user wrote it, for the message of a repeat
    for given, k, vals in pairs:
        if k not in known:
            raise ConfigError(f"unknown grid key {k!r} (known: {', '.join(sorted(known))})")
        if k in out:
            both = "" if spelled[k] == given else f" (as {spelled[k]!r} and {given!r})"
            raise ConfigError(f"grid key {k!r} given twice{both}")
        spelled[k] = given
        if not vals:
            raise ConfigError(f"grid {k}: no values")
        if k in integer_keys():  # seed=1.0 is seed 1: one point, one key (a resume finds it)
            vals = [_whole(k, v) for v in vals]
        _check_distinct(k, vals)
        if k == "load" and any(not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 for v in vals):
            raise ConfigError("grid load: values must be positive numbers (fractions of the critical rate)")
        out[k] = vals
    if "rate" in out and "load" in out:
        raise ConfigError("grid: give either rate or load (a fraction of the critical rate), not both")
    return out


def _grid_key(given: str) -> str:
    """The grid key a spelling names: dashes as underscores, a flag's alias as its key
    (`max-num-batched-tokens` is `b_max`)."""
    k = given.replace("-", "_")
    return OPTION_ALIASES.get(k, k)


def _check_distinct(key: str, vals: list) -> None:
    """A value given twice in one key would run (and write) the same points twice (a
    policy's name in any case or by an alias is the same policy; a cost model with its
    defaults written out is the model without them; a length law however it is spelt,
    `geometric:200` or `geometric:mean=200`, is the law; no system prompt is 0 tokens)."""
    seen: dict = {}
    for v in vals:
        same = v
        if key in _POLICY_KINDS and isinstance(v, str):
            same = canonical_policy_name(v, _POLICY_KINDS[key])
        elif key == "cost_model" and isinstance(v, str):
            same = _cost_model_identity(v)
        elif key in LENGTH_LAW_KEYS and not isinstance(v, bool):
            same = _length_law_identity(v)
        elif key == "system_prompt" and v is None:
            same = 0  # (the workload draws None as 0 tokens)
        elif isinstance(v, dict):  # a mapping in any key order, 1 and 1.0 alike; an SLO's names as run
            try:
                items = check_request_slo(v) if key == "slo" else v
            except ConfigError:
                items = v  # (refused with its reason when the point is checked)
            items = {k: float(x) if as_real(x) is not None else x for k, x in items.items()}
            same = repr(sorted(items.items(), key=lambda kv: str(kv[0])))
        try:
            mark = (type(v) is bool, same)
            hash(mark)
        except TypeError:  # a list or mapping value
            mark = (False, repr(v))
        if mark in seen:
            first = seen[mark]
            what = "model" if key == "cost_model" else "law" if key in LENGTH_LAW_KEYS else "value"
            again = f"the same {what} as {first!r}" if first != v else "given twice"
            raise ConfigError(f"grid {key}: the value {v!r} is {again}")
        seen[mark] = v


_POLICY_KINDS = {"policy": "batch", "admission": "admission"}
#: Keys whose values are length laws (`llmsched.workload.lengths`).
LENGTH_LAW_KEYS = ("prompt", "output", "turns")
#: Keys whose values are specs with comma-separated options (`paper:c=1,a=2`, `gamma:rate=5,cv=2`)
SPEC_KEYS = ("cost_model", "arrival")
#: What `parse_length_law` raises for a value that is no law (a file it cannot read included)
_LAW_ERRORS = (ConfigError, OSError, ValueError, TypeError)


def _length_law_identity(spec):
    """The length law a value parses to (laws compare by their parameters; a file's law by
    its spec as given: `t.csv` and `./t.csv` are not found equal); the value itself where it
    is no law, left to the point's checks."""
    try:
        return parse_length_law(spec)
    except _LAW_ERRORS:
        return spec


def _cost_model_identity(spec: str) -> str:
    """What a cost model spec resolves to: a paper, linear or const model's parameters
    (cheap to build); a profile's spec with its path absolute (its tables are not read
    here). A spec that does not build is left to the point's checks."""
    kind, _, rest = spec.partition(":")
    if kind.strip().lower() == "profile":  # `profile` is the default profile's name
        return recorded_cost_model(f"profile:{rest.strip() or DEFAULT_PROFILE}")
    try:
        return json.dumps(make_cost_model(spec).describe(), sort_keys=True)
    except ConfigError:
        return spec


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """The cartesian product of a grid, in order (the last key varies fastest)."""
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def parse_slo(items: Iterable[str] | dict | None) -> dict[str, float]:
    """`["p99_itl_ms=100", "median_ttft_ms=2000"]` into {metric: upper limit}; dashes in a
    metric become underscores (`p99-itl-ms`), as in simulate's --slo."""
    if not items:
        return {}
    if isinstance(items, str):  # one METRIC=LIMIT
        items = [items]
    if not isinstance(items, (dict, Iterable)) or isinstance(items, bytes):
        raise ConfigError(f"SLO must be a mapping of metric -> limit or a list of METRIC=LIMIT, got {items!r:.60}")
    pairs = items.items() if isinstance(items, dict) else []
    if not isinstance(items, dict):
        pairs = []
        for item in items:
            if not isinstance(item, str) or "=" not in item:
                raise ConfigError(f"SLO must be METRIC=LIMIT (e.g. p99_itl_ms=100), got {item!r}")
            k, v = item.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out = {}
    for k, v in pairs:
        k = str(k).replace("-", "_")
        check_run_slo_name(k)
        if k in out:
            raise ConfigError(f"SLO {k} is given twice")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO {k}: limit must be a number, got {v!r}") from None
        if not (math.isfinite(f) and f > 0):
            raise ConfigError(f"SLO {k}: limit must be a positive number, got {v!r}")
        out[k] = f
    return out
