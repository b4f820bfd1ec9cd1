"""The server on the real PyTorch engine (a tiny random model made by `make_tiny_model`)."""

from __future__ import annotations

import pytest
import safetensors  # noqa: F401
import tokenizers  # noqa: F401
import torch  # noqa: F401
from srv_helpers import engine_of, parse_sse, post, running_server, tiny_engine_server, wait_for


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    with tiny_engine_server(tmp_path_factory.mktemp("tiny")) as served:
        yield served


def test_engine_completions(engine_server):
    base, srv, backend = engine_server
    name = backend.model_name
    r = post(base, "/v1/completions", {"model": name, "prompt": "hello world", "max_tokens": 5, "ignore_eos": True})
    b = r.json()
    assert r.status_code == 200, b
    assert b["usage"]["completion_tokens"] == 5 and b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["prompt_tokens"] == len(backend.tokenizer.encode("hello world"))
    r = post(
        base,
        "/v1/completions",
        {
            "model": name,
            "prompt": [5, 6, 7, 8],
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    ev = parse_sse(r.content)
    assert ev[-1] == "[DONE]" and ev[-2]["usage"]["completion_tokens"] == 4
    assert ev[-2]["usage"]["prompt_tokens"] == 4
    assert ev[-3]["choices"][0]["finish_reason"] == "length"
    r = post(
        base,
        "/v1/chat/completions",
        {
            "model": name,
            "max_tokens": 3,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
    )
    ev = parse_sse(r.content)
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and ev[-1] == "[DONE]"
    # prompt + completion beyond max_model_len (512): the completion is cut to the room
    r = post(base, "/v1/completions", {"model": name, "prompt": [1] * 500, "max_tokens": 20, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = post(base, "/v1/completions", {"model": name, "prompt": [1] * 512, "max_tokens": 20})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    # a token id outside the vocabulary is the client's error: the engine refuses it at add time
    r = post(base, "/v1/completions", {"model": name, "prompt": [10**6], "max_tokens": 2})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    # streaming too: refused before the stream starts (the backend knows the vocabulary)
    r = post(base, "/v1/completions", {"model": name, "prompt": [5, 10**6], "max_tokens": 2, "stream": True})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "prompt"
    r = post(base, "/v1/completions", {"model": name, "prompt": [backend.vocab_size], "max_tokens": 2, "stream": True})
    assert r.status_code == 400
    # /detokenize: ids the tokenizer cannot take are the client's error, not a 500
    for toks in ([5, -1], [5, 2**70], [backend.vocab_size]):
        r = post(base, "/detokenize", {"tokens": toks})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", (toks, r.text)
    assert post(base, "/detokenize", {"tokens": [5, 6]}).status_code == 200


def test_engine_tiny_temperature_does_not_fail_the_batch(engine_server):
    import threading

    base, srv, backend = engine_server
    name = backend.model_name
    res = {}

    def victim():
        res["v"] = post(
            base,
            "/v1/completions",
            {"model": name, "prompt": "hello", "max_tokens": 40, "ignore_eos": True, "temperature": 0, "stream": True},
        )

    t = threading.Thread(target=victim)
    t.start()
    eng = engine_of(srv)
    assert wait_for(lambda: eng.streams and eng.queued_requests == 0, timeout=10)
    bodies = [
        {"model": name, "prompt": "hi", "max_tokens": 3, "temperature": 1e-40},
        {"model": name, "prompt": "hi", "max_tokens": 3, "temperature": 1e-30, "seed": 7},
        {"model": name, "prompt": "hi", "max_tokens": 3, "temperature": 1.5, "seed": 2**63 - 1},
    ]
    for body in bodies:
        r = post(base, "/v1/completions", body)
        assert r.status_code == 200, r.text
    t.join(30)
    ev = parse_sse(res["v"].content)
    assert res["v"].status_code == 200 and ev[-1] == "[DONE]"
    assert ev[-2]["choices"][0]["finish_reason"] == "length" and len(ev) == 41
    assert eng.healthy
    # stop_reason reaches the body: the stop token id (every id is one here)
    every = list(range(backend.vocab_size))
    r = post(
        base,
        "/v1/completions",
        {"model": name, "prompt": "hi", "max_tokens": 8, "temperature": 0, "stop_token_ids": every},
    )
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] in every and c["text"] == ""
    assert r.json()["usage"]["completion_tokens"] == 1
    # min_tokens masks them all for 2 tokens: those rows have no distribution left, yet
    # the request (sampled or greedy) goes on and stops at its third token
    for temp in (0, 1.0):
        r = post(
            base,
            "/v1/completions",
            {
                "model": name,
                "prompt": "hi",
                "max_tokens": 8,
                "temperature": temp,
                "seed": 1,
                "stop_token_ids": every,
                "min_tokens": 2,
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["stop_reason"] in every
    assert eng.healthy


@pytest.mark.parametrize("stream", [False, True])
def test_engine_include_stop_str_in_output(engine_server, stream):
    """On the engine: a stop string ends the text before it, or with
    include_stop_str_in_output after it (vLLM's extension), streamed or not."""
    base, _, backend = engine_server
    name = backend.model_name
    body = {"model": name, "prompt": "hello world", "max_tokens": 12, "ignore_eos": True, "temperature": 0}

    def text_of(**extra):
        r = post(base, "/v1/completions", {**body, "stream": stream, **extra})
        assert r.status_code == 200, r.text
        if not stream:
            c = r.json()["choices"][0]
            return c["text"], c["finish_reason"], c["stop_reason"]
        ev = [e for e in parse_sse(r.content)[:-1] if e["choices"]]
        return (
            "".join(e["choices"][0]["text"] for e in ev),
            ev[-1]["choices"][0]["finish_reason"],
            ev[-1]["choices"][0]["stop_reason"],
        )

    full, reason, _ = text_of()
    assert reason == "length" and len(full) >= 4, full
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    at = full.find(stop)
    assert text_of(stop=[stop]) == (full[:at], "stop", stop)
    assert text_of(stop=[stop], include_stop_str_in_output=True) == (full[: at + len(stop)], "stop", stop)


def test_engine_tokenizer_option_gives_the_same_outputs(tmp_path):
    """`--tokenizer` naming the model's own tokenizer changes nothing: the prompt gets the
    BOS its post-processor adds (it was dropped), so counts, ids and greedy text are those
    of the server without it."""
    from tokenizers import Tokenizer

    from llmsched.core.errors import ConfigError
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    model = make_tiny_model(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    opts = {"max_model_len": 256, "num_blocks": 64, "block_size": 16, "seed": 0}

    def outputs(**tok):
        backend = make_engine_backend(str(model), SchedulerOptions(max_running=4), **tok, **opts)
        with running_server(backend) as (base, _):
            comp = post(
                base, "/v1/completions", {"model": "m", "prompt": "The scheduler", "max_tokens": 6, "temperature": 0}
            )
            chat = post(
                base,
                "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0},
            )
            ids = post(base, "/tokenize", {"prompt": "The scheduler"})
            assert comp.status_code == chat.status_code == ids.status_code == 200
            c, h = comp.json(), chat.json()
            return (
                c["choices"][0]["text"],
                c["usage"],
                h["choices"][0]["message"]["content"],
                h["usage"],
                ids.json()["tokens"],
            )

    plain = outputs()
    bos = Tokenizer.from_file(str(model / "tokenizer.json")).token_to_id("<s>")
    assert plain[-1][0] == bos
    assert outputs(tokenizer=str(model)) == plain
    assert outputs(tokenizer=str(model / "tokenizer.json")) == plain
    with pytest.raises(ConfigError, match="no tokenizer.json found"):
        make_engine_backend(str(model), tokenizer=str(tmp_path / "none"), **opts)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_token_ids_outside_the_vocabulary_are_a_400_before_any_stream(engine_server, stream):
    """They were checked only inside the engine: a stream began (200) and then carried an
    error event, and the message named the internal request id, not the field."""
    base, srv, backend = engine_server
    for ids in ([10**6], [-5]):
        body = {"model": backend.model_name, "prompt": "hi", "max_tokens": 2, "stop_token_ids": ids, "stream": stream}
        r = post(base, "/v1/completions", body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "stop_token_ids" and "cmpl-" not in err["message"]


def test_a_model_without_a_tokenizer_refuses_text_features_and_says_what_its_kv_holds(tmp_path):
    """Stop strings (a 200 stream, then an error event) and echo (a misleading message about
    'tokens') need text; /v1/models promised max_model_len 4096 with 320 KV tokens."""
    import os

    from llmsched.core.errors import InputWarning
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    model = make_tiny_model(tmp_path / "m")
    os.remove(model / "tokenizer.json")
    # a KV cache that cuts the context says so at start (vLLM refuses to start)
    with pytest.warns(InputWarning, match=r"the KV cache holds 256 tokens .* may reach 257 of the model's"):
        backend = make_engine_backend(
            str(model), SchedulerOptions(b_max=64, max_running=4), num_blocks=20, block_size=16, seed=0
        )
    assert backend.max_model_len == backend.kv_capacity + 1 < 4096
    with running_server(backend) as (base, _):
        assert (
            post(base, "/v1/completions", {"model": backend.model_name, "prompt": [5, 6], "max_tokens": 2}).status_code
            == 200
        )
        for extra, param in (({"stop": ["x"], "stream": True}, "stop"), ({"echo": True}, "echo")):
            r = post(base, "/v1/completions", {"model": backend.model_name, "prompt": [5, 6], "max_tokens": 2, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        import httpx

        listed = httpx.get(base + "/v1/models").json()["data"][0]
        assert listed["max_model_len"] == backend.max_model_len


def test_a_chat_template_is_applied_and_one_it_cannot_use_is_a_warning(tmp_path):
    """An instruct model's template was ignored (a warning; its chat requests reached the
    model as 'role: content' lines): it is applied now, quietly. Named templates without a
    'default' cannot be chosen: they still get the warning, and the lines."""
    import json
    import warnings

    from llmsched.core.errors import InputWarning
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    model = make_tiny_model(tmp_path / "m")
    # (a context the KV cache holds: no warning about it)
    opts = {"num_blocks": 8, "block_size": 16, "seed": 0, "max_model_len": 64}
    msgs = [{"role": "user", "content": "hi"}]
    cfg = model / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    template = "{% for m in messages %}<|{{ m['role'] }}|>{% endfor %}"
    for value, text in ((None, "user: hi\nassistant:"), (template, "<|user|>")):
        cfg.write_text(json.dumps({**data, "chat_template": value}))
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputWarning)
            backend = make_engine_backend(str(model), SchedulerOptions(b_max=64, max_running=2), **opts)
        assert backend.tokenizer.chat_text(msgs) == text
    cfg.write_text(json.dumps({**data, "chat_template": [{"name": "tool_use", "template": template}]}))
    with pytest.warns(InputWarning, match="none named 'default'"):
        backend = make_engine_backend(str(model), SchedulerOptions(b_max=64, max_running=2), **opts)
    assert backend.tokenizer.chat_text(msgs) == "user: hi\nassistant:"
