"""A minimal asyncio HTTP/1.1 client for the benchmark's load path.

Why not httpx here: with 256 token streams, httpx/httpcore/h11 cost about 60 us of Python
per received chunk, which saturates a CPU core at a real GPU's token rate and makes the
client, not the server, the bottleneck (tokens pile up and arrive in clumps).

This client does only what a benchmark needs: keep-alive connections (a pool per base
URL), one request at a time per connection, the status and headers, and the body as it
arrives, de-chunked. It is an `asyncio.Protocol`: each network read is time-stamped in
`data_received`, when the event loop reads the socket, not when the consuming task next
runs, so a burst of tokens on many streams does not skew the measured times. http and
https (TLS); no proxies, redirects or HTTP/2. `llmsched bench --http-client httpx` uses
httpx instead.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
import time
from urllib.parse import urlsplit

_now = time.perf_counter


class HTTPClientError(Exception):
    pass


class Response:
    """One response, fed by its connection's protocol."""

    def __init__(self, conn: _Conn):
        self._conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head = b""
        self._head_done = False
        self._pieces: list[tuple[float, bytes]] = []
        self._waiter: asyncio.Future | None = None
        self._done = False
        self._error: Exception | None = None
        self._mode = "eof"  # "chunked", "length" or "eof"
        self._left = 0  # length mode: bytes left; chunked: bytes left of the chunk
        self._state = 0  # chunked: 0 size line, 1 data, 2 CRLF, 3 trailer
        self._buf = b""
        self._reuse = True

    # ---- fed by the protocol ------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes, now: float) -> None:
        if not self._head_done:
            self._head += data
            i = self._head.find(b"\r\n\r\n")
            if i < 0:
                return
            head, data = self._head[:i], self._head[i + 4 :]
            self._head = b""
            try:
                self._parse_head(head)
            except Exception as e:  # noqa: BLE001 - a malformed response is an error result
                self._fail(HTTPClientError(f"bad response head: {e}"))
                return
            self._head_done = True
            self._wake()
            if not data and self._mode != "length":
                return
        out = self._decode(data) if data or self._mode == "length" else b""
        if out:
            self._pieces.append((now, out))
        if out or self._done:
            self._wake()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise HTTPClientError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        h = self.headers
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            h[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        if "chunked" in h.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in h:
            self._mode = "length"
            self._left = int(h["content-length"])
            if self._left == 0:
                self._done = True
        else:
            self._mode = "eof"
        if h.get("connection", "").lower() == "close":
            self._reuse = False

    def _decode(self, data: bytes) -> bytes:
        if self._mode == "length":
            piece = data[: self._left]
            self._left -= len(piece)
            if self._left <= 0:
                self._done = True
            return piece
        if self._mode == "eof":
            return data
        buf = self._buf + data if self._buf else data
        out = []
        state, left = self._state, self._left
        while True:
            if state == 1:
                if not buf:
                    break
                take = buf[:left]
                buf = buf[len(take) :]
                left -= len(take)
                out.append(take)
                if left:
                    break
                state = 2
            elif state == 2:
                if len(buf) < 2:
                    break
                buf = buf[2:]
                state = 0
            elif state == 0:
                i = buf.find(b"\r\n")
                if i < 0:
                    break
                size = int(buf[:i].split(b";", 1)[0], 16)
                buf = buf[i + 2 :]
                if size == 0:
                    state = 3
                else:
                    left = size
                    state = 1
            else:
                i = buf.find(b"\r\n")
                if i < 0:
                    break
                line, buf = buf[:i], buf[i + 2 :]
                if not line:  # end of the trailers: the response is complete
                    self._done = True
                    if buf:
                        self._reuse = False
                    buf = b""
                    break
        self._buf, self._state, self._left = buf, state, left
        return out[0] if len(out) == 1 else b"".join(out)

    def _eof(self, exc: Exception | None) -> None:
        if self._mode == "eof" and self._head_done and exc is None:
            self._done = True
        elif not self._done:
            self._error = exc or HTTPClientError("the server closed the connection mid-response")
        self._reuse = False
        self._wake()

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        self._reuse = False
        self._wake()

    # ---- used by the caller -------------------------------------------------------------
    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _wait_head(self) -> None:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def iter_body(self):
        """(arrival time, bytes) for each network read of the body, de-chunked."""
        while True:
            if self._pieces:
                pieces, self._pieces = self._pieces, []
                for p in pieces:
                    yield p
                continue
            if self._done:
                return
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        return b"".join([p async for _, p in self.iter_body()])

    def close(self) -> None:
        """Give the connection back (if the response was read whole) or close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.resp = None
        if self._done and self._reuse and not conn.closed:
            conn.pool._idle.append(conn)
        else:
            conn.close()


class _Conn(asyncio.Protocol):
    def __init__(self, pool: HTTPClient, loop):
        self.pool = pool
        self.loop = loop
        self.transport = None
        self.resp: Response | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is not None:
            r._feed(data, _now())

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.resp is not None:
            self.resp._eof(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HTTPClient:
    """Keep-alive connections to one base URL."""

    def __init__(self, base_url: str):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise HTTPClientError(f"unsupported URL scheme in {base_url!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl = _ssl.create_default_context() if u.scheme == "https" else None
        self.host_header = u.netloc.encode()
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(self, loop), self.host, self.port, ssl=self.ssl)
        return conn

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> Response:
        """Send a request; returns once the status and headers are in."""
        head = [
            f"{method} {self.prefix}{path} HTTP/1.1".encode(),
            b"host: " + self.host_header,
            b"content-length: " + str(len(body)).encode(),
        ]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode())
        raw = b"\r\n".join(head) + b"\r\n\r\n" + body
        for attempt in range(2):
            conn = None
            while self._idle and conn is None:
                c = self._idle.pop()
                conn = None if c.closed else c
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            resp = Response(conn)
            conn.resp = resp
            try:
                conn.transport.write(raw)
                await resp._wait_head()
                return resp
            except (ConnectionError, HTTPClientError):
                conn.resp = None
                conn.close()
                if not reused or attempt:  # a kept-alive connection may have been closed: retry once
                    raise
        raise HTTPClientError("unreachable")

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
