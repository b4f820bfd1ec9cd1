"""Open-loop admission policies: the order of the waiting queue and who may join."""

from __future__ import annotations

from ..core.checks import as_int, whole_as_int
from ..core.errors import ConfigError
from ..core.request import Request
from ..core.state import ServerState
from .base import AdmissionPolicy, Planner


class FCFS(AdmissionPolicy):
    """Admit waiting requests in arrival order (ties: request id)."""

    name = "fcfs"
    summary = "first come, first served"


class ShortestPromptFirst(AdmissionPolicy):
    """Admit the waiting request with the shortest prompt first (ties: arrival, id).
    Preempted requests still come back first."""

    name = "spf"
    summary = "shortest prompt first (the 'Priority' baseline of the TWP paper)"

    def waiting_key(self):
        return lambda r: (r.prompt, r.arrival, r.id)


class RunningCap(AdmissionPolicy):
    """Any admission order, with at most `max_running` requests running at once."""

    summary = "cap the number of running requests"

    def __init__(self, inner: AdmissionPolicy, max_running: int):
        n = as_int(whole_as_int(max_running))  # (4.0 as simulate(max_running=4.0) takes it)
        if n is None or n <= 0:
            raise ConfigError(f"max_running must be a positive integer, got {max_running!r}")
        max_running = n
        self.inner = inner
        self.max_running = max_running
        self.name = f"{inner.name}+cap{max_running}"
        self.closed_loop = inner.closed_loop
        self.repeatable = inner.repeatable
        self.repeats = inner.repeats
        self.reads_emitted = inner.reads_emitted
        inner.bind_running_cap(max_running)

    def waiting_key(self):
        return self.inner.waiting_key()

    def token_limit(self, state: ServerState) -> int:
        return self.inner.token_limit(state)

    def batch_limit(self, state: ServerState) -> int:
        return self.inner.batch_limit(state)

    def may_admit(self, state: ServerState, r: Request, planner: Planner) -> bool:
        return state.n_running + planner.n_admitted < self.max_running and self.inner.may_admit(state, r, planner)

    def observe(self, state, feedback) -> None:
        self.inner.observe(state, feedback)

    def repeat_steps(self, state, plan, start_ns, durations_ns) -> int:
        return self.inner.repeat_steps(state, plan, start_ns, durations_ns)

    def observe_repeats(self, state, plan, start_ns, durations_ns) -> None:
        self.inner.observe_repeats(state, plan, start_ns, durations_ns)

    def observe_batch(self, state, plan, *batch) -> None:
        self.inner.observe_batch(state, plan, *batch)

    def went_idle(self) -> None:
        self.inner.went_idle()

    def bind_cost_model(self, cost) -> None:
        self.inner.bind_cost_model(cost)

    def bind_running_cap(self, max_running: int) -> None:
        # an outer cap over this one: the tighter of the two is in force
        self.inner.bind_running_cap(min(max_running, self.max_running))

    def reset(self) -> None:
        self.inner.reset()
        # (the inner policy forgets a cap at reset: it may since have run unwrapped)
        self.inner.bind_running_cap(self.max_running)

    def describe(self) -> dict:
        return {**self.inner.describe(), "max_running": self.max_running}
