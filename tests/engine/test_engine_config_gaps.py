"""Model folders that Hugging Face loads the engine loads too, read the same way (issue 11
item 6): rope parameters merged as transformers merges them, `num_key_value_heads: null`,
a corrupt generation_config.json, a stray adapter file."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
import torch

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 96,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

ROPE_CASES = {
    # rope_theta only at the top level: transformers puts it into rope_parameters
    "theta-top-level": {"rope_theta": 500000.0, "rope_parameters": dict(LLAMA3, original_max_position_embeddings=1024)},
    # no original_max_position_embeddings: transformers takes max_position_embeddings
    "no-original-max": {"rope_parameters": dict(LLAMA3, rope_theta=500000.0)},
    "both-missing": {"rope_theta": 250000.0, "rope_parameters": dict(LLAMA3)},
    # rope_parameters' own theta wins over the top-level one
    "theta-in-params-wins": {"rope_theta": 1000.0, "rope_parameters": dict(LLAMA3, rope_theta=500000.0)},
    # the legacy rope_scaling dict wins over rope_parameters
    "legacy-scaling-wins": {
        "rope_theta": 5000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "rope_parameters": dict(LLAMA3, rope_theta=500000.0),
    },
    "linear-default-theta": {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
    "plain": {"rope_theta": 20000.0},
}


def _hf_inv_freq(cfg: dict, tmp_path):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    return LlamaRotaryEmbedding(config=hf_cfg).inv_freq.float()


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_parameters_merge_like_transformers(case, tmp_path):
    from llmsched.engine.loader import parse_config, rope_inv_freq

    cfg = dict(BASE, **ROPE_CASES[case])
    ours = rope_inv_freq(parse_config(json.loads(json.dumps(cfg))))
    ref = _hf_inv_freq(cfg, tmp_path)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    if "llama3" in json.dumps(cfg) and "legacy" not in case:
        plain = rope_inv_freq(parse_config(dict(BASE, rope_theta=parse_config(cfg).rope_theta)))
        assert not torch.allclose(ours, plain)  # the scaling was applied, not dropped


def test_llama3_original_max_defaults_to_max_position_embeddings():
    from llmsched.engine.loader import parse_config

    cfg = parse_config(dict(BASE, rope_theta=500000.0, rope_parameters=dict(LLAMA3), max_position_embeddings=2048))
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.rope_scaling["original_max_position_embeddings"] == 2048
    with pytest.raises(ConfigError, match="rope_parameters must be a JSON object"):
        parse_config(dict(BASE, rope_parameters=[1, 2]))
    with pytest.raises(ConfigError, match="rope_theta must be a positive finite number"):
        parse_config(dict(BASE, rope_theta=-1.0))


@pytest.fixture(scope="module")
def mha_model(tmp_path_factory):
    """A make-tiny-model folder with as many KV heads as attention heads."""
    from llmsched.engine.tiny import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("mha") / "model",
        num_layers=1,
        hidden_size=32,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=64,
        std=0.15,
    )


def _generate(folder, prompts=([1, 5, 9, 11], [3, 4])):
    from llmsched.engine import LLM

    llm = LLM(folder, max_model_len=64, max_num_seqs=2, b_max=32)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(list(prompts), sp)]


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_bias_keys_are_read_for_llama_only_as_transformers_reads_them(tmp_path, arch):
    # transformers builds Qwen2 (q/k/v biases) and Mistral (none) whatever attention_bias and
    # mlp_bias say, and saves the keys: such a checkpoint was refused as lacking biases
    import transformers
    from engine_helpers import hf_greedy

    cls = {"qwen2": transformers.Qwen2ForCausalLM, "mistral": transformers.MistralForCausalLM}[arch]
    hf_cfg = cls.config_class(
        **{k: v for k, v in BASE.items() if k not in ("architectures", "model_type")},
        attention_bias=True,
        mlp_bias=True,
    )
    torch.manual_seed(0)
    model = cls(hf_cfg).eval()
    model.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["mlp_bias"] is True
    prompts = ([1, 5, 9, 11], [3, 4])
    assert _generate(tmp_path, prompts) == [hf_greedy(model, p, 6) for p in prompts]


def test_null_kv_heads_means_one_per_attention_head(tmp_path, mha_model):
    from llmsched.engine.loader import read_config

    folder = shutil.copytree(mha_model, tmp_path / "null-kv")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_key_value_heads"] = None
    (folder / "config.json").write_text(json.dumps(cfg))
    assert read_config(folder).num_kv_heads == cfg["num_attention_heads"]
    assert _generate(folder) == _generate(mha_model)


def test_corrupt_generation_config_warns_and_loads(tmp_path, mha_model, caplog):
    from llmsched.engine.loader import read_config

    folder = shutil.copytree(mha_model, tmp_path / "bad-gen")
    (folder / "generation_config.json").write_text('{"eos_token_id": [2, ')
    with caplog.at_level(logging.WARNING, logger="llmsched.engine.loader"):
        cfg = read_config(folder)
    assert "generation config" in caplog.text and "not valid JSON" in caplog.text
    assert cfg.eos_token_ids == read_config(mha_model).eos_token_ids  # from config.json
    assert _generate(folder) == _generate(mha_model)


def test_stray_adapter_file_is_ignored(tmp_path, mha_model):
    from safetensors.torch import save_file

    folder = shutil.copytree(mha_model, tmp_path / "adapter")
    save_file(
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)},
        str(folder / "adapter_model.safetensors"),
    )
    assert _generate(folder) == _generate(mha_model)
    # without model.safetensors (other weight file names), adapters are still skipped
    (folder / "model.safetensors").rename(folder / "weights.safetensors")
    assert _generate(folder) == _generate(mha_model)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vocab_size": 10}, "vocab_size must be an integer from 258"),
        ({"vocab_size": 10**8}, "vocab_size must be an integer from 258"),
        ({"vocab_size": True}, "vocab_size must be an integer from 258"),
        ({"seed": True}, "seed must be an integer from 0 to 2**64 - 1, got True"),
        ({"seed": -1}, "seed must be an integer from 0 to 2**64 - 1, got -1"),
        ({"seed": 2**64}, "seed must be an integer from 0 to 2**64 - 1, got 18446744073709551616"),  # was a ValueError
        ({"num_layers": True}, "num_layers must be a positive integer, got True"),
    ],
)
def test_make_tiny_model_refuses_what_it_would_change(tmp_path, kwargs, message):
    # the tokenizer's trainer would give another vocabulary than asked, silently; a bool is
    # not a count
    from llmsched.engine.tiny import make_tiny_model

    with pytest.raises(ConfigError, match=re.escape(message)):
        make_tiny_model(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_engine_binds_a_given_cost_model_to_every_scheduler(tiny_model):
    """The engine never bound a cost model: adaptive always planned with `paper`."""
    from llmsched.core.cost import LinearCostModel
    from llmsched.engine import LLM, LLMEngine

    with pytest.raises(ConfigError):
        LLMEngine(tiny_model, cost_model="nosuch:1")
    eng = LLMEngine(tiny_model, scheduler="adaptive", b_max=64, k_max=4, max_num_seqs=4, cost_model="linear:c=2,a=0.5")
    assert isinstance(eng.scheduler.batch.cost, LinearCostModel)
    eng.set_scheduler("sarathi")
    eng.set_scheduler("adaptive", k_max=4)  # a new scheduler: bound again
    assert eng.scheduler.batch.cost is eng.cost_model
    llm = LLM(tiny_model, scheduler="adaptive", b_max=64, max_num_seqs=4, cost_model="const:3")
    assert llm.engine.scheduler.batch.cost is llm.engine.cost_model
    assert len(llm.generate([[5, 6, 7]])[0].token_ids) > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_blocks": 2.5}, "num_blocks must be a positive integer, got 2.5"),  # was torch's TypeError
        ({"num_blocks": True}, "num_blocks must be a positive integer, got True"),  # was "holds True blocks"
        ({"num_blocks": 0}, "num_blocks must be a positive integer, got 0"),
        ({"seed": 2**70}, "seed (--seed) must be an integer"),  # was torch's ValueError Overflow
        ({"seed": 1.5}, "seed (--seed) must be an integer"),
        ({"kv_cache_gb": "1"}, "kv_cache_gb must be a positive finite number, got '1'"),  # was a TypeError
        ({"gpu_memory_utilization": "x"}, "gpu_memory_utilization must be in"),
        # was "takes 0.0 MiB, more than the 0.0 MiB"
        ({"kv_cache_gb": 1e-9}, "takes 8,192 bytes, more than the 1 byte the KV cache has"),
        # torch dtypes were taken as given: float64 ran (its name is refused), int8, complex64
        # and float8 failed with torch's own errors
        ({"dtype": torch.float64}, "unsupported dtype torch.float64 (use float32, bfloat16 or float16)"),
        ({"dtype": torch.int8}, "unsupported dtype torch.int8"),
        ({"dtype": torch.complex64}, "unsupported dtype torch.complex64"),
        ({"dtype": torch.float8_e4m3fn}, "unsupported dtype torch.float8_e4m3fn"),
        ({"dtype": 5}, "unknown dtype 5"),
        ({"tokenizer": 123}, "tokenizer must be a tokenizer.json file or a folder holding one, got 123"),
        ({"max_model_len": -2}, "max_model_len must be a positive integer or 'auto' (-1), got -2"),
        ({"max_model_len": "Auto"}, "max_model_len must be a positive integer or 'auto' (-1), got 'Auto'"),
    ],
)
def test_python_api_refuses_bad_engine_options_in_one_line(tiny_model, kwargs, message):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError) as e:
        LLM(tiny_model, max_num_seqs=2, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


MISTRAL = dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", num_hidden_layers=3)
QWEN2 = dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=3)
ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.parametrize(
    "cfg, windows",
    [
        # transformers' LlamaForCausalLM ignores sliding_window (and layer_types)
        (dict(BASE, num_hidden_layers=3, sliding_window=8), [None] * 3),
        (dict(BASE, num_hidden_layers=3, sliding_window=8, layer_types=["sliding_attention"] * 3), [None] * 3),
        (dict(BASE, num_hidden_layers=3, sliding_window="x"), [None] * 3),  # not read
        (dict(MISTRAL, sliding_window=8), [8] * 3),
        (dict(MISTRAL, sliding_window=None), [None] * 3),
        (dict(MISTRAL), [4096] * 3),  # transformers' default when the key is missing
        (dict(QWEN2, use_sliding_window=True, max_window_layers=1), [None, 4096, 4096]),
        # Qwen2 carries a sliding_window it does not use unless use_sliding_window
        (dict(QWEN2, sliding_window=4096, use_sliding_window=False), [None] * 3),
        (dict(QWEN2, sliding_window=-1, use_sliding_window=False), [None] * 3),
        (dict(QWEN2, sliding_window=8, use_sliding_window=True, max_window_layers=1), [None, 8, 8]),
        (dict(QWEN2, sliding_window=8, use_sliding_window=True), [None] * 3),  # max_window_layers 28
        (dict(QWEN2, sliding_window=None, use_sliding_window=True), [None] * 3),
        # a per-layer list wins over the architecture's rule
        (dict(QWEN2, sliding_window=8, use_sliding_window=True, layer_types=ALTERNATING), [8, None, 8]),
        (dict(MISTRAL, sliding_window=8, layer_types=ALTERNATING), [8, None, 8]),
        (dict(QWEN2, use_sliding_window=True, layer_types=["full_attention"] * 3), [None] * 3),
    ],
)
def test_sliding_windows_are_read_as_transformers_reads_them(cfg, windows):
    from llmsched.engine.loader import parse_config

    assert parse_config(cfg).sliding_windows == windows


def test_a_missing_max_position_embeddings_is_the_architectures_transformers_default():
    # it was Llama's 2048 for all three: a Qwen2 config without the key refused a
    # --max-model-len of 4096 that transformers and vLLM take (their default is 32768)
    import transformers

    from llmsched.engine.loader import parse_config

    for cfg, hf in (
        (BASE, transformers.LlamaConfig),
        (QWEN2, transformers.Qwen2Config),
        (MISTRAL, transformers.MistralConfig),
    ):
        cfg = {k: v for k, v in cfg.items() if k != "max_position_embeddings"}
        assert parse_config(cfg).max_len == hf().max_position_embeddings, cfg["model_type"]


def test_a_quantized_checkpoint_is_refused_for_what_it_is():
    # its qweight / weight_scale tensors were refused one by one as "unexpected weight"
    from llmsched.engine.loader import parse_config

    for quant, method in (({"quant_method": "gptq", "bits": 4}, "'gptq'"), ("fp8", "None")):
        with pytest.raises(ConfigError, match=f"quantized checkpoints are not supported .*quant_method {method}"):
            parse_config(dict(BASE, quantization_config=quant))


def test_hidden_act_swish_is_silu_as_in_transformers():
    # transformers' ACT2FN maps "swish" to SiLU; it was refused as unsupported
    from transformers.activations import ACT2FN

    from llmsched.engine.loader import parse_config

    assert isinstance(ACT2FN["swish"], torch.nn.SiLU)
    assert parse_config(dict(BASE, hidden_act="swish")).arch == "llama"
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not supported"):
        parse_config(dict(BASE, hidden_act="gelu"))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"eos_token_id": "1"}, "eos_token_id must be a token id or a list of token ids, got '1'"),
        ({"eos_token_id": [1, "a"]}, "eos_token_id must be"),
        ({"eos_token_id": 1.0}, "eos_token_id must be"),
        ({"eos_token_id": True}, "eos_token_id must be"),
        ({"rope_theta": float("inf")}, "rope_theta must be a positive finite number, got inf"),
        ({"rope_scaling": {"type": "linear", "factor": float("inf")}}, "positive finite 'factor'"),
        (dict(MISTRAL, sliding_window="x"), "sliding_window must be a positive integer or null, got 'x'"),
        (dict(MISTRAL, sliding_window=-3), "sliding_window must be a positive integer or null, got -3"),
        (dict(MISTRAL, sliding_window=0), "sliding_window must be a positive integer or null, got 0"),
        (dict(MISTRAL, sliding_window=True), "sliding_window must be a positive integer or null, got True"),
        (dict(QWEN2, sliding_window=0, use_sliding_window=True), "sliding_window must be a positive integer"),
        (dict(QWEN2, sliding_window=8, use_sliding_window="yes"), "use_sliding_window must be true or false"),
        (dict(QWEN2, sliding_window=8, use_sliding_window=True, max_window_layers="1"), "max_window_layers"),
        # a malformed layer_types was ignored: every layer windowed by the default rule
        (dict(QWEN2, use_sliding_window=True, layer_types="sliding_attention"), "layer_types must be a list, got str"),
        (dict(QWEN2, use_sliding_window=True, layer_types=ALTERNATING[:2]), "layer_types lists 2 layers, num_hidden"),
        (
            dict(QWEN2, use_sliding_window=True, layer_types=["sliding", *ALTERNATING[1:]]),
            "layer_types holds 'sliding'",
        ),
    ],
)
def test_malformed_config_fields_are_refused_naming_them(changes, message):
    # they were silently ignored: a bad eos_token_id became no EOS at all (never stopping),
    # a bad sliding_window full attention (True: a window of 1), rope_theta Infinity taken
    from llmsched.engine.loader import parse_config

    with pytest.raises(ConfigError, match=message) as e:
        parse_config(dict(BASE, **changes))
    assert "\n" not in str(e.value)
    # null or absent: no EOS id, as before
    assert parse_config(dict(BASE, eos_token_id=None)).eos_token_ids == []
    assert parse_config(dict(BASE, eos_token_id=[1, 2])).eos_token_ids == [1, 2]


def test_generation_config_eos_ids_are_checked_too(tmp_path, mha_model):
    from llmsched.engine.loader import read_config

    folder = tmp_path / "m"
    shutil.copytree(mha_model, folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": [1, 2, "x"]}')
    with pytest.raises(ConfigError, match="generation_config.json: eos_token_id must be"):
        read_config(folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": [1, 2]}')
    assert read_config(folder).eos_token_ids == [1, 2]


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_an_eos_id_outside_the_vocabulary_is_left_out_with_a_warning(tmp_path, mha_model, caplog, name):
    """It refused the load; transformers and vLLM load such a model (the id is never drawn)."""
    from llmsched.engine.loader import read_config

    folder = tmp_path / "m"
    shutil.copytree(mha_model, folder)
    vocab = read_config(folder).vocab_size
    (folder / "generation_config.json").unlink(missing_ok=True)  # its EOS ids would replace config.json's
    data = json.loads((folder / name).read_text()) if (folder / name).is_file() else {}
    (folder / name).write_text(json.dumps({**data, "eos_token_id": [1, vocab, -4, 2]}))
    with caplog.at_level(logging.WARNING, logger="llmsched.engine.loader"):
        assert read_config(folder).eos_token_ids == [1, 2]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("\n" not in m and f"{name}: eos_token_id" in m for m in said), said
    assert f"eos_token_id {vocab} is outside the vocabulary (0..{vocab - 1}" in said[0], said
    assert "eos_token_id -4 is outside" in said[1], said


@pytest.mark.parametrize("model", [123, None, ["m"], b"m"])
def test_a_model_that_is_not_a_path_is_a_config_error(model):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match="model must be a model folder path, got"):
        LLM(model)  # was a TypeError from pathlib


def test_supported_torch_dtypes_are_taken(tiny_model):
    from llmsched.engine.runner import resolve_dtype

    cpu = torch.device("cpu")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        assert resolve_dtype(dt, cpu) is dt
    assert resolve_dtype("bf16", cpu) is torch.bfloat16 and resolve_dtype(None, cpu) is torch.float32


@pytest.mark.parametrize(
    "scaling",
    [
        dict(LLAMA3, factor=0),
        dict(LLAMA3, factor=-8.0),
        dict(LLAMA3, low_freq_factor=float("nan")),
        dict(LLAMA3, high_freq_factor=True),
        dict(LLAMA3, original_max_position_embeddings=0),
        {"rope_type": "linear", "factor": True},
    ],
)
def test_rope_scaling_factors_must_be_positive_finite(scaling):
    """A llama3 factor of 0 made every rotary frequency infinite: NaN logits, and every
    generated token id 0, silently."""
    from llmsched.engine.loader import parse_config

    with pytest.raises(ConfigError, match=r"config\.json: (llama3|linear) rope scaling needs a positive finite"):
        parse_config(json.loads(json.dumps(dict(BASE, rope_theta=500000.0, rope_parameters=scaling))))
