"""`llmsched simulate` (one server, a cluster of replicas, or a network of servers),
`llmsched schedulers` and `llmsched plot`: thin wrappers over `llmsched.simulate`,
`llmsched.simulate_network` and `llmsched.plots`."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.paths import check_run_dir
from .common import (
    Parser,
    add_cost_model_arg,
    add_scheduler_args,
    add_workload_args,
    config_file_layout,
    console,
    file_path,
    flag_of,
    folder_shown,
    not_together,
    positive_int,
    print_table,
    sim_overrides,
    small_number,
)
from .table import render_table

# what sets OpenBLAS's thread count, in the order it reads them
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def import_numpy_with_one_blas_thread() -> None:
    """Import numpy with OpenBLAS capped at one thread, unless numpy is loaded already or the
    user set a thread count. OpenBLAS starts a thread per core as numpy loads (measured:
    60 ms of a 1,000-request simulate's 0.5 s); a simulation does no linear algebra large
    enough to share among threads. The environment is restored: only this load reads it."""
    cap = "numpy" not in sys.modules and not any(v in os.environ for v in BLAS_THREAD_VARIABLES)
    if cap:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401, PLC0415
    finally:
        if cap:
            del os.environ["OPENBLAS_NUM_THREADS"]


def import_simulator() -> None:
    """Import numpy (with one BLAS thread) and the simulator with the garbage collector
    paused, then exempt what the imports made from later collections (`gc.freeze`): the
    modules' thirty thousand objects live as long as the process, yet set off some thirty
    collections (measured: 10 ms of a 1,000-request simulate). Nothing to do once loaded."""
    if "llmsched.api" in sys.modules:
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import_numpy_with_one_blas_thread()
        from .. import api  # noqa: F401, PLC0415 - numpy and the simulator only when a command runs
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def cmd_simulate(args) -> int:
    import_simulator()
    from ..api import simulate  # noqa: PLC0415

    not_together(args, "progress", "quiet", "a progress bar, or print nothing")
    _route_config(args)
    if args.out is None:
        args.out = "" if args.json else "results"
    # whether a flag applies at all, before what it needs (--out): adding the --out that a
    # refusal asked for must not meet a second refusal of the same flag
    one_server = not (args.serverless or args.network or args.replicas)
    if args.record_steps and not args.out and one_server:
        raise ConfigError("--steps writes steps.csv into the output folder: give --out DIR")
    if args.parquet:
        if not one_server:
            raise ConfigError("--parquet is for one server; a network or serverless run writes CSV files")
        if not args.out:
            raise ConfigError("--parquet writes requests.parquet into the output folder: give --out DIR")
        from ..sim.result import require_pyarrow  # noqa: PLC0415

        require_pyarrow("--parquet")  # before the run, not after it
    if args.out:  # before the run: a model folder's config.json, a sweep's results are not replaced
        kind = "serverless" if args.serverless else "network" if args.network or args.replicas else "single-server"
        check_run_dir(args.out, kind, "--out")
    if args.serverless:
        return _simulate_serverless(args)
    if args.platform_scheduler:
        raise ConfigError("--platform-scheduler is for --serverless FILE")
    if args.network or args.replicas:
        return _simulate_network(args)
    if args.router:
        raise ConfigError("--router routes among replicas: give --replicas N (or a --network file)")
    if args.scale is not None:
        raise ConfigError(
            "--scale multiplies a --network or --serverless file's arrival rates; use --rate or --time-scale"
        )
    progress, close = _progress_bar(args)
    try:
        result = simulate(
            args.config, out_dir=args.out or None, progress=progress, parquet=bool(args.parquet), **sim_overrides(args)
        )
    finally:
        close()
    return _report(args, result, print_summary)


def _route_config(args) -> None:
    """A `--config` file that is a network's (servers and jobs) or a serverless platform's
    (cluster and models), such as such a run's own config.json, runs as `--network FILE`
    / `--serverless FILE` would: with the same flags allowed beside it, the others refused
    with one line. (Neither given: a --network or --serverless beside it refuses --config.)"""
    args.declared = {"network": "--network FILE", "serverless": "--serverless FILE"}
    if args.network or args.serverless:
        return
    layout = config_file_layout(args.config)
    if layout is not None:
        setattr(args, layout, args.config)
        args.config = None
        what = "a network's servers and jobs" if layout == "network" else "a serverless platform's cluster and models"
        args.declared[layout] = f"--config FILE ({what}, run as --{layout} FILE)"


# options of a run that a network or serverless file leaves to the command line
RUN_OPTIONS = ("seed", "max_time_s", "sample_interval_s", "fast", "num_requests")


def _report(args, result, printer) -> int:
    """The summary as JSON (`--json`) or as a table, and where the files went."""
    if args.json:
        print(json.dumps(to_jsonable(result.summary), indent=2))
    elif not args.quiet:
        printer(result)
        if args.out:
            print(f"results written to {folder_shown(args.out)}")
    return 0


def _refuse_flags(args, keep: tuple[str, ...], what: str, instead: str) -> None:
    """One line naming the first simulate flag that a declared file (`what`) makes moot."""
    given = [k for k, v in sim_overrides(args, parse=False).items() if v is not None and k not in keep]
    if given or args.config:
        flag = flag_of(given[0]) if given else "--config"
        raise ConfigError(f"{what}; {flag} does not apply ({instead})")


def _simulate_network(args) -> int:
    from ..api import build_config, cluster_network  # noqa: PLC0415
    from ..sim.network import CallOverCapacity  # noqa: PLC0415
    from ..sim.network_result import simulate_network  # noqa: PLC0415

    if args.record_steps:
        raise ConfigError("--steps is for one server; a network writes calls.csv and per-replica outputs")
    if args.network:
        declared = args.declared["network"]
        if args.replicas or args.router:
            raise ConfigError(
                f"--replicas/--router describe a cluster from the flags; {declared} "
                "declares replicas and routers per server"
            )
        _refuse_flags(
            args,
            RUN_OPTIONS,
            f"{declared} declares servers and workload",
            "use --scale, --num-requests for the number of jobs, --seed",
        )
        network = args.network
        num_jobs = args.num_requests
        # (not given: the file's, as a run's config.json records them)
        max_time_s, sample_interval_s, fast = args.max_time_s, args.sample_interval_s, False if args.exact else None
    else:
        if args.scale is not None:
            raise ConfigError("--scale multiplies a --network file's arrival rates; use --rate for a cluster")
        # a --config file's run options hold for the cluster as for one server
        cfg = build_config(args.config, **sim_overrides(args))
        network = cluster_network(cfg, replicas=args.replicas, router=args.router or "jsq")
        num_jobs = None
        max_time_s, sample_interval_s, fast = cfg.max_time_s, cfg.sample_interval_s, cfg.fast
    progress, close = _progress_bar(args)
    try:
        res = simulate_network(
            network,
            out_dir=args.out or None,
            fast=fast,
            max_time_s=max_time_s,
            sample_interval_s=sample_interval_s,
            scale=args.scale,
            num_jobs=num_jobs,
            seed=args.seed if args.network else None,
            progress=progress,
        )
    except CallOverCapacity as e:
        if args.network:
            raise
        # a cluster's job is one request to the server of the command line (or --config file): named so
        key = flag_of("kv_capacity") + (" or the --config file's kv_capacity" if args.config else "")
        raise ConfigError(e.message(key, f"request {e.job}")) from None
    finally:
        close()
    return _report(args, res, print_network_summary)


def _simulate_serverless(args) -> int:
    from ..sim.serverless_result import simulate_serverless  # noqa: PLC0415

    declared = args.declared["serverless"]
    if args.network or args.replicas or args.router or args.record_steps:
        raise ConfigError(
            f"{declared} declares the whole platform; --network, --replicas, --router and --steps do not apply"
        )
    if args.sample_interval_s is not None:
        raise ConfigError(
            f"--sample-interval does not apply to {declared}: a serverless run samples no time series "
            "(it writes summary.json, config.json, requests.csv and instances.csv)"
        )
    _refuse_flags(
        args,
        (*RUN_OPTIONS, "admission", "slo"),
        f"{declared} declares models, cluster and workload",
        "use --platform-scheduler, --scale, --num-requests, --seed, --max-time, --exact, --slo",
    )
    if args.admission:
        raise ConfigError(
            "--serverless: the platform scheduler sets each model's admission; use "
            "--platform-scheduler fcfs|round-robin|priority|dynamicbatch|twp|serverlessllm"
        )
    progress, close = _progress_bar(args)
    try:
        res = simulate_serverless(
            args.serverless,
            args.out or None,
            scheduler=args.platform_scheduler,
            fast=False if args.exact else None,  # (not given: the file's, as a run's config.json records it)
            max_time_s=args.max_time_s,
            scale=args.scale,
            num_requests=args.num_requests,
            seed=args.seed,
            slo=sim_overrides(args).get("slo"),
            progress=progress,
        )
    finally:
        close()
    return _report(args, res, print_serverless_summary)


def print_serverless_summary(res) -> None:
    s = res.summary

    def num(key, spec, unit=""):
        """A summary value formatted, or '-' where there is none (no GPU-seconds before the
        first instance starts, no ITL before a second token, no throughput over no time)."""
        v = s.get(key)
        return "-" if v is None else f"{v:{spec}}{unit}"

    def ms(key):
        return num(key, ",.1f", " ms")

    rows = [
        ("scheduler / GPUs", f"{s['scheduler']} / {s['gpus']}"),
        completed_row("requests", s["completed"], s["arrived"], s["num_requests"], "workload"),
        ("request throughput", num("request_throughput", ",.2f", " req/s")),
        ("TTFT p50 / p95 / p99", f"{ms('p50_ttft_ms')} / {ms('p95_ttft_ms')} / {ms('p99_ttft_ms')}"),
        ("ITL mean / p99, CV", f"{ms('mean_itl_ms')} / {ms('p99_itl_ms')}, {num('itl_cv', '.3f')}"),
        ("E2E latency p99", ms("p99_e2el_ms")),
        *(
            [
                (
                    "goodput (requests meeting every SLO)",
                    f"{num('goodput', ',.2f', ' req/s')} ({num('goodput_share', '.1%')})",
                )
            ]
            if "goodput" in s
            else []
        ),
        (
            "cold starts (total time)",
            f"{s['cold_starts']:,} ({num('cold_start_time_s', ',.1f', ' s')})"
            + (f", {s['cold_starts_unfinished']:,} unfinished" if s["cold_starts_unfinished"] else ""),
        ),
        ("GPU-seconds (busy share)", f"{num('gpu_seconds', ',.0f')} ({num('gpu_busy_fraction', '.1%')})"),
        ("instances used / peak", f"{s['instances_used']} / {s['peak_instances']}"),
        ("migrations", f"{s['migrations']:,}"),
        ("simulation wall time", f"{s['wall_s']:.2f} s"),
    ]
    print_table("llmsched serverless", rows, ("metric", "value"))


def prefix_cache_row(pc: dict, label: str = "") -> tuple[str, str]:
    """The summary table's row of a prefix cache's stats (`PrefixCache.stats`)."""
    return (
        f"{label}prefix cache hits: tokens / blocks",
        f"{pc['token_hit_rate']:.1%} / {pc['block_hit_rate']:.1%} "
        f"({pc['prefill_tokens_saved']:,} prefill tokens saved, {pc['evictions']:,} evictions)",
    )


def print_network_summary(res) -> None:
    s = res.summary

    def ms(v):
        return "-" if v is None else f"{small_number(v, ',.1f')} ms"

    calls = f" ({s['num_calls']:,} calls)"
    rows = [
        completed_row("jobs", s["completed_jobs"], s["arrived_jobs"], s["num_jobs"], "workload", calls),
        ("job throughput", f"{s['job_throughput']:,.3f} jobs/s"),
        (
            "job latency mean / p50 / p99",
            f"{ms(s['mean_job_latency_ms'])} / {ms(s['p50_job_latency_ms'])} / {ms(s['p99_job_latency_ms'])}",
        ),
    ]
    for name, srv in s["servers"].items():
        util = srv.get("utilisation")
        fill = srv.get("fill_utilisation")
        net = srv.get("utilisation_net_of_hits")
        hits = "" if net is None else f"{net:.1%} net of cache hits"
        if util is None:
            load = ""
        elif fill is not None and fill > util * (1 + 1e-9):
            # smaller steps (or the region's shapes) serve more than steps at b_max: capacity
            # is the best policy's
            more = f"; {hits}" if hits else ""
            load = f"load {fill:.1%} of what filling steps to b_max serves ({util:.1%} of the best policy's{more}), "
        else:
            load = f"load {util:.1%} of capacity" + (f" ({hits})" if hits else "") + ", "
        verdict = srv["verdict"]
        if "buffer_growth_tokens_per_s" in srv:
            g = srv["buffer_growth_tokens_per_s"]
            growth = "-" if g is None else f"{g:,.1f} tokens/s"
            verdict += f" (buffer included; back-pressure buffer growth {growth})"
        rows.append(
            (
                f"server {name} ({len(srv['replicas'])} replica(s))",
                f"{load}{srv['calls']:,} calls, TTFT p99 {ms(srv['p99_ttft_ms'])}, {verdict}",
            )
        )
        if srv.get("prefix_cache") is not None:
            rows.append(prefix_cache_row(srv["prefix_cache"], f"  {name} "))
    if s.get("bottleneck"):
        scale = f"rates could scale by {s['critical_scale']:.3g}"
        if not s.get("critical_scale_exact", True):
            scale = f"rates could scale by at least {s['critical_scale']:.3g} (prefix-cache hits not counted)"
        rows.append(("bottleneck (traffic equations)", f"{s['bottleneck']} at {s['max_utilisation']:.1%}; {scale}"))
    rows.append(("network verdict", s["verdict"]))
    rows.append(("simulation wall time", f"{s['wall_s']:.2f} s"))
    print_table("llmsched network", rows, ("metric", "value"))


def _progress_bar(args):
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    if not show or args.quiet:
        return None, lambda: None
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn  # noqa: PLC0415

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    task = bar.add_task("simulating", total=None)
    bar.start()

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar.stop


def completed_row(what: str, done: int, arrived: int, total: int, source: str, extra: str = "") -> tuple[str, str]:
    """The summary row of completions: with the arrivals when a stop kept some from arriving."""
    if arrived < total:
        return f"{what} completed / arrived / in the {source}", f"{done:,} / {arrived:,} / {total:,}{extra}"
    return f"{what} completed", f"{done:,} / {total:,}{extra}"


def print_summary(result) -> None:
    s = result.summary
    c = result.config

    def ms(key):
        v = s.get(key)
        return "-" if v is None else f"{small_number(v, ',.1f')} ms"

    share = "-" if s.get("goodput_share") is None else f"{s['goodput_share']:.1%}"  # (none completed)
    title = (
        f"llmsched: {c['scheduler']['batch_policy']} "
        f"(admission {c['scheduler']['admission']['name']}, b_max {c['b_max']}, "
        f"cost {c['cost_model']})"
    )
    rows = [
        completed_row("requests", s["completed"], s.get("arrived", s["num_requests"]), s["num_requests"], "trace"),
        # (a slow run's figures to 3 significant digits, not 0: 5 requests completed over
        # 1,231 s printed '0.00 req/s' and '0 tok/s')
        ("duration", f"{small_number(s['duration'], ',.1f')} s"),
        ("request throughput", f"{small_number(s['request_throughput'], ',.2f')} req/s"),
        ("output token throughput", f"{small_number(s['output_throughput'], ',.0f')} tok/s"),
        ("total token throughput", f"{small_number(s['total_token_throughput'], ',.0f')} tok/s"),
        ("TTFT mean / p50 / p99", f"{ms('mean_ttft_ms')} / {ms('median_ttft_ms')} / {ms('p99_ttft_ms')}"),
        ("TPOT mean / p99", f"{ms('mean_tpot_ms')} / {ms('p99_tpot_ms')}"),
        ("ITL mean / p50 / p99", f"{ms('mean_itl_ms')} / {ms('median_itl_ms')} / {ms('p99_itl_ms')}"),
        ("ITL CV", "-" if s.get("itl_cv") is None else f"{s['itl_cv']:.3f}"),
        *(
            [
                (
                    "goodput (requests meeting every SLO)",
                    f"{small_number(s['goodput'], ',.2f')} req/s ({share})",
                )
            ]
            if "goodput" in s
            else []
        ),
        ("E2E latency mean / p99", f"{ms('mean_e2el_ms')} / {ms('p99_e2el_ms')}"),
        ("steps", f"{s['steps']:,}"),
        ("mean token load / full-budget steps", f"{s['mean_token_load']:,.1f} / {s['full_budget_step_share']:.1%}"),
        ("mean batch size", f"{s['mean_batch_size']:,.1f}"),
        ("preemptions", f"{s['preemptions']:,}"),
    ]
    if s.get("prefix_cache") is not None:
        rows.append(prefix_cache_row(s["prefix_cache"]))
    if s.get("critical_rate") is not None:
        # with a batch-size cap lambda* is the 2-D region's (an LP), not theorem 2's token bound
        source = "theorem 2" if c.get("k_max") is None else f"2-D region, k_max {c['k_max']}"
        work = s["offered_work_rate"] / s["offered_rate"] if s.get("offered_rate") else None
        if c.get("k_max") is None and work and s["critical_rate"] * work > s["token_capacity"] * (1 + 1e-9):
            # a load-only model whose b / t(b) peaks below b_max: smaller steps serve more
            # than theorem 2's b_max / t(b_max) (docs/stability.md)
            source = "b / t(b) peaks below b_max, not theorem 2"
        rows.append((f"critical rate lambda* ({source})", f"{small_number(s['critical_rate'], ',.2f')} req/s"))
    if s.get("utilisation") is not None:
        rows.append(("utilisation (offered / lambda*)", f"{s['utilisation']:.1%}"))
    own = s.get("policy_critical_rate")
    if own is not None and s.get("critical_rate") and own < s["critical_rate"] * (1 - 1e-9):
        # full steps of b_max serve less than lambda*'s steps: this policy's own limit
        util = s.get("policy_utilisation")
        rows.append(
            (
                f"{c.get('policy', 'the policy')}'s limit (full steps of b_max)",
                f"{small_number(own, ',.2f')} req/s" + (f" ({util:.1%} offered)" if util is not None else ""),
            )
        )
    from ..theory import describe_verdict  # noqa: PLC0415 - numpy: only once there is a result

    verdict = describe_verdict(s)
    if verdict is not None:
        rows.append(("stability (backlog growth, 95% CI)", verdict))
    rows.append(
        ("simulation wall time", f"{s['wall_s']:.2f} s ({s['num_requests'] / max(s['wall_s'], 1e-9):,.0f} req/s)")
    )
    print(render_table(title, ("metric", "value"), rows, (False, True)))


# ---- other commands ----------------------------------------------------------------------
def cmd_schedulers(args) -> int:
    from rich.table import Table  # noqa: PLC0415

    from ..policies import list_policies  # noqa: PLC0415

    t = Table(title=f"llmsched {args.command}")  # (titled by the command that prints it)
    t.add_column("kind")
    t.add_column("name")
    t.add_column("rule")
    for kind, name, summary in list_policies():
        t.add_row(kind, name, summary)
    console().print(t)
    return 0


def cmd_plot(args) -> int:
    from ..plots import plot_dir  # noqa: PLC0415

    for path in plot_dir(args.dir):
        print(path)
    return 0


COMMANDS = ("simulate", "schedulers", "plot")  # what `register` adds


def simulate_parser() -> Parser:
    """simulate's parser alone: its flags are the options a sweep's grid may set."""
    sub = Parser().add_subparsers()
    register(sub)
    return sub.choices["simulate"]


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a workload on a server, a cluster or a network",
        description="Simulate a workload under a batch policy and write its results. "
        "--replicas N puts N copies of the server behind a --router; "
        "--network FILE simulates a YAML network of servers and job routes.",
    )
    p.add_argument("--config", type=file_path, help="YAML file with any of the options (flags override it)")
    add_scheduler_args(p)
    add_cost_model_arg(p)
    add_workload_args(p)
    g = p.add_argument_group("clusters and networks")
    g.add_argument(
        "--replicas",
        type=positive_int,
        help="simulate N replicas of the server behind a router (default: one server, no router); their requests "
        "are drawn as a network's, the same for every N, not one server's: --replicas 1 differs from one server "
        "by its draws",
    )
    g.add_argument("--router", help="random, round-robin, jsq (default), least-tokens, power-of-two")
    g.add_argument(
        "--network", metavar="FILE", type=file_path, help="a YAML network of servers and job routes (docs/networks.md)"
    )
    g.add_argument("--scale", type=float, help="--network, --serverless: multiply every arrival rate by K (default 1)")
    g = p.add_argument_group("serverless platforms")
    g.add_argument(
        "--serverless",
        metavar="FILE",
        type=file_path,
        help="a YAML serverless platform: GPU nodes, models with cold starts, workload (docs/serverless.md)",
    )
    g.add_argument(
        "--platform-scheduler",
        help="--serverless: fcfs, round-robin, priority, dynamicbatch, twp or serverlessllm (default: the file's)",
    )
    g = p.add_argument_group("run and output")
    g.add_argument(
        "--slo",
        action="append",
        metavar="METRIC=MS",
        dest="request_slo",
        help="a per-request objective for goodput (repeatable): ttft_ms, tpot_ms, e2el_ms, itl_ms (each "
        "request's mean inter-token gap, = tpot_ms; either, the smaller of both, is the ITL target of twp "
        "and dynamicbatch unless --admission-option itl_target_ms is given; itl_p99_ms is an older name of "
        "it, not a p99). "
        "A run's statistics (p99_itl_ms, ...) are limits of `sweep --search`",
    )
    g.add_argument(
        "--max-time",
        type=float,
        dest="max_time_s",
        help="stop the simulation at this time (s; default: when every request has finished)",
    )
    g.add_argument(
        "--sample-interval",
        type=float,
        dest="sample_interval_s",
        help="time-series sampling interval in s, at least 1e-6, at most 1,000,000 samples a run "
        "(default: the arrivals' span / 1000, at least 0.01, doubled as needed, at most 4,096 samples a series)",
    )
    g.add_argument("--exact", action="store_true", help="step by step, without the fast path")
    g.add_argument("--steps", action="store_true", dest="record_steps", help="also write steps.csv (one row per step)")
    g.add_argument(
        "--parquet",
        action="store_true",
        help="also write requests.parquet, timeseries.parquet (and steps.parquet with --steps): typed "
        "columns for pandas/polars; needs pyarrow (pip install 'llmsched[analysis]')",
    )
    g.add_argument("--out", default=None, help="output folder (default results, or none with --json; '' for none)")
    g.add_argument(
        "--json", action="store_true", help="print the summary as JSON on stdout (and write files only with --out)"
    )
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    g.add_argument("--quiet", action="store_true", help="print nothing but --json's output")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedulers", help="list the policies", description="List batch and admission policies.")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser(
        "plot",
        help="draw figures of a results folder",
        description="Draw queue.png, ttft_cdf.png, itl_cdf.png, token_load.png in DIR.",
    )
    p.add_argument("dir", help="a folder written by `llmsched simulate --out`")
    p.set_defaults(func=cmd_plot)
