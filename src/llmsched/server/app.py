"""The OpenAI-compatible HTTP API (FastAPI app; routes are plain Starlette endpoints so
the hot path skips FastAPI's request models).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics (Prometheus text), GET /version, POST /tokenize and POST /detokenize (as in
vLLM; `vllm bench serve` uses them to check that it counts tokens as the server does). With an API key, every /v1 route needs
`Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open, as in vLLM.

Streaming follows OpenAI and vLLM: `data: {json}\\n\\n` events, one per token; a chat
stream's first event carries `delta.role`; the last token's event carries `finish_reason`;
with `stream_options.include_usage` a final event has `usage` and empty `choices`; then
`data: [DONE]\\n\\n`. An error after the response started is sent as a `data: {"error":
...}` event followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..core.errors import ConfigError
from .async_engine import AsyncEngine, Draining, EngineDead, Overloaded, RequestStream
from .backends import Backend
from .metrics import ServerMetrics
from .protocol import (APIError, ChunkWriter, bad_request, chat_body, completion_body, dumps,
                       parse_body, parse_chat, parse_completion, sampling_params)

log = logging.getLogger("llmsched.server")

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    default_max_tokens: int | None = None   # None: 16 for completions, the room left for chat
    drain_timeout: float = 30.0
    log_level: str = "warning"
    switch_interval: float = 0.001          # sys.setswitchinterval while serving
    max_body_bytes: int = 32 * 1024 * 1024  # larger bodies: 413, not read
    max_header_bytes: int = 64 * 1024       # request line + headers; larger: 431
    read_timeout: float = 30.0              # for the headers, then for the body: else 408

    def __post_init__(self):
        for name in ("max_queued_requests", "max_queued_tokens", "default_max_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not (isinstance(self.port, int) and 0 <= self.port < 65536):
            raise ConfigError(f"port must be in 0..65535, got {self.port!r}")
        if self.drain_timeout < 0:
            raise ConfigError(f"drain timeout must be >= 0 seconds, got {self.drain_timeout}")
        for name in ("max_body_bytes", "max_header_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not (isinstance(self.read_timeout, (int, float)) and 0 < self.read_timeout < float("inf")):
            raise ConfigError(f"read timeout must be a positive number of seconds, got {self.read_timeout!r}")


def error_response(e: APIError, headers: dict | None = None) -> Response:
    return Response(dumps(e.body()), status_code=e.status, media_type="application/json",
                    headers=headers)


def _overloaded() -> Response:
    return error_response(APIError(429, "The server is overloaded: its request queue is full. "
                                   "Retry later.", "rate_limit_error", None, "rate_limit_exceeded"),
                          {"retry-after": "1"})


def output_error(o) -> APIError:
    """The APIError of an engine output that ended with an error (`AsyncEngine` sets its
    HTTP status, and its OpenAI error type and code where they are not the defaults)."""
    status = getattr(o, "status", 500)
    etype = getattr(o, "error_type", None) or ("internal_server_error" if status >= 500
                                               else "invalid_request_error")
    return APIError(status, o.error or "internal error", etype, None, getattr(o, "error_code", None))


def _draining() -> Response:
    return error_response(APIError(503, "The server is shutting down and accepts no new requests.",
                                   "service_unavailable", None, "server_shutting_down"))


def _auth_failure(scope, expected: bytes) -> Response | None:
    """A 401 response if a /v1 request lacks `Authorization: Bearer KEY`, else None."""
    if not scope["path"].startswith("/v1"):
        return None
    got = b""
    for k, v in scope["headers"]:
        if k == b"authorization":
            got = v
            break
    if hmac.compare_digest(got, expected):
        return None
    msg = ("Incorrect API key provided." if got else
           "You didn't provide an API key. Pass it as 'Authorization: Bearer KEY'.")
    return error_response(APIError(401, msg, "invalid_request_error", None, "invalid_api_key"),
                          {"www-authenticate": "Bearer"})


class AuthMiddleware:
    """Bearer-token check for /v1 routes (pure ASGI, so streaming is untouched)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            fail = _auth_failure(scope, self.expected)
            if fail is not None:
                await fail(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _ClientGone(Exception):
    pass


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        msg = await receive()
        if msg["type"] == "http.request":
            parts.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                return b"".join(parts)
        elif msg["type"] == "http.disconnect":
            raise _ClientGone()


class LLMSchedApp(FastAPI):
    """FastAPI, with the two generation routes served ahead of the middleware stack.

    A streamed token resumes every coroutine frame between the server and the handler;
    taking POST /v1/completions and /v1/chat/completions straight to their handler keeps
    that chain short. Everything else goes through FastAPI as usual."""

    fast_routes: dict = {}
    api_key_header: bytes | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None:
                if self.api_key_header is not None:
                    fail = _auth_failure(scope, self.api_key_header)
                    if fail is not None:
                        await fail(scope, receive, send)
                        return
                try:
                    body = await _read_body(receive)
                except _ClientGone:
                    return
                try:
                    resp = await handler(body, receive)
                except Exception as exc:  # noqa: BLE001 - a 500, never a dropped connection
                    log.exception("unhandled error")
                    resp = error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                                   "internal_server_error"))
                await resp(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _watch_disconnect(receive, engine: AsyncEngine, s: RequestStream) -> None:
    """Abort the request when the client goes away (the body is already read)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            if not s.finished:
                engine.abort(s.rid)
            return


class SSEResponse:
    """A token stream as Server-Sent Events."""

    def __init__(self, engine: AsyncEngine, s: RequestStream, w: ChunkWriter, chat: bool,
                 include_usage: bool, continuous_usage: bool):
        self.engine, self.s, self.w = engine, s, w
        self.chat, self.include_usage, self.continuous = chat, include_usage, continuous_usage

    async def __call__(self, scope, receive, send) -> None:
        s = self.s
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        watch = asyncio.ensure_future(_watch_disconnect(receive, self.engine, s))
        try:
            async for chunk in self._events():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()
            if not s.finished:
                self.engine.abort(s.rid)

    async def _events(self):
        s, w = self.s, self.w
        chat = self.chat
        first = True
        n_out = 0
        prompt_tokens = s.prompt_tokens
        while True:
            outs = await s.get()
            parts = []
            for o in outs:
                if o.finish_reason == "abort":
                    return
                if o.finish_reason == "error":
                    parts.append(w.error(output_error(o)))
                    parts.append(w.DONE)
                    yield "".join(parts).encode()
                    return
                if first:
                    first = False
                    if chat:
                        parts.append(w.role())
                if o.prompt_tokens:
                    prompt_tokens = o.prompt_tokens
                n_out = o.output_tokens or (n_out + len(o.new_token_ids))
                usage = None
                if self.continuous:
                    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_out,
                             "total_tokens": prompt_tokens + n_out}
                if o.finished:
                    parts.append(w.token(o.new_text, o.finish_reason, usage, o.stop_reason))
                else:
                    parts.append(w.token(o.new_text, None, usage))
                if o.finished:
                    if self.include_usage:
                        parts.append(w.usage(prompt_tokens, n_out))
                    parts.append(w.DONE)
                    yield "".join(parts).encode()
                    return
            if parts:
                yield "".join(parts).encode()


async def _collect(engine: AsyncEngine, s: RequestStream, receive, chat: bool, rid: str,
                   created: int, model: str) -> Response:
    watch = asyncio.ensure_future(_watch_disconnect(receive, engine, s))
    texts = []
    n_out = 0
    prompt_tokens = s.prompt_tokens
    try:
        while True:
            for o in await s.get():
                if o.finish_reason == "abort":
                    return Response(status_code=499)   # nobody is listening any more
                if o.finish_reason == "error":
                    return error_response(output_error(o))
                texts.append(o.new_text)
                n_out = o.output_tokens or (n_out + len(o.new_token_ids))
                if o.prompt_tokens:
                    prompt_tokens = o.prompt_tokens
                if o.finished:
                    make = chat_body if chat else completion_body
                    body = make(rid, created, model, "".join(texts), o.finish_reason or "stop",
                                prompt_tokens, n_out, o.stop_reason)
                    return Response(dumps(body), media_type="application/json")
    finally:
        watch.cancel()
        if not s.finished:
            engine.abort(s.rid)


def build_app(backend: Backend, cfg: ServerConfig | None = None) -> FastAPI:
    """The FastAPI application serving `backend`."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(backend.model_name)
    engine = AsyncEngine(backend.core, metrics, max_queued_requests=cfg.max_queued_requests,
                         max_queued_tokens=cfg.max_queued_tokens)
    tok = backend.tokenizer
    names = {backend.model_name, backend.root}
    started = int(time.time())

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
            gc.unfreeze()

    app = LLMSchedApp(title="llmsched", version=__version__, lifespan=lifespan,
                      docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.config = cfg

    async def generate(data: bytes, receive, chat: bool):
        try:
            body = parse_body(data)
            req = parse_chat(body) if chat else parse_completion(body)
            if req.model not in names:
                raise bad_request(f"The model `{req.model}` does not exist (this server serves "
                                  f"`{backend.model_name}`).", "model", "model_not_found")
            param = "messages" if chat else "prompt"
            try:
                if req.prompt_ids is not None:
                    ids = req.prompt_ids
                elif chat:
                    ids = tok.encode_chat(req.messages)
                else:
                    ids = tok.encode(req.prompt_text)
                # refused here, not by the engine once a stream has started (a 200)
                backend.check_token_ids(ids)
            except ConfigError as e:
                raise bad_request(str(e), param) from None
            n = len(ids)
            if cfg.max_queued_tokens is not None and n > cfg.max_queued_tokens:
                raise bad_request(f"the prompt has {n} tokens, more than the server's whole queue "
                                  f"holds (--max-queued-tokens {cfg.max_queued_tokens})", param,
                                  "context_length_exceeded")
            max_tokens = req.max_tokens
            if max_tokens is None:
                if cfg.default_max_tokens is not None:
                    max_tokens = cfg.default_max_tokens
                elif chat:
                    max_tokens = max(1, backend.room(n))
                else:
                    max_tokens = 16
            try:
                backend.check(n, max_tokens)
            except ConfigError as e:
                raise bad_request(str(e), param, "context_length_exceeded") from None
            try:
                params = sampling_params(req, max_tokens)
            except ConfigError as e:
                raise bad_request(str(e)) from None
            rid = engine.new_id("chatcmpl" if chat else "cmpl")
            s = engine.submit(rid, ids, params)
        except APIError as e:
            return error_response(e)
        except Overloaded:
            return _overloaded()
        except Draining:
            return _draining()
        except EngineDead as e:
            return error_response(APIError(503, str(e), "service_unavailable", None, "engine_failed"))
        created = int(time.time())
        if req.stream:
            w = ChunkWriter(rid, created, req.model, chat, req.include_usage)
            return SSEResponse(engine, s, w, chat, req.include_usage, req.continuous_usage)
        return await _collect(engine, s, receive, chat, rid, created, req.model)

    async def completions_fast(data: bytes, receive):
        return await generate(data, receive, False)

    async def chat_fast(data: bytes, receive):
        return await generate(data, receive, True)

    async def completions(request: Request):
        return await generate(await request.body(), request.receive, False)

    async def chat_completions(request: Request):
        return await generate(await request.body(), request.receive, True)

    app.fast_routes = {"/v1/completions": completions_fast, "/v1/chat/completions": chat_fast}
    if cfg.api_key:
        app.api_key_header = f"Bearer {cfg.api_key}".encode()

    async def models(request: Request):
        card = {"id": backend.model_name, "object": "model", "created": started, "owned_by": "llmsched",
                "root": backend.root, "parent": None, "max_model_len": backend.max_model_len,
                "permission": []}
        return Response(dumps({"object": "list", "data": [card]}), media_type="application/json")

    async def health(request: Request):
        if engine.draining or not engine.healthy:
            return Response(status_code=503)
        return Response(status_code=200)

    async def metrics_route(request: Request):
        text = metrics.render(engine.snapshot, engine.queued_requests, engine.queued_tokens)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(request: Request):
        try:
            body = parse_body(await request.body())
            if body.get("model") is not None and body["model"] not in names:
                raise bad_request(f"The model `{body['model']}` does not exist.", "model", "model_not_found")
            try:
                if "messages" in body:
                    ids = tok.encode_chat(parse_chat({**body, "model": backend.model_name}).messages)
                elif isinstance(body.get("prompt"), str):
                    ids = tok.encode(body["prompt"])
                else:
                    raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
            except ConfigError as e:
                raise bad_request(str(e), "prompt") from None
        except APIError as e:
            return error_response(e)
        ids = list(ids)
        return Response(dumps({"count": len(ids), "max_model_len": backend.max_model_len, "tokens": ids}),
                        media_type="application/json")

    async def detokenize(request: Request):
        try:
            body = parse_body(await request.body())
            toks = body.get("tokens")
            if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
                raise bad_request("'tokens' must be an array of integers", "tokens")
            if any(t < 0 for t in toks):
                raise bad_request("'tokens' must be non-negative token ids", "tokens")
            try:
                backend.check_token_ids(toks)
                text = tok.decode(toks)
            except ConfigError as e:
                raise bad_request(str(e), "tokens") from None
            except (OverflowError, ValueError, TypeError) as e:  # ids the tokenizer cannot take
                raise bad_request(f"cannot decode 'tokens': {e}", "tokens") from None
        except APIError as e:
            return error_response(e)
        return Response(dumps({"prompt": text}), media_type="application/json")

    async def version(request: Request):
        return Response(dumps({"version": __version__, **backend.info}), media_type="application/json")

    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", metrics_route, methods=["GET"])
    app.add_route("/version", version, methods=["GET"])
    app.add_route("/tokenize", tokenize, methods=["POST"])
    app.add_route("/detokenize", detokenize, methods=["POST"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            e = APIError(404, f"Not found: {request.method} {request.url.path}", "invalid_request_error",
                         None, "not_found")
        elif exc.status_code == 405:
            e = APIError(405, f"Method {request.method} is not allowed on {request.url.path}",
                         "invalid_request_error", None, "method_not_allowed")
        else:
            e = APIError(exc.status_code, str(exc.detail), "invalid_request_error")
        return error_response(e, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                       "internal_server_error"))

    if cfg.api_key:
        app.add_middleware(AuthMiddleware, api_key=cfg.api_key)
    return app
