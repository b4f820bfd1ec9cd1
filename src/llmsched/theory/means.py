"""Mean prompt and output lengths of a workload, by sampling it through `llmsched.workload`.

The capacity numbers need `m_p` and `m_o` (docs/stability.md "Work and capacity"), and a
context-dependent cost model the lengths' mix (`workload_mix`, a `LengthMix` of the same
sample: docs/stability.md "Contexts of a full step"). For
synthetic length laws the samples are drawn with the workload's own generator (so
clipping, rounding and the joint sampling of two columns of one file all count); a trace
is read whole.

Two more numbers relate a workload's options to theorem 2's, which counts requests:
`requests_per_rate` (requests offered per unit of the workload's `rate`: the mean turns
of a conversation, times `time_scale` for synthetic arrivals) and
`ideal_cached_prompt` (the prompt tokens per request an unbounded prefix cache serves).
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from ..core.checks import as_int
from ..core.constraints import k_max_binds
from ..core.errors import ConfigError
from ..core.length_mix import LengthMix
from ..workload import WorkloadSpec, make_trace, replays_trace
from ..workload.datasets import file_stamps
from ..workload.spec import DEFAULT_WORKLOAD, with_defaults

__all__ = [
    "workload_means",
    "workload_mix",
    "largest_prompt",
    "sample_key",
    "rate_unit",
    "requests_per_rate",
    "ideal_cached_prompt",
    "ideal_cached_tokens",
    "ideal_cached_counts",
    "cached_workload_mix",
    "DEFAULT_SAMPLES",
]

DEFAULT_SAMPLES = 200_000
#: requests replayed through an unbounded cache by `ideal_cached_prompt` (a Python loop)
CACHE_SAMPLES = 20_000


def workload_means(workload: dict, samples: int = DEFAULT_SAMPLES) -> tuple[float, float]:
    """(mean prompt, mean output) tokens of a workload mapping (the `workload` section of a
    configuration: prompt/output laws, a trace, classes...; options not given take a run's
    defaults, `DEFAULT_WORKLOAD`). Synthetic laws are sampled `samples` times with the
    workload's seed; a trace uses its requests."""
    mix = _mix(*_sample_key(workload, samples), 0.0)
    return mix.mean_prompt, mix.mean_output


def largest_prompt(workload: dict) -> int | None:
    """The longest prompt a workload mapping can offer, in tokens: its prompt laws'
    largest draws (`LengthLaw.largest`) plus their system prompts; a conversation's last
    turn holds all earlier turns' text and outputs too; prompts a replayed trace supplies,
    its longest. None when a law has no bound of its own (a geometric or lognormal law
    without max=). The region caps a request's prefill per step at it
    (`max_prefill_per_request`: a request never holds more prefill tokens than its prompt)."""
    return _largest_prompt(*_sample_key(workload, 1))


def region_prefill_cap(workload: dict, b_max: int, k_max: int | None) -> int | None:
    """The region's cap on a request's prefill per step (`max_prefill_per_request`): the
    workload's longest prompt under a binding k_max (`k_max_binds`), None otherwise (or
    when no law bounds the prompts)."""
    return largest_prompt(workload) if k_max_binds(b_max, k_max) else None


@lru_cache(maxsize=64)
def _largest_prompt(key: str, files: tuple) -> int | None:
    spec = WorkloadSpec.from_dict(json.loads(key))
    system = spec.system_prompt or 0
    groups = [
        (c.prompt or spec.prompt, c.output or spec.output, system if c.system_prompt is None else c.system_prompt)
        for c in spec.classes or ()
    ] or [(spec.prompt, spec.output, system)]
    traced = None
    longest = 0
    for prompt, output, system in groups:
        if prompt is None:  # (the trace's prompts)
            if traced is None:
                traced = int(np.max(make_trace(spec, blocks=False).prompt))
            text = traced
        else:
            text = prompt.largest()
        if text is None:
            return None
        if spec.turns is not None:
            turns = spec.turns.largest()
            out = None if output is None else output.largest()
            if turns is None or out is None:
                return None
            text = turns * text + (turns - 1) * out
        longest = max(longest, system + text)
    return longest


def sample_key(workload: dict, samples: int = DEFAULT_SAMPLES) -> str:
    """A key of what `workload_mix` samples: equal for workloads that differ only in
    their arrivals or how many requests they run (for a synthetic workload)."""
    return _sample_key(workload, samples)[0]


def workload_mix(workload: dict, samples: int = DEFAULT_SAMPLES, cached_fraction: float = 0.0) -> LengthMix:
    """The `LengthMix` of a workload mapping: the lengths of the `samples` requests
    `workload_means` draws (a trace: its requests), for timing a context-dependent cost
    model's steps as varying lengths make them. `cached_fraction`: the share of each
    prompt a prefix cache serves, its first tokens (rounded; the last token is always
    computed)."""
    return _mix(*_sample_key(workload, samples), float(cached_fraction))


def _sample_key(workload: dict, samples) -> tuple:
    """(sample key, file stamps) of a sampled workload, checked: the key is the JSON of
    what is sampled (`_sample_dict`), so workloads that differ only in their arrivals or
    their length of run share one sample (a sweep's points). Options not given take the
    defaults a run takes (`DEFAULT_WORKLOAD`: `{"rate": 12}` samples the default prompt
    and output laws, as `llmsched.simulate(rate=12)` runs them)."""
    if not isinstance(workload, dict):
        raise ConfigError("a workload must be a mapping (arrival, rate, prompt, output, ...)")
    n = as_int(samples)
    if n is None or n < 1:
        raise ConfigError(f"samples must be a whole number >= 1, got {samples!r}")
    return _key(_sample_dict(with_defaults(workload, DEFAULT_WORKLOAD), n)), _files(workload)


def _key(workload: dict) -> str:
    return json.dumps(workload, sort_keys=True, default=str)


def _files(workload: dict) -> tuple:
    """Part of the caches' keys: the (absolute path, size, modification time) of the files
    the workload names (a trace, `empirical:PATH`, a dataset where it resolves now), so
    that a changed file, or a relative path read from another folder, is read anew."""
    return tuple(file_stamps({"workload": workload}))


def _sample_dict(workload: dict, samples: int) -> dict:
    """The workload mapping that draws the sample: `samples` requests of a synthetic
    workload at one rate, arriving deterministically; a trace as it is."""
    d = {k: v for k, v in workload.items() if v is not None}
    if not replays_trace(d):
        d.pop("duration_s", None)
        d["num_requests"] = samples
        # arrivals do not matter here (but for which turns of conversations come first:
        # one rate for every rate, so that a workload's means do not depend on its rate)
        d["rate"] = 1.0
        d["time_scale"] = 1.0  # (1e-12 put the 200,000th arrival past the simulator's clock)
        d["arrival"] = "deterministic"  # cheapest to draw
        d.pop("cv", None)
        if d.get("think_time_s") is not None:
            # each conversation's turns right after its first: the sample holds whole
            # conversations, the steady state's mix of turns (with the real think time a
            # long one left the later turns, the longer prompts, past the sample's end)
            d["think_time_s"] = 1e-9
    return d


def cached_tokens(cached_fraction: float, prompts):
    """The tokens of each prompt a prefix cache serving `cached_fraction` of it covers,
    rounded to the nearest token and never the last one (it is always computed); an array
    for an array of prompts, an int for one."""
    p = np.asarray(prompts, dtype=np.int64)
    c = np.minimum(np.rint(cached_fraction * p).astype(np.int64), p - 1)
    return int(c) if c.ndim == 0 else c


@lru_cache(maxsize=64)
def _mix(key: str, files: tuple, cached_fraction: float) -> LengthMix:
    tr = make_trace(WorkloadSpec.from_dict(json.loads(key)), blocks=False)
    cached = None
    if cached_fraction:
        cached = cached_tokens(cached_fraction, tr.prompt)
    return LengthMix(tr.prompt, tr.output, cached)


def rate_unit(workload: dict) -> str:
    """The unit of a workload's `rate`: conversations/s with `turns` (each conversation
    offers its turns), else req/s."""
    return "conversations/s" if workload.get("turns") is not None else "req/s"


def requests_per_rate(workload: dict) -> float:
    """Requests offered per unit of a workload's `rate`: with `turns` the rate counts
    conversations, each its mean number of turns (the turns law's mean); synthetic
    arrivals run `time_scale` times as fast. 1 for a trace (its rate, when given, is in
    requests/s). So the offered request rate of a workload is
    `rate * requests_per_rate(workload)`, and its load that over lambda*."""
    if not isinstance(workload, dict):
        raise ConfigError("a workload must be a mapping (arrival, rate, prompt, output, ...)")
    return _per_rate(_key(workload), _files(workload))


@lru_cache(maxsize=256)
def _per_rate(key: str, files: tuple = ()) -> float:
    d = {k: v for k, v in json.loads(key).items() if v is not None}
    if replays_trace(d):
        return 1.0
    spec = WorkloadSpec.from_dict(d)
    n = 1.0 if spec.turns is None else float(spec.turns.expected())
    return n * spec.time_scale


def ideal_cached_counts(trace, block_size: int) -> np.ndarray:
    """Prompt tokens of each request an unbounded cache would serve, replaying `trace` in
    arrival order (the last prompt token is always computed)."""
    seen: set[int] = set()
    out = np.zeros(len(trace), dtype=np.int64)
    for i, (p, blocks) in enumerate(zip(trace.prompt.tolist(), trace.iter_block_views(block_size))):
        if blocks is None:
            continue
        limit = min(len(blocks), (p - 1) // block_size)
        n = 0
        while n < limit and blocks[n] in seen:
            n += 1
        out[i] = n * block_size
        seen.update(blocks)
    return out


def ideal_cached_tokens(trace, block_size: int) -> float:
    """Mean prompt tokens per request an unbounded cache would serve, replaying `trace`
    in arrival order (the last prompt token is always computed)."""
    return float(ideal_cached_counts(trace, block_size).sum()) / max(len(trace), 1)


def ideal_cached_prompt(workload: dict, block_size: int, samples: int = CACHE_SAMPLES) -> float:
    """Prompt tokens per request that an unbounded prefix cache of `block_size`-token
    blocks serves on a workload (a shared system prompt, earlier turns of a conversation,
    a trace's block ids), over `samples` requests drawn as `workload_means` draws them (a
    trace's first `samples`): what theorem 2 does not count as work. A run measures its
    own (`cached_prompt_tokens_per_request`), lower when its KV cache evicts."""
    replay = _replay(*_sample_key(workload, samples), int(block_size))
    if replay is None:
        return 0.0
    hits = replay[2][:samples]  # (a replay in row order: the first rows' hits are the head's)
    return float(hits.sum()) / max(len(hits), 1)


def cached_workload_mix(workload: dict, block_size: int, samples: int = CACHE_SAMPLES) -> LengthMix:
    """The `LengthMix` of a workload replayed through an unbounded prefix cache, each
    request with the prompt tokens the cache serves it (`LengthMix(cached=...)`: its
    uncached tokens are timed after its cached prefix): `samples` requests of a synthetic
    workload (the replay is a Python loop over their blocks), a trace whole. A workload
    the cache serves nothing of gets `workload_mix` itself (the same lambda* as without
    caching)."""
    mix = _cached_mix(*_sample_key(workload, samples), int(block_size))
    return mix if mix is not None else workload_mix(workload)


@lru_cache(maxsize=64)
def _replay(key: str, files: tuple, block_size: int):
    """(prompts, outputs, each request's hits) of a sample replayed through an unbounded
    cache; None when it has no block ids."""
    tr = make_trace(WorkloadSpec.from_dict(json.loads(key)), block_size)
    return (tr.prompt, tr.output, ideal_cached_counts(tr, block_size)) if tr.has_blocks else None


@lru_cache(maxsize=64)
def _cached_mix(key: str, files: tuple, block_size: int) -> LengthMix | None:
    replay = _replay(key, files, block_size)
    return LengthMix(*replay) if replay is not None and replay[2].any() else None
