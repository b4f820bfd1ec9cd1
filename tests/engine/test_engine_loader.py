"""Model folders: make-tiny-model output, sharded checkpoints, clear loading errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError


def test_tiny_model_loads_and_matches_hf(tiny_model):
    import torch
    import transformers

    from llmsched.engine import LLM

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_model / name).is_file()
    llm = LLM(tiny_model, b_max=16, max_model_len=512, max_num_seqs=4)
    ids = llm.tokenizer.encode("Hello world")
    assert ids[0] == llm.engine.config.bos_token_id
    assert llm.tokenizer.decode(ids) == "Hello world"
    out = llm.generate("Hello world", SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([ids])  # BOS is id 0: give the mask, or generate takes it for padding
        ref = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=10,
            min_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert out.token_ids == ref[0, len(ids) :].tolist()
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    assert tok("Hello world")["input_ids"] == ids


def test_sharded_checkpoint_loads(tmp_path, hf_models):
    path, prompts, ref = hf_models["llama"]
    from engine_helpers import MAX_TOKENS, build_hf_model

    sharded = tmp_path / "sharded"
    model = build_hf_model("llama", tmp_path / "unused")
    model.save_pretrained(str(sharded), safe_serialization=True, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    from llmsched.engine import LLM

    outs = LLM(sharded, b_max=32).generate(
        prompts, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    )
    assert [o.token_ids for o in outs] == ref


@pytest.mark.parametrize(
    "weight_map, message",
    [
        ({"w": "model-00002.safetensors"}, "names shard 'model-00002.safetensors', which is not in"),
        # a null or a number was a TypeError traceback; mixed with a name too
        ({"w": None}, "weight_map gives weight 'w' the shard None, not a file name"),
        ({"w": "model-00001-of-00001.safetensors", "v": 3}, "weight_map gives weight 'v' the shard 3, not a file name"),
        ({"w": ""}, "weight_map gives weight 'w' the shard '', not a file name"),
    ],
)
def test_a_bad_shard_index_is_one_line_naming_it(tmp_path, tiny_model, weight_map, message):
    from llmsched.engine.loader import check_weights, read_config

    folder = _copy(tiny_model, tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        check_weights(read_config(folder), folder)
    assert "model.safetensors.index.json" in str(e.value) and "\n" not in str(e.value)


def test_model_safetensors_wins_over_a_stale_index_as_in_transformers(tmp_path, tiny_model):
    """transformers reads model.safetensors before model.safetensors.index.json: a merged
    checkpoint beside the index of its old shards loads; it was refused as missing them."""
    import transformers

    from llmsched.engine.loader import weight_files

    folder = _copy(tiny_model, tmp_path / "m")
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    assert weight_files(folder) == [folder / "model.safetensors"]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_loading_errors_are_clear(tmp_path, tiny_model):
    from llmsched.engine import LLM
    from llmsched.engine.loader import read_config

    with pytest.raises(ConfigError, match="does not exist"):
        LLM(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        LLM(tmp_path / "empty")
    bad = _copy(tiny_model, tmp_path / "bad-json")
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_config(bad)
    arch = _copy(tiny_model, tmp_path / "arch")
    _edit_config(arch, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ConfigError, match="unsupported architecture GPT2LMHeadModel"):
        read_config(arch)
    heads = _copy(tiny_model, tmp_path / "heads")
    _edit_config(heads, num_key_value_heads=3)
    with pytest.raises(ConfigError, match="multiple of"):
        read_config(heads)
    rope = _copy(tiny_model, tmp_path / "rope")
    _edit_config(rope, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="yarn"):
        read_config(rope)
    noweights = _copy(tiny_model, tmp_path / "noweights")
    (noweights / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        LLM(noweights)
    shape = _copy(tiny_model, tmp_path / "shape")
    _edit_config(shape, intermediate_size=200)
    with pytest.raises(ConfigError, match="shape"):
        LLM(shape)
    fewer = _copy(tiny_model, tmp_path / "fewer")
    _edit_config(fewer, num_hidden_layers=1)
    with pytest.raises(ConfigError, match="unexpected weight 'model.layers.1"):
        LLM(fewer)
    more = _copy(tiny_model, tmp_path / "more")
    _edit_config(more, num_hidden_layers=1 + json.loads((tiny_model / "config.json").read_text())["num_hidden_layers"])
    with pytest.raises(ConfigError, match="lacks weight 'model.layers.2"):
        LLM(more)
    garbage = _copy(tiny_model, tmp_path / "garbage")
    (garbage / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ConfigError, match="cannot read weights"):
        LLM(garbage)


def test_text_prompts_need_a_tokenizer(tmp_path, tiny_model):
    from llmsched.engine import LLM

    folder = _copy(tiny_model, tmp_path / "notok")
    (folder / "tokenizer.json").unlink()
    llm = LLM(folder, max_model_len=256, max_num_seqs=2)
    with pytest.raises(ConfigError, match="tokenizer"):
        llm.generate("hello")
    out = llm.generate([[1, 5, 7]], SamplingParams(max_tokens=3, temperature=0))[0]
    assert len(out.token_ids) <= 3 and out.text == ""
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        llm.generate([[1, 10**6]])
    with pytest.raises(ConfigError, match="prompt is empty"):
        llm.generate([[]])


def test_tied_config_with_a_different_lm_head_uses_it_as_transformers_does(tmp_path, tiny_model, caplog):
    """tie_word_embeddings true and a checkpoint lm_head.weight that differs from the
    embedding: the engine skipped the head silently and used the embedding, while
    transformers keeps the two untied and uses lm_head."""
    import torch
    import transformers
    from engine_helpers import hf_greedy
    from safetensors.torch import load_file, save_file

    from llmsched.engine import LLM

    def tied_copy(name, same):
        d = tmp_path / name
        shutil.copytree(tiny_model, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
        w = load_file(d / "model.safetensors")
        if same:
            w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
        assert not torch.equal(w["lm_head.weight"], w["model.embed_tokens.weight"]) or same
        save_file(w, d / "model.safetensors")
        return d

    p = [0, 5, 17, 200, 33]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    d = tied_copy("untied", same=False)
    ref = hf_greedy(transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval(), p, 8)
    with caplog.at_level("WARNING"):
        llm = LLM(d, b_max=16, max_model_len=512, max_num_seqs=2)
    assert "lm_head.weight differs from the embedding" in caplog.text
    assert llm.engine.runner.model.lm_head is not None
    assert llm.generate([p], greedy)[0].token_ids == ref
    # equal to the embedding: stays tied (one weight)
    llm = LLM(tied_copy("tied", same=True), b_max=16, max_model_len=512, max_num_seqs=2)
    assert llm.engine.runner.model.lm_head is None


@pytest.mark.parametrize("dtype", ["int8", "int32", "bool", "float8_e4m3fn"])
def test_a_weight_that_is_no_float_is_refused_naming_it(tmp_path, tiny_model, dtype):
    """An integer (quantized) or fp8 weight of the right shape was cast to the model's
    dtype and served as garbage, silently; float16 / bfloat16 ones load."""
    import torch
    from safetensors.torch import load_file, save_file

    from llmsched.engine.loader import check_weights, read_config

    d = _copy(tiny_model, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    w["model.norm.weight"] = w["model.norm.weight"].to(getattr(torch, dtype))
    save_file(w, d / "model.safetensors")
    with pytest.raises(ConfigError, match=r"model.safetensors: weight 'model.norm.weight' is of dtype \w+, not a"):
        check_weights(read_config(d), d)
    for half in (torch.float16, torch.bfloat16):
        w["model.norm.weight"] = w["model.norm.weight"].to(half)
        save_file(w, d / "model.safetensors")
        check_weights(read_config(d), d)


def test_a_tied_checkpoint_holding_only_lm_head_loads_it_as_the_embedding(tmp_path, tiny_model):
    """tie_word_embeddings true and the shared matrix saved as lm_head.weight alone:
    transformers loads it into the embedding; it was refused as lacking
    model.embed_tokens.weight. Untied, the embedding is still required."""
    import torch
    import transformers
    from engine_helpers import hf_greedy
    from safetensors.torch import load_file, save_file

    from llmsched.engine import LLM
    from llmsched.engine.loader import check_weights, read_config

    d = _copy(tiny_model, tmp_path / "head-only")
    _edit_config(d, tie_word_embeddings=True)
    w = load_file(d / "model.safetensors")
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    save_file(w, d / "model.safetensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    assert torch.equal(hf.model.embed_tokens.weight, w["lm_head.weight"])
    p = [0, 5, 17, 200, 33]
    llm = LLM(d, b_max=16, max_model_len=512, max_num_seqs=2)
    assert llm.engine.runner.model.lm_head is None  # tied, one matrix
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert llm.generate([p], greedy)[0].token_ids == hf_greedy(hf, p, 8)
    _edit_config(d, tie_word_embeddings=False)
    with pytest.raises(ConfigError, match="lacks weight 'model.embed_tokens.weight'"):
        check_weights(read_config(d), d)


def test_a_weight_in_two_files_is_refused(tmp_path, tiny_model):
    """Without model.safetensors every *.safetensors is read: a weight in two of them was
    silently taken from the last file."""
    import torch
    from safetensors.torch import save_file

    from llmsched.engine import LLM

    folder = _copy(tiny_model, tmp_path / "dup")
    (folder / "model.safetensors").rename(folder / "a.safetensors")
    save_file({"model.norm.weight": torch.zeros(64)}, folder / "b.safetensors")
    with pytest.raises(ConfigError, match=r"'model.norm.weight' is in both a.safetensors and b.safetensors"):
        LLM(folder)


@pytest.mark.parametrize(
    "wrong, right",
    [
        ("model.layers.0.mlp.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("model.layers.1.self_attn.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
        ("model.layers.0.o_proj.weight", "model.layers.0.self_attn.o_proj.weight"),
        ("model.layers.01.input_layernorm.weight", "model.layers.1.input_layernorm.weight"),
    ],
)
def test_a_weight_under_the_wrong_module_is_unexpected(tmp_path, tiny_model, wrong, right):
    """The name mapping dropped the module: mlp.q_proj loaded as attention's q_proj."""
    from safetensors.torch import load_file, save_file

    from llmsched.engine import LLM

    folder = _copy(tiny_model, tmp_path / "misnamed")
    w = load_file(folder / "model.safetensors")
    w[wrong] = w.pop(right)
    save_file(w, folder / "model.safetensors")
    with pytest.raises(ConfigError, match=f"unexpected weight '{wrong}'"):
        LLM(folder)


def test_json_files_that_are_not_utf8_are_config_errors(tmp_path, tiny_model, caplog):
    """A UnicodeDecodeError escaped _read_json as a traceback."""
    from llmsched.engine.loader import read_config, weight_files

    cfg = _copy(tiny_model, tmp_path / "cfg")
    (cfg / "config.json").write_bytes(b'{"architectures": ["\xff"]}')
    with pytest.raises(ConfigError, match="config.json is not valid UTF-8"):
        read_config(cfg)
    index = _copy(tiny_model, tmp_path / "index")
    (index / "model.safetensors").rename(index / "model-1.safetensors")
    (index / "model.safetensors.index.json").write_bytes(b'{"weight_map": {"\xff": "model-1.safetensors"}}')
    with pytest.raises(ConfigError, match="index.json is not valid UTF-8"):
        weight_files(index)
    gen = _copy(tiny_model, tmp_path / "gen")  # a broken generation config is ignored, as transformers does
    (gen / "generation_config.json").write_bytes(b'{"eos_token_id": 2, "x": "\xff"}')
    with caplog.at_level("WARNING", logger="llmsched.engine.loader"):
        assert read_config(gen).eos_token_ids == read_config(tiny_model).eos_token_ids
    assert "generation_config.json is not valid UTF-8" in caplog.text


@pytest.mark.parametrize("key", ["vocab_size", "intermediate_size"])
def test_absurd_config_sizes_are_checked_against_the_weights_before_allocating(tmp_path, tiny_model, key):
    """A config.json of 10**12 tokens or MLP width allocated the model first and died with
    an out-of-memory RuntimeError."""
    from llmsched.engine import LLM

    folder = _copy(tiny_model, tmp_path / key)
    _edit_config(folder, **{key: 10**12})
    with pytest.raises(ConfigError, match="model's weights .* more than the .* of memory"):
        LLM(folder)
    _edit_config(folder, **{key: 1000})  # within memory: the shapes tell
    with pytest.raises(ConfigError, match="weight '.*' has shape .* the config implies .*1000"):
        LLM(folder)


def test_a_model_larger_than_memory_is_refused_before_allocating():
    """Weights the config sizes beyond the machine's memory (random weights here: no
    checkpoint to compare with) are one line, not an allocator traceback."""
    import dataclasses

    from helpers import tiny_llama_config

    from llmsched.engine.runner import ModelRunner

    cfg = dataclasses.replace(tiny_llama_config(), vocab_size=10**12)
    with pytest.raises(ConfigError, match="model's weights .* more than the .* of memory"):
        ModelRunner(cfg, None)


def test_config_fields_of_the_wrong_type_are_named():
    """A string `architectures` was listed letter by letter; a string "false" for a flag
    was taken as true."""
    from llmsched.engine.loader import parse_config

    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    with pytest.raises(ConfigError, match="architectures must be a list of names, got 'LlamaForCausalLM'"):
        parse_config({**base, "architectures": "LlamaForCausalLM"})
    for key in ("attention_bias", "tie_word_embeddings", "mlp_bias"):
        with pytest.raises(ConfigError, match=f"{key} must be true or false, got 'false'"):
            parse_config({**base, key: "false"})
    cfg = parse_config({**base, "attention_bias": None, "tie_word_embeddings": True})  # null: the default
    assert (cfg.o_bias, cfg.tie_word_embeddings, cfg.mlp_bias) == (False, True, False)
    cfg = parse_config({**base, "mlp_bias": 1, "tie_word_embeddings": 0})  # as transformers reads them
    assert (cfg.tie_word_embeddings, cfg.mlp_bias) == (False, True)
    with pytest.raises(ConfigError, match="mlp_bias must be true or false, got 2"):
        parse_config({**base, "mlp_bias": 2})


def test_far_more_layers_in_the_config_than_in_the_checkpoint_are_refused_before_building_a_model(
    tmp_path, tiny_model, monkeypatch
):
    """num_hidden_layers 20,000 over a checkpoint of 2 layers built a meta model of 20,000
    layers (14 s here) before the check named the weights missing."""
    from llmsched.engine import LLM
    from llmsched.engine.model import CausalLM

    folder = _copy(tiny_model, tmp_path / "deep")
    _edit_config(folder, num_hidden_layers=20_000)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the checkpoint was checked")

    monkeypatch.setattr(CausalLM, "__init__", no_model)
    message = r"lacks weight 'model.layers.2\..*weights of 2 layers.*num_hidden_layers 20,000"
    with pytest.raises(ConfigError, match=message):
        LLM(folder)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_word_embeddings": True},
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
        {"attention_bias": True, "mlp_bias": True, "head_dim": 8, "num_key_value_heads": 1},
    ],
)
def test_the_shapes_checked_are_the_models(changes):
    """check_weights works from the config's sizes, without a model: they must be the
    parameters engine.model.CausalLM makes."""
    from llmsched.engine.loader import _layer_shapes, _top_shapes, parse_config
    from llmsched.engine.model import CausalLM

    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    cfg = parse_config({**base, **changes})
    model = {name: tuple(p.shape) for name, p in CausalLM(cfg, device="meta").named_parameters()}
    shapes = dict(_top_shapes(cfg))
    if cfg.tie_word_embeddings:
        del shapes["lm_head.weight"]  # (a tied checkpoint's lm_head.weight is still taken)
    for i in range(cfg.num_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in _layer_shapes(cfg).items()})
    assert shapes == model


def _out_of_memory(kind: str):
    import torch

    if kind == "cpu":
        return RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1024 bytes. Error code 12 (Cannot allocate memory)"
        )
    if kind == "mmap":  # safetensors mapping the file (seen under ulimit -v)
        return RuntimeError("unable to mmap 1024 bytes from file <model.safetensors>: Cannot allocate memory (12)")
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")


@pytest.mark.parametrize(
    "kind, where",
    [
        ("cpu", "runner.CausalLM"),
        ("cuda", "runner.CausalLM"),
        ("cpu", "runner.load_weights"),
        ("cuda", "runner.load_weights"),
        ("mmap", "loader._open_weights"),
    ],
)
def test_an_allocation_that_fails_after_the_memory_check_is_one_line(tiny_model, monkeypatch, kind, where):
    """Memory in use elsewhere: the check said the weights fit, the allocator then refused
    them, and the RuntimeError (or torch.OutOfMemoryError) was a traceback."""
    import llmsched.engine.loader as loader
    import llmsched.engine.runner as runner
    from llmsched.engine import LLM

    def refuse(*args, **kwargs):
        raise _out_of_memory(kind)

    module, name = where.split(".")
    monkeypatch.setattr({"runner": runner, "loader": loader}[module], name, refuse)
    need = loader.read_config(tiny_model).num_params() * 4
    with pytest.raises(ConfigError, match=f"cannot allocate the weights of model folder {tiny_model}.*{need:,} bytes"):
        LLM(tiny_model)


def test_other_runtime_errors_while_loading_are_not_called_memory(tiny_model, monkeypatch):
    """Only the allocator's refusals are said to be memory: another failure is not hidden."""
    import llmsched.engine.runner as runner
    from llmsched.engine import LLM

    def broken(*args, **kwargs):
        raise RuntimeError("an internal failure")

    monkeypatch.setattr(runner, "load_weights", broken)
    with pytest.raises(RuntimeError, match="an internal failure"):
        LLM(tiny_model)


def test_missing_weights_are_named_in_layer_order(tmp_path):
    """Sorted as text, layers.10 came before layers.2: the first missing weight named was
    not the first one missing."""
    from safetensors.torch import load_file, save_file

    from llmsched.engine import LLM
    from llmsched.engine.tiny import make_tiny_model

    folder = make_tiny_model(
        tmp_path / "m", hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64, num_layers=12
    )
    weights = load_file(str(folder / "model.safetensors"))
    for layer in (2, 10):
        del weights[f"model.layers.{layer}.mlp.up_proj.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"lacks weight 'model\.layers\.2\.mlp\.up_proj\.weight' and 1 more$"):
        LLM(folder)
