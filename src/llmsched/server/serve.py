"""Running the app under uvicorn, with a graceful shutdown.

On the first SIGINT/SIGTERM the server drains: new requests get 503, /health turns 503,
the accepted requests run to completion (at most `drain_timeout` seconds; any left then
end with an error), and the process exits with status 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading

import uvicorn

from .app import ServerConfig, build_app
from .backends import Backend

log = logging.getLogger("llmsched.server")


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, drain_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.drain_timeout = drain_timeout
        self._draining = False
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
        n = len(self.engine.streams)
        log.warning("draining: refusing new requests, waiting for %d running request(s)", n)
        ok = await self.engine.drain(self.drain_timeout)
        if not ok:
            log.warning("drain timeout (%.0f s): the remaining requests were ended", self.drain_timeout)
        self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        if not self._draining and not self.should_exit:
            self.begin_drain()
        else:
            self.should_exit = True
            self.force_exit = True

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


def make_server(backend: Backend, cfg: ServerConfig) -> GracefulServer:
    app = build_app(backend, cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                            access_log=False, lifespan="on", backlog=4096,
                            timeout_keep_alive=30,
                            timeout_graceful_shutdown=int(cfg.drain_timeout) + 5)
    return GracefulServer(config, app.state.engine, cfg.drain_timeout)


def serve(backend: Backend, cfg: ServerConfig, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s")
    server = make_server(backend, cfg)
    old = sys.getswitchinterval()
    if cfg.switch_interval:
        # the engine thread must get the GIL back quickly when a step ends
        sys.setswitchinterval(cfg.switch_interval)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        sys.setswitchinterval(old)
