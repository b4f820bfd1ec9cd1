"""generation_config.json's sampling defaults in `generate` and the `LLM` API, as vLLM's
`--generation-config auto` (its default) reads them: temperature, top_p, top_k,
repetition_penalty and max_new_tokens (as max_tokens) fill what the flags / params do not
set; `--generation-config vllm` ignores them. They were ignored: a folder's
max_new_tokens or temperature changed nothing. A bad value is one line naming the file and
the key, exit code 2."""

from __future__ import annotations

import json
import logging

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
    with pytest.raises(ConfigError, match="generation config folder 'hf' does not exist"):
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
    with pytest.raises(ConfigError, match="generation config folder 'hf' does not exist"):
        LLM(model, generation_config="hf")


# ---- --generation-config PATH and --override-generation-config (vLLM's; they were refused:
# `--generation-config` took only auto or vllm, and there was no override) ----
def _folder(tmp_path, **fields):
    folder = tmp_path / "gen"
    folder.mkdir(exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(fields))
    return folder


def test_generation_config_path(model, tmp_path):
    _write(model, temperature=0.2, top_k=5)
    folder = _folder(tmp_path, temperature=1.5, max_new_tokens=3)
    # that folder's file instead of the model's (the model's top_k is not merged in)
    assert generation_defaults(model, str(folder)) == {"temperature": 1.5, "max_tokens": 3}
    assert generation_defaults(model, folder / "generation_config.json") == {"temperature": 1.5, "max_tokens": 3}
    with pytest.raises(ConfigError, match=f"generation config folder '{tmp_path / 'nope'}' does not exist"):
        generation_defaults(model, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=f"generation config folder {tmp_path} has no generation_config.json"):
        generation_defaults(model, tmp_path)
    # a file asked for by name that is not JSON is an error, not silently no defaults
    (folder / "generation_config.json").write_text("{bad")
    with pytest.raises(ConfigError, match="generation_config.json is not valid JSON"):
        generation_defaults(model, folder)


def test_override_generation_config(model):
    _write(model, temperature=0.2, top_k=5)
    # merged over the file's; a null removes the file's value; with vllm only the override
    assert generation_defaults(model, override={"temperature": 0.5, "max_new_tokens": 4}) == {
        "temperature": 0.5,
        "top_k": 5,
        "max_tokens": 4,
    }
    assert generation_defaults(model, override={"top_k": None}) == {"temperature": 0.2}
    assert generation_defaults(model, "vllm", {"top_p": 0.9}) == {"top_p": 0.9}
    with pytest.raises(ConfigError, match="unknown override_generation_config key 'max_tokens'; did you mean"):
        generation_defaults(model, override={"max_tokens": 4})
    with pytest.raises(ConfigError, match="override_generation_config: top_p must be in"):
        generation_defaults(model, override={"top_p": 2})
    with pytest.raises(ConfigError, match="override_generation_config must be a JSON object"):
        generation_defaults(model, override=[("temperature", 1)])


def test_generate_takes_a_path_and_an_override(model, tmp_path, capsys):
    folder = _folder(tmp_path, temperature=1.5, max_new_tokens=3)
    ids, err = _gen(model, capsys, "--generation-config", str(folder), "--seed", "1")
    assert len(ids) == 3
    assert f"from {folder / 'generation_config.json'}: temperature=1.5, max_tokens=3" in err
    assert _gen(model, capsys, "--seed", "1", "--temperature", "1.5", "--max-tokens", "3")[0] == ids
    over = ["--override-generation-config", '{"max_new_tokens": 5, "temperature": 0}']
    ids, err = _gen(model, capsys, "--generation-config", str(folder), *over)
    assert len(ids) == 5 and "and --override-generation-config: temperature=0, max_tokens=5" in err
    assert _gen(model, capsys, "--temperature", "0", "--max-tokens", "5")[0] == ids
    # the override alone: no file to ignore, so no hint at --generation-config vllm
    err = _gen(model, capsys, "--override-generation-config", '{"max_new_tokens": 2}')[1]
    assert "from --override-generation-config: max_tokens=2 (the flags given override them)\n" in err


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--generation-config", "/no/such/dir"], "generation config folder '/no/such/dir' does not exist"),
        (["--generation-config", ""], "generation config folder '' does not exist"),
        (["--override-generation-config", '{"temperature": 0.5'], "--override-generation-config: expected a JSON"),
        (["--override-generation-config", "[1]"], "--override-generation-config: expected a JSON object such as"),
        (["--override-generation-config", '{"temprature": 1}'], "unknown --override-generation-config key"),
        (["--override-generation-config", '{"temperature": "hot"}'], "temperature must be a number, got 'hot'"),
    ],
)
def test_generate_refuses_bad_ones(model, capsys, flags, says):
    try:
        rc = main(["generate", "--model", str(model), "--prompt", "x", *flags])
    except SystemExit as e:  # argparse's one-line error (the flag's type)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_llm_path_and_override(model, tmp_path):
    from llmsched.engine import LLM

    folder = _folder(tmp_path, top_k=7)
    llm = LLM(model, max_num_seqs=2, num_threads=1, generation_config=folder, override_generation_config={"top_p": 0.5})
    assert llm.get_default_sampling_params() == SamplingParams(top_k=7, top_p=0.5)


def test_a_path_files_other_eos_ids_stop_generation(model, tmp_path, capsys):
    """As vLLM, a --generation-config PATH file's eos_token_id ids other than the model's
    are stop token ids of every request (unless ignore_eos); they were only warned about."""
    from llmsched.engine import LLM

    def run(*flags):  # greedy, 8 tokens, stopping at EOS
        argv = ["generate", "--model", str(model), "--prompt-ids", "5,9,13", "--json", "--threads", "1"]
        assert main([*argv, "--temperature", "0", "--max-tokens", "8", *flags]) == 0
        out, err = capsys.readouterr()
        return json.loads(out)["token_ids"], err

    greedy = run()[0]
    assert len(greedy) > 1, greedy
    stop = greedy[1]  # a token the run emits, past its first
    cut = greedy.index(stop)
    folder = _folder(tmp_path, eos_token_id=[1, stop])
    ids, err = run("--generation-config", str(folder))
    assert ids == greedy[: cut + 1] and "is not used" not in err
    assert run("--generation-config", str(folder), "--ignore-eos")[0] == run("--ignore-eos")[0]
    llm = LLM(model, max_num_seqs=2, num_threads=1, generation_config=folder)
    (c,) = llm.generate([[5, 9, 13]], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[99]))
    assert (c.token_ids, c.finish_reason, c.stop_reason) == (greedy[: cut + 1], "stop", stop)  # vLLM's stop_reason
    (c,) = llm.generate([[5, 9, 13]], SamplingParams(max_tokens=8, temperature=0, min_tokens=cut + 1))
    assert c.token_ids[cut] != stop  # nor drawn among min_tokens (vLLM's _all_stop_token_ids)
    (c,) = llm.generate([[5, 9, 13]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert c.token_ids[: cut + 1] == greedy[: cut + 1]


def test_a_path_files_eos_id_outside_the_vocabulary_is_left_out_with_a_warning(model, tmp_path, capsys, caplog):
    # it refused the start; vLLM takes it, and it never stops anything (never drawn)
    from llmsched.engine.loader import generation_stop_ids

    folder = _folder(tmp_path, eos_token_id=[1, 99999, 7])
    argv = ["generate", "--model", str(model), "--prompt-ids", "5", "--max-tokens", "2", "--json"]
    assert main([*argv, "--generation-config", str(folder)]) == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llmsched.engine.loader"):
        assert generation_stop_ids(model, str(folder)) == [7]
    (said,) = [r.getMessage() for r in caplog.records]
    assert "generation_config.json: eos_token_id 99999 is outside the vocabulary (0..511, vocab_size 512)" in said


def test_an_override_min_p_says_how_to_fix_it(model):
    # it pointed at --generation-config vllm, which does not drop the override's own values
    with pytest.raises(ConfigError, match=r"override_generation_config: min_p 0.1 .* \(leave it out, or give 0\)$"):
        generation_defaults(model, override={"min_p": 0.1})
