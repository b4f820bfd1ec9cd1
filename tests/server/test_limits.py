"""Request limits and hostile input over real HTTP (issue #13, items 2-5): body size and
read-time limits, header size and timeouts, text prompts refused before tokenizing,
/tokenize behind the API key, no 5xx or exception text for client input, no redirects,
404 for unknown models and GET /v1/models/{id}."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from srv_helpers import post, running_server

from llmsched.server.app import ServerConfig
from llmsched.server.backends import SchedulerOptions, make_sim_backend

MODEL = "llmsched-sim"
LIMITS = ServerConfig(max_body_bytes=1_000_000, max_header_bytes=4096, read_timeout=1.0, api_key="sekret")
AUTH = {"authorization": "Bearer sekret"}


@pytest.fixture(scope="module")
def server():
    backend = make_sim_backend(SchedulerOptions(b_max=256), "const:2", max_model_len=1000)
    with running_server(backend, LIMITS) as (base, srv):
        yield base, srv


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _read_all(sock: socket.socket, timeout: float = 20.0) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    sock.settimeout(timeout)
    out = b""
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                break
            out += b
    except ConnectionResetError:  # the server closed with our unread upload in its buffer
        pass
    return out


def _raw(base: str, data: bytes, timeout: float = 20.0) -> bytes:
    with socket.create_connection(("127.0.0.1", _port(base))) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _read_all(s, timeout)


def _split(raw: bytes):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return status, headers, body


def _json_error(raw: bytes, status: int, code: str) -> dict:
    st, headers, body = _split(raw)
    assert st == status, raw[:300]
    assert headers["content-type"].startswith("application/json")
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return headers


def _head(path: str, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer sekret\r\n"
        f"content-type: application/json\r\n{extra}\r\n"
    ).encode()


# ---- item 3: body size and body read time ---------------------------------------------
def test_announced_oversized_body_is_413_before_any_byte_is_read(server):
    base, srv = server
    with socket.create_connection(("127.0.0.1", _port(base))) as s:
        # 100 MB announced, not one byte sent: the answer comes anyway, and the
        # connection is closed (the rest would not be read)
        s.sendall(_head("/v1/completions", "content-length: 100000000\r\n"))
        raw = _read_all(s)
    h = _json_error(raw, 413, "request_too_large")
    assert h["connection"] == "close"
    for path in ("/tokenize", "/detokenize", "/v1/chat/completions"):
        raw = _raw(base, _head(path, "content-length: 1000001\r\n"))
        _json_error(raw, 413, "request_too_large")
    assert srv.config.app.state.metrics.rejected["body_too_large"] >= 4


def test_chunked_body_over_the_limit_is_413_and_not_read_whole(server):
    base, _ = server
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(64)) + b"0\r\n\r\n"  # 4 MiB
    raw = _raw(base, _head("/tokenize", "transfer-encoding: chunked\r\n") + body)
    _json_error(raw, 413, "request_too_large")
    # at the limit it is read (and answered on its merits)
    ok = post(base, "/tokenize", {"prompt": "x" * 100}, headers=AUTH)
    assert ok.status_code == 200


def test_stalled_body_upload_gets_408_and_is_closed_while_others_are_served(server):
    base, _ = server
    with socket.create_connection(("127.0.0.1", _port(base))) as s:
        s.sendall(_head("/v1/completions", "content-length: 1000\r\n") + b'{"model": "')  # 11 of 1000
        # the server keeps serving while that handler waits
        r = post(base, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=AUTH)
        assert r.status_code == 200
        raw = _read_all(s)
    h = _json_error(raw, 408, "request_timeout")
    assert h["connection"] == "close"


def test_slow_dribble_body_is_cut_at_the_read_timeout(server):
    base, _ = server
    with socket.create_connection(("127.0.0.1", _port(base))) as s:
        s.sendall(_head("/tokenize", "content-length: 100\r\n"))
        got = b""
        s.settimeout(0.2)
        for _ in range(100):  # one byte every 0.2 s would take 20 s: never finishes
            try:
                s.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                got += s.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if got:
                break
        got += _read_all(s)
    _json_error(got, 408, "request_timeout")


# ---- item 3: headers ------------------------------------------------------------------
def test_oversized_headers_are_431_json(server):
    base, _ = server
    big = "x-pad: " + "a" * 10000 + "\r\n"
    raw = _raw(base, _head("/v1/completions", big + "content-length: 2\r\n") + b"{}")
    _json_error(raw, 431, "request_header_fields_too_large")
    # trickled in small pieces, never finished: cut once over the cap
    with socket.create_connection(("127.0.0.1", _port(base))) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        for _ in range(20):
            try:
                s.sendall(b"x-pad: " + b"a" * 500 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.01)
        raw = _read_all(s)
    _json_error(raw, 431, "request_header_fields_too_large")
    assert httpx.get(base + "/health").status_code == 200


def test_stalled_headers_get_408_and_idle_connections_are_closed(server):
    base, _ = server
    raw = _raw(base, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
    _json_error(raw, 408, "request_timeout")
    with socket.create_connection(("127.0.0.1", _port(base))) as s:  # never sends a byte
        assert _read_all(s) == b""  # closed, not held


def test_malformed_http_is_a_json_400(server):
    base, _ = server
    for junk in (
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\ncontent-length: nope\r\n\r\n",
    ):
        raw = _raw(base, junk)
        h = _json_error(raw, 400, "invalid_http_request")
        assert h["connection"] == "close"


# ---- item 1 (sim backend): text refused before tokenizing ------------------------------
def test_text_over_the_byte_bound_is_refused_before_tokenizing(server):
    base, _ = server

    # max_model_len 1000, 4 bytes per token: text over 4000 bytes cannot fit
    def comp(prompt, **kw):
        return post(base, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1, **kw}, headers=AUTH)

    assert comp("x" * 3996).status_code == 200  # 999 tokens + 1
    for prompt in ("x" * 4001, "é" * 2001, "x" * 900_000):  # 4001, 4002 and 900000 bytes
        r = comp(prompt)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert "bytes of text" in err["message"] and err["param"] == "prompt"
    r = post(
        base,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x" * 3000}, {"role": "user", "content": "y" * 1001}],
        },
        headers=AUTH,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "bytes of text" in r.json()["error"]["message"]
    r = post(
        base,
        "/v1/chat/completions",
        {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": ""}] * 5000},
        headers=AUTH,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # token ids: the list's length is checked before its items
    r = comp(list(range(1001)) + ["junk"] * 100_000)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # /tokenize: the same bound
    r = post(base, "/tokenize", {"prompt": "x" * 4001}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(base, "/tokenize", {"prompt": "x" * 4000}, headers=AUTH)
    assert r.status_code == 200 and r.json()["count"] == 1000
    r = post(base, "/detokenize", {"tokens": [1] * 1001}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_large_bodies_within_limits_are_served(server):
    base, _ = server
    # above the size that is parsed off the event loop, below the body limit
    r = post(
        base,
        "/v1/completions",
        {"model": MODEL, "prompt": list(range(1, 990)), "max_tokens": 2, "pad": "p" * 200_000},
        headers=AUTH,
    )
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 989
    r = post(base, "/tokenize", {"prompt": "ab" * 1500, "pad": "p" * 200_000}, headers=AUTH)
    assert r.status_code == 200 and r.json()["count"] == 750
    r = post(base, "/detokenize", {"tokens": [1] * 900, "pad": "p" * 200_000}, headers=AUTH)
    assert r.status_code == 200 and r.json()["prompt"] == " tok" * 900


# ---- item 2: /tokenize needs the key ----------------------------------------------------
def test_tokenize_and_detokenize_need_the_api_key(server):
    base, _ = server
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        r = post(base, path, body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert post(base, path, body, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert post(base, path, body, headers=AUTH).status_code == 200
    # refused before the body is read: a 100 MB upload without the key is not taken in
    raw = _raw(base, b"POST /tokenize HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n")
    _json_error(raw, 401, "invalid_api_key")
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(base + path).status_code == 200
    r = httpx.get(base + "/v1/models/" + MODEL)
    assert r.status_code == 401


# ---- item 4: no 5xx and no exception text for client input; no redirects -----------------
HOSTILE = [
    ("/tokenize", {"model": [], "prompt": "x"}),
    ("/tokenize", {"model": {"a": 1}, "prompt": "x"}),
    ("/tokenize", {"model": 5, "messages": [{"role": "user", "content": "x"}]}),
    ("/tokenize", {"messages": "x"}),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("/tokenize", {"prompt": ["x"]}),
    ("/detokenize", {"tokens": [1.5]}),
    ("/detokenize", {"tokens": [True]}),
    ("/detokenize", {"tokens": [2**70]}),
    ("/detokenize", {"tokens": None}),
    ("/v1/completions", {"model": [], "prompt": "x"}),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], ["3"]]}),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], 3]}),
    ("/v1/completions", {"model": MODEL, "prompt": [{"a": 1}]}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 1e300}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1e300}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a"] * 5000}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"9" * 40: 1}}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"1": "x" * 100_000}}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 10**30}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 1e300}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": []}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "z" * 100_000}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [None]}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": ["user"], "content": "x"}]}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": {"a": 1}}]}),
]


@pytest.mark.parametrize("path,body", HOSTILE)
def test_client_input_never_gets_a_5xx_or_exception_text(server, path, body):
    base, _ = server
    r = post(base, path, body, headers=AUTH)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert len(r.content) < 2000  # a long value is not echoed back
    for word in ("Traceback", "Error:", "TypeError", "ValueError", "unhashable", 'File "'):
        assert word not in err["message"], err["message"]


@pytest.mark.parametrize(
    "raw", [b"[" * 5000 + b"]" * 5000, b'{"a": "\\ud800"}', b"\xff" * 10, b'{"model": "' + b"\\u00e9" * 1000 + b'"}']
)
def test_odd_json_is_a_4xx(server, raw):
    base, _ = server
    for path in ("/v1/completions", "/tokenize", "/detokenize"):
        r = post(base, path, raw, headers=AUTH)
        assert 400 <= r.status_code < 500, (path, r.text)
        assert "Traceback" not in r.text and "line 1 column" not in r.text


def test_trailing_slash_is_a_404_not_a_redirect_to_the_clients_host(server):
    base, _ = server
    for method, path in (
        ("POST", "/v1/completions/"),
        ("POST", "/tokenize/"),
        ("GET", "/v1/models/"),
        ("GET", "/health/"),
    ):
        r = httpx.request(
            method, base + path, headers={"host": "evil.example", **AUTH}, content=b"{}", follow_redirects=False
        )
        assert r.status_code == 404, (path, r.status_code)
        assert "location" not in r.headers and "evil" not in r.text
        assert r.json()["error"]["code"] in ("not_found", "model_not_found")


# ---- item 5: 404 for an unknown model; GET /v1/models/{id} ------------------------------
def test_unknown_model_is_404_and_models_retrieve(server):
    import openai

    base, _ = server
    for path, body in (
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}),
        ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}),
        ("/tokenize", {"model": "gpt-4", "prompt": "x"}),
    ):
        r = post(base, path, body, headers=AUTH)
        err = r.json()["error"]
        assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    r = post(base, "/v1/completions", {"model": "m" * 100_000, "prompt": "x"}, headers=AUTH)
    assert r.status_code == 404 and len(r.content) < 1000
    client = openai.OpenAI(base_url=base + "/v1", api_key="sekret", max_retries=0)
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    r = httpx.get(base + "/v1/models/" + MODEL, headers=AUTH)
    assert r.status_code == 200 and r.json()["max_model_len"] == 1000


def test_limits_are_validated():
    from llmsched.core.errors import ConfigError

    for bad in (
        {"max_body_bytes": 0},
        {"max_header_bytes": -1},
        {"read_timeout": 0},
        {"read_timeout": float("nan")},
        {"max_body_bytes": 1.5},
    ):
        with pytest.raises(ConfigError):
            ServerConfig(**bad)


def test_cli_limit_options():
    import argparse

    from llmsched.cli.server import add_serve_parser, limit_config

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers())
    args = p.parse_args(["serve"])
    assert limit_config(args) == {"max_body_bytes": None, "max_header_bytes": 65536, "read_timeout": 30.0}
    args = p.parse_args(["serve", "--max-body-bytes", "1000", "--max-header-bytes", "2000", "--read-timeout", "2.5"])
    cfg = ServerConfig(**limit_config(args))
    assert (cfg.max_body_bytes, cfg.max_header_bytes, cfg.read_timeout) == (1000, 2000, 2.5)


def test_many_stalled_uploads_do_not_block_the_server(server):
    base, _ = server
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", _port(base)))
            s.sendall(_head("/v1/completions", "content-length: 1000\r\n") + b"{")
            socks.append(s)
        r = post(base, "/v1/completions", {"model": MODEL, "prompt": [1, 2], "max_tokens": 3}, headers=AUTH)
        assert r.status_code == 200
        for s in socks:
            _json_error(_read_all(s), 408, "request_timeout")
    finally:
        for s in socks:
            s.close()


def test_default_body_limit_is_what_the_largest_servable_request_needs():
    from llmsched.server.app import MAX_BODY_CAP, default_max_body_bytes

    backend = make_sim_backend(SchedulerOptions(b_max=256), "const:2", max_model_len=1000)
    with running_server(backend, ServerConfig()) as (base, srv):
        # 4000 bytes of text (escaped: up to 6 bytes a byte), or 1000 ids, plus 1 MiB
        limit = 6 * 4000 + 32 * 1000 + (1 << 20)
        assert srv.config.app.max_body_bytes == limit
        assert httpx.get(base + "/version").json()["limits"]["max_body_bytes"] == limit
        raw = _raw(base, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (limit + 1))
        _json_error(raw, 413, "request_too_large")
        # a prompt escaped as \u00e9 (6 bytes of JSON per 2 bytes of text) at the text bound
        body = json.dumps({"model": MODEL, "prompt": "é" * 1998, "max_tokens": 1}).encode()
        assert len(body) < limit
        r = post(base, "/v1/completions", body)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 999
        r = post(base, "/v1/completions", {"model": MODEL, "prompt": "x" * (limit - 100), "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert default_max_body_bytes(None, None) == MAX_BODY_CAP == 16 * 1024 * 1024
    assert default_max_body_bytes(131072, 16 * 131072) == MAX_BODY_CAP
    assert default_max_body_bytes(8192, 16 * 8192) == 6 * 16 * 8192 + 32 * 8192 + (1 << 20)


def test_sim_with_a_tokenizer_refuses_ids_outside_its_vocabulary(tmp_path):
    """`--backend sim --tokenizer DIR`: the tokenizer's vocabulary bounds token ids as the
    engine's does (400 naming the field), instead of echoing or detokenizing them as ''."""
    from llmsched.engine.tiny import train_tokenizer

    tok = train_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    backend = make_sim_backend(SchedulerOptions(), "const:2", tokenizer=str(tmp_path))
    assert backend.vocab_size == vocab
    with running_server(backend) as (base, _):
        for path, body, param in (
            ("/v1/completions", {"model": MODEL, "prompt": [99999, 5], "max_tokens": 2, "echo": True}, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": [[5], [vocab]], "max_tokens": 2, "stream": True}, "prompt"),
            ("/detokenize", {"tokens": [99999]}, "tokens"),
        ):
            r = post(base, path, body)
            err = r.json()["error"]
            assert r.status_code == 400 and "outside the vocabulary" in err["message"], (path, r.text)
            assert err["param"] == param
        r = post(base, "/v1/completions", {"model": MODEL, "prompt": [vocab - 1, 5], "max_tokens": 2, "echo": True})
        assert r.status_code == 200 and r.json()["choices"][0]["text"].endswith(" tok tok")
        assert post(base, "/detokenize", {"tokens": [5]}).json()["prompt"] == tok.decode([5])
