"""The incremental detokenizer against decoding the whole sequence at once, on the tiny
byte-level BPE tokenizer (random byte tokens make partial and invalid UTF-8 often)."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from llmsched.engine.tiny import train_tokenizer
from llmsched.engine.tokenizer import Detokenizer, Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(train_tokenizer(300))


def expected_text(tok, prompt, out):
    """decode(prompt + output) past what it shares with decode(prompt)."""
    whole, head = tok.decode(prompt + out), tok.decode(prompt)
    shared = next((i for i, (a, b) in enumerate(zip(whole, head)) if a != b), min(len(whole), len(head)))
    return whole[shared:]


def streamed(tok, prompt, out, chunks):
    """The deltas of a Detokenizer fed `out` in pieces of the given sizes; the last is final."""
    detok = Detokenizer(tok, len(prompt))
    ids, deltas, i = list(prompt), [], 0
    for size in chunks:
        ids += out[i : i + size]
        i += size
        deltas.append(detok.step(ids, final=i >= len(out)))
    return deltas


def test_a_character_the_prompt_begins_is_returned_once_the_output_completes_it(tok):
    ids = tok.encode("a\U0001f600", add_special_tokens=False)
    assert len(ids) >= 2 and "\ufffd" in tok.decode(ids[:-1])  # the emoji spans tokens
    prompt, out = ids[:-1], ids[-1:] + tok.encode("b", add_special_tokens=False)
    assert streamed(tok, prompt, out, [1] * len(out)) == ["\U0001f600", "b"]
    assert expected_text(tok, prompt, out) == "\U0001f600b"


def test_an_unfinished_prompt_character_the_output_never_completes_is_not_repeated(tok):
    ids = tok.encode("a\U0001f600", add_special_tokens=False)
    prompt, out = ids[:-1], tok.encode("bc", add_special_tokens=False)
    assert "".join(streamed(tok, prompt, out, [1] * len(out))) == "bc"
    assert streamed(tok, prompt, [tok.token_id("</s>")], [1]) == [""]  # only a special token


@pytest.mark.parametrize("seed", range(4))
def test_streamed_text_is_the_whole_decode_past_the_prompt(tok, seed):
    rng = random.Random(seed)
    # single-byte tokens (half of them bytes >= 0x80) and the specials, plus a few merges
    vocab = list(range(2, 258)) + [0, 1] + rng.sample(range(258, 300), 8)
    cases = 0
    for _ in range(300):
        prompt = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
        out = [rng.choice(vocab) for _ in range(rng.randint(1, 10))]
        want = expected_text(tok, prompt, out)
        one_by_one = streamed(tok, prompt, out, [1] * len(out))
        chunks = []
        while sum(chunks) < len(out):
            chunks.append(rng.randint(1, 3))
        assert "".join(one_by_one) == want, (prompt, out)
        assert "".join(streamed(tok, prompt, out, chunks)) == want, (prompt, out, chunks)
        cases += tok.decode(prompt).endswith("\ufffd")
    assert cases > 30  # the prompts end inside a character often


def test_byte_fallback_windows_start_on_whole_characters():
    """A byte-fallback decoder (Llama-2 style) turns a run of byte tokens into U+FFFDs unless
    the whole run is valid UTF-8: a window starting inside the emoji would garble the next
    character."""
    vocab = {"<unk>": 0, "a": 1, "b": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    raw = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    raw.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok = Tokenizer(raw)
    ids = tok.encode("a\U0001f600\u00e9b")  # a, the emoji's 4 bytes, é's 2 bytes, b
    prompt, out = ids[:3], ids[3:]
    assert streamed(tok, prompt, out, [1] * len(out)) == ["", "\U0001f600", "", "\u00e9", "b"]
    assert expected_text(tok, prompt, out) == "\U0001f600\u00e9b"


def test_a_path_names_its_tokenizer_json_one_way_for_engine_and_server(tmp_path):
    from llmsched.engine.tokenizer import tokenizer_file  # noqa: PLC0415
    from llmsched.server.tokenizer import HFTokenizer as ServerTokenizer  # noqa: PLC0415

    assert tokenizer_file(tmp_path) == tmp_path / "tokenizer.json"  # a folder: its file, there or not
    assert tokenizer_file(tmp_path / "none") == tmp_path / "none" / "tokenizer.json"
    train_tokenizer(300).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "other.json").write_bytes((tmp_path / "tokenizer.json").read_bytes())
    assert tokenizer_file(tmp_path / "other.json") == tmp_path / "other.json"  # a file: itself
    for given, used in ((tmp_path, "tokenizer.json"), (tmp_path / "other.json", "other.json")):
        assert ServerTokenizer(given).file == tmp_path / used
        assert Tokenizer.from_dir(given).encode("hello", False) == list(ServerTokenizer(given).encode("hello"))
