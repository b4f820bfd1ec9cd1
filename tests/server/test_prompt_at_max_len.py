"""A prompt of max_model_len tokens leaves no room for a completion token and is refused,
even to score it (`echo: true, max_tokens: 0`, as lm-evaluation-harness does), as vLLM
0.32's server refuses it (its input processor: prompt_len == max_model_len for a generating
model); one token less is served, and scoring it gives the prompt logprobs of a longer
context. The engine itself (`LLM.generate`) takes a one-token request at max_model_len."""

from __future__ import annotations

import pytest
from srv_helpers import post, running_server

from llmsched.core.engine_api import SamplingParams, check_request_size
from llmsched.core.errors import ConfigError
from llmsched.server.backends import SchedulerOptions, make_sim_backend

LEN = 64


def test_the_size_rule():
    check_request_size(LEN, 0, LEN, None)  # scoring: the prompt alone
    # a one-token request may fill the context with its prompt (the server refuses it:
    # test_sim_backend_refuses_a_prompt_of_max_model_len_even_to_score_it)
    check_request_size(LEN, 1, LEN, None)
    with pytest.raises(ConfigError, match=rf"requested {LEN + 1} tokens \({LEN + 1} in the prompt, 0 in"):
        check_request_size(LEN + 1, 0, LEN, None)
    for prompt, out in ((LEN, 2), (LEN + 1, 1), (LEN + 1, 0)):
        with pytest.raises(ConfigError, match="maximum context length"):
            check_request_size(prompt, out, LEN, None)
    # the KV cache holds the prompt and all but the last token
    check_request_size(LEN, 0, None, LEN)
    check_request_size(LEN, 1, None, LEN)
    check_request_size(LEN - 3, 4, None, LEN)
    with pytest.raises(ConfigError, match=rf"needs {LEN + 1} KV-cache tokens \(its prompt\)"):
        check_request_size(LEN + 1, 0, None, LEN)
    with pytest.raises(ConfigError, match=rf"needs {LEN + 1} KV-cache tokens \({LEN - 3} prompt \+ 5 completion - 1\)"):
        check_request_size(LEN - 3, 5, None, LEN)


def _score(base, model, prompt, **extra):
    return post(base, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 0, "echo": True, **extra})


def _refused(r, param="prompt", *words):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    for w in words:
        assert w in err["message"], err
    return err


TOO_MANY_IDS = f"the prompt has {LEN + 1} token ids, more than the model's context ({LEN} tokens)"
NO_ROOM = f"your prompt has {LEN} tokens, which leaves no room for a completion token"


def test_sim_backend_refuses_a_prompt_of_max_model_len_even_to_score_it():
    backend = make_sim_backend(SchedulerOptions(b_max=256), "const:1", max_model_len=LEN)
    ids = list(range(1, LEN + 1))
    with running_server(backend) as (base, _):
        r = _score(base, backend.model_name, ids[:-1])
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["usage"] == {"prompt_tokens": LEN - 1, "completion_tokens": 0, "total_tokens": LEN - 1}
        assert b["choices"][0]["finish_reason"] == "length"
        text = "x" * (4 * LEN)  # LEN tokens by the 4-bytes rule
        _refused(_score(base, backend.model_name, ids), "prompt", NO_ROOM)
        _refused(_score(base, backend.model_name, text), "prompt", NO_ROOM)
        assert _score(base, backend.model_name, text[:-4]).json()["usage"]["prompt_tokens"] == LEN - 1
        _refused(_score(base, backend.model_name, [*ids, 5]), "prompt", TOO_MANY_IDS)
        _refused(_score(base, backend.model_name, text + "x"), "prompt", f"context of {LEN} tokens")
        one = post(base, "/v1/completions", {"model": backend.model_name, "prompt": ids, "max_tokens": 1})
        _refused(one, "prompt", NO_ROOM)


def test_sim_backend_scores_what_the_kv_cache_holds():
    """max_model_len defaults to the KV capacity + 1 (a prompt of the capacity and one
    token): a prompt of the capacity is served, scored or not; one more is not."""
    backend = make_sim_backend(SchedulerOptions(b_max=256, kv_capacity=LEN), "const:1")
    assert backend.max_model_len == LEN + 1
    with running_server(backend) as (base, _):
        assert _score(base, backend.model_name, list(range(1, LEN + 1))).status_code == 200
        err = _refused(_score(base, backend.model_name, list(range(1, LEN + 2))))
        assert f"your prompt has {LEN + 1} tokens, which leaves no room" in err["message"], err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llmsched.engine import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("score") / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1
    )


def _engine_backend(model, max_model_len, b_max=32, num_blocks=24):
    from llmsched.server.backends import make_engine_backend

    return make_engine_backend(
        str(model),
        SchedulerOptions(b_max=b_max, max_running=2),
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        block_size=16,
        seed=0,
    )


def test_engine_backend_scores_a_prompt_of_max_model_len_less_one(tiny):
    """The prompt logprobs at max_model_len - 1 (prefilled in two chunks) equal those of a
    server with a longer context; one token more is a 400."""
    ids = [5 + (7 * i) % 200 for i in range(LEN - 1)]
    scores = {}
    for max_len in (LEN, 2 * LEN):
        backend = _engine_backend(tiny, max_len)
        assert backend.max_model_len == max_len < backend.kv_capacity
        with running_server(backend) as (base, _):
            r = _score(base, backend.model_name, ids, logprobs=1)
            assert r.status_code == 200, r.text
            b = r.json()
            assert b["usage"] == {"prompt_tokens": LEN - 1, "completion_tokens": 0, "total_tokens": LEN - 1}
            c = b["choices"][0]
            assert c["finish_reason"] == "length" and len(c["logprobs"]["token_logprobs"]) == LEN - 1
            scores[max_len] = c["logprobs"]["token_logprobs"]
            if max_len == LEN:
                _refused(_score(base, backend.model_name, [*ids, 5], logprobs=1), "prompt", NO_ROOM)
                _refused(_score(base, backend.model_name, [*ids, 5, 6], logprobs=1), "prompt", TOO_MANY_IDS)
                text = backend.tokenizer.decode(ids[1:]) + " and more"  # BOS + 62 tokens + more
                n = len(backend.tokenizer.encode(text))
                assert n >= LEN
                _refused(_score(base, backend.model_name, text), "prompt", f"your prompt has {n} tokens")
                one = post(base, "/v1/completions", {"model": backend.model_name, "prompt": [*ids, 5], "max_tokens": 1})
                _refused(one, "prompt", NO_ROOM)
                # and the engine serves what fits
                r = post(base, "/v1/completions", {"model": backend.model_name, "prompt": ids, "max_tokens": 1})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    assert scores[LEN][0] is None and all(v < 0 for v in scores[LEN][1:])
    assert scores[LEN][1:] == pytest.approx(scores[2 * LEN][1:], abs=1e-5)


@pytest.mark.parametrize("b_max", [32, LEN])
def test_engine_one_token_at_max_model_len_with_a_full_kv_cache(tiny, b_max):
    """The engine itself: a prompt of max_model_len tokens (prefilled in two chunks, or
    one) and one sampled token, in a KV cache that holds exactly the prompt (2 sequences'
    reserve + 4 blocks of 16); two tokens are refused. Nothing is left allocated."""
    from llmsched.engine import LLM

    llm = LLM(str(tiny), block_size=16, max_num_seqs=2, num_blocks=6, max_model_len=LEN, b_max=b_max)
    assert llm.engine.kv_capacity == LEN
    ids = [5 + (3 * i) % 200 for i in range(LEN)]
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length" and len(out.prompt_logprobs) == LEN
    shorter = llm.generate([ids[:-1]], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    assert [p[0] for p in out.prompt_logprobs[1:-1]] == pytest.approx([p[0] for p in shorter.prompt_logprobs[1:]])
    with pytest.raises(ConfigError, match="maximum context length"):
        llm.generate([ids], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="maximum context length"):
        llm.generate([[*ids, 5]], SamplingParams(max_tokens=1))
    assert llm.engine.allocator.num_used == 0 and not llm.engine.has_unfinished_requests()


def test_sim_backend_caps_a_max_model_len_beyond_the_kv_cache():
    """As the engine backend: --max-model-len 5000 with --kv-capacity 100 warns at start and
    serves (and advertises) a context of 101 tokens, which requests then meet."""
    import httpx

    from llmsched.core.errors import InputWarning

    with pytest.warns(InputWarning, match=r"KV cache holds 100 tokens .* may reach 101 of the --max-model-len 5,000"):
        backend = make_sim_backend(SchedulerOptions(b_max=256, kv_capacity=100), "const:1", max_model_len=5000)
    assert backend.max_model_len == backend.info["max_model_len"] == 101
    with running_server(backend) as (base, _):
        assert httpx.get(base + "/v1/models").json()["data"][0]["max_model_len"] == 101
        name = backend.model_name
        r = post(base, "/v1/completions", {"model": name, "prompt": list(range(1, 101)), "max_tokens": 50})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text
        r = post(base, "/v1/completions", {"model": name, "prompt": [1, 2], "max_tokens": 200})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
