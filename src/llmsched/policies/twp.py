"""Token Window Pacing (TWP): a closed-loop admission policy that paces each step's token load.

Rule (docs/twp.md; every constant is a parameter, defaults in `TWP`):

- `l_min` = decode step time at batch 1 (the cost model at `context` tokens of context, or
  `l_min_ms`, or, with neither, the shortest observed step that emitted decode tokens);
  `B_0` = the largest decode batch whose step stays within `(1 + eps) * l_min` (the knee).
- Each step the window `H_t` bounds the token load: `token_limit` is `H_t`, so the batch
  policy (Sarathi by default) serves the active decoders first, then prefill chunks FCFS up
  to `H_t` tokens in all. The window never pauses an active decoder.
- After each step, with `l` = EWMA (`alpha`) of the observed inter-token latency and
  `L*` = `itl_target_ms` (default `1.5 * l_min`): if `l > L*`, `H <- max(H_min, beta * H)`,
  else `H <- min(H_max, H + delta * (1 + ln(1 + queue depth)))`. `H` starts at `H_0`.
- Admission into the active set, FCFS: request `r` joins while `B_t < B_max` and the
  outstanding work `K_t + w(r)` (tokens left of the running requests, plus `r`'s) can
  drain within `horizon_steps` steps at the current window in whole tokens (as the
  token limit): `K_t + w(r) <= horizon * floor(H_t)`.
  When nothing is running the head of the queue is always admitted (no deadlock).
- Our defaults (docs/twp.md): `B_max` = the largest decode batch whose step meets `L*`
  (at least `B_0`); `H_min` = max(`B_max`, the load knee `W_0`), so the window always
  holds every active decoder and never shrinks below the load where steps get faster;
  `H_max` = `b_max`; `H_0` = `H_min`.

The observed ITL of a step is the gap its decoders saw since their previous token: the end
of this step minus the end of the previous one when that step emitted tokens (back to back,
this is the step's duration plus any host time between the steps), else the step's own
duration. Idle time while nothing runs is never counted (no decoder waits through it; a
driver that lets a decoder join an idle server without a prefill calls `went_idle`).
Everything is computed from `StepFeedback` and the state (the simulator hands the same
quantities to `observe_batch`, one call per batch of repeated steps): no wall clock, so the
simulator, the virtual GPU and the engine take the same decisions given the same feedback.
"""

from __future__ import annotations

import math

from ..core.checks import as_real
from ..core.cost import CostModel, make_cost_model
from ..core.errors import ConfigError, unknown_option
from ..core.request import NS, Request
from ..core.state import UNLIMITED, ServerState
from .base import AdmissionPolicy, Planner

__all__ = ["TWP", "ItlMeter", "MeteredAdmission", "decode_step_time", "check_number"]


def check_number(
    policy: str,
    name: str,
    v,
    *,
    integer: bool = False,
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
    hi_open: bool = False,
    none: bool = True,
):
    """Validate one option value; returns it (an int when `integer`) or raises ConfigError."""
    if v is None:
        if none:
            return None
        raise ConfigError(f"{policy}: {name} is required")
    huge = False
    try:
        bad = as_real(v) is None or not math.isfinite(v)
    except OverflowError:  # an int past a float's range (10**400): no window or step time holds it
        bad = huge = True
    if not bad and integer and v != int(v):
        bad = True
    if not bad and lo is not None and (v <= lo if lo_open else v < lo):
        bad = True
    if not bad and hi is not None and (v >= hi if hi_open else v > hi):
        bad = True
    if bad:
        kind = "an integer" if integer else "a number"
        rng = []
        if lo is not None:
            rng.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi is not None:
            rng.append(f"{'<' if hi_open else '<='} {hi:g}")
        elif huge:
            rng.append("< 1e308")
        where = f" {' and '.join(rng)}" if rng else ""
        raise ConfigError(f"{policy}: {name} must be {kind}{where}, got {v!r:.60}")
    return int(v) if integer else float(v)


def decode_step_time(cost, n: int, context: int) -> float:
    """Seconds of a decode-only step of `n` decoders with `context` cached tokens each."""
    if cost.load_only:
        return float(cost.load_time(n))
    return float(cost.step_time(0, n, n * context, [], n))


def _roofline_batch(b0: int, target: float, l_min: float) -> int:
    """The largest n with l_min * n / b0 <= target: floor(b0 * target / l_min), one more
    where the quotient falls a rounding error short of a whole number (3 ms, 16, 9 ms gave
    47.99999..., so 47, where a batch of 48 takes exactly 9 ms)."""
    n = int(b0 * target / l_min)
    return n + 1 if l_min * (n + 1) <= b0 * target * (1 + 1e-12) else n


class ItlMeter:
    """The inter-token latency a step's decoders experienced, from `StepFeedback` alone.

    A decoder served back to back waits from the end of the previous step to the end of
    this one (the step's duration, plus host time between steps on a real engine). When
    the previous step emitted no token, nothing decoded before this step without a pause
    we could see, so the step's duration is the sample. Steps without decode tokens give
    no sample (a first token is TTFT, not ITL)."""

    __slots__ = ("prev_end", "prev_emitted")

    def __init__(self):
        self.prev_end: float | None = None
        self.prev_emitted = False

    def sample(self, feedback) -> float | None:
        end = feedback.start + feedback.duration
        s = None
        if feedback.plan.decode > 0:
            s = feedback.duration
            if self.prev_emitted and self.prev_end is not None:
                s = max(s, end - self.prev_end)
        self.prev_emitted = bool(feedback.plan.decode > 0 or feedback.first_tokens or feedback.resumed)
        self.prev_end = end
        return s

    def forget(self) -> None:
        """The server was idle: the next step's decoders waited through none of it."""
        self.prev_end = None
        self.prev_emitted = False


class MeteredAdmission(AdmissionPolicy):
    """An admission that samples the inter-token latency with an `ItlMeter`, `self.meter`
    (TWP, DynamicBatch): a server gone idle starts its next step with the meter reset."""

    meter: ItlMeter
    _bound = None  # the driver's cost model (bind_cost_model)
    _running_cap: int | None = None  # a RunningCap wrapper's limit (bind_running_cap)

    def went_idle(self) -> None:
        self.meter.forget()

    def bind_cost_model(self, cost) -> None:
        self._bound = cost
        self._invalidate()

    def bind_running_cap(self, max_running: int) -> None:
        self._running_cap = max_running
        self._invalidate()

    def _invalidate(self) -> None:
        """The derived constants are recomputed at the next step (`_resolve`)."""
        self._key = None

    def reset(self) -> None:
        """A new run: the run's state starts over (`_start`); the bound cost model and the
        options stay. A running cap is the wrapper's (`RunningCap.reset` binds it again):
        the policy run without that wrapper runs uncapped, as a fresh one."""
        self._running_cap = None
        self._start()

    def _start(self) -> None:  # pragma: no cover - each policy's own
        raise NotImplementedError

    def _room(self, state: ServerState) -> int:
        """The most requests a step can hold: min(b_max, k_max), and a running cap's."""
        room = min(state.b_max, state.k_max)
        return room if self._running_cap is None else min(room, self._running_cap)


class TWP(MeteredAdmission):
    """Token Window Pacing (see the module docstring for the rule).

    Options (keyword arguments, `--admission-option KEY=VALUE`), defaults in brackets;
    `b_max` is the server's token budget, `k_max` its batch-size cap, `t(n)` the step
    time of `n` decoders (at `context` tokens each) and `t_load(b)` of a load of `b`
    tokens, both from the cost model:

    - `eps` [0.2]: knee tolerance: `B_0` is the largest `n` with `t(1..n) <= (1+eps) l_min`.
    - `itl_target_ms` [1.5 l_min]: the ITL target `L*` (your SLO).
    - `alpha` [0.2]: EWMA weight of the newest ITL sample (a memory of about 5 steps).
    - `beta` [0.5]: multiplicative decrease of the window when `l > L*`.
    - `delta` [b_max / 64]: additive increase in tokens per step, times `1 + ln(1 + q)`
      with `q` waiting requests: from `H_0 = H_min` the window reaches the budget after
      `(b_max - H_min) / delta` steps with no queue (48 on the paper model, 41 on the
      H200 profile, b_max 512), 8-9 with 100 waiting.
    - `max_active` (`B_max`) [the largest decode batch with `t(n) <= L*`, at least B_0]:
      most requests in the active set, so that pure decode steps meet the target; at
      most `min(b_max, k_max, H_max)` and a running cap (`--max-running`), if one
      wraps the policy (a larger value is cut to it).
    - `h_min` [max(B_max, W_0)]: smallest window. At least `B_max`, so the window always
      holds one decode token per active request, and at least the load knee `W_0` (the
      largest load with `t_load(1..W_0) <= (1+eps) t_load(1)`): a smaller window makes no
      step faster, it only cuts throughput.
    - `h_max` [b_max]: largest window (larger values are cut to `b_max`; an `h_min` above
      it is cut to it too).
    - `h0` [H_min]: initial window: start at the knee, grow under queue pressure.
    - `horizon_steps` [256]: steps within which the active work must drain at the current
      window for a new request to join (`K_t + w(r) <= horizon * floor(H_t)`); 256 steps is the
      default workload's mean output, so it binds only when the active work is unusually
      large for the window (long prompts or outputs piled up while the window shrank).
    - `l_min_ms`, `b0` [from the cost model]: measured values, when you have them. With
      both and no cost model, `B_max` follows the roofline `t(n) = l_min max(1, n / B_0)`:
      `floor(B_0 L* / l_min)`, and `W_0 = B_0`.
    - `cost` [the driver's]: a cost model spec (`paper`, `profile:PATH`, ...) to compute
      `l_min`, `B_0`, `B_max` and `W_0` from, instead of the one the driver binds (the
      simulator and the virtual GPU bind theirs; the PyTorch engine binds none).
    - `context` [1024]: cached tokens per decoder when timing decode steps with a
      context-dependent cost model (ignored by load-only models such as `paper`).

    Without a cost model, `l_min_ms` and `b0` (the engine without `cost=`), both are
    measured from the feedback: `l_min` is the shortest observed step that emitted decode
    tokens, `B_0` (and `W_0`) the largest token load observed in a step within
    `(1 + eps) l_min`; `B_max` is then `k_max` (no cap from timing; at most `H_max`) and
    `H_min` follows `B_0`.
    """

    name = "twp"
    summary = (
        "Token Window Pacing: an ITL-feedback token window bounds each step's load; "
        "FCFS admission while the active work drains within a horizon"
    )
    closed_loop = True
    reads_emitted = False
    OPTIONS = (
        "eps",
        "itl_target_ms",
        "alpha",
        "beta",
        "delta",
        "max_active",
        "h_min",
        "h_max",
        "h0",
        "horizon_steps",
        "l_min_ms",
        "b0",
        "cost",
        "context",
    )

    def __init__(
        self,
        *,
        eps: float = 0.2,
        itl_target_ms: float | None = None,
        alpha: float = 0.2,
        beta: float = 0.5,
        delta: float | None = None,
        max_active: int | None = None,
        h_min: int | None = None,
        h_max: int | None = None,
        h0: int | None = None,
        horizon_steps: float = 256,
        l_min_ms: float | None = None,
        b0: int | None = None,
        cost=None,
        context: int = 1024,
        **unknown,
    ):
        p = self.name
        if unknown:
            raise unknown_option("admission policy", p, unknown, self.OPTIONS)
        self.eps = check_number(p, "eps", eps, lo=0, none=False)
        self.itl_target_ms = check_number(p, "itl_target_ms", itl_target_ms, lo=0, lo_open=True)
        self.alpha = check_number(p, "alpha", alpha, lo=0, lo_open=True, hi=1, none=False)
        self.beta = check_number(p, "beta", beta, lo=0, lo_open=True, hi=1, hi_open=True, none=False)
        self.delta = check_number(p, "delta", delta, lo=0, lo_open=True)
        self.max_active = check_number(p, "max_active", max_active, integer=True, lo=1)
        self.h_min = check_number(p, "h_min", h_min, integer=True, lo=1)
        self.h_max = check_number(p, "h_max", h_max, integer=True, lo=1)
        self.h0 = check_number(p, "h0", h0, integer=True, lo=1)
        self.horizon_steps = check_number(p, "horizon_steps", horizon_steps, lo=0, lo_open=True, none=False)
        self.l_min_ms = check_number(p, "l_min_ms", l_min_ms, lo=0, lo_open=True)
        self.b0 = check_number(p, "b0", b0, integer=True, lo=1)
        self.context = check_number(p, "context", context, integer=True, lo=0, none=False)
        if self.h_min is not None and self.h_max is not None and self.h_min > self.h_max:
            raise ConfigError(f"{p}: h_min ({self.h_min}) must not exceed h_max ({self.h_max})")

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
        self._key = None  # (b_max, k_max) the derived values were computed for
        self._state = None  # the state last resolved for (a state's b_max and k_max never change)
        self.meter = ItlMeter()
        self.l_ewma: float | None = None  # seconds
        self.window: float | None = None  # H_t
        self._admitted_work = 0
        self._repeated = None  # (plan, start, queue, feedback state) of the last repeat_steps
        # measured (no cost model): shortest decode step, loads' fastest steps, their knee
        self._seen_l_min: float | None = None
        self._seen_load: dict[int, float] = {}
        self._seen_knee = 1
        # derived (by _resolve)
        self.measured = False
        self.l_min_s: float | None = None  # seconds
        self.B_0: int | None = None
        self.W_0: int | None = None
        self.B_max = UNLIMITED
        self.H_min = 1
        self.H_max = 1
        self.delta_tokens = 1.0
        self._target: float | None = None  # L* in seconds (itl_target() when not measured)

    # ---- derived constants -----------------------------------------------------------
    def _invalidate(self) -> None:
        self._key = self._state = None

    def _resolve(self, state: ServerState) -> None:
        key = (state.b_max, state.k_max)
        if key == self._key:
            self._state = state
            return
        self._key = key
        b_max = state.b_max
        # no decode batch holds more than k_max requests, nor more than a running cap
        # (RunningCap) lets run: B_0 and B_max are at most that
        cap = self._room(state)
        model = self.cost if self.cost is not None else self._bound
        self.H_max = min(self.h_max if self.h_max is not None else b_max, b_max)
        self.delta_tokens = self.delta if self.delta is not None else b_max / 64
        self.measured = False
        if self.l_min_ms is not None:
            self.l_min_s = self.l_min_ms / 1e3
        elif model is not None:
            self.l_min_s = decode_step_time(model, 1, self.context)
            if not (self.l_min_s > 0 and math.isfinite(self.l_min_s)):
                raise ConfigError(
                    f"{self.name}: the cost model's decode step time at batch 1 is {self.l_min_s!r}; give l_min_ms"
                )
        else:
            self.l_min_s = None
        if self.b0 is not None:
            self.B_0 = self.b0
        elif model is not None:
            l_min = self.l_min_s
            self.B_0 = self._last_within(model, (1 + self.eps) * l_min, cap, self.context)
        else:
            self.B_0 = None
        if self.l_min_s is None or self.B_0 is None:
            self.measured = True  # l_min and/or B_0 come from the feedback
        target = self._target = self.itl_target()
        # at most the server's decode room and the largest window (which must hold one
        # decode token per active request); a larger max_active is cut to it, as h_max is
        cap = min(cap, self.H_max)
        if self.max_active is not None:
            self.B_max = min(self.max_active, cap)
        elif self.measured:
            self.B_max = cap  # no cap from timing: k_max, and the largest window
        elif model is not None:
            within = self._last_within(model, target, cap, self.context)
            self.B_max = min(max(self.B_0, within), cap)
        else:  # l_min and B_0 given: the roofline
            self.B_max = min(max(self.B_0, _roofline_batch(self.B_0, target, self.l_min_s)), cap)
        if model is not None:
            t1 = model.load_time(1)
            self.W_0 = self._last_within(model, (1 + self.eps) * t1, b_max)
        else:
            self.W_0 = self.B_0
        self._set_h_min()
        if self.window is None:
            h0 = self.h0 if self.h0 is not None else self.H_min
            self.window = float(min(max(h0, self.H_min), self.H_max))
        else:
            self.window = float(min(max(self.window, self.H_min), self.H_max))
        self._state = state

    def _set_h_min(self) -> None:
        if self.h_min is not None:
            lo = self.h_min
        elif self.measured:
            lo = self.B_0 if self.B_0 is not None else self._seen_knee
            if self.max_active is not None:  # the window holds every active decoder: B_max, as cut
                lo = max(lo, self.B_max)
        else:
            lo = max(self.B_max, self.W_0)
        self.H_min = max(1, min(lo, self.H_max))

    @staticmethod
    def _last_within(model, bound: float, cap: int, context: int | None = None) -> int:
        """Largest n <= cap with t(m) <= bound for every m in 1..n (at least 1), where t(m)
        is the model's decode step of m decoders at `context` (`decode_step_time`), or with
        no context its step of load m (`load_time`)."""
        if model.load_only:  # t(m) = load_time(m), non-decreasing: bisect
            lo, hi = 1, cap
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if model.load_time(mid) <= bound:
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        import numpy as np  # noqa: PLC0415

        # A context-dependent time may fall again past a size over the bound: every size is
        # timed in turn, by a vectorised model in chunks that double (one size at a time, a
        # budget of 1,000,000 took a minute), so that a small answer times few sizes past
        # it; a model that times each size itself is never asked past the first one over
        # the bound (its tables may end there).
        name = "load_times" if context is None else "decode_times"
        chunk, grow = (64, 2) if getattr(type(model), name) is not getattr(CostModel, name) else (1, 1)
        n = 1
        while n < cap:
            sizes = np.arange(n + 1, min(cap, n + chunk) + 1)
            times = model.load_times(sizes) if context is None else model.decode_times(sizes, context)
            over = np.flatnonzero(~(times <= bound))  # a NaN stops the scan, as `<=` did
            if len(over):
                return n + int(over[0])
            n += len(sizes)
            chunk *= grow
        return n

    def itl_target(self) -> float | None:
        """L* in seconds (None while l_min is still unmeasured)."""
        if self.itl_target_ms is not None:
            return self.itl_target_ms / 1e3
        l_min = self.l_min_s if self.l_min_s is not None else self._seen_l_min
        return None if l_min is None else 1.5 * l_min

    def _measure(self, d: float, b: int, decoded: bool) -> None:
        """Measured mode: the shortest decode step (l_min) and the load knee (B_0), from a
        step of `d` seconds at token load `b`."""
        if b <= 0:
            return
        if b not in self._seen_load or d < self._seen_load[b]:
            self._seen_load[b] = d
        if decoded and (self._seen_l_min is None or d < self._seen_l_min):
            self._seen_l_min = d
            bound = (1 + self.eps) * d
            self._seen_knee = max([1] + [n for n, t in self._seen_load.items() if t <= bound])
        elif self._seen_l_min is not None and d <= (1 + self.eps) * self._seen_l_min:
            self._seen_knee = max(self._seen_knee, b)
        self._set_h_min()

    # ---- the policy ------------------------------------------------------------------
    # The three calls below run at every step (and `observe_batch` after every batch of
    # steps in the simulator): each calls `_resolve` only for a state it was not resolved
    # for (instead of comparing `_key` with the state's limits), to keep TWP's cost per step
    # small. The window's rule is `_next` (one step) and `_replay` (a run of steps).
    def token_limit(self, state: ServerState) -> int:
        if state is not self._state:
            self._resolve(state)
        w = int(self.window)
        n = state.n_decoding
        return w if w >= n else n  # noqa: FURB136 (max() costs a call per step)

    def may_admit(self, state: ServerState, r: Request, planner: Planner) -> bool:
        if state is not self._state:
            self._resolve(state)
        if planner.n_admitted == 0:
            self._admitted_work = 0
            if not state.running:  # liveness: an idle server always takes the head
                self._admitted_work = state.work(r)
                return True
        # (`len(state.running)` is `n_running`, `backlog_tokens - waiting_tokens` is
        # `outstanding_tokens`, without a property call: this runs at every admission)
        if len(state.running) + planner.n_admitted >= self.B_max:
            return False
        work = state.work(r)
        if state.backlog_tokens - state.waiting_tokens + self._admitted_work + work > self.horizon_steps * int(
            self.window
        ):
            return False
        self._admitted_work += work
        return True

    def observe(self, state: ServerState, feedback) -> None:
        if state is not self._state:
            self._resolve(state)
        plan = feedback.plan
        decoded = plan.decode > 0
        meter = self.meter
        emitted = decoded or bool(feedback.first_tokens) or bool(feedback.resumed)
        if self.measured:
            self._measure(feedback.duration, plan.tokens, decoded)
        self.l_ewma, self.window, meter.prev_end, meter.prev_emitted = self._next(
            self.l_ewma,
            self.window,
            meter.prev_end,
            meter.prev_emitted,
            feedback.start,
            feedback.duration,
            decoded,
            emitted,
            len(state.waiting) - state.joining,  # `waiting_after_step`, without a property call
        )

    # The window changes a plan only through its token limit and, while requests wait,
    # through the horizon test of the head of the queue: TWP tells the simulator how long a
    # plan lasts, so that it repeats plans too.
    repeats = True

    def repeat_steps(self, state: ServerState, plan, start_ns: int, durations_ns) -> int:
        waiting = state.waiting
        q = len(waiting)
        count = len(durations_ns)
        self._repeated = (plan, start_ns, q, None)
        if not q and not plan.prefill and not state.prefilling:
            return count  # every active decoder, whatever the window
        if self.measured:
            return 1
        n, b_max = state.n_decoding, state.b_max
        w = int(self.window)
        # the windows that give the plan's token limit min(max(int(H), n), b_max): lo <= H < hi
        if n >= b_max or w >= b_max:
            lo, hi = (0 if n >= b_max else b_max), UNLIMITED
        elif w <= n:
            lo, hi = 0, n + 1
        else:
            lo, hi = w, w + 1
        # The plan admits nothing, so it refused the head of the queue. A refusal by the
        # horizon test may turn into an admission as the active work drains (by the step's
        # load every step) or the window grows: the plan lasts until then. Every other
        # refusal (budget, KV, B_max) stands while the token limit does.
        need = None
        load = 0
        if q and len(state.running) < self.B_max:  # n_running, outstanding_tokens, inline
            need = state.backlog_tokens - state.waiting_tokens + state.work(waiting.first())
            if need <= self.horizon_steps * w:
                need = None
            else:
                load = plan.tokens
        steps, after = self._replay(start_ns, durations_ns, count - 1, plan.decode > 0, q, lo, hi, need, load)
        if after is None:  # the window after step `steps - 1` changes the plan
            return steps
        # the feedback of the steps before the last one, for `observe_repeats`
        self._repeated = (plan, start_ns, q, (steps, *after))
        return count

    def observe_repeats(self, state: ServerState, plan, start_ns: int, durations_ns) -> None:
        if state is not self._state:
            self._resolve(state)
        meter = self.meter
        steps = len(durations_ns)
        q = state.waiting_after_step
        repeated = self._repeated
        self._repeated = None
        if repeated is not None and repeated[0] is plan and repeated[1] == start_ns:
            q = repeated[2]  # the queue while the steps ran (arrivals end a batch)
            known = repeated[3]
            if known is not None and known[0] == steps:  # repeat_steps computed it
                _, self.l_ewma, self.window, meter.prev_end, meter.prev_emitted = known
                return
        decoded = plan.decode > 0
        if self.measured:
            t = start_ns
            b = plan.tokens
            for d in durations_ns:
                seconds = d / NS
                self._measure(seconds, b, decoded)
                self.l_ewma, self.window, meter.prev_end, meter.prev_emitted = self._next(
                    self.l_ewma, self.window, meter.prev_end, meter.prev_emitted, t / NS, seconds, decoded, False, q
                )
                t += d
            return
        _, after = self._replay(start_ns, durations_ns, steps, decoded, q)
        self.l_ewma, self.window, meter.prev_end, meter.prev_emitted = after

    def observe_batch(
        self, state, plan, start_ns, durations_ns, count, end_ns, finished, first_tokens, resumed, served
    ) -> None:
        # `observe_repeats` then `observe` (the default) in one call, without building the
        # last step's `StepFeedback`: the simulator calls this after every batch of steps
        if state is not self._state:
            self._resolve(state)
        if self.measured:
            AdmissionPolicy.observe_batch(
                self, state, plan, start_ns, durations_ns, count, end_ns, finished, first_tokens, resumed, served
            )
            return
        decoded = plan.decode > 0
        meter = self.meter
        if count > 1:
            # the steps before the last one (`observe_repeats`)
            repeated = self._repeated
            self._repeated = None
            known = None
            if repeated is not None and repeated[0] is plan and repeated[1] == start_ns:
                known = repeated[3]
                q = repeated[2]  # the queue while the steps ran (arrivals end a batch)
            else:
                q = state.waiting_after_step
            if durations_ns.__class__ is int:
                last = end_ns - durations_ns
                if known is None or known[0] != count - 1:
                    durations_ns = [durations_ns] * (count - 1)
            else:
                last = end_ns - durations_ns[-1]
            if known is not None and known[0] == count - 1:  # repeat_steps computed it
                _, ewma, window, prev_end, prev_emitted = known
            else:
                ewma, window, prev_end, prev_emitted = self._replay(start_ns, durations_ns, count - 1, decoded, q)[1]
        else:
            ewma, window, prev_end, prev_emitted = self.l_ewma, self.window, meter.prev_end, meter.prev_emitted
            last = start_ns
        # the last step, as `observe` takes it
        self.l_ewma, self.window, meter.prev_end, meter.prev_emitted = self._next(
            ewma,
            window,
            prev_end,
            prev_emitted,
            last / NS,
            (end_ns - last) / NS,
            decoded,
            decoded or bool(first_tokens) or bool(resumed),
            len(state.waiting) - state.joining,  # `waiting_after_step`, without a property call
        )

    def _replay(self, start_ns, durations_ns, steps, decoded, q, lo=0, hi=UNLIMITED, need=None, load=0):
        """The feedback of the first `steps` of back-to-back steps of these durations that
        emit no first token, the rule of `_next` (same arithmetic), with `q` requests
        waiting; not in measured mode. Stops after the step whose window leaves
        `lo <= H < hi` or lets a head of `need` tokens of work (active work included) pass
        the horizon test once `load` tokens a step have drained. Returns (steps applied,
        the new (ITL EWMA, window, meter's previous end, meter's previous step emitted)),
        or (steps applied, None) when it stopped. Changes nothing."""
        ewma, window, prev_end, prev_emitted = self.l_ewma, self.window, self.meter.prev_end, self.meter.prev_emitted
        target, alpha, keep = self._target, self.alpha, 1 - self.alpha
        beta, h_min, h_max = self.beta, float(self.H_min), float(self.H_max)
        horizon = self.horizon_steps
        growth = self.delta_tokens * (1 + math.log1p(q)) if q else self.delta_tokens
        t = start_ns
        i = 0
        steady = decoded and target is not None
        while i < steps and not (steady and prev_emitted and prev_end is not None and ewma is not None):
            d_ns = durations_ns[i]
            start = t / NS
            d = d_ns / NS
            end = start + d
            if decoded:
                if prev_emitted and prev_end is not None and end - prev_end > d:
                    d = end - prev_end
                ewma = d if ewma is None else alpha * d + keep * ewma
            if ewma is not None and target is not None and ewma > target:
                window = beta * window
            else:
                window = window + growth
                if window > h_max:
                    window = h_max
            if window < h_min:
                window = h_min
            prev_end, prev_emitted = end, decoded
            t += d_ns
            i += 1
            if window < lo or window >= hi or (need is not None and need - i * load <= horizon * int(window)):
                return i, None
        # The steady state: every step decodes right after one that emitted. A window at
        # its floor while the ITL is over target (or at its ceiling while under) stays put.
        # The window starts within [lo, hi) (the plan's) and each step moves it one way: a
        # cut can only leave it below `lo`, a rise at or above `hi`.
        ns = NS
        for i, d_ns in enumerate(durations_ns[i:steps], i + 1):  # noqa: B020 (i: the steps applied)
            d = d_ns / ns
            end = t / ns + d
            t += d_ns
            gap = end - prev_end
            ewma = alpha * (gap if gap > d else d) + keep * ewma
            prev_end = end
            if ewma > target:
                if window != h_min:
                    window = beta * window
                    if window < h_min:
                        window = h_min
                    if window < lo:
                        return i, None
            elif window != h_max:
                window = window + growth
                if window > h_max:
                    window = h_max
                if window >= hi:
                    return i, None
            if need is not None and need - i * load <= horizon * int(window):
                return i, None
        return i, (ewma, window, prev_end, prev_emitted)

    def _next(self, ewma, window, prev_end, prev_emitted, start, d, decoded, first_or_resumed, q):
        """One step's feedback: the ITL sample (the rule of `ItlMeter.sample`, inlined) and
        the window's update, with `q` requests waiting after the step. Pure: returns the new
        (ITL EWMA, window, meter's previous end, meter's previous step emitted)."""
        target = self.itl_target() if self.measured else self._target
        end = start + d
        if decoded:
            if prev_emitted and prev_end is not None and end - prev_end > d:
                d = end - prev_end
            ewma = d if ewma is None else self.alpha * d + (1 - self.alpha) * ewma
        if ewma is not None and target is not None and ewma > target:
            window = self.beta * window
        else:
            window = window + self.delta_tokens * (1 + math.log1p(q)) if q else window + self.delta_tokens
            if window > self.H_max:
                window = float(self.H_max)
        if window < self.H_min:  # a cut below it, or H_min grew (measured knee)
            window = float(self.H_min)
        return ewma, window, end, decoded or first_or_resumed

    def describe(self) -> dict:
        d = {"name": self.name}
        for k in self.OPTIONS:
            v = self.cost_spec if k == "cost" else getattr(self, k)
            if v is not None:
                d[k] = v if k != "cost" or isinstance(v, str) else getattr(v, "name", str(v))
        if self._key is not None:
            target = self.itl_target()
            l_min = self.l_min_s if self.l_min_s is not None else self._seen_l_min
            # measured mode: B_0 and W_0 are the load knee observed so far (`_set_h_min`)
            knee = self._seen_knee if self.measured else None
            d["resolved"] = {
                "l_min_ms": None if l_min is None else l_min * 1e3,
                "itl_target_ms": None if target is None else target * 1e3,
                "B_0": self.B_0 if self.B_0 is not None else knee,
                "B_max": None if self.B_max >= UNLIMITED else self.B_max,
                "W_0": self.W_0 if self.W_0 is not None else knee,
                "H_min": self.H_min,
                "H_max": self.H_max,
                "delta_tokens": self.delta_tokens,
                "measured": self.measured,
            }
        return d
