"""Read a Hugging Face-format model folder: `config.json`, `*.safetensors` (one file or
shards with `model.safetensors.index.json`), optional `generation_config.json` (EOS ids,
and the sampling defaults vLLM applies: `generation_defaults`).

Supported: Llama 2/3 (incl. Llama-3 rope scaling), Qwen2 (q/k/v bias), Mistral (sliding
window). Everything a user can get wrong raises `ConfigError` with one sentence.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.checks import as_real, check_bool
from ..core.engine_api import SamplingParams
from ..core.errors import ConfigError, check_known

log = logging.getLogger(__name__)
# transformers' MistralConfig and Qwen2Config default (a config.json without the key)
DEFAULT_SLIDING_WINDOW = 4096
# each architecture's transformers default of max_position_embeddings (LlamaConfig,
# Qwen2Config, MistralConfig; transformers 5.25), for a config.json without the key
DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "mistral": 131072}

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_windows: list = field(default_factory=list)  # per layer: window or None
    bos_token_id: int | None = None
    eos_token_ids: list = field(default_factory=list)
    torch_dtype: str | None = None

    @property
    def max_len(self) -> int:
        """The longest sequence the model's positions cover: max_position_embeddings, times
        the factor of linear rope scaling (as vLLM derives its max_model_len; llama3's
        max_position_embeddings is already the scaled length)."""
        s = self.rope_scaling
        if s and s.get("rope_type") == "linear":
            return int(self.max_position_embeddings * s["factor"])
        return self.max_position_embeddings

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """The model's weights (`engine.model.CausalLM`'s parameters), biases included."""
        h, i, v, q, kv = self.hidden_size, self.intermediate_size, self.vocab_size, self.q_size, self.kv_size
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h  # qkv, o, gate/up/down, two norms
        layer += (q + 2 * kv) * self.qkv_bias + h * self.o_bias + (2 * i + h) * self.mlp_bias
        return self.num_layers * layer + v * h * (1 if self.tie_word_embeddings else 2) + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes


def _read_json(path: Path, what: str) -> dict:
    try:  # JSON is UTF-8 whatever the locale (transformers reads these files so too)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError as e:
        byte = e.object[e.start]
        raise ConfigError(f"{what} {path} is not valid UTF-8 text: byte {byte:#04x} at offset {e.start}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object")
    return data


def model_path(model_dir) -> Path:
    if not isinstance(model_dir, (str, os.PathLike)) or isinstance(model_dir, bytes):
        raise ConfigError(f"model must be a model folder path, got {model_dir!r}")
    p = Path(model_dir)
    if not p.exists():
        raise ConfigError(f"model folder {p} does not exist")
    if not p.is_dir():
        raise ConfigError(f"model path {p} is not a folder (expected a Hugging Face model folder)")
    if not (p / "config.json").is_file():
        raise ConfigError(f"model folder {p} has no config.json")
    return p


def _int(cfg: dict, key: str, path: Path, default=None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def _flag(cfg: dict, key: str, path: Path) -> bool:
    """A true/false field, false when absent or null (a string "false" is not false); 0
    and 1 read as false and true, as Hugging Face's loader reads them."""
    v = cfg.get(key)
    if v is None:
        return False
    if type(v) is int and v in (0, 1):
        return bool(v)
    return check_bool(v, f"{path}: {key}")


def _positive_finite(v) -> bool:
    """A JSON number (not a bool) above 0 and finite (Python's json reads NaN and Infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _token_ids(v, where: str, vocab: int) -> list[int]:
    """An `eos_token_id` value: null (or absent) is none; else an id or a list of ids
    (`where` names the field in the error). An id outside 0..vocab-1 is left out with a
    warning: it can never be drawn, so it stops nothing, and transformers and vLLM load
    such a model."""
    if v is None:
        return []
    ids = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise ConfigError(f"{where} must be a token id or a list of token ids, got {v!r:.80}")
    for x in ids:
        if not 0 <= x < vocab:
            log.warning(
                "%s %d is outside the vocabulary (0..%d, vocab_size %d); ignoring it (it can never be drawn)",
                where,
                x,
                vocab - 1,
                vocab,
            )
    return [x for x in ids if 0 <= x < vocab]


def parse_config(cfg: dict, path: Path | str = "config.json") -> ModelConfig:
    """Validate a config.json dict and turn it into a `ModelConfig`."""
    path = Path(path)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ConfigError(f"{path}: architectures must be a list of names, got {archs!r:.80}")
    arch = None
    for a in archs:
        if a in ARCHITECTURES:
            arch = ARCHITECTURES[a]
            break
    if arch is None:
        mt = cfg.get("model_type")
        if mt in ARCHITECTURES.values() and not archs:
            arch = mt
        else:
            got = ", ".join(map(str, archs)) if archs else f"model_type {mt!r}"
            raise ConfigError(f"{path}: unsupported architecture {got} (supported: {', '.join(ARCHITECTURES)})")
    quant = cfg.get("quantization_config")
    if quant is not None:  # its weights were refused one by one as unexpected, not for what they are
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        raise ConfigError(
            f"{path}: quantized checkpoints are not supported (quantization_config, quant_method {method!r}); "
            "use the model's float16 or bfloat16 weights"
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers' "swish" is SiLU too
        raise ConfigError(f"{path}: hidden_act {act!r} is not supported (only silu)")
    hidden = _int(cfg, "hidden_size", path)
    heads = _int(cfg, "num_attention_heads", path)
    # null or absent: one KV head per attention head, as transformers reads it
    kv_heads = heads if cfg.get("num_key_value_heads") is None else _int(cfg, "num_key_value_heads", path)
    layers = _int(cfg, "num_hidden_layers", path)
    if heads % kv_heads:
        raise ConfigError(
            f"{path}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"{path}: hidden_size ({hidden}) is not a multiple of "
                f"num_attention_heads ({heads}) and no head_dim is given"
            )
        head_dim = hidden // heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", path)
    if head_dim % 2:
        raise ConfigError(f"{path}: head_dim must be even for rotary embeddings, got {head_dim}")

    # rope, merged as transformers 5 does: the legacy `rope_scaling` dict if set, else
    # `rope_parameters`; a top-level `rope_theta` fills in a missing one (default 10000);
    # llama3 scaling without `original_max_position_embeddings` takes max_position_embeddings
    max_pos = _int(cfg, "max_position_embeddings", path, DEFAULT_MAX_POSITIONS[arch])
    rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    for key, v in (("rope_scaling", rs), ("rope_parameters", rp)):
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"{path}: {key} must be a JSON object, got {v!r}")
    scaling = dict(rs or rp or {})
    if scaling.get("rope_theta") is None:
        top = cfg.get("rope_theta")
        scaling["rope_theta"] = 10000.0 if top is None else top
    theta = scaling.pop("rope_theta")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not 0 < theta < math.inf:
        raise ConfigError(f"{path}: rope_theta must be a positive finite number, got {theta!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"{path}: rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    scaling["rope_type"] = kind
    if kind == "default":
        scaling = None
    elif kind == "llama3":
        if scaling.get("original_max_position_embeddings") is None:
            scaling["original_max_position_embeddings"] = max_pos
        # (a factor of 0 made every frequency infinite: the model's outputs were NaN, and
        # each token silently the first of the vocabulary)
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if not _positive_finite(scaling.get(k)):
                raise ConfigError(f"{path}: llama3 rope scaling needs a positive finite number {k!r}")
    elif not _positive_finite(scaling.get("factor")):
        raise ConfigError(f"{path}: linear rope scaling needs a positive finite 'factor'")

    # sliding windows, per layer, as transformers reads them: Llama has none (its
    # `sliding_window`, if any, is ignored); Mistral windows every layer (null: none);
    # Qwen2 only with `use_sliding_window`, from layer `max_window_layers` (default 28) on.
    # A `layer_types` list names the windowed layers instead (transformers' Mistral warns
    # of one and fails to generate past its window: we read it as its Ministral does).
    # An unused `sliding_window` is not read (Qwen2 configs carry one with
    # use_sliding_window false); a used one must be a positive integer or null, and a
    # missing one is transformers' default, 4096 tokens
    window = None
    if arch == "mistral":
        window = cfg.get("sliding_window", DEFAULT_SLIDING_WINDOW)
    elif arch == "qwen2":
        use = cfg.get("use_sliding_window")
        if use is not None and not isinstance(use, bool):
            raise ConfigError(f"{path}: use_sliding_window must be true or false, got {use!r}")
        if use:
            window = cfg.get("sliding_window", DEFAULT_SLIDING_WINDOW)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ConfigError(f"{path}: sliding_window must be a positive integer or null, got {window!r}")
    layer_types = cfg.get("layer_types")
    if window is None:
        windows = [None] * layers
    elif layer_types is not None:
        _check_layer_types(path, layer_types, layers)
        windows = [window if t == "sliding_attention" else None for t in layer_types]
    elif arch == "qwen2":
        mwl = cfg.get("max_window_layers")
        mwl = 28 if mwl is None else mwl
        if not isinstance(mwl, int) or isinstance(mwl, bool) or mwl < 0:
            raise ConfigError(f"{path}: max_window_layers must be an integer >= 0, got {mwl!r}")
        windows = [window if i >= mwl else None for i in range(layers)]
    else:
        windows = [window] * layers

    # transformers reads attention_bias and mlp_bias for Llama only: Qwen2 has q/k/v biases
    # and Mistral none, whatever they say (a checkpoint of either saved with them true holds
    # no such biases, and its weights were refused as missing them)
    llama = arch == "llama"
    bias = llama and _flag(cfg, "attention_bias", path)
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ConfigError(f"{path}: rms_norm_eps must be a small positive number, got {eps!r}")
    bos = cfg.get("bos_token_id")
    vocab = _int(cfg, "vocab_size", path)
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", path),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", path),
        qkv_bias=arch == "qwen2" or bias,
        o_bias=bias,
        mlp_bias=llama and _flag(cfg, "mlp_bias", path),
        sliding_windows=windows,
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=_token_ids(cfg.get("eos_token_id"), f"{path}: eos_token_id", vocab),
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
    )


def read_config(model_dir) -> ModelConfig:
    """config.json of a model folder (and generation_config.json's EOS ids, if any)."""
    p = model_path(model_dir)
    cfg = parse_config(_read_json(p / "config.json", "model config"), p / "config.json")
    gen = p / "generation_config.json"
    if gen.is_file():
        try:  # transformers too loads a model whose generation config is broken
            data = _read_json(gen, "generation config")
        except ConfigError as e:
            log.warning("%s; ignoring it (EOS ids from config.json)", e)
            data = {}
        eos = _token_ids(data.get("eos_token_id"), f"{gen}: eos_token_id", cfg.vocab_size)
        if eos:
            cfg.eos_token_ids = eos
    return cfg


# generation_config.json's sampling defaults, as vLLM reads them (ModelConfig.
# get_diff_sampling_param): the file's key -> the SamplingParams field it sets
GENERATION_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",  # Hugging Face's max_new_tokens is vLLM's max_tokens
}
# vLLM's fifth key, a sampling method this engine lacks: only its "off" value (0) is taken
GENERATION_KEYS = (*GENERATION_DEFAULTS, "min_p")
GENERATION_CONFIG_CHOICES = ("auto", "vllm")  # or the path of a folder holding generation_config.json


def generation_config_file(model_dir, generation_config="auto") -> Path | None:
    """The generation_config.json whose sampling defaults apply: the model folder's with
    `auto` (None if it has none), none with `vllm`, else the one in the folder (or the
    file) `generation_config` names, as vLLM's `--generation-config PATH`; a PATH that does
    not exist or holds no generation_config.json is a ConfigError."""
    if not isinstance(generation_config, (str, os.PathLike)) or isinstance(generation_config, bytes):
        raise ConfigError(f"generation_config must be auto, vllm or a folder's path, got {generation_config!r}")
    if generation_config == "vllm":
        return None
    if generation_config == "auto":
        if isinstance(model_dir, ModelConfig):
            return None
        gen = model_path(model_dir) / "generation_config.json"
        return gen if gen.is_file() else None
    p = Path(generation_config)
    if not str(generation_config).strip() or not p.exists():
        raise ConfigError(
            f"generation config folder {str(generation_config)!r} does not exist "
            "(--generation-config takes auto, vllm or a folder holding generation_config.json)"
        )
    gen = p / "generation_config.json" if p.is_dir() else p
    if not gen.is_file():
        raise ConfigError(f"generation config folder {p} has no generation_config.json")
    return gen


def generation_stop_ids(model_dir, generation_config) -> list[int]:
    """The `eos_token_id` ids of a `--generation-config PATH` file that are not the model's
    EOS ids: as in vLLM (SamplingParams.update_from_generation_config), every request stops
    on them too (as stop_token_ids) unless it sets ignore_eos. An id outside the vocabulary
    is left out with a warning, as in the model folder's own file (vLLM takes it and never
    stops there). None with auto or vllm: the model folder's own file gives the model's
    EOS ids (read_config)."""
    if generation_config in GENERATION_CONFIG_CHOICES:
        return []
    gen = generation_config_file(model_dir, generation_config)
    cfg = model_dir if isinstance(model_dir, ModelConfig) else read_config(model_dir)
    raw = _read_json(gen, "generation config").get("eos_token_id")
    ids = _token_ids(raw, f"{gen}: eos_token_id", cfg.vocab_size)
    return sorted(set(ids) - set(cfg.eos_token_ids))


def _sampling_fields(data: dict, where) -> dict:
    """The SamplingParams fields of a generation config's keys (GENERATION_DEFAULTS), those
    not null, in SamplingParams' normal form; a value it refuses, or a min_p above 0, is a
    ConfigError naming `where` and the key."""
    out = {}
    for key, name in GENERATION_DEFAULTS.items():
        v = data.get(key)
        if v is None:
            continue
        if as_real(v) is None:  # (shown as JSON-ish repr, cut: a string may hold newlines)
            raise ConfigError(f"{where}: {key} must be a number, got {v!r:.40}")
        try:
            out[name] = getattr(SamplingParams(**{name: v}), name)  # its checks, its normal form
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(f"{where}: {key}{msg[len(name) :] if msg.startswith(name) else ': ' + msg}") from None
    min_p = data.get("min_p")
    if min_p is not None and as_real(min_p) is None:
        raise ConfigError(f"{where}: min_p must be a number, got {min_p!r:.40}")
    if min_p is not None and min_p != 0:
        fix = "leave it out, or give 0"
        if isinstance(where, Path):  # a file the user may not own: a way around it
            fix = "--generation-config vllm ignores the file's sampling defaults"
        raise ConfigError(
            f"{where}: min_p {min_p!r:.40} asks for min-p sampling, which llmsched does not support ({fix})"
        )
    return out


def generation_defaults(
    model_dir, generation_config="auto", override=None, override_name: str = "override_generation_config"
) -> dict:
    """The sampling defaults (SamplingParams fields) a request that omits them gets, as vLLM
    computes them (`--generation-config`, `--override-generation-config`): those of
    GENERATION_DEFAULTS present and not null in `generation_config_file`'s file (none for
    `vllm`; none either for a ModelConfig (random weights), without the file, or, with
    `auto`, when it is not valid JSON: read_config warns and loads the model without it),
    then `override` (a dict of the same keys) on top of them: its values replace the
    file's, and a null removes one. A value SamplingParams refuses, a min_p above 0, or an
    override key vLLM does not read is a ConfigError naming the file (or `override_name`)
    and the key."""
    gen = generation_config_file(model_dir, generation_config)
    data = {}
    if gen is not None:
        try:
            data = _read_json(gen, "generation config")
        except ConfigError:
            if generation_config != "auto":  # (auto: read_config warns, as transformers loads it)
                raise
    out = _sampling_fields(data, gen)
    if override is None:
        return out
    if not isinstance(override, dict):
        example = '{"temperature": 0.5}'
        raise ConfigError(f"{override_name} must be a JSON object such as {example}, got {override!r:.40}")
    check_known(f"{override_name} key", override, GENERATION_KEYS)  # (vLLM ignores them silently)
    for key, v in override.items():
        if v is None:  # as vLLM: a null removes the file's default
            out.pop(GENERATION_DEFAULTS.get(key, key), None)
    out.update(_sampling_fields(override, override_name))
    return out


def max_tokens_cap(generation_config, override, defaults: dict) -> int | None:
    """The max_tokens no request may exceed, as vLLM's server caps them: the max_new_tokens
    of a `--generation-config PATH` file (after the override), or of
    `--override-generation-config`; None otherwise (the model folder's own max_new_tokens is
    only a default). `defaults`: generation_defaults' result for the same options."""
    given = generation_config not in GENERATION_CONFIG_CHOICES or (override or {}).get("max_new_tokens") is not None
    return defaults.get("max_tokens") if given else None


def defaults_note(model_dir, generation_config, override, defaults: dict, overriders: str) -> str:
    """The startup line that says which sampling defaults `generation_defaults` gave and
    where from (the file, --override-generation-config; vLLM logs that they override its
    own), and what overrides them."""
    # the file, where it gave any default (a model folder's may hold only EOS ids)
    gen = generation_config_file(model_dir, generation_config)
    gen = gen if generation_defaults(model_dir, generation_config) else None
    parts = ([str(gen)] if gen is not None else []) + (["--override-generation-config"] if override else [])
    source = " and ".join(parts)
    shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
    ignore = "; --generation-config vllm ignores the file's" if gen is not None else ""
    return f"default sampling parameters from {source}: {shown} ({overriders} override them{ignore})"


def weight_files(model_dir) -> list[Path]:
    """model.safetensors, else the shards of model.safetensors.index.json, as transformers
    looks for them (a stale index beside a merged model.safetensors is not read), else
    every *.safetensors but adapters (a PEFT adapter_model.safetensors beside them is not
    part of the base model)."""
    p = model_path(model_dir)
    if (p / "model.safetensors").is_file():
        return [p / "model.safetensors"]
    index = p / "model.safetensors.index.json"
    if index.is_file():
        wm = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ConfigError(f"{index} has no weight_map")
        # (a null or a number there was a TypeError traceback)
        bad = next(((k, v) for k, v in wm.items() if not isinstance(v, str) or not v.strip()), None)
        if bad is not None:
            raise ConfigError(f"{index}: weight_map gives weight {bad[0]!r} the shard {bad[1]!r}, not a file name")
        files = sorted(set(wm.values()))
        missing = [f for f in files if not (p / f).is_file()]
        if missing:
            raise ConfigError(f"{index} names shard {missing[0]!r}, which is not in {p}")
        return [p / f for f in files]
    files = sorted(f for f in p.glob("*.safetensors") if not f.name.startswith("adapter_"))
    if not files:
        raise ConfigError(f"model folder {p} has no *.safetensors weights")
    return files


# a layer weight's HF module path -> (our module, shard index in the fused projection);
# q/k/v and gate/up are fused, so a module path names a slice of ours
_LAYER_MODULES = {
    "self_attn.q_proj": ("qkv_proj", 0),
    "self_attn.k_proj": ("qkv_proj", 1),
    "self_attn.v_proj": ("qkv_proj", 2),
    "self_attn.o_proj": ("o_proj", None),
    "mlp.gate_proj": ("gate_up_proj", 0),
    "mlp.up_proj": ("gate_up_proj", 1),
    "mlp.down_proj": ("down_proj", None),
    "input_layernorm": ("input_layernorm", None),
    "post_attention_layernorm": ("post_attention_layernorm", None),
}


def _param_name(hf_name: str) -> tuple[str, int | None] | None:
    """A checkpoint weight name -> (our parameter name, fused shard), or None for a layer
    weight of no module we know (its module path must match exactly: a `mlp.q_proj` is
    not attention's q_proj)."""
    name = hf_name[len("model.") :] if hf_name.startswith("model.") else hf_name
    parts = name.split(".")
    if parts[0] != "layers":
        return name, None
    if len(parts) < 4:
        return None
    module = _LAYER_MODULES.get(".".join(parts[2:-1]))
    if module is None:
        return None
    ours, shard = module
    return f"layers.{parts[1]}.{ours}.{parts[-1]}", shard


def _open_weights(path: Path):
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"cannot read weights {path}: {e}") from None


def _shard_rows(cfg: ModelConfig, module: str, shard: int) -> tuple[int, int]:
    """(first row, rows) of a fused projection's shard: q/k/v of qkv_proj, gate/up of gate_up_proj."""
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    offsets = {"qkv_proj": [(0, q), (q, kv), (q + kv, kv)], "gate_up_proj": [(0, inter), (inter, inter)]}
    return offsets[module][shard]


def _slot(params: dict, name: str, shard, cfg: ModelConfig):
    """The tensor a checkpoint weight fills: the parameter, or its slice of a fused one."""
    dst = params[name].data
    if shard is None:
        return dst
    return dst.narrow(0, *_shard_rows(cfg, name.split(".")[2], shard))


def _top_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The parameters outside the layers and their shapes, as `engine.model.CausalLM` makes
    them; lm_head.weight whether or not it is tied (a tied checkpoint may hold one too)."""
    v, h = cfg.vocab_size, cfg.hidden_size
    return {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """One decoder layer's parameters (names under `layers.<i>.`) and their shapes, as
    `engine.model.DecoderLayer` makes them."""
    h, inter, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    shapes = {
        "input_layernorm.weight": (h,),
        "qkv_proj.weight": (q + 2 * kv, h),
        "o_proj.weight": (h, q),
        "post_attention_layernorm.weight": (h,),
        "gate_up_proj.weight": (2 * inter, h),
        "down_proj.weight": (h, inter),
    }
    if cfg.qkv_bias:
        shapes["qkv_proj.bias"] = (q + 2 * kv,)
    if cfg.o_bias:
        shapes["o_proj.bias"] = (h,)
    if cfg.mlp_bias:
        shapes.update({"gate_up_proj.bias": (2 * inter,), "down_proj.bias": (h,)})
    return shapes


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _check_layer_types(path, layer_types, layers: int) -> None:
    """transformers' per-layer attention list; a malformed one was ignored, every layer
    then windowed by the architecture's default rule."""
    if not isinstance(layer_types, list):
        raise ConfigError(f"{path}: layer_types must be a list, got {type(layer_types).__name__}")
    if len(layer_types) != layers:
        raise ConfigError(f"{path}: layer_types lists {len(layer_types):,} layers, num_hidden_layers is {layers:,}")
    unknown = next((t for t in layer_types if t not in _LAYER_TYPES), None)
    if unknown is not None:
        raise ConfigError(f"{path}: layer_types holds {unknown!r}; each must be one of {', '.join(_LAYER_TYPES)}")


def _layer_index(name: str, cfg: ModelConfig) -> int | None:
    """The layer of one of our parameter names, None outside the layers (or for an index
    the config has no layer of, or not written as the model names it: `layers.01`)."""
    parts = name.split(".")
    if parts[0] != "layers":
        return None
    index = parts[1]
    if not index.isdecimal() or index != str(int(index)) or int(index) >= cfg.num_layers:
        return None
    return int(index)


def _want_shape(cfg: ModelConfig, name: str, shard, layer_shapes: dict) -> tuple[int, ...] | None:
    """The shape the config implies for a checkpoint weight that fills our parameter `name`
    (its `shard` of a fused one), from the config's sizes alone; None: no such parameter."""
    if name.startswith("layers."):
        if _layer_index(name, cfg) is None:
            return None
        module_leaf = name.split(".", 2)[2]
        shape = layer_shapes.get(module_leaf)
        if shape is None or shard is None:
            return shape
        return (_shard_rows(cfg, module_leaf.split(".")[0], shard)[1], *shape[1:])
    return _top_shapes(cfg).get(name)


def _expected(cfg: ModelConfig, layer_shapes: dict) -> set:
    """Every (parameter, fused shard) a checkpoint must fill (one entry per layer weight:
    as many as the config has layers)."""
    shards = {"qkv_proj": 3, "gate_up_proj": 2}  # fused: a checkpoint weight per shard
    per_layer = []
    for name in layer_shapes:
        n = shards.get(name.split(".")[0])
        per_layer += [(name, None)] if n is None else [(name, i) for i in range(n)]
    expected = {(name, None) for name in _top_shapes(cfg)}
    if cfg.tie_word_embeddings:
        expected.discard(("lm_head.weight", None))
    expected.update((f"layers.{layer}.{name}", shard) for layer in range(cfg.num_layers) for name, shard in per_layer)
    return expected


# the safetensors dtypes a weight may have: converted to the model's dtype as they are
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def check_weights(cfg: ModelConfig, model_dir) -> list[tuple[Path, list[tuple[str, str, int | None]]]]:
    """The checkpoint's weights, checked against the config from the files' headers and the
    config's sizes alone (no tensor is read and no model built: a config.json whose sizes or
    layer count are absurd is refused before anything that large is allocated, or built
    layer by layer): every weight known, set once, of the shape the config implies, none
    missing. Returns, per file, its weights as (checkpoint name, our parameter name, fused
    shard)."""
    layer_shapes = _layer_shapes(cfg)
    loaded = {}  # (parameter, shard) -> (checkpoint name, file) that set it
    plan = []
    for path in weight_files(model_dir):
        entries = []
        with _open_weights(path) as f:
            for hf_name in f.keys():
                if "rotary_emb" in hf_name:
                    continue
                name, shard = _param_name(hf_name) or (None, None)
                want = None if name is None else _want_shape(cfg, name, shard, layer_shapes)
                if want is None:
                    raise ConfigError(
                        f"{path.name}: unexpected weight {hf_name!r} for a {cfg.arch} model with this config"
                    )
                _check_not_loaded(loaded, (name, shard), hf_name, path.name)
                loaded[(name, shard)] = (hf_name, path.name)
                info = f.get_slice(hf_name)
                shape = tuple(info.get_shape())
                if shape != want:
                    raise ConfigError(f"{path.name}: weight {hf_name!r} has shape {shape}, the config implies {want}")
                if info.get_dtype() not in _FLOAT_DTYPES:  # an integer or fp8 one was cast, silently wrong
                    raise ConfigError(
                        f"{path.name}: weight {hf_name!r} is of dtype {info.get_dtype()}, not a float16, bfloat16, "
                        "float32 or float64 one (a quantized checkpoint is not supported)"
                    )
                entries.append((hf_name, name, shard))
        plan.append((path, entries))
    _check_layer_count(cfg, model_dir, loaded)
    absent = _expected(cfg, layer_shapes) - loaded.keys()
    if cfg.tie_word_embeddings and ("lm_head.weight", None) in loaded:
        # a tied checkpoint may hold the shared matrix as lm_head.weight alone: transformers
        # loads it into the embedding it is tied to (load_weights does so too)
        absent.discard(("embed_tokens.weight", None))
    # by layer (as text, layers.10 sorted before layers.2), then by name
    in_order = sorted(absent, key=lambda ns: (_layer_index(ns[0], cfg) or 0, _hf_name(*ns)))
    missing = [_hf_name(n, s) for n, s in in_order]
    if missing:
        raise ConfigError(
            f"model folder {model_dir} lacks weight {missing[0]!r}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    return plan


def _check_layer_count(cfg: ModelConfig, model_dir, loaded: dict) -> None:
    """A config of more layers than the checkpoint has weights of, said in those terms, and
    before the missing weights are listed (as many as the config has layers)."""
    layers = {_layer_index(name, cfg) for name, _ in loaded} - {None}
    if len(layers) >= cfg.num_layers:
        return
    first = min(set(range(len(layers) + 1)) - layers)
    raise ConfigError(
        f"model folder {model_dir} lacks weight {_hf_name(f'layers.{first}.input_layernorm.weight', None)!r} "
        f"and every other weight of {cfg.num_layers - len(layers):,} layers: its checkpoint has weights of "
        f"{len(layers):,} layer{'' if len(layers) == 1 else 's'}, config.json's num_hidden_layers {cfg.num_layers:,}"
    )


def load_weights(model, model_dir, plan=None) -> None:
    """Copy the safetensors weights into `model` (an `engine.model.CausalLM`), converting
    dtype, after `check_weights` (`plan`: what it returned for this model's configuration,
    when the caller checked already).

    A tied model (`tie_word_embeddings`) whose checkpoint holds an `lm_head.weight` too
    uses it as transformers does: the embedding if the two are equal, else an untied head
    of its own (with a warning, as transformers gives)."""
    import torch  # noqa: PLC0415

    cfg = model.config
    params = dict(model.named_parameters())
    head = None  # a tied model's lm_head.weight from the checkpoint: (file name, tensor)
    embedded = False  # the checkpoint held the embedding
    for path, entries in check_weights(cfg, model_dir) if plan is None else plan:
        with _open_weights(path) as f:
            for hf_name, name, shard in entries:
                t = f.get_tensor(hf_name)
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    head = (path.name, t)
                    continue
                embedded |= name == "embed_tokens.weight"
                dst = _slot(params, name, shard, cfg)
                with torch.no_grad():
                    dst.copy_(t.to(device=dst.device, dtype=dst.dtype))
    if head is not None and not embedded:  # the tied matrix given as lm_head.weight alone
        emb = model.embed_tokens.weight
        with torch.no_grad():
            emb.copy_(head[1].to(device=emb.device, dtype=emb.dtype))
    elif head is not None:
        _untie_if_different(model, *head)


def _untie_if_different(model, file: str, t) -> None:
    """A tied model's checkpoint holds `lm_head.weight` `t` too: equal to the embedding, it
    stays tied; different, it becomes the model's own LM head, as transformers keeps the
    two untied then (tying them would silently compute other logits than it does)."""
    import torch  # noqa: PLC0415

    from .model import Linear  # noqa: PLC0415

    emb = model.embed_tokens.weight
    t = t.to(device=emb.device, dtype=emb.dtype)
    if torch.equal(t, emb.data):
        return
    cfg = model.config
    log.warning(
        "%s: tie_word_embeddings is true but lm_head.weight differs from the embedding: using it as an "
        "untied LM head, as transformers does (set tie_word_embeddings false to silence this)",
        file,
    )
    head = Linear(cfg.hidden_size, cfg.vocab_size, False, emb.dtype, emb.device)
    with torch.no_grad():
        head.weight.copy_(t)
    model.lm_head = head
    cfg.tie_word_embeddings = False  # as loaded: the parameter count has the head


def _check_not_loaded(loaded: dict, key, hf_name: str, file: str) -> None:
    """A weight set twice (the same name in two files, or two names of one weight) would
    silently keep whichever came last."""
    if key not in loaded:
        return
    prev_name, prev_file = loaded[key]
    if prev_name == hf_name:
        raise ConfigError(f"weight {hf_name!r} is in both {prev_file} and {file}: which one to use is ambiguous")
    raise ConfigError(
        f"weights {prev_name!r} ({prev_file}) and {hf_name!r} ({file}) are the same weight: "
        "which one to use is ambiguous"
    )


def _hf_name(name: str, shard) -> str:
    """Our parameter name (+ fused shard) -> the checkpoint's name, for messages."""
    parts = name.split(".")
    if parts[0] != "layers":
        return name if name == "lm_head.weight" else f"model.{name}"
    module = next(hf for hf, ours in _LAYER_MODULES.items() if ours == (parts[2], shard))
    return f"model.layers.{parts[1]}.{module}.{parts[3]}"


def rope_inv_freq(cfg: ModelConfig):
    """Rotary inverse frequencies (float32), with Llama-3 or linear scaling applied."""
    import torch  # noqa: PLC0415

    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(medium, smoothed, out)
