"""A second SIGTERM during a drain (issue #13, item 4): the running streams end with an
explicit error event, nothing is logged as a traceback, and the exit status says the
drain was cut short (128 + SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from srv_helpers import wait_for
from test_robustness import _free_port, _health, _streams_started, _up

MODEL = "llmsched-sim"


def test_second_sigterm_ends_streams_with_errors_and_exits_143():
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmsched",
            "serve",
            "--backend",
            "sim",
            "--cost-model",
            "const:10",
            "--port",
            str(port),
            "--drain-timeout",
            "60",
            "--log-level",
            "info",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    stalled = None
    try:
        assert wait_for(lambda: _up(base), timeout=20), "server did not start"
        results = {}
        threads = _streams_started(base, 6, 3000, results)  # 30 s of tokens each
        # and an upload that never finishes: it must not hold the exit up
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{")
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: _health(base) == 503, timeout=10)  # draining
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
        for t in threads:
            t.join(30)
        assert len(results) == 6
        for status, ev in results.values():
            assert status == 200 and ev[-1] == "[DONE]"
            err = ev[-2]["error"]
            assert err["code"] == "server_shutting_down" and err["type"] == "service_unavailable"
            assert 1 <= len(ev) - 2 < 3000  # cut short, after some tokens
        out = proc.stdout.read().decode()
        assert "Traceback" not in out and "ERROR" not in out, out
        assert "second signal" in out
    finally:
        if stalled is not None:
            stalled.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _sim_server():
    """A `serve --backend sim` process on a free port, up: (process, base URL)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsched", "serve", "--backend", "sim", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    if not wait_for(lambda: _up(base), timeout=20):
        proc.kill()
        proc.wait()
        raise AssertionError("server did not start")
    return proc, base


def test_first_sigterm_without_requests_exits_0():
    proc, base = _sim_server()
    try:
        assert httpx.get(base + "/v1/models").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_third_signal_exits_at_once_without_a_traceback():
    """docs/serving.md: a third signal skips the rest of the shutdown. uvicorn's force exit
    skipped the app's lifespan shutdown, and asyncio.run then cancelled its task: a
    CancelledError traceback in the log (signals 20-50 ms apart)."""
    proc, _ = _sim_server()
    try:
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        assert proc.wait(30) == 128 + signal.SIGINT
        out = proc.stdout.read().decode()
        assert "Traceback" not in out and "CancelledError" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _recv_all(sock: socket.socket, limit: float = 10.0) -> bytes:
    """What the server sent on `sock` until it closed the connection (at most `limit` s)."""
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _generated(base: str) -> float:
    """The server's generation_tokens_total."""
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("llmsched:generation_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError("no generation_tokens_total in /metrics")


def test_first_sigterm_ends_a_stalled_upload_and_a_stalled_reader_without_waiting():
    """docs/serving.md: the drain waits only for running requests. An upload that stalled
    mid-body, and a stream whose client stopped reading, made uvicorn wait its graceful
    timeout (drain timeout + 5 s), then cancel their handlers: a plain-text 500 for the
    upload and CancelledError tracebacks in the log."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsched", "serve", "--backend", "sim", "--cost-model", "const:1"]
        + ["--port", str(port), "--drain-timeout", "0", "--log-level", "info"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    upload = reader = None
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _up(base), timeout=20), "server did not start"
        upload = socket.create_connection(("127.0.0.1", port))
        upload.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills up soon
        reader.connect(("127.0.0.1", port))
        body = b'{"model": "%s", "prompt": "hi", "max_tokens": 3000, "n": 64, "stream": true}' % MODEL.encode()
        reader.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        assert reader.recv(12) == b"HTTP/1.1 200"  # streaming; then it reads no more
        # tokens (~200 bytes each) enough to fill the socket buffers (~3 MB) and pause the writer
        assert wait_for(lambda: _generated(base) >= 40000, timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(4) == 0  # the 1 s the handlers get to write, not uvicorn's 5 s
        head, _, payload = _recv_all(upload).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"application/json" in head, head
        assert json.loads(payload)["error"]["code"] == "server_shutting_down"
        _recv_all(reader)  # the server closed the stream's connection
        out = proc.stdout.read().decode()
        assert "Traceback" not in out and "ERROR" not in out, out
    finally:
        for s in (upload, reader):
            if s is not None:
                s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pipelined_upload_is_refused_after_the_response_ahead_of_it():
    """A request pipelined behind a stream, its body not all sent: the drain's 503 for it
    came inside the stream's chunked body (no error event, no terminator); the stream now
    ends first, then the 503 follows."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsched", "serve", "--backend", "sim", "--cost-model", "const:50"]
        + ["--port", str(port), "--drain-timeout", "0", "--log-level", "info"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    conn = None
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _up(base), timeout=20), "server did not start"
        conn = socket.create_connection(("127.0.0.1", port))
        body = b'{"model": "%s", "prompt": "hi", "max_tokens": 3000, "stream": true}' % MODEL.encode()
        stream = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        conn.sendall(stream + b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{")
        assert conn.recv(12) == b"HTTP/1.1 200"
        assert wait_for(lambda: _generated(base) >= 3, timeout=20)  # the stream is under way
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(4) == 0
        data = _recv_all(conn)
        stream_part, sep, refusal = data.partition(b"0\r\n\r\nHTTP/1.1 503 ")
        assert sep, data[-400:]  # the stream's last chunk, then the pipelined request's 503
        assert b"server_shutting_down" in stream_part and stream_part.rstrip().endswith(b"data: [DONE]")
        assert b"HTTP/1.1" not in stream_part[12:]
        assert json.loads(refusal.partition(b"\r\n\r\n")[2])["error"]["code"] == "server_shutting_down"
    finally:
        if conn is not None:
            conn.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_EARLY_SIGNAL = """
import asyncio, os, signal, sys, threading
import uvicorn.lifespan.on as on

startup = on.LifespanOn.startup


async def late_startup(self):
    await startup(self)  # the app's lifespan ran: its engine started, no listening server yet
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0.5)


on.LifespanOn.startup = late_startup
threading.Timer(8, lambda: (print("still running", flush=True), os._exit(3))).start()
from llmsched.cli import main

print("serve returned", main(["serve", "--backend", "sim", "--cost-model", "const:1", "--port", sys.argv[1],
                              "--drain-timeout", "2"]), flush=True)
os._exit(0)
"""


def test_a_signal_before_the_listening_server_exists_still_exits_0():
    """A SIGTERM after the app's start-up but before uvicorn made its listening server: the
    drain failed on the missing `servers` (a task exception), never set should_exit, and the
    server went on refusing everything until a second signal (exit 143)."""
    r = subprocess.run(
        [sys.executable, "-c", _EARLY_SIGNAL, str(_free_port())], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and "serve returned 0" in r.stdout, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "exception" not in r.stderr.lower(), r.stderr
