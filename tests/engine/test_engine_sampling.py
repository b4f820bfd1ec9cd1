"""Sampling and stop conditions."""

from __future__ import annotations

import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError


@pytest.fixture(scope="module")
def llm(tiny_model):
    from llmsched.engine import LLM
    return LLM(tiny_model, b_max=64, max_num_seqs=8, max_model_len=512)


PROMPTS = ["Hello world", "The scheduler decides", "Once upon a time"]


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=123, ignore_eos=True)
    a = llm.generate(PROMPTS, p)
    b = llm.generate(PROMPTS[::-1], p)  # different batch order: same per-request draws
    assert [o.token_ids for o in a] == [o.token_ids for o in b[::-1]]
    c = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, seed=124, ignore_eos=True))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_top_k_1_and_tiny_top_p_equal_greedy(llm):
    g = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    k1 = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.8, top_k=1, seed=5, ignore_eos=True))
    p0 = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=1.3, top_p=1e-6, seed=7, ignore_eos=True))
    assert [o.token_ids for o in k1] == [o.token_ids for o in g]
    assert [o.token_ids for o in p0] == [o.token_ids for o in g]


def test_sampler_respects_top_k():
    import torch

    from llmsched.engine.sampler import sample
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0, 4.8]] * 200)
    params = [SamplingParams(temperature=1.0, top_k=2)] * 200
    gens = [torch.Generator().manual_seed(i) for i in range(200)]
    toks = sample(logits, params, gens)
    assert set(toks) == {1, 2}
    mixed = sample(logits[:2], [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.3)],
                   [None, torch.Generator().manual_seed(0)])
    assert mixed[0] == 1 and mixed[1] == 1


def test_stop_strings_cut_text(llm):
    base = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    text = base.text
    assert len(text) > 6
    stop = text[3:6]
    o = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == text[:text.find(stop)]
    assert stop not in o.text
    assert base.token_ids[:len(o.token_ids)] == o.token_ids and len(o.token_ids) < len(base.token_ids)


def test_stop_token_ids_and_eos(llm):
    base = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    tok = base.token_ids[4]
    first = base.token_ids.index(tok)
    o = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[tok]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == tok
    assert o.token_ids == base.token_ids[:first + 1]
    # the same token as EOS: stops unless ignore_eos
    eng = llm.engine
    saved = eng.eos_ids
    eng.eos_ids = frozenset([tok])
    try:
        e = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0))[0]
        i = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    finally:
        eng.eos_ids = saved
    assert e.finish_reason == "stop" and e.token_ids == base.token_ids[:first + 1]
    assert i.token_ids == base.token_ids and i.finish_reason == "length"


def test_streamed_pieces_add_up(tiny_model):
    from llmsched.engine.engine import LLMEngine
    eng = LLMEngine(tiny_model, b_max=16, max_num_seqs=4, max_model_len=512)
    tok = eng.tokenizer
    stop = None
    for rid, prompt in enumerate(PROMPTS):
        eng.add_request(str(rid), tok.encode(prompt), SamplingParams(max_tokens=15, temperature=0, ignore_eos=True,
                                                                     stop=["zzzz"]))
    pieces: dict[str, list] = {}
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            pieces.setdefault(o.request_id, []).append((o.new_token_ids, o.new_text))
            if o.finished:
                done[o.request_id] = o
    assert stop is None and set(done) == {"0", "1", "2"}
    for rid, ps in pieces.items():
        ids = [t for new, _ in ps for t in new]
        text = "".join(t for _, t in ps)
        assert len(ids) == 15 and done[rid].output_tokens == 15
        assert text == tok.decode(ids)


def test_bad_sampling_params_are_refused():
    with pytest.raises(ConfigError):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError):
        SamplingParams(top_k=0)
    with pytest.raises(ConfigError):
        SamplingParams(max_tokens=0)
