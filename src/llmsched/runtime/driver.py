"""The one step loop of every online driver: plan -> execute -> account -> feedback.

`StepDriver.step()` asks the scheduler for a plan, applies it to the `ServerState`
(preemptions, admissions), hands the batch to an `Executor` (the real model, or a cost
model on a clock), applies the computed tokens, runs every emitted token through the
request's stop checker (`runtime.output.Sequence`), finishes requests that stopped early
and reports the step to closed-loop policies. The PyTorch engine and the virtual GPU are
`StepDriver`s with different executors; the offline simulator keeps a specialised loop
for speed (it skips repeated steps) over the same `ServerState` accounting, and a test
holds the two to the same steps.

Subclasses supply the executor and may override the hooks `_begin` (when the step
starts and which plan runs), `_release` (free a request's resources: KV blocks),
`_piece` (the text of an emitted token), `_on_token` and `_after_step`.
"""

from __future__ import annotations

from typing import Protocol

from ..core.engine_api import RequestOutput
from ..core.errors import ConfigError
from ..core.plan import StepFeedback, StepPlan
from ..core.request import DONE, NS, Request
from ..core.state import ServerState
from ..policies.base import Scheduler
from .output import PieceFn, Sequence


class StepBatch:
    """One planned step as an executor receives it."""

    __slots__ = (
        "plan",
        "start_ns",
        "prefill_tokens",
        "decode_context",
        "chunks",
        "sampled",
        "decoders",
        "prefill",
        "samplers",
    )

    def __init__(
        self,
        plan: StepPlan,
        start_ns: int,
        prefill_tokens: int,
        decode_context: int,
        chunks: list[tuple[int, int]],
        sampled: int,
        decoders: list[Request],
        prefill: list[tuple[Request, int, int, bool]],
        samplers: list[Request],
    ):
        self.plan = plan
        self.start_ns = start_ns
        self.prefill_tokens = prefill_tokens  # cost-model view: tokens, context, chunks
        self.decode_context = decode_context
        self.chunks = chunks
        self.sampled = sampled
        self.decoders = decoders  # served decoders, in decode order
        self.prefill = prefill  # (request, first position, tokens, completes prompt)
        self.samplers = samplers  # requests that emit a token: decoders, then completed prompts

    @property
    def cost_args(self) -> tuple:
        """The arguments of `CostModel.step_time` for this step."""
        return (self.prefill_tokens, self.plan.decode, self.decode_context, self.chunks, self.sampled)


class Executor(Protocol):
    def execute(self, batch: StepBatch) -> tuple[int, list[int]]:
        """Compute the step; returns (its end on the driver's clock in ns, the token id each
        of `batch.samplers` emitted)."""


class StepDriver:
    """An `EngineCore` (see `core.engine_api`) whose steps are one scheduler's plans.

    Keeps the requests by id, the counters `/metrics` reads, and the plan and duration
    of the last step (`last_plan`, `last_step_s`, `last_batch`)."""

    executor: Executor

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        scheduler.reset()  # a server starts: nothing an earlier run taught the policies carries over
        self.state: ServerState = scheduler.new_state()
        self._requests: dict[str, Request] = {}
        self._next_id = 0
        self.last_plan: StepPlan | None = None
        self.last_batch: StepBatch | None = None
        self.last_step_s = 0.0
        self._planned_nothing = False
        self.steps = 0
        self.busy_ns = 0
        self.preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0
        self.aborted_total = 0

    # ---- clock and hooks (subclasses) ------------------------------------------------
    def now_ns(self) -> int:
        raise NotImplementedError

    def _begin(self) -> tuple[StepPlan, int] | None:
        """The plan of the next step and its start (ns), or None when nothing can run."""
        plan = self.scheduler.plan(self.state)
        self.last_plan = plan
        if plan.is_empty():
            return None
        return plan, max(self.state.now, self.now_ns())

    def _release(self, r: Request) -> None:
        """Free what a request holds besides its state (KV blocks); it was preempted,
        finished or aborted."""

    def _piece(self, seq: Sequence, tok: int) -> PieceFn | None:
        """How to get the text of token `tok` of `seq` (None: no text)."""
        return None

    def _after_step(self, end: int) -> None:
        """The step ended at `end` (ns) and is accounted."""

    def _on_token(self, seq: Sequence, tok: int, t: float) -> None:
        """A token was emitted at `t` seconds (before its stop check)."""

    # ---- requests --------------------------------------------------------------------
    def _register(self, seq: Sequence, arrival_ns: int) -> Request:
        """Track a new request; returns its `Request` (not yet in the state)."""
        rid = seq.request_id
        if rid in self._requests:
            raise ConfigError(f"request id {rid!r} is already in use")
        r = Request(self._next_id, arrival_ns, seq.prompt_len, seq.params.max_tokens, payload=seq)
        self._next_id += 1
        seq.req = r
        self._requests[rid] = r
        return r

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def unfinished_ids(self) -> list[str]:
        return list(self._requests)

    def stalled(self) -> bool:
        """Whether the last `step()` planned nothing although requests are unfinished and
        nothing but the policy could start a step (no arrival due). A pure policy plans the
        same again until a request arrives or is aborted: a server would wait forever."""
        return self._planned_nothing and bool(self._requests)

    def abort_request(self, request_id: str) -> None:
        """Drop a request wherever it is and free its resources."""
        r = self._requests.pop(request_id, None)
        if r is None:
            return
        seq = r.payload
        if seq.finish_reason is None:
            seq.finish_reason = "abort"
        self._drop(r)
        self._release(r)
        self.aborted_total += 1

    def _drop(self, r: Request) -> None:
        if r.phase != DONE:
            self.state.finish(r, max(self.state.now, self.now_ns()))

    def sequence(self, request_id: str) -> Sequence | None:
        r = self._requests.get(request_id)
        return r.payload if r is not None else None

    # ---- the step --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Plan, execute and account one step; returns one output per emitted token."""
        begun = self._begin()
        self._planned_nothing = begun is None
        if begun is None:
            return []
        plan, start = begun
        st = self.state
        pf, dctx, chunks, sampled = st.begin_step(plan, start)
        for r in plan.preempt:
            self._release(r)
        self.preemptions += len(plan.preempt)
        decoders = st.decoders[: plan.decode]
        prefill = []
        samplers = list(decoders)
        for r, n in plan.prefill:
            last = r.prefilled + n == r.prefill_target
            prefill.append((r, r.prefilled, n, last))
            if last:
                samplers.append(r)
        batch = StepBatch(plan, start, pf, dctx, chunks, sampled, decoders, prefill, samplers)
        self.last_batch = batch
        end, tokens = self.executor.execute(batch)
        if end <= start:
            raise ConfigError("a step must take a positive time")
        st.end_step(plan, end)
        outputs, stopped = self._emit(samplers, tokens, end)
        d = end - start
        self.steps += 1
        self.busy_ns += d
        self.last_step_s = d / NS
        if self.scheduler.closed_loop:
            finished = st.finished + stopped if stopped else st.finished
            self.scheduler.observe(
                st,
                StepFeedback(
                    start / NS,
                    d / NS,
                    plan,
                    finished,
                    st.first_tokens,
                    lambda: decoders,
                    resumed=[r for r, _ in st.resumed],
                ),
            )
        self._after_step(end)
        return outputs

    def _emit(self, samplers: list[Request], tokens: list[int], end: int) -> tuple[list[RequestOutput], list[Request]]:
        st = self.state
        t_end = end / NS
        outputs = []
        stopped = []
        for r, tok in zip(samplers, tokens):
            seq = r.payload
            if seq.finished:  # aborted while its step ran
                continue
            if seq.n_out == 0:
                self.prompt_tokens_total += r.prompt
            self._on_token(seq, tok, t_end)
            out = seq.accept(tok, r.phase == DONE, self._piece(seq, tok))
            if out.finished:
                out.timings = (r.arrival / NS, r.first_scheduled / NS, r.first_token / NS, t_end)
                if r.phase != DONE:
                    st.finish(r, end)
                    stopped.append(r)
                self._release(r)
                self._requests.pop(seq.request_id, None)
                self.finished_total += 1
            outputs.append(out)
        self.generation_tokens_total += len(outputs)
        return outputs, stopped

    # ---- metrics ---------------------------------------------------------------------
    def counters(self) -> dict:
        st = self.state
        kv = self.scheduler.constraints.kv_capacity
        out = {
            "waiting": len(st.waiting),
            "running": st.n_running,
            "decoding": st.n_decoding,
            "kv_used_tokens": st.kv_used,
            "kv_capacity_tokens": kv,
            "kv_usage": (st.kv_used / kv) if kv else 0.0,
            "backlog_tokens": st.backlog_tokens,
            "unfinished": len(self._requests),
            "steps": self.steps,
            "busy_s": self.busy_ns / NS,
            "preemptions": self.preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "finished_total": self.finished_total,
            "aborted_total": self.aborted_total,
            "scheduler": self.scheduler.name,
        }
        if st.prefix is not None:  # hit rates, prefill tokens saved, evictions (for /metrics)
            out["prefix_cache"] = st.prefix_stats()
        return out


__all__ = ["StepDriver", "StepBatch", "Executor", "NS"]
