"""llmsched: simulate, analyse and serve LLM inference under token-level batch schedulers."""

__version__ = "0.1.0"
