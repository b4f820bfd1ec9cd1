"""Tiny random models for the engine tests, built with `transformers` config classes and
saved with safetensors, plus Hugging Face greedy reference outputs."""

from __future__ import annotations

import pytest
import safetensors  # noqa: F401
import tokenizers  # noqa: F401
import torch
from engine_helpers import MAX_TOKENS, build_hf_model, hf_greedy, prompts  # noqa: E402

# One intra-op thread: the tiny models gain nothing from more, and on a shared 2-core
# machine a second OpenMP thread waiting for a busy core makes every op many times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """arch -> (model folder, prompts, HF greedy outputs)."""
    out = {}
    for arch in ("llama", "qwen2", "mistral"):
        path = tmp_path_factory.mktemp(f"hf-{arch}")
        model = build_hf_model(arch, path)
        ps = prompts()
        out[arch] = (path, ps, [hf_greedy(model, p, n) for p, n in zip(ps, MAX_TOKENS)])
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A `make-tiny-model` folder (llama, with tokenizer)."""
    from llmsched.engine.tiny import make_tiny_model

    # std 0.15: logits spread enough that float rounding never flips a greedy choice
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", num_layers=2, hidden_size=64, intermediate_size=128, std=0.15
    )
