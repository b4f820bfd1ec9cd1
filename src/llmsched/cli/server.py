"""`llmsched serve` and `llmsched bench`: thin wrappers over `serve()` and `run_bench()`.

FastAPI, uvicorn and httpx are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..core.checks import check_api_key
from ..core.errors import ConfigError
from ..core.request import MAX_SECONDS
from ..engine.loader import generation_defaults
from .common import add_scheduler_args, max_model_len_arg, positive_int, scheduler_spec
from .engine import add_device_args, add_generation_config_arg, check_kv_cache_gb, generation_config_args

# --sim-max-debt-ms' largest value: the project's clock range
MAX_DEBT_MS = MAX_SECONDS * 1000


# ---- request limits (issue #13): --max-body-bytes, --max-header-bytes, --read-timeout ----
def add_limit_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("request limits")
    g.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help="largest request body in bytes; larger ones get 413 without being read "
        "(default: what the largest request the context can serve needs as JSON, "
        "6 x the text bound + 32 B per token + 1 MiB, at most 16 MiB; see /version)",
    )
    g.add_argument(
        "--max-header-bytes",
        type=positive_int,
        default=64 * 1024,
        help="largest request line + headers in bytes; larger get 431 (default: 65536)",
    )
    g.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to send a request's headers, and then its body; "
        "slower ones get 408 and are disconnected (default: 30)",
    )


def limit_config(args) -> dict:
    """The ServerConfig fields of add_limit_args' options."""
    return {
        "max_body_bytes": args.max_body_bytes,
        "max_header_bytes": args.max_header_bytes,
        "read_timeout": args.read_timeout,
    }


# ---- end of request limits ----


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API on the engine or a virtual GPU",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics. "
        "--model DIR runs the PyTorch engine; --backend sim runs a virtual GPU that "
        "executes the policy's plans in real time, timed by a cost model.",
    )
    p.add_argument(
        "--backend",
        choices=("sim", "engine"),
        default=None,
        help="sim: virtual GPU; engine: the PyTorch engine (default: engine with --model, else sim)",
    )
    p.add_argument("model_dir", nargs="?", metavar="MODEL", help="model folder, as `vllm serve MODEL` takes it")
    p.add_argument("--model", default=None, help="model folder (Hugging Face format) for the engine backend")
    p.add_argument(
        "--served-model-name", default=None, help="model name clients use (default: the folder name, or llmsched-sim)"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="folder with tokenizer.json: the sim's prompt token counts, chat rendered with its chat "
        "template as on the engine (default: 4 UTF-8 bytes per token); the engine's tokenizer instead "
        "of the model folder's",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_STRING",
        help="Jinja chat template for /v1/chat/completions (engine, or sim with --tokenizer), a file or "
        "the template itself, as vLLM's option; overrides the tokenizer folder's (chat_template.jinja or "
        "tokenizer_config.json's chat_template), which is applied by default",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1, /tokenize and /detokenize (default: "
        "$LLMSCHED_API_KEY if set; /health, /metrics and /version stay open)",
    )
    p.add_argument(
        "--max-model-len",
        type=max_model_len_arg,
        default=None,
        help="longest prompt + completion; auto (or -1): the longest the KV cache holds, on the engine at most the "
        "model's (sim default: 32768, or the KV capacity + 1; engine default: the model's)",
    )
    add_scheduler_args(p, defaults=True, block_size=False)
    g = p.add_argument_group("virtual GPU (--backend sim)")
    g.add_argument(
        "--cost-model",
        default=None,
        help="step cost model: paper[:c=..,a=..,b0=..], linear:c=..,a=.., const:MS, "
        "profile[:NAME|PATH] (default: profile:h200-llama-3-8b, as the simulator); with --backend engine it "
        "times nothing and is bound to the policy (--policy adaptive and --admission twp or dynamicbatch read "
        "step times from it; "
        "default: none, adaptive then plans with paper)",
    )
    g.add_argument(
        "--sim-max-debt-ms",
        type=float,
        default=None,
        help="how far (ms) the virtual GPU may fall behind the cost model's schedule and "
        "still catch up (host hiccups); 0: never catch up, so the host's time between steps adds to "
        "every step (default: 50)",
    )
    g = p.add_argument_group("engine (--model)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    # the defaults are LLMEngine's (None here: the sim backend refuses engine options given)
    g.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on CUDA)"
    )
    g.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="KV-cache memory on CPU in GiB (default: 1, capped at what --max-running can use; "
        "not used on CUDA, where the cache takes what --gpu-memory-utilization of the GPU's memory leaves)",
    )
    g.add_argument(
        "--num-blocks",
        type=positive_int,
        default=None,
        help="KV-cache blocks (default: sized from the memory, as --kv-cache-gb says)",
    )
    g.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help="KV-cache block size in tokens, the prefix cache's unit (default: 16; the sim backend takes it "
        "with --prefix-caching)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed of the engine: the sampling of requests that give no seed (default: 0)",
    )
    add_device_args(g, unset=True)
    add_generation_config_arg(g)
    g = p.add_argument_group("overload and shutdown")
    g.add_argument(
        "--max-queued-requests",
        type=positive_int,
        default=None,
        help="refuse (429) a request when this many accepted requests have no first token yet (default: no limit)",
    )
    g.add_argument(
        "--max-queued-tokens",
        type=positive_int,
        default=None,
        help="refuse (429) a request when the queued prompt tokens would exceed this (default: no limit)",
    )
    g.add_argument(
        "--default-max-tokens",
        type=positive_int,
        default=None,
        help="max_tokens when a request gives none, cut to the room the prompt leaves "
        "(default: 16 for completions; for chat the model's max_new_tokens, else the context left)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGINT/SIGTERM, seconds to let running requests finish (default: 30)",
    )
    add_limit_args(p)
    p.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="log level (default: warning)",
    )
    p.add_argument(
        "--metrics-prefix",
        choices=("llmsched", "vllm"),
        default="llmsched",
        help="prefix of the /metrics names: llmsched (default) or vllm, for dashboards made for vLLM",
    )
    p.set_defaults(func=serve_main)
    return p


def build_backend(args):
    from ..server.backends import make_engine_backend, make_sim_backend  # noqa: PLC0415 - FastAPI

    if args.model_dir:
        if args.model and args.model != args.model_dir:
            raise ConfigError(f"two models given: {args.model_dir} and --model {args.model}")
        args.model = args.model_dir
    backend = args.backend or ("engine" if args.model else "sim")
    opts = scheduler_spec(args)
    engine_only = [
        f"--{k.replace('_', '-')}"
        for k in (
            "device",
            "dtype",
            "kv_cache_gb",
            "num_blocks",
            "block_size",
            "seed",
            "gpu_memory_utilization",
            "enforce_eager",
            "threads",
            "generation_config",
            "override_generation_config",
        )
        if getattr(args, k) is not None and not (k == "block_size" and args.prefix_caching)
    ]
    if backend == "sim" and engine_only:
        raise ConfigError(f"{engine_only[0]} is an engine option; the sim backend (a virtual GPU) does not use it")
    if backend == "engine" and args.sim_max_debt_ms is not None:
        raise ConfigError("--sim-max-debt-ms paces the sim backend's virtual GPU; the engine backend does not use it")
    check_kv_cache_gb(args.kv_cache_gb)
    if args.kv_cache_gb is not None and args.num_blocks is not None:
        raise ConfigError("give the KV cache's size once: --num-blocks or --kv-cache-gb (--num-blocks overrides it)")
    if backend == "engine":
        if not args.model:
            raise ConfigError("the engine backend needs --model DIR (or use --backend sim)")
        gen_args = generation_config_args(args)
        if args.generation_config is not None or args.override_generation_config is not None:
            # checked here, where the error names the command line's flag, not the API's
            # keyword; without them make_engine_backend reads --chat-template first
            generation_defaults(args.model, **gen_args)
        return make_engine_backend(
            args.model,
            opts,
            served_model_name=args.served_model_name,
            tokenizer=args.tokenizer,
            chat_template=args.chat_template,
            device=args.device,
            dtype=args.dtype,
            kv_cache_gb=args.kv_cache_gb,
            num_blocks=args.num_blocks,
            block_size=args.block_size,
            seed=args.seed,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enforce_eager=args.enforce_eager,
            num_threads=args.threads,
            max_model_len=args.max_model_len,
            cost_model=args.cost_model,
            generation_config=gen_args["generation_config"],
            override_generation_config=gen_args["override"],
        )
    if args.model:
        raise ConfigError("--model is for the engine backend; the sim backend takes --served-model-name")
    if args.sim_max_debt_ms is None:
        args.sim_max_debt_ms = 50.0
    if not args.sim_max_debt_ms >= 0:
        raise ConfigError(f"--sim-max-debt-ms must be >= 0, got {args.sim_max_debt_ms}")
    if args.sim_max_debt_ms > MAX_DEBT_MS:  # (inf and 1e308 overflowed the ns clock)
        raise ConfigError(
            f"--sim-max-debt-ms must be at most {MAX_DEBT_MS:g} ms (1e9 s, the clock's range), "
            f"got {args.sim_max_debt_ms:g}"
        )
    return make_sim_backend(
        opts,
        args.cost_model or "profile:h200-llama-3-8b",
        max_model_len=args.max_model_len,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        served_model_name=args.served_model_name,
        max_debt_s=args.sim_max_debt_ms / 1e3,
    )


def serve_main(args) -> int:
    from ..server.app import ServerConfig  # noqa: PLC0415
    from ..server.serving import bind_socket, serve  # noqa: PLC0415

    if not args.host.strip():
        # '' binds every interface and printed the unusable http://:PORT/v1
        raise ConfigError("--host must name an address (0.0.0.0 for every interface), got ''")
    cfg = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=check_api_key(args.api_key, "LLMSCHED_API_KEY"),
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens,
        default_max_tokens=args.default_max_tokens,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
        metrics_prefix=args.metrics_prefix,
        **limit_config(args),
    )
    # bound first: a bad --host or a busy --port is found before a model is loaded
    sock = bind_socket(cfg.host, cfg.port)
    try:
        backend = build_backend(args)
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    print(
        f"llmsched serve: {backend.kind} backend, model {backend.model_name!r}, http://{cfg.host}:{port}/v1",
        file=sys.stderr,
        flush=True,
    )
    if backend.sampling_defaults:
        from ..engine.loader import defaults_note  # noqa: PLC0415

        gen_args = generation_config_args(args)
        note = defaults_note(
            backend.root,
            gen_args["generation_config"],
            gen_args["override"],
            backend.sampling_defaults,
            "the fields a request sets",
        )
        print(f"llmsched serve: {note}", file=sys.stderr, flush=True)
    serve(backend, cfg, sock)
    return 0


# ---- bench -----------------------------------------------------------------------------
def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint (metrics of vllm bench serve)",
        description="Send a workload to /v1/completions or /v1/chat/completions and report TTFT, "
        "TPOT, ITL, E2EL, throughput and goodput, defined as in `vllm bench serve`.",
    )
    p.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1", help="server host (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="server port (default: 8000)")
    p.add_argument(
        "--endpoint",
        default=None,
        choices=("/v1/completions", "/v1/chat/completions"),
        help="API endpoint (default: the --backend's, /v1/completions)",
    )
    p.add_argument(
        "--backend",
        default=None,
        choices=("openai", "openai-chat", "vllm"),
        help="as vllm bench serve: openai or vllm (/v1/completions), openai-chat (/v1/chat/completions); "
        "the result's backend and default label (default: openai, or openai-chat with --endpoint "
        "/v1/chat/completions)",
    )
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name requests carry, as vllm bench serve: when the server's differs from --model, "
        "which still names the result (model_id) (default: --model's)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted as vllm bench serve takes it (for its tokenizer), and not needed (a note says so)",
    )
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY if set)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="accepted as vllm bench serve takes it, and not needed: prompt lengths are set with "
        "the server's /tokenize (a note says so)",
    )
    g = p.add_argument_group("workload")
    g.add_argument(
        "--dataset-name",
        default="random",
        choices=("random", "sharegpt", "arxiv", "trace"),
        help="random lengths; ShareGPT/arXiv length files; or a trace replayed with its "
        "timestamps (Azure or plain CSV) (default: random)",
    )
    g.add_argument(
        "--dataset-path",
        default=None,
        help="length CSV or trace file (default for sharegpt/arxiv: the shared copy; "
        "trace: required, or the name azure-conv)",
    )
    g.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="requests to send (default: 1000; a shorter --dataset-name trace is replayed whole)",
    )
    g.add_argument(
        "--input-len",
        "--random-input-len",
        dest="input_len",
        type=positive_int,
        default=1024,
        help="random: prompt tokens (default: 1024)",
    )
    g.add_argument(
        "--output-len",
        "--random-output-len",
        dest="output_len",
        type=positive_int,
        default=128,
        help="random: output tokens (default: 128)",
    )
    g.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform from floor(L*(1-r)) to ceil(L*(1+r)), both included, at least 1 "
        "(default: 0, fixed)",
    )
    g.add_argument(
        "--sharegpt-output-len",
        type=positive_int,
        default=None,
        help="sharegpt/arxiv/trace: override every output length",
    )
    g.add_argument(
        "--time-scale", type=float, default=1.0, help="trace: divide the trace's arrival times by this (default: 1)"
    )
    g.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests per second; inf (the default) sends all at once (trace: its own timestamps, rescaled to a rate)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the inter-arrival times: 1 Poisson (default), <1 burstier, >1 smoother",
    )
    g.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="at most this many requests in flight (default: no limit)",
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    g.add_argument(
        "--prompt-format",
        choices=("auto", "ids", "text"),
        default="auto",
        help="completions prompts as token-id lists (auto, the default) or text (4 bytes per token)",
    )
    g.add_argument(
        "--token-id-range",
        default="1,100",
        help="LO,HI: token ids of id prompts are drawn from [LO, HI) (default: 1,100)",
    )
    g.add_argument(
        "--num-warmups", type=int, default=1, help="unmeasured requests sent first, one at a time (default: 1)"
    )
    g.add_argument(
        "--request-id-prefix",
        default=None,
        metavar="PREFIX",
        help="send request i with the header X-Request-Id: PREFIXi, as vllm bench serve (which sends a random "
        "prefix by default) (default: no header)",
    )
    g.add_argument(
        "--ready-check-timeout-sec",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a server that is still starting (refusing connections, or answering "
        "/v1/models with a 5xx), as vllm bench serve (whose default is 600) (default: 0, fail at once)",
    )
    g.add_argument(
        "--ignore-eos", dest="ignore_eos", action="store_true", default=True, help="send ignore_eos: true (the default)"
    )
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="do not send ignore_eos: true")
    g.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature sent (default: 0, greedy, as vLLM's)"
    )
    g.add_argument("--top-p", type=float, default=None, help="top_p sent (default: none)")
    g.add_argument("--top-k", type=int, default=None, help="top_k sent (default: none)")
    g.add_argument("--extra-body", default=None, help="a JSON object merged into every request body")
    g = p.add_argument_group("metrics")
    g.add_argument(
        "--goodput",
        nargs="+",
        action="extend",  # a repeated --goodput adds to the earlier SLOs (it replaced them)
        default=None,
        metavar="KEY:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000 (milliseconds)",
    )
    g.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help="metrics to report percentiles of: ttft,tpot,itl,e2el (default: ttft,tpot,itl)",
    )
    g.add_argument("--metric-percentiles", default="99", help="percentiles, e.g. 50,90,99 (default: 99)")
    g.add_argument("--result-file", default=None, help="write the results as JSON here")
    g.add_argument(
        "--save-result",
        action="store_true",
        help="write the results as JSON, named as vllm bench serve names them "
        "({label}-{rate}qps[-concurrencyN]-{model}-{date}.json)",
    )
    g.add_argument("--result-dir", default=None, help="folder for --save-result (default: the current one)")
    g.add_argument("--result-filename", default=None, help="file name for --save-result")
    g.add_argument("--append-result", action="store_true", help="append the result to the file (one JSON a line)")
    g.add_argument("--label", default=None, help="result label (default: the backend, openai or openai-chat)")
    g.add_argument(
        "--metadata", nargs="*", action="extend", default=None, metavar="KEY=VALUE", help="saved in the result file"
    )
    g.add_argument(
        "--save-detailed", action="store_true", help="include per-request values (ttfts, itls, ...) in the result file"
    )
    g.add_argument("--timeout", type=float, default=6 * 3600, help="per-request timeout in seconds (default 6 h)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--disable-tqdm", action="store_true", help="the same as --quiet (vllm bench serve's name)")
    g.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: a minimal asyncio HTTP/1.1 client (default; cheap per token); httpx",
    )
    p.set_defaults(func=bench_main)
    return p


def bench_main(args) -> int:
    from ..server.bench import BenchConfig, api_key_error, print_table, run_bench  # noqa: PLC0415

    cfg = BenchConfig.from_args(args)
    for flag, given in (("--tokenizer", args.tokenizer), ("--trust-remote-code", args.trust_remote_code)):
        if given:
            print(
                f"note: {flag} is not used: llmsched bench loads no tokenizer, it sizes its prompts with the "
                "server's /tokenize",
                file=sys.stderr,
            )
    result = run_bench(cfg)
    if result["num_prompts"] and all(r.status == 401 for r in result["_results"]):
        # --num-warmups 0 with --model: no request before these asked for the key (the
        # result file, if any, is written; the table of 401s is not printed)
        raise api_key_error(cfg.base_url, bool(cfg.api_key))
    print_table(result, cfg)
    if result.get("interrupted"):
        unfinished = sum(r.error == "interrupted" for r in result["_results"])
        print(
            f"llmsched bench: {result['_signal']}: stopped with {unfinished} of {result['num_prompts']} requests "
            "unfinished (counted as failed)",
            file=sys.stderr,
        )
        return 143 if result["_signal"] == "SIGTERM" else 130
    if result["num_prompts"] and not result["completed"]:
        # a run of failures is not a benchmark: scripts and CI must see it (the table and the
        # result file are still written, with the errors)
        first = next((r.error for r in result["_results"] if r.error), "")
        print(
            f"llmsched bench: error: all {result['num_prompts']} requests failed; the first: {first[:200]}",
            file=sys.stderr,
        )
        return 1
    return 0


COMMANDS = ("serve", "bench")  # what `register` adds


def register(subparsers) -> None:
    """Add `serve` and `bench` to the main CLI's subparsers."""
    add_serve_parser(subparsers)
    add_bench_parser(subparsers)
