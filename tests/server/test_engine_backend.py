"""The server on the real PyTorch engine (a tiny random model made by `make_tiny_model`)."""

from __future__ import annotations

import httpx
import pytest
from srv_helpers import engine_of, parse_sse, post, running_server, wait_for

import torch  # noqa: F401
import safetensors  # noqa: F401
import tokenizers  # noqa: F401


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    model_dir = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    backend = make_engine_backend(str(model_dir), SchedulerOptions(b_max=256, max_running=16),
                                  max_model_len=512, num_blocks=128, block_size=16, seed=0)
    with running_server(backend) as (base, srv):
        yield base, srv, backend


def test_engine_completions(engine_server):
    base, srv, backend = engine_server
    name = backend.model_name
    r = post(base, "/v1/completions", {"model": name, "prompt": "hello world", "max_tokens": 5,
                                       "ignore_eos": True})
    b = r.json()
    assert r.status_code == 200, b
    assert b["usage"]["completion_tokens"] == 5 and b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["prompt_tokens"] == len(backend.tokenizer.encode("hello world"))
    r = post(base, "/v1/completions", {"model": name, "prompt": [5, 6, 7, 8], "max_tokens": 4,
                                       "ignore_eos": True, "stream": True,
                                       "stream_options": {"include_usage": True}})
    ev = parse_sse(r.content)
    assert ev[-1] == "[DONE]" and ev[-2]["usage"]["completion_tokens"] == 4
    assert ev[-2]["usage"]["prompt_tokens"] == 4
    assert ev[-3]["choices"][0]["finish_reason"] == "length"
    r = post(base, "/v1/chat/completions", {"model": name, "max_tokens": 3, "ignore_eos": True,
                                            "messages": [{"role": "user", "content": "hi"}], "stream": True})
    ev = parse_sse(r.content)
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and ev[-1] == "[DONE]"
    # prompt + completion beyond max_model_len (512)
    r = post(base, "/v1/completions", {"model": name, "prompt": [1] * 500, "max_tokens": 20})
    assert r.status_code == 400
    # a token id outside the vocabulary is the client's error: the engine refuses it at add time
    r = post(base, "/v1/completions", {"model": name, "prompt": [10 ** 6], "max_tokens": 2})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    # streaming: the response has started, so the error is an event, then [DONE]
    r = post(base, "/v1/completions", {"model": name, "prompt": [10 ** 6], "max_tokens": 2, "stream": True})
    ev = parse_sse(r.content)
    assert r.status_code == 200 and len(ev) == 2 and ev[1] == "[DONE]"
    assert "vocabulary" in ev[0]["error"]["message"] and ev[0]["error"]["type"] == "invalid_request_error"


def test_engine_openai_client_and_disconnect(engine_server):
    import openai
    base, srv, backend = engine_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    out = client.completions.create(model=backend.model_name, prompt="abc", max_tokens=6,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 6
    eng = engine_of(srv)
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", base + "/v1/completions", json={
                "model": backend.model_name, "prompt": [1, 2, 3] * 20, "max_tokens": 400,
                "ignore_eos": True, "stream": True}) as r:
            it = r.iter_raw()
            got = b""
            while got.count(b"\n\n") < 3:
                got += next(it)
            assert eng.snapshot.get("running", 0) >= 0
    assert wait_for(lambda: eng.snapshot.get("kv_used_tokens") == 0 and eng.snapshot.get("running") == 0
                    and not eng.streams, timeout=10), eng.snapshot
    assert backend.core.stats()["kv_blocks_used"] == 0
    assert srv.config.app.state.metrics.finished["abort"] >= 1
