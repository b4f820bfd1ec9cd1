"""Helpers for the server tests: a real uvicorn server on a free loopback port."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx

from llmsched.server.app import ServerConfig
from llmsched.server.backends import SchedulerOptions, make_sim_backend
from llmsched.server.serving import make_server


@contextlib.contextmanager
def running_server(backend=None, cfg: ServerConfig | None = None, **sim):
    """Serve `backend` (default: a sim backend built from `sim` keywords) in a thread.
    Yields (base_url, server); the app is `server.config.app`."""
    if backend is None:
        cost = sim.pop("cost", "const:5")
        backend = make_sim_backend(SchedulerOptions(**sim), cost)
    cfg = cfg or ServerConfig()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(backend, cfg)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    if not server.ready.wait(20):
        raise RuntimeError("the test server did not start")
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        t.join(30)
        sock.close()


@contextlib.contextmanager
def tiny_engine_server(folder, *, max_model_len: int = 512, num_blocks: int = 128):
    """The engine backend on a tiny model written to `folder`, served in a thread. Yields
    (base_url, server, backend)."""
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import make_engine_backend

    model_dir = make_tiny_model(folder / "model")
    backend = make_engine_backend(
        str(model_dir),
        SchedulerOptions(b_max=256, max_running=16),
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        block_size=16,
        seed=0,
    )
    with running_server(backend) as (base, srv):
        yield base, srv, backend


def engine_of(server):
    return server.config.app.state.engine


def wait_for(pred, timeout: float = 5.0, interval: float = 0.01):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


def parse_sse(raw: bytes) -> list:
    """The events of an SSE body: parsed JSON objects, and the string '[DONE]'."""
    text = raw.decode()
    assert text.endswith("\n\n"), "an SSE body ends with a blank line"
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append("[DONE]" if data == "[DONE]" else json.loads(data))
    return events


def post(base: str, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        base + path,
        content=content,
        headers={"content-type": "application/json", **kw.pop("headers", {})},
        timeout=30,
        **kw,
    )
