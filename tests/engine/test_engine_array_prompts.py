"""A numpy array of token ids was refused as a prompt ("got ndarray"), while a list of
numpy integers was taken."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError


def test_numpy_arrays_of_token_ids_are_prompts(tiny_model):
    from llmsched.engine import LLM

    llm = LLM(tiny_model, max_num_seqs=4)
    p = SamplingParams(max_tokens=3, temperature=0)
    ref = llm.generate([[5, 6, 7], [8, 9, 10]], p)
    one = llm.generate(np.array([5, 6, 7]), p)
    rows = llm.generate(np.array([[5, 6, 7], [8, 9, 10]], dtype=np.uint16), p)
    listed = llm.generate([np.array([8, 9, 10])], p)
    assert [c.token_ids for c in one] == [ref[0].token_ids]
    assert [c.token_ids for c in rows] == [c.token_ids for c in ref]
    assert [c.token_ids for c in listed] == [ref[1].token_ids]
    assert one[0].prompt_token_ids == [5, 6, 7] and type(one[0].prompt_token_ids[0]) is int
    with pytest.raises(ConfigError, match="got a 1-D float64 array"):
        llm.generate(np.array([1.0, 2.0]), p)
