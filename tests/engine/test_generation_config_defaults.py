"""generation_config.json's sampling defaults in `generate` and the `LLM` API, as vLLM's
`--generation-config auto` (its default) reads them: temperature, top_p, top_k,
repetition_penalty and max_new_tokens (as max_tokens) fill what the flags / params do not
set; `--generation-config vllm` ignores them. They were ignored: a folder's
max_new_tokens or temperature changed nothing. A bad value is one line naming the file and
the key, exit code 2."""

from __future__ import annotations

import json

import pytest

from llmsched.cli import main
from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError
from llmsched.engine.loader import generation_defaults

BASE = {"bos_token_id": 0, "eos_token_id": 1}


@pytest.fixture
def model(tmp_path):
    from llmsched.engine.tiny import make_tiny_model

    return make_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def _write(model, **fields):
    (model / "generation_config.json").write_text(json.dumps({**BASE, **fields}))


def test_make_tiny_model_writes_no_sampling_defaults(model):
    assert json.loads((model / "generation_config.json").read_text()) == BASE
    assert generation_defaults(model) == {}


def test_the_keys_vllm_reads(model):
    _write(model, temperature=0.6, top_p=0.9, top_k=0, repetition_penalty=1.05, max_new_tokens=7, min_p=0, do_sample=1)
    want = {"temperature": 0.6, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.05, "max_tokens": 7}
    assert generation_defaults(model) == want
    assert generation_defaults(model, "vllm") == {}
    _write(model, temperature=None, top_k=20)  # null: not set, as vLLM reads it
    assert generation_defaults(model) == {"top_k": 20}
    with pytest.raises(ConfigError, match="generation_config must be auto or vllm, got 'hf'"):
        generation_defaults(model, "hf")


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("temperature", "hot", "temperature must be a number, got 'hot'"),
        ("temperature", "x\ny" * 50, "temperature must be a number, got 'x\\ny"),
        ("temperature", -1, "temperature must be a finite number >= 0, got -1"),
        ("top_k", 2.5, "top_k must be 0 or -1 (off) or a positive integer, got 2.5"),
        ("top_p", -0.5, "top_p must be in (0, 1], got -0.5"),
        ("top_k", -3, "top_k must be 0 or -1 (off) or a positive integer"),
        ("repetition_penalty", 0, "repetition_penalty must be > 0"),
        ("max_new_tokens", 0, "max_new_tokens must be a positive integer, got 0"),
        ("min_p", 0.05, "min_p 0.05 asks for min-p sampling, which llmsched does not support"),
        ("min_p", "low", "min_p must be a number, got 'low'"),
    ],
)
def test_bad_values_name_the_file_and_key(model, capsys, key, value, says):
    _write(model, **{key: value})
    with pytest.raises(ConfigError) as e:
        generation_defaults(model)
    assert str(e.value).startswith(f"{model / 'generation_config.json'}: {says}")
    assert main(["generate", "--model", str(model), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generation_config.json: " + key in err


def _gen(model, capsys, *flags):
    argv = ["generate", "--model", str(model), "--prompt-ids", "5,9,13", "--json", "--ignore-eos", "--threads", "1"]
    assert main([*argv, *flags]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)["token_ids"], err


def test_generate_takes_the_model_defaults(model, capsys):
    _write(model, temperature=1.5, max_new_tokens=3)
    ids, err = _gen(model, capsys, "--seed", "1")
    assert len(ids) == 3
    assert f"default sampling parameters from {model / 'generation_config.json'}: temperature=1.5, max_tokens=3" in err
    assert _gen(model, capsys, "--seed", "1", "--temperature", "1.5", "--max-tokens", "3")[0] == ids
    # flags win; vllm: generate's own defaults (32 tokens, greedy)
    assert len(_gen(model, capsys, "--max-tokens", "2")[0]) == 2
    ids, err = _gen(model, capsys, "--generation-config", "vllm")
    assert len(ids) == 32 and "default sampling parameters" not in err
    assert _gen(model, capsys, "--temperature", "0", "--max-tokens", "32")[0] == ids


def test_llm_default_params(model):
    from llmsched.engine import LLM

    _write(model, temperature=0.0, top_k=5, max_new_tokens=4)
    llm = LLM(model, max_num_seqs=2, num_threads=1)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=5, max_tokens=4)
    (out,) = llm.generate([[5, 9, 13]])  # no params: the model's defaults
    assert len(out.token_ids) <= 4
    assert (
        out.token_ids == llm.generate([[5, 9, 13]], SamplingParams(temperature=0.0, top_k=5, max_tokens=4))[0].token_ids
    )
    plain = LLM(model, max_num_seqs=2, num_threads=1, generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ConfigError, match="generation_config must be auto or vllm"):
        LLM(model, generation_config="hf")
