"""Running the app under uvicorn, with a graceful shutdown and guarded connections.

On the first SIGINT/SIGTERM the server drains: new requests get 503, /health turns 503,
the accepted requests run to completion (at most `drain_timeout` seconds; any left then
end with an error), the uploads still arriving then get a 503, the responses still being
written get the rest of that time, and the process exits with status 0. A second signal
stops at once:
the requests still running end with a 503 `server_shutting_down` error (an error event in a
stream), the server gives them a moment to be written, and `serve()` exits with status
128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a shell reports a process
killed by that signal.

`GuardedHttpProtocol` (uvicorn's httptools protocol, or h11's where httptools is missing)
adds what uvicorn lacks: a request line + headers over `max_header_bytes` get 431, headers
not complete `read_timeout` seconds after the connection opened (or after the request's
first byte) get 408 (an idle new connection is just closed), and uvicorn's own 400s for
malformed HTTP are OpenAI-style JSON, not plain text. (Without httptools, uvicorn's h11
protocol caps the headers itself and only the JSON 400s are added.)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
import threading

import uvicorn

from ..core.errors import ConfigError
from .app import ServerConfig, build_app
from .backends import Backend
from .protocol import APIError, dumps

log = logging.getLogger("llmsched.server")

try:  # uvicorn[standard] brings httptools; uvicorn alone runs h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol

    _HTTPTOOLS = True
except ImportError:  # pragma: no cover - depends on the environment
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol

    _HTTPTOOLS = False

_PHRASES = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def _raw_error(status: int, message: str, code: str, error_type: str = "invalid_request_error") -> bytes:
    """A complete HTTP/1.1 error response (JSON body, connection closed) as bytes."""
    body = dumps(APIError(status, message, error_type, None, code).body()).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, _PHRASES[status], len(body))
    ) + body


class _Rejected(Exception):
    """Raised in a parser callback to stop parsing a rejected connection's data (httptools
    hands it to uvicorn as a parser error, whose 400 is then not sent)."""


class _JSON400Mixin:
    def send_400_response(self, msg: str) -> None:
        if getattr(self, "_rejected", False):
            return
        self._rejected = True
        log.info("malformed HTTP request from %s: %s", self.client, msg)
        if not self.transport.is_closing():
            self.transport.write(_raw_error(400, "invalid HTTP request", "invalid_http_request"))
            self.transport.close()


class GuardedHttpProtocol(_JSON400Mixin, _BaseProtocol):
    """uvicorn's httptools protocol with a header-size cap, a header-read timeout and JSON
    400s. `protocol_class` sets the two limits on a subclass (they are class attributes)."""

    max_header_bytes = ServerConfig.max_header_bytes
    read_timeout = ServerConfig.read_timeout

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._hdr_bytes = 0  # bytes received since the current message's headers began
        self._in_body = False  # between a message's headers and its end
        self._started = False  # a message has begun since the last one ended
        self._rejected = False
        self._hdr_timer = self.loop.call_later(self.read_timeout, self._header_timeout)

    def connection_lost(self, exc) -> None:
        self._cancel_hdr_timer()
        super().connection_lost(exc)

    def _cancel_hdr_timer(self) -> None:
        t = getattr(self, "_hdr_timer", None)
        if t is not None:
            t.cancel()
            self._hdr_timer = None

    def _reject(self, status: int, message: str, code: str) -> None:
        self._rejected = True
        self._cancel_hdr_timer()
        if not self.transport.is_closing():
            self.transport.write(_raw_error(status, message, code))
            self.transport.close()

    def _header_timeout(self) -> None:
        self._hdr_timer = None
        if self._rejected or self.transport.is_closing() or self._in_body:
            return
        if self._started:
            self._reject(408, f"the request headers did not arrive within {self.read_timeout:g} s", "request_timeout")
        else:  # a connection that never sent a request: just close it
            self._rejected = True
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if not self._in_body:
            self._hdr_bytes += len(data)
        super().data_received(data)
        if self._started and not self._in_body and self._hdr_bytes > self.max_header_bytes and not self._rejected:
            self._reject_headers()

    def on_message_begin(self) -> None:
        self._started = True
        if self._hdr_timer is None and not self._rejected:
            self._hdr_timer = self.loop.call_later(self.read_timeout, self._header_timeout)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._cancel_hdr_timer()
        self._in_body = True
        self._hdr_bytes = 0
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if size > self.max_header_bytes:  # all of it came in one read
            self._reject_headers()
            raise _Rejected()  # stop parsing this connection's data
        super().on_headers_complete()

    def _reject_headers(self) -> None:
        self._reject(
            431,
            f"the request line and headers are larger than this server accepts ({self.max_header_bytes} bytes)",
            "request_header_fields_too_large",
        )

    def on_message_complete(self) -> None:
        self._in_body = False
        self._started = False
        self._hdr_bytes = 0
        super().on_message_complete()


class _GuardedH11Protocol(_JSON400Mixin, _BaseProtocol):
    """Without httptools: h11 caps the headers itself (`h11_max_incomplete_event_size`);
    only the JSON 400s are added (no header-read timeout)."""


def protocol_class(cfg: ServerConfig) -> type:
    """The HTTP protocol class for uvicorn, with `cfg`'s limits."""
    if not _HTTPTOOLS:  # pragma: no cover - depends on the environment
        return _GuardedH11Protocol
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"max_header_bytes": cfg.max_header_bytes, "read_timeout": cfg.read_timeout},
    )


_WRITE_GRACE = 1.0  # seconds the handlers get to write a last response before it is cut off


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, drain_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.drain_timeout = drain_timeout
        self._draining = False
        self._stopping = False
        self.exit_code = 0  # 128 + signal number after a second signal
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        self.ready.set()

    def begin_drain(self) -> None:
        """Stop accepting requests, let the running ones finish, then exit (thread-safe)."""
        if self._draining or self._loop is None:
            return
        self._draining = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))

    async def _drain(self) -> None:
        end = self._loop.time() + self.drain_timeout
        n = len(self.engine.streams)
        log.warning("draining: refusing new requests, waiting for %d running request(s)", n)
        try:
            ok = await self.engine.drain(self.drain_timeout)
            if not ok:
                log.warning("drain timeout (%g s): the remaining requests were ended", self.drain_timeout)
            # the responses still being written get the rest of the drain's time
            await self._end_connections(max(_WRITE_GRACE, end - self._loop.time()))
        finally:  # whatever happened, the server still exits
            self.should_exit = True

    def stop_now(self, sig: int = signal.SIGTERM) -> None:
        """End every running request with an error, let the handlers write it, close the
        remaining connections and exit (thread-safe). Called again, exits at once."""
        if self._stopping or self._loop is None or self._loop.is_closed():
            self.should_exit = self.force_exit = True  # a third signal: no more waiting
            return
        self._stopping = True
        self.exit_code = 128 + int(sig)
        try:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._stop_now()))
        except RuntimeError:  # the loop is closing
            self.should_exit = self.force_exit = True

    async def _stop_now(self) -> None:
        eng = self.engine
        log.warning("second signal: ending %d running request(s) now", len(eng.streams))
        eng.draining = True
        for rid in list(eng.streams):
            eng.fail(
                rid,
                "the server was stopped before the request completed",
                503,
                "service_unavailable",
                "server_shutting_down",
            )
        try:
            await self._end_connections(_WRITE_GRACE)
        finally:
            self.should_exit = True

    async def _end_connections(self, grace: float) -> None:
        """Stop listening, refuse the uploads still arriving, give the handlers `grace`
        seconds to write their responses, then close every connection.

        Left open, a stalled upload or a client that stopped reading would make uvicorn's
        shutdown wait for them (the drain timeout + 5 s), then cancel their handlers: a
        plain-text 500 and a traceback."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        # the drain is over: no new connection to wait for (a signal that came before
        # uvicorn made its listening servers finds none)
        for server in getattr(self, "servers", ()):
            server.close()
        self._refuse_uploads()
        me = asyncio.current_task()
        tasks = [t for t in self.server_state.tasks if t is not me and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        self._refuse_uploads()  # a request whose body began meanwhile
        for conn in list(self.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()  # once what was written has gone out
        while self.server_state.connections and loop.time() < end:
            await asyncio.sleep(0.02)
        for conn in list(self.server_state.connections):  # a client that stopped reading
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()

    def _refuse_uploads(self) -> None:
        """A 503 `server_shutting_down` to every request still sending its body (its
        handler sees the connection close and ends)."""
        for conn in list(self.server_state.connections):
            cycle = getattr(conn, "cycle", None)
            transport = getattr(conn, "transport", None)
            if cycle is None or cycle.response_started or not cycle.more_body:
                continue
            if getattr(conn, "pipeline", None):
                # a pipelined request, queued behind a response still being written: a
                # 503 now would land inside that response (the connection closes after it)
                continue
            if transport is None or transport.is_closing():
                continue
            self.engine.metrics.rejected["draining"] += 1
            msg = "the server shut down before the request's body arrived"
            transport.write(_raw_error(503, msg, "server_shutting_down", "service_unavailable"))
            transport.close()

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        lifespan = getattr(self, "lifespan", None)
        done = getattr(lifespan, "shutdown_event", None)
        if self.force_exit and done is not None and not done.is_set():
            # A third signal made uvicorn skip the app's shutdown, whose task asyncio.run
            # would then cancel (a traceback in the log): run it, briefly (the second
            # signal already ended every request, so the engine has nothing to drain).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lifespan.shutdown(), timeout=2.0)

    def handle_exit(self, sig, frame) -> None:
        if not self._draining and not self.should_exit:
            self.begin_drain()
        else:
            self.stop_now(sig)

    @contextlib.contextmanager
    def capture_signals(self):
        # like uvicorn's, but without re-raising the signal afterwards: a drained server
        # exits normally
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)


_BACKLOG = 4096


def make_server(backend: Backend, cfg: ServerConfig) -> GracefulServer:
    app = build_app(backend, cfg)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        access_log=False,
        lifespan="on",
        backlog=_BACKLOG,
        timeout_keep_alive=30,
        http=protocol_class(cfg),
        h11_max_incomplete_event_size=cfg.max_header_bytes,
        timeout_graceful_shutdown=int(cfg.drain_timeout) + 5,
    )
    return GracefulServer(config, app.state.engine, cfg.drain_timeout)


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, as uvicorn binds it; ConfigError (one line naming
    --host or --port) if it cannot be, instead of uvicorn's log line and exit code 3 once
    the backend is built."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # listening now, not when uvicorn starts: with SO_REUSEADDR two sockets that only
        # bind both succeed on Linux, and the later listen() that fails (while the model
        # loads) is swallowed by the event loop's create_server, leaving a server that
        # never accepts
        sock.listen(_BACKLOG)
    except OSError as e:
        sock.close()
        reason = e.strerror or str(e)
        if isinstance(e, socket.gaierror):
            raise ConfigError(f"--host {host!r} is not an address of this machine: {reason}") from None
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: address {host}:{port} is already in use") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host!r} is not an address of this machine: {reason}") from None
        raise ConfigError(f"cannot listen on --host {host!r} --port {port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def serve(backend: Backend, cfg: ServerConfig, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT/SIGTERM (blocking). Returns after a drain; raises SystemExit(128 +
    signal) when a second signal cut the drain short."""
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
    server = make_server(backend, cfg)
    old = sys.getswitchinterval()
    if cfg.switch_interval:
        # the engine thread must get the GIL back quickly when a step ends
        sys.setswitchinterval(cfg.switch_interval)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        sys.setswitchinterval(old)
    if server.exit_code:
        raise SystemExit(server.exit_code)
