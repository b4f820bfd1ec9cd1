"""Values left in a freed KV block (NaN, inf) never reach a later request (issue 11 item 5).

Decode attention used to read whole blocks and only mask the positions past a request's
context; a masked NaN still poisons SDPA (NaN * 0 = NaN). Both CPU decode paths are
checked: the compiled kernel reads only positions inside the context, the torch path
zeroes the gathered positions outside it.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmsched.core.engine_api import SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
B_PROMPTS = [[1, 7, 9, 30, 2, 2, 41], [5, 6], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def _llm(path, **opts):
    from llmsched.engine import LLM

    return LLM(path, scheduler="sarathi", b_max=16, block_size=4, max_num_seqs=4, num_blocks=40, **opts)


@pytest.fixture(params=["c", "torch"])
def attention(request, monkeypatch):
    monkeypatch.setenv("LLMSCHED_CPU_ATTENTION", request.param)
    return request.param


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_planted_non_finite_values_in_free_blocks_are_never_read(hf_models, attention, poison):
    path, _, _ = hf_models["mistral"]  # sliding-window layers: the window bound is checked too
    ref = [o.token_ids for o in _llm(path).generate(B_PROMPTS, PARAMS)]
    llm = _llm(path)
    assert (llm.engine.runner.decode_kernel is None) == (attention == "torch")
    llm.generate([[3, 4, 5, 6, 7, 8, 9, 10, 11]], PARAMS)  # the blocks have had an owner
    assert llm.engine.allocator.num_used == 0
    runner = llm.engine.runner
    runner.k_cache.fill_(poison)  # every block, the scratch block too
    runner.v_cache.fill_(poison)
    outs = llm.generate(B_PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == ref


def test_a_request_with_non_finite_activations_does_not_poison_the_next(hf_models, attention):
    """The realistic trigger: one request's K/V overflow (here: a NaN embedding row for a
    token only it uses); a later request that gets its freed blocks is unaffected."""
    path, _, _ = hf_models["llama"]
    ref = [o.token_ids for o in _llm(path).generate(B_PROMPTS, PARAMS)]
    llm = _llm(path)
    bad = 99
    assert all(bad not in p for p in B_PROMPTS)
    with torch.no_grad():
        llm.engine.runner.model.embed_tokens.weight[bad] = math.nan
    llm.generate([[1, bad, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]], PARAMS)
    assert torch.isnan(llm.engine.runner.k_cache).any()  # its values stayed in the freed blocks
    outs = llm.generate(B_PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == ref


@pytest.mark.parametrize("window", [None, 5])
def test_decode_kernel_equals_torch_attention(window):
    """The in-place kernel against the gather + SDPA path on ragged contexts, grouped-query
    heads and NaN in every slot outside the contexts."""
    from llmsched.engine import cpu_kernel
    from llmsched.engine.attention import AttnMeta, paged_attention

    fn = cpu_kernel.decode_kernel()
    assert fn is not None
    g = torch.Generator().manual_seed(0)
    kvh, heads, d, bs, nb = 2, 6, 16, 4, 24
    lens = torch.tensor([1, 4, 5, 13, 9])
    tables = torch.randperm(nb, generator=g)[:20].view(5, 4)  # 4 blocks per decoder
    kc, vc = torch.full((kvh, nb + 1, bs, d), math.nan), torch.full((kvh, nb + 1, bs, d), math.nan)
    for b, n in enumerate(lens.tolist()):  # only the positions before the new token are set
        for p in range(n - 1):
            kc[:, tables[b, p // bs], p % bs] = torch.randn(kvh, d, generator=g)
            vc[:, tables[b, p // bs], p % bs] = torch.randn(kvh, d, generator=g)
    q = torch.randn(5, heads, d, generator=g)
    k, v = torch.randn(5, kvh, d, generator=g), torch.randn(5, kvh, d, generator=g)
    slots = tables[torch.arange(5), (lens - 1) // bs] * bs + (lens - 1) % bs
    outs = []
    for kernel in (None, fn):
        meta = AttnMeta(slots, 5, tables, lens, [], bs, fused=kernel)
        outs.append(paged_attention(q, k, v, kc.clone(), vc.clone(), meta, d**-0.5, window))
    assert torch.isfinite(outs[0]).all() and torch.isfinite(outs[1]).all()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
