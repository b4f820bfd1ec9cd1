"""`llmsched capacity`, `sweep`, `reproduce` and `validate`: thin wrappers over
`llmsched.analysis` and `llmsched.theory`.

The analysis modules (numpy, the simulator) are imported when a command runs, so that
`llmsched --help` and the other commands do not pay for them.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from ..core.constraints import k_max_binds
from ..core.errors import ConfigError
from ..core.guarantee import CAP, COST, FILL, REGION
from ..core.jsonio import to_jsonable
from ..core.paths import atomic_write, check_out_dir, check_out_file, check_run_dir, is_a_figure
from .common import (
    DEFAULTS,
    add_cost_model_arg,
    add_parallel_args,
    add_scheduler_args,
    add_workload_args,
    bounded_float,
    check_replaces_own_file,
    config_file_layout,
    console,
    file_path,
    flag_keys,
    flag_of,
    folder_shown,
    is_given,
    not_together,
    only_with,
    policy_names,
    positive_int,
    print_grid,
    print_table,
    sim_overrides,
    small_number,
)
from .engine import CALIBRATE_S, REPS, add_engine_args, check_measurement_times, engine_setup

#: The finest search tolerance (a fraction of lambda*): a bisection to 1e-300 runs about
#: a thousand rounds of simulations (it hung); 0.001 takes about ten.
MIN_TOL = 1e-3
#: The largest first upper end of a rate search, in lambda* (inf hung).
MAX_SEARCH_HI = 100.0


_tolerance = bounded_float("the tolerance", MIN_TOL, 1.0, hi_open=True)
_search_hi = bounded_float("the search's upper end", 1e-3, MAX_SEARCH_HI, hi_open=False)

__all__ = ["register", "cmd_capacity", "cmd_sweep", "cmd_reproduce", "cmd_validate"]


def _check_parallel(args) -> None:
    """The parallel options, before any work: --workers from 1 to the backends' maximum (a
    pool forks its processes up front: `--workers 100000` forked thousands); --address
    only with --backend ray."""
    from ..analysis.runner import check_workers  # noqa: PLC0415

    if getattr(args, "backend", None) != "ray" and getattr(args, "address", None):
        raise ConfigError("--address is a Ray cluster's: give --backend ray")
    check_workers(args.workers, "--workers")


def _num(x, fmt: str = ",.2f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    return format(x, fmt)


def _print_rows(title: str, rows: list[dict], cols: list[tuple[str, str, str]]) -> None:
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=title)
    for _, head, _f in cols:
        t.add_column(head, justify="left" if _f == "s" else "right")
    for r in rows:
        cells = []
        for key, _h, f in cols:
            v = r.get(key)
            if isinstance(v, bool):
                cells.append("yes" if v else "NO")
            elif v is None:
                cells.append("-")
            elif f == "s" or isinstance(v, str):
                cells.append(str(v))
            else:
                cells.append(_num(v, f))
        t.add_row(*cells)
    console().print(t)


# ---------------------------------------------------------------------------------------
# capacity


def cmd_capacity(args) -> int:
    from ..analysis.capacity_report import CAPACITY_IGNORES, capacity_report, rep_law  # noqa: PLC0415

    if not args.find_counterexample:
        only_with(args, ("load", "seeds", "workers"), "--find-counterexample")
    _check_parallel(args)
    # a flag that does not apply is the error, before any flag's value is read
    if args.network:
        return _network_capacity(args, "--network FILE")
    if config_file_layout(args.config) == "network":  # (a cluster's too): judged as simulate runs it
        args.network, args.config = args.config, None
        return _network_capacity(args, "--config FILE (a network's servers and jobs, judged as --network FILE)")
    given = sim_overrides(args, parse=False)
    for key in CAPACITY_IGNORES:
        if given.get(key) is not None:
            instead = "simulate with it"
            if key == "prefix_caching":
                instead = "--cached-fraction gives a prefix cache's share"
            raise ConfigError(
                "capacity's bounds do not model admission, a running cap or the KV cache; "
                f"{flag_of(key)} does not apply ({instead})"
            )
    over = sim_overrides(args)
    rate = over.pop("rate", None)
    _check_capacity_inputs(args, over)
    if args.lengths:
        if args.prompt or args.output:
            raise ConfigError("give --lengths FILE or --prompt/--output, not both")
        from ..workload.datasets import is_dataset, not_a_file  # noqa: PLC0415

        # named here: the laws' own check called a missing file "prompt: file X does not exist"
        path = Path(os.path.expanduser(args.lengths))
        if not path.is_file() and (path.exists() or not is_dataset(args.lengths)):
            raise ConfigError(f"--lengths: {not_a_file(path)}")
        over["prompt"] = over["output"] = f"empirical:{args.lengths}"
    from ..workload.csvio import MAX_LENGTH  # noqa: PLC0415 (numpy loads after the CLI sets its threads)

    for role, v in (("prompt", args.mean_prompt), ("output", args.mean_output)):
        # a request has at least one token (a mean of 1e-300 gave a silent, meaningless report)
        if v is not None and not 1 <= v <= MAX_LENGTH:
            raise ConfigError(
                f"--mean-{role}: the mean {role} must be a number of tokens from 1 to {MAX_LENGTH:,}, got {v:g}"
            )
    samples = args.samples
    if samples is not None and samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {samples}")
    from ..workload.arrivals import MAX_REQUESTS  # noqa: PLC0415

    if samples is not None and samples > MAX_REQUESTS:  # (the draw's limit named num_requests, no flag)
        raise ConfigError(f"--samples must be at most {MAX_REQUESTS:,}, got {samples:,}")
    if args.plot is not None:
        _check_plot_reads_nothing(args, over)
    if args.find_counterexample:  # a cap that cannot bind: refused before any work
        from ..analysis.counterexample import check_binding_cap  # noqa: PLC0415
        from ..api import build_config  # noqa: PLC0415

        _seeds(args.seeds)  # (a malformed flag first, as before)
        cfg = build_config(args.config, **over)
        check_binding_cap(cfg.b_max, cfg.k_max)
    rep = capacity_report(
        args.config,
        mean_prompt=args.mean_prompt,
        mean_output=args.mean_output,
        rate=rate,
        samples=samples,
        plot=args.plot,
        cached_fraction=args.cached_fraction,
        **over,
    )
    cands = None
    if args.find_counterexample:
        from ..analysis.counterexample import find_counterexample  # noqa: PLC0415

        if args.prompt or args.output or args.lengths:
            cands = [(over["prompt"] or rep_law(rep, "prompt"), over["output"] or rep_law(rep, "output"))]
        rep["counterexample"] = find_counterexample(
            rep["cost_model"],
            rep["b_max"],
            rep["k_max"],
            load=0.85 if args.load is None else args.load,
            policy=(args.policy or "sarathi"),
            candidates=cands,
            num_requests=4000 if args.num_requests is None else args.num_requests,
            seeds=_seeds(args.seeds),
            workers=args.workers,
            progress=(not args.json) and sys.stderr.isatty(),
        )
    if args.json:
        print(json.dumps(to_jsonable(rep), indent=2, default=str))
        return 0
    # a search over its own candidates: the default workload's table would describe none of them
    _print_capacity(rep, table=not (args.find_counterexample and cands is None))
    return 0


def _share(x: float, sign: str = "") -> str:
    """A share as a percentage with one decimal, or 3 significant digits where that would
    run to many digits (a rate of 1e-9 req/s: margin +1999834768308.0%) or, for a share
    without a sign (a utilisation), print a positive one as 0.0%."""
    if x and (abs(x) >= 1e4 or (not sign and x < 5e-4)):
        return f"{x * 100:{sign}.3g}%"
    return f"{x:{sign}.1%}"


def _check_capacity_inputs(args, over: dict) -> None:
    """What capacity would ignore is refused (a scheduler option the bounds do not model,
    set in --config: by `capacity_report`): a length law whose mean --mean-prompt/--mean-output gives, --samples
    with both means given, a run length with nothing to run, an empty --lengths."""
    from ..api import build_config  # noqa: PLC0415
    from ..workload import replays_trace  # noqa: PLC0415

    if args.lengths == "":
        raise ConfigError("--lengths: give a CSV file or a dataset name, got ''")
    for mean, role in ((args.mean_prompt, "prompt"), (args.mean_output, "output")):
        if mean is None:
            continue
        for flag, v in ((f"--{role}", args.prompt if role == "prompt" else args.output), ("--lengths", args.lengths)):
            if v is not None:
                raise ConfigError(f"--mean-{role} and {flag} both give the {role} lengths: give one")
    if args.mean_prompt is not None and args.mean_output is not None:
        for flag, v in (("--samples", args.samples), ("--seed", over.get("seed"))):
            if v is not None:
                raise ConfigError(
                    f"{flag} sets the draws of the means, which --mean-prompt and --mean-output give: it does not apply"
                )
    if over.get("num_requests") is None and over.get("duration_s") is None:
        return
    if not replays_trace(build_config(args.config, **over).workload):
        if over.get("duration_s") is not None:
            raise ConfigError("--duration cuts a replayed trace (--trace): without one it does not apply")
        if not args.find_counterexample:
            raise ConfigError(
                "--num-requests sets the runs of --find-counterexample (or cuts a --trace): it does not apply"
            )


def _check_plot_reads_nothing(args, over: dict) -> None:
    """--plot must not name a file the configuration reads (a trace, a length table, a
    profile, the --config file): the figure was written over it, exit 0."""
    from ..analysis.capacity_report import plot_path  # noqa: PLC0415
    from ..api import build_config  # noqa: PLC0415
    from ..core.paths import check_not_an_input  # noqa: PLC0415
    from ..workload.datasets import file_stamps  # noqa: PLC0415

    target = plot_path(args.plot)  # (the name the figure gets: .png added to a bare name)
    cfg = build_config(args.config, **over)
    inputs = [f for f, _, _ in file_stamps({"cost_model": cfg.cost_model, "workload": cfg.workload})]
    if isinstance(args.config, str):
        inputs.append(args.config)
    check_not_an_input(target, inputs, "--plot")
    # nor a file of the user's that the figure would replace (notes.png holding text was
    # overwritten, exit 0): an earlier figure, of the format its name says, is replaced
    check_replaces_own_file(str(target), "--plot", "a figure", is_a_figure)


def _network_capacity(args, declared: str) -> int:
    from ..theory.network import network_capacity_report, network_capacity_rows, network_server_rows  # noqa: PLC0415

    over = sim_overrides(args, parse=False)
    rate = over.pop("rate", None)
    given = [flag_of(k) for k, v in over.items() if v is not None and k not in ("fast", "record_steps")]
    for flag, v in (
        ("--rate", rate),
        ("--config", args.config),
        ("--mean-prompt", args.mean_prompt),
        ("--mean-output", args.mean_output),
        ("--lengths", args.lengths),
        ("--samples", args.samples),
        ("--cached-fraction", args.cached_fraction or None),
        ("--plot", args.plot),
        ("--find-counterexample", args.find_counterexample or None),
    ):
        if v is not None:
            given.append(flag)
    if given:
        raise ConfigError(f"{declared} declares its servers and workload; {given[0]} does not apply")
    rep = network_capacity_report(args.network)
    if args.json:
        print(json.dumps(to_jsonable(rep), indent=2, default=str))
        return 0
    print_grid(f"llmsched capacity: {args.network}", network_server_rows(rep))
    print_table("network", network_capacity_rows(rep))
    return 0


def _whole_numbers(text: str, flag: str, what: str = "whole numbers") -> list[int]:
    """A flag's comma-separated whole numbers: an empty item (`0,,1`, a trailing comma) is
    refused as `sweep --grid` refuses it, not dropped."""
    parts = [s.strip() for s in str(text).split(",")]
    if str(text).strip() and any(p == "" for p in parts):
        raise ConfigError(f"{flag}: empty value in {text!r}")
    try:
        return [int(s) for s in parts if s]
    except ValueError:
        raise ConfigError(f"{flag} must be a comma-separated list of {what}, got {text!r}") from None


def _seeds(text: str | None) -> list[int]:
    if text is None:
        return [0, 1]
    out = _whole_numbers(text, "--seeds")
    if not out or any(s < 0 for s in out):
        raise ConfigError(f"--seeds must list whole numbers >= 0, got {text!r}")
    return out


#: how a context-dependent model's steps were timed, after t(b_max)
_CONTEXTS = {
    "length mix": " (contexts of the workload's length mix)",
    "mean lengths": " (contexts of the mean lengths: optimistic if lengths vary)",
}


def _print_capacity(rep: dict, table: bool = True) -> None:
    """The capacity table (`table`), then the counterexample search's outcome if it ran."""
    c = rep["capacity"]
    t_ms = c["step_time_at_b_max_s"] * 1e3
    rows = [
        ("cost model", str(rep["cost_model"])),
        ("b_max / k_max", f"{rep['b_max']} / {rep['k_max'] if rep['k_max'] is not None else 'none'}"),
        ("step time t(b_max)", f"{small_number(t_ms, ',.2f')} ms{_CONTEXTS.get(c['contexts'], '')}"),
        ("token capacity b_max / t(b_max)", f"{small_number(c['token_capacity'], ',.1f')} tokens/s"),
        ("mean prompt / output", f"{c['mean_prompt']:,.1f} / {c['mean_output']:,.1f} tokens ({rep['means_source']})"),
        ("work per request (prompt + output - 1)", f"{c['work_per_request']:,.1f} tokens"),
        *(
            [("  of the prompt, cached (not work)", f"{c['cached_prompt_per_request']:,.1f} tokens")]
            if c.get("cached_prompt_per_request")
            else []
        ),
        ("theorem 2 rate C / w", f"{small_number(c['critical_rate_token_bound'], ',.3f')} req/s"),
        ("critical rate lambda*", f"{small_number(c['critical_rate'], ',.3f')} req/s ({c['binding']})"),
    ]
    if c["peak_token_capacity"] > c["token_capacity"] * (1 + 1e-9):
        rows.append(
            (
                "note: peak b / t(b)",
                f"{small_number(c['peak_token_capacity'], ',.1f')} tokens/s at b = {c['peak_load']} "
                "(b/t(b) peaks below b_max: theorem 2's assumption fails)",
            )
        )
    bound = c.get("shape_bound_rate")
    if bound is not None and bound > c["critical_rate"] * 1.001:
        rows.append(
            (
                "note: other step shapes",
                f"up to {bound:,.3f} req/s (+{bound / c['critical_rate'] - 1:.1%}) time-sharing step shapes "
                "(the region's LP, e.g. prefill-only and decode-only steps): lambda* is full mixed steps' "
                "(Sarathi); Orca may pass it",
            )
        )
    if c["critical_rate"] > c["critical_rate_token_bound"] * (1 + 1e-9):
        # (a load-only model whose b / t(b) peaks below b_max: a context-dependent one's
        # lambda* is never above C / w, the region's step shapes are `shape_bound_rate`)
        why = "t(b)/b is least below b_max: a policy filling every step to b_max is stable only below C / w"
        rows.append(("note: lambda* above C / w", f"theorem 2 does not give lambda*: {why}"))
    if "region" in rep:
        verts = ", ".join(
            f"({v['prefill_tokens']},{v['decode_tokens']})"
            for v in rep["region"]["vertices"]
            if v["prefill_tokens"] + v["decode_tokens"] > 0
        )
        rows.append(("region vertices: step shapes (prefill, decode)", verts))
    if "largest_prompt" in rep:
        longest = rep["largest_prompt"]
        rows.append(
            (
                "region: prefill per request in a step",
                f"at most {longest:,} tokens (the longest prompt"
                + (", less its cached share)" if c.get("cached_prompt_per_request") else ")")
                if longest is not None
                else "any number (no longest prompt known: --mean-prompt, or a law without max=); "
                "with prompts shorter than a vertex's prefill lambda* can exceed what any policy serves",
            )
        )
    if c.get("region_note"):
        rows.append(
            (
                "note: region",
                f"lambda* is an upper bound: {c['region_note'].removesuffix(': lambda* is an upper bound')}",
            )
        )
    own = rep.get("policy_critical_rate")
    kinds = set(rep["not_throughput_optimal_kinds"])
    capped = k_max_binds(rep["b_max"], rep["k_max"])
    if kinds:
        if kinds == {FILL}:
            why = (
                f"{rep['policy']} fills every step to b_max {rep['b_max']}, but b / t(b) peaks at b = "
                f"{c['peak_load']}: it is stable only below {small_number(own, ',.3f')} req/s (fill capacity / work), "
                "under lambda*; "
                "adaptive runs lambda*'s steps"
            )
        elif kinds == {REGION}:
            why = (
                f"{rep['policy']} picks its steps from the region, but the region is an upper bound here "
                "(region_exact false: prompts cut into its chunks can need more requests per step than k_max "
                "allows): lambda* may lie above what any policy serves; check by simulation"
            )
        elif kinds == {CAP}:
            why = (
                f"k_max {rep['k_max']} < b_max {rep['b_max']}: a policy filling every step ({rep['policy']}) can be "
                "unstable inside the region (paper 1), so lambda* bounds its stable rates from above only "
                "(adaptive picks its steps from the region)"
            )
        elif COST in kinds:
            why = (
                f"{rep['not_throughput_optimal']}: it picks the steps of another model's region, so lambda* "
                "bounds its stable rates from above only (drop its cost= option to plan with the run's)"
            )
        else:
            why = (
                f"{rep['policy']} is not work-conserving: lambda* bounds its stable rates from above only, "
                "its queue may grow below it (its own limit: sweep --search max-stable-rate)"
            )
        rows.append(("note: policy", why))
    # a policy filling every step grows at its own limit where full steps serve less than
    # lambda*'s (b / t(b) peaks below b_max: a reason of kind FILL)
    own_growth = FILL in kinds and own is not None and own < c["critical_rate"] * (1 - 1e-9)
    growth = rep.get("policy_predicted_growth_tokens_per_s") if own_growth else c["predicted_growth_tokens_per_s"]
    if rep.get("rate") is not None:
        offered = small_number(c["offered_tokens_per_s"], ",.1f")
        arrival = f"{small_number(rep['rate'], ',.3f')} req/s ({offered} tokens/s)"
        per = rep.get("requests_per_rate")
        if per is not None:
            ts = rep.get("time_scale", 1.0)
            what = f"{small_number(rep['rate'], ',.3f')} req/s"
            if rep.get("rate_unit") == "conversations/s":
                what = f"{small_number(rep['rate'], ',.3f')} conversations/s x {per / ts:.3g} mean turns"
            arrival = (
                what
                + (f" x time scale {ts:g}" if ts != 1.0 else "")
                + f" = {small_number(rep['request_rate'], ',.3f')} req/s"
                + f" ({offered} tokens/s)"
            )
        rows += [
            ("arrival rate", arrival),
            ("utilisation rate / lambda*", _share(rep["utilisation"])),
            (
                "inside the stability region",
                f"{'yes' if rep['inside'] else 'NO'} (rate can be scaled by "
                f"{rep['scale']:.4g}, margin {_share(rep['margin'], '+')})"
                + (
                    ""
                    if rep["throughput_optimal"] or not rep["inside"]
                    else f"; not a guarantee for {rep['policy']}"
                    + (
                        f": {'below' if rep['policy_inside'] else 'NOT below'} its own limit "
                        f"{small_number(own, ',.3f')} req/s "
                        f"({rep['policy_utilisation']:.1%})"
                        if own is not None
                        else ""
                    )
                ),
            ),
            (
                # theorem 2's growth of a work-conserving policy holds only without a binding
                # cap, and only with b / t(b) largest at b_max; elsewhere a policy filling every
                # step grows at its own limit, and the growth at lambda*'s steps is the best policy's
                f"fluid backlog growth ({rep['policy']}: full steps of b_max)"
                if own_growth
                else "fluid backlog growth (work-conserving)"
                if not capped and c["critical_rate"] <= c["critical_rate_token_bound"] * (1 + 1e-9)
                else "fluid backlog growth (at lambda*'s steps)",
                f"{small_number(growth, ',.1f')} tokens/s",
            ),
        ]
    if rep.get("plot"):
        rows.append(("region plot", rep["plot"]))
    if table:
        print_table("llmsched capacity", rows)
    elif rep.get("plot"):  # the file --plot wrote, without the table that would name it
        print(f"region plot: {rep['plot']}")
    ce = rep.get("counterexample")
    if ce is not None:
        if not ce["found"]:
            undecided = sum(bool(t.get("inconclusive")) for t in ce["tried"])
            print(
                f"no counterexample confirmed among {len(ce['tried'])} candidate workloads "
                f"(load {ce['load']:g} of lambda*)"
                + (f"; {undecided} inconclusive (longer runs may decide: --num-requests)" if undecided else "")
            )
            return
        fmt = lambda vs: ", ".join(  # noqa: E731
            f"seed {v['seed']}: {v.get('verdict') or ('stable' if v['stable'] else 'unstable')} "
            f"({_num(v['backlog_growth_tokens_per_s'], ',.0f')} tok/s)"
            for v in vs
        )
        print_table(
            "counterexample: inside the region, unstable at full budget",
            [
                ("workload", f"prompt {ce['workload']['prompt']}, output {ce['workload']['output']}, Poisson"),
                (
                    "rate / lambda* (region)",
                    f"{ce['rate']:.4g} / {ce['critical_rate']:.4g} req/s "
                    f"(theorem 2 alone: {ce['critical_rate_token_bound']:.4g})",
                ),
                ("region margin (largest scale factor)", f"{ce['scale']:.4g} ({ce['margin']:+.1%})"),
                (f"{ce['policy']} (b_max {ce['b_max']}, k_max {ce['k_max']})", fmt(ce["runs"])),
                ("adaptive", fmt(ce["adaptive"])),
            ],
        )


# ---------------------------------------------------------------------------------------
# sweep


def cmd_sweep(args) -> int:
    from ..analysis.sweep import run_sweep  # noqa: PLC0415

    not_together(args, "progress", "quiet", "a progress bar, or print nothing")
    if not args.grid and not args.search:
        raise ConfigError("give at least one --grid KEY=VALUES (or --search max-stable-rate)")
    if not args.search:
        only_with(args, ("tol", "search_hi"), "--search max-stable-rate")
    _check_parallel(args)
    check_run_dir(args.out, "sweep", "--out")  # '' (no folder), another run's folder: before any run
    fixed = sim_overrides(args)
    grid = _grid_in_option_keys(args.grid)
    _check_fixed_not_gridded(grid, fixed)
    res = run_sweep(
        args.config,
        grid,
        out_dir=args.out,
        backend=args.backend,
        workers=args.workers,
        address=args.address,
        search=args.search,
        slo=args.slo,
        tol=0.02 if args.tol is None else args.tol,
        search_hi=1.25 if args.search_hi is None else args.search_hi,
        plots=not args.no_plots,
        progress=False if args.quiet else args.progress,
        quiet=args.quiet,
        **fixed,
    )
    if args.json:
        print(
            json.dumps(
                to_jsonable(
                    {
                        "points": len(res.rows),
                        "ran": res.ran,
                        "skipped": res.skipped,
                        "errors": res.errors,
                        "wall_s": res.wall_s,
                        "files": res.files,
                        "search": res.search,
                    }
                ),
                indent=2,
            )
        )
        return _sweep_status(res)
    if args.quiet:
        return _sweep_status(res)
    if res.search is not None:
        _print_search(res.search)
    print(
        f"{len(res.rows)} point{'' if len(res.rows) == 1 else 's'}: {res.ran} simulated, {res.skipped} already done"
        + (f", {res.errors} failed (see the error column)" if res.errors else "")
        + f"; {res.wall_s:.1f} s"
    )
    if res.files:
        names = (os.path.basename(f) + ("/" if os.path.isdir(f) else "") for f in res.files)
        print(f"written to {folder_shown(args.out)}: " + ", ".join(names))
    return _sweep_status(res)


def _grid_in_option_keys(grid: list[str] | None) -> list[str] | None:
    """`--grid` specs with each simulate flag's spelling as the option it sets
    (`max-time=1,2` is `max_time_s=1,2`): a grid's keys are the options' names, which some
    flags spell otherwise. `exact`, a switch with no values, is refused naming `fast`."""
    from ..analysis.grid import grid_keys  # noqa: PLC0415
    from .simulate import simulate_parser  # noqa: PLC0415

    if grid is None:
        return None
    keys = flag_keys(simulate_parser(), set(grid_keys()))
    out = []
    for item in grid:
        given, sep, values = item.partition("=")
        spelled = given.strip().replace("-", "_")
        if spelled == "exact":
            raise ConfigError("grid key 'exact': --exact is a switch; grid fast=false (as --exact) or fast=true,false")
        out.append(f"{keys[spelled]}={values}" if sep and spelled in keys else item)
    return out


def _check_fixed_not_gridded(grid, fixed: dict) -> None:
    """A flag that the grid also sets would do nothing (each point takes the grid's
    value): refused, naming both. `--rate` with a `load` grid as well."""
    from ..analysis.grid import parse_grid  # noqa: PLC0415
    from ..analysis.sweep import fixed_in_grid  # noqa: PLC0415

    clash = fixed_in_grid(parse_grid(grid), fixed)
    if clash is not None:  # (run_sweep refuses it too, naming options, not flags)
        key, gkey = clash
        raise ConfigError(f"{flag_of(key)} and --grid {gkey}=... both set each point's {key}: give one")


#: Search table columns shown by `_print_search` (the others are the group's grid values).
SEARCH_COLUMNS = (
    "policy_name",
    "critical_rate",
    "policy_critical_rate",
    "rate_unit",
    "max_stable_rate",
    "max_stable_load",
    "max_stable_lower_bound",
    "max_stable_upper_bound",
    "inconclusive_low",
    "inconclusive_high",
    "inconclusive_probes",
    "inconclusive_above_unstable",
    "unstable_rate",
    "failed_rate",
    "probes",
    "max_slo_rate",
    "max_slo_load",
    "slo_miss_rate",
    "run_slo",
)


def _below(r: dict, rate_key: str, load_key: str, low) -> None:
    """Show a search answer of 0 (no probe passed) as below `low`, the lowest rate that
    failed (0.000 would read as a rate found), and its load likewise."""
    if r.get(rate_key) != 0 or low is None:
        return
    r[rate_key] = f"< {low:,.3f}"
    lam = r.get("critical_rate")
    r[load_key] = f"< {low / lam:.3f}" if lam else None


def _mark_bounds(r: dict) -> None:
    """A stability table's row whose max stable rate is a bound (its `max_stable_upper_bound`
    or `max_stable_lower_bound` flag): `< rate` or `>= rate`, and its load likewise."""
    for flag, sign in (("max_stable_upper_bound", "<"), ("max_stable_lower_bound", ">=")):
        if r.get(flag) and r.get("max_stable_rate") is not None:
            r["max_stable_rate"] = f"{sign} {r['max_stable_rate']:,.3f}"
            if r.get("max_stable_load") is not None:
                r["max_stable_load"] = f"{sign} {r['max_stable_load']:.3f}"


def _print_search(search: list[dict]) -> None:
    """The search table: per group, the max stable rate, the rates judged inconclusive
    above it, the first rate judged unstable, and a failed probe where a search stopped."""
    from ..analysis.tables import grid_cell  # noqa: PLC0415

    # (a grid's mapping as JSON, as search.csv writes it, not Python's repr)
    shown = [
        {
            **{k: grid_cell(v) for k, v in r.items()},
            "inconclusive": _rate_range(r["inconclusive_low"], r["inconclusive_high"]),
        }
        for r in search
    ]
    for r in shown:
        _below(r, "max_slo_rate", "max_slo_load", r.get("slo_miss_rate"))  # no probed rate met the SLOs
        # no probe stable (`< rate`), or every probe up to the widest stable (`>= rate`)
        _mark_bounds(r)
    cols = [(k, k, "s") for k in (search[0] if search else {}) if k not in SEARCH_COLUMNS]
    cols += [
        ("critical_rate", "lambda* (theory)", ",.3f"),
        ("max_stable_rate", "max stable rate", ",.3f"),
        ("max_stable_load", "/ lambda*", ".3f"),
        ("inconclusive", "inconclusive", "s"),
        ("unstable_rate", "first unstable", ",.3f"),
    ]
    if any(r.get("failed_rate") is not None for r in search):
        cols.append(("failed_rate", "failed probe", ",.3f"))
    if search and "max_slo_rate" in search[0]:
        cols += [("max_slo_rate", "max rate meeting SLOs", ",.3f"), ("max_slo_load", "/ lambda*", ".3f")]
    units = sorted({r.get("rate_unit") or "req/s" for r in search})
    if units != ["req/s"]:  # with --turns a rate counts conversations, lambda* too
        cols.insert(cols.index(("critical_rate", "lambda* (theory)", ",.3f")), ("rate_unit", "rates in", "s"))
        for r in shown:
            r["rate_unit"] = r.get("rate_unit") or "req/s"
    _print_rows("maximum stable rate (bisection on the stability verdict)", shown, cols)
    for row in search:
        name = row.get("policy", "a policy")
        own, lam = row.get("policy_critical_rate"), row.get("critical_rate")
        if own is not None and lam and own < lam * (1 - 1e-9):
            print(
                f"note: {name} fills every step to b_max, where b / t(b) is below its peak: it is stable only "
                f"below {own:,.3f} ({own / lam:.3f} of lambda*), the rate its full steps serve"
            )
        if row.get("failed_rate") is not None:
            print(
                f"note: {name}'s search stopped at a failed probe (rate {row['failed_rate']:.4g}): a failed run "
                "is no verdict, so there is no answer; see the error column of results.csv"
            )
        elif not row.get("max_stable_upper_bound") and (row.get("max_stable_rate") or 0) > (
            row.get("critical_rate") or float("inf")
        ):
            print(
                # (with a binding k_max lambda* is the region's, not theorem 2's)
                f"note: {name}'s max stable rate is above lambda*, "
                f"which no policy can sustain: the runs are too short to resolve loads this close "
                f"to capacity; use more requests (--num-requests)"
            )
        elif row.get("max_stable_rate") is None:
            print(
                f"note: no probe of {name} was judged stable or unstable "
                f"({_rate_range(row['inconclusive_low'], row['inconclusive_high'])}, inconclusive): the search has "
                "no answer, no bound on its max stable rate; use more requests (--num-requests)"
            )
        elif row.get("inconclusive_probes") and row.get("unstable_rate") is None:
            print(
                f"note: no probe of {name} was judged unstable (up to {row['inconclusive_high']:.4g}, "
                "inconclusive): use more requests (--num-requests)"
            )
        if row.get("max_stable_lower_bound"):
            load = row.get("max_stable_load")
            print(
                f"note: every probe of {name} was judged stable, up to the widest rate searched "
                f"({row['max_stable_rate']:.4g}" + (f", {load:.3g} lambda*" if load is not None else "") + "): "
                "its max stable rate is a lower bound, not a boundary; raise --search-hi to look higher"
            )
        if row.get("inconclusive_above_unstable") and row.get("unstable_rate") is not None:
            n = row["inconclusive_above_unstable"]
            print(
                f"note: {name}'s verdicts are not monotone in the rate (the bisection assumes they are): {n} "
                f"probe{'s' * (n > 1)} above the first unstable rate ({row['unstable_rate']:.4g}) judged "
                "inconclusive, left out of the inconclusive range; more requests per probe (--num-requests) "
                "give firmer verdicts"
            )


def _rate_range(lo, hi) -> str | None:
    """`lo-hi` (or one rate) for a table cell, None when there is none."""
    if lo is None:
        return None
    return f"{lo:,.3f}" if hi == lo else f"{lo:,.3f}-{hi:,.3f}"


def _sweep_status(res) -> int:
    """1, with one line on stderr, when points failed: the table and files hold the rest,
    but a failed point is no result (a search stops at a failed probe, with no answer)."""
    if not res.errors:
        return 0
    first = next((r["error"] for r in res.rows if r.get("error")), "")
    print(
        f"llmsched sweep: error: {res.errors} of {len(res.rows)} points failed (the error column of results.csv); "
        f"the first: {first}",
        file=sys.stderr,
    )
    return 1


# ---------------------------------------------------------------------------------------
# reproduce

EXPERIMENTS = ("stability", "clusters", "agents", "rybko-stolyar", "twp", "prefix-caching")
STABILITY_ONLY = ("workload", "cost_model", "b_max", "load", "search_requests", "tol", "policies", "no_search")


def cmd_reproduce(args) -> int:
    from ..analysis.reproduce import reproduce_stability  # noqa: PLC0415

    if args.out is None:
        args.out = f"reproduce-{args.experiment}"  # (where an interruption finds it too: `cli._files_complete`)
    out = args.out
    check_run_dir(out, f"reproduce {args.experiment}", "--out")  # '' (no folder), another run's folder
    check_out_dir(out, "--out")
    _check_parallel(args)
    if args.policies is not None:
        args.policies = ",".join(policy_names(args.policies))
    if args.experiment == "prefix-caching":
        return _reproduce_prefix(args, out)
    only_with(args, ("trace", "kv_capacities", "block_size"), "`reproduce prefix-caching`")
    if args.experiment != "stability":
        return _reproduce_other(args, out)
    if args.no_search:  # only the queue runs: a setting of the search would do nothing
        for key in ("search_requests", "tol"):
            if getattr(args, key) is not None:
                raise ConfigError(f"{flag_of(key)} sets the rate search: it has no effect with --no-search")
        if args.seeds is not None and len(_seeds(args.seeds)) > 1:
            raise ConfigError("--seeds: with --no-search give one seed (the queue runs'); more seed the search")
    args.workload = args.workload or "synthetic"
    args.load = 0.9 if args.load is None else args.load
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else None
    kw = {} if policies is None else {"policies": policies}
    res = reproduce_stability(
        args.workload,
        cost_model=args.cost_model,
        b_max=args.b_max,
        load=args.load,
        num_requests=args.num_requests,
        search_requests=args.search_requests,
        seeds=None if args.seeds is None else _seeds(args.seeds),
        tol=args.tol,
        quick=args.quick,
        search=not args.no_search,
        out_dir=out,
        backend=args.backend,
        workers=args.workers,
        address=args.address,
        progress=args.progress,
        **kw,
    )
    if args.json:
        print(json.dumps(to_jsonable(res), indent=2, default=str))
        return _search_failed(res, out)
    m = res["config"]
    shown = [dict(r) for r in res["rows"]]
    for r in shown:
        _mark_bounds(r)
    _print_rows(
        f"reproduce stability: {m['workload']} ({m['cost_model']}, b_max {m['b_max']}), "
        f"lambda* = {res['critical_rate']:.3f} req/s",
        shown,
        [
            ("policy_spec", "policy", "s"),  # (with its options: two runs of one policy differ)
            ("work_conserving", "work-conserving", "s"),
            ("stable_at_load", f"stable at load {args.load:g}", "s"),
            ("backlog_growth_tokens_per_s", "backlog growth tok/s", ",.0f"),
            ("in_system_at_end", "in system at end", ",.0f"),
            ("max_stable_rate", "max stable rate", ",.3f"),
            ("max_stable_load", "/ lambda*", ".3f"),
            ("critical_rate", "lambda* (theory)", ",.3f"),
        ],
    )
    short = [
        r["policy_spec"]
        for r in res["rows"]
        if r.get("stable_at_load") is True
        and r.get("max_stable_upper_bound") is not None  # (a search ran)
        # no probe stable: below a rate judged unstable, or no answer (every probe inconclusive)
        and (r.get("max_stable_load") is None or r["max_stable_upper_bound"] or r["max_stable_load"] < args.load)
    ]
    if short:
        print(
            f"note: {', '.join(short)} stable at load {args.load:g} in the queue runs ({m['queue_requests']:,} "
            f"requests) but not in the search: its probes ({m['search_requests']:,} requests) count an "
            "inconclusive verdict as not stable; give more --search-requests"
        )
    search = "" if args.no_search else f"; the rate search's points under {os.path.join(out, 'search')}/"
    print(f"{res['wall_s']:.1f} s; written: " + ", ".join(res["files"]) + search)
    return _search_failed(res, out)


def _search_failed(res: dict, out: str) -> int:
    """1, with one line on stderr, when a policy's rate search stopped at a failed probe:
    its max stable rate is then empty, which otherwise reads as every probe inconclusive
    (the run exited 0). A rerun retries the failed probes."""
    failed = res["search_failed"]
    if not failed:
        return 0
    p, rate = next(iter(failed.items()))
    print(
        f"llmsched reproduce: error: the rate search of {len(failed)} of {len(res['rows'])} policies stopped at a "
        f"failed probe ({p} at rate {rate:.4g}: the error column of {os.path.join(out, 'search', 'results.csv')}); "
        "a rerun retries it",
        file=sys.stderr,
    )
    return 1


def _reproduce_prefix(args, out: str) -> int:
    from ..analysis.reproduce_prefix import reproduce_prefix_caching  # noqa: PLC0415

    if args.trace is None:
        raise ConfigError(
            "reproduce prefix-caching needs --trace PATH (Mooncake JSON lines with hash_ids, or a CSV with block_ids@B)"
        )
    given = [k for k in ("workload", "search_requests", "tol", "policies", "seeds") if is_given(getattr(args, k))]
    # (its runs go one after the other, in this process)
    given += [k for k in ("workers", "address") if getattr(args, k) is not None]
    given += ["backend"] if args.backend != "local" else []
    if given or args.no_search:
        what = given[0].replace("_", "-") if given else "no-search"
        raise ConfigError(f"--{what} is not an option of `reproduce prefix-caching`")
    kw = {}
    if args.cost_model is not None:
        kw["cost_model"] = args.cost_model
    if args.b_max is not None:
        kw["b_max"] = args.b_max
    if args.load is not None:
        kw["loads"] = (args.load,)
    if args.kv_capacities is not None:
        caps = _whole_numbers(args.kv_capacities, "--kv-capacities", "whole numbers (tokens)")
        if not caps:
            raise ConfigError(f"--kv-capacities must be comma-separated whole numbers, got {args.kv_capacities!r}")
        kw["kv_capacities"] = tuple(caps)  # (a repeat or a capacity < 1: refused by the experiment)
    if args.block_size is not None:
        kw["block_size"] = args.block_size
    res = reproduce_prefix_caching(
        args.trace,
        out_dir=out,
        num_requests=args.num_requests,
        quick=args.quick,
        progress=not args.json and args.progress,
        **kw,
    )
    if args.json:
        print(json.dumps(to_jsonable(res), indent=2, default=str))
        return 0
    print_table("reproduce prefix-caching", [(k, str(v)) for k, v in res["summary"].items()], ("finding", "measured"))
    print(f"{res['wall_s']:.1f} s; written: " + ", ".join(res["files"]))
    return 0


def _reproduce_other(args, out: str) -> int:
    from ..analysis import reproduce_networks, reproduce_twp  # noqa: PLC0415

    twp_kw = _twp_choices(args) if args.experiment == "twp" else {}
    shared = TWP_SHARED if args.experiment == "twp" else ()
    for key in STABILITY_ONLY:
        if key not in shared and is_given(getattr(args, key)):
            owners = [f"`reproduce {e}`" for e in EXPERIMENTS if key in OPTIONS_OF[e]]
            named = owners[0] if len(owners) == 1 else ", ".join(owners[:-1]) + " and " + owners[-1]
            raise ConfigError(f"{flag_of(key)} is an option of {named}, not of `reproduce {args.experiment}`")
    fn = {
        "clusters": reproduce_networks.reproduce_clusters,
        "agents": reproduce_networks.reproduce_agents,
        "rybko-stolyar": reproduce_networks.reproduce_rybko_stolyar,
        "twp": reproduce_twp.reproduce_twp,
    }[args.experiment]
    kw = dict(out_dir=out, quick=args.quick, backend=args.backend, workers=args.workers, address=args.address)
    if args.seeds is not None:
        kw["seeds"] = _seeds(args.seeds)
    if args.num_requests is not None:
        kw["num_requests" if args.experiment == "twp" else "num_jobs"] = args.num_requests
    res = fn(**kw, **twp_kw)
    if args.json:
        print(json.dumps(to_jsonable(res), indent=2, default=str))
        return 0
    if args.experiment == "twp":
        _print_twp(res)
    else:
        rows = list(_finding_rows("", to_jsonable(res.get("summary") or {})))
        print_table(f"reproduce {args.experiment}", rows, ("finding", "measured"))
    print(f"{res['wall_s']:.1f} s; written: " + ", ".join(res["files"]))
    return 0


# the options of `reproduce stability` that `reproduce twp` takes too
TWP_SHARED = ("workload", "policies", "load")
# which experiments take each of `reproduce stability`'s options (for the refusal's words)
OPTIONS_OF = {
    "stability": STABILITY_ONLY,
    "twp": TWP_SHARED,
    "prefix-caching": ("cost_model", "b_max", "load"),
}
OPTIONS_OF = {e: OPTIONS_OF.get(e, ()) for e in EXPERIMENTS}


def _twp_choices(args) -> dict:
    """`reproduce twp`'s share of the stability options: `--workload` (azure or sharegpt),
    `--policies` (platform schedulers) and `--load` (one load, a fraction of the platform's
    capacity)."""
    kw = {}
    if args.workload is not None:
        kw["workloads"] = [args.workload]
    if args.policies:
        kw["schedulers"] = [p.strip() for p in args.policies.split(",")]
    if args.load is not None:
        kw["loads"] = [args.load]
    return kw


def _finding_value(v) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _finding_rows(path: str, v):
    """A result's summary as (dotted path, value) rows: nested findings one per row, lists
    of plain values on one row."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _finding_rows(f"{path}.{k}" if path else str(k), x)
    elif isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        for i, x in enumerate(v):
            yield from _finding_rows(f"{path}[{i}]", x)
    elif isinstance(v, list):
        yield path, ", ".join(_finding_value(x) for x in v) if v else "(none)"
    else:
        yield path, _finding_value(v)


def _print_twp(res: dict) -> None:
    """Paper 2's Table III as measured, and TWP against ServerlessLLM and the best of FCFS,
    Round-Robin, Priority and DynamicBatch (docs/twp.md reads them against the paper's
    claims)."""

    def num(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    rows = [
        ("workload", "load", "scheduler", "req/s", "p99 latency s", "p99 TTFT s", "mean ITL ms", "p99 ITL ms", "ITL CV")
    ]
    for r in res["table3"]:
        p99 = r["p99_latency_ms"]
        ttft = r["p99_ttft_ms"]
        rows.append(
            (
                r["workload"],
                r["load"],
                r["scheduler"],
                num(r["throughput_rps"], ".2f"),
                num(None if p99 is None else p99 / 1e3, ".2f"),
                num(None if ttft is None else ttft / 1e3, ".2f"),
                num(r["mean_itl_ms"], ".2f"),
                num(r["p99_itl_ms"], ".2f"),
                num(r["itl_cv"], ".3f"),
            )
        )
    print_grid("reproduce twp: Table III (paper 2)", rows)
    schedulers = (res.get("config") or {}).get("schedulers") or []
    if "twp" not in schedulers:  # (no claims: the table would be its header alone)
        print("note: TWP is not among the platform schedulers (--policies): no comparison with the baselines")
        return
    if len(schedulers) == 1:
        print("note: TWP is the only platform scheduler (--policies): no baseline to compare it with")
        return
    pairs = (("serverlessllm", "ServerlessLLM"), ("best_conventional", "best conventional"))
    rows = [("workload", "load", *(f"TWP {what} vs {name}" for _, name in pairs for what in ("req/s", "p99 ITL")))]
    for c in res["claims"]:
        cells = []
        for key, _ in pairs:
            for metric in ("throughput_rps", "p99_itl_ms"):
                v = c.get(f"{metric}_vs_{key}")
                cells.append("-" if v is None else f"{v:+.1%}")
        rows.append((c["workload"], c["load"], *cells))
    print_grid("TWP against the baselines (relative difference)", rows)


# ---------------------------------------------------------------------------------------
# registration


COMMANDS = ("capacity", "sweep", "reproduce", "validate")  # what `register` adds


def register(sub) -> None:
    # capacity ------------------------------------------------------------------------
    p = sub.add_parser(
        "capacity",
        help="theorem 2's capacity, critical rate and the k_max region",
        description="Token capacity b_max/t(b_max), the critical arrival rate lambda*, the "
        "utilisation at a rate and, with --k-max, the two-dimensional stability "
        "region (LP). Workload means come from --mean-prompt/--mean-output or are "
        "estimated by sampling the --prompt/--output laws (or --lengths FILE, or "
        "a --trace).",
    )
    p.add_argument("--config", type=file_path, help="YAML configuration (as for simulate)")
    add_scheduler_args(p)
    add_cost_model_arg(p)
    add_workload_args(
        p,
        rate_help="report the utilisation and predicted backlog growth at this arrival rate, requests/s "
        "(default: none; with a trace, its replayed part rescaled to this mean rate)",
        num_requests_help="requests per run of --find-counterexample (default 4000); with a trace, "
        "its first N requests",
    )
    g = p.add_argument_group("capacity")
    g.add_argument("--mean-prompt", type=float, help="mean prompt length in tokens (instead of sampling)")
    g.add_argument("--mean-output", type=float, help="mean output length in tokens (instead of sampling)")
    g.add_argument(
        "--cached-fraction",
        type=float,
        default=0.0,
        help="expected share of prompt tokens served by a prefix cache (not work; default 0)",
    )
    g.add_argument(
        "--lengths",
        metavar="FILE",
        help="a CSV of prompt and output lengths (or a dataset name: sharegpt, arxiv, azure-conv)",
    )
    g.add_argument("--samples", type=int, help="draws used to estimate the means (default 200000)")
    g.add_argument("--plot", metavar="FILE.png", help="draw the stability region and the workload point")
    g.add_argument(
        "--network",
        metavar="FILE",
        type=file_path,
        help="a YAML network (docs/networks.md): every server's "
        "offered load against its capacity, the bottleneck and "
        "the largest common scaling of the arrival rates",
    )
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    g = p.add_argument_group("counterexample search")
    g.add_argument(
        "--find-counterexample",
        action="store_true",
        help="search for workloads inside the region where the policy (default sarathi) at full "
        "budget is unstable, confirmed by simulation (needs --k-max)",
    )
    g.add_argument("--load", type=float, default=None, help="rate / lambda* of the candidates (default 0.85)")
    g.add_argument("--seeds", help="seeds of the confirming runs (default 0,1)")
    g.add_argument("--workers", type=int, help="parallel simulations (default: all CPU cores)")
    p.set_defaults(func=cmd_capacity)

    # sweep ---------------------------------------------------------------------------
    p = sub.add_parser(
        "sweep",
        help="a grid of simulations in parallel (resumable), or a rate search",
        description="Run a grid of simulations: --grid KEY=VALUES (a,b,c or LO:HI:N; use | "
        "between values that hold commas) over any simulate option, plus load "
        "(rate as a fraction of lambda*); every other flag is a fixed value. Each "
        "finished point is stored under --out, keyed by a hash of its "
        "configuration, so a rerun skips it. Writes results.csv, "
        "results.parquet and figures.",
    )
    p.add_argument("--config", type=file_path, help="YAML configuration: the base of every point")
    add_scheduler_args(p)
    add_cost_model_arg(p)
    add_workload_args(p)
    g = p.add_argument_group("run")
    g.add_argument(
        "--max-time",
        type=float,
        dest="max_time_s",
        help="stop each simulation at this time (s; default: when every request has finished)",
    )
    g.add_argument(
        "--sample-interval",
        type=float,
        dest="sample_interval_s",
        help="time-series sampling interval (s; default: as simulate's)",
    )
    g.add_argument("--exact", action="store_true", help="step by step, without the fast path")
    g = p.add_argument_group("sweep")
    g.add_argument(
        "--grid",
        action="append",
        metavar="KEY=VALUES",
        help="one key per --grid, repeated for each key, e.g. --grid policy=sarathi,orca,vllm "
        "--grid load=0.5:1.2:8 --grid seed=0,1 (or rate=1:20:20 instead of load: not both); a key is an "
        "option's config name or any simulate flag's spelling (max-time, think-time, scheduler, "
        "max-num-batched-tokens, ...; fast=false for --exact)",
    )
    g.add_argument("--out", default="sweep", help="output folder (default sweep)")
    g.add_argument(
        "--search",
        choices=["max-stable-rate"],
        help="bisect the rate for each group of the grid to find its maximum stable rate",
    )
    g.add_argument(
        "--slo",
        action="append",
        metavar="METRIC=LIMIT",
        help="with --search: also the largest rate whose runs meet it, a limit on a run's statistic "
        "(STAT_METRIC_ms or itl_cv), e.g. p99_itl_ms=200 (the p99 over every inter-token gap) "
        "median_ttft_ms=2000; simulate's --slo is per request (goodput)",
    )
    g.add_argument(
        "--tol",
        type=_tolerance,
        default=None,
        help=f"search tolerance, fraction of lambda* (default 0.02; {MIN_TOL:g} to < 1)",
    )
    g.add_argument(
        "--search-hi",
        type=_search_hi,
        default=None,
        help=f"upper end of the search, in lambda* (default 1.25; at most {MAX_SEARCH_HI:g})",
    )
    g.add_argument("--no-plots", action="store_true", help="do not draw figures")
    g.add_argument("--json", action="store_true", help="print a JSON summary")
    g.add_argument("--quiet", action="store_true", help="print nothing but --json's output")
    add_parallel_args(g)
    p.set_defaults(func=cmd_sweep)

    # reproduce -----------------------------------------------------------------------
    p = sub.add_parser(
        "reproduce",
        help="reproduce a paper experiment (stability, clusters, agents, rybko-stolyar, twp, prefix-caching)",
        description="stability: at a load below theorem 2's bound, FasterTransformer and vanilla "
        "vLLM queues grow while Orca, Sarathi-Serve and K-FCFS stay bounded; and "
        "each policy's empirical maximum stable rate against the bound. clusters: "
        "routers on 4-16 replicas from 50% to 98% of capacity. agents: a DAG and a "
        "fork-join workflow under Sarathi and FasterTransformer. rybko-stolyar: the "
        "cyclic network under both priority orders and back-pressure. twp: paper 2's "
        "Table III on serverless workloads, with TWP's ablation. prefix-caching: a Mooncake "
        "trace with and without the prefix cache (docs/networks.md, docs/twp.md, "
        "docs/prefix-caching.md).",
    )
    p.add_argument("experiment", choices=EXPERIMENTS)
    p.add_argument(
        "--workload",
        choices=["synthetic", "sharegpt", "azure"],
        default=None,
        help="synthetic (paper cost model, default), sharegpt or azure (H200 profile); twp: azure or sharegpt",
    )
    p.add_argument("--cost-model", help="stability, prefix-caching: override the workload's cost model")
    p.add_argument("--b-max", type=positive_int, help="stability, prefix-caching: override the token budget")
    p.add_argument(
        "--load",
        type=float,
        default=None,
        help="load of the queue runs, rate / lambda* (default 0.9); twp: one load, a share of the platform's "
        "capacity; prefix-caching: one load, rate / lambda* without caching (default 0.6, 0.9 and 1.3)",
    )
    p.add_argument(
        "--num-requests",
        type=positive_int,
        help="stability: requests per queue run, and per search probe unless --search-requests "
        "(default 20,000 synthetic, 8,000 sharegpt and azure); clusters: jobs per replica (default "
        "5,000); agents: jobs per run (default 10,000); rybko-stolyar: jobs per run (default 20,000); "
        "twp: requests per run (default 6,000); prefix-caching: the trace's first N requests (default: "
        "all); --quick: fewer",
    )
    # the defaults are analysis.reproduce.SIZES', reproduce_networks.NUM_JOBS' and
    # reproduce_twp.SIZES' (not imported here: they load numpy; a test holds them equal)
    p.add_argument(
        "--search-requests",
        type=positive_int,
        help="requests per search probe (default: 10,000 synthetic, 4,000 sharegpt and azure)",
    )
    p.add_argument(
        "--seeds",
        help="stability: seeds of the search probes, e.g. 0,1 (default 0,1 synthetic, 0 sharegpt and azure); "
        "the queue runs use the first (with --no-search give one: the queue runs' seed); clusters, agents, "
        "rybko-stolyar, twp: the seeds run (default 0)",
    )
    p.add_argument(
        "--tol",
        type=_tolerance,
        help=f"search tolerance, fraction of lambda* ({MIN_TOL:g} to < 1; default 0.02 synthetic, "
        "0.03 sharegpt and azure)",
    )
    p.add_argument(
        "--policies",
        help="comma-separated (default fastertransformer,vllm,orca,sarathi,kfcfs); twp: platform schedulers",
    )
    p.add_argument("--no-search", action="store_true", help="only the queue runs")
    p.add_argument("--quick", action="store_true", help="small runs (seconds), for tests")
    p.add_argument(
        "--trace",
        type=file_path,
        help="prefix-caching: the trace (Mooncake JSON lines with hash_ids, or a CSV with block_ids@B)",
    )
    p.add_argument(
        "--kv-capacities", help="prefix-caching: KV capacities in tokens, comma-separated (default 1000000,8000000)"
    )
    p.add_argument("--block-size", type=positive_int, help="prefix-caching: cache block size in tokens (default 512)")
    p.add_argument("--out", default=None, help="output folder (default reproduce-EXPERIMENT)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_parallel_args(
        p.add_argument_group("parallel runs (--workers, --backend, --address: not prefix-caching, which runs in turn)")
    )
    p.set_defaults(func=cmd_reproduce)
    _register_validate(sub)


# ---- validate ------------------------------------------------------------------------------
def render_validation(result: dict) -> None:
    from rich.table import Table  # noqa: PLC0415

    from ..analysis.validate import METRICS, STATS  # noqa: PLC0415

    t = Table(
        title=f"sim vs real ({result['trace_requests']} requests, {result['device']}); "
        f"cells: real ms / sim ms (sim error)"
    )
    t.add_column("policy")
    t.add_column("metric")
    for st in STATS:
        t.add_column(st, justify="right")

    def cell(e):
        if e["real_ms"] is None or e["sim_ms"] is None:
            return "-"
        err = "-" if e["rel_error"] is None else f"{e['rel_error'] * 100:+.0f}%"
        return f"{e['real_ms']:.1f} / {e['sim_ms']:.1f} ({err})"

    for policy, res in result["policies"].items():
        for m in METRICS:
            t.add_row(policy, m, *(cell(res["errors"][f"{m}_{st}"]) for st in STATS))
    con = console()
    con.print(t)
    for policy, res in result["policies"].items():
        st = res.get("steps")
        if not st:
            continue

        def ratio(v):
            return "-" if v is None else f"{v:.2f}"

        lag = "-" if st.get("idle_start_lag_ms") is None else f"{st['idle_start_lag_ms']:.2f} ms"
        # a step is timed start to next start: one that no step followed at once is not,
        # so say how many of each kind the median is over (it said '0 steps' first after
        # idle for two requests that each ran after an idle wait)
        con.print(
            f"{policy}: {st['real']} real steps, {st['sim']} simulated; real / modelled step time "
            f"(median, steps another followed at once): {ratio(st['busy_ratio'])} back to back "
            f"({st['busy_timed']} of {st['busy_steps']} timed), {ratio(st['after_idle_ratio'])} first after idle "
            f"({st['after_idle_timed']} of {st['after_idle_steps']} timed; started {lag} after the arrival); "
            f"preemptions: {res.get('engine_preemptions', '-')} real, {res.get('sim_preemptions', '-')} simulated"
        )


# the keys of `analysis.validate.validate`'s result that mark a file as one it wrote
VALIDATION_KEYS = ("model", "trace_requests", "policies")


def _check_replaces_a_validation(path: str) -> None:
    check_replaces_own_file(path, "--json", "a validate result", _is_a_validation)


def _is_a_validation(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and all(k in old for k in VALIDATION_KEYS)


def cmd_validate(args) -> int:
    from ..analysis.validate import validate  # noqa: PLC0415

    policies = _validate_policies(args)
    if args.json and args.json != "-":
        check_out_file(args.json, "--json", make_parents=True)  # before the replay, not after it
        _check_replaces_a_validation(args.json)
    # the engine's seed too: above 2**64 - 1 its refusal named no flag and a range from -2**63
    if not 0 <= args.seed <= 2**64 - 1:
        raise ConfigError(f"--seed must be an integer from 0 to 2**64 - 1, got {args.seed}")
    opts = engine_setup(args)
    opts["max_model_len"] = args.max_model_len  # default: from the trace
    say = (lambda m: print(m, file=sys.stderr)) if not args.quiet else None
    check_measurement_times(args)
    res = validate(
        args.model,
        args.trace,
        policies,
        profile=args.profile,
        seed=args.seed,
        reps=args.reps,
        progress=say,
        tables_s=args.tables_s,
        calibrate_s=args.calibrate_s,
        **opts,
    )
    if args.json and args.json != "-":
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

        def write(tmp) -> None:
            with open(tmp, "w") as fh:
                json.dump(res, fh, indent=2)

        # whole or not at all: a write that stops (Ctrl-C) keeps the earlier result intact
        atomic_write(args.json, write)
    if args.json == "-" or args.print_json:
        print(json.dumps(res, indent=2))
    else:
        render_validation(res)
    return 0


def _validate_policies(args) -> str:
    """The batch policies to validate: `--policies`, or the one `--policy` names. The
    engine runs FCFS admission without a prefix cache here: the flags that would change
    that are refused, not ignored."""
    if args.admission != DEFAULTS.admission or args.admission_option:
        flag = "--admission" if args.admission != DEFAULTS.admission else "--admission-option"
        raise ConfigError(f"validate compares batch policies under FCFS admission; {flag} does not apply")
    if args.prefix_caching:
        raise ConfigError("validate runs the engine without a prefix cache; --prefix-caching does not apply")
    if args.policies is None:
        return args.policy
    if args.policy != DEFAULTS.policy:
        raise ConfigError("give the policies to validate once: --policies A,B or --policy A")
    return ",".join(policy_names(args.policies))


def _register_validate(sub) -> None:

    p = sub.add_parser(
        "validate",
        help="compare the simulator with the real engine on a trace",
        description="Replay a trace through the engine in real time and through the "
        "simulator (timed by the engine's profile); report the error of "
        "TTFT, ITL and E2E (mean, p50, p99) per policy.",
    )
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument(
        "--trace", required=True, type=file_path, help="CSV arrival_s,prompt_tokens,output_tokens (or an Azure trace)"
    )
    p.add_argument("--policies", default=None, help="comma-separated batch policies (default: --policy's, sarathi)")
    p.add_argument(
        "--profile",
        default=None,
        help="profile of this engine, PATH or profile:PATH[,overlap=V] (on CPU overlap 0 unless given), "
        "or another cost model as given (paper, linear:...) (default: measure one first)",
    )
    p.add_argument(
        "--reps",
        type=positive_int,
        default=REPS,
        help=f"without --profile: interleaved passes over the grid, at least (default: {REPS})",
    )
    p.add_argument(
        "--tables-s",
        type=float,
        default=None,
        help="without --profile: seconds of table passes (default: 3 on CPU, 10 on CUDA)",
    )
    p.add_argument(
        "--calibrate-s",
        type=float,
        default=CALIBRATE_S,
        help=f"without --profile: length of the calibration run, 0 for none (default: {CALIBRATE_S})",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random prompt token ids (0 to 2**64 - 1; default: 0)"
    )
    p.add_argument("--json", default=None, help="also write the result as JSON to this file ('-': print it)")
    p.add_argument("--print-json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    # (validate.validate chooses it: the trace's longest request, from 2048 to 4096)
    # --admission(-option) and --prefix-caching are refused (`_validate_policies`): kept out of
    # the help (it listed them, as profile's once listed the options it refuses)
    add_engine_args(
        p,
        cpu_max_model_len_help="the trace's longest prompt + output, at least 2048 and at most 4096",
        refused=("admission", "admission_option", "prefix_caching"),
    )
    p.set_defaults(func=cmd_validate)
