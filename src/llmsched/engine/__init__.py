"""Real execution (optional extra `llmsched[engine]`): a PyTorch engine that runs the plans
of llmsched policies on a Llama-family model with a paged KV cache.

Importing this package does not import torch; `LLM`, `LLMEngine` and friends load it on
first use.
"""

from __future__ import annotations

_LAZY = {
    "LLM": "engine", "LLMEngine": "engine", "Completion": "engine",
    "ModelConfig": "loader", "read_config": "loader",
    "make_tiny_model": "tiny", "profile_engine": "profiler", "replay": "replay",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib  # noqa: PLC0415
        try:
            mod = importlib.import_module(f".{_LAZY[name]}", __name__)
        except ModuleNotFoundError as e:
            if e.name in ("torch", "safetensors", "tokenizers"):
                from ..core.errors import ConfigError  # noqa: PLC0415
                raise ConfigError(f"the engine needs {e.name}: pip install 'llmsched[engine]'") from None
            raise
        return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
