"""Greedy outputs equal Hugging Face `generate` token for token, whatever the batching."""

from __future__ import annotations

import pytest
from engine_helpers import MAX_TOKENS

from llmsched.core.engine_api import SamplingParams

CASES = [
    # (policy, engine options)
    ("sarathi", dict(b_max=8)),  # chunked prefill, mixed steps
    ("orca", dict(b_max=16)),
    ("vllm", dict(b_max=64)),  # whole prompts, prefill-only steps
    ("fastertransformer", dict(b_max=32)),
    ("kfcfs", dict(b_max=12, k_max=3)),
    ("sarathi", dict(b_max=512)),  # everything in one step
]


def _run(path, prompts, policy, **opts):
    from llmsched.engine import LLM

    llm = LLM(path, scheduler=policy, **opts)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    return llm, llm.generate(prompts, params)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("policy,opts", CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CASES)])
def test_greedy_matches_hf(hf_models, arch, policy, opts):
    path, prompts, ref = hf_models[arch]
    _, outs = _run(path, prompts, policy, **opts)
    for o, r in zip(outs, ref):
        assert o.token_ids == r
        assert o.finish_reason == "length"


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("policy", ["sarathi", "vllm", "orca"])
def test_preemption_recompute_matches_hf(hf_models, arch, policy):
    """A cache barely larger than the longest request: the policy must preempt, and the
    recomputed requests still produce the reference tokens."""
    path, prompts, ref = hf_models[arch]
    longest = max(len(p) + n - 1 for p, n in zip(prompts, MAX_TOKENS))
    bs, seqs = 4, 4
    blocks = seqs + -(-longest // bs) + 1
    llm, outs = _run(path, prompts, policy, b_max=16, block_size=bs, max_num_seqs=seqs, num_blocks=blocks)
    assert llm.engine.preemptions > 0
    assert [o.token_ids for o in outs] == ref
    assert llm.engine.allocator.num_used == 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("mode", ["torch", "c"])
def test_both_cpu_attention_paths_match_hf(hf_models, arch, mode, monkeypatch):
    """The compiled in-place decode kernel (the CPU default) and the pure-torch gather
    path (CUDA, and CPUs without a C compiler) both give the reference tokens."""
    monkeypatch.setenv("LLMSCHED_CPU_ATTENTION", mode)
    path, prompts, ref = hf_models[arch]
    llm, outs = _run(path, prompts, "sarathi", b_max=8)
    assert (llm.engine.runner.decode_kernel is None) == (mode == "torch")
    assert [o.token_ids for o in outs] == ref
