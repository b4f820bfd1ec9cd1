"""Drives an `EngineCore` from an asyncio server.

One background thread owns the engine core (which is not thread-safe): it takes new
requests and aborts from an inbox, runs `step()` in a loop while there is work, and hands
each step's outputs to the event loop in one `loop.call_soon_threadsafe` call. On the
loop, `_dispatch` routes every output to its request's `RequestStream` and updates the
metrics. Nothing else touches the core.

Admission control, on the loop (so it is exact, not a step late): a request is *queued*
from its acceptance until its first token (or its end). `max_queued_requests` and
`max_queued_tokens` (prompt tokens) bound the queue; a request over the bound is refused
(`Overloaded`, a 429) instead of waiting in an unbounded queue. While draining for a
shutdown, new requests are refused (`Draining`, a 503) and the running ones finish.

If the batch policy plans nothing `STALL_STEPS` times in a row while requests are
unfinished and nothing else can start a step (no request added or aborted, no arrival
due, no policy job in flight), the requests end with a 500 naming the policy (a pure
policy would plan nothing forever) and the server keeps serving.

If the driver thread dies (an exception outside a step: `stats()`, `has_unfinished_requests()`),
the engine is marked unhealthy (`/health` turns 503), every pending request ends with an
explicit 503 error and new ones are refused (`EngineDead`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Sequence

from ..core.engine_api import EngineCore, RequestOutput, SamplingParams
from ..core.errors import ConfigError
from .metrics import ServerMetrics

log = logging.getLogger("llmsched.server")


# what clients are told; the exception's text goes to the log only
INTERNAL = "internal error; the server log has the details"
STEP_FAILED = "the engine failed while running this request; the server log has the details"
ENGINE_DEAD = "the engine failed and stopped serving; the server log has the details"

# empty plans in a row, no request added or aborted between them, before the requests are
# failed: the offline `LLM.generate`'s patience, and more than a policy that waits one step
STALL_STEPS = 3


class Overloaded(Exception):
    pass


class Draining(Exception):
    pass


class EngineDead(RuntimeError):
    """The engine's driver thread has died: no request can be served any more."""


class RequestStream:
    """The outputs of one request, produced on the loop, consumed by its handler."""

    __slots__ = (
        "rid",
        "prompt_tokens",
        "arrival",
        "first_at",
        "last_at",
        "queued",
        "_buf",
        "_waiter",
        "finished",
        "_loop",
        "score_only",
    )

    def __init__(self, rid: str, prompt_tokens: int, arrival: float, loop, score_only: bool = False):
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        # max_tokens 0: the one token the engine samples is dropped, so not counted as generated
        self.score_only = score_only
        self.arrival = arrival
        self.first_at = 0.0
        self.last_at = 0.0
        self.queued = True
        self._buf: list[RequestOutput] = []
        self._waiter: asyncio.Future | None = None
        self.finished = False
        self._loop = loop

    def generated(self, tokens: int) -> int:
        """`tokens` the engine generated for this request, as the metrics count them: none
        for a score-only request (max_tokens 0), whose one sampled token is dropped."""
        return 0 if self.score_only else tokens

    def _put(self, out: RequestOutput) -> None:
        self._buf.append(out)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self) -> list[RequestOutput]:
        """All outputs available now (waits for at least one)."""
        while not self._buf:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        buf = self._buf
        self._buf = []
        return buf


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        metrics: ServerMetrics,
        *,
        max_queued_requests: int | None = None,
        max_queued_tokens: int | None = None,
    ):
        self.core = core
        self.metrics = metrics
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.queued_requests = 0
        self.queued_tokens = 0
        self.streams: dict[str, RequestStream] = {}
        self.snapshot: dict = {}
        self.draining = False
        self.healthy = True
        self.last_error: str | None = None
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None  # created in start(), on the loop
        self._seq = 0

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver thread; call from the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        try:
            self.snapshot = self.core.stats()
        except Exception:  # noqa: BLE001
            self.snapshot = {}
        self._thread = threading.Thread(target=self._run, name="llmsched-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        interrupt = getattr(self.core, "interrupt", None)  # the virtual GPU's wait for a step's end
        if interrupt is not None:
            interrupt()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        close = getattr(self.core, "close", None)  # the engine's worker for adaptive's refits
        if close is not None:
            close()

    async def drain(self, timeout: float | None) -> bool:
        """Refuse new requests and wait until the accepted ones have ended. Returns True if
        they all did within `timeout`; otherwise the rest are aborted with an error."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            for rid in list(self.streams):
                self.fail(
                    rid,
                    "the server shut down before the request completed",
                    503,
                    "service_unavailable",
                    "server_shutting_down",
                )
            return False

    # ---- requests (event loop) ---------------------------------------------------------
    def new_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq:x}{time.monotonic_ns() & 0xFFFFFF:06x}"

    def admit(self, requests: int, prompt_tokens: int) -> None:
        """Raises Draining, EngineDead or Overloaded unless `requests` more requests with
        `prompt_tokens` tokens in all can be queued now. A client's request of several
        choices is checked whole first, so it is accepted or refused as one (no choice is
        queued, then aborted)."""
        if self.draining:
            self.metrics.rejected["draining"] += 1
            raise Draining()
        if not self.healthy:
            raise EngineDead(ENGINE_DEAD)
        mq, mt = self.max_queued_requests, self.max_queued_tokens
        if (mq is not None and self.queued_requests + requests > mq) or (
            mt is not None and self.queued_tokens + prompt_tokens > mt
        ):
            self.metrics.rejected["overloaded"] += 1
            raise Overloaded()

    def submit(
        self, rid: str, prompt_ids: Sequence[int], params: SamplingParams, score_only: bool = False
    ) -> RequestStream:
        """Accept a request (raises Draining or Overloaded) and queue it for the engine.
        `score_only`: the client asked for no token (max_tokens 0); the one sampled is not
        counted in the metrics."""
        n = len(prompt_ids)
        self.admit(1, n)
        now = time.monotonic()
        s = RequestStream(rid, n, now, self._loop, score_only)
        self.streams[rid] = s
        self._idle.clear()
        self.queued_requests += 1
        self.queued_tokens += n
        m = self.metrics
        if self.queued_requests > m.max_queued_requests_seen:
            m.max_queued_requests_seen = self.queued_requests
        if self.queued_tokens > m.max_queued_tokens_seen:
            m.max_queued_tokens_seen = self.queued_tokens
        self._inbox.append(("add", rid, prompt_ids, params, time.time()))
        self._wake.set()
        return s

    def abort(self, rid: str) -> None:
        """The client went away: drop the request and free its KV cache."""
        s = self.streams.get(rid)
        if s is None:
            return
        s._put(RequestOutput(rid, [], finished=True, finish_reason="abort"))
        self._end(s, "abort")
        self._inbox.append(("abort", rid))
        self._wake.set()

    def fail(
        self, rid: str, message: str, status: int = 500, error_type: str | None = None, code: str | None = None
    ) -> None:
        s = self.streams.get(rid)
        if s is None:
            return
        s._put(_error_output(rid, message, status, error_type, code))
        self._end(s, "error")
        self._inbox.append(("abort", rid))
        self._wake.set()

    def _end(self, s: RequestStream, reason: str) -> None:
        if s.queued:
            s.queued = False
            self.queued_requests -= 1
            self.queued_tokens -= s.prompt_tokens
        s.finished = True
        del self.streams[s.rid]
        self.metrics.finished[reason] = self.metrics.finished.get(reason, 0) + 1
        if not self.streams:
            self._idle.set()

    def _dispatch(self, outs: list[RequestOutput], snapshot: dict | None, iterations: list | None = None) -> None:
        """On the loop: route a step's outputs to their streams.

        First tokens are handed over before the others: the streams then write in that
        order, so a new request's TTFT does not include the time taken to write the
        step's tokens to every other stream."""
        if snapshot is not None:
            self.snapshot = snapshot
        now = time.monotonic()
        if iterations:
            obs = self.metrics.iteration_tokens.observe
            for n in iterations:
                obs(n)
        streams = self.streams
        m = self.metrics
        itl = m.itl.observe
        gen = 0
        later = []
        for o in outs:
            s = streams.get(o.request_id)
            if s is None:
                continue
            if not s.queued or not o.new_token_ids:
                later.append((s, o))
                continue
            gen += s.generated(len(o.new_token_ids))
            s.queued = False
            self.queued_requests -= 1
            self.queued_tokens -= s.prompt_tokens
            s.first_at = s.last_at = now
            m.ttft.observe(now - s.arrival)
            m.prompt_tokens += s.prompt_tokens
            s._put(o)
            if o.finished:
                m.e2e.observe(now - s.arrival)
                m.request_finished(
                    s.prompt_tokens, s.generated(o.output_tokens), now - s.arrival, now - s.arrival, o.timings
                )
                self._end(s, o.finish_reason or "stop")
        for s, o in later:
            ntok = len(o.new_token_ids)
            if ntok:
                gen += s.generated(ntok)
                itl(now - s.last_at)
                s.last_at = now
            s._put(o)
            if o.finished:
                if o.finish_reason != "error" and s.first_at:
                    m.e2e.observe(now - s.arrival)
                    if o.finish_reason in ("stop", "length"):
                        m.request_finished(
                            s.prompt_tokens,
                            s.generated(o.output_tokens),
                            now - s.arrival,
                            s.first_at - s.arrival,
                            o.timings,
                        )
                self._end(s, o.finish_reason or "stop")
        m.generation_tokens += gen

    # ---- driver thread -----------------------------------------------------------------
    def _post(self, outs: list[RequestOutput], snapshot: dict | None, iterations: list | None = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._dispatch, outs, snapshot, iterations)
        except RuntimeError:  # the loop is closed: the server is gone
            self._stop = True

    def _run(self) -> None:
        try:
            self._drive()
        except BaseException as e:  # noqa: BLE001 - the thread is dying: say so, fail everyone
            log.exception("the engine's driver thread died")
            self.last_error = f"{type(e).__name__}: {e}"
            self.healthy = False
            try:
                self._loop.call_soon_threadsafe(self._fail_all, self.last_error, True)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

    def _drive(self) -> None:
        core = self.core
        inbox = self._inbox
        wake = self._wake
        last_batch = getattr(core, "last_batch", None)
        iterations: list[int] = []  # tokens of each step since the last post
        stalled = getattr(core, "stalled", None)
        stalls = 0
        while not self._stop:
            wake.clear()
            errors: list[RequestOutput] = []
            if inbox:  # a new or aborted request may change the policy's plan
                stalls = 0
            while inbox:
                cmd = inbox.popleft()
                if cmd[0] == "add":
                    _, rid, ids, params, arrival = cmd
                    try:
                        core.add_request(rid, ids, params, arrival)
                    except ConfigError as e:
                        errors.append(_error_output(rid, str(e), 400))
                    except Exception:  # noqa: BLE001 - report, keep serving
                        log.exception("add_request failed")
                        errors.append(_error_output(rid, INTERNAL, 500))
                else:
                    try:
                        core.abort_request(cmd[1])
                    except Exception:  # noqa: BLE001
                        log.exception("abort_request failed")
            if errors:
                self._post(errors, None)
            if not core.has_unfinished_requests():
                self._post([], core.stats())
                wake.wait(0.5)
                continue
            t0 = time.perf_counter()
            try:
                outs = core.step()
            except Exception as e:  # noqa: BLE001 - fail the requests, keep serving
                log.exception("engine step failed")
                self.last_error = f"{type(e).__name__}: {e}"
                self._loop.call_soon_threadsafe(self._fail_all, self.last_error)
                time.sleep(0.01)
                continue
            b = getattr(core, "last_batch", None)
            if b is not None and b is not last_batch:  # a step ran: its tokens
                last_batch = b
                iterations.append(b.plan.tokens)
            snap = core.stats()
            if outs or snap != self.snapshot:
                self._post(outs, snap, iterations or None)
                iterations = []
            if stalled is not None and not outs and stalled():
                stalls += 1
                if stalls >= STALL_STEPS:
                    stalls = 0
                    self._fail_stalled()
                    continue
            else:
                stalls = 0
            if not outs and time.perf_counter() - t0 < 5e-5:
                wake.wait(0.001)  # nothing runnable now: do not spin

    def _fail_stalled(self) -> None:
        """In the driver thread: the policy plans nothing and nothing else will start a step;
        end the core's requests with an error naming the policy."""
        core = self.core
        sched = getattr(core, "scheduler", None)
        policy = getattr(getattr(sched, "batch", None), "name", None) or getattr(sched, "name", "?")
        ids = core.unfinished_ids()
        msg = (
            f"the batch policy {policy!r} planned no work for {STALL_STEPS} steps in a row with "
            f"{len(ids)} unfinished request{'' if len(ids) == 1 else 's'} and nothing else to start a step; "
            "the request was failed"
        )
        log.error("%s", msg)
        for rid in ids:
            try:
                core.abort_request(rid)
            except Exception:  # noqa: BLE001
                log.exception("abort_request failed")
        self._post([_error_output(rid, msg, 500) for rid in ids], core.stats())

    def _fail_all(self, message: str, dead: bool = False) -> None:
        """Fail every request in flight; `message` (the exception) is for the log only."""
        for rid in list(self.streams):
            if dead:
                self.fail(rid, ENGINE_DEAD, 503, "service_unavailable", "engine_failed")
            else:
                self.fail(rid, STEP_FAILED)


def _error_output(
    rid: str, message: str, status: int, error_type: str | None = None, code: str | None = None
) -> RequestOutput:
    o = RequestOutput(rid, [], finished=True, finish_reason="error", error=message)
    o.status = status  # HTTP status for a response not started yet
    o.error_type = error_type  # OpenAI error type (None: from the status)
    o.error_code = code
    return o
