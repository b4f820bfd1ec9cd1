"""`llmsched generate`, `make-tiny-model` and `profile`: thin wrappers over the PyTorch
engine (the sim-vs-real `validate` is in `cli.analysis`). torch is imported only when a
command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys

from ..core import engine_api
from ..core.checks import check_text
from ..core.engine_api import (
    GPU_MEMORY_UTILIZATION,
    INT64_MAX,
    MAX_KV_CACHE_GB,  # noqa: F401 (the limits the command line shares with the engine)
    MAX_MEASURE_S,
    MAX_THREADS,
    DefaultMaxModelLen,
    default_max_running,
)
from ..core.errors import ConfigError
from ..core.paths import check_out_dir, check_out_file
from ..engine.loader import defaults_note, generation_defaults
from .common import (
    add_scheduler_args,
    check_replaces_own_file,
    flag_of,
    is_given,
    max_model_len_arg,
    nonnegative_int,
    positive_int,
    positive_int_at_most,
    scheduler_spec,
)


def check_kv_cache_gb(gb: float | None) -> None:
    """--kv-cache-gb: above 0 and at most MAX_KV_CACHE_GB (1e308 ended in an OverflowError
    traceback; inf and nan are refused too)."""
    if gb is not None:
        engine_api.check_kv_cache_gb(gb, "--kv-cache-gb", f"{gb:g}")


def fraction(text: str) -> float:
    """An argparse type: a share in (0, 1] (--gpu-memory-utilization)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 < v <= 1:  # (nan fails too)
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return v


def seed_int(text: str) -> int:
    """An argparse type: a seed, an integer >= 0 (as simulate's, bench's and validate's)."""
    return nonnegative_int(text)


def request_seed_int(text: str) -> int:
    """An argparse type: a per-request sampling seed, 0 to 2**63 - 1 (SamplingParams takes
    an int64; a negative one is refused as by `seed_int`)."""
    v = seed_int(text)
    if v > INT64_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2**63 - 1, got {text!r}")
    return v


def tiny_vocab_size(text: str) -> int:
    """An argparse type: a vocabulary size the tiny model's tokenizer can honour (its BPE
    trainer would silently give another: 258 for 10, 575 for 10**8)."""
    from ..engine.tiny import MAX_VOCAB, MIN_VOCAB  # noqa: PLC0415

    try:
        v = int(text)
    except ValueError:
        v = 0
    if not MIN_VOCAB <= v <= MAX_VOCAB:
        raise argparse.ArgumentTypeError(
            f"expected an integer from {MIN_VOCAB} (256 bytes + <s>, </s>) to {MAX_VOCAB} (every merge "
            f"of the training text), got {text!r}"
        )
    return v


def add_engine_args(
    p: argparse.ArgumentParser,
    cpu_max_model_len: int | None = 2048,
    cpu_max_model_len_help: str | None = None,
    refused: tuple[str, ...] = (),
) -> None:
    """The scheduler's options (cli.common) and the engine's own. `cpu_max_model_len`: the
    command's --max-model-len on CPU when not given (None: the model's, as on CUDA); the
    help states it and `engine_setup` applies it (one place for both). `cpu_max_model_len_help`:
    what the help says of the CPU default instead, for a command that chooses its own
    (validate: from the trace). `refused`: scheduler options (dests) the command refuses,
    left out of its --help as --kv-capacity is (engine_setup refuses it: the engine sizes
    its KV cache from --kv-cache-gb)."""
    add_scheduler_args(p, defaults=True, block_size=False, hidden=("kv_capacity", *refused))
    p.set_defaults(cpu_max_model_len=cpu_max_model_len)
    if cpu_max_model_len_help is not None:
        mml_default = f"{cpu_max_model_len_help} on CPU, the model's max_position_embeddings on CUDA"
    elif cpu_max_model_len is None:
        mml_default = "the model's max_position_embeddings"
    else:
        mml_default = f"{cpu_max_model_len} on CPU, the model's max_position_embeddings on CUDA"
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    g.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on CUDA)"
    )
    g.add_argument("--block-size", type=positive_int, default=16, help="KV cache block size in tokens (default: 16)")
    g.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="KV cache size on CPU in GiB (default: 1, capped at what --max-running can use)",
    )
    g.add_argument(
        "--max-model-len",
        type=max_model_len_arg,
        default=None,
        help=f"longest sequence, prompt + output (default: {mml_default}); auto or -1: the longest the KV "
        "cache holds, at most the model's",
    )
    add_device_args(g)


def add_device_args(g, unset: bool = False) -> None:
    """--gpu-memory-utilization, --enforce-eager and --threads, the engine's use of the
    device. `unset`: their defaults are None, so that a command with another backend
    (serve --backend sim) can refuse them when given; the engine applies its own."""
    g.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        default=None if unset else GPU_MEMORY_UTILIZATION,
        help="share of GPU memory the engine may use, KV cache included, in (0, 1] "
        f"(default: {GPU_MEMORY_UTILIZATION})",
    )
    g.add_argument("--enforce-eager", action="store_true", default=None if unset else False, help="no CUDA graphs")
    g.add_argument(
        "--threads",
        type=positive_int_at_most(MAX_THREADS),
        default=None,
        help="torch CPU threads (default: all cores but one)",
    )


# generate's sampling when neither a flag nor the model's generation_config.json sets it
GENERATE_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1}


def add_generation_config_arg(p) -> None:
    p.add_argument(
        "--generation-config",
        default=None,
        metavar="auto|vllm|PATH",
        help="auto: the model folder's generation_config.json gives the sampling defaults (temperature, "
        "top_p, top_k, repetition_penalty, max_new_tokens), as vLLM; vllm: none do; PATH: the "
        "generation_config.json in that folder does (default: auto)",
    )
    p.add_argument(
        "--override-generation-config",
        type=json_object,
        default=None,
        metavar="JSON",
        help="sampling defaults over those of --generation-config, e.g. '{\"temperature\": 0.5}' "
        "(keys: temperature, top_p, top_k, repetition_penalty, max_new_tokens, min_p; null removes one), as vLLM",
    )


def json_object(text: str) -> dict:
    """An argparse type: a JSON object (`--override-generation-config`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        what = f"{e.msg} at column {e.colno}"
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r:.60} ({what})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"temperature\": 0.5}}', got {text!r:.60}")
    return value


def generation_config_args(args) -> dict:
    """The sampling-defaults options of the command line, as generation_defaults takes them."""
    return {
        "generation_config": "auto" if args.generation_config is None else args.generation_config,
        "override": args.override_generation_config,
        "override_name": "--override-generation-config",
    }


def engine_setup(args) -> dict:
    """The engine's keyword options from the command line (the device's defaults where not given)."""
    if getattr(args, "kv_capacity", None) is not None:
        raise ConfigError("--kv-capacity is the simulator's; the engine sizes its KV cache from --kv-cache-gb")
    check_kv_cache_gb(args.kv_cache_gb)
    cuda = str(args.device).startswith("cuda")
    mns = args.max_running or default_max_running(args.device)
    mml = args.max_model_len
    if mml is None and not cuda:
        mml = getattr(args, "cpu_max_model_len", 2048)
        # the command's default, lowered to the model's longest sequence; a --max-model-len
        # beyond it is refused
        mml = None if mml is None else DefaultMaxModelLen(mml)
    return dict(
        device=args.device,
        dtype=args.dtype,
        b_max=args.b_max,
        k_max=args.k_max,
        max_num_seqs=mns,
        block_size=args.block_size,
        kv_cache_gb=args.kv_cache_gb,
        max_model_len=mml,
        num_threads=args.threads,
    )


# ---- generate ----------------------------------------------------------------------------
def parse_prompt_ids(text: str) -> list[int]:
    """`--prompt-ids`: token ids separated by commas (or spaces). Every element must be an
    integer: '1,,2' or a trailing comma is a typo, not a shorter prompt."""
    ids = []
    for part in re.split(r"\s*,\s*|\s+", text.strip()):
        try:
            ids.append(int(part))
        except ValueError:
            what = "an empty element" if not part else repr(part)
            raise ConfigError(f"--prompt-ids takes integers separated by commas, got {text!r} ({what})") from None
    return ids


class PromptIds(str):
    """A `--prompt-ids` value as given: it shares `prompts` with `--prompt`, in command-line
    order, and is read by `parse_prompt_ids` when the command runs (its one-line error)."""


def cmd_generate(args) -> int:
    from ..core.engine_api import SamplingParams  # noqa: PLC0415
    from ..engine import LLM  # noqa: PLC0415 - torch

    # the flags given, else the model's generation_config.json defaults, else generate's own;
    # the flags are checked before the model folder is read
    flags = {k: getattr(args, k) for k in GENERATE_DEFAULTS if getattr(args, k) is not None}
    params = SamplingParams(
        **{**GENERATE_DEFAULTS, **flags},
        seed=args.seed,
        stop=list(args.stop or []),
        stop_token_ids=list(args.stop_token_id or []),
        ignore_eos=args.ignore_eos,
    )
    # the prompts are checked before the model is loaded
    prompts = [
        parse_prompt_ids(p) if isinstance(p, PromptIds) else check_text(p, "--prompt") for p in args.prompts or []
    ]
    if not prompts:
        raise ConfigError("give at least one --prompt (or --prompt-ids)")
    opts = engine_setup(args)  # (its flags too, before the model folder is read)
    gen_args = generation_config_args(args)
    defaults = generation_defaults(args.model, **gen_args)
    if defaults:
        params = dataclasses.replace(params, **{**defaults, **flags})
    spec = scheduler_spec(args).replace(max_running=opts["max_num_seqs"])
    llm = LLM(
        args.model,
        scheduler=spec,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        cost_model=args.cost_model,
        generation_config=gen_args["generation_config"],
        override_generation_config=gen_args["override"],
        **opts,
    )
    if defaults:
        gen, over = gen_args["generation_config"], gen_args["override"]
        note = defaults_note(args.model, gen, over, defaults, "the flags given")
        print(f"llmsched generate: {note}", file=sys.stderr)
    outs = llm.generate(prompts, params)
    for prompt, o in zip(prompts, outs):
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": o.text,
                        "token_ids": o.token_ids,
                        "finish_reason": o.finish_reason,
                        "stop_reason": o.stop_reason,
                        "ttft_s": o.ttft,
                        "e2e_s": o.e2e,
                        "itl_s": o.itl,
                        "preemptions": o.preemptions,
                    }
                )
            )
        else:
            shown = prompt if isinstance(prompt, str) else f"<{len(prompt)} token ids>"
            print(f"--- prompt: {shown!r}")
            print(o.text)
            # one token has no gap: '-', as simulate's table says (it printed 'nan ms')
            mean_itl = f"{sum(o.itl) / len(o.itl) * 1e3:.2f} ms" if o.itl else "-"
            print(
                f"[{len(o.token_ids)} tokens, finish_reason={o.finish_reason}, ttft={o.ttft * 1e3:.1f} ms, "
                f"mean itl={mean_itl}, e2e={o.e2e * 1e3:.1f} ms]"
            )
    return 0


# ---- make-tiny-model -----------------------------------------------------------------------
def cmd_make_tiny_model(args) -> int:
    from ..engine.tiny import make_tiny_model  # noqa: PLC0415

    out = make_tiny_model(
        args.dir,
        arch=args.arch,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=args.tie_word_embeddings,
        seed=args.seed,
        overwrite=args.force,
    )
    print(f"wrote a tiny {args.arch} model to {out}")
    return 0


# ---- profile -------------------------------------------------------------------------------
# profile's and validate's measurement defaults (both parsers read them)
REPS, CALIBRATE_S = 3, 2.5
# validate's measurement options and their defaults (cli.analysis): with --profile nothing
# is measured, and a value other than the default is refused, not ignored
MEASUREMENT_DEFAULTS = (
    ("reps", "--reps", REPS),
    ("tables_s", "--tables-s", None),
    ("calibrate_s", "--calibrate-s", CALIBRATE_S),
)


def check_measurement_times(args) -> None:
    """profile's and validate's --calibrate-s and --tables-s: from 0 to MAX_MEASURE_S (nan
    ran with no calibration, silently). validate's: no measurement option with --profile (nothing is
    measured), and no empty --json path (it wrote nothing, silently)."""
    if getattr(args, "json", None) == "":
        raise ConfigError("--json needs a file name ('-': print the JSON)")
    if getattr(args, "profile", None) is not None:
        for key, flag, default in MEASUREMENT_DEFAULTS:
            if getattr(args, key) != default:
                raise ConfigError(f"{flag} sets the profile measurement; with --profile nothing is measured")
    # (1e308 seconds overflowed the calibration's request count; nan ran with none)
    for flag, v in (("--calibrate-s", args.calibrate_s), ("--tables-s", args.tables_s)):
        if v is not None and not 0 <= v < math.inf:
            raise ConfigError(f"{flag} must be a finite number >= 0, got {v:g}")
        if v is not None and v > MAX_MEASURE_S:
            raise ConfigError(f"{flag} must be at most {MAX_MEASURE_S:g} s, got {v:g}")


def _check_replaces_a_profile(path: str) -> None:
    check_replaces_own_file(path, "--out", "a step-time profile", _is_a_profile)


def _is_a_profile(path: str) -> bool:
    """Whether `path` starts with the header of a profile this command writes."""
    from ..core.profile import COMBINED_COLUMNS  # noqa: PLC0415
    from ..workload.csvio import read_header  # noqa: PLC0415

    try:
        return read_header(path) == list(COMBINED_COLUMNS)
    except ConfigError:  # unreadable as text: not ours either
        return False


# the scheduler options that would only choose the steps profile times: refused (and left
# out of its --help)
PROFILE_REFUSED = ("policy", "admission", "admission_option", "k_max", "prefix_caching")


def cmd_profile(args) -> int:
    from ..engine.profiler import profile  # noqa: PLC0415

    # the profile times the engine's steps for any policy: the scheduler's options that
    # would only choose the steps are refused, not ignored (--b-max and --max-running size
    # the measured loads and batches and stay)
    for key in PROFILE_REFUSED:
        if is_given(getattr(args, key)):
            raise ConfigError(
                f"{flag_of(key)} is a scheduler option; profile measures step times whatever the policy, "
                "and does not use it"
            )
    if args.out == "":  # (Path('') is the current folder: "'' is a folder, not a file")
        raise ConfigError("--out: the path is empty; give a file name (or a folder, for profile.csv)")
    # a folder (it gets profile.csv): one that exists, or a path ending in a slash
    if os.path.isdir(args.out) or args.out.endswith(("/", os.sep)):
        check_out_dir(args.out, "--out")
        from ..core.profile import COMBINED_FILE  # noqa: PLC0415

        _check_replaces_a_profile(os.path.join(args.out, COMBINED_FILE))
    else:
        check_out_file(args.out, "--out", make_parents=True)  # before the measurement, not after it
        _check_replaces_a_profile(args.out)
    opts = engine_setup(args)
    opts.pop("k_max")
    say = (lambda m: print(m, file=sys.stderr)) if not args.quiet else None
    check_measurement_times(args)
    s = profile(
        args.model,
        args.out,
        reps=args.reps,
        warmup=args.warmup,
        enforce_eager=args.enforce_eager,
        progress=say,
        calibrate=args.calibrate_s > 0,
        calibrate_s=args.calibrate_s or 1.0,
        min_s=args.tables_s,
        spread=not args.equal_contexts,
        **opts,
    )
    print(
        f"wrote {s['rows']} rows to {s['path']} ({s['device']}, {s['dtype']}, {s['layers']} layers, "
        f"{s['seconds']:.1f} s)"
    )
    cal = s.get("calibration") or {}
    if cal.get("steps"):
        print(
            f"calibrated on {cal['steps']} real steps: x{cal['scale']:.3f}, host {cal['fixed_s'] * 1e3:.3f} ms "
            f"+ {cal['per_row_s'] * 1e6:.1f} us per sampled row"
        )
    print(f"simulate with: --cost-model {s['cost_model']}")
    return 0


COMMANDS = ("generate", "make-tiny-model", "profile")  # what `register` adds


def register(subparsers) -> None:
    """Add the engine subcommands to an argparse subparsers object."""
    p = subparsers.add_parser(
        "generate",
        help="generate text with the PyTorch engine",
        description="Generate with a local Hugging Face-format model; every step runs the plan of a llmsched policy.",
    )
    p.add_argument("--model", required=True, help="model folder (config.json, *.safetensors, tokenizer.json)")
    # one list for both kinds: the outputs follow the prompts' order on the command line
    p.add_argument(
        "--prompt", dest="prompts", action="append", metavar="PROMPT", help="a text prompt (repeat for several)"
    )
    p.add_argument(
        "--prompt-ids",
        dest="prompts",
        action="append",
        type=PromptIds,
        metavar="PROMPT_IDS",
        help="a prompt as token ids, e.g. '1,5,9' (repeatable)",
    )
    # (None: the model's generation_config.json default, else GENERATE_DEFAULTS')
    model_default = "the model's generation_config.json, else"
    p.add_argument(
        "--max-tokens", type=positive_int, default=None, help=f"output tokens per prompt (default: {model_default} 32)"
    )
    p.add_argument("--temperature", type=float, default=None, help=f"0 = greedy (default: {model_default} 0)")
    p.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling mass (default: {model_default} 1)")
    p.add_argument(
        "--top-k", type=int, default=None, help=f"top-k sampling, 0 or -1 = off (default: {model_default} -1)"
    )
    p.add_argument(
        "--seed",
        type=request_seed_int,
        default=None,
        help="per-request sampling seed (0 to 2**63 - 1; default: drawn from the engine's seed, 0)",
    )
    p.add_argument("--stop", action="append", help="stop string (repeatable); the text is cut before it")
    p.add_argument("--stop-token-id", type=int, action="append", help="stop token id (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    add_engine_args(p, cpu_max_model_len=None)
    add_generation_config_arg(p)
    p.add_argument(
        "--cost-model",
        default=None,
        help="a cost model bound to the policies that reason about step times (--policy adaptive, "
        "--admission twp or dynamicbatch): profile:PATH (as `llmsched profile` prints it), paper[:...], "
        "linear:..., const:MS (default: none; adaptive then plans with paper, twp and dynamicbatch learn "
        "the measured step times)",
    )
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser(
        "make-tiny-model",
        help="write a small random model with a trained tokenizer",
        description="Write a small random Llama-family model (config.json, "
        "model.safetensors, tokenizer.json) for demos and tests.",
    )
    p.add_argument("dir", help="output folder")
    p.add_argument(
        "--arch",
        default="llama",
        choices=["llama", "qwen2", "mistral"],
        help="architecture: llama, qwen2 or mistral (default: llama)",
    )
    for flag, kind, default, text in (
        (
            "--vocab-size",
            tiny_vocab_size,
            512,
            "BPE vocabulary size, from 258 (the 256 bytes and <s>, </s>) to 575 (every merge of the training text)",
        ),
        ("--hidden-size", positive_int, 128, "hidden size"),
        ("--layers", positive_int, 4, "decoder layers"),
        ("--heads", positive_int, 4, "attention heads"),
        ("--kv-heads", positive_int, 2, "key/value heads (grouped-query attention)"),
        ("--intermediate-size", positive_int, 384, "MLP intermediate size"),
        ("--max-position-embeddings", positive_int, 4096, "longest sequence the model takes"),
        ("--seed", seed_int, 0, "weights' random seed (0 to 2**64 - 1)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default})")
    p.add_argument(
        "--tie-word-embeddings", action="store_true", help="share the LM head with the embeddings (default: separate)"
    )
    p.add_argument(
        "--force", action="store_true", help="write into a folder that is not empty, replacing its model files"
    )
    p.set_defaults(func=cmd_make_tiny_model)

    p = subparsers.add_parser(
        "profile",
        help="measure this machine's step-time tables for simulate",
        description="Measure linear, attention and LM-head times of the engine on "
        "this machine and write a profile CSV that "
        "`simulate --cost-model profile:PATH` reads. The measured step tokens and prefill chunks "
        "reach --b-max and stop there (LM-head rows and decode batches: --max-running, if smaller): give "
        "the budget you "
        "will simulate.",
    )
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--out", required=True, help="output CSV file (a folder gets profile.csv)")
    p.add_argument(
        "--reps", type=positive_int, default=REPS, help=f"interleaved passes over the grid, at least (default: {REPS})"
    )
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed passes first (default: 1)")
    p.add_argument(
        "--tables-s",
        type=float,
        default=None,
        help="keep making passes until this many seconds after the first, the calibration run "
        "included (default: 3 on CPU, 10 on CUDA)",
    )
    p.add_argument(
        "--calibrate-s",
        type=float,
        default=CALIBRATE_S,
        help="length of the real-time calibration run that fits the step-time scale and the "
        f"host time per step; 0: none (default: {CALIBRATE_S})",
    )
    p.add_argument(
        "--equal-contexts",
        action="store_true",
        help="time decode batches with equal contexts (default: contexts spread over 0..2x the "
        "mean, as in serving; the SDPA decode path pads a batch to its longest context)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_engine_args(p, refused=PROFILE_REFUSED)
    # no default policy or admission: a given one is refused (cmd_profile), not ignored
    p.set_defaults(func=cmd_profile, policy=None, admission=None)
