"""Mean prompt and output lengths of a workload, by sampling it through `llmsched.workload`.

The capacity numbers need `m_p` and `m_o` (docs/stability.md "Work and capacity"). For
synthetic length laws the samples are drawn with the workload's own generator (so
clipping, rounding and the joint sampling of two columns of one file all count); a trace
is read whole.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from ..core.errors import ConfigError
from ..workload import WorkloadSpec, make_trace, replays_trace

__all__ = ["workload_means", "DEFAULT_SAMPLES"]

DEFAULT_SAMPLES = 200_000


def workload_means(workload: dict, samples: int = DEFAULT_SAMPLES) -> tuple[float, float]:
    """(mean prompt, mean output) tokens of a workload mapping (the `workload` section of a
    configuration: prompt/output laws, a trace, classes...). Synthetic laws are sampled
    `samples` times with the workload's seed; a trace uses its requests."""
    if not isinstance(workload, dict):
        raise ConfigError("a workload must be a mapping (arrival, rate, prompt, output, ...)")
    if not isinstance(samples, int) or samples < 1:
        raise ConfigError(f"samples must be a whole number >= 1, got {samples!r}")
    key = json.dumps(workload, sort_keys=True, default=str)
    return _means(key, samples)


@lru_cache(maxsize=256)
def _means(key: str, samples: int) -> tuple[float, float]:
    d = json.loads(key)
    d = {k: v for k, v in d.items() if v is not None}
    if not replays_trace(d):
        d.pop("duration_s", None)
        d["num_requests"] = samples
        d["rate"] = d.get("rate") or 1.0
        d["arrival"] = "deterministic"  # arrivals do not matter here; cheapest to draw
        d.pop("cv", None)
    spec = WorkloadSpec.from_dict(d)
    tr = make_trace(spec)
    return float(np.mean(tr.prompt)), float(np.mean(tr.output))
