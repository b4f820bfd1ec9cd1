"""The HTTP API on a real loopback server (sim backend): event structure, the official
openai client, auth, errors."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from srv_helpers import parse_sse, post, running_server

from llmsched.server.app import ServerConfig

MODEL = "llmsched-sim"


@pytest.fixture(scope="module")
def server():
    with running_server(cost="const:2", b_max=256, kv_capacity=4096) as (base, srv):
        yield base, srv


@pytest.fixture(scope="module")
def auth_server():
    with running_server(cfg=ServerConfig(api_key="sekret"), cost="const:2") as (base, srv):
        yield base, srv


# ---- streaming ------------------------------------------------------------------------
def test_completion_stream_events(server):
    base, _ = server
    r = post(
        base,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": [1, 2, 3, 4, 5],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    ev = parse_sse(r.content)
    assert ev[-1] == "[DONE]"
    content, usage = ev[:4], ev[4]
    assert len(ev) == 6
    for i, e in enumerate(content):
        assert e["object"] == "text_completion"
        assert e["model"] == MODEL
        assert e["id"] == content[0]["id"] and e["id"].startswith("cmpl-")
        (c,) = e["choices"]
        assert c["index"] == 0 and c["text"] == " tok"
        assert c["finish_reason"] == ("length" if i == 3 else None)
        assert "usage" in e and e["usage"] is None
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_chat_stream_events(server):
    base, _ = server
    r = post(
        base,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * 40}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    ev = parse_sse(r.content)
    assert [type(e) for e in ev].count(str) == 1 and ev[-1] == "[DONE]"
    role, toks, usage = ev[0], ev[1:4], ev[4]
    assert len(ev) == 6
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["choices"][0]["finish_reason"] is None
    for i, e in enumerate(toks):
        assert e["object"] == "chat.completion.chunk" and e["id"] == role["id"]
        assert e["choices"][0]["delta"] == {"content": " tok"}
        assert e["choices"][0]["finish_reason"] == ("length" if i == 2 else None)
    # 40 bytes of text = 10 tokens under the sim's 4-bytes-per-token rule
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 10
    assert usage["usage"]["completion_tokens"] == 3


def test_stream_without_usage_has_no_usage_chunk(server):
    base, _ = server
    r = post(
        base,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True},
    )
    ev = parse_sse(r.content)
    assert len(ev) == 4 and ev[-1] == "[DONE]"
    assert all("usage" not in e for e in ev[:-1])
    assert ev[2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "options, continuous, final",
    [
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
        ({"include_usage": False, "continuous_usage_stats": True}, False, False),
        ({"continuous_usage_stats": True}, False, False),  # include_usage defaults to false
        ({"include_usage": True, "continuous_usage_stats": False}, False, True),
        ({}, False, False),
        ({"include_usage": False}, False, False),
    ],
)
def test_stream_options_usage_as_vllm(server, options, continuous, final):
    """OpenAI's and current vLLM's rules: include_usage defaults to false, and per-chunk
    usage (continuous_usage_stats) needs include_usage (it was given on its own)."""
    base, _ = server
    r = post(
        base,
        "/v1/completions",
        {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, "stream": True, "stream_options": options},
    )
    ev = parse_sse(r.content)[:-1]
    tokens = [e for e in ev if e["choices"]]
    assert len(tokens) == 2
    if continuous:
        assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 2]
    else:
        assert all(e.get("usage") is None for e in tokens)
    assert (ev[-1]["choices"] == [] and ev[-1]["usage"]["total_tokens"] == 4) == final
    assert len(ev) == 2 + final


def test_chat_role_chunk_carries_continuous_usage(server):
    """With continuous usage stats every chunk has usage, the role chunk too: the prompt's
    tokens and none generated (vLLM's role chunk); it had "usage": null."""
    base, _ = server
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2}
    r = post(base, "/v1/chat/completions", {**body, "stream": True, "stream_options": options})
    ev = parse_sse(r.content)[:-1]
    roles = [e for e in ev if e["choices"] and "role" in e["choices"][0]["delta"]]
    prompt = ev[-1]["usage"]["prompt_tokens"]
    assert len(roles) == 2 and prompt > 0
    for e in roles:
        assert e["usage"] == {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}
    assert all(e["usage"] is not None for e in ev)
    # without continuous usage the role chunk's usage stays null
    r = post(base, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    roles = [e for e in parse_sse(r.content)[:-1] if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert len(roles) == 2 and all(e["usage"] is None for e in roles)


def test_stop_string_ends_with_stop(server):
    base, _ = server
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 10, "stop": ["tok tok"]})
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 2
    # as the engine and vLLM: the text before the stop string, which is the stop_reason
    assert body["choices"][0]["text"] == " " and body["choices"][0]["stop_reason"] == "tok tok"


def test_stop_reason_and_min_tokens_in_bodies_and_streams(server):
    base, _ = server
    r = post(
        base, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 5, "stop": "tok tok", "stream": True}
    )
    ev = parse_sse(r.content)
    assert ev[-1] == "[DONE]" and "".join(e["choices"][0]["text"] for e in ev[:-1]) == " "
    assert [e["choices"][0]["stop_reason"] for e in ev[:-1]] == [None, "tok tok"]
    assert ev[-2]["choices"][0]["finish_reason"] == "stop"
    r = post(
        base,
        "/v1/chat/completions",
        {"model": MODEL, "max_tokens": 5, "stop_token_ids": [0], "messages": [{"role": "user", "content": "hi"}]},
    )
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == 0 and c["message"]["content"] == ""
    r = post(
        base,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 5,
            "stop_token_ids": [0],
            "min_tokens": 2,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    ev = parse_sse(r.content)
    toks = ev[1:-1]
    assert [e["choices"][0]["stop_reason"] for e in toks] == [None, None, 0]
    assert "".join(e["choices"][0]["delta"]["content"] for e in toks) == " tok tok"
    # length and plain completions: null
    r = post(
        base, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3, "min_tokens": 3, "stop": ["tok"]}
    )
    c = r.json()["choices"][0]
    # as in vLLM: stop strings are looked for only once more than min_tokens tokens exist
    assert r.status_code == 200 and c["finish_reason"] == "length" and c["stop_reason"] is None
    assert c["text"] == " tok tok tok" and r.json()["usage"]["completion_tokens"] == 3
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3})
    assert r.json()["choices"][0]["stop_reason"] is None


# ---- non-streaming --------------------------------------------------------------------
def test_completion_non_stream(server):
    base, _ = server
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": "abcdefgh", "max_tokens": 3})
    assert r.status_code == 200
    b = r.json()
    assert b["object"] == "text_completion" and b["model"] == MODEL
    assert b["choices"][0]["text"] == " tok tok tok"
    assert b["choices"][0]["finish_reason"] == "length"
    assert b["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_response_ids_follow_x_request_id_and_request_id(server):
    """As vLLM's server: the response id is `cmpl-`/`chatcmpl-` + the X-Request-Id header,
    else the body's `request_id`, else a fresh id (a gateway correlates its logs by it; it
    was always a fresh one). Requests that share one are still served apart."""
    import concurrent.futures

    base, _ = server
    comp = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    hdr = {"x-request-id": "gw-7"}
    assert post(base, "/v1/completions", comp, headers=hdr).json()["id"] == "cmpl-gw-7"
    assert post(base, "/v1/chat/completions", {**chat, "request_id": "mine"}).json()["id"] == "chatcmpl-mine"
    # the header wins over the body's, as in vLLM
    assert post(base, "/v1/completions", {**comp, "request_id": "mine"}, headers=hdr).json()["id"] == "cmpl-gw-7"
    for route, body, want in (("/v1/completions", comp, "cmpl-gw-7"), ("/v1/chat/completions", chat, "chatcmpl-gw-7")):
        body = {**body, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
        ev = parse_sse(post(base, route, body, headers=hdr).content)
        assert ev[-1] == "[DONE]" and {e["id"] for e in ev[:-1]} == {want}
    # no id given: a fresh one each time
    a, b = (post(base, "/v1/completions", comp).json()["id"] for _ in range(2))
    assert a != b and a.startswith("cmpl-")
    # one id, many requests at once: each is served (the engine's own ids stay unique)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        rs = list(pool.map(lambda _: post(base, "/v1/completions", {**comp, "max_tokens": 20}, headers=hdr), range(8)))
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20 for r in rs)
    r = post(base, "/v1/completions", {**comp, "request_id": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"
    r = post(base, "/v1/completions", comp, headers={"x-request-id": "x" * 257})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id"


def test_chat_non_stream(server):
    base, _ = server
    r = post(
        base,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_completion_tokens": 2,
            "messages": [
                {"role": "system", "content": "abcd"},
                {"role": "user", "content": [{"type": "text", "text": "efgh"}]},
            ],
        },
    )
    b = r.json()
    assert b["object"] == "chat.completion"
    assert b["choices"][0]["message"] == {"role": "assistant", "content": " tok tok"}
    assert b["usage"]["prompt_tokens"] == 3  # "abcd\nefgh": 9 bytes -> 3 tokens


# ---- the official client ----------------------------------------------------------------
def test_openai_client(server):
    import openai

    base, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    c = client.completions.create(model=MODEL, prompt="Say hi", max_tokens=5)
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=[1, 2, 3], max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == " tok" * 4
    assert chunks[-1].usage.completion_tokens == 4
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == " tok tok tok"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == " tok tok tok"
    assert parts[-1].usage.total_tokens == 4
    # an unknown model is a 404, as OpenAI answers it (the client's NotFoundError)
    with pytest.raises(openai.NotFoundError) as ei:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("nope")
    assert ei.value.code == "model_not_found"


def test_async_openai_client(server):
    import asyncio

    import openai

    base, _ = server

    async def main():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        outs = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
                )
                for _ in range(20)
            ]
        )
        await client.close()
        return outs

    outs = asyncio.run(main())
    assert all(o.usage.completion_tokens == 5 for o in outs)


# ---- auth -----------------------------------------------------------------------------
def test_auth(auth_server):
    base, _ = auth_server
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"}):
        r = post(base, "/v1/completions", body, headers=headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert set(err) == {"message", "type", "param", "code"}
    assert httpx.get(base + "/v1/models").status_code == 401
    ok = post(base, "/v1/completions", body, headers={"authorization": "Bearer sekret"})
    assert ok.status_code == 200
    assert httpx.get(base + "/health").status_code == 200  # open, as in vLLM
    assert httpx.get(base + "/metrics").status_code == 200
    import openai

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="bad", max_retries=0).models.list()
    assert openai.OpenAI(base_url=base + "/v1", api_key="sekret").models.list().data[0].id == MODEL


# ---- errors ---------------------------------------------------------------------------
BAD = [
    ("/v1/completions", {"prompt": "x"}, "model"),
    ("/v1/completions", {"model": 3, "prompt": "x"}, "model"),
    ("/v1/completions", {"model": MODEL}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": 5}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", 5]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [3, True]]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, -2]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "10.5"}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "maybe"}, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 129}, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": ["x"] * 20, "n": 100}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2, "best_of": 3}, "best_of"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": 7}, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a"] * 1025}, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": 2}, "echo"),
    # refused features: a 400 that names them, not silently ignored
    ("/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "end"}, "suffix"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
        "response_format",
    ),
    # tools reach the chat template only with tool_choice "none": no tool calls are parsed
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "tool_choice",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "tools": [{"function": {"name": "f"}}]}, "tools"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"},
        "tool_choice",
    ),
    # the sim backend has no logits
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, "logprobs"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True},
        "logprobs",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"five": 10}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": [5]}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs"),
    # the prompt's logprobs (echo) need logits too
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1, "echo": True}, "logprobs"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        "top_logprobs",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    # beyond int64: torch.manual_seed overflowed in the engine (a 500)
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 10**23}, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**63}, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": -(10**20)}, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "min_tokens": 4}, "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -2}, "top_k"),
    ("/v1/chat/completions", {"model": MODEL}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
        "max_completion_tokens",
    ),
]


@pytest.mark.parametrize("path,body,param", BAD)
def test_bad_requests_are_400(server, path, body, param):
    base, _ = server
    r = post(base, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_malformed_json_is_400(server, raw):
    base, _ = server
    r = post(base, "/v1/completions", raw)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_prompt_too_long_is_400(server):
    base, _ = server
    # the KV cache holds 4096 tokens (max_model_len 4097): a prompt of 4097 leaves no room
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": list(range(4097)), "max_tokens": 200})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == "prompt"
    r = post(
        base,
        "/v1/chat/completions",
        {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "x" * 40000}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_unknown_route_and_method(server):
    base, _ = server
    r = httpx.get(base + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(base + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_health_models_version_metrics(server):
    base, srv = server
    assert httpx.get(base + "/health").status_code == 200
    m = httpx.get(base + "/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == MODEL and m["data"][0]["root"] == MODEL
    v = httpx.get(base + "/version").json()
    assert v["backend"] == "sim" and v["scheduler"]["batch_policy"] == "sarathi"
    post(base, "/v1/completions", {"model": MODEL, "prompt": [1] * 8, "max_tokens": 5})
    text = httpx.get(base + "/metrics").text
    for name in (
        "llmsched:num_requests_running",
        "llmsched:num_requests_waiting",
        "llmsched:kv_cache_usage_perc",
        "llmsched:prompt_tokens_total",
        "llmsched:generation_tokens_total",
        "llmsched:time_to_first_token_seconds_bucket",
        "llmsched:inter_token_latency_seconds_count",
        "llmsched:e2e_request_latency_seconds_sum",
    ):
        assert name in text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            values[k] = float(v)
    lab = '{model_name="llmsched-sim"}'
    assert values[f"llmsched:generation_tokens_total{lab}"] >= 5
    assert values[f"llmsched:num_requests_running{lab}"] == 0
    assert values[f"llmsched:time_to_first_token_seconds_count{lab}"] >= 1
    # histogram buckets are cumulative and end with +Inf = count
    b = [v for k, v in values.items() if k.startswith("llmsched:inter_token_latency_seconds_bucket")]
    assert b == sorted(b) and b[-1] == values[f"llmsched:inter_token_latency_seconds_count{lab}"]


def test_error_event_is_json_object():
    from llmsched.server.protocol import APIError, ChunkWriter

    ev = ChunkWriter.error(APIError(500, "boom", "internal_server_error"))
    assert ev.startswith("data: ") and ev.endswith("\n\n")
    assert json.loads(ev[6:])["error"]["message"] == "boom"


def test_tokenize_detokenize(server):
    base, _ = server
    r = post(base, "/tokenize", {"model": MODEL, "prompt": "x" * 41})
    assert r.json()["count"] == 11 and len(r.json()["tokens"]) == 11
    r = post(base, "/tokenize", {"messages": [{"role": "user", "content": "abcd"}]})
    assert r.json()["count"] == 1
    assert post(base, "/tokenize", {"prompt": 5}).status_code == 400
    assert post(base, "/detokenize", {"tokens": [1, 2]}).json() == {"prompt": " tok tok"}
    assert post(base, "/detokenize", {"tokens": "no"}).status_code == 400
    # ids written as strings are those ids, as in stop_token_ids (vLLM's lax pydantic reads both)
    assert post(base, "/detokenize", {"tokens": ["1", 2.0]}).json() == {"prompt": " tok tok"}
    r = post(base, "/detokenize", {"tokens": ["1", "x"]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "'tokens' must be an array of integers"
    r = post(base, "/detokenize", {"tokens": [5, -1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    # a model this server does not serve: 404 on both, as on the generation routes
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        r = post(base, path, {"model": "other", **body})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", (path, r.text)
        assert post(base, path, {"model": 7, **body}).json()["error"]["param"] == "model"


@pytest.mark.parametrize("name", ["", "  "])
def test_empty_served_model_name_is_refused(name, tmp_path):
    """An empty name was silently replaced by the default, so clients asking for the name
    they configured got 404s."""
    from llmsched.core.errors import ConfigError
    from llmsched.server.backends import make_engine_backend, make_sim_backend

    with pytest.raises(ConfigError, match="--served-model-name must be a non-empty name"):
        make_sim_backend(None, "const:1", served_model_name=name)
    with pytest.raises(ConfigError, match="--served-model-name must be a non-empty name"):
        make_engine_backend(str(tmp_path), served_model_name=name)  # before anything loads


@pytest.mark.parametrize(
    "path, extra",
    [
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
@pytest.mark.parametrize("stop", ["", ["", "x"], ["x", "y" * 257]])
def test_empty_or_overlong_stop_string_is_400(server, path, extra, stop):
    """An empty stop string would match everywhere (vLLM refuses it); a very long one makes
    every token of every stream slower. Neither is silently dropped."""
    base, _ = server
    r = post(base, path, {"model": MODEL, "max_tokens": 3, "stop": stop, **extra})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "stop", r.text
    assert ("empty string" if "" in ([stop] if isinstance(stop, str) else stop) else "256 characters") in err["message"]
    # the longest allowed is served
    r = post(base, path, {"model": MODEL, "max_tokens": 3, "stop": ["y" * 256], **extra})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output(server, stream):
    """vLLM's include_stop_str_in_output: the text keeps the stop string (or the stop
    token's text) that ended it, streamed or not, completions and chat."""
    base, _ = server

    def text_of(path, body):
        r = post(base, path, {"model": MODEL, "max_tokens": 6, "stream": stream, **body})
        assert r.status_code == 200, r.text
        if not stream:
            c = r.json()["choices"][0]
            return c.get("text", (c.get("message") or {}).get("content")), c["finish_reason"], c["stop_reason"]
        ev = [e for e in parse_sse(r.content)[:-1] if e["choices"]]
        pieces = [e["choices"][0].get("text", e["choices"][0].get("delta", {}).get("content") or "") for e in ev]
        return "".join(pieces), ev[-1]["choices"][0]["finish_reason"], ev[-1]["choices"][0]["stop_reason"]

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for path, prompt in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", chat)):
        body = {**prompt, "stop": ["k t"]}
        assert text_of(path, body) == (" to", "stop", "k t")
        assert text_of(path, {**body, "include_stop_str_in_output": True}) == (" tok t", "stop", "k t")
        assert text_of(path, {**body, "include_stop_str_in_output": False}) == (" to", "stop", "k t")
        # a stop token id: its text is kept too (as vLLM does)
        body = {**prompt, "stop_token_ids": [0], "min_tokens": 1}
        assert text_of(path, body) == (" tok", "stop", 0)
        assert text_of(path, {**body, "include_stop_str_in_output": True}) == (" tok tok", "stop", 0)
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": "hi", "include_stop_str_in_output": " true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include_stop_str_in_output"


@pytest.mark.parametrize("huge", [1e100, 10**100, 2**64])
@pytest.mark.parametrize("field", ["max_tokens", "n", "min_tokens", "top_k"])
def test_a_huge_integer_is_400_naming_its_field_clipped(server, huge, field):
    """A 100-digit number is not echoed back whole, and the error names the field."""
    base, _ = server
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": "hi", field: huge})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == field, r.text
    assert len(err["message"]) < 160 and not re.search(r"\d{30}", err["message"]), err["message"]


@pytest.mark.parametrize("field", ["max_tokens", "seed"])
def test_an_integer_beyond_64_bits_is_shown_as_written(server, field):
    """orjson reads 99999999999999999999999 as the float 1e+23: the message shows the
    integer the client sent, a long one by its first digits and its length."""
    base, _ = server
    for written, shown in (
        ("99999999999999999999999", "got 99999999999999999999999"),
        ("-99999999999999999999999", "got -99999999999999999999999"),
        ("9" * 100, "got 99999999999999999999... (100 digits)"),
        ("1e23", "got 1e+23"),  # a float as written
    ):
        r = post(base, "/v1/completions", f'{{"model": "{MODEL}", "prompt": "hi", "{field}": {written}}}')
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field, r.text
        assert err["message"] == f"'{field}' must be a 64-bit integer, {shown}", err


@pytest.mark.parametrize("top_k", [0, -1, 1])
def test_top_k_0_and_minus_1_mean_off(server, top_k):
    """vLLM's SamplingParams takes 0 (its default) and -1 as top-k off."""
    base, _ = server
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi"}), ("/v1/chat/completions", chat)):
        r = post(base, path, {**body, "max_tokens": 2, "top_k": top_k})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2


def test_max_tokens_beyond_the_context_names_max_tokens(server):
    """max_tokens beyond the whole context (4097 tokens) is refused naming the field that
    gave it (as vLLM says); within it, max_tokens is cut to the room the prompt leaves
    (vLLM's get_max_tokens: `length` there); a prompt too long is the prompt's."""
    base, _ = server
    r = post(base, "/v1/completions", {"model": MODEL, "prompt": list(range(4000)), "max_tokens": 200})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 97 and r.json()["choices"][0]["finish_reason"] == "length"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for path, body, param in (
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 5000}, "max_tokens"),
        ("/v1/chat/completions", {**chat, "max_completion_tokens": 5000}, "max_completion_tokens"),
        ("/v1/chat/completions", {**chat, "max_tokens": 5000}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": [1] * 4097, "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 4 * 4097}, "prompt"),
    ):
        r = post(base, path, body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert err["param"] == param, (body.keys(), err)
