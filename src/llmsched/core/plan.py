"""A step plan: what one GPU step computes, as returned by a policy."""

from __future__ import annotations

from .request import Request


class StepPlan:
    """The work of one step.

    - `decode`: the first `decode` decoders in decode order (arrival, then id) each get
      one decode token.
    - `prefill`: `(request, tokens)` prefill chunks in plan order; a request still
      waiting is admitted by the step.
    - `preempt`: running requests evicted before the step (their KV is freed and they
      are recomputed later, as vLLM does).
    - `decode_first`: whether the decode tokens come before the prefill chunks in the
      step's entry order (a presentation and packing order, not a cost difference).
    - `decode_room`: the KV slots the plan needed free for decode tokens, below which it
      would have preempted (the planner reserves one per decoder the step could serve,
      which may be more than `decode`); None means `decode`.
    - `ignores_waiting`: requests that arrive after the plan's first step begins leave it
      unchanged (the policy built it without reading the waiting queue, as the budget was
      spent first, or `repeats_admission`): a driver need not cut its batch at an arrival.
    - `repeats_admission`: the plan admits one request whose chunk spends the rest of the
      budget and not its whole prompt; the plan of the next step is the same (that request
      then a running prefill) and reads no queue, so the plan repeats despite admitting.
    """

    __slots__ = (
        "decode",
        "prefill",
        "preempt",
        "decode_first",
        "decode_room",
        "ignores_waiting",
        "repeats_admission",
    )

    def __init__(
        self,
        decode: int = 0,
        prefill: list[tuple[Request, int]] | None = None,
        preempt: list[Request] | None = None,
        decode_first: bool = True,
        decode_room: int | None = None,
    ):
        self.decode = decode
        self.prefill = prefill if prefill is not None else []
        self.preempt = preempt if preempt is not None else []
        self.decode_first = decode_first
        self.decode_room = decode if decode_room is None else decode_room
        self.ignores_waiting = False
        self.repeats_admission = False

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    @property
    def tokens(self) -> int:
        """Token load b of the step."""
        return self.decode + self.prefill_tokens

    @property
    def batch_size(self) -> int:
        """Distinct requests k in the step."""
        return self.decode + len(self.prefill)

    def is_empty(self) -> bool:
        return self.decode == 0 and not self.prefill

    def __repr__(self) -> str:
        chunks = ", ".join(f"{r.id}:p{n}" for r, n in self.prefill)
        return f"StepPlan(decode={self.decode}, prefill=[{chunks}], preempt={[r.id for r in self.preempt]})"


class StepFeedback:
    """What a closed-loop policy learns after a step: its duration, its plan, and the
    tokens each request emitted (`emitted()` lists them on demand)."""

    __slots__ = ("start", "duration", "plan", "finished", "first_tokens", "resumed", "_decoded")

    def __init__(
        self,
        start: float,
        duration: float,
        plan: StepPlan,
        finished: list[Request],
        first_tokens: list[Request],
        decoded,
        resumed: list[Request] = (),
    ):
        self.start = start  # seconds
        self.duration = duration  # seconds, observed or predicted
        self.plan = plan
        self.finished = finished  # requests that completed in this step
        self.first_tokens = first_tokens  # requests whose first prefill completed (token 1)
        self.resumed = resumed  # requests whose recompute after a preemption completed
        self._decoded = decoded  # callable -> the decoders served by the step

    @property
    def decode_tokens(self) -> int:
        return self.plan.decode

    def emitted(self) -> list[tuple[Request, int]]:
        """(request, tokens emitted) for every request that emitted a token in the step."""
        out = [(r, 1) for r in self._decoded()]
        out.extend((r, 1) for r in self.first_tokens)
        out.extend((r, 1) for r in self.resumed)
        return out
