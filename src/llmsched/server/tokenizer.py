"""Prompt token counting for the server.

- `ByteRuleTokenizer` (the sim backend's default): a text of B UTF-8 bytes is
  `max(1, ceil(B / 4))` tokens (the usual "about 4 characters per token" rule of thumb,
  made exact). A chat request counts the contents of its messages joined by a newline.
  No ids are made: only the count matters to the virtual GPU.
- `HFTokenizer`: a real tokenizer read from a folder holding `tokenizer.json` (the
  `tokenizers` package). A chat request is rendered as `role: content` lines (no model
  chat template) before encoding.
Token-id prompts (the completions API accepts a list of ints) are counted as given.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ..core.errors import ConfigError

BYTES_PER_TOKEN = 4


class ByteRuleTokenizer:
    name = "bytes/4"

    def encode(self, text: str) -> Sequence[int]:
        n = max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))
        return range(n)

    def encode_chat(self, messages: list[dict]) -> Sequence[int]:
        return self.encode("\n".join(m["content"] for m in messages))

    def decode(self, ids: Sequence[int]) -> str:
        return " tok" * len(ids)


class HFTokenizer:
    def __init__(self, path: str | Path, tokenizer=None):
        if tokenizer is not None:
            self._tok = tokenizer
            self.name = str(path)
            return
        p = Path(path)
        f = p / "tokenizer.json" if p.is_dir() else p
        if not f.is_file():
            raise ConfigError(f"no tokenizer.json found at {p}")
        try:
            from tokenizers import Tokenizer  # noqa: PLC0415 (optional dependency)
        except ImportError:
            raise ConfigError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
        try:
            self._tok = Tokenizer.from_file(str(f))
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
            raise ConfigError(f"cannot read tokenizer {f}: {e}") from None
        self.name = str(f)

    def encode(self, text: str) -> list[int]:
        enc = self._tok.encode(text, add_special_tokens=False) if hasattr(self._tok, "encode") else None
        ids = enc.ids if hasattr(enc, "ids") else list(enc)
        return ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode("\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:")

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))
