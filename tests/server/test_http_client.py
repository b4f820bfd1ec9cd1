"""The bench's minimal HTTP/1.1 client: de-chunking whatever way the bytes arrive."""

from __future__ import annotations

import asyncio

import pytest

from llmsched.server.http_client import Response


class _Conn:
    def __init__(self):
        self.loop = None
        self.closed = False


def _feed_all(raw: bytes, cuts):
    r = Response(_Conn())
    prev = 0
    for i, c in enumerate([*cuts, len(raw)]):
        r._feed(raw[prev:c], float(i))
        prev = c
    return r


BODY = [b'data: {"a": 1}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in BODY)
    + b"0\r\n\r\n"
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_chunked_any_split(step):
    r = _feed_all(CHUNKED, list(range(step, len(CHUNKED), step)))
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    assert b"".join(p for _, p in r._pieces) == b"".join(BODY)
    assert r._done and r._reuse and r._error is None
    # time stamps are those of the reads that brought the bytes
    assert [t for t, _ in r._pieces] == sorted(t for t, _ in r._pieces)


def test_content_length_and_connection_close():
    raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
    r = _feed_all(raw, [10, 60])
    assert r.status == 429 and b"".join(p for _, p in r._pieces) == b"hello"
    assert r._done and not r._reuse


def test_truncated_response_is_an_error():
    r = _feed_all(CHUNKED[:-10], [])
    r._eof(None)
    assert r._error is not None and not r._done

    async def body():
        return [p async for p in r.iter_body()]

    r._conn.loop = asyncio.new_event_loop()
    try:
        with pytest.raises(Exception):
            r._conn.loop.run_until_complete(body())
    finally:
        r._conn.loop.close()
