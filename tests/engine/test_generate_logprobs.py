"""`LLM.generate` returns `SamplingParams.logprobs` in each `Completion` (as vLLM's offline
`LLM.generate`: per generated token, its logprob and the top k), and SamplingParams caps
`logprobs` / `prompt_logprobs` at vLLM's default max_logprobs (20), as the server does."""

from __future__ import annotations

import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError

K = 3


def test_generate_returns_logprobs(tiny_model):
    from llmsched.engine import LLM

    llm = LLM(tiny_model, num_threads=1)
    prompt = llm.encode("Hello there")
    params = [
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=K),
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),  # no logprobs asked
        SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=0),
    ]
    with_lp, without, zero = llm.generate([prompt, prompt, prompt], params)
    assert without.logprobs is None
    assert with_lp.token_ids == without.token_ids  # asking for logprobs changes no token
    assert len(with_lp.logprobs) == len(with_lp.token_ids) == 5
    for tok, (lp, top) in zip(with_lp.token_ids, with_lp.logprobs):
        assert len(top) == K and lp <= 0
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        assert top[0][0] == tok and top[0][1] == pytest.approx(lp)  # greedy: the best one
    assert [len(top) for _, top in zero.logprobs] == [0, 0, 0]
    assert [lp for lp, _ in zero.logprobs] == pytest.approx([lp for lp, _ in with_lp.logprobs[:3]], abs=1e-5)
    # the same logprobs, recomputed as prompt logprobs of the prompt followed by the output
    full = prompt + with_lp.token_ids
    (again,) = llm.generate([full], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=K))
    for (lp, top), (plp, ptop) in zip(with_lp.logprobs, again.prompt_logprobs[len(prompt) :]):
        assert plp == pytest.approx(lp, abs=1e-4)
        assert [i for i, _ in ptop][:1] == [i for i, _ in top][:1]


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_logprobs_capped(name):
    assert getattr(SamplingParams(**{name: 20}), name) == 20
    for n in (21, 10**6):
        with pytest.raises(ConfigError, match=f"{name} must be at most 20") as e:
            SamplingParams(**{name: n})
        assert "\n" not in str(e.value)
