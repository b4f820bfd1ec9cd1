"""The discrete-event simulator: one server, one scheduler, one cost model.

Events are step boundaries and arrivals. At each boundary the arrivals so far join the
waiting queue, the scheduler plans a step, the cost model times it, and the state
advances. The fast path: when the plan is one the scheduler would repeat (no admission,
preemption, arrival, completion or chunk boundary before the next step), all the
identical steps up to the next event are applied at once. Times are integer nanoseconds,
so both paths give the same clock, the same metrics and the same `steps.csv`.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Callable, TextIO

import numpy as np

from ..core.cost import CostModel
from ..core.errors import ConfigError
from ..core.plan import StepFeedback
from ..core.request import WAITING, Request
from ..core.state import UNLIMITED
from ..policies.base import Scheduler
from .histogram import GapHistogram

NS = 1_000_000_000
MAX_SAMPLES = 4096  # time-series length bound with the automatic sampling interval
GAP_BATCH = 4096    # distinct inter-token gaps counted before they go to the histogram


class SimulationStuck(RuntimeError):
    """The scheduler planned an empty step while requests wait and none will arrive."""


@dataclass
class RunStats:
    """Everything the simulator measures, in bounded memory."""

    n: int
    ttft_ns: np.ndarray
    e2e_ns: np.ndarray
    queue_ns: np.ndarray
    preemptions: np.ndarray
    itl: GapHistogram
    load_hist: list[int]
    batch_hist: dict[int, int]
    steps: int
    busy_ns: int
    end_ns: int
    timeseries: dict[str, list]
    unfinished: int


MAX_TOKENS = 1 << 31        # per request: prompt + output
MAX_ARRIVAL_S = 1e9         # about 31 years: integer nanoseconds stay far from overflow


def validate_requests(prompt: np.ndarray, output: np.ndarray, kv_capacity: int | None) -> None:
    if len(prompt) == 0:
        raise ConfigError("the workload has no requests")
    big = np.asarray(prompt, dtype=np.float64) + np.asarray(output, dtype=np.float64) >= MAX_TOKENS
    if big.any():
        i = int(np.argmax(big))
        raise ConfigError(f"request {i} asks for {int(prompt[i])} prompt + {int(output[i])} output tokens; "
                          f"the simulator supports fewer than {MAX_TOKENS} per request")
    if (prompt < 1).any():
        raise ConfigError(f"request {int(np.argmax(prompt < 1))} has a prompt of {int(prompt.min())} tokens; prompts need at least 1")
    if (output < 1).any():
        raise ConfigError(f"request {int(np.argmax(output < 1))} asks for {int(output.min())} output tokens; at least 1 is needed")
    if kv_capacity:
        need = prompt + output - 1
        if (need > kv_capacity).any():
            i = int(np.argmax(need > kv_capacity))
            raise ConfigError(
                f"request {i} needs {int(need[i])} KV tokens (prompt {int(prompt[i])} + output "
                f"{int(output[i])} - 1) but the KV capacity is {kv_capacity}: it can never complete")


def simulate_trace(trace, scheduler: Scheduler, cost: CostModel, *, fast: bool = True,
                   max_time_s: float | None = None, sample_interval_s: float | None = None,
                   steps_file: TextIO | None = None,
                   progress: Callable[[int, int], None] | None = None) -> RunStats:
    """Run `trace` (arrays arrival_s, prompt, output) through `scheduler` timed by `cost`."""
    arrival_s = np.asarray(trace.arrival_s, dtype=np.float64)
    prompt_arr = np.asarray(trace.prompt, dtype=np.int64)
    output_arr = np.asarray(trace.output, dtype=np.int64)
    validate_requests(prompt_arr, output_arr, scheduler.constraints.kv_capacity)
    if (np.diff(arrival_s) < 0).any():
        raise ConfigError("arrival times must be non-decreasing")
    if len(arrival_s) and not (np.isfinite(arrival_s).all() and arrival_s.min() >= 0
                               and arrival_s.max() < MAX_ARRIVAL_S):
        raise ConfigError(f"arrival times must be finite, >= 0 and below {MAX_ARRIVAL_S:g} s "
                          f"(got {arrival_s.min():g} .. {arrival_s.max():g} s)")
    n = len(arrival_s)
    arr = np.round(arrival_s * NS).astype(np.int64).tolist()
    prompts = prompt_arr.tolist()
    outputs = output_arr.tolist()
    tags = trace.tag.tolist() if getattr(trace, "tag", None) is not None else None

    state = scheduler.new_state()
    b_max = state.b_max
    plan_step = scheduler.plan
    repeatable = fast and scheduler.repeatable
    closed_loop = scheduler.closed_loop
    load_only = cost.load_only
    step_time = cost.step_time
    load_ns: dict[int, int] = {}
    kv_capacity = state.kv_capacity

    itl = GapHistogram()
    load_hist = [0] * (b_max + 1)
    batch_hist: dict[int, int] = {}
    max_time = UNLIMITED if max_time_s is None else int(round(max_time_s * NS))

    span = (arr[-1] - arr[0]) if n else 0
    auto_interval = not sample_interval_s
    if auto_interval:
        interval = max(span // 1000, NS // 100)
    else:
        interval = int(round(sample_interval_s * NS))
        if interval < 1000:
            raise ConfigError(f"the sampling interval must be at least 1 microsecond, got {sample_interval_s} s")
    ts: dict[str, list] = {k: [] for k in ("time_s", "waiting_requests", "waiting_prefill_tokens",
                                           "running_requests", "decoding_requests", "token_load",
                                           "backlog_tokens", "kv_used_tokens")}
    first_sample = next_sample = arr[0] if n else 0

    def advance() -> None:
        """Move to the next sample time. With the automatic interval, memory stays bounded:
        past MAX_SAMPLES samples every other one is dropped and the interval doubles."""
        nonlocal next_sample, interval
        next_sample += interval
        if auto_interval and len(ts["time_s"]) >= MAX_SAMPLES:
            for col in ts.values():
                del col[1::2]
            interval *= 2
            next_sample = first_sample + -(-(next_sample - first_sample) // interval) * interval

    def record(t: int, j: int, b: int, pf: int) -> None:
        ts["time_s"].append(t / NS)
        ts["waiting_requests"].append(len(state.waiting))
        ts["waiting_prefill_tokens"].append(state.pending_prefill - j * pf)
        ts["running_requests"].append(state.n_running)
        ts["decoding_requests"].append(state.n_decoding)
        ts["token_load"].append(b)
        ts["backlog_tokens"].append(state.backlog_tokens - j * b)
        ts["kv_used_tokens"].append(state.kv_used + j * (b - pf))

    def sample_span(start: int, durations, count: int, b: int, pf: int) -> None:
        """Record the samples that fall in `count` repeated steps from `start`."""
        nonlocal next_sample
        if isinstance(durations, int):
            end = start + durations * count
            while next_sample < end:
                record(next_sample, max(0, next_sample - start) // durations, b, pf)
                advance()
            return
        t = start
        for j, d in enumerate(durations):
            t += d
            while next_sample < t:
                record(next_sample, j, b, pf)
                advance()

    def sample_idle(until: int) -> None:
        nonlocal next_sample
        while next_sample < until:
            record(next_sample, 0, 0, 0)
            advance()

    # Per-request results: typed arrays (cheap stores, compact), numpy at the end.
    ttft = array("q", [-1]) * n
    e2e = array("q", [-1]) * n
    queue = array("q", [-1]) * n
    preempts = array("i", [0]) * n
    # Inter-token gaps: counted in a plain dict (value -> weight) and handed to the
    # histogram in batches; its result does not depend on the order of its additions.
    gaps: dict[int, int] = {}
    gap = gaps.get

    i = 0
    now = arr[0] if n else 0
    next_arrival = arr[0] if n else UNLIMITED
    steps = 0
    busy = 0
    done = 0
    progress_every = max(1, n // 200)
    next_progress = progress_every if progress is not None else UNLIMITED
    running = state.running
    add = state.add
    begin_step = state.begin_step
    end_step = state.end_step

    while True:
        if next_arrival <= now:
            while i < n and arr[i] <= now:
                add(Request(i, arr[i], prompts[i], outputs[i], tags[i] if tags else ""))
                i += 1
            next_arrival = arr[i] if i < n else UNLIMITED
        if not running and not state.waiting:
            if i >= n:
                break
            sample_idle(next_arrival)
            now = next_arrival
            continue
        if now >= max_time:
            break
        plan = plan_step(state)
        prefill = plan.prefill
        m = plan.decode
        if not m and not prefill:
            if plan.preempt or running:
                raise SimulationStuck(f"the scheduler planned no work at t={now / NS:.6f}s "
                                      f"with {state.n_running} requests running")
            if i < n:
                sample_idle(next_arrival)
                now = next_arrival
                continue
            raise SimulationStuck(
                f"the scheduler planned no work at t={now / NS:.6f}s with {len(state.waiting)} waiting "
                f"and {state.n_running} running requests, and no more arrivals")
        admits = False
        for r, _ in prefill:
            if r.phase == WAITING:
                admits = True
                break
        pf, dctx, chunks, sampled = begin_step(plan, now)
        b = pf + m
        new = state.newly_active
        count = 1
        if repeatable and not admits and not plan.preempt:
            count = state.next_completion_round() if m else UNLIMITED
            for r, c in prefill:
                k = (r.prefill_target - r.prefilled) // c
                if k < count:
                    count = k
            if m and kv_capacity < UNLIMITED:
                # the plan repeats while the planner finds its decode room free
                k = (kv_capacity - state.kv_used - plan.decode_room) // m + 1
                if k < count:
                    count = k
        if load_only:
            d = load_ns.get(b)
            if d is None:
                d = load_ns[b] = int(round(cost.load_time(b) * NS))
                if d <= 0:
                    raise ConfigError(f"the cost model gives a non-positive step time at load {b}")
            if count > 1:
                limit = next_arrival if max_time > next_arrival else max_time
                if limit < UNLIMITED:
                    k = -(-(limit - now) // d)  # steps starting before the limit
                    if k < count:
                        count = k
            total = d * count
            durs = d
            first = d
        else:
            durs = []
            t = now
            limit = next_arrival if max_time > next_arrival else max_time
            rems = [r.prefill_target - r.prefilled for r, _ in prefill] if count > 1 else None
            j = 0
            while True:
                if j == 0:
                    d = step_time(pf, m, dctx, chunks, sampled)
                else:
                    s = m
                    for (c, _), rem in zip(chunks, rems):
                        if rem - j * c == c:
                            s += 1
                    d = step_time(pf, m, dctx + j * m, [(c, ctx + j * c) for c, ctx in chunks], s)
                d = int(round(d * NS))
                if d <= 0:
                    raise ConfigError(f"the cost model gives a non-positive step time at load {b}")
                durs.append(d)
                t += d
                j += 1
                if j >= count or t >= limit:
                    break
            count = j
            total = t - now
            first = durs[0]
        end = now + total

        # ---- metrics of the steps ------------------------------------------------------
        steps += count
        busy += total
        load_hist[b] += count
        k = m + len(prefill)
        batch_hist[k] = batch_hist.get(k, 0) + count
        if m:
            # every served decoder emits one token per step; a decoder that resumes after
            # a pause emits its first one after a longer gap
            w = m - len(new)
            if new:
                t1 = now + first
                for r in new:
                    g = t1 - r.last_emit
                    gaps[g] = gap(g, 0) + 1
            if count > 1:
                if load_only:
                    w += m * (count - 1)
                else:
                    for g in durs[1:]:
                        gaps[g] = gap(g, 0) + m
            gaps[first] = gap(first, 0) + w
        if next_sample < end:
            sample_span(now, durs, count, b, pf)
        if steps_file is not None:
            _write_steps(steps_file, steps - count, now, durs, count, plan, state)

        served = state.decoders[:m] if closed_loop else None
        end_step(plan, end, count)
        for _, g in state.resumed:
            gaps[g] = gap(g, 0) + 1
        for r in state.finished:
            x = r.id
            a = r.arrival
            if r.first_token >= 0:
                ttft[x] = r.first_token - a
            e2e[x] = r.finish - a
            queue[x] = r.first_scheduled - a
            preempts[x] = r.preemptions
            done += 1
        if closed_loop:
            scheduler.observe(state, StepFeedback(now / NS, total / NS, plan, state.finished,
                                                  state.first_tokens, lambda: served,
                                                  [r for r, _ in state.resumed]))
        if len(gaps) > GAP_BATCH:
            itl.add_counts(gaps)
            gaps.clear()
        now = end
        if done >= next_progress:
            progress(done, n)
            next_progress = done + progress_every

    itl.add_counts(gaps)
    for r in list(state.running.values()) + list(state.waiting):
        x = r.id
        if r.first_token >= 0:
            ttft[x] = r.first_token - r.arrival
        if r.first_scheduled >= 0:
            queue[x] = r.first_scheduled - r.arrival
        preempts[x] = r.preemptions
    if progress is not None:
        progress(done, n)
    return RunStats(n=n, ttft_ns=_np(ttft, np.int64), e2e_ns=_np(e2e, np.int64), queue_ns=_np(queue, np.int64),
                    preemptions=_np(preempts, np.int32), itl=itl, load_hist=load_hist, batch_hist=batch_hist,
                    steps=steps, busy_ns=busy, end_ns=now, timeseries=ts, unfinished=n - done)


def _np(a: array, dtype) -> np.ndarray:
    return np.frombuffer(a, dtype=a.typecode).astype(dtype) if len(a) else np.zeros(0, dtype=dtype)


def _write_steps(f: TextIO, first_index: int, start: int, durs, count: int, plan, state) -> None:
    decodes = " ".join(f"{r.id}:d" for r in state.decoders[:plan.decode])
    prefills = " ".join(f"{r.id}:p{c}" for r, c in plan.prefill)
    parts = [decodes, prefills] if plan.decode_first else [prefills, decodes]
    entries = " ".join(p for p in parts if p)
    pf = plan.prefill_tokens
    k = plan.decode + len(plan.prefill)
    t = start
    for j in range(count):
        d = durs if isinstance(durs, int) else durs[j]
        f.write(f"{first_index + j},{t / NS:.9f},{d / NS:.9f},{pf},{plan.decode},{k},{entries}\n")
        t += d


STEPS_HEADER = "step,start_s,duration_s,prefill_tokens,decode_tokens,batch_size,entries\n"
