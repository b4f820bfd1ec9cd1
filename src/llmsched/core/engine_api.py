"""The contract between a step executor (the real engine, or the virtual GPU of the
simulator) and its callers (the offline `LLM` API, the HTTP server).

An `EngineCore` owns a `ServerState` and a `Scheduler`; `step()` runs one scheduler step
synchronously and returns what each request emitted. It is not thread-safe: one driver
thread calls it. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from .checks import as_int, as_real, check_text
from .errors import ConfigError

# temperatures below this are greedy (as in vLLM): dividing logits by a tiny temperature
# overflows float32 (inf - inf = NaN probabilities)
SAMPLING_EPS = 1e-5
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# the longest stop string: every stop string is looked for after every token, on the
# engine's thread that serves every request, and a stream holds back len(longest) - 1
# characters; real stop strings ("\n\nUser:", "</answer>") are far shorter
MAX_STOP_CHARS = 256
# the engine's limits, here (no torch) for the engine and the command line alike: the most
# intra-op CPU threads (num_threads, --threads; OpenMP crashed the process, with no
# message, at 100,000), the largest KV cache on the CPU in GiB (kv_cache_gb, --kv-cache-gb:
# a pebibyte; 1e308 overflowed the byte count), and the longest profile measurement in
# seconds (calibrate_s and min_s, --calibrate-s and --tables-s: 11.6 days; 1e308
# overflowed the calibration's request count)
MAX_THREADS = 1024
MAX_KV_CACHE_GB = 1 << 20
MAX_MEASURE_S = 1e6
MAX_SEED = 2**64 - 1  # the largest seed torch.Generator.manual_seed takes
# most top logprobs a request may ask for (SamplingParams.logprobs / prompt_logprobs, the
# server's logprobs / top_logprobs): vLLM's default max_logprobs
MAX_LOGPROBS = 20


def check_kv_cache_gb(gb: float, name: str, shown: str) -> None:
    """A KV cache size in GiB (`name` in the message, the value `shown` as given): above 0
    and at most MAX_KV_CACHE_GB (1e308 overflowed the byte count; inf and nan refused)."""
    if not 0 < gb < math.inf:
        raise ConfigError(f"{name} must be a positive finite number, got {shown}")
    if gb > MAX_KV_CACHE_GB:
        raise ConfigError(f"{name} must be at most {MAX_KV_CACHE_GB:,} GiB (a PiB), got {shown}")


@dataclass
class SamplingParams:
    """Per-request generation settings (the OpenAI / vLLM ones we support)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0, as vLLM): no top-k
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # vLLM's extension: the text returned keeps the stop string (or stop token's text) that
    # ended the request, instead of ending before it
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS / stop token ids / stop strings cannot end it before
    # OpenAI / vLLM semantics: presence and frequency penalties are subtracted from the logit
    # of every token already generated (once / per occurrence); a repetition penalty > 1
    # divides positive and multiplies negative logits of prompt and generated tokens;
    # logit_bias adds to a token id's logit before sampling
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    # return the sampled token's logprob and this many top ones (at most MAX_LOGPROBS, 20)
    logprobs: int | None = None
    # return every prompt token's logprob given the tokens before it (the first: None) and
    # this many top alternatives (at most MAX_LOGPROBS), computed during the prompt's prefill
    # (see RequestOutput); with prefix caching such a request computes its whole prompt
    # (reuses no cached block)
    prompt_logprobs: int | None = None
    # vLLM's cache_salt: with prefix caching, only requests with the same salt (or none)
    # share cached blocks (a non-empty string, or None)
    cache_salt: str | None = None

    @property
    def penalized(self) -> bool:
        """Penalties that need the request's token history."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def __post_init__(self):
        # numpy numbers become Python ones; bools are refused
        max_tokens = as_int(self.max_tokens)
        if max_tokens is None or max_tokens < 1:
            raise ConfigError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        self.max_tokens = max_tokens
        min_tokens = as_int(self.min_tokens)
        if min_tokens is None or not 0 <= min_tokens <= self.max_tokens:
            raise ConfigError(
                f"min_tokens must be an integer in 0..max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        self.min_tokens = min_tokens
        if self.seed is not None:
            seed = as_int(self.seed)
            if seed is None or not INT64_MIN <= seed <= INT64_MAX:
                raise ConfigError(f"seed must be an integer in {INT64_MIN}..{INT64_MAX}, got {self.seed!r}")
            self.seed = seed
        temperature = as_real(self.temperature)
        if temperature is None or not 0 <= temperature < math.inf:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        self.temperature = temperature
        top_p = as_real(self.top_p)
        if top_p is None or not 0 < top_p <= 1:
            shown = repr(self.top_p) if top_p is None else top_p
            raise ConfigError(f"top_p must be in (0, 1], got {shown}")
        self.top_p = top_p
        top_k = as_int(self.top_k)
        if top_k is None or top_k < -1:
            raise ConfigError(
                f"top_k must be 0 or -1 (off) or a positive integer, got {self.top_k if top_k is None else top_k!r}"
            )
        self.top_k = top_k or -1  # vLLM's "off" is 0
        if self.stop_token_ids is None:  # vLLM's default
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ConfigError(f"stop_token_ids must be a list of token ids, got {type(self.stop_token_ids).__name__}")
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ConfigError(f"stop_token_ids must be non-negative token ids, got {t!r}")
        for t, b in (self.logit_bias or {}).items():
            # the HTTP server's rule (server/protocol.py): a NaN bias would win every argmax
            if not _is_int(t) or t < 0:
                raise ConfigError(f"logit_bias keys must be non-negative token ids, got {t!r}")
            if as_real(b) is None or not -100 <= b <= 100:
                raise ConfigError(f"logit_bias values must be numbers in -100..100, got {b!r}")
        if self.logit_bias:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.stop is None:  # vLLM's default
            self.stop = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)):
            raise ConfigError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ConfigError(f"stop strings must be non-empty strings, got {s!r}")  # vLLM refuses "" too
            if len(s) > MAX_STOP_CHARS:
                raise ConfigError(f"a stop string may be at most {MAX_STOP_CHARS} characters, got one of {len(s)}")
            check_text(s, "a stop string")  # (one that is not could never match the output's text)
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            v = as_real(getattr(self, name))
            if v is None or not math.isfinite(v):
                raise ConfigError(f"{name} must be a finite number, got {getattr(self, name)!r}")
            setattr(self, name, v)
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str) and self.cache_salt):
            raise ConfigError(f"cache_salt must be a non-empty string or None, got {self.cache_salt!r:.40}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                n = as_int(v)
                if n is None or n < 0:
                    raise ConfigError(f"{name} must be a non-negative integer or None, got {v!r}")
                if n > MAX_LOGPROBS:  # vLLM's max_logprobs, as the server's limit
                    raise ConfigError(f"{name} must be at most {MAX_LOGPROBS} (vLLM's max_logprobs), got {n}")
                setattr(self, name, n)

    @property
    def greedy(self) -> bool:
        """Argmax sampling: temperature 0, or below `SAMPLING_EPS` (as vLLM)."""
        return self.temperature < SAMPLING_EPS


def _is_int(v) -> bool:
    return as_int(v) is not None


# LLM / LLMEngine's max_num_seqs when none is given, on every device: vLLM's LLM class
# default (its CPU build keeps 256 too)
LLM_MAX_NUM_SEQS = 256

# the engine's share of GPU memory (KV cache included) when none is given: vLLM's default
GPU_MEMORY_UTILIZATION = 0.9


def default_max_running(device) -> int:
    """The engine commands' cap on running requests when none is given (generate, serve,
    profile, validate): 256 on CUDA, 64 on CPU. Fewer than the API's LLM_MAX_NUM_SEQS on
    CPU: profile measures decode batches up to it (a CPU profile stays minutes), and the
    other commands run the batches a default profile measured."""
    return LLM_MAX_NUM_SEQS if str(device or "cpu").startswith("cuda") else 64


class DefaultMaxModelLen(int):
    """A max_model_len that a command chose as its default (on CPU: 2048, validate's from
    the trace), not the user: the engine lowers it to the model's longest sequence instead
    of refusing it, as it refuses a user's max_model_len beyond what the model's positions
    cover."""


def is_auto_max_model_len(v) -> bool:
    """vLLM's max_model_len "auto" (or -1): the longest sequence the KV cache holds, at most
    the model's own."""
    return v == "auto" or (not isinstance(v, (str, bool)) and as_int(v) == -1)


def check_request_size(
    prompt_tokens: int,
    max_tokens: int,
    max_model_len: int | None,
    kv_capacity: int | None,
) -> None:
    """Raise ConfigError if a request of this size can never be served.

    The context holds the prompt and the completion: prompt + max_tokens <= max_model_len,
    as OpenAI and vLLM count it. The token a step samples is not fed to the model until the
    next step, so a request's last token needs neither a position nor a KV slot: a request
    of one token (`max_tokens` 1, or 0: scoring a prompt, where the token its prefill samples
    is dropped) fits a prompt of max_model_len tokens (vLLM 0.32 refuses that prompt, and
    so does the HTTP server: `server.backends.Backend.check_prompt`). The KV cache must
    hold prompt + max(max_tokens, 1) - 1 tokens."""
    if prompt_tokens < 1:
        raise ConfigError("the prompt is empty; at least 1 token is needed")
    one = max_tokens in (0, 1)
    if max_model_len is not None and prompt_tokens + (0 if one else max_tokens) > max_model_len:
        raise ConfigError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
            "completion). Please reduce the length of the prompt or completion."
        )
    need = prompt_tokens + max(max_tokens, 1) - 1
    if kv_capacity is not None and need > kv_capacity:
        what = f"{prompt_tokens} prompt + {max_tokens} completion - 1" if max_tokens > 0 else "its prompt"
        raise ConfigError(
            f"The request needs {need} KV-cache tokens ({what}) but the KV cache holds {kv_capacity}: it could "
            "never complete. Please reduce the length of the prompt or completion."
        )


def find_stop(text: str, new_chars: int, stops) -> tuple[int, str] | None:
    """The earliest stop string that the last `new_chars` characters of `text` complete:
    (its index in `text`, the string), or None. The text is then cut at the index, as
    OpenAI and vLLM return it (without the stop string)."""
    best = None
    for stop in stops:
        if not stop:
            continue
        i = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, stop)
    return best


@dataclass
class RequestOutput:
    """What one request emitted in one step (or its end)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    prompt_tokens: int = 0
    output_tokens: int = 0  # emitted so far, including new ones
    error: str | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    # (None: EOS, length, or not finished)
    # with SamplingParams.logprobs: per new token, (its logprob, [(token id, logprob), ...]
    # the top `logprobs` of the model's distribution)
    logprobs: list | None = None
    # with SamplingParams.prompt_logprobs, on the request's first output only: per prompt
    # token, None (the first token) or (its logprob given the tokens before it, [(token id,
    # logprob), ...] the top `prompt_logprobs` there)
    prompt_logprobs: list | None = None
    # on a request's last output: (arrival, first scheduled, first token, finish), seconds
    # on the engine's clock (the phases of vLLM's queue / prefill / decode / inference times)
    timings: tuple | None = None


class EngineCore(Protocol):
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        """Queue a request; raises ConfigError if it can never be served (too long...)."""

    def abort_request(self, request_id: str) -> None:
        """Drop a request wherever it is and free its KV cache."""

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; returns the outputs of the requests that emitted."""

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> dict:
        """waiting, running, kv_used_tokens, kv_capacity_tokens, ... for /metrics."""
