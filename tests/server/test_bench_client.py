"""`llmsched bench`'s client: distinct text prompts, SSE line endings, the descriptor limit,
interruption, queue times."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import signal
import socketserver
import subprocess
import sys
import threading
import types
import warnings

import httpx
import numpy as np
import pytest
from srv_helpers import running_server

from llmsched.server.bench import BenchConfig, Workload, build_payloads, run_bench
from llmsched.server.tokenizer import ByteRuleTokenizer


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(f"llmsched:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def test_text_prompts_differ_from_their_first_token():
    """Text prompts were one word repeated: every prompt was the same text, so a prefix
    cache served all but the last block of each."""
    wl = Workload(np.zeros(3), np.array([40, 40, 40]), np.array([2, 2, 2]))
    for cfg in (BenchConfig(endpoint="/v1/chat/completions"), BenchConfig(prompt_format="text")):
        bodies = [json.loads(p) for p in build_payloads(cfg, wl, "m")]
        texts = [b["messages"][0]["content"] if cfg.chat else b["prompt"] for b in bodies]
        ids = [ByteRuleTokenizer(content_ids=True).encode(t) for t in texts]
        assert all(len(i) == 40 for i in ids)
        assert len({tuple(i[:16]) for i in ids}) == 3  # the first 16-token blocks all differ
        again = [json.loads(p) for p in build_payloads(cfg, wl, "m")]
        assert again == bodies  # the same seed: the same prompts


def test_chat_prompts_miss_a_prefix_cache_and_keep_their_lengths():
    with running_server(prefix_caching=True, block_size=16) as (base, _):
        cfg = BenchConfig(
            base_url=base,
            backend="openai-chat",
            num_prompts=6,
            input_len=64,
            output_len=2,
            quiet=True,
            num_warmups=0,
            save_detailed=True,
        )
        res = run_bench(cfg)
        assert res["completed"] == 6 and res["input_lens"] == [64] * 6
        assert _metric(base, "prefix_cache_queries_total") == 6 * 64
        assert _metric(base, "prefix_cache_hits_total") == 0
        assert res["text_unit_exact"] and len(res["text_units"]) > 1


def test_sse_events_split_on_any_line_ending_across_pieces():
    from llmsched.server.bench import SSEEvents

    for nl in (b"\n", b"\r\n", b"\r"):
        stream = b"".join(b"data: " + e + nl + nl for e in (b'{"a":1}', b": ping", b"[DONE]"))
        # (a final CR may be half a CRLF: held back until more comes, so a last comment)
        stream = b": hello" + nl + nl + stream + b": bye" + nl + nl
        for cut in range(len(stream) + 1):  # every split into two pieces, CR|LF included
            sse = SSEEvents()
            events = sse.feed(stream[:cut]) + sse.feed(stream[cut:])
            want = [b": hello", b'data: {"a":1}', b"data: : ping", b"data: [DONE]"]
            assert [e.strip() for e in events[:4]] == want
            assert len(sse.buf) <= len(b": bye\n")  # consumed events are not kept


def test_a_cr_ended_stream_gives_its_last_event_at_its_end():
    """With CR line endings a stream's last CR (its last event's blank line) was held back
    as half of a CRLF and never released: the last event (a usage-only chunk, or [DONE])
    was lost. An event without its blank line is still dropped, as the standard says."""
    from llmsched.server.bench import SSEEvents

    stream = b'data: {"a":1}\r\rdata: {"usage":{}}\r\r'
    for cut in range(len(stream) + 1):
        sse = SSEEvents()
        events = sse.feed(stream[:cut]) + sse.feed(stream[cut:]) + sse.close()
        assert [e.strip() for e in events] == [b'data: {"a":1}', b'data: {"usage":{}}']
    sse = SSEEvents()
    assert sse.feed(b"data: 1\n\ndata: 2\n") == [b"data: 1"] and sse.close() == []


def test_run_bench_puts_the_processs_signal_handlers_back():
    """run_bench stops on SIGINT/SIGTERM while it runs; after it, SIGTERM was left at the
    default (kill) and SIGINT at KeyboardInterrupt's, whatever the caller had set."""
    mine = lambda signum, frame: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine), signal.signal(signal.SIGINT, mine)
    try:
        with _sse_server(1) as base:
            res = run_bench(BenchConfig(base_url=base, num_prompts=1, input_len=4, output_len=1, quiet=True))
        assert res["completed"] == 1
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


@contextlib.contextmanager
def _sse_server(n_tokens: int, nl: str = "\r\n"):
    """A server whose completion streams end their SSE lines in `nl` (CRLF: as
    sse-starlette's do), each event in its own write."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += self.rfile.read(1)
            size = [int(v) for k, v in re.findall(rb"(?i)(content-length): *(\d+)", head)]
            self.rfile.read(size[0] if size else 0)
            if head.startswith(b"GET /v1/models"):
                body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
                self.wfile.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                return
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            events = [{"choices": [{"index": 0, "text": " t", "finish_reason": None}]}] * n_tokens
            events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n_tokens}})
            for e in [json.dumps(e) for e in events] + ["[DONE]"]:
                self.wfile.write(f"data: {e}{nl}{nl}".encode())
                self.wfile.flush()

    socketserver.ThreadingTCPServer.daemon_threads = True
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_streams_with_crlf_events_are_measured():
    with _sse_server(3) as base:
        for client in ("raw", "httpx"):
            cfg = BenchConfig(base_url=base, num_prompts=2, input_len=4, output_len=3, quiet=True, http_client=client)
            res = run_bench(cfg)
            assert res["completed"] == 2 and res["failed"] == 0, res["errors_sample"]
            assert res["total_output_tokens"] == 6 and res["total_input_tokens"] == 10


def _bench_with_fd_limit(soft: int, hard: int, *args: str) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    script = (
        "import resource, sys\nfrom llmsched.cli import main\n"
        "try:\n    sys.exit(main(sys.argv[1:]))\n"
        "finally:\n    print('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    # nothing listens on port 1: the run stops at its first request, after the check
    argv = ["bench", "--base-url", "http://127.0.0.1:1", "--input-len", "8", *args]
    return subprocess.run(
        [sys.executable, "-c", script, *argv], preexec_fn=limit, capture_output=True, text=True, timeout=60
    )


def test_too_few_file_descriptors_are_raised_or_named():
    """Requests beyond `ulimit -n` failed to connect and were counted as server failures."""
    p = _bench_with_fd_limit(200, 200, "--num-prompts", "1500")
    assert p.returncode == 2 and "cannot reach" in p.stderr
    lines = [x for x in p.stderr.splitlines() if "ulimit -n" in x]
    assert len(lines) == 1 and "at most 200 files" in lines[0] and "--max-concurrency" in lines[0]
    # a --max-concurrency that fits: no warning
    p = _bench_with_fd_limit(200, 200, "--num-prompts", "1500", "--max-concurrency", "100")
    assert p.returncode == 2 and "ulimit" not in p.stderr
    # the soft limit is raised to the hard one, which suffices: no warning
    p = _bench_with_fd_limit(200, 4096, "--num-prompts", "1500")
    assert "ulimit" not in p.stderr and "soft 4096" in p.stdout


def test_queue_times_are_not_negative_when_a_timer_wakes_early(monkeypatch):
    """Queue times were measured from the scheduled send, so a request sent before it
    (uvloop's timers wake up to 1 ms early) had a negative one. Here every timer wakes at
    once: the requests go out up to ~1 s early; no queue time may be negative."""
    from llmsched.server import bench

    fast = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    fast.sleep = lambda delay, *a: asyncio.sleep(0)
    monkeypatch.setattr(bench, "asyncio", fast)
    with _sse_server(2, "\n") as base:
        cfg = BenchConfig(base_url=base, num_prompts=5, input_len=4, output_len=2, request_rate=5.0, quiet=True)
        res = run_bench(cfg)
    assert res["completed"] == 5
    assert min(res["queue_times"]) >= 0


def test_a_short_trace_names_the_count_the_user_gave(tmp_path):
    """A trace shorter than the default count warned "num_requests=1,000 replays them
    all": a count the user never gave, under a name bench has no flag for."""
    from llmsched.core.errors import InputWarning
    from llmsched.server.bench import make_workload

    trace = tmp_path / "tr.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i / 10},{8 + i},4\n" for i in range(80)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(make_workload(BenchConfig(dataset_name="trace", dataset_path=str(trace)))) == 80
    assert [str(w.message) for w in caught] == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wl = make_workload(BenchConfig(dataset_name="trace", dataset_path=str(trace), num_prompts=1000))
    assert len(wl) == 80 and [w.category for w in caught] == [InputWarning]
    assert str(caught[0].message) == f"--num-prompts 1,000: trace {trace} has 80 requests, all are replayed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(make_workload(BenchConfig(dataset_name="trace", dataset_path=str(trace), num_prompts=30))) == 30
    assert caught == []


@contextlib.contextmanager
def _hanging_server(answered: int):
    """Answers `answered` completion requests (one token each), then holds every further
    one open without a byte; `.hung` is set when the first held request arrives."""
    state = types.SimpleNamespace(count=0, lock=threading.Lock(), hung=threading.Event())

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    c = self.rfile.read(1)
                    if not c:
                        return
                    head += c
                size = [int(v) for k, v in re.findall(rb"(?i)(content-length): *(\d+)", head)]
                self.rfile.read(size[0] if size else 0)
                with state.lock:
                    state.count += 1
                    k = state.count
                if k > answered:
                    state.hung.set()
                    self.rfile.read()  # until the client closes the connection
                    return
                events = [{"choices": [{"index": 0, "text": " t", "finish_reason": "length"}]}, "[DONE]"]
                body = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events).encode()
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
                self.wfile.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                self.wfile.flush()

    socketserver.ThreadingTCPServer.daemon_threads = True
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", state
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("sig", "rc"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_keeps_what_finished(tmp_path, sig, rc):
    """Ctrl-C or SIGTERM mid-run discarded every result. With --max-concurrency 1 the
    third request reaches the server only after the client finished the first two."""
    out = tmp_path / "r.json"
    with _hanging_server(answered=2) as (base, state):
        argv = ["bench", "--base-url", base, "--model", "m", "--num-warmups", "0", "--input-len", "4"]
        argv += ["--output-len", "1", "--num-prompts", "4", "--max-concurrency", "1", "--result-file", str(out)]
        p = subprocess.Popen(
            [sys.executable, "-m", "llmsched", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert state.hung.wait(60)
            p.send_signal(sig)
            stdout, stderr = p.communicate(timeout=60)
        finally:
            p.kill()
    assert p.returncode == rc, stderr
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and data["completed"] == 2 and data["failed"] == 2
    assert data["errors_sample"] == ["interrupted"] * 2
    assert "Successful requests" in stdout and "2 of 4 requests unfinished" in stderr
