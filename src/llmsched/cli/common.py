"""What every `llmsched` command shares: the argparse parser with one-line errors, the
option types, the KEY=VALUE parser, and one vocabulary for the scheduler, the cost model
and the workload.

One name per concept: `--policy` (alias `--scheduler`) is the batch policy,
`--max-running` (alias vLLM's `--max-num-seqs`) caps running requests, `--b-max` (alias
vLLM's `--max-num-batched-tokens`) is the token budget per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from fractions import Fraction

from ..core.constraints import MAX_B_MAX, MAX_KV_TOKENS, MAX_REQUESTS_PER_STEP
from ..core.engine_api import LLM_MAX_NUM_SEQS, default_max_running
from ..core.errors import ConfigError, closest
from ..core.names import OPTION_ALIASES, option_flags
from ..policies.spec import SchedulerSpec

DEFAULTS = SchedulerSpec()


def _terminal_columns() -> int:
    """`shutil.get_terminal_size().columns`, without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout at the same width, which argparse's own formatter reads
    through shutil: argparse makes a formatter for every option added (to check its
    metavar), so a run that prints no help would import shutil, bz2 and lzma for it (7.5 M
    instructions, 2-5 ms of start-up)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, _terminal_columns() - 2 if width is None else width)


# what the same thing is called by vllm bench serve, Vidur and habit (without the "--"):
# the option spelt closest to them was another one (--output-dir: "did you mean --output?",
# the output length law; --num-prompts: "--prompt?"). The first of them a command has is
# named, or none: capacity writes no folder, and its --output is no answer to --output-dir.
OTHER_SPELLINGS = {
    "output-dir": ("out", "result-dir"),
    "out-dir": ("out", "result-dir"),
    "outdir": ("out", "result-dir"),
    "output-folder": ("out", "result-dir"),
    "results-dir": ("out", "result-dir"),
    "result-dir": ("out",),
    "num-prompts": ("num-requests",),
    "num-requests": ("num-prompts",),
    "request-rate": ("rate",),
    "qps": ("rate", "request-rate"),
    "rate": ("request-rate",),
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2) and `HelpFormatter` by default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        # a flag is spelt in full: argparse's prefix matching ran `simulate --time 100`
        # (meant as --max-time) as --time-scale 100, 100 times the rate, and read
        # `capacity --out DIR` as --output DIR
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):
        """argparse's, but arguments no option takes are refused by the command's own
        parser (`llmsched simulate: error: ...`, not `llmsched: error: ...`), with a "did
        you mean" for an option spelt close to one of the command's."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(ns)
            parser.error(parser.unrecognized(extras))
        return ns

    def _command_parser(self, ns) -> Parser:
        """The parser of the command `ns` holds (`ns.command`), or this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(ns, action.dest, None) or "")
                if isinstance(sub, Parser):
                    return sub._command_parser(ns)
        return self

    def unrecognized(self, extras: list[str]) -> str:
        """argparse's message for `extras`, with the closest option to each unknown one."""
        names = [o[2:] for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for arg in extras:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in self._option_string_actions:
                # without the "--" every flag shares (it made --bogus 67% like --out), and
                # above the 0.6 that lets --plot pass as --prompt: a letter or two mistyped
                # scores 0.75 or more (--polcy, --b-mx, --kmax), unrelated words 0.67 or less
                if flag[2:] in OTHER_SPELLINGS:
                    close = next((o for o in OTHER_SPELLINGS[flag[2:]] if o in names), None)
                else:
                    close = closest(flag[2:], names, cutoff=0.7)
                if close:
                    hints.append((flag, "--" + close))
        if len(hints) == 1:
            hint = f" (did you mean {hints[0][1]}?)"
        elif hints:
            hint = " (" + "; ".join(f"{flag}: did you mean {o}?" for flag, o in hints) + ")"
        else:
            hint = ""
        return f"unrecognized arguments: {' '.join(extras)}{hint}"


def file_path(text: str) -> str:
    """An argparse type: a file's path, not empty (an empty one read as "not given" and ran
    the default workload, server or capacity instead)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file, got {text!r}")
    return text


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


# vLLM's human-readable integers (--max-model-len, --max-num-batched-tokens): a lowercase
# suffix counts in powers of 1000 and may follow a decimal (25.6k), an uppercase one in
# powers of 1024 and follows a whole number only (1K = 1024)
_HUMAN_INT = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT])")
_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def max_model_len_arg(text: str) -> int | str:
    """--max-model-len: positive_human_int, or vLLM's "auto" / -1 (the longest sequence the
    KV cache holds, at most the model's), returned as "auto"."""
    if text.strip().lower() in ("auto", "-1"):
        return "auto"
    try:
        return positive_human_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}; or auto (-1): the longest the KV cache holds") from None


def positive_human_int(text: str) -> int:
    """An argparse type: a positive integer, as written or with vLLM's k/m/g/t (x1000) or
    K/M/G/T (x1024) suffix: 32k is 32,000, 32K 32,768, 1.5k 1,500. Exact (vLLM's floats make
    4.1k 4,099), and a decimal that is no whole number of tokens (1.0001k) is refused."""
    m = _HUMAN_INT.fullmatch(text.strip())
    if m is None:
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected a positive integer, or one with a suffix (32k = 32,000, 32K = 32,768), got {text!r}"
            ) from None
    number, suffix = m.groups()
    if suffix.isupper() and "." in number:
        raise argparse.ArgumentTypeError(
            f"a decimal cannot take the binary suffix {suffix} (x1024), got {text!r}: "
            f"did you mean {number}{suffix.lower()} (x1000)?"
        )
    v = Fraction(number) * _SUFFIXES[suffix]
    if v.denominator != 1 or v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of tokens, got {text!r} ({float(v):g})")
    return int(v)


def nonnegative_int(text: str) -> int:
    """An argparse type: a whole number >= 0 (argparse names the flag in its error: a check
    after parsing said "warmup must be >= 0", without the `--`)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def positive_int_at_most(maximum: int):
    """An argparse type: a positive integer of at most `maximum` (a cap of 1e30 requests per
    step crashed the capacity region with an overflow)."""

    def parse(text: str) -> int:
        v = positive_int(text)
        if v > maximum:
            raise argparse.ArgumentTypeError(f"expected a positive integer of at most {maximum:,}, got {text!r}")
        return v

    return parse


def bounded_float(name: str, lo: float, hi: float, hi_open: bool):
    """An argparse type: a number from `lo` to `hi` (below `hi` with `hi_open`)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (lo <= v < hi if hi_open else lo <= v <= hi):
            raise argparse.ArgumentTypeError(
                f"{name} must be a number from {lo:g} to {'below ' if hi_open else ''}{hi:g}, got {text!r}"
            )
        return v

    return parse


def small_number(x: float, fmt: str) -> str:
    """`x` in `fmt` (',.3f'), or to 3 significant digits where `fmt` would print it as 0
    (`capacity --rate 1e-6` printed '0.000 req/s (0.0 tokens/s)')."""
    text = format(x, fmt)
    return f"{x:.3g}" if x and not text.strip("0.,-") else text


def policy_names(text: str, flag: str = "--policies") -> list[str]:
    """`A,B,...`: policy names, each given once (in any case, by an alias, with options
    in any case: the same policy); an empty name (`sarathi,`) or a repeated one is a
    ConfigError. What every command's `--policies` reads."""
    from ..core.checks import first_repeat  # noqa: PLC0415
    from ..policies import canonical_policy_name  # noqa: PLC0415

    names = [p.strip() for p in text.split(",")]
    if "" in names:
        raise ConfigError(f"{flag}: give comma-separated policy names, got {text!r}")
    dup = first_repeat([canonical_policy_name(p).lower() for p in names])
    if dup is not None:
        raise ConfigError(f"{flag}: {dup!r} is given twice")
    return names


def key_values(items: list[str] | None, what: str = "KEY=VALUE") -> dict:
    """`KEY=VALUE` options as a dict: a value is JSON if it parses (numbers, true, null,
    lists), then true/false/none in any case, else the text. Dashes in keys become
    underscores."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"{what} expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if k in out:
            raise ConfigError(f"{what}: {k} is given twice")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = {"true": True, "false": False, "none": None}.get(v.strip().lower(), v)
    return out


def add_scheduler_args(
    p: argparse.ArgumentParser, *, defaults: bool = False, block_size: bool = True, hidden: tuple[str, ...] = ()
) -> None:
    """The scheduler's options, the same for simulate, sweep, capacity, serve and the engine
    commands. `defaults`: fill in SchedulerSpec's defaults (serve); otherwise unset options
    stay None so that a config file's values stand. `block_size`: add `--block-size`
    (False where the command has its own, the KV cache's, under the same name). `hidden`:
    options (dests) the command refuses: parsed, so that its refusal names them in one
    line, but left out of its --help."""
    d = DEFAULTS
    g = p.add_argument_group("scheduler")

    def shown(dest: str, text: str) -> str:
        return argparse.SUPPRESS if dest in hidden else text

    g.add_argument(
        *option_flags("policy", "--policy"),
        dest="policy",
        default=d.policy if defaults else None,
        help=shown("policy", f"batch policy (see `llmsched schedulers`; default {d.policy})"),
    )
    g.add_argument(
        "--admission",
        default=d.admission if defaults else None,
        help=shown("admission", f"admission policy: fcfs, spf, twp, dynamicbatch (default {d.admission})"),
    )
    g.add_argument(
        *option_flags("admission_options", "--admission-option"),
        dest="admission_option",
        action="append",
        metavar="KEY=VALUE",
        help=shown("admission_option", "an option of the admission policy (repeatable)"),
    )
    g.add_argument(
        *option_flags("b_max", "--b-max"),
        dest="b_max",
        type=positive_human_int,
        default=d.b_max if defaults else None,
        help=shown("b_max", f"token budget per step (default {d.b_max}; at most {MAX_B_MAX:,})"),
    )
    g.add_argument(
        "--k-max",
        type=positive_int_at_most(MAX_REQUESTS_PER_STEP),
        help=shown("k_max", f"cap on requests per step (default: none; at most {MAX_REQUESTS_PER_STEP:,})"),
    )
    g.add_argument(
        "--kv-capacity",
        type=positive_int_at_most(MAX_KV_TOKENS),
        help=shown("kv_capacity", f"KV-cache capacity in tokens (default: unlimited; at most {MAX_KV_TOKENS:,})"),
    )
    g.add_argument(
        *option_flags("max_running", "--max-running"),
        dest="max_running",
        type=positive_int_at_most(MAX_REQUESTS_PER_STEP),
        help=shown(
            "max_running",
            f"cap on running requests (default: none; the engine commands: {default_max_running('cpu')} on CPU, "
            f"{default_max_running('cuda')} on CUDA; the Python LLM and LLMEngine: {LLM_MAX_NUM_SEQS})",
        ),
    )
    g.add_argument(
        *option_flags("prefix_caching", "--prefix-caching"),
        dest="prefix_caching",
        action="store_true",
        default=None,
        help=shown("prefix_caching", "reuse the KV cache of shared prompt prefixes (see docs/prefix-caching.md)"),
    )
    if block_size:
        g.add_argument(
            "--block-size",
            type=positive_int,
            default=d.block_size if defaults else None,
            help=shown("block_size", f"KV block size in tokens, the prefix cache's unit (default {d.block_size})"),
        )


def scheduler_options(args, parse: bool = True) -> dict:
    """The scheduler options given on the command line (None where not given);
    `parse=False` leaves --admission-option's KEY=VALUE items unread."""
    keys = ("policy", "admission", "b_max", "k_max", "kv_capacity", "max_running", "prefix_caching", "block_size")
    out = {k: getattr(args, k, None) for k in keys}
    policy = out["policy"]
    if parse and isinstance(policy, str) and "," in policy.partition(":")[0]:
        # a list here was "unknown batch policy 'sarathi,orca'; did you mean 'sarathi'?"
        names = policy.partition(":")[0]
        several = {"sweep": f"--grid policy={names}", "simulate": f"llmsched sweep --grid policy={names}"}
        hint = several.get(getattr(args, "command", None), "")
        raise ConfigError(
            f"--policy takes one batch policy, got {policy!r}" + (f": to run several, {hint}" if hint else "")
        )
    if getattr(args, "admission_option", None):
        items = args.admission_option
        out["admission_options"] = key_values(items, "--admission-option") if parse else items
    return out


def scheduler_spec(args) -> SchedulerSpec:
    """A SchedulerSpec from the command line, SchedulerSpec's defaults elsewhere."""
    return SchedulerSpec.from_mapping(scheduler_options(args))


def add_cost_model_arg(p, default: str | None = None) -> None:
    p.add_argument(
        "--cost-model",
        default=default,
        help="paper[:c=,a=,b0=,variant=], linear:c=,a=, const:MS, profile[:NAME|PATH] "
        "(default profile:h200-llama-3-8b)",
    )


def add_workload_args(p: argparse.ArgumentParser, rate_help: str | None = None, num_requests_help: str | None = None):
    """The workload flags; `rate_help`/`num_requests_help` replace those flags' help where a
    command uses them otherwise than a simulation does (capacity)."""
    g = p.add_argument_group("workload")
    g.add_argument("--arrival", help="poisson (default), gamma, deterministic, trace:PATH, azure-conv")
    g.add_argument(
        "--trace",
        type=file_path,
        help="replay a trace file: plain CSV (arrival_s,prompt_tokens,output_tokens), Azure CSV, "
        "BurstGPT CSV or Mooncake JSON lines (told apart by the first line), any of them gzip-compressed "
        "(told by its first bytes, whatever its name), or a Parquet table of the plain CSV's columns "
        "(needs pyarrow); default: none. A trace "
        "replays whole, at its own times and lengths: the defaults of --rate, --num-requests, --prompt "
        "and --output do not apply to it, only values given (--prompt or --output replaces the trace's "
        "prompt or output lengths)",
    )
    g.add_argument("--trace-model", help="BurstGPT: keep only rows of these models (e.g. ChatGPT or ChatGPT,GPT-4)")
    g.add_argument("--trace-log-type", help="BurstGPT: keep only rows of this log type (Conversation log, API log)")
    g.add_argument(
        "--rate",
        type=float,
        help=rate_help
        or "arrival rate in requests/s (default 16; a trace keeps its own rate unless --rate is given, "
        "then its replayed part is rescaled to this mean rate)",
    )
    g.add_argument("--cv", type=float, help="coefficient of variation of gaps (gamma arrivals; default 1)")
    g.add_argument("--time-scale", type=float, help="multiply the arrival rate by K, a trace's included (default 1)")
    g.add_argument(
        "--prompt",
        help="prompt length law: const:N, uniform:LO,HI, geometric:MEAN, "
        "lognormal:mean=M,sigma=S, empirical:PATH[:COL], replay:PATH[:COL], sharegpt, arxiv, azure-conv "
        "(default lognormal:mean=1024,sigma=1.0,max=8192)",
    )
    g.add_argument("--output", help="output length law, the same forms (default geometric:mean=256,max=2048)")
    g.add_argument(
        "--num-requests",
        type=int,
        help=num_requests_help
        or "stop after N requests (default 5000, none with --duration; a trace: all its requests unless "
        "given, then its first N)",
    )
    g.add_argument(
        "--duration",
        type=float,
        dest="duration_s",
        help="stop arrivals after S seconds (default: none); with --num-requests, whichever comes first",
    )
    g.add_argument("--seed", type=int, help="random seed: a whole number >= 0, kept exactly however large (default 0)")
    g.add_argument(
        "--system-prompt",
        type=int,
        help="every request starts with the same N tokens (shared prefix; prompt = N + law)",
    )
    g.add_argument(
        "--turns",
        help="multi-turn conversations: turns per conversation, a length law (e.g. geometric:4); "
        "--rate is then new conversations per second",
    )
    g.add_argument(
        "--think-time",
        type=float,
        dest="think_time_s",
        help="mean seconds from a turn's arrival to the next turn's (no default: --turns needs it)",
    )


# simulate()'s keys whose command-line flag is spelled otherwise
FLAG_OF_KEY = {
    "duration_s": "--duration",
    "think_time_s": "--think-time",
    "max_time_s": "--max-time",
    "sample_interval_s": "--sample-interval",
    "slo": "--slo",
    "fast": "--exact",
    "record_steps": "--steps",
    "admission_options": "--admission-option",
}


def check_replaces_own_file(path: str, flag: str, what: str, is_ours) -> None:
    """A file `flag` would replace must be `what` this command wrote (`is_ours(path)`: its
    content says so), not another file (`--out MODEL/config.json` replaced the model's
    configuration). An empty file (`mktemp`'s) has nothing to lose."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    if not is_ours(path):
        raise ConfigError(f"{flag} {path!r} exists and is not {what}: give another file, it would be replaced")


def config_file_layout(path: str | None) -> str | None:
    """'network' or 'serverless' when the `--config` file at `path` is a network's (servers
    and jobs) or a serverless platform's (cluster and models), such as such a run's own
    config.json (`api.config_layout`); None otherwise, and for a pipe, which is read once,
    by the run."""
    if not path or not os.path.isfile(path):
        return None
    from ..api import config_layout  # noqa: PLC0415
    from ..core.yamlfile import read_yaml  # noqa: PLC0415

    return config_layout(read_yaml(path, "config"))


def folder_shown(path) -> str:
    """A folder as a message names it, with one trailing slash: `tsl/` for --out tsl/ or
    tsl (not `tsl//`)."""
    return str(path).rstrip("/") + "/"


def flag_of(key: str) -> str:
    """The command-line flag that sets simulate()'s `key`."""
    return FLAG_OF_KEY.get(key, "--" + key.replace("_", "-"))


def flag_keys(parser: argparse.ArgumentParser, known) -> dict[str, str]:
    """`parser`'s long flags spelled as keys (`max_time`) -> the option of `known` each
    sets (`max_time_s`): the flag's dest, or the option its dest is an alias of
    (OPTION_ALIASES). Read from the parser, so a flag added there is in it. Left out: the
    spellings that name their option already, as such or by OPTION_ALIASES."""
    out = {}
    for action in parser._actions:
        key = OPTION_ALIASES.get(action.dest, action.dest)
        if key not in known:
            continue
        for flag in action.option_strings:
            spelled = flag[2:].replace("-", "_")
            if flag.startswith("--") and OPTION_ALIASES.get(spelled, spelled) != key:
                out[spelled] = key
    return out


def is_given(value) -> bool:
    """Whether an option's argparse value means it was given: not None (no value) and not
    False (a store_true flag left off). `not in (None, False)` took a given 0 or 0.0 for
    not given, as 0 == False."""
    return value is not None and value is not False


def only_with(args, keys, owner: str) -> None:
    """One line naming the first of these options (argparse dests) that was given, though
    it is an option of `owner` only (a flag at its default is not given)."""
    for key in keys:
        if is_given(getattr(args, key)):
            raise ConfigError(f"{flag_of(key)} is an option of {owner}")


def not_together(args, first: str, second: str, why: str) -> None:
    """One line when two options (argparse dests) that contradict each other are both
    given (a flag at its default, or turned off with --no-..., is not given)."""
    if is_given(getattr(args, first)) and is_given(getattr(args, second)):
        raise ConfigError(f"{flag_of(first)} and {flag_of(second)} contradict each other ({why}): give one")


# simulate()'s keys that take a length law
LAW_KEYS = ("prompt", "output", "turns")


def sim_overrides(args, parse: bool = True) -> dict:
    """simulate()'s keyword overrides from the command line (None: not given). A bad
    length law is an error naming its flag (`--prompt: ...`); `parse=False` reads no
    value (no law, no KEY=VALUE), for a caller that only asks which flags were given and
    refuses them."""
    keys = [
        "cost_model",
        "arrival",
        "trace",
        "rate",
        "cv",
        "time_scale",
        "prompt",
        "output",
        "num_requests",
        "duration_s",
        "seed",
        "trace_model",
        "trace_log_type",
        "system_prompt",
        "turns",
        "think_time_s",
        "max_time_s",
        "sample_interval_s",
    ]
    out = {k: getattr(args, k, None) for k in keys}
    if parse:
        from ..workload.lengths import named_length_law  # noqa: PLC0415 - start-up: it loads numpy

        for key in LAW_KEYS:
            if out[key] is not None:
                try:
                    named_length_law(out[key], flag_of(key), key)
                except ConfigError as e:
                    # `--output results` is the output folder as other tools spell it
                    if key == "output" and hasattr(args, "out") and "unknown length law" in str(e):
                        raise ConfigError(f"{e}; the output folder is --out DIR") from None
                    raise
    out.update(scheduler_options(args, parse))
    if getattr(args, "request_slo", None):  # simulate's per-request objectives (sweep's --slo is a search's)
        out["slo"] = key_values(args.request_slo, "--slo") if parse else args.request_slo
    if getattr(args, "exact", False):
        out["fast"] = False
    if getattr(args, "record_steps", False):
        out["record_steps"] = True
    return out


def add_parallel_args(g) -> None:
    g.add_argument("--workers", type=int, help="parallel simulations (default: all CPU cores)")
    g.add_argument("--backend", choices=["local", "ray"], default="local", help="local process pool (default) or Ray")
    g.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


PIPE_WIDTH = 10_000  # piped output: no wrapping, no cut headers; a table takes its natural width


def console():
    """rich's Console for tables on stdout: the terminal's width on a terminal; when piped,
    wide enough for any table (rich would otherwise wrap and cut at 80 columns)."""
    from rich.console import Console  # noqa: PLC0415 - rich costs start-up time

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def print_table(title: str, rows: list[tuple[str, str]], head: tuple[str, str] = ("quantity", "value")) -> None:
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=title)
    t.add_column(head[0])
    t.add_column(head[1], justify="right")
    for k, v in rows:
        t.add_row(k, v)
    console().print(t)


def print_grid(title: str, rows: list[tuple[str, ...]]) -> None:
    """A table whose first row is the header; when piped, whole rows rather than cut cells."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=title)
    for i, head in enumerate(rows[0]):
        t.add_column(head, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows[1:]:
        t.add_row(*row)
    console().print(t)


__all__ = [
    "Parser",
    "positive_int",
    "key_values",
    "add_scheduler_args",
    "scheduler_options",
    "scheduler_spec",
    "add_cost_model_arg",
    "add_workload_args",
    "sim_overrides",
    "add_parallel_args",
    "console",
    "print_table",
    "print_grid",
]
