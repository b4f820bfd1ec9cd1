"""The virtual GPU: an `EngineCore` that executes a policy's plans in real time.

`VirtualEngine` is a `runtime.StepDriver` (the step loop of the real engine too) whose
executor is a cost model on the wall clock: each `step()` plans one step, times it with
the cost model, sleeps until the step's predicted end and returns one placeholder token
for every request the step served. The whole serving stack (HTTP server, driver thread, clients)
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
first: a stop string found in its generated text, or `token_id` in `stop_token_ids`. The
stop rules are the real engine's (`runtime.output.Sequence`). Only the number of prompt
tokens matters, so `prompt_token_ids` may be any sized sequence (`range(n)` is fine).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..core.checks import as_real
from ..core.clock import wall_stamp_ns
from ..core.cost import CostModel, StepTimer, make_cost_model
from ..core.engine_api import SamplingParams, check_request_size
from ..core.errors import ConfigError
from ..core.plan import StepPlan
from ..core.prefix_cache import token_block_ids
from ..core.request import MAX_SECONDS, Request
from ..policies.base import Scheduler
from ..runtime.driver import NS, StepBatch, StepDriver
from ..runtime.output import PieceFn
from ..runtime.output import Sequence as Seq

__all__ = ["VirtualEngine"]


class CostExecutor:
    """Executes a step by timing it with a cost model: every sampler emits `token_id`."""

    def __init__(self, cost: CostModel, token_id: int):
        self.timer = StepTimer(cost)
        self.token_id = token_id

    def execute(self, batch: StepBatch) -> tuple[int, list[int]]:
        d = self.timer.step_ns(*batch.cost_args)
        return batch.start_ns + d, [self.token_id] * len(batch.samplers)


class VirtualEngine(StepDriver):
    """An `EngineCore` whose GPU is a cost model (see the module docstring).

    `scheduler`: a `Scheduler` (e.g. from `llmsched.policies.make_scheduler`); `cost`: a
    `CostModel` or a spec such as `"paper"`, `"const:20"`; `max_model_len`: the longest
    prompt + output a request may ask for (None: no limit besides the KV capacity).
    `clock` returns seconds (default `time.monotonic`). `arrival_time` in `add_request` is
    `time.time()` seconds, as for the real engine (virtual seconds when not `realtime`);
    `arrival_ns` is a time on the engine's own clock (`now_ns()`).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        cost: CostModel | str = "paper",
        *,
        max_model_len: int | None = None,
        realtime: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        token_id: int = 0,
        token_text: str = " tok",
        max_debt_s: float = 0.05,
    ):
        if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        debt = as_real(max_debt_s)  # (inf and 1e308 overflowed the ns count)
        if debt is None or not 0 <= debt <= MAX_SECONDS:
            raise ConfigError(
                f"max_debt_s (--sim-max-debt-ms / 1000) must be a number of seconds from 0 to {MAX_SECONDS:g}, "
                f"got {max_debt_s!r}"
            )
        super().__init__(scheduler)
        self.cost = make_cost_model(cost)
        scheduler.bind_cost_model(self.cost)
        self.executor = CostExecutor(self.cost, token_id)
        self.max_model_len = max_model_len
        self.realtime = realtime
        self._clock = clock
        # the wait until a step's end; `interrupt` cuts it short (a server stopping at once)
        self._interrupted = threading.Event()
        self._sleep = self._interrupted.wait if sleep is None else sleep
        self._epoch = clock()
        self.token_id = token_id
        self.token_text = token_text
        self._vnow = 0  # virtual clock (ns) when not realtime
        self._free_at = -1  # scheduled end of the last step (ns)
        self._busy = False  # whether work was left after the last step
        self._last_arrival = 0
        self._pending: deque[Request] = deque()  # added, not yet at a step boundary
        self.max_debt_ns = int(debt * NS)
        self.lag_ns = 0
        self.late_steps = 0
        self.max_late_ns = 0

    def interrupt(self) -> None:
        """End the wait for the current step's end now, and every later one: the server is
        stopping at once and will not serve the step's tokens (a step of seconds would
        otherwise hold the shutdown)."""
        self._interrupted.set()

    # ---- clock -----------------------------------------------------------------------
    def now_ns(self) -> int:
        if not self.realtime:
            return self._vnow
        return int((self._clock() - self._epoch) * NS)

    def _to_ns(self, t: float, now: int) -> int:
        if not self.realtime:
            return int(round(t * NS))
        return wall_stamp_ns(t, now)

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

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        *,
        arrival_ns: int | None = None,
    ) -> None:
        n = len(prompt_token_ids)
        self.check_request(n, params.max_tokens)
        now = self.now_ns()
        if arrival_ns is None and arrival_time is not None:
            arrival_ns = self._to_ns(arrival_time, now)
        arrival = now if arrival_ns is None else min(now, arrival_ns)
        if arrival < self._last_arrival:  # keep the decode order = arrival order
            arrival = self._last_arrival
        r = self._register(Seq(request_id, n, params), arrival)
        pc = self.state.prefix
        if pc is not None:  # prefix caching: the prompt's blocks from its token ids
            r.blocks = token_block_ids(list(prompt_token_ids), pc.block_size, params.cache_salt)
        self._last_arrival = arrival
        self._pending.append(r)  # joins the state at the first step starting after it

    def abort_request(self, request_id: str) -> None:
        super().abort_request(request_id)
        # with no work left the GPU is idle: the next arrival starts a step at once (it is
        # not late on a schedule that ended with the aborted request)
        self._busy = not self.state.is_idle() or bool(self._pending)

    def stalled(self) -> bool:
        # a request still pending joins at its arrival's step boundary: that step may run
        return super().stalled() and not self._pending

    def _drop(self, r: Request) -> None:
        if r in self._pending:
            self._pending.remove(r)
        else:
            super()._drop(r)

    # ---- the step's timing (the loop itself is StepDriver.step) ---------------------
    def _begin(self) -> tuple[StepPlan, int] | None:
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
            self.last_plan = plan
            if not plan.is_empty():
                return plan, start
            if pending and pending[0].arrival <= now:
                start = pending[0].arrival
                continue
            self._busy = False  # nothing the policy can run now
            return None

    def _piece(self, seq: Seq, tok: int) -> PieceFn:
        text = self.token_text
        return lambda final, drop: "" if drop else text

    def _after_step(self, end: int) -> None:
        self._busy = not self.state.is_idle() or bool(self._pending)
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

    def stats(self) -> dict:
        return {
            **self.counters(),
            "late_steps": self.late_steps,
            "lag_s": self.lag_ns / NS,
            "max_late_s": self.max_late_ns / NS,
        }

    def describe(self) -> dict:
        return {
            "backend": "sim",
            "scheduler": self.scheduler.describe(),
            "cost_model": self.cost.describe(),
            "max_model_len": self.max_model_len,
            "realtime": self.realtime,
        }
