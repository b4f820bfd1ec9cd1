"""max_tokens and the room a prompt leaves in the context, as vLLM 0.32's server counts it
(`get_max_tokens`): what the client asks for, or the server's default, is cut to
max_model_len - prompt, and the choice ends with `finish_reason` "length" there; only
max_tokens above max_model_len, or a prompt that leaves no room, is a 400. On both
backends, completions and chat, streamed or not, n > 1 and several prompts."""

from __future__ import annotations

import pytest
from srv_helpers import parse_sse, post, running_server

from llmsched.server.app import ServerConfig
from llmsched.server.backends import SchedulerOptions, make_sim_backend

LEN = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llmsched.engine import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("room") / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1
    )


def _backend(kind, tiny_model):
    if kind == "sim":
        return make_sim_backend(SchedulerOptions(b_max=256), "const:1", max_model_len=LEN)
    from llmsched.server.backends import make_engine_backend

    backend = make_engine_backend(
        str(tiny_model), SchedulerOptions(b_max=32, max_running=4), max_model_len=LEN, num_blocks=40, block_size=16
    )
    assert backend.max_model_len == LEN
    return backend


@pytest.fixture(scope="module", params=["sim", "engine"])
def served(request, tmp_path_factory):
    tiny_model = request.getfixturevalue("tiny") if request.param == "engine" else None
    backend = _backend(request.param, tiny_model)
    with running_server(backend) as (base, _):
        yield base, backend


def _ids(n):
    return [5 + (7 * i) % 200 for i in range(n)]


def _messages_of_about(base, tokens):
    """A chat conversation of `tokens` tokens or a few more, by the server's count."""
    for k in range(1, 4 * tokens):
        messages = [{"role": "user", "content": "abcd " * k}]
        if post(base, "/tokenize", {"messages": messages}).json()["count"] >= tokens:
            return messages
    raise AssertionError("no conversation is that long")


def _request(base, path, body, stream):
    """(status, [(choice index, tokens generated, finish_reason)], usage or error) of a
    request, streamed or not; streamed, a choice's tokens are its last event's usage."""
    if stream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    r = post(base, path, body)
    if r.status_code != 200:
        return r.status_code, [], r.json()["error"]
    if not stream:
        b = r.json()
        return 200, [(c["index"], None, c["finish_reason"]) for c in b["choices"]], b["usage"]
    events = [e for e in parse_sse(r.content) if e != "[DONE]"]
    tokens, finish = {}, {}
    for e in events:
        for c in e["choices"]:
            if c.get("finish_reason"):
                finish[c["index"]] = c["finish_reason"]
                tokens[c["index"]] = e["usage"]["completion_tokens"]
    return 200, [(i, tokens[i], finish[i]) for i in sorted(finish)], events[-1]["usage"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
def test_max_tokens_beyond_the_room_is_cut_to_it(served, chat, stream):
    base, backend = served
    name = backend.model_name
    if chat:
        path, field = "/v1/chat/completions", "max_completion_tokens"
        body = {"model": name, "messages": [{"role": "user", "content": "the engine samples " * 3}]}
    else:
        path, field = "/v1/completions", "max_tokens"
        body = {"model": name, "prompt": _ids(20)}
    body = {**body, field: LEN, "n": 2, "ignore_eos": True}
    status, choices, usage = _request(base, path, body, stream)
    assert status == 200, usage
    room = LEN - usage["prompt_tokens"]
    assert 0 < room < LEN
    assert usage["completion_tokens"] == 2 * room
    assert [c[0] for c in choices] == [0, 1] and all(c[2] == "length" for c in choices), choices
    if stream:
        assert all(c[1] == room for c in choices), choices


@pytest.mark.parametrize("stream", [False, True])
def test_each_prompt_gets_its_own_room(served, stream):
    base, backend = served
    body = {"model": backend.model_name, "prompt": [_ids(10), _ids(50)], "max_tokens": 30, "ignore_eos": True}
    status, choices, usage = _request(base, "/v1/completions", body, stream)
    assert status == 200, usage
    assert usage == {"prompt_tokens": 60, "completion_tokens": 30 + (LEN - 50), "total_tokens": 60 + 44}
    assert [c[2] for c in choices] == ["length", "length"]
    if stream:
        assert [c[1] for c in choices] == [30, LEN - 50]


def test_only_max_tokens_beyond_the_whole_context_is_refused(served):
    """As vLLM: max_tokens > max_model_len names the field that gave it; a prompt that
    leaves no room names the prompt, and says nothing of a completion nobody asked for."""
    base, backend = served
    name = backend.model_name
    chat = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
    for path, body, param in (
        ("/v1/completions", {"model": name, "prompt": "hi", "max_tokens": LEN + 1}, "max_tokens"),
        ("/v1/completions", {"model": name, "prompt": _ids(LEN - 1), "max_tokens": LEN + 1}, "max_tokens"),
        ("/v1/chat/completions", {**chat, "max_completion_tokens": LEN + 1}, "max_completion_tokens"),
        ("/v1/chat/completions", {**chat, "max_tokens": LEN + 1}, "max_tokens"),
        ("/v1/completions", {"model": name, "prompt": _ids(LEN)}, "prompt"),
        ("/v1/completions", {"model": name, "prompt": _ids(LEN), "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"model": name, "prompt": _ids(LEN + 1), "max_tokens": 1}, "prompt"),
    ):
        r = post(base, path, body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert err["param"] == param, (body, err)
        if param == "prompt":
            assert "completion" not in err["message"].replace("a completion token", ""), err
        else:
            assert f"is {LEN + 1}, more than the model's context of {LEN} tokens" in err["message"], err
    # the whole context is still a valid max_tokens: cut to the room
    r = post(base, "/v1/completions", {"model": name, "prompt": _ids(LEN - 1), "max_tokens": LEN, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text
    # min_tokens must fit in what is left, and the message says why max_tokens is smaller
    r = post(base, "/v1/completions", {"model": name, "prompt": _ids(60), "max_tokens": 10, "min_tokens": 5})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "min_tokens", r.text
    assert "max_tokens (4: the 10 asked for, cut to the room the prompt leaves)" in err["message"], err


@pytest.mark.parametrize("kind", ["sim", "engine"])
def test_the_default_max_tokens_is_cut_to_the_room(kind, request):
    """The server's defaults (--default-max-tokens, 16 for completions) are not the
    client's request: a prompt that leaves less room gets what fits (vLLM's get_max_tokens),
    never a 400 that counts tokens the client did not ask for."""
    tiny_model = request.getfixturevalue("tiny") if kind == "engine" else None
    backend = _backend(kind, tiny_model)
    with running_server(backend, ServerConfig(default_max_tokens=50)) as (base, _):
        name = backend.model_name
        chat = {"model": name, "messages": _messages_of_about(base, 30), "ignore_eos": True}
        r = post(base, "/v1/chat/completions", chat)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert 0 < LEN - usage["prompt_tokens"] < 50
        assert usage["completion_tokens"] == LEN - usage["prompt_tokens"]
        assert r.json()["choices"][0]["finish_reason"] == "length"
        r = post(base, "/v1/completions", {"model": name, "prompt": _ids(10), "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 50
    # completions' default of 16, cut to the room
    backend = _backend(kind, tiny_model)
    with running_server(backend) as (base, _):
        body = {"model": backend.model_name, "prompt": _ids(LEN - 5), "ignore_eos": True}
        r = post(base, "/v1/completions", body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
        r = post(base, "/v1/completions", {**body, "prompt": _ids(20)})
        assert r.json()["usage"]["completion_tokens"] == 16


def test_a_completions_max_tokens_null_is_the_room_left(served):
    """`max_tokens: null` on a completion is vLLM's "not set": the room the prompt leaves
    (or the model's max_new_tokens); only a missing field is OpenAI's default of 16. It
    was 16 either way."""
    base, backend = served
    body = {"model": backend.model_name, "prompt": _ids(20), "ignore_eos": True}
    r = post(base, "/v1/completions", {**body, "max_tokens": None})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == LEN - 20, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert post(base, "/v1/completions", body).json()["usage"]["completion_tokens"] == 16
