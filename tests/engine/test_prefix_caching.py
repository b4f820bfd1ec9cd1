"""Prefix caching in the engine: shared physical blocks, and outputs token for token equal
to Hugging Face with caching on."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import hf_greedy

from llmsched.core.engine_api import SamplingParams

BS = 4


def _cases(base: list[int]) -> tuple[list[list[int]], list[int]]:
    """Prompts sharing `base` (40 tokens = 10 blocks of 4) in different ways, and their
    output lengths."""
    other = [(t * 7 + 5) % 290 + 3 for t in base]
    ps = [
        base[:33] + other[:6],  # 8 common blocks, then diverges inside block 9
        list(base),  # all 10 blocks cached: 9 reused, the last token computed
        base[:22],  # 5 full blocks and a partial one: 5 cached, at most 21 tokens reused -> 5
        other[:30],  # nothing in common
        base[:12] + other[:20],  # exactly 3 common blocks
    ]
    return ps, [7, 9, 5, 6, 8]


@pytest.fixture(scope="module")
def refs(hf_models):
    """arch -> (model folder, base prompt, prompts, output lengths, HF greedy outputs)."""
    import transformers

    out = {}
    for arch in ("llama", "mistral"):
        path, prompts, _ = hf_models[arch]
        base = prompts[3]  # the 40-token prompt
        ps, ns = _cases(base)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        out[arch] = (path, base, ps, ns, [hf_greedy(model, p, n) for p, n in zip(ps, ns)], hf_greedy(model, base, 4))
    return out


def _params(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("policy,b_max", [("sarathi", 8), ("sarathi", 512), ("vllm", 64), ("orca", 16)])
def test_outputs_equal_hf_with_prefix_caching(refs, arch, policy, b_max):
    from llmsched.engine import LLM

    path, base, ps, ns, ref, ref_base = refs[arch]
    llm = LLM(path, scheduler=policy, b_max=b_max, block_size=BS, prefix_caching=True, num_blocks=200, max_num_seqs=8)
    first = llm.generate([base], [_params(4)])  # caches base's 10 blocks
    assert first[0].token_ids == ref_base
    outs = llm.generate(ps, [_params(n) for n in ns])
    assert [o.token_ids for o in outs] == ref
    eng = llm.engine
    pc = eng.state.prefix_stats()
    # admitted together after base finished: 8 + 9 + 5 + 0 + 3 blocks reused
    assert pc["hit_blocks"] == 25 and pc["hit_tokens"] == 25 * BS
    # no leak: every block in use is a cached one, no one holds any
    assert eng.state.kv_used == 0 and pc["free_cached_blocks"] == pc["cached_blocks"]
    assert eng.allocator.num_used == len(eng._cached_blocks) == pc["cached_blocks"]


def test_reused_blocks_are_the_same_physical_blocks(refs):
    from llmsched.engine import LLMEngine

    path, base, ps, ns, ref, ref_base = refs["llama"]
    eng = LLMEngine(
        path, scheduler="sarathi", b_max=512, block_size=BS, prefix_caching=True, num_blocks=200, max_num_seqs=8
    )
    eng.add_request("a", base, _params(2))
    while eng.has_unfinished_requests():
        eng.step()
    cached = dict(eng._cached_blocks)
    assert len(cached) == 10
    used = eng.allocator.num_used
    eng.add_request("b", list(base), _params(3))
    eng.add_request("c", list(base), _params(3))
    seqs = [eng.sequence("b"), eng.sequence("c")]
    eng.step()
    blocks_b = eng._requests["b"].blocks
    # both tables start with the cached physical blocks (no copy): 9 reused, then their own
    for s in seqs:
        assert s.blocks[:9] == [cached[k] for k in blocks_b[:9]]
        assert s.blocks[9] not in cached.values()
    assert eng.allocator.num_used == used + 2  # one own block each for the 10th block
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.finished]
    assert [s.output_ids for s in seqs] == [ref_base[:3]] * 2


@pytest.mark.parametrize("policy", ["sarathi", "vllm"])
def test_preemption_with_prefix_caching_matches_hf(refs, policy):
    """A cache barely larger than the longest request: requests are preempted and come
    back on their own cached blocks, outputs unchanged, nothing leaks."""
    from llmsched.engine import LLM

    path, base, ps, ns, ref, ref_base = refs["llama"]
    longest = max(len(p) + n - 1 for p, n in zip(ps, ns))
    seqs = 4
    blocks = seqs + -(-longest // BS) + 1
    llm = LLM(
        path,
        scheduler=policy,
        b_max=16,
        block_size=BS,
        max_num_seqs=seqs,
        num_blocks=blocks,
        prefix_caching=True,
    )
    outs = llm.generate(ps, [_params(n) for n in ns])
    assert llm.engine.preemptions > 0
    assert [o.token_ids for o in outs] == ref
    eng = llm.engine
    assert eng.state.kv_used == 0
    assert eng.allocator.num_used == len(eng._cached_blocks) == eng.state.prefix_stats()["cached_blocks"]


def test_a_scheduler_specs_block_size_is_the_engines(tiny_model):
    """A SchedulerSpec's block_size 4 was replaced by the engine's default of 16, silently:
    the cache then reused whole 16-token blocks only (a 10-token prefix: nothing)."""
    from llmsched.core.errors import ConfigError
    from llmsched.engine import LLMEngine
    from llmsched.policies.spec import SchedulerSpec

    spec = SchedulerSpec(policy="sarathi", prefix_caching=True, block_size=4)
    eng = LLMEngine(tiny_model, scheduler=spec, num_blocks=300, max_num_seqs=4, max_model_len=256)
    assert eng.allocator.block_size == eng.spec.block_size == eng.stats()["block_size"] == 4
    prompt = list(range(3, 13))
    for rid in ("a", "b"):
        eng.add_request(rid, prompt, _params(2))
        while eng.has_unfinished_requests():
            eng.step()
    assert eng.state.prefix_stats()["hit_tokens"] == 8  # two 4-token blocks of the 10
    # the same size in both places is that size; two sizes are refused, naming both
    assert LLMEngine(tiny_model, scheduler=spec, block_size=4, num_blocks=300, max_num_seqs=4).allocator.block_size == 4
    with pytest.raises(ConfigError, match=r"^block_size 16 differs from the SchedulerSpec's block_size 4"):
        LLMEngine(tiny_model, scheduler=spec, block_size=16, num_blocks=300, max_num_seqs=4)


def test_cache_salt_keeps_prompts_apart(tiny_model):
    """SamplingParams.cache_salt (vLLM's): only requests with the same salt (or none) reuse
    each other's cached blocks; the outputs are those of an uncached run."""
    from llmsched.core.errors import ConfigError
    from llmsched.engine import LLMEngine

    eng = LLMEngine(tiny_model, block_size=4, prefix_caching=True, num_blocks=300, max_num_seqs=4, max_model_len=256)
    prompt = list(range(3, 13))
    hits, outs = [], []
    for rid, salt in (("a", None), ("b", "x"), ("c", "y"), ("d", "x"), ("e", None)):
        p = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, cache_salt=salt)
        eng.add_request(rid, prompt, p)
        toks = []
        while eng.has_unfinished_requests():
            toks += [t for o in eng.step() for t in o.new_token_ids]
        outs.append(toks)
        hits.append(eng.state.prefix_stats()["hit_tokens"])
    assert hits == [0, 0, 0, 8, 16]  # d hits b's two 4-token blocks, e hits a's
    assert all(o == outs[0] for o in outs)
    for bad in ("", 3):
        with pytest.raises(ConfigError, match="cache_salt must be a non-empty string"):
            SamplingParams(cache_salt=bad)
