"""What the server runs requests on: the real engine or the virtual GPU.

A `Backend` bundles an `EngineCore` with the tokenizer the server counts prompts with, the
model's name and its length limits. `make_sim_backend` builds a `VirtualEngine` from the
simulator's options; `make_engine_backend` builds `llmsched.engine.LLMEngine` from a model
folder (needs the `engine` extra: torch, safetensors, tokenizers). Both render chat requests
with the tokenizer folder's chat template, or `--chat-template` (`chat_template.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.engine_api import EngineCore, default_max_running, is_auto_max_model_len
from ..core.errors import ConfigError, warn
from ..engine.loader import generation_defaults, generation_stop_ids, max_tokens_cap
from ..engine.tokenizer import tokenizer_file
from ..policies.spec import SchedulerSpec
from .chat_template import ChatTemplates, resolve_template
from .tokenizer import ByteRuleTokenizer, ChatRendering, HFTokenizer, text_bound

DEFAULT_SIM_MAX_MODEL_LEN = 32768


# the policy and limits of a server: the one scheduler spec of the simulator and the engine
SchedulerOptions = SchedulerSpec


@dataclass
class Backend:
    kind: str  # "sim" or "engine"
    core: EngineCore
    tokenizer: Any  # render_chat(messages), encode(text), decode(ids), bytes_per_token
    model_name: str
    root: str
    max_model_len: int | None
    kv_capacity: int | None
    info: dict
    vocab_size: int | None = None  # token ids must be below it (None: any id is fine)
    logits: bool = False  # the model has logits: logprobs and logit_bias can be served
    # SamplingParams fields a request that omits them gets: the model's generation_config.json
    # (engine.loader.generation_defaults)
    sampling_defaults: dict = field(default_factory=dict)
    # the most max_tokens a request gets (engine.loader.max_tokens_cap); None: no such cap
    max_tokens_cap: int | None = None

    def check_prompt(self, prompt_tokens: int) -> None:
        """ConfigError if a prompt of this size leaves no room for a completion token. As
        vLLM 0.32's server, `max_tokens` 0 (scoring the prompt) is no exception: its prefill
        samples a token too."""
        if prompt_tokens < 1:
            raise ConfigError("the prompt is empty; at least 1 token is needed")
        limit = self.max_model_len
        if limit is not None and prompt_tokens >= limit:
            raise ConfigError(
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{prompt_tokens} tokens, which leaves no room for a completion token. Please reduce "
                "the length of the prompt."
            )
        if self.kv_capacity is not None and prompt_tokens > self.kv_capacity:
            raise ConfigError(
                f"The prompt has {prompt_tokens} tokens but the KV cache holds {self.kv_capacity}: it could "
                "never be served. Please reduce the length of the prompt."
            )

    def check_token_ids(self, ids) -> None:
        """ConfigError if a token id is negative or outside the model's vocabulary."""
        if self.vocab_size is None or isinstance(ids, range) or not ids:
            return
        if min(ids) >= 0 and max(ids) < self.vocab_size:  # C loops: cheap for long prompts
            return
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            shown = str(bad) if len(str(bad)) <= 24 else str(bad)[:20] + "..."  # never a client's 100 digits
            raise ConfigError(f"token id {shown} is outside the vocabulary (0..{self.vocab_size - 1})")

    @property
    def max_text_bytes(self) -> int | None:
        """Text longer than this (UTF-8 bytes) is refused before it is tokenized: it cannot
        fit `max_model_len` tokens (see `tokenizer.bytes_per_token`). None: no such limit."""
        bpt = getattr(self.tokenizer, "bytes_per_token", None)
        if self.max_model_len is None or not bpt:
            return None
        return self.max_model_len * bpt

    def room(self, prompt_tokens: int) -> int:
        """The most completion tokens a prompt of this size may ask for."""
        room = 1 << 30
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - prompt_tokens)
        if self.kv_capacity is not None:
            room = min(room, self.kv_capacity - prompt_tokens + 1)
        return room


def chat_templates(tokenizer_file: Path, override: str | None) -> ChatTemplates | None:
    """The chat templates of the tokenizer at `tokenizer_file` (its folder's, or the
    `--chat-template` `override`); a warning when the folder's cannot be used."""
    templates, note = resolve_template(tokenizer_file.parent, override)
    if note:
        warn(note)
    return templates


def _template_info(tok) -> dict:
    templates = getattr(tok, "templates", None)
    if templates is None:
        return {"chat_template": None}
    info = {"chat_template": templates.source}
    if templates.tool_use is not None:
        info["chat_template_tool_use"] = templates.tool_use.source
    return info


def served_name(given: str | None, default: str) -> str:
    """The model name clients use: `given` (--served-model-name), else `default`. An empty
    name is refused rather than replaced, so that clients asking for it get no 404."""
    if given is None:
        return default
    if not isinstance(given, str) or not given.strip():
        raise ConfigError(f"--served-model-name must be a non-empty name, got {given!r}")
    return given


def make_sim_backend(
    opts: SchedulerOptions | None = None,
    cost_model: str = "profile:h200-llama-3-8b",
    *,
    max_model_len: int | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    served_model_name: str | None = None,
    realtime: bool = True,
    max_debt_s: float = 0.05,
) -> Backend:
    """A virtual GPU running `opts`' policy, timed by `cost_model` (a spec string). With a
    `tokenizer` (a folder with tokenizer.json, or the file), chat requests are rendered as on
    the engine backend: with its folder's chat template, or `chat_template` (a file or the
    template itself)."""
    if tokenizer:
        tok = HFTokenizer(tokenizer)
        tok.templates = chat_templates(tok.file, chat_template)
    elif chat_template is not None:
        raise ConfigError(
            "--chat-template needs --tokenizer on the sim backend (without one, chat messages are counted "
            "by the bytes of their contents)"
        )
    from ..sim.virtual import VirtualEngine  # noqa: PLC0415

    opts = opts or SchedulerOptions()
    if not tokenizer:  # ids from the text's bytes only where they matter: the prefix cache's blocks
        tok = ByteRuleTokenizer(content_ids=bool(opts.prefix_caching))
    sched = opts.build()
    kv = opts.kv_capacity
    if is_auto_max_model_len(max_model_len):  # the longest the KV cache holds (no model to cap it)
        max_model_len = None if kv is None else kv + 1
    if max_model_len is None:
        max_model_len = DEFAULT_SIM_MAX_MODEL_LEN
        if kv is not None:
            max_model_len = min(max_model_len, kv + 1)
    elif kv is not None and kv + 1 < max_model_len:
        # as the engine backend: a request can reach what the KV cache holds (prompt +
        # output - 1 tokens), and /v1/models must not promise more
        warn(
            f"the KV cache holds {kv:,} tokens (--kv-capacity), so a request may reach {kv + 1:,} of the "
            f"--max-model-len {max_model_len:,}: serving a context of {kv + 1:,}"
        )
        max_model_len = kv + 1
    core = VirtualEngine(sched, cost_model, max_model_len=max_model_len, realtime=realtime, max_debt_s=max_debt_s)
    name = served_name(served_model_name, "llmsched-sim")
    info = {
        "backend": "sim",
        "scheduler": sched.describe(),
        "cost_model": core.cost.describe(),
        "tokenizer": tok.name,
        "max_model_len": max_model_len,
        **_template_info(tok),
    }
    # a real tokenizer names its vocabulary: ids outside it are refused as on the engine
    vocab_size = getattr(tok, "vocab_size", None)
    return Backend("sim", core, tok, name, name, max_model_len, opts.kv_capacity, info, vocab_size=vocab_size)


class _EngineTokenizer(ChatRendering):
    """The engine's tokenizer, with the server's chat rendering (`ChatRendering`). Encodes
    and decodes with the `tokenizers` batch calls, which release the GIL (the engine's own
    calls do not), and gives the same ids as the engine's `Tokenizer.encode` (special tokens
    added)."""

    cheap = False

    def __init__(self, tok, templates: ChatTemplates | None = None):
        self._tok = tok
        self._hf = getattr(tok, "tok", None)
        if not (hasattr(self._hf, "encode_batch") and hasattr(self._hf, "decode_batch")):
            self._hf = None
        self.name = "model"
        self.bytes_per_token, self.text_bound_exact = text_bound(self._hf)
        self.templates = templates

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is not None:
            return self._hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens)

    def decode(self, ids) -> str:
        if self._hf is not None:
            return self._hf.decode_batch([list(ids)], skip_special_tokens=True)[0]
        return self._tok.decode(ids)


class _NoTokenizer:
    name = "none"
    cheap = True
    bytes_per_token = None
    text_bound_exact = False

    def _fail(self, *_, **__):
        raise ConfigError("this model has no tokenizer: send the prompt as token ids to /v1/completions")

    encode = encode_chat = decode = chat_text = render_chat = _fail


def make_engine_backend(
    model: str,
    opts: SchedulerOptions | None = None,
    *,
    served_model_name: str | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    generation_config: str = "auto",
    override_generation_config: dict | None = None,
    **engine_kwargs,
) -> Backend:
    """`llmsched.engine.LLMEngine` on the model folder `model`. Chat requests are rendered
    with `chat_template` (`--chat-template`: a file or the template itself) if given, else
    with the tokenizer folder's template if it has one (see `chat_template.py`). Requests
    get the sampling defaults of the folder's generation_config.json (`generation_config`
    auto, as vLLM's server), of the one in the folder `generation_config` names, or none
    (vllm), with `override_generation_config`'s on top (vLLM's `--override-generation-config`)."""
    if not Path(model).exists():
        raise ConfigError(f"model folder {model} does not exist")
    name = served_name(served_model_name, Path(model).name)  # checked before the model loads
    tokenizer = tokenizer or None
    # read before the model loads: a bad template (or --tokenizer) is found at once
    tok_file = tokenizer_file(tokenizer or model)
    templates = None
    if tok_file.is_file():
        templates = chat_templates(tok_file, chat_template)
    elif tokenizer is not None:
        raise ConfigError(f"no tokenizer.json found at {tokenizer}")
    elif chat_template is not None:
        raise ConfigError("--chat-template needs a tokenizer, and this model has none (no tokenizer.json)")
    sampling_defaults = generation_defaults(model, generation_config, override_generation_config)
    cap = max_tokens_cap(generation_config, override_generation_config, sampling_defaults)
    stop_ids = generation_stop_ids(model, generation_config)
    from .. import engine as _engine  # noqa: PLC0415 - the engine needs torch

    opts = opts or SchedulerOptions()
    if opts.kv_capacity is not None:
        raise ConfigError(
            "--kv-capacity is for the sim backend; the engine sizes its KV cache "
            "from memory (--kv-cache-gb, --num-blocks)"
        )
    kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
    if opts.max_running is None:
        opts = opts.replace(max_running=default_max_running(kwargs.get("device")))
    # the engine itself takes --tokenizer (as vLLM's does): prompts get the special tokens
    # its post-processor adds (BOS), and output text and stop strings use it too
    core = _engine.LLMEngine(model, scheduler=opts, tokenizer=tokenizer, **kwargs)
    core.config_stop_ids = frozenset(stop_ids)  # (as vLLM: each request's stop_token_ids, unless ignore_eos)
    has_tokenizer = getattr(core, "tokenizer", None) is not None
    tok = _EngineTokenizer(core.tokenizer, templates) if has_tokenizer else _NoTokenizer()
    max_len = getattr(core, "max_model_len", None)
    kv = getattr(core, "kv_capacity", None)
    if max_len is not None and kv is not None:
        # what a request can reach is what the KV cache holds (prompt + output - 1 tokens),
        # as the sim backend says: /v1/models must not promise more
        if kv + 1 < max_len:
            # the flag that sized this cache (--kv-cache-gb is CPU's, and --num-blocks overrides it)
            knob = getattr(getattr(core, "runner", None), "kv_size_knob", ("kv_cache_gb", "--kv-cache-gb"))[1]
            warn(
                f"the KV cache holds {kv:,} tokens (one block per running sequence is held back), so a "
                f"request may reach {kv + 1:,} of the model's {max_len:,}: raise {knob} or lower --max-running"
            )
        max_len = min(max_len, kv + 1)
    info = {
        "backend": "engine",
        "model": str(model),
        "scheduler": core.scheduler.describe(),
        "cost_model": core.cost_model.describe() if core.cost_model is not None else None,
        "max_model_len": max_len,
        "sampling_defaults": sampling_defaults,
        "max_tokens_cap": cap,
        **_template_info(tok),
    }
    cfg = getattr(core, "config", None)
    return Backend(
        "engine",
        core,
        tok,
        name,
        str(model),
        max_len,
        kv,
        info,
        vocab_size=getattr(cfg, "vocab_size", None),
        logits=True,
        sampling_defaults=sampling_defaults,
        max_tokens_cap=cap,
    )
