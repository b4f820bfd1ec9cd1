"""The OpenAI request fields evaluation harnesses rely on, over real HTTP on loopback:
logprobs / top_logprobs, n > 1, several prompts in one request, echo, stop lists,
logit_bias and the penalties on the engine (a tiny random model); what the sim backend
does with them; and the fields refused with a 400 that says so."""

from __future__ import annotations

import math

import pytest
import safetensors  # noqa: F401
import tokenizers  # noqa: F401
import torch  # noqa: F401
from srv_helpers import engine_of, parse_sse, post, running_server, tiny_engine_server, wait_for


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    with tiny_engine_server(tmp_path_factory.mktemp("tiny")) as served:
        yield served


@pytest.fixture(scope="module")
def client(engine_server):
    import openai

    base = engine_server[0]
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def _complete(base, **body):
    r = post(base, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_logprobs_with_the_client(engine_server, client):
    base, _, backend = engine_server
    name = backend.model_name
    c = client.completions.create(model=name, prompt="hello world", max_tokens=6, temperature=0, logprobs=3)
    ch = c.choices[0]
    lp = ch.logprobs
    assert c.usage.completion_tokens == 6 and len(lp.tokens) == 6 and len(lp.token_logprobs) == 6
    assert len(lp.top_logprobs) == 6 and len(lp.text_offset) == 6
    for i in range(6):
        top = lp.top_logprobs[i]
        assert 1 <= len(top) <= 3 and top[lp.tokens[i]] == lp.token_logprobs[i]  # the token itself first
        assert all(v <= 0 for v in top.values()) and sum(math.exp(v) for v in top.values()) <= 1 + 1e-5
        # greedy: the sampled token is the most likely one of the raw distribution
        assert lp.token_logprobs[i] == pytest.approx(max(top.values()), abs=1e-5)
        assert lp.token_logprobs[i] < 0
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    # the tokens are the completion's own: its text, token by token (a byte-level token
    # that is part of a character shows as U+FFFD on its own)
    if not any("\ufffd" in t for t in lp.tokens):
        assert "".join(lp.tokens) == ch.text
    # logprobs=0 (as vLLM): each token's top_logprobs is the token alone, no alternatives
    c0 = client.completions.create(model=name, prompt="hello world", max_tokens=3, temperature=0, logprobs=0)
    lp0 = c0.choices[0].logprobs
    assert lp0.top_logprobs == [{t: v} for t, v in zip(lp0.tokens, lp0.token_logprobs)] and len(lp0.tokens) == 3
    assert c0.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:3], abs=1e-5)
    # streamed: the same logprobs, chunk by chunk, offsets continuing
    chunks = list(
        client.completions.create(
            model=name, prompt="hello world", max_tokens=6, temperature=0, logprobs=3, stream=True
        )
    )
    got = [v for ch_ in chunks for v in (ch_.choices[0].logprobs.token_logprobs if ch_.choices[0].logprobs else [])]
    offs = [v for ch_ in chunks for v in (ch_.choices[0].logprobs.text_offset if ch_.choices[0].logprobs else [])]
    assert got == pytest.approx(lp.token_logprobs, abs=1e-5) and offs == lp.text_offset


def test_chat_logprobs_with_the_client(engine_server, client):
    name = engine_server[2].model_name
    msgs = [{"role": "user", "content": "hi there"}]
    c = client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens == 5
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-5)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token
    assert "".join(item.token for item in content) == c.choices[0].message.content
    # logprobs without top_logprobs: no alternatives; without logprobs: null
    c = client.chat.completions.create(model=name, messages=msgs, max_tokens=2, logprobs=True)
    assert all(item.top_logprobs == [] for item in c.choices[0].logprobs.content)
    c = client.chat.completions.create(model=name, messages=msgs, max_tokens=2)
    assert c.choices[0].logprobs is None
    stream = client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    items = [i for p in stream if p.choices and p.choices[0].logprobs for i in p.choices[0].logprobs.content]
    assert len(items) == 4 and all(len(i.top_logprobs) == 1 for i in items)


def test_n_and_seeds_with_the_client(engine_server, client):
    name = engine_server[2].model_name
    kw = dict(model=name, prompt="once upon", max_tokens=8, temperature=1.0, seed=1234, extra_body={"ignore_eos": True})
    c = client.completions.create(n=2, **kw)
    assert [ch.index for ch in c.choices] == [0, 1]
    assert (
        c.usage.completion_tokens == 16
        and c.usage.prompt_tokens
        == client.completions.create(max_tokens=1, model=name, prompt="once upon").usage.prompt_tokens
    )
    one = client.completions.create(n=1, **kw)
    assert c.choices[0].text == one.choices[0].text  # choice 0 draws as n=1 with this seed
    assert c.choices[0].text != c.choices[1].text  # choice 1 has its own seed
    # streamed: each choice's chunks carry its index; the texts are the same
    stream = client.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **kw)
    texts = {0: "", 1: ""}
    finish = {}
    usage = None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            texts[x.index] += x.text
            if x.finish_reason:
                finish[x.index] = x.finish_reason
    assert texts == {0: c.choices[0].text, 1: c.choices[1].text}
    assert finish == {0: "length", 1: "length"} and usage.completion_tokens == 16
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "x"}], n=3, max_tokens=2, temperature=1.0
    )
    assert [ch.index for ch in chat.choices] == [0, 1, 2]
    assert all(ch.message.role == "assistant" for ch in chat.choices)


def test_stop_lists_with_the_client(engine_server, client):
    name = engine_server[2].model_name
    kw = dict(model=name, prompt="the quick brown fox", temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(max_tokens=24, **kw).choices[0].text
    assert len(full) > 12
    target = full[6:9]
    others = [f"<never{i}>" for i in range(7)]  # more than OpenAI's 4
    c = client.completions.create(max_tokens=24, stop=others + [target], **kw)
    cut = full.index(target)
    assert c.choices[0].text == full[:cut]
    assert c.choices[0].finish_reason == "stop"
    # none of them occurs: the whole text
    c = client.completions.create(max_tokens=24, stop=others, **kw)
    assert c.choices[0].text == full and c.choices[0].finish_reason == "length"
    # streamed through the client
    parts = list(client.completions.create(max_tokens=24, stop=others + [target], stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts if p.choices) == full[:cut]


def test_prompt_lists_and_echo(engine_server):
    base, _, backend = engine_server
    name = backend.model_name
    tok = backend.tokenizer
    prompts = ["alpha beta", "gamma", [5, 6, 7, 8]]
    b = _complete(base, model=name, prompt=prompts, max_tokens=3, temperature=0, ignore_eos=True, echo=True)
    assert [c["index"] for c in b["choices"]] == [0, 1, 2]
    singles = [
        _complete(base, model=name, prompt=p, max_tokens=3, temperature=0, ignore_eos=True)["choices"][0]["text"]
        for p in prompts
    ]
    echoed = ["alpha beta", "gamma", tok.decode([5, 6, 7, 8])]
    for c, e, single in zip(b["choices"], echoed, singles):
        assert c["text"] == e + single
    n_prompt = len(tok.encode("alpha beta")) + len(tok.encode("gamma")) + 4
    assert b["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 9, "total_tokens": n_prompt + 9}
    # several prompts x n: index = prompt * n + choice
    b = _complete(base, model=name, prompt=[[5, 6], [7, 8]], n=2, max_tokens=2, temperature=0, ignore_eos=True)
    assert [c["index"] for c in b["choices"]] == [0, 1, 2, 3]
    assert b["choices"][0]["text"] == b["choices"][1]["text"]  # greedy: the same
    # streamed echo: the first chunk starts with the prompt
    r = post(
        base, "/v1/completions", {"model": name, "prompt": "alpha beta", "max_tokens": 2, "echo": True, "stream": True}
    )
    ev = parse_sse(r.content)
    assert ev[0]["choices"][0]["text"].startswith("alpha beta")


def test_echo_logprobs_loglikelihood_mode_with_the_client(engine_server, client):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs=k, max_tokens 0 or 1;
    it reads `token_logprobs` over the prompt."""
    name = engine_server[2].model_name
    tok = engine_server[2].tokenizer
    # a greedy continuation and its logprobs, then the same tokens scored as a prompt: the
    # prompt logprobs of the continuation equal the decode-time ones
    base_ids = tok.encode("the quick brown fox")
    g = client.completions.create(
        model=name, prompt=base_ids, max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    gen_lps = g.choices[0].logprobs.token_logprobs
    assert len(gen_lps) == 5
    full = client.completions.create(
        model=name, prompt=base_ids, max_tokens=5, temperature=0, echo=True, logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = full.choices[0].logprobs
    n = len(base_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 5
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[n:] == pytest.approx(gen_lps, abs=1e-5)  # the generated part as before
    assert all(v < 0 for v in lp.token_logprobs[1:])
    for i in range(1, n + 5):
        top = lp.top_logprobs[i]
        # the token, then its 2 most likely alternatives (3 entries when it is not one of them)
        assert list(top)[0] == lp.tokens[i] and top[lp.tokens[i]] == lp.token_logprobs[i]
        assert 1 <= len(top) <= 3  # (fewer when texts coincide: byte tokens show as U+FFFD)
    assert lp.tokens[:n] == [tok.decode([t]) for t in base_ids]
    assert lp.text_offset[:n] == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    assert lp.text_offset[n] == len(tok.decode(base_ids))  # the output's offsets follow the echo
    assert full.choices[0].text == tok.decode(base_ids) + g.choices[0].text
    # max_tokens 0: the prompt scored, nothing generated; each prompt logprob equals the
    # raw logprob of that token sampled after the tokens before it (forced by logit_bias)
    sc = client.completions.create(model=name, prompt=base_ids, max_tokens=0, echo=True, logprobs=1)
    for j in range(1, n):
        forced = client.completions.create(
            model=name, prompt=base_ids[:j], max_tokens=1, logprobs=0, logit_bias={str(base_ids[j]): 100}
        )
        assert forced.choices[0].logprobs.token_logprobs[0] == pytest.approx(lp.token_logprobs[j], abs=1e-4)
    ch = sc.choices[0]
    slp = ch.logprobs
    assert ch.finish_reason == "length" and sc.usage.completion_tokens == 0
    assert sc.usage.prompt_tokens == n and ch.text == tok.decode(base_ids)
    assert len(slp.tokens) == n and slp.token_logprobs[0] is None and slp.top_logprobs[0] is None
    assert slp.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:n], abs=1e-5)
    assert slp.text_offset == lp.text_offset[:n]
    # logprobs=0: each prompt token alone, no alternatives (the first token's stays null)
    sc0 = client.completions.create(model=name, prompt=base_ids, max_tokens=0, echo=True, logprobs=0)
    lp0 = sc0.choices[0].logprobs
    assert lp0.top_logprobs == [None] + [{t: v} for t, v in zip(lp0.tokens[1:], lp0.token_logprobs[1:])]
    # max_tokens 1 (the harness's other spelling): prompt then one token
    one = client.completions.create(model=name, prompt=base_ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert len(one.choices[0].logprobs.tokens) == n + 1 and one.usage.completion_tokens == 1
    # streamed: the first chunk carries the echo and the prompt's logprobs
    chunks = list(
        client.completions.create(model=name, prompt=base_ids, max_tokens=0, echo=True, logprobs=1, stream=True)
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    got = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert text == tok.decode(base_ids) and got[0] is None
    assert got[1:] == pytest.approx(lp.token_logprobs[1:n], abs=1e-5)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # max_tokens 0 with echo and no logprobs: the prompt alone; n > 1 and lists work too
    b = _complete(engine_server[0], model=name, prompt=["alpha", "beta"], n=2, max_tokens=0, echo=True)
    assert [c["text"] for c in b["choices"]] == ["alpha", "alpha", "beta", "beta"]
    assert all(c["logprobs"] is None and c["finish_reason"] == "length" for c in b["choices"])
    assert b["usage"]["completion_tokens"] == 0


def test_echo_logprobs_with_prefix_caching_and_chunks(engine_server, client):
    """`--enable-prefix-caching`, prompts chunked (b_max 16): a prompt cached by a plain
    request is scored all the same (no cached block reused for it), equal to the scores
    of the server without caching that takes the prompt in one step."""
    import openai

    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    ref_backend = engine_server[2]
    backend = make_engine_backend(
        ref_backend.root,
        SchedulerOptions(b_max=16, max_running=4, prefix_caching=True, block_size=4),
        max_model_len=512,
        num_blocks=132,  # 512 tokens after the 4 blocks held back for running sequences
        block_size=4,
        seed=0,
    )
    name = ref_backend.model_name
    ids = [(7 * i + 3) % 200 + 5 for i in range(45)]  # 45 tokens: 3 chunks, 11 full blocks
    ref = client.completions.create(model=name, prompt=ids, max_tokens=0, echo=True, logprobs=2).choices[0].logprobs
    with running_server(backend) as (base, _):
        pc = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        pc.completions.create(model=name, prompt=ids, max_tokens=1)  # caches the prompt
        stats = backend.core.state.prefix_stats()
        assert stats["cached_blocks"] >= 11
        hits = stats["hit_tokens"]
        got = pc.completions.create(model=name, prompt=ids, max_tokens=0, echo=True, logprobs=2).choices[0].logprobs
        assert backend.core.state.prefix_stats()["hit_tokens"] == hits
        pc.completions.create(model=name, prompt=ids, max_tokens=1)
        assert backend.core.state.prefix_stats()["hit_tokens"] > hits  # the cache still serves
    assert len(got.token_logprobs) == len(ids) == len(ref.token_logprobs)
    assert got.token_logprobs[0] is None and got.tokens == ref.tokens
    assert got.token_logprobs[1:] == pytest.approx(ref.token_logprobs[1:], abs=1e-4)
    for a, b in zip(got.top_logprobs[1:], ref.top_logprobs[1:]):
        assert sorted(a.values()) == pytest.approx(sorted(b.values()), abs=1e-4)


def test_max_tokens_zero_rules(engine_server):
    base, _, backend = engine_server
    name = backend.model_name
    for body, param, words in (
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "echo"),
        ({"prompt": "x", "max_tokens": 0, "logprobs": 1}, "max_tokens", "echo"),
        ({"prompt": "x", "max_tokens": -1, "echo": True}, "max_tokens", "at least 0"),
        ({"prompt": "x", "max_tokens": 0, "echo": True, "min_tokens": 1}, "min_tokens", "at most"),
        ({"prompt": "x", "max_tokens": 0, "echo": True, "logprobs": 21}, "logprobs", "at most 20"),
    ):
        r = post(base, "/v1/completions", {"model": name, **body})
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"]
    # chat keeps max_tokens >= 1
    r = post(
        base, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_logit_bias_and_penalties(engine_server):
    base, _, backend = engine_server
    name = backend.model_name
    tok = backend.tokenizer
    kw = dict(model=name, prompt=[5, 6, 7], max_tokens=12, temperature=0, ignore_eos=True)
    plain = _complete(base, logprobs=1, **kw)["choices"][0]
    # a +100 bias makes token 42 win every step; logprobs stay the raw model's
    b = _complete(base, logit_bias={"42": 100}, logprobs=1, **kw)["choices"][0]
    assert b["text"] == tok.decode([42] * 12)
    assert b["logprobs"]["tokens"] == [tok.decode([42])] * 12
    # its top_logprobs: token 42 first, then the most likely token (unless 42 is that one)
    top0 = b["logprobs"]["top_logprobs"][0]
    assert list(top0)[0] == tok.decode([42]) and top0[tok.decode([42])] == b["logprobs"]["token_logprobs"][0]
    assert len(top0) == 2 or plain["text"].startswith(tok.decode([42]))
    assert b["logprobs"]["token_logprobs"][0] < max(b["logprobs"]["top_logprobs"][0].values()) or plain[
        "text"
    ].startswith(tok.decode([42]))
    # a -100 bias on the greedy first token: another first token
    first = _complete(base, **{**kw, "max_tokens": 1})["choices"][0]["text"]
    first_id = backend.tokenizer.encode(first)  # may carry BOS: take the last id
    r = _complete(base, logit_bias={str(first_id[-1]): -100}, **{**kw, "max_tokens": 1})["choices"][0]["text"]
    assert r != first
    # penalties change a greedy text that repeats itself
    ids_plain = post(base, "/tokenize", {"prompt": plain["text"], "add_special_tokens": False}).json()["tokens"]
    assert len(set(ids_plain)) < len(ids_plain), "the plain greedy text should repeat a token"
    for pen in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 3.0}):
        t = _complete(base, **pen, **kw)["choices"][0]["text"]
        assert t != plain["text"], pen
    # out-of-vocabulary bias: the client's error
    r = post(base, "/v1/completions", {**kw, "logit_bias": {str(backend.vocab_size): 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_n_choices_are_freed_when_the_client_leaves(engine_server):
    import httpx

    base, srv, backend = engine_server
    eng = engine_of(srv)
    body = {"model": backend.model_name, "prompt": "x", "n": 4, "max_tokens": 400, "ignore_eos": True, "stream": True}
    seen = 0
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
        for _ in r.iter_bytes():
            seen = max(seen, len(eng.streams))
            if seen == 4 and eng.snapshot.get("kv_blocks_used", 0) > 0:
                break
    assert seen == 4  # the client left while its 4 choices were decoding
    assert wait_for(lambda: not eng.streams, timeout=10)
    assert wait_for(lambda: eng.snapshot.get("kv_blocks_used") == 0, timeout=10)


# ---- the sim backend ------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_server():
    with running_server() as (base, srv):
        yield base, srv


def test_max_tokens_zero_ends_at_its_length_whatever_stopped_the_engine(sim_server):
    """max_tokens 0: the one token the engine samples is dropped, and so is the reason it
    stopped (here a stop string that matches it): "length", no stop_reason, streamed or not."""
    base, _ = sim_server
    body = {"model": "llmsched-sim", "prompt": "abcd", "echo": True, "stop": [" tok"]}
    r = post(base, "/v1/completions", {**body, "max_tokens": 1}).json()  # the token, its stop
    assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["stop_reason"] == " tok"
    r = post(base, "/v1/completions", {**body, "max_tokens": 0}).json()
    ch = r["choices"][0]
    assert (ch["text"], ch["finish_reason"], ch["stop_reason"]) == ("abcd", "length", None)
    assert r["usage"]["completion_tokens"] == 0
    body.update(max_tokens=0, stream=True, stream_options={"include_usage": True})
    ev = parse_sse(post(base, "/v1/completions", body).content)
    chunks = [e for e in ev[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "abcd"
    assert (chunks[-1]["choices"][0]["finish_reason"], chunks[-1]["choices"][0]["stop_reason"]) == ("length", None)
    assert ev[-2]["usage"]["completion_tokens"] == 0 and ev[-1] == "[DONE]"


def test_sim_backend_n_lists_echo_and_refusals(sim_server):
    import openai

    base, _ = sim_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    c = client.completions.create(model="llmsched-sim", prompt=["abcd", "abcdefgh"], n=2, max_tokens=3, echo=True)
    assert [ch.index for ch in c.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in c.choices] == ["abcd tok tok tok"] * 2 + ["abcdefgh tok tok tok"] * 2
    assert c.usage.prompt_tokens == 1 + 2 and c.usage.completion_tokens == 12
    # penalties are accepted (the sim's text is synthetic, they change nothing)
    c = client.completions.create(model="llmsched-sim", prompt="x", max_tokens=2, frequency_penalty=1.0)
    assert c.choices[0].text == " tok tok"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="llmsched-sim", prompt="x", max_tokens=2, logprobs=1)
    assert "logits" in ei.value.message and ei.value.param == "logprobs"
    # the prompt's logprobs (echo) need logits too; max_tokens 0 with echo: the prompt alone
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="llmsched-sim", prompt="x", max_tokens=0, echo=True, logprobs=1)
    assert "logits" in ei.value.message and ei.value.param == "logprobs"
    c = client.completions.create(model="llmsched-sim", prompt="abcd", max_tokens=0, echo=True)
    assert c.choices[0].text == "abcd" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 0 and c.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model="llmsched-sim",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_object"},
        )
    assert "not supported" in ei.value.message
    stream = client.chat.completions.create(
        model="llmsched-sim", messages=[{"role": "user", "content": "x"}], n=2, max_tokens=3, stream=True
    )
    texts = {0: "", 1: ""}
    roles = set()
    for p in stream:
        for ch in p.choices:
            if ch.delta.role:
                roles.add(ch.index)
            texts[ch.index] += ch.delta.content or ""
    assert roles == {0, 1} and texts == {0: " tok tok tok", 1: " tok tok tok"}


def _chat_texts(base, body) -> tuple[list, dict]:
    """The choices' contents of a chat request, and of the same request streamed."""
    r = post(base, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    streamed = {}
    for e in parse_sse(post(base, "/v1/chat/completions", {**body, "stream": True}).content):
        for c in [] if e == "[DONE]" else e["choices"]:
            streamed[c["index"]] = streamed.get(c["index"], "") + (c["delta"].get("content") or "")
    return [c["message"]["content"] for c in r.json()["choices"]], streamed


def test_chat_echo_returns_the_last_message_when_the_reply_continues_it(sim_server):
    """vLLM's chat `echo`: the last message's content comes first in each choice's content
    when it is the reply's role (the assistant's; any role's without a generation prompt),
    text parts joined by newlines; otherwise echo adds nothing."""
    base, _ = sim_server
    user = {"role": "user", "content": "hi"}
    for messages, extra, echoed in (
        ([user, {"role": "assistant", "content": "The answer is"}], {}, "The answer is"),
        ([user], {}, ""),
        ([user], {"add_generation_prompt": False}, "hi"),
        ([{"role": "assistant", "content": [{"type": "text", "text": t} for t in "ab"]}], {}, "a\nb"),
    ):
        body = {"model": "llmsched-sim", "messages": messages, "max_tokens": 2, "n": 2, "echo": True, **extra}
        plain, streamed = _chat_texts(base, body)
        assert plain == [echoed + " tok tok"] * 2, (messages, plain)
        assert streamed == {0: echoed + " tok tok", 1: echoed + " tok tok"}, (messages, streamed)
    r = post(base, "/v1/chat/completions", {"model": "llmsched-sim", "messages": [user], "echo": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_tokenize_honours_add_special_tokens(engine_server):
    base, _, backend = engine_server
    with_bos = post(base, "/tokenize", {"prompt": "hello world"}).json()["tokens"]
    plain = post(base, "/tokenize", {"prompt": "hello world", "add_special_tokens": False}).json()
    explicit = post(base, "/tokenize", {"prompt": "hello world", "add_special_tokens": True}).json()["tokens"]
    assert explicit == with_bos
    assert len(with_bos) == plain["count"] + 1 and with_bos[1:] == plain["tokens"]  # the BOS only
    # the count /tokenize gives by default is the one the completion's usage reports
    u = _complete(base, model=backend.model_name, prompt="hello world", max_tokens=1)["usage"]
    assert u["prompt_tokens"] == len(with_bos)
    # a boolean written as a string, as vLLM's pydantic (lax mode) reads it
    assert post(base, "/tokenize", {"prompt": "hello world", "add_special_tokens": "False"}).json() == plain
    r = post(base, "/tokenize", {"prompt": "x", "add_special_tokens": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"


def test_sampler_adjust_by_hand():
    """The penalties and the bias on a 5-token vocabulary, computed by hand (vLLM's rules)."""
    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine.sampler import adjust, sample

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]] * 3)
    ps = [
        SamplingParams(temperature=0, repetition_penalty=2.0),
        SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=1.0),
        SamplingParams(temperature=0, logit_bias={4: 10.0}),
    ]
    # prompt [0, 1], output [3, 3]: repetition touches 0, 1, 3; frequency/presence only 3
    hist = [([0, 1, 3, 3], 2)] * 3
    out = adjust(logits, ps, hist)
    assert out[0].tolist() == pytest.approx([1.0, -2.0, 0.5, 1.5, -2.0])
    assert out[1].tolist() == pytest.approx([2.0, -1.0, 0.5, 3.0 - 2 * 0.5 - 1.0, -2.0])
    assert out[2].tolist() == pytest.approx([2.0, -1.0, 0.5, 3.0, 8.0])
    assert logits[0, 0] == 2.0  # the input is not changed
    lps: list = []
    toks = sample(logits, ps, [None] * 3, history=hist, logprobs_out=lps)
    assert toks == [3, 0, 4]
    assert lps == [None] * 3  # none asked for logprobs
    p = SamplingParams(temperature=0, logprobs=2, logit_bias={4: 10.0})
    lps = []
    assert sample(logits[:1], [p], [None], logprobs_out=lps) == [4]
    raw = torch.log_softmax(logits[0], dim=-1)
    tok_lp, top = lps[0]
    assert tok_lp == pytest.approx(raw[4].item())  # the raw distribution, before the bias
    assert [i for i, _ in top] == [3, 0] and top[0][1] == pytest.approx(raw[3].item())


# ---- llmsched bench against the engine: prompt lengths and vLLM's result file ----------
VLLM_RESULT_FIELDS = (
    "date endpoint_type backend label model_id tokenizer_id num_prompts request_rate burstiness max_concurrency "
    "duration completed failed total_input_tokens total_output_tokens request_throughput request_goodput "
    "output_throughput total_token_throughput max_output_tokens_per_s max_concurrent_requests "
    "mean_ttft_ms median_ttft_ms std_ttft_ms p99_ttft_ms mean_tpot_ms median_tpot_ms std_tpot_ms p99_tpot_ms "
    "mean_itl_ms median_itl_ms std_itl_ms p99_itl_ms latencies queue_times rtfx "
    "input_lens output_lens ttfts itls generated_texts errors start_times"
).split()


def test_bench_chat_prompts_have_the_intended_length(engine_server, tmp_path, capsys):
    import json

    from llmsched.cli import main

    base, _, backend = engine_server
    tok = backend.tokenizer
    # the old prompt unit: a real tokenizer splits "tok " in two (~2x the tokens asked for)
    assert len(tok.encode("tok " * 40, add_special_tokens=False)) > 60
    argv = ["bench", "--base-url", base, "--backend", "openai-chat", "--dataset-name", "random"]
    argv += ["--random-input-len", "40", "--random-output-len", "3", "--num-prompts", "4", "--ignore-eos"]
    argv += ["--save-result", "--result-dir", str(tmp_path / "res"), "--label", "t", "--save-detailed"]
    argv += ["--disable-tqdm", "--metadata", "run=a"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "per 1 s, as vLLM" in out and "instantaneous" in out
    files = list((tmp_path / "res").glob("t-infqps-*.json"))
    assert len(files) == 1, files
    data = json.loads(files[0].read_text())
    missing = [k for k in VLLM_RESULT_FIELDS if k not in data]
    assert not missing, missing
    assert data["backend"] == "openai-chat" and data["run"] == "a" and data["completed"] == 4
    assert data["output_lens"] == [3] * 4 and all(t for t in data["generated_texts"])
    unit = data["text_unit"]
    assert data["text_unit_exact"] and len(tok.encode(unit * 40, add_special_tokens=False)) == 40
    # what the server counted: the 40-token content plus the chat rendering and BOS
    whole = post(base, "/tokenize", {"messages": [{"role": "user", "content": unit * 40}]}).json()["count"]
    empty = post(base, "/tokenize", {"messages": [{"role": "user", "content": ""}]}).json()["count"]
    assert data["input_lens"] == [whole] * 4
    assert 40 <= whole <= 40 + empty + 1
