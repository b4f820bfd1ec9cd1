"""Prompt logprobs (`SamplingParams.prompt_logprobs`, lm-evaluation-harness's loglikelihood
mode): every prompt token's logprob given the tokens before it equals Hugging Face's
`log_softmax(model(prompt).logits)` gathered at the next tokens, whole prompts or chunked,
with prefix caching on (a cached prefix is not reused for them), and after preemption."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import MAX_TOKENS

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError

K = 3


def _hf_prompt_logprobs(path, prompts):
    """Per prompt: (logprobs [n - 1], top-K ids [n - 1, K], top-K logprobs) from HF."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            lp = torch.log_softmax(model(torch.tensor([p])).logits[0].float(), dim=-1)[:-1]
            picked = lp.gather(1, torch.tensor(p[1:])[:, None]).squeeze(1)
            tv, ti = lp.topk(K, dim=-1)
            out.append((picked, ti, tv))
    return out


def _check(got, prompt, ref):
    picked, ti, tv = ref
    assert len(got) == len(prompt) and got[0] is None
    lps = torch.tensor([e[0] for e in got[1:]])
    assert torch.allclose(lps, picked, atol=2e-4), (lps - picked).abs().max()
    for (_, top), ids, vals in zip(got[1:], ti.tolist(), tv.tolist()):
        assert len(top) == K
        assert [v for _, v in top] == pytest.approx(vals, abs=2e-4)
        # ties aside, the same tokens in the same order
        assert [i for i, _ in top][:1] == ids[:1] or vals[0] - vals[1] < 1e-4


@pytest.fixture(scope="module")
def refs(hf_models):
    return {arch: _hf_prompt_logprobs(hf_models[arch][0], hf_models[arch][1]) for arch in ("llama", "mistral")}


CASES = [
    ("sarathi", dict(b_max=8)),  # chunked: the 40-token prompt spans 5 steps, mixed with decodes
    ("sarathi", dict(b_max=512)),  # every prompt in one step
    ("vllm", dict(b_max=64)),  # prefill-only steps
]


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("policy,opts", CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CASES)])
def test_prompt_logprobs_match_hf(hf_models, refs, arch, policy, opts):
    from llmsched.engine import LLM

    path, prompts, greedy = hf_models[arch]
    llm = LLM(path, scheduler=policy, **opts)
    # every other request asks for prompt logprobs: the others get none and generate as before
    params = [
        SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, prompt_logprobs=K if i % 2 == 0 else None)
        for i, n in enumerate(MAX_TOKENS)
    ]
    outs = llm.generate(prompts, params)
    for i, (o, p, ref, g) in enumerate(zip(outs, prompts, refs[arch], greedy)):
        assert o.token_ids == g
        if i % 2 == 0:
            _check(o.prompt_logprobs, p, ref)
        else:
            assert o.prompt_logprobs is None
    assert llm.engine.allocator.num_used == 0


def test_prompt_logprobs_with_prefix_caching(hf_models, refs):
    """The prompts are cached first (by requests that do not want logprobs): a request that
    wants them computes its whole prompt all the same, and what it computes is cached."""
    from llmsched.engine import LLM

    path, prompts, greedy = hf_models["llama"]
    llm = LLM(path, scheduler="sarathi", b_max=16, block_size=4, prefix_caching=True)
    eng = llm.engine
    plain = [SamplingParams(max_tokens=2, temperature=0, ignore_eos=True) for _ in prompts]
    llm.generate(prompts, plain)
    stats = eng.state.prefix_stats()
    hits0, cached0 = stats["hit_tokens"], stats["cached_blocks"]
    assert cached0 >= sum(len(p) // 4 for p in prompts) - 1  # the cache holds the prompts
    want = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, prompt_logprobs=K) for n in MAX_TOKENS]
    outs = llm.generate(prompts, want)
    for o, p, ref, g in zip(outs, prompts, refs["llama"], greedy):
        _check(o.prompt_logprobs, p, ref)
        assert o.token_ids == g
    assert eng.state.prefix_stats()["hit_tokens"] == hits0  # no cached block was reused
    # the cache still serves requests that do not want prompt logprobs
    llm.generate(prompts, plain)
    assert eng.state.prefix_stats()["hit_tokens"] > hits0


def test_prompt_logprobs_fresh_prompts_are_cached(hf_models, refs):
    """A request with prompt logprobs still fills the cache for the next ones."""
    from llmsched.engine import LLM

    path, prompts, _ = hf_models["llama"]
    llm = LLM(path, scheduler="sarathi", b_max=16, block_size=4, prefix_caching=True)
    p = prompts[3]  # 40 tokens
    (o,) = llm.generate([p], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    _check_values_only(o.prompt_logprobs, p, refs["llama"][3])
    assert all(top == [] for _, top in o.prompt_logprobs[1:])
    llm.generate([p], SamplingParams(max_tokens=1, temperature=0))
    assert llm.engine.state.prefix_stats()["hit_tokens"] >= 36


def _check_values_only(got, prompt, ref):
    assert len(got) == len(prompt) and got[0] is None
    lps = torch.tensor([e[0] for e in got[1:]])
    assert torch.allclose(lps, ref[0], atol=2e-4)


def test_prompt_logprobs_survive_preemption(hf_models, refs):
    """A cache barely larger than the longest request: requests are preempted and
    recomputed; the prompt logprobs are computed once and still equal HF's."""
    from llmsched.engine import LLM

    path, prompts, greedy = hf_models["llama"]
    longest = max(len(p) + n - 1 for p, n in zip(prompts, MAX_TOKENS))
    bs, seqs = 4, 4
    llm = LLM(
        path, scheduler="sarathi", b_max=16, block_size=bs, max_num_seqs=seqs, num_blocks=seqs + -(-longest // bs) + 1
    )
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, prompt_logprobs=K) for n in MAX_TOKENS]
    outs = llm.generate(prompts, params)
    assert llm.engine.preemptions > 0
    for o, p, ref, g in zip(outs, prompts, refs["llama"], greedy):
        assert o.token_ids == g
        _check(o.prompt_logprobs, p, ref)


def test_prompt_logprobs_param_is_checked():
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)
    assert SamplingParams(prompt_logprobs=0).prompt_logprobs == 0
