"""The `llmsched` command line: thin wrappers over the Python API.

Every user error ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .core.errors import ConfigError
from .core.jsonio import to_jsonable


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _key_values(items: list[str] | None) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip().replace("-", "_")] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip().replace("-", "_")] = v
    return out


# ---- simulate ---------------------------------------------------------------------------
def add_policy_args(p: argparse.ArgumentParser) -> None:
    """Policy, limit and cost-model options shared by simulate, sweep and serve."""
    g = p.add_argument_group("policy and limits")
    g.add_argument("--policy", "--scheduler", dest="policy", help="batch policy (see `llmsched schedulers`); default sarathi")
    g.add_argument("--admission", help="admission policy: fcfs (default), spf, ...")
    g.add_argument("--admission-option", action="append", metavar="KEY=VALUE",
                   help="an option of the admission policy (repeatable)")
    g.add_argument("--max-running", type=int, help="cap on running requests")
    g.add_argument("--b-max", type=int, help="token budget per step (default 512)")
    g.add_argument("--k-max", type=int, help="cap on requests per step (default: none)")
    g.add_argument("--kv-capacity", type=int, help="KV-cache capacity in tokens (default: unlimited)")
    g.add_argument("--cost-model", help="paper[:c=,a=,b0=,variant=], linear:c=,a=, const:MS, "
                                        "profile[:NAME|PATH] (default profile:h200-llama-3-8b)")


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--arrival", help="poisson (default), gamma, deterministic, trace:PATH, azure-conv")
    g.add_argument("--trace", help="replay a trace CSV (Azure format or arrival_s,prompt_tokens,output_tokens)")
    g.add_argument("--rate", type=float, help="arrival rate in requests/s (for a trace: rescale to it)")
    g.add_argument("--cv", type=float, help="coefficient of variation of gaps (gamma arrivals)")
    g.add_argument("--time-scale", type=float, help="multiply a trace's rate by K")
    g.add_argument("--prompt", help="prompt length law: const:N, uniform:LO,HI, geometric:MEAN, "
                                    "lognormal:mean=M,sigma=S, empirical:PATH[:COL], sharegpt, arxiv")
    g.add_argument("--output", help="output length law (same forms as --prompt)")
    g.add_argument("--num-requests", type=int, help="stop after N requests")
    g.add_argument("--duration", type=float, dest="duration_s", help="stop arrivals after S seconds")
    g.add_argument("--seed", type=int, help="random seed (default 0)")


def _overrides(args) -> dict:
    keys = ["policy", "admission", "max_running", "b_max", "k_max", "kv_capacity", "cost_model",
            "arrival", "trace", "rate", "cv", "time_scale", "prompt", "output", "num_requests",
            "duration_s", "seed", "max_time_s", "sample_interval_s"]
    out = {k: getattr(args, k, None) for k in keys}
    if getattr(args, "admission_option", None):
        out["admission_options"] = _key_values(args.admission_option)
    if getattr(args, "exact", False):
        out["fast"] = False
    if getattr(args, "steps", False):
        out["record_steps"] = True
    return out


def cmd_simulate(args) -> int:
    from .api import simulate  # noqa: PLC0415

    if args.steps and not args.out:
        raise ConfigError("--steps writes steps.csv into the output folder: give --out DIR")

    progress, close = _progress_bar(args)
    try:
        result = simulate(args.config, out_dir=args.out or None, progress=progress, **_overrides(args))
    finally:
        close()
    if args.json:

        print(json.dumps(to_jsonable(result.summary), indent=2))
    elif not args.quiet:
        print_summary(result)
        if args.out:
            print(f"results written to {args.out}/")
    return 0


def _progress_bar(args):
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    if not show or args.quiet:
        return None, lambda: None
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn  # noqa: PLC0415

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    task = bar.add_task("simulating", total=None)
    bar.start()

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar.stop


def print_summary(result) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    s = result.summary
    c = result.config

    def ms(key):
        v = s.get(key)
        return "-" if v is None else f"{v:,.1f} ms"

    t = Table(title=f"llmsched: {c['scheduler']['batch_policy']} "
                    f"(admission {c['scheduler']['admission']['name']}, b_max {c['b_max']}, "
                    f"cost {c['cost_model']})", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("requests completed", f"{s['completed']:,} / {s['num_requests']:,}"),
        ("duration", f"{s['duration']:,.1f} s"),
        ("request throughput", f"{s['request_throughput']:,.2f} req/s"),
        ("output token throughput", f"{s['output_throughput']:,.0f} tok/s"),
        ("total token throughput", f"{s['total_token_throughput']:,.0f} tok/s"),
        ("TTFT mean / p50 / p99", f"{ms('mean_ttft_ms')} / {ms('median_ttft_ms')} / {ms('p99_ttft_ms')}"),
        ("TPOT mean / p99", f"{ms('mean_tpot_ms')} / {ms('p99_tpot_ms')}"),
        ("ITL mean / p50 / p99", f"{ms('mean_itl_ms')} / {ms('median_itl_ms')} / {ms('p99_itl_ms')}"),
        ("ITL CV", "-" if s.get("itl_cv") is None else f"{s['itl_cv']:.3f}"),
        ("E2E latency mean / p99", f"{ms('mean_e2el_ms')} / {ms('p99_e2el_ms')}"),
        ("steps", f"{s['steps']:,}"),
        ("mean token load / full-budget steps", f"{s['mean_token_load']:,.1f} / {s['full_budget_step_share']:.1%}"),
        ("mean batch size", f"{s['mean_batch_size']:,.1f}"),
        ("preemptions", f"{s['preemptions']:,}"),
    ]
    if s.get("critical_rate") is not None:
        rows.append(("critical rate lambda* (theorem 2)", f"{s['critical_rate']:,.2f} req/s"))
    if s.get("utilisation") is not None:
        rows.append(("utilisation (offered / lambda*)", f"{s['utilisation']:.1%}"))
    if s.get("stable") is not None:
        lo, hi = s["backlog_growth_ci"]
        rows.append(("stable (backlog growth, 95% CI)",
                     f"{'yes' if s['stable'] else 'NO'} ({s['backlog_growth_tokens_per_s']:,.0f} tok/s, "
                     f"[{lo:,.0f}, {hi:,.0f}])"))
    rows.append(("simulation wall time", f"{s['wall_s']:.2f} s ({s['num_requests'] / max(s['wall_s'], 1e-9):,.0f} req/s)"))
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)


# ---- other commands ----------------------------------------------------------------------
def cmd_schedulers(args) -> int:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from .policies import list_policies  # noqa: PLC0415

    t = Table(title="llmsched policies")
    t.add_column("kind")
    t.add_column("name")
    t.add_column("rule")
    for kind, name, summary in list_policies():
        t.add_row(kind, name, summary)
    Console().print(t)
    return 0


def cmd_plot(args) -> int:
    from .plots import plot_dir  # noqa: PLC0415

    for path in plot_dir(args.dir):
        print(path)
    return 0


def build_parser() -> Parser:
    parser = Parser(prog="llmsched", description="Simulate, analyse and serve LLM inference "
                                                  "under token-level batch schedulers.")
    parser.add_argument("--version", action="version", version="llmsched 0.1.0")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")

    p = sub.add_parser("simulate", help="simulate a workload under a policy",
                       description="Simulate a workload under a batch policy and write its results.")
    p.add_argument("--config", help="YAML file with any of the options (flags override it)")
    add_policy_args(p)
    add_workload_args(p)
    g = p.add_argument_group("run and output")
    g.add_argument("--max-time", type=float, dest="max_time_s", help="stop the simulation at this time (s)")
    g.add_argument("--sample-interval", type=float, dest="sample_interval_s",
                   help="time-series sampling interval in s (default: span / 1000)")
    g.add_argument("--exact", action="store_true", help="step by step, without the fast path")
    g.add_argument("--steps", action="store_true", help="also write steps.csv (one row per step)")
    g.add_argument("--out", default="results", help="output folder (default results; '' for none)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    g.add_argument("--quiet", action="store_true", help="print nothing")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedulers", help="list the policies", description="List batch and admission policies.")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser("plot", help="draw figures of a results folder",
                       description="Draw queue.png, ttft_cdf.png, itl_cdf.png, token_load.png in DIR.")
    p.add_argument("dir", help="a folder written by `llmsched simulate --out`")
    p.set_defaults(func=cmd_plot)

    for module in ("analysis.cli", "engine.cli", "server.cli"):
        try:
            mod = __import__(f"llmsched.{module}", fromlist=["register"])
        except ImportError as e:
            if e.name and e.name.startswith("llmsched"):
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"llmsched {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llmsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `llmsched simulate --json | head`
        import os  # noqa: PLC0415

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # an internal failure: still one line, and a non-zero code
        from .sim.simulator import SimulationStuck  # noqa: PLC0415

        if isinstance(e, SimulationStuck):
            print(f"llmsched {args.command}: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
