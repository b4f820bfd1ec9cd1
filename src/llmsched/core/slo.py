"""SLO names, one vocabulary for `simulate` and `sweep`; they hold two kinds of limit.

- **Per-request objectives** (`simulate --slo`, `simulate(slo=...)`, a configuration's
  `slo:`): a request meets them when its own TTFT, TPOT and end-to-end latency are within
  the limits; goodput counts the requests that meet every one. Names: `ttft_ms`,
  `tpot_ms`, `itl_ms`, `e2el_ms`. A request's ITL is its mean inter-token gap,
  (e2e - TTFT) / (output - 1), which is its TPOT: `itl_ms` is the same limit as
  `tpot_ms`, and it is also the ITL target of TWP and DynamicBatch unless their own
  `itl_target_ms` is given (`itl_limit_ms`: with both names, the smaller limit, the one
  a request must meet). Aliases: `ttft`, `tpot`, `itl`, `e2el`, and `itl_p99_ms`, an
  older name of `itl_ms` (the mean gap, not a p99).
- **Run statistics** (`sweep --search max-stable-rate --slo`, `max_stable_rate(slo=...)`):
  a run passes when a statistic over all its requests is within the limit:
  `STAT_METRIC_ms` (STAT `mean`, `median`, `std`, `p90`, `p95`, `p99`, `max`; METRIC
  `ttft`, `tpot`, `itl`, `e2el`, `queue`) or `itl_cv`, the keys of a run's summary. Here
  ITL is every inter-token gap of every request (`p99_itl_ms`: the p99 over all gaps),
  and TPOT one value per request.

Neither kind is an alias of the other: `p99_itl_ms` (the run's p99 gap) and `itl_ms` (each
request's mean gap) are different statistics, so each command refuses the other's names
with a line that says which name it means.
"""

from __future__ import annotations

import math
import re

from .checks import as_real
from .errors import ConfigError, closest

__all__ = [
    "REQUEST_SLO_KEYS",
    "REQUEST_SLO_ALIASES",
    "RUN_SLO_METRIC",
    "check_request_slo",
    "check_run_slo_name",
    "itl_limit_ms",
]

#: Per-request objectives (milliseconds): simulate's goodput.
REQUEST_SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
#: Other spellings of the per-request objectives.
REQUEST_SLO_ALIASES = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2el_ms", "itl_p99_ms": "itl_ms"}
_STATS = ("mean", "median", "std", "p90", "p95", "p99", "max")
_METRICS = ("ttft", "tpot", "itl", "e2el", "queue")
_STAT_ALTERNATIVES = "|".join(_STATS)
_METRIC_ALTERNATIVES = "|".join(_METRICS)
#: Statistics of a run a sweep's search may limit (milliseconds, or the ITL's coefficient
#: of variation).
RUN_SLO_METRIC = re.compile(rf"^({_STAT_ALTERNATIVES})_({_METRIC_ALTERNATIVES})_ms$|^itl_cv$")

_RUN_NAMES = [f"{s}_{m}_ms" for s in _STATS for m in _METRICS] + ["itl_cv"]
_RUN_FORM = f"STAT_METRIC_ms with STAT {_STAT_ALTERNATIVES} and METRIC {_METRIC_ALTERNATIVES}, or itl_cv"
_SWAPPED = re.compile(rf"^({_METRIC_ALTERNATIVES})_({_STAT_ALTERNATIVES})_ms$")
# what a per-request objective limits, for the messages
_REQUEST_WORDS = {
    "ttft_ms": "each request's TTFT",
    "tpot_ms": "each request's TPOT",
    "itl_ms": "each request's mean inter-token gap, its TPOT",
    "e2el_ms": "each request's end-to-end latency",
}
_RUN_OF = {
    "ttft": "the requests' TTFTs",
    "tpot": "the requests' TPOTs",
    "itl": "every inter-token gap",
    "e2el": "the requests' end-to-end latencies",
    "queue": "the requests' queueing times",
}


def _run_name(name: str) -> str | None:
    """The run statistic `name` spells (`p99_ttft_ms`, or `ttft_p99_ms` in the other
    order), or None."""
    if RUN_SLO_METRIC.match(name):
        return name
    m = _SWAPPED.match(name)
    return f"{m.group(2)}_{m.group(1)}_ms" if m else None


def _run_words(name: str) -> str:
    """A run statistic in words: 'a run's p99 over every inter-token gap'."""
    if name == "itl_cv":
        return "a run's coefficient of variation of every inter-token gap"
    stat, metric = name[: -len("_ms")].split("_", 1)
    return f"a run's {stat} over {_RUN_OF[metric]}"


def check_request_slo(slo) -> dict:
    """Per-request objectives `{name: ms}` in canonical names (`REQUEST_SLO_KEYS`); a
    ConfigError in one line for anything else, pointing a run statistic (a sweep's SLO
    name) to the per-request objective of the same quantity."""
    if slo is None:
        return {}
    if not isinstance(slo, dict):
        raise ConfigError("slo must be a mapping like {ttft_ms: 2000, itl_ms: 50}")
    out = {}
    spelled: dict[str, str] = {}
    for k, v in slo.items():
        name = str(k)
        key = REQUEST_SLO_ALIASES.get(name, name)
        if key not in REQUEST_SLO_KEYS:
            raise _not_a_request_slo(name)
        if key in spelled:  # two spellings of one objective: which one was meant?
            raise ConfigError(f"SLO {name} and {spelled[key]} are the same objective ({key}); give it once")
        spelled[key] = name
        ms = as_real(v)
        if ms is None or not math.isfinite(ms) or ms <= 0:
            raise ConfigError(f"SLO {name} must be a positive number of milliseconds, got {v!r}")
        out[key] = float(ms)
    return out


def itl_limit_ms(slo: dict) -> float | None:
    """The limit per-request objectives (`check_request_slo`'s) put on a request's mean
    inter-token gap, or None: `itl_ms` and `tpot_ms` are the same limit, so with both the
    smaller one, which a request must meet to meet both."""
    limits = [slo[k] for k in ("itl_ms", "tpot_ms") if k in slo]
    return min(limits) if limits else None


def _not_a_request_slo(name: str) -> ConfigError:
    short = [k for k in REQUEST_SLO_ALIASES if f"{k}_ms" == REQUEST_SLO_ALIASES[k]]
    known = f"{', '.join(REQUEST_SLO_KEYS)}, or without _ms: {', '.join(short)}"
    run = _run_name(name)
    if run is not None:
        metric = "itl" if run == "itl_cv" else run[: -len("_ms")].split("_", 1)[1]
        same = f"{metric}_ms"
        instead = f": {same} limits {_REQUEST_WORDS[same]}" if same in _REQUEST_WORDS and run != "itl_cv" else ""
        return ConfigError(
            f"SLO {name!r} is {_run_words(run)}, a limit for `llmsched sweep --search`; "
            f"a simulation's SLOs are per request (goodput){instead}. Per-request SLOs: {known}"
        )
    close = closest(name, [*REQUEST_SLO_KEYS, *REQUEST_SLO_ALIASES])
    hint = f"; did you mean {close!r}?" if close else ""
    return ConfigError(f"unknown per-request SLO {name!r}{hint} (per-request SLOs: {known})")


def check_run_slo_name(name: str) -> None:
    """A ConfigError in one line unless `name` is a run statistic (`RUN_SLO_METRIC`); a
    per-request objective (a simulation's SLO name) is pointed to the statistics to use."""
    if RUN_SLO_METRIC.match(name):
        return
    key = REQUEST_SLO_ALIASES.get(name, name)
    if key in REQUEST_SLO_KEYS:
        metric = key[: -len("_ms")]
        if metric == "itl":
            which = (
                "p99_itl_ms (the p99 over every inter-token gap), or p99_tpot_ms / max_tpot_ms "
                "over the requests' mean gaps"
            )
        else:
            which = f"e.g. p99_{metric}_ms, or max_{metric}_ms (every request within the limit)"
        meant = _REQUEST_WORDS[key] + (", not a p99" if name == "itl_p99_ms" else "")
        raise ConfigError(
            f"unknown SLO metric {name!r}: that is simulate's per-request objective ({meant}); "
            f"a rate search limits a statistic of each run: {which}"
        )
    run = _run_name(name)
    if run is None:
        run = closest(name, _RUN_NAMES)
    hint = f"; did you mean {run!r}?" if run else ""
    raise ConfigError(f"unknown SLO metric {name!r}{hint} (a run statistic: {_RUN_FORM}; e.g. p99_itl_ms)")
