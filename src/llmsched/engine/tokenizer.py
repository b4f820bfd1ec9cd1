"""`tokenizer.json` (the `tokenizers` library) and incremental detokenization."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import ConfigError


def tokenizer_file(path) -> Path:
    """The tokenizer.json `path` names: the file itself, else the one in that folder (it
    may not exist: the caller asks `is_file()`)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"tokenizer must be a tokenizer.json file or a folder holding one, got {path!r}")
    p = Path(path)
    return p if p.is_file() else p / "tokenizer.json"


class Tokenizer:
    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def from_dir(cls, model_dir, *, required: bool = False) -> Tokenizer | None:
        """The folder's tokenizer.json (or `model_dir` itself, a tokenizer.json file), or
        None if it has none (ConfigError if `required`)."""
        path = tokenizer_file(model_dir)
        if not path.is_file():
            if required:
                raise ConfigError(f"no tokenizer.json found at {model_dir}")
            return None
        from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

        try:
            return cls(HFTokenizer.from_file(str(path)))
        except Exception as e:  # the tokenizers library raises bare Exceptions
            raise ConfigError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)


class Detokenizer:
    """Text of a growing sequence, a few tokens at a time: decodes a short window before the
    new tokens and emits where it departs from the window's text so far, holding back a
    trailing partial UTF-8 character. A character the prompt's last bytes begin is returned
    whole once the output completes it (its bytes decode to U+FFFD in the prompt's text), so
    the text is decode(prompt + output) minus what it shares with decode(prompt)."""

    __slots__ = ("tok", "prefix", "read")

    def __init__(self, tok: Tokenizer, prompt_len: int):
        self.tok = tok
        self.read = prompt_len
        self.prefix = max(0, prompt_len - 6)

    def step(self, ids: list[int], final: bool = False) -> str:
        if self.read >= len(ids):
            return ""
        before = self.tok.decode(ids[self.prefix : self.read])
        full = self.tok.decode(ids[self.prefix :])
        if full.endswith("\ufffd") and not final:
            return ""
        start = _shared_prefix_len(before, full)
        if start == len(full):
            return ""
        if start == len(before):  # `read` ends a whole character: the next window may start there
            self.prefix = self.read
        self.read = len(ids)
        return full[start:]


def _shared_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
