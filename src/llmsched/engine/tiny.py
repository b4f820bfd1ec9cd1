"""`make-tiny-model`: a small random Llama-family model in Hugging Face format (config.json,
model.safetensors, tokenizer.json with a byte-level BPE trained on a built-in text), so
that demos and tests run anywhere without downloads."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.engine_api import MAX_SEED
from ..core.errors import ConfigError
from .loader import parse_config

ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "mistral": ("MistralForCausalLM", "mistral"),
}

# A short built-in training text for the tokenizer (written for this project).
TEXT = """\
A scheduler decides which requests share the next step of the model.
Each step holds prefill tokens of new prompts and one decode token for every running request.
The token budget bounds the work of a step, and the batch cap bounds how many requests it holds.
When the cache of keys and values is full, the newest request is preempted and computed again later.
Chunked prefill splits a long prompt into pieces so that decoding requests keep their pace.
Throughput is the number of tokens served per second; latency is the time a user waits.
The time to first token measures the queue and the prefill; the inter-token latency measures each decode step.
A work-conserving policy never leaves the budget idle while work is waiting.
Hello world! The quick brown fox jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.
Once upon a time, a small model wrote short stories about servers, queues and patient users.
"""

BOS, EOS = "<s>", "</s>"
# the vocabulary sizes train_tokenizer can honour: the 256 bytes and the two special tokens
# at least, and at most what BPE can merge from TEXT (tests/engine checks the bound); the
# trainer clamps other sizes silently, so `make_tiny_model` refuses them
MIN_VOCAB = 258
MAX_VOCAB = 575


def train_tokenizer(vocab_size: int = 512):
    """A byte-level BPE `tokenizers.Tokenizer` with <s> (BOS, added to every encoding) and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = TEXT.splitlines()
    tok.train_from_iterator(lines * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def tiny_config(
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool = False,
    bos_token_id: int = 0,
    eos_token_id: int = 1,
) -> dict:
    if arch not in ARCHS:
        raise ConfigError(f"unknown architecture {arch!r} (known: {', '.join(ARCHS)})")
    cls, mt = ARCHS[arch]
    cfg = {
        "architectures": [cls],
        "model_type": mt,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    elif arch == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None)
    else:
        cfg.update(sliding_window=None)
    return cfg


# the largest weights file make_tiny_model writes (float32 bytes): a tiny model; a size of
# 1e9 hidden units failed allocating, and 100,000 layers ran for minutes towards 75 GB
MAX_TINY_BYTES = 2 << 30


def tiny_param_count(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    tie_word_embeddings: bool = False,
    arch: str = "llama",
) -> int:
    """The number of weights `make_tiny_model` writes for these sizes (exact integers):
    those of the config it writes, counted without building the model."""
    cfg = tiny_config(
        arch,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    return parse_config(cfg).num_params()


def make_tiny_model(
    out_dir,
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    std: float = 0.05,
    overwrite: bool = False,
) -> Path:
    """Write a random model and a trained tokenizer into `out_dir`; returns the folder.
    `out_dir` must not exist or be empty, unless `overwrite` (its model files are then
    replaced): a typo must not destroy a real model's weights."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        # torch's generator takes at most 64 bits: a larger seed was its ValueError
        raise ConfigError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r}")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        # the BPE trainer would silently give another size (258 for 10, 575 for 10**8)
        raise ConfigError(
            f"vocab_size must be an integer from {MIN_VOCAB} (256 bytes + <s>, </s>) to {MAX_VOCAB} "
            f"(every merge of the training text), got {vocab_size!r}"
        )
    for name, v in (
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("intermediate_size", intermediate_size),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    # (one message for both named neither value: which flag to change was a guess)
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ConfigError(
            f"hidden_size ({hidden_size}) must split into num_heads ({num_heads}) heads of an even size "
            "(rotary embeddings pair the dimensions)"
        )
    if num_heads % num_kv_heads:
        raise ConfigError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    n = tiny_param_count(
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        tie_word_embeddings,
        arch,
    )
    if n * 4 > MAX_TINY_BYTES:  # before torch allocates it
        raise ConfigError(
            f"these sizes give {n:,} weights ({n * 4 / (1 << 30):,.1f} GiB in float32), more than a tiny model's "
            f"{MAX_TINY_BYTES >> 30} GiB: lower hidden_size (--hidden-size), intermediate_size "
            "(--intermediate-size) or num_layers (--layers)"
        )
    if not str(out_dir).strip():  # Path("") is the current folder
        raise ConfigError("give the folder to write the model into, got ''")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a folder")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise ConfigError(
            f"{out} exists and is not empty: give another folder, or --force to overwrite its model files"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on the path, a read-only or virtual file system
        raise ConfigError(f"cannot create the folder {out}: {e.strerror or e}") from None
    # (after the checks: a bad argument does not wait for torch to load)
    import torch  # noqa: PLC0415
    from safetensors.torch import save  # noqa: PLC0415

    from .model import CausalLM  # noqa: PLC0415

    tok = train_tokenizer(vocab_size)
    vocab = tok.get_vocab_size()
    cfg_dict = tiny_config(
        arch,
        vocab,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        max_position_embeddings,
        tie_word_embeddings,
        tok.token_to_id(BOS),
        tok.token_to_id(EOS),
    )
    cfg = parse_config(cfg_dict)
    model = CausalLM(cfg, torch.float32, "cpu")
    model.init_random(seed, std)
    tensors = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] != "layers":
            hf = name if name == "lm_head.weight" else f"model.{name}"
            tensors[hf] = p.detach().clone()
            continue
        i, kind, leaf = parts[1], parts[2], parts[3]
        pre = f"model.layers.{i}"
        if kind == "qkv_proj":
            q, kv = cfg.q_size, cfg.kv_size
            for sub, (a, b) in zip(("q_proj", "k_proj", "v_proj"), ((0, q), (q, q + kv), (q + kv, q + 2 * kv))):
                tensors[f"{pre}.self_attn.{sub}.{leaf}"] = p[a:b].clone()
        elif kind == "o_proj":
            tensors[f"{pre}.self_attn.o_proj.{leaf}"] = p.detach().clone()
        elif kind == "gate_up_proj":
            n = cfg.intermediate_size
            tensors[f"{pre}.mlp.gate_proj.{leaf}"] = p[:n].clone()
            tensors[f"{pre}.mlp.up_proj.{leaf}"] = p[n:].clone()
        elif kind == "down_proj":
            tensors[f"{pre}.mlp.down_proj.{leaf}"] = p.detach().clone()
        else:
            tensors[f"{pre}.{kind}.{leaf}"] = p.detach().clone()
    # serialized in memory and written like the other files: safetensors' save_file creates
    # the file with mode 0600, not the umask's (a model others cannot read)
    (out / "model.safetensors").write_bytes(save(tensors, metadata={"format": "pt"}))
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": cfg_dict["bos_token_id"], "eos_token_id": cfg_dict["eos_token_id"]}, indent=2)
        + "\n"
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "model_max_length": max_position_embeddings,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )
    return out
