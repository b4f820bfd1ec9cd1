"""The engine backend's tokenizer path and seeds over HTTP (issue #13, items 1 and 7):
the text bound is safe for the tokenizer (a refused text could never have fit), long
texts are tokenized off the event loop with the same ids as the engine's own tokenizer,
and per-request seeds use all 64 bits."""

from __future__ import annotations

import random

import pytest
import tokenizers  # noqa: F401
import torch  # noqa: F401
from srv_helpers import post, tiny_engine_server

MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    with tiny_engine_server(tmp_path_factory.mktemp("tiny"), max_model_len=MAX_MODEL_LEN, num_blocks=512) as served:
        yield served


def _text(base, name, **kw):
    r = post(
        base,
        "/v1/completions",
        {"model": name, "prompt": "the engine samples", "max_tokens": 24, "ignore_eos": True, "temperature": 1.0, **kw},
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


# ---- item 7 -----------------------------------------------------------------------------
def test_seeds_use_all_64_bits(engine_server):
    base, _, backend = engine_server
    name = backend.model_name
    seeds = [1, 2**32 + 1, 2**33 + 1, -1, 2**63 - 1, -(2**63), 2**63 - 2**32]
    texts = {s: _text(base, name, seed=s) for s in seeds}
    # the same seed draws the same tokens; seeds that differ only above bit 32 (torch's CPU
    # generator kept the low 32 bits) or only in sign do not
    assert all(_text(base, name, seed=s) == texts[s] for s in (1, 2**32 + 1, -1))
    assert len(set(texts.values())) == len(seeds), texts
    assert texts[1] != texts[2**32 + 1] and texts[1] != texts[-1]


def test_engine_generators_take_the_whole_seed():
    """The engine's per-request generator for seed s and s + 2**32 differ (the sampler's
    draws), and torch's CPU generator would not have told them apart."""
    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine.sampler import sample

    g = torch.Generator()
    assert g.manual_seed(1).initial_seed() == 1
    a = torch.rand(4, generator=torch.Generator().manual_seed(1))
    b = torch.rand(4, generator=torch.Generator().manual_seed(2**32 + 1))
    assert torch.equal(a, b)  # the truncation this fixes
    logits = torch.zeros(1, 1000)
    p = [SamplingParams(temperature=1.0)]

    def draw(seed):
        return [sample(logits, p, [gen])[0] for gen in [random.Random(seed & (2**64 - 1))] for _ in range(20)]

    assert draw(1) == draw(1) and draw(1) != draw(2**32 + 1)


# ---- item 1: the tokenizer path ----------------------------------------------------------
def test_text_bound_is_safe_for_the_tokenizer(engine_server):
    """Every text longer than the bound has more than max_model_len tokens, so refusing it
    before tokenizing never refuses a servable prompt."""
    _, _, backend = engine_server
    tok = backend.tokenizer
    hf = backend.core.tokenizer.tok
    vocab = hf.get_vocab(with_added_tokens=True)
    # a byte-level token's characters are one byte each ("Ġrequests": 9 bytes, not 10)
    longest = max(len(t) for t in vocab)
    assert tok.bytes_per_token == longest == 9 and tok.text_bound_exact
    bound = backend.max_text_bytes
    assert bound == MAX_MODEL_LEN * longest
    # texts of bound + 1 bytes made of the longest tokens, of the vocabulary's words, of
    # random bytes: each has more tokens than the context
    words = [hf.decode([i]) for i in range(hf.get_vocab_size())]
    rng = random.Random(0)
    longest_text = max(words, key=lambda w: len(w.encode()))
    samples = [
        longest_text * (bound // len(longest_text.encode()) + 1),
        "".join(rng.choice(words) for _ in range(bound)),
        bytes(rng.randrange(32, 127) for _ in range(bound + 1)).decode(),
        " " * (bound + 1),
        "é" * (bound // 2 + 1),
    ]
    for text in samples:
        text = text.encode()[: bound + 1].decode(errors="ignore")
        while len(text.encode()) <= bound:
            text += "a"
        assert len(backend.core.tokenizer.encode(text)) > MAX_MODEL_LEN, text[:40]


def test_long_text_is_refused_before_tokenizing_and_tokenized_off_the_loop(engine_server):
    base, srv, backend = engine_server
    name = backend.model_name
    bound = backend.max_text_bytes
    limits = srv.config.app.max_body_bytes
    # over the body limit: 413 unread; over the text bound: 400 before tokenizing
    r = post(base, "/v1/completions", {"model": name, "prompt": "x" * 10_000_000, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    for prompt in ("x" * (bound + 1), "x" * (limits - 200)):
        r = post(base, "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 1})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "bytes of text" in err["message"]
    r = post(
        base,
        "/v1/chat/completions",
        {"model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "x" * bound}]},
    )
    assert r.status_code == 400 and "bytes of text" in r.json()["error"]["message"]
    # under the bound: tokenized (in a worker thread: longer than 1024 characters), then
    # refused by its token count, or served
    r = post(base, "/v1/completions", {"model": name, "prompt": "x" * (bound - 10), "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "bytes of text" not in r.json()["error"]["message"]
    text = "the request measures latency " * 60  # 1740 characters
    n = len(backend.core.tokenizer.encode(text))
    r = post(base, "/v1/completions", {"model": name, "prompt": text, "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == n


def test_tokenize_matches_the_engine_tokenizer(engine_server):
    base, _, backend = engine_server
    engine_tok = backend.core.tokenizer
    for text in ("hi", "the request measures latency " * 100, "é" * 700 + " tok"):
        r = post(base, "/tokenize", {"prompt": text})
        assert r.status_code == 200 and r.json()["tokens"] == engine_tok.encode(text)
    msgs = [{"role": "user", "content": "prefill " * 300}]
    r = post(base, "/tokenize", {"messages": msgs})
    assert r.json()["tokens"] == engine_tok.encode("user: " + "prefill " * 300 + "\nassistant:")
    ids = engine_tok.encode("the request measures latency " * 300)
    assert 1024 < len(ids) <= MAX_MODEL_LEN  # decoded in a worker thread
    r = post(base, "/detokenize", {"tokens": ids})
    assert r.status_code == 200 and r.json()["prompt"] == engine_tok.decode(ids)
    r = post(base, "/detokenize", {"tokens": [5] * (MAX_MODEL_LEN + 1)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_version_reports_the_limits(engine_server):
    import httpx

    from llmsched.server.app import default_max_body_bytes

    base, _, backend = engine_server
    limits = httpx.get(base + "/version").json()["limits"]
    assert limits["max_text_bytes"] == backend.max_text_bytes == 9 * MAX_MODEL_LEN
    assert limits["max_body_bytes"] == default_max_body_bytes(MAX_MODEL_LEN, 9 * MAX_MODEL_LEN)
    assert limits["max_body_bytes"] == 6 * 9 * MAX_MODEL_LEN + 32 * MAX_MODEL_LEN + (1 << 20)
