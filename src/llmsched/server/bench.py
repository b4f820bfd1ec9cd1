"""`llmsched bench`: an asyncio load-testing client for OpenAI-compatible servers.

It follows `vllm bench serve` (vllm/benchmarks/serve.py and
vllm/benchmarks/lib/endpoint_request_func.py in the vLLM repository) in what it measures
and how it names it:

- Every request streams (`stream: true`, `stream_options.include_usage: true`); `ignore_eos`
  is sent and `max_tokens` (chat: `max_completion_tokens`) is the intended output length.
- `start_time`: just before the request is sent (after waiting for a `--max-concurrency`
  slot). TTFT = first token event - start. ITL: the gaps between successive token events
  of a request. E2EL (`latency`) = last token event - start. An event is a token event
  when it has non-empty `choices`; a chat event that only carries the role (no content,
  no finish_reason) is not a token (vLLM's client counts it, but vLLM's server sends it
  together with the first token, so the two agree there).
- Output tokens of a request: `usage.completion_tokens` of the final event; without one,
  the number of token events (vLLM re-tokenizes the text instead; we have no tokenizer).
  Input tokens: `usage.prompt_tokens` if sent, else the intended prompt length.
- TPOT of a request = (E2EL - TTFT) / (output tokens - 1), for requests with more than
  one output token; goodput counts TPOT as 0 for the others.
- duration: from the first request's scheduled send to the last response's end.
  request_throughput = completed / duration; output_throughput = total output tokens /
  duration; total_token_throughput = (input + output tokens) / duration.
- Goodput (`--goodput ttft:MS tpot:MS e2el:MS`): requests meeting every given SLO
  (value <= SLO) per second of duration (DistServe's definition, as in vLLM).
- mean/median/std/pNN of ttft, tpot, itl, e2el in ms over the successful requests (ITL over
  all gaps of all successful requests), numpy's default (linear) percentiles; `pNN` keys
  are named like vLLM's (`p99_ttft_ms`, `p99.9_itl_ms`).
- max_output_tokens_per_s: the most tokens received in one one-second bucket from the
  first successful request's start (failed ones move no bucket, as in vLLM);
  max_concurrent_requests: the peak number of requests in flight.
- Arrivals: request_rate inf sends every request at once; otherwise inter-arrival gaps are
  gamma with shape `burstiness` and mean 1/rate (burstiness 1: Poisson). Unlike vLLM, the
  gaps are not rescaled to make the last arrival exactly num_prompts / rate, and the first
  request is sent at time 0. A trace on its own timestamps records its replayed mean rate
  as request_rate (`sent_rate`).

Datasets: `random` (fixed lengths, or integers uniform from floor(L(1-r)) to ceil(L(1+r)),
both included, with `--random-range-ratio r`, as vLLM's random dataset: mean L unless
the lower end is raised to 1; `random_length_range`), `sharegpt` and `arxiv` (prompt/output
length pairs drawn from the shared length CSVs), `trace` (Azure or plain CSV replayed on
its own timestamps, `--time-scale` to speed it up, or rescaled to `--request-rate`), all
through `llmsched.workload`. Prompts are built so the server sees the intended number of
tokens: token-id lists on /v1/completions, and on chat (or `--prompt-format text`) a random
sequence of words that the server's /tokenize counts as one token each (`find_text_units`),
distinct per request so that a prefix cache does not serve them.

Transport: requests go through `http_client.HTTPClient`, a minimal asyncio HTTP/1.1
client (httpx costs about 60 us of Python per streamed chunk, which at 256 streams makes
the client the bottleneck); `--http-client httpx` uses httpx instead. With uvloop
installed the client runs on it. One unmeasured warm-up request is sent first
(`--num-warmups`; vLLM's default is 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..core.checks import as_int, as_real, check_api_key
from ..core.errors import ConfigError, warn
from ..core.paths import atomic_write, check_out_dir, check_out_file
from ..workload import WorkloadSpec, make_trace
from ..workload.arrivals import MAX_REQUESTS
from ..workload.csvio import read_header
from ..workload.lengths import OUTPUT_COLUMNS, PROMPT_COLUMNS
from ..workload.spec import load_trace
from ..workload.trace import mean_rate

MS = 1000.0
METRICS = ("ttft", "tpot", "itl", "e2el")
# the random dataset's longest prompt or output, whatever the server (16,777,216 tokens:
# beyond the longest context of any model served today, 10M); longer than the server's
# max_model_len, requests are sent and fail, as vLLM's client sends them
MAX_BENCH_LEN = 1 << 24
# --token-id-range's HI (exclusive): the ids are drawn as 64-bit integers
MAX_TOKEN_ID_END = 1 << 63
DEFAULT_NUM_PROMPTS = 1000  # vLLM's
# --request-id-prefix: an id is the prefix and the request's index, and servers bound it
# (llmsched serve and vLLM's clients: 256 characters)
MAX_REQUEST_ID_PREFIX = 200
MAX_READY_WAIT_S = 86400.0  # --ready-check-timeout-sec: a day
READY_POLL_S = 0.5  # how often a server that is not up yet is asked again
DEFAULT_TOKEN_ID_RANGE = (1, 100)


# ---- configuration ---------------------------------------------------------------------
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        for pair in str(item).split():
            if ":" not in pair:
                raise ConfigError(f"--goodput expects KEY:MS pairs such as ttft:500, got {pair!r}")
            k, v = pair.split(":", 1)
            k = _goodput_metric(k)
            try:
                ms = float(v)
            except ValueError:
                raise ConfigError(f"--goodput {k} must be a number of milliseconds, got {v!r}") from None
            out[k] = _goodput_ms(k, ms)
    return out


def _goodput_metric(k) -> str:
    key = str(k).strip().lower()
    if key not in GOODPUT_METRICS:
        raise ConfigError(f"--goodput metric must be ttft, tpot or e2el, got {str(k).strip()!r}")
    return key


def _goodput_ms(k: str, v) -> float:
    ms = as_real(v)
    if ms is None:
        raise ConfigError(f"--goodput {k} must be a number of milliseconds, got {v!r}")
    if not ms >= 0:
        raise ConfigError(f"--goodput {k} must be >= 0 ms, got {v}")
    return float(ms)


def check_goodput(goodput) -> dict[str, float]:
    """The goodput SLOs `{metric: ms}` (metric ttft, tpot or e2el) by `--goodput`'s rules,
    with canonical keys; a string is parsed as `--goodput` ("ttft:500 e2el:2000")."""
    if goodput is None:
        return {}
    if isinstance(goodput, str):
        return parse_goodput([goodput])
    if not isinstance(goodput, dict):
        raise ConfigError(f"goodput must be a mapping like {{'ttft': 500}} (milliseconds), got {goodput!r}")
    out: dict[str, float] = {}
    for k, v in goodput.items():
        key = _goodput_metric(k)
        out[key] = _goodput_ms(key, v)
    return out


def parse_percentiles(text: str) -> list[float]:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            p = float(part)
        except ValueError:
            raise ConfigError(f"--metric-percentiles must be numbers, got {part!r}") from None
        out.append(p)
    return check_percentiles(out)


def check_percentiles(percentiles) -> list[float]:
    """Percentiles by `--metric-percentiles`' rules: a non-empty list of numbers in
    (0, 100]; a string is parsed as `--metric-percentiles` ("50,99")."""
    if isinstance(percentiles, str):
        return parse_percentiles(percentiles)
    try:
        items = list(percentiles)
    except TypeError:
        raise ConfigError(f"--metric-percentiles must be a list of numbers, got {percentiles!r}") from None
    out = []
    for v in items:
        p = as_real(v)
        if p is None:
            raise ConfigError(f"--metric-percentiles must be numbers, got {v!r}")
        if not 0 < p <= 100:
            raise ConfigError(f"percentiles must be in (0, 100], got {p:g}")
        out.append(float(p))
    if not out:
        raise ConfigError("--metric-percentiles is empty")
    return out


def parse_metric_names(text: str) -> list[str]:
    return check_metric_names([m for m in str(text).split(",") if m.strip()])


def check_metric_names(names) -> list[str]:
    """Metric names by `--percentile-metrics`' rules (ttft, tpot, itl, e2el), lowercase; a
    string is parsed as `--percentile-metrics` ("ttft,itl")."""
    if isinstance(names, str):
        return parse_metric_names(names)
    try:
        items = list(names)
    except TypeError:
        raise ConfigError(f"--percentile-metrics must be a list of metric names, got {names!r}") from None
    out = []
    for m in items:
        name = str(m).strip().lower()
        if name not in METRICS:
            raise ConfigError(f"--percentile-metrics: unknown metric {name!r} (known: {', '.join(METRICS)})")
        out.append(name)
    if not out:
        # (it printed a table without latency rows, where --metric-percentiles '' is refused)
        raise ConfigError(f"--percentile-metrics is empty (known: {', '.join(METRICS)})")
    return out


# vLLM's --backend names this client speaks; `vllm` (vllm bench serve's default) is its
# name for the completions API
BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions", "vllm": "/v1/completions"}


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str | None = None  # None: the backend's (/v1/completions for openai)
    backend: str | None = None  # vLLM's --backend: openai or openai-chat (None: from the endpoint)
    model: str | None = None
    # vLLM's --served-model-name: the name requests carry, when it is not --model's (which
    # stays the result's model_id, as in vLLM)
    served_model_name: str | None = None
    api_key: str | None = None
    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int | None = None  # None: not given (1000; a shorter trace is replayed whole)
    input_len: int = 1024
    output_len: int = 128
    random_range_ratio: float = 0.0
    sharegpt_output_len: int | None = None
    time_scale: float = 1.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    prompt_format: str = "auto"
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
    ignore_eos: bool = True
    goodput: dict[str, float] = field(default_factory=dict)
    percentile_metrics: list[str] = field(default_factory=lambda: ["ttft", "tpot", "itl"])
    metric_percentiles: list[float] = field(default_factory=lambda: [99.0])
    result_file: str | None = None
    save_detailed: bool = False
    timeout: float = 6 * 3600.0
    quiet: bool = False
    num_warmups: int = 1
    # vLLM's --ready-check-timeout-sec: how long to wait for a server that is not up yet
    # (0: not at all; vLLM waits 600 s by default, we fail at once)
    ready_check_timeout: float = 0.0
    # vLLM's --request-id-prefix: request i is sent with the header X-Request-Id: PREFIX{i}
    # (None: no header; vLLM sends a random prefix by default)
    request_id_prefix: str | None = None
    http_client: str = "raw"
    # vLLM's result-file options: --save-result writes `result_path()` (--result-dir,
    # --result-filename, --label, --metadata KEY=VALUE, --append-result)
    save_result: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    append_result: bool = False
    label: str | None = None
    metadata: dict = field(default_factory=dict)
    # sampling: vLLM's client sends temperature 0 (greedy) unless told otherwise
    temperature: float | None = 0.0
    top_p: float | None = None
    top_k: int | None = None
    extra_body: dict = field(default_factory=dict)

    def __post_init__(self):
        self.base_url = _check_base_url(self.base_url)
        if not (isinstance(self.timeout, (int, float)) and 0 < self.timeout < math.inf):
            raise ConfigError(f"--timeout must be a positive, finite number of seconds, got {self.timeout}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"--backend must be {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.endpoint is None:
            self.endpoint = BACKENDS[self.backend or "openai"]
        if self.backend is not None and self.endpoint != BACKENDS[self.backend]:
            raise ConfigError(
                f"--backend {self.backend} sends to {BACKENDS[self.backend]}, not --endpoint {self.endpoint}"
            )
        if self.endpoint not in BACKENDS.values():
            raise ConfigError(f"--endpoint must be {' or '.join(BACKENDS.values())}, got {self.endpoint!r}")
        if not (self.request_rate > 0):
            raise ConfigError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if not (self.burstiness > 0):
            raise ConfigError(f"--burstiness must be > 0, got {self.burstiness}")
        if not 0 <= self.random_range_ratio < 1:
            raise ConfigError(f"--random-range-ratio must be in [0, 1), got {self.random_range_ratio}")
        if self.dataset_name == "random":
            for flag, length in (("--input-len", self.input_len), ("--output-len", self.output_len)):
                hi = random_length_range(length, self.random_range_ratio)[1]
                if hi > MAX_BENCH_LEN:
                    # before a prompt is built: 2 prompts of 10^9 ids took the memory of the machine
                    ratio = f" with --random-range-ratio {self.random_range_ratio:g}" if self.random_range_ratio else ""
                    raise ConfigError(
                        f"{flag} {length}{ratio} asks for requests of up to {hi:,} tokens; at most "
                        f"{MAX_BENCH_LEN:,} (longer than any model's context)"
                    )
        if not (0 < self.time_scale < math.inf):  # (inf reached the trace reader, which named time_scale)
            raise ConfigError(
                f"--time-scale must be a positive, finite number (k replays the trace k times as fast), "
                f"got {self.time_scale}"
            )
        lo, hi = self.token_id_range
        if not (0 <= lo < hi):
            raise ConfigError(f"--token-id-range must be LO,HI with 0 <= LO < HI, got {lo},{hi}")
        if hi > MAX_TOKEN_ID_END:
            # checked here, not by numpy after the server was contacted (a traceback, exit 1)
            raise ConfigError(
                f"--token-id-range HI must be at most 2**63 ({MAX_TOKEN_ID_END}; ids are 64-bit), got {hi}"
            )
        if self.prompt_format not in ("auto", "ids", "text"):
            raise ConfigError(f"--prompt-format must be auto, ids or text, got {self.prompt_format!r}")
        if self.http_client not in ("raw", "httpx"):
            raise ConfigError(f"--http-client must be raw or httpx, got {self.http_client!r}")
        if not isinstance(self.num_warmups, int) or self.num_warmups < 0:
            raise ConfigError(f"--num-warmups must be >= 0, got {self.num_warmups!r}")
        p = self.request_id_prefix
        if p is not None and (
            not isinstance(p, str) or len(p) > MAX_REQUEST_ID_PREFIX or not (p.isascii() and p.isprintable())
        ):
            raise ConfigError(
                f"--request-id-prefix must be printable ASCII of at most {MAX_REQUEST_ID_PREFIX} characters "
                f"(it goes into the X-Request-Id header), got {p!r:.60}"
            )
        r = as_real(self.ready_check_timeout)
        if r is None or not 0 <= r <= MAX_READY_WAIT_S:
            raise ConfigError(
                f"--ready-check-timeout-sec must be from 0 to {MAX_READY_WAIT_S:g} seconds, "
                f"got {self.ready_check_timeout!r:.40}"
            )
        # (a trace shorter than an asked count is named as --num-prompts; the default is not)
        self.num_prompts_given = self.num_prompts is not None
        if self.num_prompts is None:
            self.num_prompts = DEFAULT_NUM_PROMPTS
        n = as_int(self.num_prompts)
        if n is None or n < 1:
            raise ConfigError(f"--num-prompts must be a positive integer, got {self.num_prompts!r}")
        self.num_prompts = n
        self.goodput = check_goodput(self.goodput)
        self.percentile_metrics = check_metric_names(self.percentile_metrics)
        self.metric_percentiles = check_percentiles(self.metric_percentiles)
        if self.prompt_format == "ids" and self.chat:
            raise ConfigError("token-id prompts need /v1/completions; chat prompts are text")
        self.temperature, self.top_p, self.top_k = check_sampling(self.temperature, self.top_p, self.top_k)

    @property
    def chat(self) -> bool:
        return self.endpoint.endswith("/chat/completions")

    def check_result_path(self) -> None:
        """ConfigError unless the result file can be written where `result_path` puts it:
        checked before the run, which an unwritable path would otherwise lose at its end."""
        import os  # noqa: PLC0415

        if self.result_file:
            check_out_file(self.result_file, "--result-file", make_parents=True)
            check_holds_bench_results(self.result_file, "--result-file", self.append_result)
        elif self.save_result or self.append_result:
            if self.result_dir:
                check_out_dir(self.result_dir, "--result-dir")
            else:
                check_out_dir(".", "the current folder (where --save-result writes)")
            if self.result_filename:
                path = os.path.join(self.result_dir or ".", self.result_filename)
                check_out_file(path, "--result-filename", make_parents=True)
                check_holds_bench_results(path, "--result-filename", self.append_result)

    @property
    def backend_name(self) -> str:
        if self.backend is not None:
            return self.backend
        return "openai-chat" if self.chat else "openai"

    def result_path(self, model_id: str, date: str, rate: float | None = None) -> str | None:
        """Where the result JSON goes: `--result-file`, or with `--save-result` vLLM's name
        `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json` (or `--result-filename`)
        in `--result-dir` (default: the current directory); `rate` (`sent_rate`) defaults
        to `--request-rate`."""
        import os  # noqa: PLC0415

        if self.result_file:
            return self.result_file
        if not (self.save_result or self.append_result):
            return None
        name = self.result_filename
        if not name:
            conc = f"-concurrency{self.max_concurrency}" if self.max_concurrency is not None else ""
            label = self.label or self.backend_name
            # vLLM's spelling of the rate given (`10.0`); a trace's replayed mean rate is
            # measured, so 4 significant digits (not `1.1428571428571428`)
            given = rate is None or rate == self.request_rate
            qps = float(self.request_rate) if given else float(f"{rate:.4g}")
            name = f"{label}-{qps}qps{conc}-{model_id.split('/')[-1]}-{date}.json"
        return os.path.join(self.result_dir, name) if self.result_dir else name

    @classmethod
    def from_args(cls, a) -> BenchConfig:

        if a.base_url is None and not 0 < a.port < 65536:
            raise ConfigError(f"--port must be in 1..65535, got {a.port}")
        base = a.base_url or f"http://{a.host}:{a.port}"
        try:
            lo, hi = (int(x) for x in str(a.token_id_range).split(","))
        except ValueError:
            raise ConfigError(f"--token-id-range must be LO,HI, got {a.token_id_range!r}") from None
        metadata = {}
        for item in a.metadata or []:
            if "=" not in item:
                raise ConfigError(f"--metadata expects KEY=VALUE, got {item!r}")
            k, v = item.split("=", 1)
            metadata[k.strip()] = v.strip()
        extra = {}
        if a.extra_body:
            try:
                extra = json.loads(a.extra_body, parse_constant=_no_constant)
            except ValueError:
                raise ConfigError("--extra-body must be a JSON object") from None
            if not isinstance(extra, dict):
                raise ConfigError("--extra-body must be a JSON object")
            check_extra_body(extra, a)
        cfg = cls(
            base_url=base,
            endpoint=a.endpoint,
            backend=a.backend,
            save_result=a.save_result,
            result_dir=a.result_dir,
            result_filename=a.result_filename,
            append_result=a.append_result,
            label=a.label,
            metadata=metadata,
            temperature=a.temperature,
            top_p=a.top_p,
            top_k=a.top_k,
            extra_body=extra,
            model=a.model,
            served_model_name=a.served_model_name,
            api_key=check_api_key(a.api_key, "OPENAI_API_KEY"),
            dataset_name=a.dataset_name,
            dataset_path=a.dataset_path,
            num_prompts=a.num_prompts,
            input_len=a.input_len,
            output_len=a.output_len,
            random_range_ratio=a.random_range_ratio,
            sharegpt_output_len=a.sharegpt_output_len,
            time_scale=a.time_scale,
            request_rate=a.request_rate,
            burstiness=a.burstiness,
            max_concurrency=a.max_concurrency,
            seed=a.seed,
            prompt_format=a.prompt_format,
            token_id_range=(lo, hi),
            ignore_eos=a.ignore_eos,
            goodput=parse_goodput(a.goodput),
            percentile_metrics=parse_metric_names(a.percentile_metrics),
            metric_percentiles=parse_percentiles(a.metric_percentiles),
            result_file=a.result_file,
            save_detailed=a.save_detailed,
            timeout=a.timeout,
            quiet=a.quiet or a.disable_tqdm,
            num_warmups=a.num_warmups,
            ready_check_timeout=a.ready_check_timeout_sec,
            request_id_prefix=a.request_id_prefix,
            http_client=a.http_client,
        )
        # after the values' own checks (in __post_init__): a bad value is named as such
        # (--burstiness 0 without --request-rate was "does nothing in this run")
        check_moot_options(a)
        if (lo, hi) != DEFAULT_TOKEN_ID_RANGE and (cfg.chat or cfg.prompt_format == "text"):
            why = "chat prompts are text" if cfg.chat else "--prompt-format text sends text prompts"
            raise ConfigError(f"--token-id-range does nothing in this run: {why} (it sets token-id prompts)")
        return cfg


_NO_RESULT = "no result file is written (give --save-result or --result-file)"


def _no_constant(name: str):
    """json.loads' hook for NaN and Infinity, which are no JSON (json.loads takes them, and
    the request body sent with them is refused)."""
    raise ValueError(f"{name} is not JSON")


# the body keys bench itself sets and measures by: one streamed completion per request, of
# the dataset's prompt and length (an `n` of 4 was counted as one choice's tokens)
BENCH_KEYS = {
    "model": "--model",
    "prompt": "the dataset",
    "messages": "the dataset",
    "max_tokens": "the dataset (--output-len, --sharegpt-output-len)",
    "max_completion_tokens": "the dataset (--output-len, --sharegpt-output-len)",
    "stream": "bench (it streams to time every token)",
    "stream_options": "bench (it streams to time every token)",
    "n": "bench (one choice per request)",
    "best_of": "bench (one choice per request)",
    "echo": "bench (the stream must hold the output alone)",
}
# the keys with a flag of their own, and the flag's default (not counted as given)
SAMPLING_FLAGS = {"temperature": 0.0, "top_p": None, "top_k": None, "ignore_eos": True}


def check_extra_body(extra: dict, a) -> None:
    """ConfigError for an `--extra-body` key that bench sets itself (the run measured
    something else than it reported), or that repeats a flag given with another value;
    a sampling key's value is checked as its flag's is."""
    for key in extra:
        if key in BENCH_KEYS:
            raise ConfigError(f"--extra-body: {key!r} is set by {BENCH_KEYS[key]}; leave it out")
    for key, default in SAMPLING_FLAGS.items():
        if key not in extra:
            continue
        flag = "--" + key.replace("_", "-")
        given = getattr(a, key, default)
        if given != default and given != extra[key]:
            raise ConfigError(f"--extra-body: {key!r} is {extra[key]!r} there and {given!r} by {flag}; give it once")
        if key == "ignore_eos":
            if not isinstance(extra[key], bool):
                raise ConfigError(f"--extra-body: 'ignore_eos' must be true or false, got {extra[key]!r:.40}")
        else:
            try:
                check_sampling(**{"temperature": None, "top_p": None, "top_k": None, key: extra[key]})
            except ConfigError as e:
                raise ConfigError(f"--extra-body: {key!r} {str(e).split(' ', 1)[1]}") from None


def check_sampling(temperature, top_p, top_k) -> tuple:
    """`--temperature`, `--top-p` and `--top-k` (None: not sent), checked as the server's
    protocol checks them (server/protocol.py): temperature in [0, 2], top_p in (0, 1],
    top_k -1 or 0 (off) or a positive 64-bit integer. Before, `nan` went out as a body that
    is no JSON (the server's answer named no flag) and the others failed every request."""
    if temperature is not None:
        t = as_real(temperature)
        if t is None or not 0 <= t <= 2:  # (nan fails too)
            raise ConfigError(f"--temperature must be a number from 0 to 2 (0: greedy), got {temperature!r:.40}")
        temperature = float(t)
    if top_p is not None:
        p = as_real(top_p)
        if p is None or not 0 < p <= 1:
            raise ConfigError(f"--top-p must be a number in (0, 1] (1: off), got {top_p!r:.40}")
        top_p = float(p)
    if top_k is not None:
        k = as_int(top_k)
        if k is None or not -1 <= k <= (1 << 63) - 1:
            raise ConfigError(f"--top-k must be -1 or 0 (off) or a positive 64-bit integer, got {top_k!r:.40}")
        top_k = k
    return temperature, top_p, top_k


def check_moot_options(a) -> None:
    """ConfigError for an option that this run would ignore (exit 0 with a flag that did
    nothing): one line naming it and why. An option at its default counts as not given."""
    # '' ran to exit 0 writing nothing, and then let --metadata and --save-detailed pass
    # (the checks below test `is None`, the writer the name's emptiness)
    if a.result_file == "":
        raise ConfigError("--result-file: give a file name, got ''")
    named = a.save_result or a.append_result  # the result file named as vLLM names it
    moot = [
        (a.base_url is not None and a.port != 8000, "--port", "--base-url gives the server's port"),
        (a.base_url is not None and a.host != "127.0.0.1", "--host", "--base-url gives the server's host"),
        (
            a.dataset_name == "random" and a.dataset_path is not None,
            "--dataset-path",
            "the random dataset reads no file",
        ),
        (a.dataset_name != "random" and a.input_len != 1024, "--input-len", "it sets the random dataset's prompts"),
        (
            a.dataset_name != "random" and a.output_len != 128,
            "--output-len",
            "it sets the random dataset's outputs (sharegpt/arxiv/trace: --sharegpt-output-len)",
        ),
        (
            a.dataset_name != "random" and a.random_range_ratio != 0.0,
            "--random-range-ratio",
            "it sets the random dataset's lengths",
        ),
        (
            a.dataset_name == "random" and a.sharegpt_output_len is not None,
            "--sharegpt-output-len",
            "it sets the output lengths of sharegpt, arxiv and trace (random: --output-len)",
        ),
        (a.dataset_name != "trace" and a.time_scale != 1.0, "--time-scale", "it scales a trace's timestamps"),
        (
            a.dataset_name == "trace" and a.time_scale != 1.0 and a.request_rate != math.inf,
            "--time-scale",
            "--request-rate rescales the trace's timestamps to its rate",
        ),
        (
            a.burstiness != 1.0 and (a.dataset_name == "trace" or a.request_rate == math.inf),
            "--burstiness",
            "it shapes the gaps of a finite --request-rate (a trace keeps its own, rescaled to the rate; "
            "inf sends all at once)",
        ),
        (
            a.result_file is not None and (a.result_dir is not None or a.result_filename is not None),
            "--result-dir" if a.result_dir is not None else "--result-filename",
            "--result-file names the result file",
        ),
        (
            not named and a.result_file is None and a.result_dir is not None,
            "--result-dir",
            "it is where --save-result writes",
        ),
        (
            not named and a.result_file is None and a.result_filename is not None,
            "--result-filename",
            "it names --save-result's file",
        ),
        (not named and a.result_file is None and a.label is not None, "--label", _NO_RESULT),
        (not named and a.result_file is None and a.metadata is not None, "--metadata", _NO_RESULT),
        (not named and a.result_file is None and a.save_detailed, "--save-detailed", _NO_RESULT),
    ]
    for given, flag, why in moot:
        if given:
            raise ConfigError(f"{flag} does nothing in this run: {why}")


def _check_base_url(url) -> str:
    """The server URL, checked: http(s), a host, a valid port. A trailing /v1 (the OpenAI
    clients' base URL) is dropped with a warning: the endpoints already start with /v1, and
    `vllm bench serve` too takes the URL without it."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    shown = repr(str(url)[:100])
    try:
        u = urlsplit(str(url))
    except ValueError:  # an unclosed or malformed [IPv6] host
        raise ConfigError(f"--base-url {shown} is not a valid URL (a bracketed IPv6 host must be like [::1])") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"--base-url must be an http:// or https:// URL such as http://127.0.0.1:8000, got {shown}")
    try:
        u.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        raise ConfigError(f"--base-url {shown}: the port must be a number in 1..65535") from None
    if u.port == 0:
        raise ConfigError(f"--base-url {shown}: the port must be a number in 1..65535")
    url = str(url).rstrip("/")
    if u.path.rstrip("/").endswith("/v1"):
        url = url[: -len("/v1")]
        warn(f"--base-url ends in /v1, which the endpoints already start with: using {url}")
    return url


# ---- workload --------------------------------------------------------------------------
@dataclass
class Workload:
    """What to send: send offsets (seconds from the start), prompt and output lengths."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt)


def _arrivals(cfg: BenchConfig, n: int) -> np.ndarray:
    if math.isinf(cfg.request_rate):
        return np.zeros(n)
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(7,)))
    if math.isinf(cfg.burstiness):
        gaps = np.full(n, 1.0 / cfg.request_rate)
    else:
        gaps = rng.gamma(shape=cfg.burstiness, scale=1.0 / (cfg.request_rate * cfg.burstiness), size=n)
    out = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return out


def random_length_range(length: int, ratio: float) -> tuple[int, int]:
    """The `random` dataset's lengths for a target `length` and `--random-range-ratio`:
    integers from floor(L(1-r)) to ceil(L(1+r)), both included, as vLLM's random dataset
    draws them: a range symmetric about L, so their mean is L, unless the lower end is
    raised to 1 (L = 1, r = 0.5: 1..2, a mean of 1.5; L = 4, r = 0.9: 1..8, 4.5); exact on
    the decimal ratio given (100 with r = 0.1: 90..110, where float arithmetic gives a
    ceiling of 111)."""
    r = Fraction(repr(float(ratio)))
    return max(1, math.floor(length * (1 - r))), max(1, math.ceil(length * (1 + r)))


def make_workload(cfg: BenchConfig) -> Workload:
    """The requests of a benchmark, from `llmsched.workload`."""

    n = cfg.num_prompts
    name = cfg.dataset_name
    if name == "random":

        def law(length: int) -> str:
            lo, hi = random_length_range(length, cfg.random_range_ratio)
            return f"const:{length}" if lo == hi else f"uniform:{lo},{hi}"

        t = make_trace(
            WorkloadSpec(
                arrival="deterministic",
                rate=1.0,
                prompt=law(cfg.input_len),
                output=law(cfg.output_len),
                num_requests=n,
                seed=cfg.seed,
            ),
            blocks=False,
        )
        return Workload(_arrivals(cfg, n), t.prompt, t.output)
    if name in ("sharegpt", "arxiv"):
        src = cfg.dataset_path or name
        out = f"const:{cfg.sharegpt_output_len}" if cfg.sharegpt_output_len else f"empirical:{src}"
        draws = n if name == "arxiv" else min(MAX_REQUESTS, 4 * n + 1000)  # sharegpt: some are filtered out
        spec = dict(arrival="deterministic", rate=1.0, prompt=f"empirical:{src}", output=out)
        try:
            _check_length_columns(src, fixed_output=bool(cfg.sharegpt_output_len))
            t = make_trace(WorkloadSpec(**spec, num_requests=draws, seed=cfg.seed), blocks=False)
        except ConfigError as e:
            raise _dataset_error(cfg, e) from None
        prompt, output = t.prompt, t.output
        if name == "sharegpt":
            prompt, output = _sharegpt_pairs(prompt, output, n, fixed_output=bool(cfg.sharegpt_output_len), src=src)
        return Workload(_arrivals(cfg, n), prompt, output)
    if name == "trace":
        if not cfg.dataset_path:
            raise ConfigError("--dataset-name trace needs --dataset-path FILE (Azure or plain CSV, or azure-conv)")
        try:
            have = len(load_trace(cfg.dataset_path, None).arrival_s)  # (cached for make_trace)
        except ConfigError:
            have = None  # make_trace names the problem
        if have is not None and n > have:
            # said here, not by make_trace: it named num_requests=1,000 also when no count was given
            if cfg.num_prompts_given:
                warn(f"--num-prompts {n:,}: trace {cfg.dataset_path} has {have:,} requests, all are replayed")
            n = have
        spec = dict(arrival="trace", trace=cfg.dataset_path, time_scale=cfg.time_scale, num_requests=n, seed=cfg.seed)
        if not math.isinf(cfg.request_rate):  # the trace's own times rescaled to it, as `simulate --rate`
            spec["rate"] = cfg.request_rate
        if cfg.sharegpt_output_len:
            spec["output"] = f"const:{cfg.sharegpt_output_len}"
        t = make_trace(WorkloadSpec(**spec), blocks=False)  # (lengths and times: no block ids)
        return Workload(np.asarray(t.arrival_s - t.arrival_s[0], dtype=np.float64), t.prompt, t.output)
    raise ConfigError(f"unknown dataset {name!r} (known: random, sharegpt, arxiv, trace)")


def _check_length_columns(src: str, fixed_output: bool) -> None:
    """A length file of several columns must name its prompt (and, unless fixed, output)
    column as the shared files do: the length laws' hint (`empirical:PATH:COLUMN`) is not
    something bench takes."""
    path = Path(os.path.expanduser(src))
    if not path.is_file():
        return  # a dataset name, or a missing file: the length law says which
    with open(path, "rb") as f:
        start = f.read(4096).lstrip()
    if start[:1] in (b"[", b"{"):
        # what `vllm bench serve --dataset-path` takes: the csv reader's errors (its JSON
        # shown as column names; a Mooncake trace) told a vLLM user nothing
        raise ConfigError(
            f"{path} is JSON, such as vLLM's ShareGPT conversations; llmsched bench takes token lengths, "
            f"a CSV file with a prompt length column ({', '.join(PROMPT_COLUMNS)}) and an output one "
            f"({', '.join(OUTPUT_COLUMNS)}), and builds prompts of those lengths"
        )
    header = read_header(path)
    if len(header) == 1:  # the one column is every length, as in simulate
        return
    for role, names in (("prompt", PROMPT_COLUMNS), ("output", () if fixed_output else OUTPUT_COLUMNS)):
        if names and not set(names) & set(header):
            raise ConfigError(
                f"{path} has no {role} length column (one of {', '.join(names)}; its columns: {','.join(header)})"
            )


def _dataset_error(cfg: BenchConfig, error: ConfigError) -> ConfigError:
    """A length file's error named by the option that gave the file, not by the length
    law (`prompt: file ... does not exist`) bench built from it."""
    flag = "--dataset-path" if cfg.dataset_path else f"--dataset-name {cfg.dataset_name}"
    role, sep, problem = str(error).partition(": ")
    return ConfigError(f"{flag}: {problem if sep and role in ('prompt', 'output') else error}")


def _sharegpt_pairs(prompt, output, n: int, fixed_output: bool, src: str):
    """The first `n` pairs that vLLM's ShareGPT sampler keeps: prompts of 4 to 1,024
    tokens, outputs of at least 4 (unless `--sharegpt-output-len` fixes them), at most
    2,048 tokens together (longer ones would not fit a 2,048-token context)."""
    keep = (prompt >= 4) & (prompt <= 1024) & (prompt + output <= 2048)
    if not fixed_output:
        keep &= output >= 4
    if keep.sum() < n:
        raise ConfigError(
            f"--dataset-name sharegpt: only {int(keep.sum()):,} of {len(prompt):,} length pairs drawn from {src} "
            f"fit vLLM's ShareGPT limits (prompt 4-1,024 tokens, at most 2,048 with the output), not {n:,}"
        )
    return prompt[keep][:n], output[keep][:n]


TEXT_UNIT = "tok "  # 4 UTF-8 bytes: one token under the sim backend's rule
# words tried as the units of text prompts: those that the server's /tokenize counts as
# exactly one token per repetition are used (byte-level BPEs split "tok " in two). A prompt
# is a random sequence of them, not one word repeated: identical prompts share every block
# of a prefix cache, which then served ~96% of each prompt (vLLM's random dataset draws a
# distinct sequence per request). The 4-byte words are each one token under the sim rule.
TEXT_UNITS = (TEXT_UNIT, " the", " a", " and", " of", " x", " I", " for", " was", " are", " not")
# used when the server cannot count: exact under the sim backend's 4-bytes rule
FALLBACK_UNITS = tuple(u for u in TEXT_UNITS if len(u.encode()) == 4)
CALIBRATION_REPEATS = 64


def text_prompt(units, n: int, rng: np.random.Generator) -> str:
    """A text of `n` words drawn uniformly from `units` (a str: that word repeated)."""
    if isinstance(units, str):
        return units * n
    if len(units) == 1:
        return units[0] * n
    return "".join(np.asarray(units, dtype=object)[rng.integers(0, len(units), size=n)])


async def find_text_units(
    client, headers: dict, model: str, base_url: str = "the server"
) -> tuple[tuple[str, ...], bool]:
    """The words of text prompts: those of TEXT_UNITS that the server tokenizes as one token
    per repetition (POST /tokenize, without special tokens), kept together only if a random
    mix of them is one token a word too. Returns (units, exact); (FALLBACK_UNITS, False) if
    the server has no /tokenize or no unit qualifies; an HTTP 401 is the API-key error
    (llmsched serve guards /tokenize with the key)."""

    async def count(text: str) -> int | None:
        body = json.dumps({"model": model, "prompt": text, "add_special_tokens": False}).encode()
        try:
            async with client.stream("POST", "/tokenize", body, headers) as (status, _, read_all):
                data = await read_all()
        except Exception:  # noqa: BLE001 - no /tokenize: lengths are approximate
            return None
        if status == 401:
            raise api_key_error(base_url, "authorization" in headers)
        if status != 200:
            return None
        try:
            return int(json.loads(data)["count"])
        except (ValueError, KeyError, TypeError):
            return None

    k = CALIBRATION_REPEATS
    units: list[str] = []
    for unit in TEXT_UNITS:
        counts = []
        for text in (unit * k, unit * (k + 1)):
            c = await count(text)
            if c is None:
                return FALLBACK_UNITS, False
            counts.append(c)
        if counts == [k, k + 1]:
            units.append(unit)
    if not units:
        return FALLBACK_UNITS, False
    if len(units) > 1:
        # words that are one token alone may merge with their neighbours
        mixed = [await count(text_prompt(units, n, np.random.default_rng(n))) for n in (k, k + 1)]
        if mixed != [k, k + 1]:
            units = units[:1]
    return tuple(units), True


def build_payloads(cfg: BenchConfig, wl: Workload, model: str, units=FALLBACK_UNITS) -> list[bytes]:
    """One request body per request. Text prompts (chat, `--prompt-format text`) are random
    sequences of `units` (see `find_text_units`; a str: that word repeated), one word a
    token; the same seed gives the same prompts."""
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(11,)))
    lo, hi = cfg.token_id_range
    out = []
    ids_mode = not cfg.chat and cfg.prompt_format in ("auto", "ids")
    sampling = {}
    for key in ("temperature", "top_p", "top_k"):
        v = getattr(cfg, key)
        if v is not None:
            sampling[key] = v
    for p, o in zip(wl.prompt.tolist(), wl.output.tolist()):
        if cfg.chat:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text_prompt(units, p, rng)}],
                "max_completion_tokens": o,
            }
        else:
            prompt = rng.integers(lo, hi, size=p).tolist() if ids_mode else text_prompt(units, p, rng)
            body = {"model": model, "prompt": prompt, "max_tokens": o}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if cfg.ignore_eos:
            body["ignore_eos"] = True
        body.update(sampling)
        body.update(cfg.extra_body)
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


# ---- one request -----------------------------------------------------------------------
class SSEEvents:
    """Splits a server-sent-event stream, fed in arbitrary pieces, into its events (the
    bytes between blank lines). Lines may end in LF, CRLF or CR, as the SSE standard allows
    (sse-starlette ends them in CRLF: split on LF alone, no event was ever found); a CR
    that ends a piece is held back, as it may be the first half of a CRLF."""

    def __init__(self):
        self.buf = b""  # the unfinished event (with line endings made LF)
        self.cr = False  # the last piece ended in CR

    def feed(self, data: bytes) -> list[bytes]:
        if self.cr:
            data = b"\r" + data
        self.cr = data.endswith(b"\r")
        if self.cr:
            data = data[:-1]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events = (self.buf + data).split(b"\n\n")
        self.buf = events.pop()  # (only what is not yet a whole event is kept)
        return events

    def close(self) -> list[bytes]:
        """The stream's end: a CR held back ends its line (with CR line endings, the last
        event's blank line is that CR); an event left without its blank line is dropped,
        as the SSE standard says."""
        if not self.cr:
            return []
        self.cr = False
        return self.feed(b"\n")


async def _sse_events(body_iter):
    """(arrival time, event) of each event of a streamed body (`SSEEvents`)."""
    sse = SSEEvents()
    now = None
    async for now, data in body_iter():
        for event in sse.feed(data):
            yield now, event
    for event in sse.close():
        yield now, event


@dataclass
class RequestResult:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    queue_time: float = 0.0  # the wait for a --max-concurrency slot
    error: str = ""
    status: int = 0
    text: str | None = None  # the generated text (kept with --save-detailed)


async def send_request(
    client, path: str, headers: dict, payload: bytes, prompt_len: int, chat: bool, keep_text: bool = False
) -> RequestResult:
    """POST one streaming request and time its token events (see the module docstring);
    `keep_text`: also collect the generated text."""
    res = RequestResult(prompt_len=prompt_len)
    pieces: list[str] | None = [] if keep_text else None
    st = time.perf_counter()
    res.start_time = st
    last = st
    first = False
    n_events = 0
    usage_tokens = None
    try:
        async with client.stream("POST", path, payload, headers) as (status, body_iter, read_all):
            res.status = status
            if status != 200:
                res.error = _error_text(status, await read_all())
                return res
            events = contextlib.aclosing(_sse_events(body_iter))  # (closed here, not by the GC, on a break)
            async with events as stream:
                async for now, event in stream:
                    event = event.strip()
                    if not event or event.startswith(b":"):
                        continue
                    if event.startswith(b"data:"):
                        event = event[5:].strip()
                    if event == b"[DONE]":
                        break
                    msg = _loads(event)
                    choices = msg.get("choices")
                    if choices:
                        c = choices[0]
                        if chat:
                            d = c.get("delta") or {}
                            if not d.get("content") and c.get("finish_reason") is None and "role" in d:
                                continue  # the role chunk: not a token
                            if pieces is not None:
                                pieces.append(d.get("content") or "")
                        elif pieces is not None:
                            pieces.append(c.get("text") or "")
                        if not first:
                            first = True
                            res.ttft = now - st
                        else:
                            res.itl.append(now - last)
                        last = now
                        n_events += 1
                    elif "error" in msg:
                        err = msg["error"]
                        res.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                        return res
                    u = msg.get("usage")
                    if u:
                        usage_tokens = u.get("completion_tokens")
                        if u.get("prompt_tokens") is not None:
                            res.prompt_len = u["prompt_tokens"]
    except TimeoutError:  # the clients raise it when --timeout runs out (its text is empty)
        res.error = _timeout_text(client)
        return res
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        res.error = f"{type(e).__name__}: {e}"
        return res
    if not first:
        res.error = "Never received a valid chunk to calculate TTFT."
        return res
    res.success = True
    if pieces is not None:
        res.text = "".join(pieces)
    res.latency = last - st
    res.output_tokens = usage_tokens if usage_tokens is not None else n_events
    return res


def _timeout_text(client) -> str:
    timeout = getattr(client, "timeout", None)
    return f"timed out after {timeout:g} s (--timeout)" if timeout is not None else "timed out"


try:
    import orjson as _orjson

    _loads = _orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads


class RawClient:
    """The load path over `http_client.HTTPClient` (the default)."""

    def __init__(self, base_url: str, timeout: float):
        from .http_client import HTTPClient  # noqa: PLC0415

        self.c = HTTPClient(base_url)
        self.timeout = timeout

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, body: bytes, headers: dict):
        async with asyncio.timeout(self.timeout):
            resp = await self.c.request(method, path, body, headers)
            try:
                yield resp.status, resp.iter_body, resp.read
            finally:
                resp.close()

    async def get_json(self, path: str, headers: dict):
        async with self.stream("GET", path, b"", headers) as (status, _, read_all):
            return status, json.loads(await read_all() or b"null")

    async def aclose(self):
        await self.c.aclose()


class HttpxClient:
    """The load path over httpx (`--http-client httpx`)."""

    def __init__(self, base_url: str, timeout: float, connections: int):
        import httpx  # noqa: PLC0415

        self.base = base_url
        self.timeout = timeout
        self.c = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=60.0),
            limits=httpx.Limits(max_connections=connections + 8, max_keepalive_connections=connections + 8),
        )

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, body: bytes, headers: dict):
        import httpx  # noqa: PLC0415

        # --timeout bounds the whole request, as on the raw client (httpx's own timeout
        # bounds each read); httpx's timeouts become TimeoutError, as asyncio's are
        try:
            async with asyncio.timeout(self.timeout):
                async with self.c.stream(method, self.base + path, content=body, headers=headers) as r:

                    async def pieces():
                        async for data in r.aiter_raw():
                            yield time.perf_counter(), data

                    yield r.status_code, pieces, r.aread
        except httpx.TimeoutException as e:
            raise TimeoutError(str(e)) from e

    async def get_json(self, path: str, headers: dict):
        r = await self.c.get(self.base + path, headers=headers)
        return r.status_code, r.json()

    async def aclose(self):
        await self.c.aclose()


def _error_text(status: int, body: bytes) -> str:
    try:
        err = json.loads(body)["error"]
        return f"HTTP {status}: {err.get('message', err)}"
    except Exception:  # noqa: BLE001
        return f"HTTP {status}: {body[:200].decode(errors='replace')}"


# ---- the run ---------------------------------------------------------------------------
def api_key_error(base_url: str, key_sent: bool) -> ConfigError:
    """The one-line error for an HTTP 401 (from /v1/models, the warm-up, or every request)."""
    if key_sent:
        return ConfigError(f"{base_url} rejected the API key (HTTP 401): check --api-key (or $OPENAI_API_KEY)")
    return ConfigError(f"{base_url} wants an API key: give --api-key (or set $OPENAI_API_KEY)")


async def wait_until_ready(client, cfg: BenchConfig, headers: dict) -> None:
    """Wait up to `cfg.ready_check_timeout` seconds for the server to answer GET /v1/models
    with anything but a 5xx (vLLM's ready check, `--ready-check-timeout-sec`): a server
    that is still starting refuses connections, or answers 503. After the time, the
    caller's first request names the problem."""
    deadline = time.monotonic() + cfg.ready_check_timeout
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                status, _ = await client.get_json("/v1/models", headers)
            if status < 500:
                return
        except Exception:  # noqa: BLE001, S110 - not up yet (refused, reset, timed out): try again
            pass
        await asyncio.sleep(min(READY_POLL_S, max(deadline - time.monotonic(), 0)))


async def _first_model(client, base_url: str, headers: dict) -> str:
    status, body = await client.get_json("/v1/models", headers)
    if status == 401:
        raise api_key_error(base_url, "authorization" in headers)
    if status != 200:
        raise ConfigError(f"GET {base_url}/v1/models answered HTTP {status}; give --model")
    data = (body or {}).get("data") or []
    if not data:
        raise ConfigError(f"{base_url}/v1/models lists no model; give --model")
    return data[0]["id"]


# descriptors the client needs besides one per request in flight (stdio, the event loop's,
# the warm-up's and the tokenize calls' connections, imported libraries)
FD_MARGIN = 64


def raise_fd_limit(concurrency: int) -> None:
    """Raise the soft limit on open files to the hard one, and warn once if it is still
    below `concurrency` requests' connections: the requests beyond it failed to connect
    and were counted as the server's failures (1500 at once under `ulimit -n 1024`: 491)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ValueError, OSError):  # (macOS refuses an infinite hard limit: keep the soft one)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < concurrency + FD_MARGIN:
        warn(
            f"this process may open at most {soft:,} files (ulimit -n) but up to {concurrency:,} requests may "
            "run at once: those beyond the limit would fail to connect; raise the limit or give --max-concurrency"
        )


async def benchmark(
    cfg: BenchConfig, wl: Workload | None = None, *, stop_on_signals: bool = False
) -> tuple[list[RequestResult], float, dict]:
    """Send the workload; returns (per-request results, duration in s, run info).
    `stop_on_signals`: SIGINT and SIGTERM during the run stop it and keep what finished
    (`run_bench`, which owns its event loop; the process's handlers are put back after)."""
    wl = wl if wl is not None else make_workload(cfg)
    raise_fd_limit(min(cfg.max_concurrency or len(wl), len(wl)))
    headers = {"content-type": "application/json"}
    if cfg.api_key:
        headers["authorization"] = f"Bearer {cfg.api_key}"
    if cfg.http_client == "httpx":
        client = HttpxClient(cfg.base_url, cfg.timeout, cfg.max_concurrency or len(wl))
    else:
        client = RawClient(cfg.base_url, cfg.timeout)
    try:
        if cfg.ready_check_timeout:
            await wait_until_ready(client, cfg, headers)
        try:
            model = cfg.served_model_name or cfg.model or await _first_model(client, cfg.base_url, headers)
        except TimeoutError:
            raise ConfigError(f"cannot reach {cfg.base_url}: {_timeout_text(client)}") from None
        except OSError as e:
            raise ConfigError(f"cannot reach {cfg.base_url}: {e}") from None
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - httpx errors, bad JSON
            raise ConfigError(f"cannot list the models of {cfg.base_url}: {e}") from None
        units, exact = FALLBACK_UNITS, True
        if cfg.chat or cfg.prompt_format == "text":
            units, exact = await find_text_units(client, headers, model, cfg.base_url)
            if not exact and not cfg.quiet:
                print(
                    "warning: the server's /tokenize gave no one-token word; text prompts are drawn from "
                    f"{', '.join(map(repr, units))} and may not have the intended token counts",
                    file=sys.stderr,
                )
            elif len(units) == 1 and not cfg.quiet:
                print(
                    f"warning: only {units[0]!r} is one token to the server; every text prompt repeats it, "
                    "so a prefix cache serves most of each prompt",
                    file=sys.stderr,
                )
        payloads = build_payloads(cfg, wl, model, units)
        url = cfg.endpoint
        if cfg.num_warmups:
            # not measured: warms the client, the connection and the server's code paths
            # (a cold first request would delay the server's whole first busy period)
            warm = build_payloads(cfg, Workload(np.zeros(1), np.array([8]), np.array([2])), model, units)[0]
            for _ in range(cfg.num_warmups):
                w = await send_request(client, url, headers, warm, 8, cfg.chat)
                if w.status == 401:  # with --model, /v1/models was not asked
                    raise api_key_error(cfg.base_url, "authorization" in headers)
                if not w.success:
                    raise ConfigError(f"the warm-up request to {cfg.base_url}{url} failed: {w.error}")
        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        n = len(wl)
        done = 0
        prompts = wl.prompt.tolist()

        async def one(i: int) -> RequestResult:
            nonlocal done
            # from the dispatch, not the scheduled time: a timer that woke early (uvloop's
            # have 1 ms resolution) made queue times negative
            queued = time.perf_counter()
            h = headers if cfg.request_id_prefix is None else {**headers, "x-request-id": f"{cfg.request_id_prefix}{i}"}
            if sem is None:
                r = await send_request(client, url, h, payloads[i], prompts[i], cfg.chat, cfg.save_detailed)
            else:
                async with sem:
                    r = await send_request(client, url, h, payloads[i], prompts[i], cfg.chat, cfg.save_detailed)
            r.queue_time = r.start_time - queued
            done += 1
            return r

        progress = None
        if not cfg.quiet and sys.stderr.isatty():

            async def report():
                while True:
                    await asyncio.sleep(1.0)
                    print(f"\r{done}/{n} requests done", end="", file=sys.stderr, flush=True)

            progress = asyncio.ensure_future(report())
        tasks = []

        async def send_all():
            for i, at in enumerate(wl.arrival_s.tolist()):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.gather(*tasks)

        t0 = time.perf_counter()
        run = asyncio.ensure_future(send_all())
        # Ctrl-C or SIGTERM mid-run stops it but keeps what finished: the cancelled gather
        # used to take every result with it
        interrupted = None
        loop = asyncio.get_running_loop()

        def stop(name: str) -> None:
            nonlocal interrupted
            interrupted = name
            run.cancel()

        handled = []  # (signal, the process's handler before)
        for sig in ("SIGINT", "SIGTERM") if stop_on_signals else ():
            with contextlib.suppress(AttributeError, NotImplementedError, RuntimeError, ValueError):
                before = signal.getsignal(getattr(signal, sig))
                loop.add_signal_handler(getattr(signal, sig), stop, sig)  # (main thread, POSIX)
                handled.append((getattr(signal, sig), before))
        try:
            await run
        except asyncio.CancelledError:
            if interrupted is None:
                raise
            for t in tasks:  # (those sent before a stop in the dispatch loop's sleep)
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for sig, before in handled:
                loop.remove_signal_handler(sig)  # (which sets the default handler, not the one before)
                if before is not None:
                    signal.signal(sig, before)
        duration = time.perf_counter() - t0
        results = [t.result() if t.done() and not t.cancelled() else None for t in tasks]
        results += [None] * (n - len(results))
        results = [r or RequestResult(prompt_len=prompts[i], error="interrupted") for i, r in enumerate(results)]
        if progress is not None:
            progress.cancel()
            print(f"\r{done}/{n} requests done", file=sys.stderr, flush=True)
    finally:
        await client.aclose()
    info = {"model_id": cfg.model or model, "t0": t0, "text_units": units, "text_unit_exact": exact}
    info["interrupted"] = interrupted
    return results, duration, info


def _dist(name: str, values: list[float], percentiles: list[float], out: dict) -> None:
    arr = np.asarray(values, dtype=np.float64) if values else np.zeros(1)
    out[f"mean_{name}_ms"] = float(np.mean(arr) * MS)
    out[f"median_{name}_ms"] = float(np.median(arr) * MS)
    out[f"std_{name}_ms"] = float(np.std(arr) * MS)
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p) * MS)


def calculate_metrics(
    results: list[RequestResult], duration: float, percentiles: list[float], goodput: dict[str, float] | None = None
) -> dict:
    """Summary metrics, defined as `vllm bench serve` defines them (module docstring).
    `percentiles` and `goodput` follow BenchConfig's rules (a ConfigError otherwise)."""
    percentiles = check_percentiles(percentiles)
    goodput = check_goodput(goodput)
    ok = [r for r in results if r.success]
    ttfts = [r.ttft for r in ok]
    e2els = [r.latency for r in ok]
    itls = [g for r in ok for g in r.itl]
    tpots, all_tpots = [], []
    for r in ok:
        t = 0.0
        if r.output_tokens > 1:
            t = (r.latency - r.ttft) / (r.output_tokens - 1)
            tpots.append(t)
        all_tpots.append(t)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    good = 0
    if goodput:
        slo = {k: v / MS for k, v in goodput.items()}
        for r, tpot in zip(ok, all_tpots):
            vals = {"ttft": r.ttft, "tpot": tpot, "e2el": r.latency}
            if all(vals[k] <= s for k, s in slo.items()):
                good += 1
    dur = max(duration, 1e-9)
    m = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if goodput else None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    }
    peak_tps, peak_conc, peak_instant = 0.0, 0, 0
    if ok:
        t_min = min(r.start_time for r in ok)
        t_max = max(r.start_time + r.latency for r in ok)
        nb = int(math.ceil(t_max - t_min)) + 1
        buckets = np.zeros(nb)
        active = np.zeros(nb + 1)  # requests active at some time of each second (a difference array)
        events = []
        for r in ok:
            t = r.start_time + r.ttft
            times = [t]
            for g in r.itl:
                t += g
                times.append(t)
            idx = (np.asarray(times) - t_min).astype(np.int64)
            idx = idx[(idx >= 0) & (idx < len(buckets))]
            np.add.at(buckets, idx, 1)
            first_s = int(r.start_time - t_min)
            last_s = min(int(r.start_time + r.latency - t_min), nb - 1)
            active[first_s] += 1
            active[last_s + 1] -= 1
            events.append((r.start_time + r.latency, -1))
            events.append((r.start_time, 1))
        events.sort()  # at equal times an end (-1) comes before a start
        c = 0
        for _, d in events:
            c += d
            peak_instant = max(peak_instant, c)
        peak_tps = float(buckets.max())
        peak_conc = int(np.cumsum(active)[:nb].max())
    m["max_output_tokens_per_s"] = peak_tps
    m["max_concurrent_requests"] = peak_conc  # vLLM's: per one-second bucket
    m["max_concurrent_requests_instant"] = peak_instant
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        _dist(name, vals, percentiles, m)
    return m


def sent_rate(cfg: BenchConfig, wl: Workload) -> float:
    """The request rate the requests were sent at: `--request-rate`, but for a trace on its
    own timestamps (no rate given) its replayed mean rate (n - 1) / span, since vLLM's
    "inf" means every request at once; inf for a trace of one timestamp."""
    if cfg.dataset_name == "trace" and math.isinf(cfg.request_rate):
        rate = mean_rate(wl.arrival_s)
        return rate if rate == rate else math.inf  # (nan: no span, all sent at once)
    return cfg.request_rate


def run_bench(cfg: BenchConfig, wl: Workload | None = None) -> dict:
    """Run a benchmark and return (and, with `result_file`, write) its result dict."""
    cfg.check_result_path()
    wl = wl if wl is not None else make_workload(cfg)
    results, duration, info = _run(benchmark(cfg, wl, stop_on_signals=True))
    m = calculate_metrics(results, duration, cfg.metric_percentiles, cfg.goodput)
    text = cfg.chat or cfg.prompt_format == "text"
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    rate = sent_rate(cfg, wl)
    # vLLM's result-file fields first (vllm/benchmarks/serve.py), then ours
    out = {
        "date": date,
        "endpoint_type": cfg.backend_name,
        "backend": cfg.backend_name,
        "label": cfg.label,
        "model_id": info["model_id"],
        "tokenizer_id": None,  # the prompts are sized by the server's own /tokenize
        "num_prompts": len(wl),
        **cfg.metadata,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        **m,
        # vLLM (0.32) writes these per-request lists whatever --save-detailed says, and the
        # inverse real-time factor of its speech benchmarks (0 for text)
        "latencies": [r.latency for r in results],
        "queue_times": [r.queue_time for r in results],
        "rtfx": 0.0,
        "base_url": cfg.base_url,
        "endpoint": cfg.endpoint,
        "dataset_name": cfg.dataset_name,
        "goodput_config": cfg.goodput or None,
        "percentile_metrics": cfg.percentile_metrics,
        "metric_percentiles": cfg.metric_percentiles,
        # text_unit: the first word (the only one before prompts mixed several)
        "text_unit": info["text_units"][0] if text else None,
        "text_units": list(info["text_units"]) if text else None,
        "text_unit_exact": info["text_unit_exact"],
    }
    if info.get("interrupted"):
        out["interrupted"] = True  # (unfinished requests are failures with the error "interrupted")
        out["_signal"] = info["interrupted"]
    errors = [r.error for r in results if not r.success]
    out["errors_sample"] = errors[:10]
    if cfg.save_detailed:
        out.update(
            {
                "input_lens": [r.prompt_len for r in results],
                "output_lens": [r.output_tokens for r in results],
                "ttfts": [r.ttft for r in results],
                "itls": [r.itl for r in results],
                "generated_texts": [r.text or "" for r in results],
                "errors": [r.error for r in results],
                "start_times": [r.start_time - info["t0"] for r in results],
            }
        )
    out["_results"] = results
    # when each request was sent, in s from the first scheduled send (nan: never sent): the
    # client's lateness is this minus the planned arrival (`queue_times` is not: it is only
    # the wait for a --max-concurrency slot); what a replay in the simulator needs
    out["_sent_s"] = [r.start_time - info["t0"] if r.start_time else math.nan for r in results]
    path = cfg.result_path(info["model_id"], date, rate)
    if path:
        import os  # noqa: PLC0415

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_result(path, {k: v for k, v in out.items() if not k.startswith("_")}, cfg.append_result)
        out["result_path"] = path
    return out


# keys that every result of `llmsched bench` and of `vllm bench serve` holds: a JSON object
# with all of them is taken for a bench result
RESULT_KEYS = ("date", "num_prompts", "duration", "completed", "total_input_tokens", "request_throughput")


def holds_bench_results(path) -> bool:
    """Whether the file at `path` holds nothing but bench results: JSON objects with
    `RESULT_KEYS`, one (as a replacing write leaves it) or several one after the other (as
    `--append-result` leaves them, one a line; also after a replaced one). Whitespace only
    counts too (nothing to lose)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError):  # (unreadable, not UTF-8: not ours)
        return False
    decoder = json.JSONDecoder()
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i == n:
            return True
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError:
            return False
        if not (isinstance(obj, dict) and all(k in obj for k in RESULT_KEYS)):
            return False


def check_holds_bench_results(path, flag: str, append: bool) -> None:
    """ConfigError unless the file at `path`, if there is one and it is not empty, holds
    bench results only (`holds_bench_results`): the result would replace it (`--append-result`:
    add a line to it), and another file (`--result-file notes.txt`) was replaced."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    if holds_bench_results(path):
        return
    if append:
        raise ConfigError(
            f"{flag} {str(path)!r} exists and does not hold bench results (one JSON object a line): "
            "give another file, a line would be added to it"
        )
    raise ConfigError(f"{flag} {str(path)!r} exists and is not a bench result: give another file, it would be replaced")


def write_result(path: str, data: dict, append: bool) -> None:
    """The result JSON at `path`: with `append` one line added to what the file holds
    (`--append-result`, also with `--result-file`), else the file replaced. Replacing, it
    is written whole to a temporary file, then renamed (`atomic_write`): a write that stops
    (Ctrl-C) leaves the earlier result as it was, not a truncated file. Appending, the line
    is made first and added by one append-mode write: the file keeps its earlier lines, its
    permissions and links, and writers running at once each add their whole line."""
    if not append:

        def write(tmp) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)

        atomic_write(path, write)
        return
    line = json.dumps(data).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        if os.fstat(fd).st_size:  # (lines are separated, as before: no newline after the last)
            line = b"\n" + line
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _run(coro):
    """asyncio.run, on uvloop when it is installed (a cheaper event loop for the client)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def print_table(res: dict, cfg: BenchConfig, file=None) -> None:
    """The summary as a table (rich), in the layout of vllm bench serve."""
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    t = Table(title="Serving Benchmark Result", show_header=False, title_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("Successful requests", str(res["completed"]))
    t.add_row("Failed requests", str(res["failed"]))
    if cfg.max_concurrency is not None:
        t.add_row("Maximum request concurrency", str(cfg.max_concurrency))
    if not math.isinf(cfg.request_rate):
        t.add_row("Request rate configured (RPS)", f"{cfg.request_rate:.2f}")
    elif isinstance(res.get("request_rate"), float):  # a trace on its own timestamps (`sent_rate`)
        t.add_row("Request rate of the trace (RPS)", f"{res['request_rate']:.2f}")
    t.add_row("Benchmark duration (s)", f"{res['duration']:.2f}")
    t.add_row("Total input tokens", str(res["total_input_tokens"]))
    t.add_row("Total generated tokens", str(res["total_output_tokens"]))
    t.add_row("Request throughput (req/s)", f"{res['request_throughput']:.2f}")
    if res.get("request_goodput") is not None:
        t.add_row("Request goodput (req/s)", f"{res['request_goodput']:.2f}")
    t.add_row("Output token throughput (tok/s)", f"{res['output_throughput']:.2f}")
    t.add_row("Peak output token throughput (tok/s)", f"{res['max_output_tokens_per_s']:.2f}")
    t.add_row("Peak concurrent requests (per 1 s, as vLLM)", str(res["max_concurrent_requests"]))
    t.add_row("Peak concurrent requests (instantaneous)", str(res["max_concurrent_requests_instant"]))
    t.add_row("Total token throughput (tok/s)", f"{res['total_token_throughput']:.2f}")
    for name in cfg.percentile_metrics:
        short, long = HEADERS[name]
        t.add_section()
        t.add_row(f"[bold]{long}[/bold]", "")
        t.add_row(f"Mean {short} (ms)", f"{res[f'mean_{name}_ms']:.2f}")
        t.add_row(f"Median {short} (ms)", f"{res[f'median_{name}_ms']:.2f}")
        for p in cfg.metric_percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            t.add_row(f"P{word} {short} (ms)", f"{res[f'p{word}_{name}_ms']:.2f}")
    Console(file=file).print(t)
    if res.get("result_path"):
        Console(file=file).print(f"result written to {res['result_path']}")
    errs = res.get("errors_sample") or []
    if errs:
        Console(file=file or sys.stderr).print(f"first errors: {errs[:3]}")


__all__ = [
    "BenchConfig",
    "Workload",
    "RequestResult",
    "make_workload",
    "build_payloads",
    "send_request",
    "benchmark",
    "calculate_metrics",
    "run_bench",
    "print_table",
    "parse_goodput",
    "parse_percentiles",
]
