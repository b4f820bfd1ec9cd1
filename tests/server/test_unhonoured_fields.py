"""vLLM's fields that change the output are honoured or refused (400 naming the field),
never silently ignored: an ignored `guided_choice` or `min_p` gave a 200 with
unconstrained output."""

from __future__ import annotations

import httpx
import pytest
from srv_helpers import running_server

from llmsched.server.backends import SchedulerOptions, make_sim_backend

MODEL = "llmsched-sim"
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": MODEL, "max_tokens": 2, "prompt": "hi"}

REFUSED = [
    ("guided_choice", ["yes", "no"]),
    ("guided_grammar", "root ::= 'a'"),
    ("structural_tag", '{"type": "structural_tag"}'),
    ("structured_outputs", {"choice": ["yes", "no"]}),
    ("use_beam_search", True),
    ("min_p", 0.1),
    ("typical_p", 0.5),
    ("allowed_token_ids", [1, 2]),
    ("bad_words", ["hello"]),
    ("logits_processors", ["my.Processor"]),
    ("truncate_prompt_tokens", 5),
    ("skip_special_tokens", False),
    ("prompt_logprobs", 0),
    ("return_tokens_as_token_ids", True),
    ("return_token_ids", True),
    ("prompt_embeds", "AAAA"),
    # vLLM refuses a priority other than 0 unless it serves with --scheduling-policy
    # priority; no policy here orders requests by it (it was ignored: FCFS, silently)
    ("priority", -10),
    ("priority", 5),
]
# what asks for nothing: accepted
NO_OPS = [
    ("guided_choice", []),
    ("guided_grammar", ""),
    ("structured_outputs", {}),
    ("use_beam_search", False),
    ("min_p", 0),
    ("min_p", 0.0),
    ("typical_p", 1),
    ("allowed_token_ids", []),
    ("bad_words", []),
    ("logits_processors", []),
    ("truncate_prompt_tokens", None),
    ("skip_special_tokens", True),
    ("prompt_logprobs", None),
    ("priority", 0),
    ("guided_decoding_backend", "xgrammar"),  # selects a backend for guided fields, all refused
]


@pytest.fixture(scope="module")
def server():
    with running_server(max_running=8) as (base, _):
        yield base


@pytest.mark.parametrize("key,value", REFUSED)
@pytest.mark.parametrize("route,body", [("/v1/completions", COMP), ("/v1/chat/completions", CHAT)])
def test_fields_that_would_change_the_output_are_refused(server, route, body, key, value):
    for stream in (False, True):
        r = httpx.post(server + route, json={**body, key: value, "stream": stream})
        assert r.status_code == 400, (key, r.text)
        err = r.json()["error"]
        assert err["param"] == key and "not supported" in err["message"], err


@pytest.mark.parametrize("key,value", NO_OPS)
@pytest.mark.parametrize("route,body", [("/v1/completions", COMP), ("/v1/chat/completions", CHAT)])
def test_values_that_ask_for_nothing_are_accepted(server, route, body, key, value):
    r = httpx.post(server + route, json={**body, key: value})
    assert r.status_code == 200, (key, r.text)


def test_chat_documents_are_refused(server):
    r = httpx.post(server + "/v1/chat/completions", json={**CHAT, "documents": [{"title": "a", "text": "b"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    assert httpx.post(server + "/v1/chat/completions", json={**CHAT, "documents": []}).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,body", [("/v1/completions", COMP), ("/v1/chat/completions", CHAT)])
def test_negative_stop_token_ids_name_the_field(server, route, body, stream):
    r = httpx.post(server + route, json={**body, "stop_token_ids": [3, -1], "stream": stream})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "stop_token_ids" and "-1" in err["message"], err


def test_add_special_tokens_is_honoured(tmp_path):
    from llmsched.engine.tiny import train_tokenizer

    tok = train_tokenizer()  # adds <s> to every encoding with special tokens
    tok.save(str(tmp_path / "tokenizer.json"))
    backend = make_sim_backend(SchedulerOptions(), "const:1", tokenizer=str(tmp_path))
    text = "Hello world! The quick brown fox"
    n = len(tok.encode(text, add_special_tokens=False).ids)
    lines = "user: " + text + "\nassistant:"  # a chat without a template, BOS added by default
    n_chat = len(tok.encode(lines, add_special_tokens=False).ids)
    msgs = [{"role": "user", "content": text}]

    def prompt_tokens(route, body):
        r = httpx.post(base + route, json={"model": MODEL, "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    with running_server(backend) as (base, _):
        assert prompt_tokens("/v1/completions", {"prompt": text}) == n
        assert prompt_tokens("/v1/completions", {"prompt": text, "add_special_tokens": True}) == n + 1
        assert prompt_tokens("/v1/completions", {"prompt": text, "add_special_tokens": False}) == n
        assert prompt_tokens("/v1/chat/completions", {"messages": msgs}) == n_chat + 1
        assert prompt_tokens("/v1/chat/completions", {"messages": msgs, "add_special_tokens": False}) == n_chat
        r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": text, "add_special_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"
