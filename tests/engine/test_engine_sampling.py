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
    mixed = sample(
        logits[:2],
        [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.3)],
        [None, torch.Generator().manual_seed(0)],
    )
    assert mixed[0] == 1 and mixed[1] == 1


def test_stop_strings_cut_text(llm):
    base = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    text = base.text
    assert len(text) > 6
    stop = text[3:6]
    o = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == text[: text.find(stop)]
    assert stop not in o.text
    assert base.token_ids[: len(o.token_ids)] == o.token_ids and len(o.token_ids) < len(base.token_ids)


def test_stop_token_ids_and_eos(llm):
    base = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    tok = base.token_ids[4]
    first = base.token_ids.index(tok)
    o = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[tok]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == tok
    assert o.token_ids == base.token_ids[: first + 1]
    # the same token as EOS: stops unless ignore_eos
    eng = llm.engine
    saved = eng.eos_ids
    eng.eos_ids = frozenset([tok])
    try:
        e = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0))[0]
        i = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    finally:
        eng.eos_ids = saved
    assert e.finish_reason == "stop" and e.token_ids == base.token_ids[: first + 1]
    assert i.token_ids == base.token_ids and i.finish_reason == "length"


def test_streamed_pieces_add_up(tiny_model):
    from llmsched.engine.engine import LLMEngine

    eng = LLMEngine(tiny_model, b_max=16, max_num_seqs=4, max_model_len=512)
    tok = eng.tokenizer
    stop = None
    for rid, prompt in enumerate(PROMPTS):
        eng.add_request(
            str(rid), tok.encode(prompt), SamplingParams(max_tokens=15, temperature=0, ignore_eos=True, stop=["zzzz"])
        )
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
    with pytest.raises(ConfigError, match="top_k"):
        SamplingParams(top_k=-2)
    # as in vLLM's SamplingParams, 0 is top-k off, as -1 is
    assert SamplingParams(top_k=0).top_k == SamplingParams(top_k=-1).top_k == -1
    with pytest.raises(ConfigError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ConfigError, match="seed"):
        SamplingParams(seed=10**23)  # torch.manual_seed would overflow
    with pytest.raises(ConfigError, match="seed"):
        SamplingParams(seed=-(2**63) - 1)
    SamplingParams(seed=2**63 - 1)
    SamplingParams(seed=-(2**63))
    with pytest.raises(ConfigError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ConfigError, match="min_tokens"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(temperature=float("nan"))
    # the Python API checks what the HTTP server checks: a NaN bias won every argmax, a
    # str key failed mid-step, a fractional top_k or a non-integer stop id passed
    for bad in ({5: float("nan")}, {5: 101}, {"5": 1.0}, {-1: 1.0}, {True: 1.0}):
        with pytest.raises(ConfigError, match="logit_bias"):
            SamplingParams(logit_bias=bad)
    with pytest.raises(ConfigError, match="top_k"):
        SamplingParams(top_k=1.5)
    for bad in (["x"], [-1], [2.0]):
        with pytest.raises(ConfigError, match="stop_token_ids"):
            SamplingParams(stop_token_ids=bad)
    SamplingParams(logit_bias={5: -100, 6: 2.5}, top_k=3, stop_token_ids=[0, 7])


def test_a_logit_bias_outside_the_vocabulary_is_refused(llm):
    vocab = llm.engine.config.vocab_size
    with pytest.raises(ConfigError, match="logit_bias token id"):
        llm.engine.add_request("r-oov", [1, 2, 3], SamplingParams(max_tokens=2, logit_bias={vocab: 5.0}))
    # a bias inside it is applied: +100 on one id makes greedy decoding pick it
    (out,) = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0, logit_bias={7: 100}, ignore_eos=True))
    assert out.token_ids == [7, 7, 7]


def test_a_text_prompt_given_as_token_ids_is_refused_as_text(llm):
    # iterated, "hello" gave the token id 'h', refused as "outside the vocabulary"
    for text in ("hello", b"hello"):
        with pytest.raises(ConfigError, match="must be a list of token ids.*tokenizer, or use LLM.generate"):
            llm.engine.add_request("r-text", text, SamplingParams(max_tokens=2))
    assert "r-text" not in llm.engine._requests  # nothing queued


def test_tiny_temperature_is_greedy_and_spares_the_batch(llm):
    assert SamplingParams(temperature=1e-40).greedy and SamplingParams(temperature=9e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    g = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    # logits / 1e-40 overflow float32: it used to make torch.multinomial raise, failing
    # every request of the step; a greedy neighbour shares the batch here
    mixed = llm.generate(
        PROMPTS,
        [
            SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=10, temperature=1e-40, ignore_eos=True),
            SamplingParams(max_tokens=10, temperature=1e-30, seed=1, ignore_eos=True),
        ],
    )
    assert [o.token_ids for o in mixed] == [o.token_ids for o in g]
    seeded = llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=1e-5, seed=3, ignore_eos=True))
    assert len(seeded[0].token_ids) == 10


def test_sampler_bad_row_does_not_fail_the_others():
    import torch

    from llmsched.engine.sampler import sample

    logits = torch.tensor(
        [
            [0.0, 5.0, 4.9, -1.0],
            [float("nan")] * 4,
            [float("-inf")] * 4,
            [0.0, float("inf"), 1.0, 2.0],
            [1.0, 0.0, 9.0, 0.0],
        ]
    )
    params = [SamplingParams(temperature=1.0, top_k=2)] * 4 + [SamplingParams(temperature=0)]
    gens = [torch.Generator().manual_seed(i) for i in range(4)] + [None]
    toks = sample(logits, params, gens)
    assert toks[0] in (1, 2) and toks[4] == 2
    assert all(0 <= t < 4 for t in toks)
    # banned ids (min_tokens) are never drawn, greedy or not; ids outside the vocabulary are ignored
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0]] * 50)
    params = [SamplingParams(temperature=0)] + [SamplingParams(temperature=1.0)] * 49
    gens = [None] + [torch.Generator().manual_seed(i) for i in range(49)]
    toks = sample(logits, params, gens, banned=[frozenset([1, -1, 99])] * 50)
    assert toks[0] == 2 and 1 not in toks


def test_logit_bias_comes_before_the_penalties():
    # vLLM V1: logit_bias, then the penalties on the biased logits
    import torch

    from llmsched.engine.sampler import adjust, sample

    logits = torch.tensor([[-0.5, 1.0, 0.0]])
    p = SamplingParams(temperature=0, logit_bias={0: 6.0}, repetition_penalty=4.0, frequency_penalty=1.0)
    got = adjust(logits, [p], [([0, 2, 0], 1)])[0].tolist()
    # token 0: (-0.5 + 6) / 4 - 1 * 1 (once in the output); token 2: 0 * 4 - 1
    assert got == pytest.approx([(-0.5 + 6) / 4 - 1, 1.0, -1.0])
    # the other order would give -0.5 * 4 + 6 - 1 = 3 and pick token 0; this order picks 1
    assert sample(logits, [p], [None], history=[([0, 2, 0], 1)]) == [1]


def test_min_tokens(llm):
    eng = llm.engine
    base = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    first = base.token_ids[0]
    # the first greedy token as a stop token: without min_tokens it ends the request at once
    o = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[first]))[0]
    assert o.token_ids == [first] and o.finish_reason == "stop" and o.stop_reason == first
    o = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[first], min_tokens=4))[0]
    assert len(o.token_ids) >= 5 and first not in o.token_ids[:4]
    assert o.token_ids[0] != first
    # the same token as EOS, or as a --generation-config file's other EOS id: masked too,
    # even with ignore_eos (as vLLM's _all_stop_token_ids), which only lets it not stop
    saved = eng.eos_ids, eng.config_stop_ids
    for eos_ids, config_ids in ((frozenset([first]), frozenset()), (frozenset(), frozenset([first]))):
        eng.eos_ids, eng.config_stop_ids = eos_ids, config_ids
        try:
            e = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, min_tokens=6))[0]
            i = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, min_tokens=6, ignore_eos=True))[0]
        finally:
            eng.eos_ids, eng.config_stop_ids = saved
        assert len(e.token_ids) >= 6 and first not in e.token_ids[:6]
        assert e.finish_reason == "length" or (e.token_ids[-1] == first and e.stop_reason in (None, first))
        assert len(i.token_ids) == 20 and i.finish_reason == "length"
        assert first not in i.token_ids[:6] and i.token_ids[:6] == e.token_ids[:6]
    # stop strings are not checked before min_tokens tokens
    stop = base.text[:2]
    assert stop
    o = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert o.finish_reason == "stop" and len(o.token_ids) < 4
    o = llm.generate(
        PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop], min_tokens=8)
    )[0]
    assert len(o.token_ids) >= 8 and o.token_ids == base.token_ids[: len(o.token_ids)]
    assert o.text.startswith(stop)
    # as in vLLM, with min_tokens=1 the first token's text is never searched for a stop
    # string (the old check matched it there: one token, cut to nothing)
    one = llm.generate(PROMPTS[1], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))[0].text
    assert one
    o = llm.generate(
        PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[one], min_tokens=1)
    )[0]
    assert len(o.token_ids) > 1 and o.token_ids == base.token_ids[: len(o.token_ids)]
    assert o.text.startswith(one)


def test_step_outputs_carry_stop_reason(tiny_model):
    from llmsched.engine.engine import LLMEngine

    eng = LLMEngine(tiny_model, b_max=16, max_num_seqs=4, max_model_len=512)
    tok = eng.tokenizer
    ref = LLMEngine(tiny_model, b_max=16, max_num_seqs=4, max_model_len=512)
    ref.add_request("r", tok.encode(PROMPTS[0]), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    ids = []
    while ref.has_unfinished_requests():
        ids += [t for o in ref.step() for t in o.new_token_ids]
    text = tok.decode(ids)
    eng.add_request("id", tok.encode(PROMPTS[0]), SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[ids[3]]))
    eng.add_request(
        "str", tok.encode(PROMPTS[0]), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[text[4:7]])
    )
    eng.add_request("len", tok.encode(PROMPTS[0]), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    last = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            assert o.stop_reason is None or o.finished
            if o.finished:
                last[o.request_id] = o
    assert last["id"].finish_reason == "stop" and last["id"].stop_reason == ids[3]
    assert last["str"].finish_reason == "stop" and last["str"].stop_reason == text[4:7]
    assert last["len"].finish_reason == "length" and last["len"].stop_reason is None


def test_a_tuple_or_numpy_token_ids_is_one_prompt(llm):
    import numpy as np

    sp = SamplingParams(max_tokens=3, temperature=0.0)
    (want,) = llm.generate([[1, 5, 9]], sp)
    for prompt in ((1, 5, 9), [np.int64(1), 5, 9], (np.int32(1), np.int64(5), 9)):
        outs = llm.generate(prompt, sp)
        assert len(outs) == 1 and outs[0].token_ids == want.token_ids
    (pair,) = llm.generate([[np.int64(1), 5]], sp)
    assert len(pair.prompt_token_ids) == 2 and all(type(t) is int for t in pair.prompt_token_ids)
