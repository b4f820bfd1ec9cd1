"""The offline LLM API's inputs of the wrong type are one ConfigError, not a TypeError."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError

pytest.importorskip("torch")
from llmsched.engine import LLM  # noqa: E402


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(tiny_model, kv_cache_gb=0.01, max_num_seqs=4)


def test_a_numpy_seed_is_a_seed(tiny_model):
    a = LLM(tiny_model, seed=np.int64(1), kv_cache_gb=0.01, max_num_seqs=4)
    b = LLM(tiny_model, seed=1, kv_cache_gb=0.01, max_num_seqs=4)
    sp = SamplingParams(max_tokens=4, temperature=1.0)
    assert a.generate(["hi"], sp)[0].token_ids == b.generate(["hi"], sp)[0].token_ids


def test_an_unknown_option_is_named(tiny_model):
    with pytest.raises(ConfigError, match="unknown LLM option 'bogus'"):
        LLM(tiny_model, bogus=1)
    with pytest.raises(ConfigError, match="did you mean 'seed'"):
        LLM(tiny_model, sed=1)


def test_a_scheduler_of_another_type_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="scheduler must be a policy name or a SchedulerSpec, got int"):
        LLM(tiny_model, scheduler=5)


def test_prompts_of_another_type_are_refused(llm):
    with pytest.raises(ConfigError, match="prompts must be a string, a list of token ids or a list of prompts"):
        llm.generate(5, SamplingParams(max_tokens=2))
    assert len(llm.generate(("hi", "yo"), SamplingParams(max_tokens=2))) == 2  # a tuple still works


def test_stop_of_another_type_is_refused():
    with pytest.raises(ConfigError, match="stop must be a string or a list of strings, got int"):
        SamplingParams(stop=5)
    with pytest.raises(ConfigError, match="stop_token_ids must be a list of token ids, got int"):
        SamplingParams(stop_token_ids=5)
    sp = SamplingParams(stop=None, stop_token_ids=None)  # vLLM's defaults
    assert sp.stop == [] and sp.stop_token_ids == []


def test_text_that_is_not_unicode_is_refused(llm):
    """A lone surrogate (undecodable command-line bytes arrive so) raised a TypeError from
    the tokenizer, and a stop string holding one could never match."""
    with pytest.raises(ConfigError, match="prompt is not valid Unicode text"):
        llm.generate("\ud800", SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="stop string is not valid Unicode text"):
        SamplingParams(stop=["ok", "a\udcff"])
