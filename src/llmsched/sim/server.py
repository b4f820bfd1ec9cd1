"""One simulated server, advanced a batch of identical steps at a time.

`ServerSim.begin(now, limit, arrival)` plans the step at boundary `now` and, on the fast
path, how many identical steps follow it (up to the next completion, chunk boundary or
KV limit, and only steps starting before `limit` and the next `arrival`); `truncate(t)`
shortens that batch when a request arrives at `t` during it (it joins at the first
boundary at or after `t`); `end()` applies the batch to the state and its metrics and
returns the requests that finished. A plan built without reading the waiting queue
(`StepPlan.ignores_waiting`: the budget was spent before any admission) is the same
whoever arrives, so its batch runs past arrivals. The single-server simulator calls
begin/end in a loop; the network simulator runs many `ServerSim`s on one event queue.

A driver whose batches arrivals usually cut early (the serverless runtime) lowers
`first_steps`: `begin` then times only the first steps of the batch, and while the batch
is `extendable` the driver calls `extend()` at `busy_until` to time more (a cut ends it),
so that no step an arrival cuts off is timed; the batches are the same either way.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import repeat
from typing import TextIO

from ..core.cost import CostModel, StepTimer
from ..core.errors import ConfigError
from ..core.request import NS, WAITING, Request
from ..core.state import UNLIMITED
from ..policies.base import Scheduler
from .csv_rows import ns_text
from .histogram import GapHistogram

MAX_SAMPLES = 4096  # time-series length bound with the automatic sampling interval
# with an interval the user gives: every sample is kept, up to this many (about 0.3 GB)
MAX_USER_SAMPLES = 1_000_000
GAP_BATCH = 1 << 13  # inter-token gap rows gathered before they go to the histogram
SERIES = (
    "time_s",
    "waiting_requests",
    "waiting_prefill_tokens",
    "running_requests",
    "decoding_requests",
    "token_load",
    "backlog_tokens",
    "kv_used_tokens",
)


class SimulationStuck(RuntimeError):
    """The scheduler planned an empty step while requests wait and none will arrive."""


# with prefix caching: cumulative prompt tokens reused, cumulative blocks evicted, and the
# slots of cached blocks no running request holds (free space that still holds KV)
PREFIX_SERIES = ("prefix_hit_tokens", "prefix_evictions", "kv_cached_free_tokens")


def too_many_samples(interval_s: float, why: str, replicas: int = 1) -> str:
    where = "" if replicas == 1 else f", all {replicas:,} replicas' series together"
    return (
        f"the sampling interval {interval_s:g} s gives more than {MAX_USER_SAMPLES:,} samples of the time "
        f"series{where} ({why}): use a larger --sample-interval, or leave it out for the automatic one"
    )


def check_sample_count(interval_s: float | None, first_s: float, last_s: float, max_time_s, replicas: int = 1):
    """Refuse, before a run, a user's sampling interval that the arrivals' span alone (up
    to a `max_time_s` stop) would fill with more than MAX_USER_SAMPLES samples, all
    `replicas`' series together (a series keeps every sample of a given interval)."""
    if not interval_s:
        return
    span = last_s - first_s
    if max_time_s is not None:
        span = min(span, max(max_time_s - first_s, 0.0))
    if span / interval_s * replicas > MAX_USER_SAMPLES:
        raise ConfigError(too_many_samples(interval_s, f"the arrivals alone span {span:g} s", replicas))


class TimeSeries:
    """Queue state sampled every `interval` ns from `first`. With the automatic interval
    memory stays bounded: past MAX_SAMPLES samples every other one after `keep_until` (ns:
    the last arrival, where the verdict's window ends) is dropped and their interval
    doubles, so a long drain leaves the judged samples as dense as they were; when those
    hold over half the bound, every other sample is dropped. `prefix`: add the
    PREFIX_SERIES columns."""

    def __init__(
        self,
        first: int,
        interval: int,
        auto: bool,
        prefix: bool = False,
        replicas: int = 1,
        keep_until: int | None = None,
    ):
        self.first = self.next = first
        self.interval = interval
        self.auto = auto
        self.keep_until = None if keep_until is None else keep_until / NS  # as the samples' times are kept
        # a user's interval: the run's series (one per replica) hold MAX_USER_SAMPLES at most
        self.replicas = replicas
        self.limit = max(MAX_USER_SAMPLES // replicas, 1)
        self.prefix = prefix
        self.cols: dict[str, list] = {k: [] for k in (SERIES + PREFIX_SERIES if prefix else SERIES)}

    def _advance(self) -> None:
        self.next += self.interval
        if self.auto:
            times = self.cols["time_s"]
            if len(times) >= MAX_SAMPLES:
                kept = 0 if self.keep_until is None else bisect_right(times, self.keep_until)
                if kept > MAX_SAMPLES // 2:
                    kept = 0
                # the samples from `kept` on lie every `interval` up to `next`
                anchor = self.next - (len(times) - kept) * self.interval
                for col in self.cols.values():
                    del col[kept + 1 :: 2]
                self.interval *= 2
                self.next = anchor + -(-(self.next - anchor) // self.interval) * self.interval
        elif len(self.cols["time_s"]) >= self.limit:  # (below MAX_SAMPLES with over 244 replicas)
            why = f"the run reached {self.next / NS:g} s"
            raise ConfigError(too_many_samples(self.interval / NS, why, self.replicas))

    def _record(self, state, t: int, j: int, b: int, pf: int, joined: tuple[int, int, int] = (0, 0, 0)) -> None:
        c = self.cols
        n, prompt, work = joined  # requests that joined the queue during the batch
        c["time_s"].append(t / NS)
        c["waiting_requests"].append(len(state.waiting) + n)
        c["waiting_prefill_tokens"].append(state.pending_prefill - j * pf + prompt)
        c["running_requests"].append(state.n_running)
        c["decoding_requests"].append(state.n_decoding)
        c["token_load"].append(b)
        c["backlog_tokens"].append(state.backlog_tokens - j * b + work)
        c["kv_used_tokens"].append(state.kv_used + j * (b - pf))
        if self.prefix:
            # inside a batch of repeated steps the step-by-step path evicts at each step's
            # start, for that step's decode tokens: count those evictions already
            pc = state.prefix
            ev = state.blocks_to_evict((j + 1) * (b - pf))
            c["prefix_hit_tokens"].append(pc.hit_tokens)
            c["prefix_evictions"].append(pc.evictions + ev)
            c["kv_cached_free_tokens"].append((pc.n_free - ev) * pc.block_size)

    def span(self, state, start: int, durations, count: int, b: int, pf: int, late=None) -> None:
        """Record the samples that fall in `count` repeated steps from `start` (the state
        is the one at the start of the first step; `late` as in `ServerSim.end`)."""
        if late:
            self._span_late(state, start, durations, count, b, pf, late)
            return
        if isinstance(durations, int):
            end = start + durations * count
            while self.next < end:
                self._record(state, self.next, max(0, self.next - start) // durations, b, pf)
                self._advance()
            return
        t = start
        for j, d in enumerate(durations):
            t += d
            while self.next < t:
                self._record(state, self.next, j, b, pf)
                self._advance()

    def _span_late(self, state, start: int, durations, count: int, b: int, pf: int, late) -> None:
        """`span` with requests arriving during the batch: a sample in step j counts those
        that arrived by the step's start (they would have joined there)."""
        k = n = prompt = work = 0
        if isinstance(durations, int):
            # sample by sample, not step by step: a batch may hold millions of steps
            end = start + durations * count
            while self.next < end:
                j = max(0, self.next - start) // durations
                t = start + j * durations
                while k < len(late) and late[k][0] <= t:
                    n, prompt, work = n + 1, prompt + late[k][1], work + late[k][2]
                    k += 1
                self._record(state, self.next, j, b, pf, (n, prompt, work))
                self._advance()
            return
        t = start
        for j in range(count):
            while k < len(late) and late[k][0] <= t:
                n, prompt, work = n + 1, prompt + late[k][1], work + late[k][2]
                k += 1
            t += durations[j]
            while self.next < t:
                self._record(state, self.next, j, b, pf, (n, prompt, work))
                self._advance()

    def idle(self, state, until: int) -> None:
        while self.next < until:
            self._record(state, self.next, 0, 0, 0)
            self._advance()


class ServerSim:
    """A server of the simulator: its state, scheduler, step timing and metrics."""

    def __init__(
        self,
        scheduler: Scheduler,
        cost: CostModel,
        *,
        fast: bool = True,
        series: TimeSeries | None = None,
        steps_file: TextIO | None = None,
        state=None,
    ):
        self.scheduler = scheduler
        scheduler.reset()  # a run starts: nothing an earlier run taught the policies carries over
        self.state = state if state is not None else scheduler.new_state()
        self.plan_step = scheduler.plan
        self.repeatable = fast and scheduler.repeatable
        self.closed_loop = scheduler.closed_loop
        # closed-loop policies (TWP) that say how long a plan lasts may repeat it too
        self.repeats_closed_loop = fast and scheduler.repeats_closed_loop
        self.reads_emitted = self.closed_loop and scheduler.reads_emitted
        self.timer = StepTimer(cost)
        self._load_ns = self.timer._by_load  # the timer's cache, read inline on the hot path
        self.load_only = cost.load_only
        self.step_time = cost.step_time
        self.kv_capacity = self.state.kv_capacity
        self.series = series
        self.steps_file = steps_file
        self._itl = GapHistogram()
        # inter-token gaps gathered as (value, weight) rows and handed to the histogram in
        # batches; its result does not depend on the order of its additions
        self._gap_values = []
        self._gap_weights = []
        self.load_hist: dict[int, int] = {}  # token load -> steps (a budget may be huge)
        self.batch_hist: dict[int, int] = {}
        self.steps = 0
        self.busy = 0
        self.now = 0
        self.busy_until = -1  # end of the current batch; -1: no batch in progress
        # the current batch: (plan, start, steps, duration or durations, prefill tokens,
        # decoders that resumed with it)
        self._batch: tuple | None = None
        # Steps whose durations `begin` computes at first (the rest on `extend`). A driver
        # whose batches are usually cut by arrivals lowers it, so that it does not time
        # steps a cut drops; with the default every step is timed at once.
        self.first_steps = UNLIMITED
        # True while the batch may go on past `busy_until` with the same plan (`extend`):
        # steps remain that the plan repeats for, none was cut, the limit is not reached
        self.extendable = False
        self._timing: tuple = ()  # what `extend` times further steps with
        self._walked: tuple = (None, 0, 0)  # steps_done's last answer: (durations, steps, their end)

    @property
    def itl(self) -> GapHistogram:
        """Every inter-token gap so far (ns)."""
        if self._gap_values:
            self._flush_gaps()
        return self._itl

    def _flush_gaps(self) -> None:
        self._itl.add_arrays(self._gap_values, self._gap_weights)
        self._gap_values = []
        self._gap_weights = []

    @property
    def batch(self) -> tuple | None:
        """The batch in progress (plan, start ns, steps, step duration(s), prefill tokens,
        resumed decoders), or None."""
        return self._batch

    def add(self, r: Request) -> None:
        self.state.add(r)

    def steps_done(self, t: int) -> int:
        """Steps of the batch in progress that ended by `t` (0 without one)."""
        batch = self._batch
        if batch is None or t <= batch[1]:
            return 0
        _, start, count, durs, _, _ = batch
        if t >= self.busy_until:
            return count
        if isinstance(durs, int):
            return (t - start) // durs
        if count == 1:
            return 0
        # routers ask at every arrival, later each time: the walk goes on from the last answer
        walked, done, end = self._walked
        if walked is not durs or done > count or end > t:
            done, end = 0, start
        while done < count:
            e = end + durs[done]
            if e > t:
                break
            end = e
            done += 1
        self._walked = (durs, done, end)
        return done

    def unfinished(self, t: int) -> int:
        """Tokens left of the server's requests at `t`, the steps done by `t` of the batch in
        progress counted as done (routers and autoscalers weigh servers by it)."""
        batch = self._batch
        if batch is None or t <= batch[1]:
            return self.state.backlog_tokens
        return self.state.backlog_tokens - self.steps_done(t) * (batch[0].decode + batch[4])

    def work_after_batch(self) -> int:
        """Tokens left of the server's requests once the batch in progress ends (the
        backlog without one): `unfinished` at any time is at least this."""
        batch = self._batch
        if batch is None:
            return self.state.backlog_tokens
        return self.state.backlog_tokens - batch[2] * (batch[0].decode + batch[4])

    def is_idle(self) -> bool:
        st = self.state
        return not st.running and not st.waiting

    # ---- a batch -----------------------------------------------------------------------
    def begin(self, now: int, limit: int = UNLIMITED, arrival: int = UNLIMITED) -> int | None:
        """Plan at boundary `now` a batch of identical steps, those that start before
        `limit` (at least one) and, unless the plan ignores the waiting queue, before the
        next `arrival`; returns its end, or None if the plan is empty."""
        st = self.state
        self.now = now
        plan = self.plan_step(st)
        if arrival < limit and not plan.ignores_waiting:
            limit = arrival
        prefill = plan.prefill
        m = plan.decode
        if not m and not prefill:
            if plan.preempt or st.running:
                raise SimulationStuck(
                    f"the batch policy {self.scheduler.batch.name!r} planned no work at t={now / NS:.6f}s "
                    f"with {st.n_running} requests running"
                )
            return None
        admits = False
        if not plan.repeats_admission:
            for r, _ in prefill:
                if r.phase == WAITING:
                    admits = True
                    break
        pf, dctx, chunks, sampled = st.begin_step(plan, now)
        count = 1
        closed = False
        if (self.repeatable or (closed := self.repeats_closed_loop)) and not (admits or plan.preempt):
            count = st.next_completion_round() if m else UNLIMITED
            for r, c in prefill:
                k = (r.prefill_target - r.prefilled) // c
                if k < count:
                    count = k
            if m and self.kv_capacity < UNLIMITED:
                # the plan repeats while the planner finds its decode room free
                k = (self.kv_capacity - st.kv_used - plan.decode_room) // m + 1
                if k < count:
                    count = k
            if st.prefix is not None and prefill:
                k = self._next_useful_block(prefill)
                if k < count:
                    count = k
        if self.load_only:
            b = pf + m
            d = self._load_ns.get(b)
            if d is None:
                d = self.timer.load_ns(b)
            if count > 1 and limit < UNLIMITED:
                k = -(-(limit - now) // d)  # steps starting before the limit
                if k < count:
                    count = k
            if closed and count > 1:
                count = self.scheduler.repeat_steps(st, plan, now, [d] * count)
            self._batch = (plan, now, count, d, pf, st.newly_active)
            end = now + d * count
        elif count > 1 and now < limit:
            # a repeated plan: its first steps timed in one call (step 0 of the repetition
            # is the step planned: its chunks, contexts and sampled rows are begin_step's)
            rems = [r.prefill_target - r.prefilled for r, _ in prefill] if prefill else ()
            self._timing = (pf, m, dctx, chunks, rems, count, limit)
            durs = []
            # (arrivals do not cut a plan that ignores the queue: it is timed whole)
            upto = count if closed or plan.ignores_waiting else min(count, self.first_steps)
            end = self._time_steps(durs, now, upto if upto > 1 else 1)
            if closed and len(durs) > 1:
                del durs[self.scheduler.repeat_steps(st, plan, now, durs) :]
                end = now + sum(durs)
            else:
                self.extendable = len(durs) < count and end < limit
            self._batch = (plan, now, len(durs), durs, pf, st.newly_active)
        else:
            d = self.timer.step_ns(pf, m, dctx, chunks, sampled)
            end = now + d
            self._batch = (plan, now, 1, [d], pf, st.newly_active)
        self.busy_until = end
        return end

    def _next_useful_block(self, prefill) -> int:
        """Prefix caching: steps until a prefill of this plan caches a block of the prompt
        at the head of the waiting queue (UNLIMITED if none will). A plan that admits
        nothing stopped at that head, and only blocks of its prompt entering the cache can
        lower what its admission takes (evicting free blocks lowers neither its KV need
        nor, as it was refused, changes the plan), so the plan repeats until then (at least
        one step)."""
        head = self.state.waiting.first()
        if head is None or head.blocks is None or head.prefilled:
            return UNLIMITED
        hb = head.blocks
        bs = self.state.prefix.block_size
        limit = min(len(hb), (head.prefill_target - 1) // bs)
        best = UNLIMITED
        for r, c in prefill:
            bl = r.blocks
            j = r.next_block
            # ids are chained: r shares a later block with the head only if it shares block j
            if bl is not None and j < len(bl) and j < limit and bl[j] == hb[j]:
                # (a call that arrived with part of its prompt computed may hold block j
                # already: it enters the cache at this step's end)
                k = max(1, -(-((j + 1) * bs - r.prefilled) // c))
                if k < best:
                    best = k
        return best

    def _time_steps(self, durs: list[int], t: int, upto: int) -> int:
        """Append the durations of the batch's steps len(durs), ... that start before its
        limit, up to step `upto` (excluded); returns the end of the last."""
        pf, m, dctx, chunks, rems, _, limit = self._timing
        return self.timer.time_steps(durs, t, limit, upto, pf, m, dctx, chunks, rems)

    def extend(self) -> int:
        """Time more steps of an `extendable` batch (as many again as it has, those that
        start before its limit); returns its new end. Nothing about the batch changes but
        how far it is known: a driver calls this at `busy_until` when nothing joined."""
        plan, start, _, durs, pf, new = self._batch
        count = self._timing[5]
        end = self._time_steps(durs, self.busy_until, min(count, 2 * len(durs)))
        self.extendable = len(durs) < count and end < self._timing[6]
        self._batch = (plan, start, len(durs), durs, pf, new)
        self.busy_until = end
        return end

    def truncate(self, t: int) -> int:
        """A request arrived at `t` during the batch: keep only the steps that start
        before `t` (and time no more: it is not `extendable`); returns the batch's (new) end."""
        self.extendable = False
        if self.busy_until <= t:
            return self.busy_until
        plan, start, count, durs, pf, new = self._batch
        if isinstance(durs, int):
            k = max(1, -(-(t - start) // durs))
            if k < count:
                self._batch = (plan, start, k, durs, pf, new)
                self.busy_until = start + durs * k
            return self.busy_until
        end = start
        for j, d in enumerate(durs):
            end += d
            if end >= t:
                del durs[j + 1 :]
                break
        self._batch = (plan, start, len(durs), durs, pf, new)
        self.busy_until = end
        return end

    def end(self, late: list[tuple[int, int, int]] | None = None) -> list[Request]:
        """Apply the current batch; returns the requests it finished (`state.finished`).
        `late`: (arrival, prompt tokens, work) of requests that arrived during a batch whose
        plan ignores the waiting queue, not yet added to the state (the time series counts
        each from the first boundary at or after its arrival, as if it had cut the batch)."""
        st = self.state
        plan, now, count, durs, pf, new = self._batch
        m = plan.decode
        b = pf + m
        end = self.busy_until
        total = end - now
        self.steps += count
        self.busy += total
        load_hist = self.load_hist
        load_hist[b] = load_hist.get(b, 0) + count
        k = m + len(plan.prefill)
        batch_hist = self.batch_hist
        batch_hist[k] = batch_hist.get(k, 0) + count
        values = self._gap_values
        weights = self._gap_weights
        if m:
            # every served decoder emits one token per step; a decoder that resumes after
            # a pause emits its first one after a longer gap
            if isinstance(durs, int):
                values.append(durs)
                weights.append(m * count - len(new))
                first = durs
            else:
                values += durs
                first = durs[0]
                weights.append(m - len(new))
                if count > 1:
                    weights += repeat(m, count - 1)
            if new:
                t1 = now + first
                for r in new:
                    values.append(t1 - r.last_emit)
                    weights.append(1)
        series = self.series
        if series is not None and series.next < end:
            series.span(st, now, durs, count, b, pf, late)
        if self.steps_file is not None:
            write_steps(self.steps_file, self.steps - count, now, durs, count, plan, st)
        served = st.decoders[:m] if self.reads_emitted else None
        st.end_step(plan, end, count)
        if st.resumed:
            for _, g in st.resumed:
                values.append(g)
                weights.append(1)
        if len(values) > GAP_BATCH:
            self._flush_gaps()
        if self.closed_loop:
            self.scheduler.observe_batch(
                st,
                plan,
                now,
                durs,
                count,
                end,
                st.finished,
                st.first_tokens,
                [r for r, _ in st.resumed] if st.resumed else [],
                served,
            )
        self.now = end
        self.busy_until = -1
        self._batch = None
        self.extendable = False
        return st.finished

    def idle_until(self, t: int) -> None:
        """No work until `t` (the time series records the idle time)."""
        if self.series is not None:
            self.series.idle(self.state, t)
        self.now = t


def record_unfinished(state, ttft, queue, preempts, hits=None) -> None:
    """What the requests still in `state` at a run's stop reached, into the run's per-request
    arrays (indexed by request id): TTFT and queue time where they got there (ns since
    arrival), their preemptions, and their first admission's cache hits (`hits`)."""
    for r in [*state.running.values(), *state.waiting]:
        x = r.id
        if r.first_token >= 0:
            ttft[x] = r.first_token - r.arrival
        if r.first_scheduled >= 0:
            queue[x] = r.first_scheduled - r.arrival
        preempts[x] = r.preemptions
        if hits is not None:
            hits[x] = r.first_hit


def write_steps(f: TextIO, first_index: int, start: int, durs, count: int, plan, state) -> None:
    decodes = " ".join(f"{r.id}:d" for r in state.decoders[: plan.decode])
    prefills = " ".join(f"{r.id}:p{c}" for r, c in plan.prefill)
    parts = [decodes, prefills] if plan.decode_first else [prefills, decodes]
    entries = " ".join(p for p in parts if p)
    pf = plan.prefill_tokens
    k = plan.decode + len(plan.prefill)
    # the requests evicted before the batch's first step (their KV freed) lead its first row
    first = f"{' '.join(f'{r.id}:x' for r in plan.preempt)} {entries}".rstrip() if plan.preempt else entries
    t = start
    for j in range(count):
        d = durs if isinstance(durs, int) else durs[j]
        f.write(f"{first_index + j},{ns_text(t)},{ns_text(d)},{pf},{plan.decode},{k},{entries if j else first}\n")
        t += d


STEPS_HEADER = "step,start_s,duration_s,prefill_tokens,decode_tokens,batch_size,entries\n"
