"""Prompt token counting for the server.

- `ByteRuleTokenizer` (the sim backend's default): a text of B UTF-8 bytes is
  `max(1, ceil(B / 4))` tokens (the usual "about 4 characters per token" rule of thumb,
  made exact). A chat request counts the contents of its messages joined by a newline
  (names, tool calls and tools are not counted). With prefix caching (`content_ids`) a
  token's id is its 4 bytes read as a little-endian number (the last group padded with
  zero bytes), so that two texts share prefix-cache blocks on the virtual GPU exactly
  where they share whole leading 4-byte groups (with the ids 0..n-1 every text of n
  tokens hit every other's blocks); without it only the count matters, and the ids are
  0..n-1, which cost nothing to make (a list of a 1 MiB text's ids took 14 ms).
- `HFTokenizer` (the sim backend's `--tokenizer`): a real tokenizer read from a folder
  holding `tokenizer.json` (the `tokenizers` package). Chat requests are rendered as on the
  engine backend (`ChatRendering`): with the folder's chat template, else as `role:
  content` lines.
Token-id prompts (the completions API accepts a list of ints) are counted as given.

Every tokenizer here has `render_chat(messages, **options)` (the text a chat request is
tokenized as, and whether special tokens are added to it; options: `add_generation_prompt`,
`continue_final_message`, `template_kwargs`, `tools`), `chat_text(messages, **options)`
(that text), `encode(text)`, `encode_chat(messages, **options)`, `decode(ids)`, and two
facts the server's limits use (see `docs/serving.md`, "Request limits"):

- `bytes_per_token` (B): the most UTF-8 bytes of text one token stands for. For the byte
  rule it is 4. For a Hugging Face tokenizer it is its longest token in decoded bytes (a
  byte-level token's characters are one byte each; added tokens count their text's UTF-8
  bytes), times 4 if it has a normalizer (which may shorten the text: NFC composes up to
  3 bytes into one); 16 if the vocabulary cannot be read. `max_model_len * B` bytes is the
  text bound, from which the default request body limit is derived.
- `text_bound_exact`: whether every text longer than the bound has more than
  `max_model_len` tokens, so that the server may refuse it without tokenizing. True for
  the byte rule, and for a byte-level BPE (GPT-2, Llama 3) without a normalizer whose
  vocabulary holds all 256 bytes, whose pre-tokenizers keep all the text and whose added
  tokens strip no whitespace: each token then covers at most B bytes of it. Otherwise (a
  normalizer, pre-tokenizers or tokens that may drop or swallow text) such a text is
  tokenized, and judged by its real count.
- `cheap`: encoding costs about as much as reading the text once, so the server may do it
  on the event loop whatever the length (otherwise long texts go to a worker thread).

`HFTokenizer.encode` and `.decode` use the `tokenizers` batch calls, which release the GIL,
so a long text tokenized in a worker thread does not hold up the event loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from ..engine.tokenizer import tokenizer_file
from .chat_template import content_text

BYTES_PER_TOKEN = 4
UNKNOWN_BYTES_PER_TOKEN = 16  # bytes_per_token of a tokenizer whose vocabulary cannot be read
# pre-tokenizers that keep every byte of the text (Split keeps it unless its behavior is "Removed")
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation"}


def chat_lines(
    messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False, **_
) -> str:
    """A chat request as the text a tokenizer without a chat template encodes: `role:
    content` lines, then `assistant:` (unless `add_generation_prompt` is false, or with
    `continue_final_message`: the last message's text is continued)."""
    text = "\n".join(f"{m['role']}: {content_text(m['content'])}" for m in messages)
    return text + "\nassistant:" if add_generation_prompt and not continue_final_message else text


def _byte_level(hf_tokenizer) -> bool:
    """Whether `hf_tokenizer` is a byte-level BPE that turns every byte of a text into tokens."""
    try:
        if hf_tokenizer.normalizer is not None or type(hf_tokenizer.model).__name__ != "BPE":
            return False
        pre = hf_tokenizer.pre_tokenizer
        state = json.loads(pre.__getstate__()) if pre is not None else {}
    except Exception:  # noqa: BLE001 - not a tokenizers.Tokenizer
        return False
    parts = state.get("pretokenizers", [state]) if state.get("type") == "Sequence" else [state]
    if not any(p.get("type") == "ByteLevel" for p in parts):
        return False
    if any(p.get("type") not in _KEEPING_PRE_TOKENIZERS or p.get("behavior") == "Removed" for p in parts):
        return False
    added = getattr(hf_tokenizer, "get_added_tokens_decoder", dict)().values()
    if any(getattr(t, "lstrip", False) or getattr(t, "rstrip", False) for t in added):
        return False  # such a token also swallows the whitespace next to it, however long
    from tokenizers import pre_tokenizers  # noqa: PLC0415 (optional dependency)

    # a byte missing from the vocabulary would be dropped (BPE without an unknown token)
    vocab = hf_tokenizer.get_vocab(with_added_tokens=False)
    return all(c in vocab for c in pre_tokenizers.ByteLevel.alphabet())


def text_bound(hf_tokenizer) -> tuple[int, bool]:
    """(`bytes_per_token`, `text_bound_exact`) of a `tokenizers.Tokenizer` (see the module
    docstring)."""
    try:
        vocab = hf_tokenizer.get_vocab(with_added_tokens=False)
        decoder = getattr(hf_tokenizer, "get_added_tokens_decoder", dict)
        added = [t.content for t in decoder().values()]
    except Exception:  # noqa: BLE001 - not a tokenizers.Tokenizer
        return UNKNOWN_BYTES_PER_TOKEN, False
    exact = _byte_level(hf_tokenizer)
    if exact:
        from tokenizers import pre_tokenizers  # noqa: PLC0415

        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        # a byte-level token's characters stand for one byte each
        longest = max((len(t) if alphabet.issuperset(t) else utf8_len(t) for t in vocab), default=1)
    else:
        longest = max((utf8_len(t) for t in vocab), default=1)
    longest = max([longest, *(utf8_len(t) for t in added)])
    if getattr(hf_tokenizer, "normalizer", None) is not None:
        longest *= 4  # a normalizer may shorten the text (NFC composes up to 3 bytes into 1)
    return max(1, longest), exact


def utf8_len(text: str) -> int:
    """The UTF-8 size of `text` (lone surrogates count 3 bytes, as they would encode)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class ChatRendering:
    """Chat requests as a real tokenizer renders them (the engine's and `--tokenizer`'s):
    with the chat template `templates` picks, the text tokenized without special tokens (the
    template writes BOS), as `apply_chat_template` does; without one, as `role: content`
    lines, tokenized with them. Needs `encode(text, add_special_tokens)`."""

    templates = None  # chat_template.ChatTemplates, or None

    def render_chat(self, messages: list[dict], **options) -> tuple[str, bool]:
        """(the text of a chat request, whether special tokens are added to it); ConfigError
        if the chat template refuses it."""
        tools = options.get("tools")
        if tools is None:
            tools = (options.get("template_kwargs") or {}).get("tools")
        template = self.templates.pick(tools) if self.templates is not None else None
        if template is None:
            return chat_lines(messages, **options), True
        return template.render(messages, **options), False

    def chat_text(self, messages: list[dict], **options) -> str:
        return self.render_chat(messages, **options)[0]

    def encode_chat(self, messages: list[dict], **options) -> list[int]:
        text, special = self.render_chat(messages, **options)
        return self.encode(text, add_special_tokens=special)


class ByteRuleTokenizer(ChatRendering):
    """The sim backend's rule without a tokenizer: 4 UTF-8 bytes a token; a chat request
    is its message contents, one a line."""

    name = "bytes/4"
    bytes_per_token = BYTES_PER_TOKEN
    text_bound_exact = True  # ceil(bytes / 4) tokens
    cheap = True

    def __init__(self, content_ids: bool = False):
        self.content_ids = content_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> Sequence[int]:
        if not self.content_ids:
            return range(max(1, math.ceil(utf8_len(text) / BYTES_PER_TOKEN)))
        data = text.encode("utf-8", "surrogatepass")
        if not data:
            return [0]  # an empty text is one token
        pad = -len(data) % BYTES_PER_TOKEN
        return np.frombuffer(data + bytes(pad), dtype="<u4").tolist()

    def render_chat(self, messages: list[dict], **_) -> tuple[str, bool]:
        return "\n".join(content_text(m["content"]) for m in messages), False

    def decode(self, ids: Sequence[int]) -> str:
        return " tok" * len(ids)


class HFTokenizer(ChatRendering):
    cheap = False

    def __init__(self, path: str | Path, tokenizer=None):
        if tokenizer is not None:
            self._tok = tokenizer
            self.name = str(path)
            self.file = Path(path)
            self.bytes_per_token, self.text_bound_exact = text_bound(tokenizer)
            return
        p = Path(path)
        f = tokenizer_file(p)
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
        self.file = f
        self.bytes_per_token, self.text_bound_exact = text_bound(self._tok)

    @property
    def vocab_size(self) -> int | None:
        """Token ids must be below it (added tokens included); None if the tokenizer does not say."""
        get = getattr(self._tok, "get_vocab_size", None)
        return get(with_added_tokens=True) if get is not None else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The text's ids; special tokens (BOS) only if asked (the sim backend counts
        completion prompts without them)."""
        tok = self._tok
        if hasattr(tok, "encode_batch"):  # releases the GIL (encode does not)
            return tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        enc = tok.encode(text, add_special_tokens=add_special_tokens) if hasattr(tok, "encode") else None
        ids = enc.ids if hasattr(enc, "ids") else list(enc)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        tok = self._tok
        if hasattr(tok, "decode_batch"):  # releases the GIL
            return tok.decode_batch([list(ids)])[0]
        return tok.decode(list(ids))
