"""The text bound (`max_model_len x bytes_per_token`) refuses untokenized only texts that
cannot fit: a byte-level BPE may hold tokens much longer than 16 bytes (runs of '=', '-',
whitespace), and a tokenizer that may drop text gets no quick refusal at all."""

from __future__ import annotations

import httpx
import pytest
from srv_helpers import running_server

from llmsched.server.backends import SchedulerOptions, make_sim_backend

LINE = "=" * 64 + "\n"


def _train(folder, *, normalizer=None, pre=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    if normalizer is not None:
        t.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
        show_progress=False,
    )
    t.train_from_iterator([LINE] * 2000 + ["hello world, this is some text.\n"] * 200, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    t.save(str(folder / "tokenizer.json"))
    return t


@pytest.fixture(scope="module")
def long_token_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok64")
    hf = _train(folder)
    backend = make_sim_backend(SchedulerOptions(), "const:1", max_model_len=128, tokenizer=str(folder))
    with running_server(backend) as (base, _):
        yield base, backend, hf


def test_long_tokens_widen_the_bound(long_token_server):
    _, backend, hf = long_token_server
    # "=" * 64 is one token of 64 bytes: the bound is not capped at 16 bytes a token
    assert hf.encode("=" * 64).ids == [hf.token_to_id("=" * 64)]
    assert backend.tokenizer.bytes_per_token >= 64 and backend.tokenizer.text_bound_exact
    assert backend.max_text_bytes == 128 * backend.tokenizer.bytes_per_token


def test_a_prompt_that_fits_is_served_on_every_route(long_token_server):
    base, _, hf = long_token_server
    text = LINE * 40  # 2600 bytes, 80 tokens: more than 128 x 16 bytes, fewer than 128 tokens
    n = len(hf.encode(text).ids)
    assert len(text.encode()) > 128 * 16 and n < 128 - 4
    r = httpx.post(base + "/v1/completions", json={"model": "llmsched-sim", "prompt": text, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == n
    msgs = [{"role": "user", "content": LINE * 30}]
    r = httpx.post(base + "/v1/chat/completions", json={"model": "llmsched-sim", "messages": msgs, "max_tokens": 4})
    assert r.status_code == 200, r.text
    r = httpx.post(base + "/tokenize", json={"prompt": text})
    assert r.status_code == 200 and r.json()["count"] == n


def test_over_the_exact_bound_is_refused_untokenized(long_token_server):
    base, backend, _ = long_token_server
    text = "x" * (backend.max_text_bytes + 1)
    r = httpx.post(base + "/v1/completions", json={"model": "llmsched-sim", "prompt": text, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "bytes of text" in err["message"]


def test_a_tokenizer_that_may_drop_text_is_judged_by_its_tokens(tmp_path):
    from tokenizers import normalizers, pre_tokenizers

    # a normalizer that deletes text: the byte count says nothing about the token count
    _train(tmp_path / "strip", normalizer=normalizers.Replace(" ", ""))
    backend = make_sim_backend(SchedulerOptions(), "const:1", max_model_len=128, tokenizer=str(tmp_path / "strip"))
    assert not backend.tokenizer.text_bound_exact
    # whitespace splitting drops the spaces
    _train(tmp_path / "ws", pre=pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel()]))
    backend = make_sim_backend(SchedulerOptions(), "const:1", max_model_len=128, tokenizer=str(tmp_path / "ws"))
    assert not backend.tokenizer.text_bound_exact
    text = " " * (backend.max_text_bytes + 1) + "hello"  # one or two tokens
    with running_server(backend) as (base, _):
        r = httpx.post(base + "/v1/completions", json={"model": "llmsched-sim", "prompt": text, "max_tokens": 1})
        assert r.status_code == 200, r.text
        r = httpx.post(base + "/v1/completions", json={"model": "llmsched-sim", "prompt": "hello " * 200})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded"
        assert "bytes of text" not in err["message"]


def test_an_added_token_that_swallows_whitespace_is_not_exact(tmp_path):
    from tokenizers import AddedToken

    hf = _train(tmp_path)
    hf.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    hf.save(str(tmp_path / "tokenizer.json"))
    text = " " * 5000 + "<mask>"
    assert len(hf.encode(text).ids) == 1  # one token for 5006 bytes
    backend = make_sim_backend(SchedulerOptions(), "const:1", max_model_len=128, tokenizer=str(tmp_path))
    assert not backend.tokenizer.text_bound_exact
