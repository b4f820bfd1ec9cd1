"""DynamicBatch: an AIMD cap on the batch size driven by a static ITL target.

Rule (the TWP paper's "DynamicBatch" baseline, docs/twp.md; our reading):

- A cap `C` on the number of requests in a step (`batch_limit`) and in the running set
  (admission is FCFS while `running + admitted < C`). Requests already running are never
  paused: a smaller cap takes effect as they finish.
- After each step, with `l` = EWMA (`alpha`) of the observed inter-token latency (as TWP
  measures it, `twp.ItlMeter`) and the static target `L*` (`itl_target_ms`, default 1.5 x
  the decode step time at batch 1): if `l > L*`, `C <- max(c_min, floor(beta * C))`
  (multiplicative decrease), else `C <- min(c_max, C + delta)` (additive increase).
- No token-level feedback: the step's token load is not bounded (a capped batch may still
  hold a full prefill chunk), and the queue depth plays no part.
- When nothing is running the head of the queue is always admitted (no deadlock).
"""

from __future__ import annotations

import math

from ..core.cost import make_cost_model
from ..core.errors import ConfigError, unknown_option
from ..core.request import Request
from ..core.state import ServerState
from .base import Planner
from .twp import ItlMeter, MeteredAdmission, check_number, decode_step_time

__all__ = ["DynamicBatch"]


class DynamicBatch(MeteredAdmission):
    """AIMD batch-size cap (see the module docstring). Options, defaults in brackets:

    - `itl_target_ms` [1.5 * l_min]: the static ITL target; `l_min` is the decode step
      time at batch 1 from the cost model (`cost`, else the driver's) at `context` tokens
      of context, or `l_min_ms`, or the shortest observed step with decode tokens.
    - `alpha` [0.2]: EWMA weight of the newest ITL sample (1: react to every step alone).
    - `beta` [0.5]: multiplicative decrease of the cap.
    - `delta` [1]: additive increase, requests per step.
    - `c_min` [1], `c_max` [min(b_max, k_max)]: bounds of the cap (a larger `c_max` is cut
      to `min(b_max, k_max)`, and to a running cap (`--max-running`) if one wraps the
      policy, and so is a `c_min` or `c0` above it).
    - `c0` [c_max]: initial cap (start unconstrained, as a plain FCFS server); one below
      `c_min` starts at `c_min`, as TWP's `h0` starts at the nearer bound.
    - `l_min_ms`, `cost`, `context` [1024]: as for `twp`.
    """

    name = "dynamicbatch"
    summary = "DynamicBatch: AIMD cap on the batch size when the ITL exceeds a static target (no token-level feedback)"
    closed_loop = True
    reads_emitted = False
    OPTIONS = ("itl_target_ms", "alpha", "beta", "delta", "c_min", "c_max", "c0", "l_min_ms", "cost", "context")

    def __init__(
        self,
        *,
        itl_target_ms: float | None = None,
        alpha: float = 0.2,
        beta: float = 0.5,
        delta: float = 1,
        c_min: int = 1,
        c_max: int | None = None,
        c0: int | None = None,
        l_min_ms: float | None = None,
        cost=None,
        context: int = 1024,
        **unknown,
    ):
        p = self.name
        if unknown:
            raise unknown_option("admission policy", p, unknown, self.OPTIONS)
        self.itl_target_ms = check_number(p, "itl_target_ms", itl_target_ms, lo=0, lo_open=True)
        self.alpha = check_number(p, "alpha", alpha, lo=0, lo_open=True, hi=1, none=False)
        self.beta = check_number(p, "beta", beta, lo=0, lo_open=True, hi=1, hi_open=True, none=False)
        self.delta = check_number(p, "delta", delta, lo=0, lo_open=True, none=False)
        self.c_min = check_number(p, "c_min", c_min, integer=True, lo=1, none=False)
        self.c_max = check_number(p, "c_max", c_max, integer=True, lo=1)
        self.c0 = check_number(p, "c0", c0, integer=True, lo=1)
        self.l_min_ms = check_number(p, "l_min_ms", l_min_ms, lo=0, lo_open=True)
        self.context = check_number(p, "context", context, integer=True, lo=0, none=False)
        if self.c_max is not None and self.c_min > self.c_max:
            raise ConfigError(f"{p}: c_min ({self.c_min}) must not exceed c_max ({self.c_max})")
        self.cost_spec = cost
        self.cost = None
        if cost is not None:
            if not isinstance(cost, str) and not hasattr(cost, "step_time"):
                raise ConfigError(f"{p}: cost must be a cost model spec such as 'paper', got {cost!r}")
            try:
                self.cost = make_cost_model(cost)
            except ConfigError as e:
                raise ConfigError(f"{p}: cost: {e}") from None
        self._start()

    def _start(self) -> None:
        """The state of a run's start: no feedback yet, nothing derived (`reset`)."""
        self._key = None
        self.meter = ItlMeter()
        self.l_ewma: float | None = None
        self.l_min_seen: float | None = None
        self.l_min_s: float | None = None
        self.C_max = 1
        self.cap: float | None = None

    def _resolve(self, state: ServerState) -> None:
        key = (state.b_max, state.k_max)
        if key == self._key:
            return
        self._key = key
        model = self.cost if self.cost is not None else self._bound
        if self.l_min_ms is not None:
            self.l_min_s = self.l_min_ms / 1e3
        elif model is not None:
            self.l_min_s = decode_step_time(model, 1, self.context)
            if not (self.l_min_s > 0 and math.isfinite(self.l_min_s)):
                raise ConfigError(
                    f"{self.name}: the cost model's decode step time at batch 1 is "
                    f"{self.l_min_s!r}; give l_min_ms or itl_target_ms"
                )
        else:
            self.l_min_s = None
        # no step holds more than min(b_max, k_max) requests, nor more than a running cap
        # (RunningCap) lets run: a larger c_max is cut to it (as TWP cuts h_max and
        # max_active), or the cap would halve from a value no step reaches
        room = self._room(state)
        self.C_max = room if self.c_max is None else min(self.c_max, room)
        lo = min(self.c_min, self.C_max)
        if self.cap is None:
            c0 = self.c0 if self.c0 is not None else self.C_max
            self.cap = float(min(max(c0, lo), self.C_max))
        else:
            self.cap = float(min(max(self.cap, lo), self.C_max))

    def itl_target(self) -> float | None:
        if self.itl_target_ms is not None:
            return self.itl_target_ms / 1e3
        l_min = self.l_min_s if self.l_min_s is not None else self.l_min_seen
        return None if l_min is None else 1.5 * l_min

    def batch_limit(self, state: ServerState) -> int:
        self._resolve(state)
        return max(int(self.cap), state.n_running)

    def may_admit(self, state: ServerState, r: Request, planner: Planner) -> bool:
        self._resolve(state)
        if state.n_running == 0 and planner.n_admitted == 0:
            return True
        return state.n_running + planner.n_admitted < int(self.cap)

    def observe(self, state: ServerState, feedback) -> None:
        self._resolve(state)
        s = self.meter.sample(feedback)
        if s is not None:
            if self.l_min_s is None and (self.l_min_seen is None or feedback.duration < self.l_min_seen):
                self.l_min_seen = feedback.duration
            self.l_ewma = s if self.l_ewma is None else self.alpha * s + (1 - self.alpha) * self.l_ewma
        target = self.itl_target()
        lo = min(self.c_min, self.C_max)
        if self.l_ewma is not None and target is not None and self.l_ewma > target:
            self.cap = max(float(lo), float(math.floor(self.beta * self.cap)))
        else:
            self.cap = min(float(self.C_max), self.cap + self.delta)

    def describe(self) -> dict:
        d = {"name": self.name}
        for k in self.OPTIONS:
            v = getattr(self, k) if k != "cost" else self.cost_spec
            if v is not None:
                d[k] = v if k != "cost" or isinstance(v, str) else getattr(v, "name", str(v))
        if self._key is not None:
            # the values in use (as TWP's `resolved`): l_min measured when no cost model gives it
            l_min = self.l_min_s if self.l_min_s is not None else self.l_min_seen
            target = self.itl_target()
            d["resolved"] = {
                "l_min_ms": None if l_min is None else l_min * 1e3,
                "itl_target_ms": None if target is None else target * 1e3,
                "C_max": self.C_max,
            }
        return d
