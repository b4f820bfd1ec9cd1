"""The model folder's generation_config.json sampling defaults over HTTP, as vLLM's server
applies them (`--generation-config auto`): a request that omits temperature, top_p,
top_k or repetition_penalty gets the model's; chat without max_tokens gets its
max_new_tokens (completions keep OpenAI's 16, as vLLM's CompletionRequest); a field the
request sets wins. They were ignored: a model made greedy by its generation config
sampled at temperature 1."""

from __future__ import annotations

import json

import pytest
from srv_helpers import post, running_server

from llmsched.cli import main
from llmsched.server.backends import SchedulerOptions, make_engine_backend

MAX_NEW = 5
GEN = {"bos_token_id": 0, "eos_token_id": 1, "temperature": 0.0, "repetition_penalty": 1.3, "max_new_tokens": MAX_NEW}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from llmsched.engine import make_tiny_model

    folder = make_tiny_model(
        tmp_path_factory.mktemp("genconf") / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1
    )
    (folder / "generation_config.json").write_text(json.dumps(GEN))
    return folder


@pytest.fixture(scope="module")
def served(model):
    backend = make_engine_backend(
        str(model), SchedulerOptions(b_max=64, max_running=4), max_model_len=128, num_blocks=40, block_size=16
    )
    with running_server(backend) as (base, _):
        yield base


def _text(base, **fields):
    r = post(base, "/v1/completions", {"model": "m", "prompt": "hello there", "max_tokens": 16, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_omitted_fields_take_the_model_defaults(served):
    greedy = _text(served, temperature=0.0, repetition_penalty=1.3)
    # without temperature (or repetition_penalty): the model's greedy text every time
    assert [_text(served) for _ in range(3)] == [greedy] * 3
    assert _text(served, temperature=0.0) == greedy
    # a field the request sets wins over the model's
    assert _text(served, repetition_penalty=1.0) == _text(served, temperature=0.0, repetition_penalty=1.0)
    assert {_text(served, temperature=1.0, seed=s) for s in range(4)} != {greedy}


def test_max_new_tokens_is_chat_default_only(served):
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    r = post(served, "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == MAX_NEW
    r = post(served, "/v1/chat/completions", {**chat, "max_tokens": MAX_NEW + 2})
    assert r.json()["usage"]["completion_tokens"] == MAX_NEW + 2  # a default, not a ceiling
    r = post(served, "/v1/completions", {"model": "m", "prompt": "hi", "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 16  # vLLM's CompletionRequest default


def test_version_shows_the_defaults(served):
    import httpx

    info = httpx.get(served + "/version", timeout=30).json()
    assert info["sampling_defaults"] == {"temperature": 0.0, "repetition_penalty": 1.3, "max_tokens": MAX_NEW}


def test_serve_logs_the_defaults_and_refuses_bad_ones(model, tmp_path, capsys, monkeypatch):
    import llmsched.server.serving as serving

    monkeypatch.setattr(serving, "serve", lambda *a, **k: None)  # start up, then return
    assert main(["serve", "--model", str(model), "--port", "0", "--num-blocks", "20", "--max-running", "4"]) == 0
    err = capsys.readouterr().err
    assert f"default sampling parameters from {model / 'generation_config.json'}" in err
    assert "temperature=0.0" in err and "max_tokens=5" in err
    assert (
        main(
            [
                "serve",
                "--model",
                str(model),
                "--port",
                "0",
                "--num-blocks",
                "20",
                "--max-running",
                "4",
                "--generation-config",
                "vllm",
            ]
        )
        == 0
    )
    assert "default sampling parameters" not in capsys.readouterr().err
    (model / "generation_config.json").write_text(json.dumps({**GEN, "temperature": "hot"}))
    try:
        assert main(["serve", "--model", str(model), "--port", "0"]) == 2
    finally:
        (model / "generation_config.json").write_text(json.dumps(GEN))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generation_config.json: temperature must be a number, got 'hot'" in err
    assert main(["serve", "--backend", "sim", "--port", "0", "--generation-config", "auto"]) == 2
    assert "--generation-config is an engine option" in capsys.readouterr().err


def test_serve_takes_a_path_and_an_override(model, tmp_path, capsys, monkeypatch):
    """vLLM's `--generation-config PATH` and `--override-generation-config JSON` (refused
    before: only auto or vllm, and no override): the defaults requests get, shown in
    /version, come from that folder's file with the override on top."""
    import llmsched.server.backends as backends
    import llmsched.server.serving as serving

    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"top_k": 7, "temperature": 0.3}))
    built = []
    real = backends.make_engine_backend
    monkeypatch.setattr(backends, "make_engine_backend", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    monkeypatch.setattr(serving, "serve", lambda *a, **k: None)  # start up, then return
    argv = ["serve", "--model", str(model), "--port", "0", "--num-blocks", "20", "--max-running", "4"]
    over = ["--override-generation-config", '{"temperature": null, "max_new_tokens": 9}']
    assert main([*argv, "--generation-config", str(folder), *over]) == 0
    assert built[-1].info["sampling_defaults"] == {"top_k": 7, "max_tokens": 9}
    err = capsys.readouterr().err
    assert f"from {folder / 'generation_config.json'} and --override-generation-config: top_k=7, max_tokens=9" in err
    assert main([*argv, "--generation-config", str(tmp_path / "nope")]) == 2
    assert "generation config folder" in capsys.readouterr().err
    assert main([*argv, "--override-generation-config", '{"max_tokens": 9}']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown --override-generation-config key 'max_tokens'" in err
    assert main(["serve", "--backend", "sim", "--port", "0", "--override-generation-config", "{}"]) == 2
    assert "--override-generation-config is an engine option" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["override", "path"])
def test_an_explicit_max_new_tokens_caps_every_request(model, tmp_path, how):
    """As vLLM's server: the max_new_tokens of --override-generation-config, or of a
    --generation-config PATH file, caps every request's max_tokens, completions too (the
    model folder's own stays a default: test_max_new_tokens_is_chat_default_only). It
    was a chat default only, and a request asking for more got more."""
    import httpx

    if how == "override":
        kw = {"override_generation_config": {"max_new_tokens": 3}}
    else:
        (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3}))
        kw = {"generation_config": str(tmp_path)}
    backend = make_engine_backend(
        str(model), SchedulerOptions(b_max=64, max_running=4), max_model_len=128, num_blocks=40, block_size=16, **kw
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    with running_server(backend) as (base, _):
        for path, body in (
            ("/v1/completions", {"model": "m", "prompt": "hi", "ignore_eos": True, "max_tokens": 10}),
            ("/v1/completions", {"model": "m", "prompt": "hi", "ignore_eos": True}),
            ("/v1/chat/completions", {**chat, "max_tokens": 10}),
            ("/v1/chat/completions", chat),
        ):
            r = post(base, path, body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3, (path, body)
            assert r.json()["choices"][0]["finish_reason"] == "length"
        r = post(base, "/v1/completions", {"model": "m", "prompt": "hi", "ignore_eos": True, "max_tokens": 2})
        assert r.json()["usage"]["completion_tokens"] == 2  # a cap, not a length
        assert httpx.get(base + "/version", timeout=30).json()["max_tokens_cap"] == 3
        # a min_tokens above it is vLLM's 400, naming the cap (it blamed the prompt's room)
        r = post(base, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10, "min_tokens": 5})
        assert r.status_code == 400 and "cut to the server's max_new_tokens cap" in r.json()["error"]["message"]


def test_a_path_files_other_eos_ids_stop_requests(model, tmp_path):
    """As vLLM's server, a --generation-config PATH file's eos_token_id ids other than the
    model's stop every request (stop_reason: the id) unless it sets ignore_eos."""
    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine import LLM

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    greedy = LLM(model, num_threads=1).generate([[5, 9, 13]], params)[0].token_ids
    stop = greedy[1]
    cut = greedy.index(stop)
    assert GEN["eos_token_id"] not in greedy[: cut + 1], greedy  # the model's own EOS comes later
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [GEN["eos_token_id"], stop]}))
    backend = make_engine_backend(
        str(model),
        SchedulerOptions(b_max=64, max_running=4),
        max_model_len=128,
        num_blocks=40,
        block_size=16,
        generation_config=str(folder),
    )
    body = {"model": "m", "prompt": [5, 9, 13], "max_tokens": 8, "temperature": 0}
    with running_server(backend) as (base, _):
        r = post(base, "/v1/completions", body).json()
        assert (r["choices"][0]["finish_reason"], r["choices"][0]["stop_reason"]) == ("stop", stop)
        assert r["usage"]["completion_tokens"] == cut + 1
        r = post(base, "/v1/completions", {**body, "ignore_eos": True}).json()
        assert r["usage"]["completion_tokens"] == 8
