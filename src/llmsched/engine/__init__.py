"""Real execution (optional extra `llmsched[engine]`): a PyTorch engine that runs the plans
of llmsched policies on a Llama-family model with a paged KV cache.

Importing this package does not import torch; `LLM`, `LLMEngine` and friends load it on
first use.
"""

from __future__ import annotations

from ..core.lazy import lazy_dir, lazy_getattr

_LAZY = {
    "LLM": "engine",
    "LLMEngine": "engine",
    "Completion": "engine",
    "ModelConfig": "loader",
    "read_config": "loader",
    "make_tiny_model": "tiny",
    "profile_engine": "profiler",
    "replay": "replaying",
}

__all__ = list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY, ("torch", "safetensors", "tokenizers"), "engine")
__dir__ = lazy_dir(globals(), _LAZY)
