"""The OpenAI-compatible HTTP API (FastAPI app; routes are plain Starlette endpoints so
the hot path skips FastAPI's request models).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models and
/v1/models/{id}, GET /health, GET /metrics (Prometheus text), GET /version, POST /tokenize
and POST /detokenize (as in vLLM; `vllm bench serve` uses them to check that it counts
tokens as the server does). With an API key, every /v1 route, /tokenize and /detokenize
need `Authorization: Bearer KEY` (401 otherwise); /health, /metrics and /version stay open.

Limits (`ServerConfig`): a body over `max_body_bytes` (default: what the largest servable
request can need, `default_max_body_bytes`, at most 16 MiB) is refused (413) without being
read further, one that has not fully arrived `read_timeout` seconds after its headers gets 408
(both close the connection); a text prompt too long to fit the context is refused before
it is tokenized; long parsing, tokenizing and decoding run in a worker thread, not on the
event loop. Header size and header timeouts are enforced by `serve.GuardedHttpProtocol`.

Streaming follows OpenAI and vLLM: `data: {json}\\n\\n` events, one per token; a chat
stream's first event carries `delta.role`; the last token's event carries `finish_reason`;
with `stream_options.include_usage` a final event has `usage` and empty `choices`; then
`data: [DONE]\\n\\n`. An error after the response started is sent as a `data: {"error":
...}` event followed by `[DONE]`. No response carries an exception's text: the log has it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hmac
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..core.engine_api import INT64_MIN
from ..core.errors import ConfigError
from ..core.version import __version__
from .async_engine import AsyncEngine, Draining, EngineDead, Overloaded, RequestStream
from .backends import Backend
from .metrics import ServerMetrics
from .protocol import (
    MAX_REQUEST_ID_CHARS,
    APIError,
    ChunkWriter,
    bad_request,
    chat_choice,
    completion_choice,
    dumps,
    int_list,
    logprobs_object,
    opt_bool,
    parse_body,
    parse_chat,
    parse_completion,
    prompt_entries,
    response_body,
    sampling_params,
    usage_dict,
)
from .tokenizer import utf8_len

log = logging.getLogger("llmsched.server")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    default_max_tokens: int | None = None  # None: 16 for completions, the room left for chat
    drain_timeout: float = 30.0
    log_level: str = "warning"
    switch_interval: float = 0.001  # sys.setswitchinterval while serving
    max_body_bytes: int | None = None  # larger bodies: 413, not read (None: derived)
    max_header_bytes: int = 64 * 1024  # request line + headers; larger: 431
    read_timeout: float = 30.0  # for the headers, then for the body: else 408
    metrics_prefix: str = "llmsched"  # or "vllm": /metrics names as vLLM's

    def __post_init__(self):
        for name in ("max_queued_requests", "max_queued_tokens", "default_max_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not (isinstance(self.port, int) and 0 <= self.port < 65536):
            raise ConfigError(f"port must be in 0..65535, got {self.port!r}")
        if not (isinstance(self.drain_timeout, (int, float)) and 0 <= self.drain_timeout < float("inf")):
            # a drain needs an end (uvicorn's graceful-shutdown limit is derived from it)
            raise ConfigError(f"drain timeout must be a finite number of seconds >= 0, got {self.drain_timeout!r}")
        for name in ("max_body_bytes", "max_header_bytes"):
            v = getattr(self, name)
            if v is None and name == "max_body_bytes":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.metrics_prefix not in ("llmsched", "vllm"):
            raise ConfigError(f"metrics prefix must be llmsched or vllm, got {self.metrics_prefix!r}")
        if not (isinstance(self.read_timeout, (int, float)) and 0 < self.read_timeout < float("inf")):
            raise ConfigError(f"read timeout must be a positive number of seconds, got {self.read_timeout!r}")


# Work that may take long runs off the event loop, in worker threads: joining, parsing and
# checking a body larger than BIG_BODY (one thread), tokenizing a text longer than
# INLINE_TEXT_CHARS (unless the tokenizer is `cheap`) and decoding more than that many token
# ids (TOKENIZE_THREADS: half the CPUs, 1 to 4, so the event loop and the engine keep a
# core, and run at a lower priority). bytes.join (over 1 MiB) and the tokenizers' batch
# calls release the GIL; pure-Python
# work in a worker yields it every switch interval; only the JSON parser holds it (about
# 3 ms per MB on a small VM). Separate pools: a body that is refused once parsed never
# waits behind long tokenizations.
BIG_BODY = 64 * 1024
INLINE_TEXT_CHARS = 1024
TOKENIZE_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
TOKENIZE_NICE = 5  # tokenizing threads yield the CPU to the event loop and the engine


def _lower_priority() -> None:
    """Thread initializer: raise this thread's nice value (Linux: per thread), so that on a
    busy machine tokenizing long prompts does not slow token delivery."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + TOKENIZE_NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: run at normal priority
        pass


MAX_BODY_CAP = 16 * 1024 * 1024


def default_max_body_bytes(max_model_len: int | None, max_text_bytes: int | None) -> int:
    """The default body limit: what the largest request this context can serve may need as
    JSON (its text escaped, up to 6 bytes a byte; or its token ids, up to 32 bytes each)
    plus 1 MiB for everything else, at most MAX_BODY_CAP (16 MiB)."""
    if max_model_len is None:
        return MAX_BODY_CAP
    text = max_text_bytes if max_text_bytes is not None else 16 * max_model_len
    return min(MAX_BODY_CAP, 6 * text + 32 * max_model_len + (1 << 20))


class BodyParts(list):
    """A body larger than BIG_BODY as it was received: joined off the event loop."""

    size = 0


def body_size(data) -> int:
    return data.size if isinstance(data, BodyParts) else len(data)


def body_bytes(data) -> bytes:
    """The body as one bytes object; a BodyParts gives up its pieces once joined."""
    if isinstance(data, BodyParts):
        joined = b"".join(data)
        data.clear()
        return joined
    return data


def error_response(e: APIError, headers: dict | None = None) -> Response:
    return Response(dumps(e.body()), status_code=e.status, media_type="application/json", headers=headers)


def internal_error_response() -> Response:
    """A 500 that says nothing about the exception (the log has it)."""
    return error_response(APIError(500, "internal error; the server log has the details", "internal_server_error"))


def _overloaded() -> Response:
    return error_response(
        APIError(
            429,
            "The server is overloaded: its request queue is full. Retry later.",
            "rate_limit_error",
            None,
            "rate_limit_exceeded",
        ),
        {"retry-after": "1"},
    )


def output_error(o) -> APIError:
    """The APIError of an engine output that ended with an error (`AsyncEngine` sets its
    HTTP status, and its OpenAI error type and code where they are not the defaults)."""
    status = getattr(o, "status", 500)
    etype = getattr(o, "error_type", None) or ("internal_server_error" if status >= 500 else "invalid_request_error")
    return APIError(status, o.error or "internal error", etype, None, getattr(o, "error_code", None))


def _draining() -> Response:
    return error_response(
        APIError(
            503,
            "The server is shutting down and accepts no new requests.",
            "service_unavailable",
            None,
            "server_shutting_down",
        )
    )


def _clip(text: str, limit: int = 100) -> str:
    """A client's string for an error message, never echoed back whole."""
    return text if len(text) <= limit else text[:limit] + "..."


def needs_api_key(path: str) -> bool:
    """Routes that need `Authorization: Bearer KEY` when the server has an API key: every
    /v1 route, /tokenize and /detokenize (/health, /metrics and /version stay open)."""
    return path.startswith("/v1") or path in ("/tokenize", "/detokenize")


def _auth_failure(scope, expected: bytes) -> Response | None:
    """A 401 response if a request to a protected route lacks `Authorization: Bearer KEY`."""
    if not needs_api_key(scope["path"]):
        return None
    got = b""
    for k, v in scope["headers"]:
        if k == b"authorization":
            got = v
            break
    if hmac.compare_digest(got, expected):
        return None
    msg = (
        "Incorrect API key provided."
        if got
        else "You didn't provide an API key. Pass it as 'Authorization: Bearer KEY'."
    )
    # refused before its body is read: close rather than read and discard that body
    return error_response(
        APIError(401, msg, "invalid_request_error", None, "invalid_api_key"),
        {"www-authenticate": "Bearer", "connection": "close"},
    )


def _header(scope, name: bytes) -> str | None:
    """A request header's value (the first), or None."""
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


class _ClientGone(Exception):
    pass


_CLOSE = {"connection": "close"}


async def _read_body(scope, receive, limit: int, timeout: float):
    """The whole request body: bytes, or a BodyParts if larger than BIG_BODY. Raises
    APIError 413 (more than `limit` bytes, announced by Content-Length or counted while
    reading; nothing is read past the limit), 408 (not all there within `timeout` seconds)
    or _ClientGone."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            digits = v.lstrip(b"0")
            if v.isdigit() and (len(digits) > 18 or int(digits or b"0") > limit):
                raise _too_large(limit)
            break
    parts = []
    n = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                msg = await receive()
                if msg["type"] == "http.request":
                    chunk = msg.get("body", b"")
                    if chunk:
                        n += len(chunk)
                        if n > limit:
                            raise _too_large(limit)
                        parts.append(chunk)
                    if not msg.get("more_body", False):
                        if len(parts) == 1:
                            return parts[0]
                        if n <= BIG_BODY:
                            return b"".join(parts)
                        big = BodyParts(parts)
                        big.size = n
                        return big
                elif msg["type"] == "http.disconnect":
                    raise _ClientGone()
    except TimeoutError:
        raise APIError(
            408,
            f"the request body did not arrive within {timeout:g} s",
            "invalid_request_error",
            None,
            "request_timeout",
        ) from None


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than this server accepts ({limit} bytes)",
        "invalid_request_error",
        None,
        "request_too_large",
    )


def _replay(body, receive):
    """A `receive` that hands out the body already read, then the connection's own events.
    (Our routes take the body from `scope["llmsched.body"]`, unjoined.)"""
    pending = [body]

    async def replay():
        if pending:
            return {"type": "http.request", "body": body_bytes(pending.pop()), "more_body": False}
        return await receive()

    return replay


async def _body_of(request: Request):
    body = request.scope.get("llmsched.body")
    return await request.body() if body is None else body


class LLMSchedApp(FastAPI):
    """FastAPI, with the API-key check, the request body read (bounded in size and time) and
    the two generation routes served ahead of the middleware stack.

    A streamed token resumes every coroutine frame between the server and the handler;
    taking POST /v1/completions and /v1/chat/completions straight to their handler keeps
    that chain short. Everything else goes through FastAPI as usual, with the body already
    read."""

    fast_routes: dict = {}
    api_key_header: bytes | None = None
    max_body_bytes: int = MAX_BODY_CAP
    read_timeout: float = ServerConfig.read_timeout
    metrics: ServerMetrics | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.api_key_header is not None:
            fail = _auth_failure(scope, self.api_key_header)
            if fail is not None:
                await fail(scope, receive, send)
                return
        try:
            body = await _read_body(scope, receive, self.max_body_bytes, self.read_timeout)
        except _ClientGone:
            return
        except APIError as e:  # 413 or 408: the rest of the body is not read; close
            if self.metrics is not None:
                key = "body_too_large" if e.status == 413 else "read_timeout"
                self.metrics.rejected[key] = self.metrics.rejected.get(key, 0) + 1
            await error_response(e, _CLOSE)(scope, receive, send)
            return
        if scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None:
                try:
                    resp = await handler(body, receive, scope)
                except Exception:  # noqa: BLE001 - a 500, never a dropped connection
                    log.exception("unhandled error")
                    resp = internal_error_response()
                del body  # not kept for as long as a stream lasts
                await resp(scope, receive, send)
                return
        scope["llmsched.body"] = body
        await super().__call__(scope, _replay(body, receive), send)


async def _watch_disconnect(receive, engine: AsyncEngine, streams: list[RequestStream]) -> None:
    """Abort the requests when the client goes away (the body is already read)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            for s in streams:
                if not s.finished:
                    engine.abort(s.rid)
            return


class Choice:
    """One choice of a response: its request's stream and what was returned of it so far."""

    __slots__ = (
        "index",
        "s",
        "prompt_tokens",
        "echo",
        "first",
        "n_out",
        "offset",
        "texts",
        "lps",
        "ids",
        "drop",
        "plp",
    )

    def __init__(self, index: int, s: RequestStream, echo: str = "", ids=None, drop: bool = False):
        self.index = index
        self.s = s
        self.prompt_tokens = s.prompt_tokens
        self.echo = echo  # text returned before the first token (completions' `echo`)
        self.first = True
        self.n_out = 0
        self.offset = 0  # text offset of the next token (completions' logprobs)
        self.texts: list[str] = []
        self.lps: list = []  # (token id, logprob, top) per token, with logprobs
        self.ids = ids  # echo with logprobs: the prompt's token ids (its logprobs come back)
        self.drop = drop  # max_tokens 0: the one token the engine samples is not returned
        self.plp: list | None = None  # the prompt's logprob entries, once they came

    def ending(self, o) -> tuple[str | None, str | int | None]:
        """(finish_reason, stop_reason) of the choice's last output: max_tokens 0 (`drop`)
        ends at its length, whatever stopped the token the engine sampled."""
        return ("length", None) if self.drop else (o.finish_reason, o.stop_reason)

    def take_prompt(self, o) -> None:
        """Keep the prompt logprobs an output carries (echo with logprobs)."""
        if self.ids is not None and o.prompt_logprobs is not None:
            self.plp = prompt_entries(self.ids, o.prompt_logprobs)


def _lp_entries(o) -> list:
    """(token id, logprob, top) of the new tokens of an output that carries logprobs."""
    return [(t, lp[0], lp[1]) for t, lp in zip(o.new_token_ids, o.logprobs) if lp is not None]


class SSEResponse:
    """The token streams of a response's choices as Server-Sent Events."""

    def __init__(
        self,
        engine: AsyncEngine,
        choices: list[Choice],
        w: ChunkWriter,
        chat: bool,
        include_usage: bool,
        continuous_usage: bool,
        token_text=None,
        prompt_tokens: int | None = None,
    ):
        self.engine, self.choices, self.w = engine, choices, w
        self.chat, self.include_usage, self.continuous = chat, include_usage, continuous_usage
        self.token_text = token_text  # id -> text, for logprobs (None: no logprobs)
        self.prompt_tokens = prompt_tokens  # usage: every prompt once (None: the one choice's)

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        streams = [c.s for c in self.choices]
        watch = asyncio.ensure_future(_watch_disconnect(receive, self.engine, streams))
        try:
            events = self._events() if len(self.choices) == 1 else self._merged()
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()
            for s in streams:
                if not s.finished:
                    self.engine.abort(s.rid)

    def _format(self, c: Choice, outs, parts: list) -> str | None:
        """Append the events of `outs` to `parts`; returns "done", "abort", "error" or None."""
        w = self.w
        for o in outs:
            if o.finish_reason == "abort":
                return "abort"
            if o.finish_reason == "error":
                parts.append(w.error(output_error(o)))
                return "error"
            text = "" if c.drop else o.new_text
            c.take_prompt(o)
            plp = c.plp if c.first else None
            if o.prompt_tokens:
                c.prompt_tokens = o.prompt_tokens
            if c.first:
                c.first = False
                if self.chat:
                    parts.append(w.role(c.index, usage_dict(c.prompt_tokens, 0) if self.continuous else None))
                if c.echo:
                    text = c.echo + text
                    c.offset = len(c.echo)
            if not c.drop:
                c.n_out = o.output_tokens or (c.n_out + len(o.new_token_ids))
            usage = None
            if self.continuous:
                usage = usage_dict(c.prompt_tokens, c.n_out)
            lp = None
            if self.token_text is not None and (o.logprobs or plp is not None):
                entries = [] if c.drop or not o.logprobs else _lp_entries(o)
                lp = logprobs_object(entries, self.token_text, self.chat, c.offset, plp)
                if entries and not self.chat:  # the next token's offset: after this chunk's last
                    c.offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
            if o.finished:
                reason, stop = c.ending(o)
                parts.append(w.token(text, reason, usage, stop, c.index, lp))
                return "done"
            parts.append(w.token(text, None, usage, None, c.index, lp))
        return None

    def _tail(self) -> str:
        parts = []
        if self.include_usage:
            pt = self.prompt_tokens if self.prompt_tokens is not None else self.choices[0].prompt_tokens
            parts.append(self.w.usage(pt, sum(c.n_out for c in self.choices)))
        parts.append(self.w.DONE)
        return "".join(parts)

    async def _events(self):
        c = self.choices[0]
        s = c.s
        while True:
            outs = await s.get()
            parts: list[str] = []
            end = self._format(c, outs, parts)
            if end == "abort":
                return
            if end is not None:
                parts.append(self._tail() if end == "done" else self.w.DONE)
                yield "".join(parts).encode()
                return
            if parts:
                yield "".join(parts).encode()

    async def _merged(self):
        """Several choices: their events interleaved as their tokens come."""
        pending = {asyncio.ensure_future(c.s.get()): c for c in self.choices}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                parts: list[str] = []
                for fut in done:
                    c = pending.pop(fut)
                    end = self._format(c, fut.result(), parts)
                    if end == "abort":
                        return
                    if end == "error":
                        parts.append(self.w.DONE)
                        yield "".join(parts).encode()
                        return
                    if end is None:
                        pending[asyncio.ensure_future(c.s.get())] = c
                if not pending:
                    parts.append(self._tail())
                if parts:
                    yield "".join(parts).encode()
        finally:
            for fut in pending:
                fut.cancel()


async def _collect(
    engine: AsyncEngine,
    choices: list[Choice],
    receive,
    chat: bool,
    rid: str,
    created: int,
    model: str,
    token_text=None,
    prompt_tokens: int | None = None,
) -> Response:
    streams = [c.s for c in choices]
    watch = asyncio.ensure_future(_watch_disconnect(receive, engine, streams))

    async def one(c: Choice):
        while True:
            for o in await c.s.get():
                if o.finish_reason == "abort":
                    return None
                if o.finish_reason == "error":
                    return output_error(o)
                c.take_prompt(o)
                if c.drop:  # max_tokens 0: nothing generated is returned
                    if o.finished:
                        return o
                    continue
                c.texts.append(o.new_text)
                if token_text is not None and o.logprobs:
                    c.lps.extend(_lp_entries(o))
                c.n_out = o.output_tokens or (c.n_out + len(o.new_token_ids))
                if o.prompt_tokens:
                    c.prompt_tokens = o.prompt_tokens
                if o.finished:
                    return o

    try:
        if len(choices) == 1:
            ends = [await one(choices[0])]
        else:
            ends = await asyncio.gather(*(one(c) for c in choices))
        bodies = []
        for c, o in zip(choices, ends):
            if o is None:
                return Response(status_code=499)  # nobody is listening any more
            if isinstance(o, APIError):
                return error_response(o)
            text = c.echo + "".join(c.texts)
            lp = None
            if token_text is not None:
                lp = logprobs_object(c.lps, token_text, chat, len(c.echo), c.plp)
            make = chat_choice if chat else completion_choice
            reason, stop = c.ending(o)
            bodies.append(make(c.index, text, reason or "stop", stop, lp))
        pt = prompt_tokens if prompt_tokens is not None else choices[0].prompt_tokens
        body = response_body(chat, rid, created, model, bodies, pt, sum(c.n_out for c in choices))
        return Response(dumps(body), media_type="application/json")
    finally:
        watch.cancel()
        for s in streams:
            if not s.finished:
                engine.abort(s.rid)


def build_app(backend: Backend, cfg: ServerConfig | None = None) -> FastAPI:
    """The FastAPI application serving `backend`."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(backend.model_name, cfg.metrics_prefix, backend.max_model_len)
    engine = AsyncEngine(
        backend.core, metrics, max_queued_requests=cfg.max_queued_requests, max_queued_tokens=cfg.max_queued_tokens
    )
    tok = backend.tokenizer
    tok_cheap = bool(getattr(tok, "cheap", False))
    names = {backend.model_name, backend.root}
    started = int(time.time())
    text_limit = backend.max_text_bytes
    max_ids = backend.max_model_len
    # a text over the bound is refused untokenized only where it surely has too many tokens
    quick_refusal = text_limit is not None and bool(getattr(tok, "text_bound_exact", False))
    max_messages = text_limit + 1 if quick_refusal else None
    parse_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmsched-parse")
    tok_pool = ThreadPoolExecutor(
        max_workers=TOKENIZE_THREADS, thread_name_prefix="llmsched-tokenize", initializer=_lower_priority
    )

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        # everything built so far lives as long as the server: keep it out of the cyclic
        # GC's scans, whose full passes would otherwise stall token delivery (as vLLM does)
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await engine.drain(cfg.drain_timeout)
            engine.stop()
            parse_pool.shutdown(wait=False, cancel_futures=True)
            tok_pool.shutdown(wait=False, cancel_futures=True)
            gc.unfreeze()

    app = LLMSchedApp(
        title="llmsched", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    # a trailing slash is a 404, not a redirect to a URL built from the client's Host header
    app.router.redirect_slashes = False
    app.state.engine = engine
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.config = cfg
    app.max_body_bytes = cfg.max_body_bytes or default_max_body_bytes(backend.max_model_len, text_limit)
    app.read_timeout = cfg.read_timeout
    app.metrics = metrics

    async def parse(fn, data, *args):
        """fn(data, *args): inline, or in the parse thread for a body larger than BIG_BODY."""
        if body_size(data) <= BIG_BODY:
            return fn(data, *args)
        return await asyncio.get_running_loop().run_in_executor(parse_pool, fn, data, *args)

    async def tokenize_text(fn, size: int, *args):
        """fn(*args) on `size` characters or ids: inline when cheap, else in the tokenizer
        threads (a long text would stall every stream on the event loop)."""
        if tok_cheap or size <= INLINE_TEXT_CHARS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(tok_pool, fn, *args)

    def model_not_found(model: str) -> APIError:
        return APIError(
            404,
            f"The model `{_clip(model)}` does not exist (this server serves `{backend.model_name}`).",
            "invalid_request_error",
            "model",
            "model_not_found",
        )

    def check_text(text: str, param: str) -> None:
        """Refuse, before tokenizing, a text too long to fit the context whatever its tokens."""
        if not quick_refusal:
            return
        if len(text) > text_limit or utf8_len(text) > text_limit:
            what = "prompt" if param == "prompt" else "conversation"
            raise bad_request(
                f"the {what} is more than {text_limit} bytes of text, which cannot fit "
                f"the model's context of {backend.max_model_len} tokens (no token of this "
                f"tokenizer stands for more than {tok.bytes_per_token} bytes)",
                param,
                "context_length_exceeded",
            )

    def encode(text: str, param: str, special: bool | None = None):
        """The text's ids: with the tokenizer's default special tokens, or as `special` says."""
        try:
            return tok.encode(text) if special is None else tok.encode(text, add_special_tokens=special)
        except ConfigError as e:
            raise bad_request(str(e), param) from None
        except Exception:  # noqa: BLE001 - the client's text: a 400 that names no internals
            log.warning("the tokenizer failed on a %d-character %s", len(text), param, exc_info=True)
            raise bad_request(f"the {param} cannot be tokenized", param) from None

    def check_ids(ids, param: str) -> None:
        try:
            backend.check_token_ids(ids)
        except ConfigError as e:
            raise bad_request(str(e), param) from None

    def chat_text(req, param: str) -> tuple[str, bool]:
        """(the text of a chat request, whether special tokens are added to it: not to a chat
        template's text, which carries its own BOS); a 400 if the template refuses it."""
        try:
            return tok.render_chat(req.messages, **req.chat_options)
        except ConfigError as e:
            raise bad_request(str(e), param) from None

    def parse_generation(data, chat: bool):
        """(request, per prompt: the text to tokenize, or None for a token-id prompt, whether
        special tokens are added (None: the tokenizer's default)); every check before
        tokenizing."""
        body = parse_body(body_bytes(data))
        req = parse_chat(body, max_messages) if chat else parse_completion(body, max_ids)
        if req.model not in names:
            raise model_not_found(req.model)
        limit = backend.max_model_len
        if req.max_tokens is not None and limit is not None and req.max_tokens > limit:
            # what fits is cut to the room the prompt leaves; more than the whole context
            # is a mistake, refused as vLLM refuses it
            raise bad_request(
                f"'{req.max_tokens_param}' is {req.max_tokens}, more than the model's context of {limit} "
                "tokens (prompt and completion together). Please request fewer output tokens.",
                req.max_tokens_param,
                "context_length_exceeded",
            )
        param = "messages" if chat else "prompt"
        special = req.add_special_tokens  # None: the tokenizer's default
        if chat:
            text, chat_special = chat_text(req, param)
            if special is None:
                special = chat_special
            texts = [text]
        else:
            texts = [p if isinstance(p, str) else None for p in req.all_prompts]
        for text in texts:
            if text is not None:
                check_text(text, param)
        return req, texts, special

    async def prepare(data: bytes, chat: bool):
        """The parsed request and each prompt's token ids, off the event loop where costly."""
        req, texts, special = await parse(parse_generation, data, chat)
        param = "messages" if chat else "prompt"
        all_ids = []
        for text, p in zip(texts, req.all_prompts):
            ids = p if text is None else await tokenize_text(encode, len(text), text, param, special)
            check_ids(ids, param)  # min() and max(): C loops over at most max_model_len ids
            all_ids.append(ids)
        return req, texts, all_ids

    token_texts: dict[int, str] = {}

    def token_text(t: int) -> str:
        """A token's text for logprobs (cached: at most one entry per vocabulary id; a cheap
        tokenizer's, such as the byte rule's with its 2**32 ids, is not cached)."""
        v = token_texts.get(t)
        if v is None:
            try:
                v = tok.decode([t])
            except Exception:  # noqa: BLE001 - an id the tokenizer cannot show
                v = ""
            if not tok_cheap:
                token_texts[t] = v
        return v

    async def echo_text(text, ids) -> str:
        if text is not None:
            return text
        return await tokenize_text(decode, len(ids), ids)

    def completion_budget(req, prompt_tokens: int, chat: bool, param: str) -> int:
        """The max_tokens a prompt gets, as vLLM's get_max_tokens: what the client asked for
        (else the server's default: --default-max-tokens; 16 for completions that leave the
        field out; for chat and `max_tokens: null` the model's max_new_tokens
        (generation_config.json), else all the room), cut to the room
        the context leaves after the prompt and to the backend's max_tokens_cap (vLLM's
        cap from --generation-config PATH or --override-generation-config). A 400 naming
        the prompt when it leaves no room."""
        asked = req.max_tokens
        if asked is None:
            if cfg.default_max_tokens is not None:
                asked = cfg.default_max_tokens
            elif not chat and not req.max_tokens_null:
                # OpenAI's completions default: vLLM's CompletionRequest has it, so the
                # model's max_new_tokens applies there only to an explicit null
                asked = 16
            else:
                asked = backend.sampling_defaults.get("max_tokens")  # None: all the room
        try:
            backend.check_prompt(prompt_tokens)
        except ConfigError as e:
            raise bad_request(str(e), param, "context_length_exceeded") from None
        room = backend.room(prompt_tokens)
        return min(v for v in (asked, backend.max_tokens_cap, room) if v is not None)

    def queue_share(all_ids, n: int, param: str) -> tuple[int, int]:
        """(requests, prompt tokens) a request (all its prompts, n choices each) adds to the
        queue; a 400 if the queue limits could never admit it, even on an idle server (a 429
        would have the client retry forever). `param` blames n when one choice per prompt
        would fit, as that is the field to lower."""
        mq, mt = cfg.max_queued_requests, cfg.max_queued_tokens
        longest = max(len(ids) for ids in all_ids)
        if mt is not None and longest > mt:
            raise bad_request(
                f"the prompt has {longest} tokens, more than the server's whole queue holds (--max-queued-tokens {mt})",
                param,
                "context_length_exceeded",
            )
        requests = len(all_ids) * n
        tokens = n * sum(len(ids) for ids in all_ids)
        if mq is not None and requests > mq:
            raise bad_request(
                f"the request has {requests} choices ({len(all_ids)} prompt(s) x n={n}), more than "
                f"the server's whole queue holds (--max-queued-requests {mq})",
                "n" if n > 1 and len(all_ids) <= mq else param,
            )
        if mt is not None and tokens > mt:
            raise bad_request(
                f"the request's {requests} choices have {tokens} prompt tokens in all, more than "
                f"the server's whole queue holds (--max-queued-tokens {mt})",
                "n" if n > 1 and tokens // n <= mt else param,
                "context_length_exceeded",
            )
        return requests, tokens

    async def generate(data: bytes, receive, chat: bool, scope):
        streams: list = []
        try:
            req, texts, all_ids = await prepare(data, chat)
            param = "messages" if chat else "prompt"
            c = req.raw
            if not backend.logits:
                for key, asked in (("logprobs", req.logprobs is not None), ("logit_bias", bool(c["logit_bias"]))):
                    if asked:
                        raise bad_request(
                            f"'{key}' needs the model's logits, and the {backend.kind} backend has none "
                            "(serve a model to use it)",
                            key,
                        )
            # before the response starts (a stream would be a 200 with an error event)
            for key in ("logit_bias", "stop_token_ids"):
                if c.get(key):
                    try:
                        backend.check_token_ids(list(c[key]))
                    except ConfigError as e:
                        raise bad_request(f"{key}: {e}", key) from None
            if backend.tokenizer.name == "none":  # what needs text, asked of a model without a tokenizer
                if c.get("stop"):
                    raise bad_request(
                        "stop strings need a tokenizer, and this model has none: use stop_token_ids", "stop"
                    )
                if req.echo:
                    raise bad_request(
                        "echo returns the prompt as text, which needs a tokenizer, and this model has none", "echo"
                    )
            queue_requests, queue_tokens = queue_share(all_ids, req.n, param)
            budgets = [completion_budget(req, len(ids), chat, param) for ids in all_ids]
            try:
                params_of = {
                    mt: sampling_params(req, mt, backend.sampling_defaults, backend.max_tokens_cap)
                    for mt in dict.fromkeys(budgets)
                }
            except ConfigError as e:
                raise bad_request(str(e)) from None
            if req.echo:
                echoes = [await echo_text(t, ids) for t, ids in zip(texts, all_ids)]
            else:
                echoes = [req.chat_echo] * len(all_ids) if req.chat_echo else None
            prefix = "chatcmpl" if chat else "cmpl"
            rid = engine.new_id(prefix)  # the engine's: unique, whatever the client's id
            given = _header(scope, b"x-request-id")
            if given is not None and len(given) > MAX_REQUEST_ID_CHARS:  # (echoed in every event)
                raise bad_request(
                    f"the X-Request-Id header must be at most {MAX_REQUEST_ID_CHARS} characters, got {len(given)}",
                    "X-Request-Id",
                )
            given = given or req.request_id
            shown = rid if given is None else f"{prefix}-{given}"  # the response's, as vLLM's
            engine.admit(queue_requests, queue_tokens)
            k = 0
            single = len(all_ids) * req.n == 1
            choices = []
            for i, ids in enumerate(all_ids):
                params = params_of[budgets[i]]
                for j in range(req.n):
                    p = params
                    if j and params.seed is not None:  # choice j of a seeded request: seed + j
                        p = dataclasses.replace(params, seed=((params.seed + j - INT64_MIN) % (1 << 64)) + INT64_MIN)
                    s = engine.submit(rid if single else f"{rid}-{k}", ids, p, req.score_only)
                    streams.append(s)
                    echo_ids = ids if req.echo and req.logprobs is not None else None
                    choices.append(Choice(k, s, echoes[i] if echoes else "", echo_ids, req.score_only))
                    k += 1
        except (APIError, Overloaded, Draining, EngineDead) as e:
            for s in streams:
                engine.abort(s.rid)
            if isinstance(e, APIError):
                return error_response(e)
            if isinstance(e, Overloaded):
                return _overloaded()
            if isinstance(e, Draining):
                return _draining()
            return error_response(APIError(503, str(e), "service_unavailable", None, "engine_failed"))
        created = int(time.time())
        lp_text = token_text if req.logprobs is not None else None
        prompt_tokens = None if single else sum(len(ids) for ids in all_ids)
        if req.stream:
            w = ChunkWriter(shown, created, req.model, chat, req.include_usage)
            return SSEResponse(
                engine, choices, w, chat, req.include_usage, req.continuous_usage, lp_text, prompt_tokens
            )
        return await _collect(engine, choices, receive, chat, shown, created, req.model, lp_text, prompt_tokens)

    async def completions_fast(data: bytes, receive, scope):
        return await generate(data, receive, False, scope)

    async def chat_fast(data: bytes, receive, scope):
        return await generate(data, receive, True, scope)

    async def completions(request: Request):
        return await generate(await _body_of(request), request.receive, False, request.scope)

    async def chat_completions(request: Request):
        return await generate(await _body_of(request), request.receive, True, request.scope)

    app.fast_routes = {"/v1/completions": completions_fast, "/v1/chat/completions": chat_fast}
    if cfg.api_key:
        app.api_key_header = f"Bearer {cfg.api_key}".encode()

    def card() -> dict:
        return {
            "id": backend.model_name,
            "object": "model",
            "created": started,
            "owned_by": "llmsched",
            "root": backend.root,
            "parent": None,
            "max_model_len": backend.max_model_len,
            "permission": [],
        }

    async def models(request: Request):
        return Response(dumps({"object": "list", "data": [card()]}), media_type="application/json")

    async def model_retrieve(request: Request):
        model = request.path_params["model_id"]
        if model not in names:
            return error_response(model_not_found(model))
        return Response(dumps(card()), media_type="application/json")

    async def health(request: Request):
        if engine.draining or not engine.healthy:
            return Response(status_code=503)
        return Response(status_code=200)

    async def metrics_route(request: Request):
        text = metrics.render(engine.snapshot, engine.queued_requests, engine.queued_tokens)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def check_model(body: dict) -> None:
        """/tokenize and /detokenize: an optional 'model' must be one this server serves."""
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise bad_request("'model' must be a string", "model")
            if model not in names:
                raise model_not_found(model)

    def parse_tokenize(data):
        """(text, param, add_special_tokens: None for the generation routes' choice)."""
        body = parse_body(body_bytes(data))
        check_model(body)
        special = opt_bool(body, "add_special_tokens")
        if "messages" in body:
            param = "messages"
            req = parse_chat({**body, "model": backend.model_name}, max_messages, tokenize_only=True)
            text, chat_special = chat_text(req, param)
            if special is None:  # as the chat route counts it
                special = chat_special
        elif isinstance(body.get("prompt"), str):
            text, param = body["prompt"], "prompt"
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        check_text(text, param)
        return text, param, special

    def encode_list(text: str, param: str, special: bool | None = None) -> list:
        return list(encode(text, param, special))  # special None: as the generation routes count it

    async def tokenize(request: Request):
        data = await _body_of(request)
        try:
            text, param, special = await parse(parse_tokenize, data)
            ids = await tokenize_text(encode_list, len(text), text, param, special)
        except APIError as e:
            return error_response(e)
        return Response(
            dumps({"count": len(ids), "max_model_len": backend.max_model_len, "tokens": ids}),
            media_type="application/json",
        )

    def parse_detokenize(data) -> list:
        body = parse_body(body_bytes(data))
        check_model(body)
        toks = body.get("tokens")
        if not isinstance(toks, list):
            raise bad_request("'tokens' must be an array of integers", "tokens")
        if max_ids is not None and len(toks) > max_ids:
            raise bad_request(
                f"'tokens' holds {len(toks)} ids, more than the model's context ({max_ids} tokens)",
                "tokens",
                "context_length_exceeded",
            )
        toks = int_list(body, "tokens")  # "5" is 5, as in stop_token_ids (vLLM reads both so)
        try:
            backend.check_token_ids(toks)
        except ConfigError as e:
            raise bad_request(str(e), "tokens") from None
        return toks

    def decode(toks: list) -> str:
        try:
            return tok.decode(toks)
        except ConfigError as e:
            raise bad_request(str(e), "tokens") from None
        except Exception:  # noqa: BLE001 - ids the tokenizer cannot take: the client's error
            log.info("the tokenizer could not decode %d ids", len(toks), exc_info=True)
            raise bad_request("'tokens' cannot be decoded by this model's tokenizer", "tokens") from None

    async def detokenize(request: Request):
        data = await _body_of(request)
        try:
            toks = await parse(parse_detokenize, data)
            text = await tokenize_text(decode, len(toks), toks)
        except APIError as e:
            return error_response(e)
        return Response(dumps({"prompt": text}), media_type="application/json")

    limits = {
        "max_body_bytes": app.max_body_bytes,
        "max_text_bytes": text_limit,
        "max_header_bytes": cfg.max_header_bytes,
        "read_timeout_s": cfg.read_timeout,
    }

    async def version(request: Request):
        # the scheduler as it is now: a closed-loop admission's resolved values (TWP's B_max,
        # window bounds) exist only once it has seen the cost model or a step
        info = {**backend.info, "scheduler": backend.core.scheduler.describe()}
        return Response(dumps({"version": __version__, **info, "limits": limits}), media_type="application/json")

    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/models/{model_id:path}", model_retrieve, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", metrics_route, methods=["GET"])
    app.add_route("/version", version, methods=["GET"])
    app.add_route("/tokenize", tokenize, methods=["POST"])
    app.add_route("/detokenize", detokenize, methods=["POST"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        path = _clip(request.url.path)
        if exc.status_code == 404:
            e = APIError(404, f"Not found: {request.method} {path}", "invalid_request_error", None, "not_found")
        elif exc.status_code == 405:
            e = APIError(
                405,
                f"Method {request.method} is not allowed on {path}",
                "invalid_request_error",
                None,
                "method_not_allowed",
            )
        else:
            etype = "internal_server_error" if exc.status_code >= 500 else "invalid_request_error"
            e = APIError(exc.status_code, _clip(str(exc.detail), 200), etype)
        return error_response(e, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error")
        return internal_error_response()

    return app
