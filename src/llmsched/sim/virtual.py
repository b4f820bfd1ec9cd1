"""The virtual GPU: an `EngineCore` that executes a policy's plans in real time.

`VirtualEngine` runs the same loop as the simulator (plan -> begin_step -> cost model ->
end_step) but on the wall clock: each `step()` plans one step, times it with the cost
model, sleeps until the step's predicted end and returns one placeholder token for every
request the step served. The whole serving stack (HTTP server, driver thread, clients)
can so be load-tested on a CPU at the scale of a real GPU.

Timing (the clock stays honest):
- A step starts when the previous one ended if the engine had work left (back to back,
  as a GPU would run), otherwise when `step()` is called (an idle engine woken by an
  arrival). The host time spent between two steps (dispatching outputs, planning) is
  taken out of the next step's sleep, not added to it.
- Requests join at the first step boundary at or after their arrival time, as in the
  simulator (a request the host hands over just after a boundary does not join a step
  that, on the schedule, had already started).
- The virtual GPU keeps the cost model's schedule: when the host finishes a step late (a
  descheduled process, a GC pause), the following steps still start on schedule and sleep
  less until the schedule is caught up, as long as the host is at most `max_debt_s`
  (default 50 ms) behind; beyond that the schedule is pushed back and the time is counted
  in `lag_s`. `stats()` also counts the late steps and the worst lateness (`max_late_s`),
  so a run whose numbers are not the cost model's can be told apart. `max_debt_s=0`:
  never catch up (every late step delays all later ones).
- With `realtime=False` nothing sleeps: the virtual clock jumps to each step's end, and
  `step()` reproduces `simulate_trace` step for step (tests use this).

Tokens: the engine never samples. A request emits exactly `max_tokens` placeholder tokens
(`token_id`, text `token_text`), as with `ignore_eos`, unless a stop condition ends it
first: a stop string found in its generated text, or `token_id` in `stop_token_ids`
(finish reason "stop", `stop_reason` the string or the id); otherwise the finish reason is
"length". As in the real engine (and vLLM), the text is cut before the stop string (a stop
token's text is left out), the last `len(longest stop) - 1` characters are held back from
the stream until they cannot start a stop string, and no stop condition applies before
`min_tokens` tokens (a stop token id cannot be drawn among the first `min_tokens`). Only
the number of prompt tokens matters, so `prompt_token_ids` may be any sized sequence
(`range(n)` is fine).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Sequence

from ..core.cost import CostModel, make_cost_model
from ..core.engine_api import RequestOutput, SamplingParams, check_request_size, find_stop
from ..core.errors import ConfigError
from ..core.plan import StepFeedback
from ..core.request import DONE, Request
from ..policies.base import Scheduler

NS = 1_000_000_000

__all__ = ["VirtualEngine"]


class _Entry:
    """Server-side bookkeeping of one request."""

    __slots__ = ("rid", "req", "params", "emitted", "text", "sent", "hold", "stops", "stop_ids",
                 "done")

    def __init__(self, rid: str, req: Request, params: SamplingParams):
        self.rid = rid
        self.req = req
        self.params = params
        self.emitted = 0
        self.stops = [x for x in params.stop if x] or None
        self.stop_ids = set(params.stop_token_ids) if params.stop_token_ids else None
        self.text = "" if self.stops else None
        self.sent = 0                  # characters of `text` already returned
        self.hold = max(len(x) for x in self.stops) - 1 if self.stops else 0
        self.done = False


class VirtualEngine:
    """An `EngineCore` whose GPU is a cost model (see the module docstring).

    `scheduler`: a `Scheduler` (e.g. from `llmsched.policies.make_scheduler`); `cost`: a
    `CostModel` or a spec such as `"paper"`, `"const:20"`; `max_model_len`: the longest
    prompt + output a request may ask for (None: no limit besides the KV capacity).
    `clock` returns seconds (default `time.monotonic`). `arrival_time` in `add_request` is
    `time.time()` seconds, as for the real engine (virtual seconds when not `realtime`).
    """

    def __init__(self, scheduler: Scheduler, cost: CostModel | str = "paper", *,
                 max_model_len: int | None = None, realtime: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 token_id: int = 0, token_text: str = " tok", max_debt_s: float = 0.05):
        if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        self.scheduler = scheduler
        self.cost = make_cost_model(cost)
        scheduler.bind_cost_model(self.cost)
        self.state = scheduler.new_state()
        self.max_model_len = max_model_len
        self.realtime = realtime
        self._clock = clock
        self._sleep = sleep
        self._epoch = clock()
        self._wall0 = time.time()
        self.token_id = token_id
        self.token_text = token_text
        self._entries: dict[str, _Entry] = {}
        self._seq = 0
        self._vnow = 0                 # virtual clock (ns) when not realtime
        self._free_at = -1             # scheduled end of the last step (ns)
        self._busy = False             # whether work was left after the last step
        self._last_arrival = 0
        self._pending: deque[Request] = deque()   # added, not yet at a step boundary
        self.max_debt_ns = int(max_debt_s * NS)
        self._load_ns: dict[int, int] = {}
        # counters
        self.steps = 0
        self.busy_ns = 0
        self.lag_ns = 0
        self.late_steps = 0
        self.max_late_ns = 0
        self.preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0
        self.aborted_total = 0

    # ---- clock -----------------------------------------------------------------------
    def now_ns(self) -> int:
        if not self.realtime:
            return self._vnow
        return int((self._clock() - self._epoch) * NS)

    def _to_ns(self, t: float) -> int:
        if not self.realtime:
            return int(round(t * NS))
        return int((t - self._wall0) * NS)

    def advance_to(self, t_s: float) -> None:
        """Without `realtime`: move the virtual clock forward to `t_s` seconds (idle time)."""
        if self.realtime:
            raise RuntimeError("advance_to() is for a VirtualEngine with realtime=False")
        self._vnow = max(self._vnow, int(round(t_s * NS)))

    # ---- EngineCore ------------------------------------------------------------------
    @property
    def kv_capacity(self) -> int | None:
        return self.scheduler.constraints.kv_capacity

    def check_request(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise ConfigError if a request of this size can never be served."""
        check_request_size(prompt_tokens, max_tokens, self.max_model_len, self.kv_capacity)

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        if request_id in self._entries:
            raise ConfigError(f"request id {request_id!r} is already in use")
        n = len(prompt_token_ids)
        self.check_request(n, params.max_tokens)
        now = self.now_ns()
        arrival = now if arrival_time is None else min(now, self._to_ns(arrival_time))
        if arrival < self._last_arrival:     # keep the decode order = arrival order
            arrival = self._last_arrival
        self._last_arrival = arrival
        r = Request(self._seq, arrival, n, params.max_tokens)
        self._seq += 1
        e = _Entry(request_id, r, params)
        r.payload = e
        self._entries[request_id] = e
        self._pending.append(r)          # joins the state at the first step starting after it

    def abort_request(self, request_id: str) -> None:
        e = self._entries.pop(request_id, None)
        if e is None or e.done:
            return
        e.done = True
        r = e.req
        if r in self._pending:
            self._pending.remove(r)
        elif r.phase != DONE:
            self.state.finish(r, max(self.now_ns(), self.state.now))
        self.aborted_total += 1
        # with no work left the GPU is idle: the next arrival starts a step at once (it is
        # not late on a schedule that ended with the aborted request)
        self._busy = not self.state.is_idle() or bool(self._pending)

    def has_unfinished_requests(self) -> bool:
        return bool(self._entries)

    def step(self) -> list[RequestOutput]:
        """Plan, time and run one step; returns one output per token emitted."""
        st = self.state
        now = self.now_ns()
        if self._busy:
            # back to back, on the cost model's schedule (see the module docstring)
            start = self._free_at
            floor = now - self.max_debt_ns
            if start < floor:
                self.lag_ns += floor - start
                start = floor
        else:
            start = now
        start = max(start, st.now)
        pending = self._pending
        while True:
            # arrivals join at the first step boundary at or after them, as in the simulator
            while pending and pending[0].arrival <= start:
                st.add(pending.popleft())
            plan = self.scheduler.plan(st)
            if not plan.is_empty():
                break
            if pending and pending[0].arrival <= now:
                start = pending[0].arrival
                continue
            self._busy = False               # nothing the policy can run now
            return []
        self.preemptions += len(plan.preempt)
        pf, dctx, chunks, sampled = st.begin_step(plan, start)
        m = plan.decode
        served = st.decoders[:m] if m else ()
        b = pf + m
        if self.cost.load_only:
            d = self._load_ns.get(b)
            if d is None:
                d = self._load_ns[b] = int(round(self.cost.load_time(b) * NS))
        else:
            d = int(round(self.cost.step_time(pf, m, dctx, chunks, sampled) * NS))
        if d <= 0:
            raise ConfigError(f"the cost model gives a non-positive step time at load {b}")
        end = start + d
        st.end_step(plan, end)
        self.steps += 1
        self.busy_ns += d

        # requests whose (re)computed prefill completed emitted a token too (a preempted
        # request's recompute emits its next token; it is not in `first_tokens`)
        completed = [r for r, _ in plan.prefill if r.prefilled == r.prefill_target]
        outs: list[RequestOutput] = []
        tid, ttext = self.token_id, self.token_text
        stopped: list[_Entry] = []
        for group in (served, completed):
            for r in group:
                e = r.payload
                if e.done:
                    continue
                e.emitted += 1
                if e.emitted == 1:
                    self.prompt_tokens_total += r.prompt
                o = RequestOutput(e.rid, [tid], ttext, prompt_tokens=r.prompt, output_tokens=e.emitted)
                if e.stops is not None or e.stop_ids is not None:
                    stop = self._stop_check(e, o, r.phase == DONE)
                    if stop is not None:
                        o.finished = True
                        o.finish_reason = "stop"
                        o.stop_reason = stop
                        e.done = True
                        if r.phase != DONE:
                            stopped.append(e)
                if r.phase == DONE and not e.done:
                    o.finished = True
                    o.finish_reason = "length"
                    e.done = True
                outs.append(o)
        for e in stopped:
            st.finish(e.req, end)
        for o in outs:
            if o.finished:
                self._entries.pop(o.request_id, None)
                self.finished_total += 1
        self.generation_tokens_total += len(outs)
        if self.scheduler.closed_loop:
            finished = st.finished + [e.req for e in stopped] if stopped else st.finished
            self.scheduler.observe(st, StepFeedback(start / NS, d / NS, plan, finished,
                                                    st.first_tokens, lambda: list(served),
                                                    resumed=[r for r, _ in st.resumed]))
        self._busy = not st.is_idle() or bool(pending)
        self._free_at = end
        if self.realtime:
            left = end - self.now_ns()
            if left > 0:
                self._sleep(left / NS)
            elif left < 0:
                self.late_steps += 1
                if -left > self.max_late_ns:
                    self.max_late_ns = -left
        else:
            self._vnow = end
        return outs

    def _stop_check(self, e: _Entry, o: RequestOutput, last: bool) -> int | str | None:
        """The stop condition the token just emitted (`o`) meets, if any (its text is then
        cut as the engine cuts it); sets `o.new_text` to the text that may be streamed now.
        `last`: the request has all its tokens."""
        checks = e.emitted >= e.params.min_tokens
        if e.stop_ids is not None and e.emitted > e.params.min_tokens and self.token_id in e.stop_ids:
            stop = self.token_id       # the stop token's text is not returned
        elif e.stops is None:
            return None
        else:
            stop = None
            text = e.text + self.token_text
            found = find_stop(text, len(self.token_text), e.stops) if checks else None
            if found is not None:
                cut, stop = found
                text = text[:cut]
            e.text = text
        if e.text is None:
            o.new_text = ""
            return stop
        upto = len(e.text) if stop is not None or last else max(e.sent, len(e.text) - e.hold)
        o.new_text = e.text[e.sent:upto]
        e.sent = upto
        return stop

    def stats(self) -> dict:
        st = self.state
        kv = self.kv_capacity
        return {
            "waiting": len(st.waiting),
            "running": st.n_running,
            "decoding": st.n_decoding,
            "kv_used_tokens": st.kv_used,
            "kv_capacity_tokens": kv,
            "kv_usage": (st.kv_used / kv) if kv else 0.0,
            "backlog_tokens": st.backlog_tokens,
            "unfinished": len(self._entries),
            "steps": self.steps,
            "busy_s": self.busy_ns / NS,
            "late_steps": self.late_steps,
            "lag_s": self.lag_ns / NS,
            "max_late_s": self.max_late_ns / NS,
            "preemptions": self.preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "finished_total": self.finished_total,
            "aborted_total": self.aborted_total,
        }

    def describe(self) -> dict:
        return {"backend": "sim", "scheduler": self.scheduler.describe(), "cost_model": self.cost.describe(),
                "max_model_len": self.max_model_len, "realtime": self.realtime}

