"""The step contract, checked for batch policies written outside llmsched (the built-in
ones keep it by construction, and their plans are not checked: the simulator's hot path).

A plan must be a `StepPlan` whose decode count, prefill chunks and preemptions the state
allows: decode at most the decoders it does not preempt; each chunk once, of a waiting
request or a running one in prefill, from 1 token to what the request has left; the step
within `b_max` tokens and `k_max` requests; its admissions and decode tokens within the
free KV slots (after its preemptions); preemptions of running requests only. A plan that
breaks it would hang the simulator or corrupt its state: it is refused in one line."""

from __future__ import annotations

from ..core.checks import as_int
from ..core.errors import ConfigError
from ..core.plan import StepPlan
from ..core.request import DECODE, PREFILL, WAITING, Request
from ..core.state import UNLIMITED, ServerState

__all__ = ["check_plan"]


def check_plan(policy: str, plan, state: ServerState, freed=frozenset()) -> None:
    """Raise ConfigError naming `policy` if `plan` breaks the step contract on `state`."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"batch policy {policy!r} planned a step the server cannot run: {why}")

    if not isinstance(plan, StepPlan):
        raise bad(f"build() returned {type(plan).__name__}, not a StepPlan (Planner.plan() makes one)")
    victims = {}
    for r in plan.preempt:
        if not isinstance(r, Request) or state.running.get(r.id) is not r:
            raise bad(f"it preempts {_name(r)}, which is not running")
        if r.id in victims:
            raise bad(f"it preempts request {r.id} twice")
        victims[r.id] = r
    # (the step serves the first `decode` decoders left once its victims are out)
    decodable = state.n_decoding - sum(1 for r in victims.values() if r.phase == DECODE)
    m = as_int(plan.decode)
    if m is None:
        raise bad(f"it decodes {plan.decode!r} requests; a count must be a whole number (an int)")
    if not 0 <= m <= decodable:
        raise bad(f"it decodes {plan.decode!r} requests; {decodable} can decode")
    plan.decode = m  # (a numpy integer as the simulator's int)
    seen = set()
    tokens = m
    kv_need = m
    for i, entry in enumerate(plan.prefill):
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], Request)):
            raise bad(f"a prefill entry is {entry!r:.80}, not (request, tokens)")
        r, c = entry
        if r.id in seen:
            raise bad(f"it gives request {r.id} two prefill chunks")
        seen.add(r.id)
        if r.id in victims:
            raise bad(f"it prefills request {r.id}, which it preempts")
        if r.phase == WAITING:
            if r not in state.waiting:
                raise bad(f"it prefills request {r.id}, which is not at this server")
            done, need = state.admission_need(r, freed)
            kv_need += need
        elif r.phase == PREFILL and state.running.get(r.id) is r:
            done = r.prefilled
        else:
            raise bad(f"it prefills request {r.id}, which is not waiting nor in prefill")
        left = r.prefill_target - done
        n = as_int(c)
        if n is None:
            raise bad(f"request {r.id} gets a chunk of {c!r} tokens; a count must be a whole number (an int)")
        if not 1 <= n <= left:
            raise bad(f"request {r.id} gets a chunk of {c!r} tokens; it has {left} prefill tokens left")
        if n is not c or type(entry) is not tuple:
            plan.prefill[i] = (r, n)
        tokens += n
    if tokens > state.b_max:
        raise bad(f"the step holds {tokens} tokens, above b_max = {state.b_max}")
    k = m + len(plan.prefill)
    if k > state.k_max:
        raise bad(f"the step holds {k} requests, above k_max = {state.k_max}")
    if state.kv_capacity < UNLIMITED:
        left: dict = {}  # (cached blocks that only victims hold, several of them)
        free = state.kv_capacity - state.kv_used + sum(state.preemption_frees(r, left)[0] for r in victims.values())
        if kv_need > free:
            raise bad(
                f"its decode tokens and admissions need {kv_need} KV slots; {free} are free "
                "(preempt, or admit less: Planner.admit checks it)"
            )


def _name(r) -> str:
    return f"request {r.id}" if isinstance(r, Request) else repr(r)
