"""The policy contract.

A `Scheduler` pairs a batch policy (what one step computes) with an admission policy
(the order of the waiting queue, which waiting requests may join, and optional per-step
limits). `plan(state)` reads a `ServerState` and returns a `StepPlan`; it changes
nothing. After the step, `observe(state, feedback)` reports the observed duration and
the tokens emitted, which closed-loop admission policies use. The simulator and the
engine call both the same way (the simulator through `observe_batch`, one call per batch
of repeated steps, which by default calls `observe_repeats` and `observe`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.checks import as_int, as_real, whole_as_int
from ..core.constraints import Constraints
from ..core.errors import ConfigError
from ..core.plan import StepFeedback, StepPlan
from ..core.request import DECODE, NS, PREFILL, WAITING, Request
from ..core.state import UNLIMITED, ServerState
from .check import check_plan


class AdmissionPolicy:
    """Default: first come, first served, no extra limits."""

    name = "fcfs"
    summary = "admit waiting requests in arrival order"
    closed_loop = False  # True: needs `observe` after every step
    reads_emitted = True  # False: never calls `feedback.emitted()` (drivers skip recording it)
    # An open-loop policy's limits and admission tests give the same answer while only the
    # running requests' token counts change (no arrival, completion or admission): the
    # simulator may repeat a plan up to the next such event.
    repeatable = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if _built_in(cls):
            return
        # A class written elsewhere (itself or a mixin of its own) may read anything
        # (outstanding tokens, a clock): the fast path would repeat a plan its test would
        # have changed a few steps on.
        per_step = _user_defines(cls, "token_limit", "batch_limit", "may_admit")
        if per_step and not _user_defines(cls, "repeatable"):
            cls.repeatable = False
        # Drivers call `observe` only on closed-loop policies: one that defines it wants it.
        learns = _user_defines(cls, "observe", "observe_batch", "observe_repeats")
        if learns and not _user_defines(cls, "closed_loop"):
            cls.closed_loop = True
        # An inherited `repeat_steps` (TWP's) knows nothing of the overrides.
        if (per_step or learns) and not _user_defines(cls, "repeats"):
            cls.repeats = False

    def waiting_key(self) -> Callable[[Request], tuple] | None:
        """Order of the waiting queue (None: arrival order)."""
        return None

    def token_limit(self, state: ServerState) -> int:
        """An extra cap on the step's token load (below b_max)."""
        return UNLIMITED

    def batch_limit(self, state: ServerState) -> int:
        """An extra cap on the step's batch size (below k_max)."""
        return UNLIMITED

    def may_admit(self, state: ServerState, r: Request, planner: Planner) -> bool:
        """Whether the head of the waiting queue may join the running set now."""
        return True

    def observe(self, state: ServerState, feedback: StepFeedback) -> None:
        pass

    # A closed-loop policy that can tell, from the durations of the coming steps, for how
    # many of them a plan stays the same (TWP) sets this, so that the simulator may still
    # repeat plans (`repeat_steps`, then `observe_batch`, by default `observe_repeats` and
    # `observe`).
    repeats = False

    def repeat_steps(self, state: ServerState, plan: StepPlan, start_ns: int, durations_ns) -> int:
        """How many of the steps (back to back from `start_ns`, of these durations, none
        finishing, starting or resuming a request, no request arriving, and `plan` admitting
        and preempting none, or admitting only as `StepPlan.repeats_admission` says: one
        request whose chunk spent the budget, a running prefill from the next step on)
        `plan` would be planned for in a row, at least 1. The batch policy would repeat the
        plan with an open-loop admission policy; what is left to decide is whether this
        policy's limits and admission tests would change it."""
        return 1

    def observe_repeats(self, state: ServerState, plan: StepPlan, start_ns: int, durations_ns) -> None:
        """The feedback of the first of those steps (the batch may have been cut short by an
        arrival since): exactly what `observe` would have learned from each of them in turn,
        with the waiting queue as it was when they ran. Called after `state` has applied
        the whole batch."""
        raise NotImplementedError

    def observe_batch(
        self,
        state: ServerState,
        plan: StepPlan,
        start_ns: int,
        durations_ns,
        count: int,
        end_ns: int,
        finished: list[Request],
        first_tokens: list[Request],
        resumed: list[Request],
        served: list[Request] | None,
    ) -> None:
        """The feedback of a batch of `count` steps of `plan` back to back from `start_ns`
        (a driver that repeats plans: the simulator), after `state` has applied it:
        `durations_ns` is each step's duration (an int when they are all equal) or their
        list, the last one ends at `end_ns`; `finished`, `first_tokens` and `resumed` are
        the last step's (the steps before it finish, start and resume no request, see
        `repeat_steps`), `served` the decoders each step served (None when the driver did
        not record them: `reads_emitted` is False). Default: `observe_repeats` for the
        steps before the last one, then `observe` for the last one; a policy may compute
        the same more cheaply."""
        last = start_ns
        if count > 1:
            if isinstance(durations_ns, int):
                self.observe_repeats(state, plan, start_ns, [durations_ns] * (count - 1))
                last = end_ns - durations_ns
            else:
                self.observe_repeats(state, plan, start_ns, durations_ns[:-1])
                last = end_ns - durations_ns[-1]
        self.observe(
            state,
            StepFeedback(
                last / NS,
                (end_ns - last) / NS,
                plan,
                finished,
                first_tokens,
                (lambda: served) if served is not None else _not_recorded,
                resumed,
            ),
        )

    def went_idle(self) -> None:
        """The server ran nothing since its last step, and a decoder joins it without a
        prefill (a live migration's hand-over in the serverless runtime): its next step
        is the first of a new run of steps. Default: nothing."""

    def bind_cost_model(self, cost) -> None:
        """The driver's step cost model, for policies that reason about step times."""

    def bind_running_cap(self, max_running: int) -> None:
        """A wrapper (`RunningCap`) lets at most `max_running` requests run at once: a
        policy that derives a cap on the running requests (TWP's `B_max`, DynamicBatch's
        `C_max`) keeps it at most this, so that `describe` reports the cap in force.
        The wrapper binds it again at every `reset`, after the policy's own (which may
        forget it: a policy run again without the wrapper is uncapped). Default: nothing."""

    def reset(self) -> None:
        """A run starts: forget whatever earlier runs taught the policy (a window, a cap,
        measured step times), so that a scheduler used again gives the same run as a
        fresh one. Keeps the options and the bound cost model. Every driver calls it
        (through `Scheduler.reset`) before its first step. Default: nothing."""

    def describe(self) -> dict:
        return {"name": self.name}


def _not_recorded():
    raise RuntimeError("this policy set reads_emitted = False: the simulator did not record the emitted tokens")


_NOBODY = frozenset()


def _whole_limit(admission: AdmissionPolicy, hook: str, limit, cap: int) -> int:
    """An admission policy's limit (its `hook`'s answer) that is no int, as an int at most
    `cap`; the planner calls this only then (an int, the common case, costs one type test
    per plan). One that is no whole number (a string option passed on,
    `admission_options={"limit": "2"}`) failed inside the planner ("'<' not supported
    between 'str' and 'int'"), or planned 2.5 requests."""
    real = as_real(limit)
    if real is not None and real >= cap:  # (math.inf for no limit, as min() took it)
        return cap
    whole = None if real is None else as_int(whole_as_int(real))
    if whole is None:
        raise ConfigError(f"admission policy {admission.name!r}: {hook} returned {limit!r:.40}, not a whole number")
    return whole


class AdmissionHooks:
    """Which of the admission policy's per-step methods its class overrides: the planner
    neither calls an inherited default (no limit, admit anyone) nor builds its arguments.
    Found once per scheduler, from the class; an override is still looked up on the
    instance at every call (a wrapper set on the instance is called)."""

    __slots__ = ("token_limit", "batch_limit", "may_admit")

    def __init__(self, admission: AdmissionPolicy):
        cls = type(admission)
        self.token_limit = cls.token_limit is not AdmissionPolicy.token_limit
        self.batch_limit = cls.batch_limit is not AdmissionPolicy.batch_limit
        self.may_admit = cls.may_admit is not AdmissionPolicy.may_admit


class Planner:
    """Budget bookkeeping while a batch policy builds one plan.

    On creation it makes room in the KV cache for one decode token of every decoder the
    step could serve, preempting the most recently admitted running requests if needed, and keeps that
    room reserved so admissions cannot take it."""

    __slots__ = (
        "state",
        "admission",
        "tokens",
        "slots",
        "kv",
        "decodable",
        "decode",
        "prefill",
        "preempt",
        "n_admitted",
        "admitted_tokens",
        "decode_room",
        "saw_waiting",
        "short_admission",
        "_may_admit",
        "_victims",
        "_freed",
    )

    def __init__(self, state: ServerState, admission: AdmissionPolicy, hooks: AdmissionHooks | None = None):
        if hooks is None:
            hooks = AdmissionHooks(admission)
        self.state = state
        self.admission = admission
        self._may_admit = hooks.may_admit
        tokens = state.b_max
        if hooks.token_limit:
            limit = admission.token_limit(state)
            if type(limit) is not int:
                limit = _whole_limit(admission, "token_limit", limit, tokens)
            if limit < tokens:
                tokens = limit
        slots = state.k_max
        if hooks.batch_limit:
            limit = admission.batch_limit(state)
            if type(limit) is not int:
                limit = _whole_limit(admission, "batch_limit", limit, slots)
            if limit < slots:
                slots = limit
        self.tokens = tokens
        self.slots = slots
        self.decode = 0
        self.prefill: list[tuple[Request, int]] = []
        self.preempt: list[Request] = []
        self.n_admitted = 0
        self.admitted_tokens = 0
        self.saw_waiting = False  # whether the policy read the waiting queue (admit, admit_waiting)
        self.short_admission = False  # whether the last admission's chunk left part of its prompt
        self._victims: set[int] | frozenset = _NOBODY
        self._freed: set | frozenset = _NOBODY  # prefix caching: cached runs only the victims hold
        self.decodable = need = len(state.decoders)
        if tokens < need:
            need = tokens
        if slots < need:
            need = slots
        kv = state.kv_capacity - state.kv_used
        if kv < need:
            kv = self._preempt_for_decodes(kv, need)
            need = min(self.decodable, tokens, slots)
        self.kv = kv - need
        self.decode_room = need

    def _preempt_for_decodes(self, kv: int, need: int) -> int:
        """Preempt the most recently admitted running requests until `kv` free slots cover the decode room;
        returns the free slots then."""
        state = self.state
        self._victims = set()
        self._freed = freed = set()
        left: dict = {}  # prefix caching: shared runs -> holders not preempted yet
        for victim in reversed(list(state.running.values())):
            self.preempt.append(victim)
            self._victims.add(victim.id)
            slots, runs = state.preemption_frees(victim, left)
            kv += slots
            freed.update(runs)
            if victim.phase == DECODE:
                self.decodable -= 1
            need = min(self.decodable, self.tokens, self.slots)
            if kv >= need:
                break
        return kv

    def decoders_before(self, key: tuple) -> int:
        """How many of the step's decoders (this step's preemption victims left out) come
        before `key` in decode order."""
        n = self.state.decoders_before(key)
        for victim in self.preempt:
            if victim.phase == DECODE and victim.key < key:
                n -= 1
        return n

    def take_decodes(self, limit: int = UNLIMITED) -> int:
        """Serve up to `limit` more decoders (in decode order); returns how many."""
        n = self.decodable - self.decode
        tokens, slots = self.tokens, self.slots
        if tokens < n:
            n = tokens
        if slots < n:
            n = slots
        if limit < n:
            n = limit
        if n <= 0:
            return 0
        self.decode += n
        self.tokens = tokens - n
        self.slots = slots - n
        return n

    def take_prefill(self, r: Request, whole: bool = False) -> bool:
        """Give a running request in prefill a chunk (all of it if `whole`)."""
        tokens = self.tokens
        if tokens <= 0 or self.slots <= 0 or r.id in self._victims:
            return False
        if r.phase == WAITING:  # (past the admission policy, a running cap and the KV check)
            raise ConfigError(
                f"a batch policy gave waiting request {r.id} a prefill chunk with take_prefill, which serves "
                "running requests: admit it with Planner.admit (or admit_waiting)"
            )
        left = r.prefill_target - r.prefilled
        n = tokens if tokens < left else left
        if whole and n < left:
            return False
        self.prefill.append((r, n))
        self.tokens = tokens - n
        self.slots -= 1
        return True

    def take_running_prefills(self, whole: bool = False) -> None:
        """Prefill chunks for running requests, oldest admitted first."""
        prefilling = self.state.prefilling
        if not prefilling:
            return
        take_prefill = self.take_prefill
        for r in prefilling:
            if self.tokens <= 0 or self.slots <= 0:
                return
            take_prefill(r, whole)

    def admit(self, r: Request, whole: bool = False) -> bool:
        """Admit waiting request `r` with a first chunk, if budget, KV and the admission
        policy allow. `whole`: only if its whole prefill fits in the step."""
        self.saw_waiting = True
        if self.preempt:
            # a step that preempts admits no one (vLLM V1's rule): the victims' slots are
            # theirs when they come back, at the head of the queue, not a newer request's
            return False
        state = self.state
        if state.prefix is None:
            done, need = r.prefilled, r.prefill_target  # a prompt may arrive with part of its KV computed
        else:
            done, need = state.admission_need(r, self._freed)  # its cached prefix is not computed again
        tokens = self.tokens
        if tokens <= 0 or self.slots <= 0 or self.kv < need:
            return False
        left = r.prefill_target - done
        n = tokens if tokens < left else left
        if whole and n < left:
            return False
        if self._may_admit and not self.admission.may_admit(state, r, self):
            return False
        self.prefill.append((r, n))
        self.tokens = tokens - n
        self.slots -= 1
        self.kv -= need
        self.short_admission = n < left
        self.n_admitted += 1
        self.admitted_tokens += r.prefill_target
        return True

    def prefill_left(self, r: Request) -> int:
        """Prefill tokens `r` still needs (for a waiting request, net of its cached prefix)."""
        if r.phase == WAITING and self.state.prefix is not None:
            return r.prefill_target - self.state.admission_need(r, self._freed)[0]
        return r.prefill_target - r.prefilled

    def admit_waiting(self, whole: bool = False) -> None:
        """Admit from the head of the waiting queue until one does not fit (no overtaking)."""
        if self.tokens <= 0 or self.slots <= 0:
            return  # no room: the head would be refused (under load, most steps)
        self.saw_waiting = True
        admit = self.admit
        for r in self.state.waiting:
            if not admit(r, whole):
                return

    def plan(self, decode_first: bool = True) -> StepPlan:
        return StepPlan(self.decode, self.prefill, self.preempt, decode_first, self.decode_room)


def _built_in(cls: type) -> bool:
    return cls.__module__.startswith("llmsched.policies.")


def _user_defines(cls: type, *names: str) -> bool:
    """Whether one of `names` resolves, through `cls`'s MRO, to a class written outside
    llmsched (the class itself or a mixin of the user's), not to a built-in policy's."""
    for name in names:
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is not None and owner is not object and not _built_in(owner):
            return True
    return False


def check_defines_build(policy) -> None:
    """ConfigError unless a BatchPolicy subclass (or an instance of one) has a `build` of
    its own (the base's would fail at the first step)."""
    build = getattr(policy, "build", None)
    if getattr(build, "__func__", build) is BatchPolicy.build or not callable(build):
        raise _no_build(policy if isinstance(policy, type) else type(policy))


def _no_build(cls: type) -> ConfigError:
    return ConfigError(
        f"batch policy class {cls.__name__!r} must define build(self, planner), which returns the step's "
        "StepPlan (planner.plan()): BatchPolicy has none to inherit"
    )


class BatchPolicy:
    """Decides the composition of one step. Subclasses implement `build(planner)`.
    A policy written outside llmsched has its plans checked against the step contract
    (`policies.check`), and is not `repeatable` unless its class says so."""

    name = ""
    summary = ""
    work_conserving = False
    #: stable wherever the workload lies inside the stability region without filling every
    #: step (adaptive's max-weight choice of the region's vertex steps)
    region_stable = False
    # Given the same requests with only token counts changed (no arrival, completion,
    # admission or chunk boundary), the plan repeats: the simulator may skip ahead.
    repeatable = True
    # `build` reads the waiting queue only through `Planner.admit` and `admit_waiting`, so
    # a plan built without them ignores the queue (`StepPlan.ignores_waiting`).
    waiting_via_planner = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not _built_in(cls) and _user_defines(cls, "build") and not _user_defines(cls, "repeatable"):
            # the fast path repeats a plan while the state's counts alone change: a plan
            # that depends on anything else (the policy's own state) would be repeated wrong
            cls.repeatable = False

    def build(self, p: Planner) -> StepPlan:
        raise _no_build(type(self))

    def bind_cost_model(self, cost) -> None:
        """The driver's step cost model, for policies that reason about step times."""

    def bind_constraints(self, constraints) -> None:
        """The server's constraints, once the scheduler is built: a policy that
        precomputes something per server does it here, not on the first step."""

    def reset(self) -> None:
        """A run starts: forget what earlier runs taught the policy (as
        `AdmissionPolicy.reset`). Default: nothing."""


class Scheduler:
    """A batch policy with an admission policy, under the server's constraints."""

    def __init__(
        self, batch: BatchPolicy, admission: AdmissionPolicy | None = None, constraints: Constraints | None = None
    ):
        check_defines_build(batch)  # now, not at the first step
        self.batch = batch
        self.admission = admission or AdmissionPolicy()
        self.constraints = constraints or Constraints()
        batch.bind_constraints(self.constraints)
        repeatable = batch.repeatable and self.admission.repeatable
        self.repeatable = repeatable and not self.admission.closed_loop
        self.closed_loop = self.admission.closed_loop
        self.repeats_closed_loop = repeatable and self.closed_loop and self.admission.repeats
        self.reads_emitted = self.admission.reads_emitted
        self._hooks = hooks = AdmissionHooks(self.admission)
        # plans may ignore the waiting queue: the batch policy reads it only through the
        # planner and the admission policy sets no limit (a limit may depend on the queue)
        self._marks_blind = (
            batch.waiting_via_planner and not self.closed_loop and not hooks.token_limit and not hooks.batch_limit
        )
        # a closed-loop policy that repeats plans (TWP) tells from the coming steps how long
        # an admission's plan lasts, its token limit moving with the feedback
        self._marks_admission = batch.waiting_via_planner and self.repeats_closed_loop and not hooks.batch_limit
        self._build = batch.build if _built_in(type(batch)) else self._checked_build

    def new_state(self) -> ServerState:
        return ServerState(self.constraints, self.admission.waiting_key())

    def plan(self, state: ServerState) -> StepPlan:
        p = Planner(state, self.admission, self._hooks)
        plan = self._build(p)
        if self._marks_blind:
            if not p.saw_waiting:
                plan.ignores_waiting = True
            elif p.n_admitted == 1 and p.short_admission:
                # the admitted prompt took the rest of the budget: as a running prefill it
                # takes the same chunk next step, and the queue is not read
                plan.ignores_waiting = plan.repeats_admission = True
        elif self._marks_admission and p.n_admitted == 1 and p.short_admission:
            plan.repeats_admission = True  # (arrivals still cut it: the queue moves the limit)
        return plan

    def _checked_build(self, p: Planner) -> StepPlan:
        """The plan of a policy written elsewhere, checked against the step contract."""
        plan = self.batch.build(p)
        check_plan(self.batch.name, plan, p.state, p._freed)
        return plan

    def observe(self, state: ServerState, feedback: StepFeedback) -> None:
        self.admission.observe(state, feedback)

    def repeat_steps(self, state: ServerState, plan: StepPlan, start_ns: int, durations_ns) -> int:
        return self.admission.repeat_steps(state, plan, start_ns, durations_ns)

    def observe_repeats(self, state: ServerState, plan: StepPlan, start_ns: int, durations_ns) -> None:
        self.admission.observe_repeats(state, plan, start_ns, durations_ns)

    def observe_batch(self, state: ServerState, plan: StepPlan, *batch) -> None:
        """`AdmissionPolicy.observe_batch` (the same arguments)."""
        self.admission.observe_batch(state, plan, *batch)

    def went_idle(self) -> None:
        """`AdmissionPolicy.went_idle`."""
        self.admission.went_idle()

    def reset(self) -> None:
        """A run starts (every driver calls this before its first step: the simulator's
        servers, serverless instances and network replicas, the virtual GPU and the
        engine): both policies forget what earlier runs taught them (`reset`), so that a
        scheduler used for a second run gives what a fresh one would."""
        self.batch.reset()
        self.admission.reset()

    def bind_cost_model(self, cost) -> None:
        """Tell the policies which cost model times the steps (the simulator's, the
        virtual GPU's, or a profile of the real engine)."""
        self.batch.bind_cost_model(cost)
        self.admission.bind_cost_model(cost)

    @property
    def name(self) -> str:
        if self.admission.name == "fcfs":
            return self.batch.name
        return f"{self.batch.name}+{self.admission.name}"

    def describe(self) -> dict:
        c = self.constraints
        d = {
            "batch_policy": self.batch.name,
            "admission": self.admission.describe(),
            "b_max": c.b_max,
            "k_max": c.k_max,
            "kv_capacity_tokens": c.kv_capacity,
        }
        if c.prefix_block_size:
            d["prefix_caching_block_size"] = c.prefix_block_size
        return d


__all__ = ["AdmissionPolicy", "AdmissionHooks", "Planner", "BatchPolicy", "Scheduler", "PREFILL", "DECODE"]
