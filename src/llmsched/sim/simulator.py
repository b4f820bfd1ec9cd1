"""The discrete-event simulator: one server, one scheduler, one cost model.

Events are step boundaries and arrivals. At each boundary the arrivals so far join the
waiting queue, and the server (`sim.server.ServerSim`, which the network simulator runs
many of) plans a step, times it and advances its state. The fast path: when the plan is
one the scheduler would repeat (no admission, preemption, arrival, completion or chunk
boundary before the next step), all the identical steps up to the next event are applied
at once; a plan that never read the waiting queue runs on past arrivals (they join at its
end, and the time series counts each from the boundary it would have joined at). Times
are integer nanoseconds, so both paths give the same clock, the same metrics and the
same `steps.csv`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from ..core.clock import past_clock_error, to_clock_ns
from ..core.cost import CostModel
from ..core.errors import ConfigError
from ..core.request import MAX_SECONDS, NS, Request, check_sample_interval, check_seconds, clock_ns
from ..core.state import UNLIMITED
from ..policies.base import Scheduler
from .histogram import GapHistogram
from .server import STEPS_HEADER, ServerSim, SimulationStuck, TimeSeries, check_sample_count, record_unfinished


@dataclass
class RunStats:
    """Everything the simulator measures, in bounded memory."""

    n: int
    ttft_ns: np.ndarray
    e2e_ns: np.ndarray
    queue_ns: np.ndarray
    preemptions: np.ndarray
    itl: GapHistogram
    load_hist: dict[int, int]  # token load -> steps
    batch_hist: dict[int, int]
    steps: int
    busy_ns: int
    end_ns: int
    timeseries: dict[str, list]
    unfinished: int
    b_max: int = 0  # the server's token budget (0: unknown)
    prefix: dict | None = None  # prefix-cache counters (ServerState.prefix_stats), None when off
    stop_ns: int | None = None  # a max_time_s stop: requests arriving at or after it never arrive
    # prefix caching: prompt tokens the cache served each request at its first admission
    prefix_hits: np.ndarray | None = None


MAX_TOKENS = 1 << 31  # per request: prompt + output


def validate_requests(prompt: np.ndarray, output: np.ndarray, kv_capacity: int | None) -> None:
    if len(prompt) == 0:
        raise ConfigError("the workload has no requests")
    big = np.asarray(prompt, dtype=np.float64) + np.asarray(output, dtype=np.float64) >= MAX_TOKENS
    if big.any():
        i = int(np.argmax(big))
        raise ConfigError(
            f"request {i} asks for {int(prompt[i])} prompt + {int(output[i])} output tokens; "
            f"the simulator supports fewer than {MAX_TOKENS} per request"
        )
    if (prompt < 1).any():
        raise ConfigError(
            f"request {int(np.argmax(prompt < 1))} has a prompt of {int(prompt.min())} tokens; prompts need at least 1"
        )
    if (output < 1).any():
        raise ConfigError(
            f"request {int(np.argmax(output < 1))} asks for {int(output.min())} output tokens; at least 1 is needed"
        )
    if kv_capacity:
        need = prompt + output - 1
        if (need > kv_capacity).any():
            i = int(np.argmax(need > kv_capacity))
            raise ConfigError(
                f"request {i} needs {int(need[i])} KV tokens (prompt {int(prompt[i])} + output "
                f"{int(output[i])} - 1) but the KV capacity is {kv_capacity}: it can never complete"
            )


def check_run_inputs(trace, scheduler: Scheduler, max_time_s=None, sample_interval_s=None) -> None:
    """What `simulate_trace` refuses before it runs (ConfigError): requests that do not fit
    the limits, arrival times out of order or range, run options out of range."""
    arrival_s = np.asarray(trace.arrival_s, dtype=np.float64)
    prompt_arr = np.asarray(trace.prompt, dtype=np.int64)
    output_arr = np.asarray(trace.output, dtype=np.int64)
    validate_requests(prompt_arr, output_arr, scheduler.constraints.kv_capacity)
    if (np.diff(arrival_s) < 0).any():
        raise ConfigError("arrival times must be non-decreasing")
    if len(arrival_s) and not (np.isfinite(arrival_s).all() and arrival_s.min() >= 0 and arrival_s.max() < MAX_SECONDS):
        raise ConfigError(
            f"arrival times must be finite, >= 0 and below {MAX_SECONDS:g} s (got {arrival_s.min():g} .. "
            f"{arrival_s.max():g} s; are they in seconds? a trace's --time-scale K divides them)"
        )
    check_seconds("max_time_s", max_time_s)
    check_sample_interval(sample_interval_s)
    if len(arrival_s):
        check_sample_count(sample_interval_s, float(arrival_s[0]), float(arrival_s[-1]), max_time_s)


def simulate_trace(
    trace,
    scheduler: Scheduler,
    cost: CostModel,
    *,
    fast: bool = True,
    max_time_s: float | None = None,
    sample_interval_s: float | None = None,
    steps_file: TextIO | None = None,
    progress: Callable[[int, int], None] | None = None,
    checked: bool = False,
) -> RunStats:
    """Run `trace` (arrays arrival_s, prompt, output) through `scheduler` timed by `cost`,
    bound to the scheduler first (as `llmsched.simulate` and the virtual GPU bind theirs:
    TWP and DynamicBatch read step times from it instead of learning them). `checked`: the
    caller ran `check_run_inputs` on these inputs already."""
    if not checked:
        check_run_inputs(trace, scheduler, max_time_s, sample_interval_s)
    scheduler.bind_cost_model(cost)
    arrival_s = np.asarray(trace.arrival_s, dtype=np.float64)
    prompt_arr = np.asarray(trace.prompt, dtype=np.int64)
    output_arr = np.asarray(trace.output, dtype=np.int64)
    n = len(arrival_s)
    arr = to_clock_ns(arrival_s).tolist()
    prompts = prompt_arr.tolist()
    outputs = output_arr.tolist()
    tags = trace.tag.tolist() if getattr(trace, "tag", None) is not None else None
    pc = scheduler.constraints.prefix_block_size
    blocks = trace_blocks(trace, pc) if pc else None

    max_time = UNLIMITED if max_time_s is None else clock_ns(max_time_s)
    span = (arr[-1] - arr[0]) if n else 0
    if sample_interval_s:
        interval = clock_ns(sample_interval_s)
    else:
        interval = max(span // 1000, NS // 100)
    # the requests that arrive: those before a max_time_s stop (the rest never reach the server)
    arriving = bisect_left(arr, max_time)
    last = arr[arriving - 1] if arriving else None
    series = TimeSeries(arr[0] if n else 0, interval, not sample_interval_s, prefix=bool(pc), keep_until=last)
    server = ServerSim(scheduler, cost, fast=fast, series=series, steps_file=steps_file)
    state = server.state
    begin, end_batch = server.begin, server.end

    # per-request results: typed arrays (cheap stores, compact), numpy at the end
    ttft = array("q", [-1]) * n
    e2e = array("q", [-1]) * n
    queue = array("q", [-1]) * n
    preempts = array("i", [0]) * n
    hits = array("q", [0]) * n if pc else None

    i = 0
    now = min(arr[0], max_time) if n else 0
    next_arrival = arr[0] if arriving else UNLIMITED
    done = 0
    progress_every = max(1, n // 200)
    next_progress = progress_every if progress is not None else UNLIMITED
    running = state.running
    add = state.add

    while True:
        if next_arrival <= now:
            while i < arriving and arr[i] <= now:
                r = Request(i, arr[i], prompts[i], outputs[i], tags[i] if tags else "")
                if blocks is not None:
                    r.blocks = next(blocks)
                add(r)
                i += 1
            next_arrival = arr[i] if i < arriving else UNLIMITED
        idle = not running and not state.waiting
        if not idle:
            if now >= max_time:
                break
            end = begin(now, max_time, next_arrival)
        if idle or end is None:  # nothing runs now: wait for the next arrival
            if i < arriving:
                server.idle_until(next_arrival)
                now = next_arrival
                continue
            if i < n:  # the stop comes first: the clock runs to it
                now = max(now, max_time)
                server.idle_until(now)
                break
            if idle:
                break
            raise SimulationStuck(
                f"the batch policy {server.scheduler.batch.name!r} planned no work at t={now / NS:.6f}s "
                f"with {len(state.waiting)} waiting "
                f"and {state.n_running} running requests, and no more arrivals"
            )
        if end >= UNLIMITED:  # (a stop time, at most MAX_SECONDS, cuts batches well before)
            raise past_clock_error(
                "requests", "--max-time, max_time_s", "the steps (cost model, prompt and output lengths)"
            )
        late = None
        if next_arrival < end and series.next < end:  # the plan ignored the queue: arrivals joined
            late = []
            j = i
            while j < arriving and arr[j] < end:
                late.append((arr[j], prompts[j], prompts[j] + outputs[j] - 1))
                j += 1
        for r in end_batch(late):
            x = r.id
            a = r.arrival
            if r.first_token >= 0:
                ttft[x] = r.first_token - a
            e2e[x] = r.finish - a
            queue[x] = r.first_scheduled - a
            preempts[x] = r.preemptions
            if hits is not None:
                hits[x] = r.first_hit
            done += 1
        now = end
        if done >= next_progress:
            progress(done, n)
            next_progress = done + progress_every

    record_unfinished(state, ttft, queue, preempts, hits)
    if progress is not None:
        progress(done, n)
    return RunStats(
        n=n,
        ttft_ns=_np(ttft, np.int64),
        e2e_ns=_np(e2e, np.int64),
        queue_ns=_np(queue, np.int64),
        preemptions=_np(preempts, np.int32),
        itl=server.itl,
        load_hist=server.load_hist,
        b_max=state.b_max,
        batch_hist=server.batch_hist,
        steps=server.steps,
        busy_ns=server.busy,
        end_ns=now,
        timeseries=series.cols,
        unfinished=n - done,
        prefix=state.prefix_stats(),
        stop_ns=None if max_time == UNLIMITED else max_time,
        prefix_hits=None if hits is None else _np(hits, np.int64),
    )


def trace_blocks(trace, block_size: int):
    """An iterator over the requests' `Request.blocks` at the cache's block size, or None
    when the trace has no block ids: a `workload.Trace`'s own ids re-cut to `block_size`
    (a chunk of requests at a time; read-only memoryviews onto its arrays,
    `Trace.iter_block_views`), or a `blocks` list given at that size (tests)."""
    if getattr(trace, "block_ids", None) is not None and hasattr(trace, "iter_block_views"):
        return trace.iter_block_views(block_size)  # 8 bytes per id, not a tuple's ~40
    blocks = getattr(trace, "blocks", None)
    return iter(blocks) if isinstance(blocks, (list, tuple)) else None


def _np(a: array, dtype) -> np.ndarray:
    return np.frombuffer(a, dtype=a.typecode).astype(dtype) if len(a) else np.zeros(0, dtype=dtype)


__all__ = [
    "simulate_trace",
    "check_run_inputs",
    "trace_blocks",
    "RunStats",
    "SimulationStuck",
    "STEPS_HEADER",
    "validate_requests",
    "NS",
]
