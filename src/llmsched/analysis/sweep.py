"""Parameter sweeps of `llmsched.simulate`: grids, parallel backends, resumable storage,
a tidy results table, figures, and rate searches (maximum stable rate, maximum rate
meeting SLOs).

`run_sweep` and `max_stable_rate` are the entry points; the parts live in their own
modules of `llmsched.analysis`:

- `grid`: `KEY=VALUES` specs into a grid (`parse_grid`), its points (`expand_grid`),
  SLO limits (`parse_slo`). Any option of `simulate` can be a key, plus `load`: the rate
  as a fraction of the theoretical critical rate lambda* of the point's configuration
  (`llmsched.theory.capacity`; workload means by sampling, `llmsched.theory.workload_means`).
- `points`: a point's full configuration (`resolve_point`), its key (`point_key`: a hash
  of that configuration) and its run (`run_point`).
- `runner`: backends (`local`: a process pool of `workers`, inline for one worker; `ray`:
  a cluster at `address`, or a local Ray started for the sweep) and storage: every
  point's summary is stored in `OUT/points/KEY.json` the moment it finishes, so a rerun
  skips finished points (resume) and a different sweep sharing points reuses them.
- `search`: bisection of the rate per group of the grid.
- `tables` and `figures`: `results.csv` and `results.parquet` (one row per point: grid
  values, the configuration columns, every scalar summary metric), `throughput.png`,
  `latency.png`, `max_stable_rate.png`; with a search also `search.csv`/`search.json`.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from ..api import unused_block_sizes
from ..core.checks import as_real, check_policy_names, check_seeds
from ..core.errors import BlockSizeUnusedWarning, ConfigError, warn_block_size_unused
from ..core.paths import begin_sweep_write, check_out_dir, check_run_dir, end_sweep_write, held_alone
from ..sim.result import check_inputs_not_replaced
from .figures import plot_sweep
from .grid import NON_GROUP_KEYS, expand_grid, grid_keys, parse_grid, parse_slo, parse_values
from .points import KEY_VERSION, check_options_taken, check_point, critical_rate_of, point_key, resolve_point, run_point
from .runner import Backend, Progress, Runner, Store
from .search import SearchSettings, search_groups, search_rates
from .tables import point_row, write_search, write_table

__all__ = [
    "parse_grid",
    "parse_values",
    "expand_grid",
    "resolve_point",
    "point_key",
    "run_sweep",
    "max_stable_rate",
    "SweepResult",
    "grid_keys",
    "parse_slo",
    # from the part modules, for code that imported them from here
    "run_point",
    "critical_rate_of",
    "write_table",
    "write_search",
    "plot_sweep",
    "KEY_VERSION",
    "NON_GROUP_KEYS",
]

SEARCHES = ("max-stable-rate",)


@dataclass
class SweepResult:
    """`rows`: one dict per point (grid values, configuration columns, metrics);
    `ran`: points simulated by this call; `skipped`: points found finished;
    `search`: one dict per group when a search ran; `files`: what was written (the
    `points/` folder of per-point records first)."""

    rows: list[dict]
    ran: int
    skipped: int
    errors: int = 0
    search: list[dict] | None = None
    files: list[str] = field(default_factory=list)
    out_dir: str | None = None
    wall_s: float = 0.0


def fixed_in_grid(grid: dict, fixed: dict) -> tuple[str, str] | None:
    """The first fixed option (key, grid key) that the grid also sets (a fixed `rate` with
    a `load` grid too), or None; `fast` and `record_steps` are run switches, not values."""
    for key, v in fixed.items():
        if v is None or key in ("fast", "record_steps"):
            continue
        gkey = "load" if key == "rate" and "load" in grid else key
        if gkey in grid:
            return key, gkey
    return None


def run_sweep(
    config=None,
    grid: dict | Iterable[str] | None = None,
    *,
    out_dir=None,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    search: str | None = None,
    slo: dict | Iterable[str] | None = None,
    tol: float = 0.02,
    search_hi: float = 1.25,
    plots: bool = True,
    progress: bool | None = None,
    quiet: bool | None = None,
    **fixed,
) -> SweepResult:
    """Run a grid of simulations (see the module docstring). `config`: base configuration
    (SimConfig, dict or YAML path); `fixed`: option values for every point; `grid`: a
    mapping key -> values or a list of `KEY=VALUES` specs.

    `search="max-stable-rate"`: instead of gridding the rate, bisect it for every group
    (every combination of the grid's other keys; seeds are all run at each probe) to find
    the largest rate judged stable on every seed and the smallest judged unstable on
    every seed, each to within `tol` * lambda*, starting from [0, search_hi * lambda*];
    rates judged inconclusive in between are reported as such, and a failed probe stops
    its group's search with no answer; with `slo` ({metric: limit}), also the largest
    rate that is stable and meets every limit on every seed (`llmsched.analysis.search`).

    `quiet`: keep the Ray backend's start-up warnings and notices off the terminal (its
    errors still show; `sweep --quiet`); by default when `progress` is False.
    """
    t0 = time.perf_counter()
    if out_dir is not None:
        check_out_dir(out_dir)  # before the runs, not after them
        check_run_dir(out_dir, "sweep")  # not into another tool's folder, nor over another run
        if os.path.isdir(os.path.join(out_dir, "points")):  # (each point's record goes there as it finishes)
            check_out_dir(os.path.join(out_dir, "points"))
    g = parse_grid(grid)
    slo_d = parse_slo(slo)
    if search == "none":
        search = None
    if search is not None and search not in SEARCHES:
        raise ConfigError(f"unknown search {search!r} (known: {', '.join(SEARCHES)})")
    if slo_d and not search:
        raise ConfigError("--slo needs --search max-stable-rate")
    if search and ("rate" in g or "load" in g):
        raise ConfigError("the search finds the rate: do not put rate or load in the grid")
    if as_real(tol) is None or not 0 < as_real(tol) < 1:
        raise ConfigError(f"tol must be in (0, 1), got {tol!r}")
    tol = as_real(tol)
    if as_real(search_hi) is None or not 0 < as_real(search_hi) < math.inf:
        raise ConfigError(f"search_hi must be a finite number > 0, got {search_hi!r}")
    search_hi = as_real(search_hi)
    fixed = {k.replace("-", "_"): v for k, v in fixed.items() if v is not None}
    bad = sorted(set(fixed) - set(grid_keys()))
    if bad:
        raise ConfigError(f"unknown option {bad[0]!r}")
    if search and ("rate" in fixed or "load" in fixed):
        raise ConfigError("the search finds the rate: do not fix a rate or load")
    clash = fixed_in_grid(g, fixed)
    if clash is not None:  # the fixed value would do nothing: each point takes the grid's
        key, gkey = clash
        raise ConfigError(f"{key}={fixed[key]!r} and the grid's {gkey!r} both set each point's {key}: give one")
    show = sys.stderr.isatty() if progress is None else bool(progress)

    # every configuration is resolved and checked before the first run
    if search:
        settings = SearchSettings(config=config, fixed=fixed, grid=g, slo=slo_d, tol=tol, search_hi=search_hi)
        groups = search_groups(settings)
    else:
        points = expand_grid(g)
        cfgs = [resolve_point(config, fixed, p) for p in points]
        traces: dict = {}
        for p, c in zip(points, cfgs):
            check_point(c, traces, p)
    check_options_taken(config, fixed, g)  # (each point keeps those its policy takes)

    resolved = cfgs if not search else [resolve_point(config, fixed, gr.params) for gr in groups]
    if out_dir is not None:
        for c in resolved:  # (a trace at out/search.csv was removed with the earlier run's files)
            check_inputs_not_replaced(out_dir, "sweep", c.to_dict())
    # a block size does what it says at the points with a prefix cache: that it does
    # nothing is one warning for the sweep, where no point has one, not one per point
    unused = unused_block_sizes(resolved)
    if unused:
        warn_block_size_unused(unused)
    with ExitStack() as held:
        bar = Progress(show, "search" if search else "sweep")
        try:
            if quiet is None:
                quiet = progress is False
            with warnings.catch_warnings(), Backend(backend, workers, address, quiet=quiet) as be:
                warnings.filterwarnings("ignore", category=BlockSizeUnusedWarning)  # (said above, for the sweep)
                # after connecting: an unreachable cluster leaves no folder
                if out_dir is not None:  # one sweep at a time there, from its first record to its last file
                    os.makedirs(out_dir, exist_ok=True)
                    held.enter_context(held_alone(out_dir, "sweep"))
                store = Store(out_dir)  # (removes a stopped write's temporary records: after the lock)
                # run_point by name from this module, so that tests can replace it here
                runner = Runner(be, store, bar, run_point)
                if search:
                    rows, table = search_rates(settings, groups, runner)
                else:
                    rows = [point_row(p, r, list(g)) for p, r in zip(points, runner.run(cfgs))]
                    for row, c in zip(rows, cfgs):
                        row["point_critical_rate"] = _point_critical_rate(c)
                    table = None
        finally:
            bar.close()
        result = SweepResult(
            rows=rows,
            ran=runner.ran,
            skipped=runner.skipped,
            errors=runner.errors,
            search=table,
            out_dir=None if out_dir is None else str(out_dir),
        )
        if out_dir is not None:
            # the earlier run's tables and figures go before this one writes any (its points/,
            # this run's records among them, stay: a rerun resumes from them), the folder
            # marked until results.csv, written last, is in place: a sweep that stops leaves
            # no new file beside an earlier run's search.csv or figures
            begin_sweep_write(out_dir)
            written = []
            if result.search is not None:
                written += write_search(result.search, out_dir)
            if plots:
                written += plot_sweep(result.rows, out_dir, list(g), result.search)
            table = write_table(result.rows, out_dir, csv_last=True)  # results.csv: the last file
            end_sweep_write(out_dir)
            result.files += [str(store.dir / "points"), *table, *written]
    result.wall_s = time.perf_counter() - t0
    return result


def _point_critical_rate(cfg) -> float | None:
    """lambda* (requests/s) of a point's configuration, the one a grid's load is a fraction
    of and `llmsched capacity` reports (the figures' lambda*); None where theory gives none."""
    try:
        lam = critical_rate_of(cfg)
    except (ConfigError, ValueError, ArithmeticError):
        return None
    return lam if lam > 0 and math.isfinite(lam) else None


def max_stable_rate(
    config=None,
    *,
    policies: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    tol: float = 0.02,
    slo: dict | Iterable[str] | None = None,
    out_dir=None,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    search_hi: float = 1.25,
    progress: bool | None = None,
    grid: dict | None = None,
    plots: bool = False,
    **fixed,
) -> list[dict]:
    """Each policy's empirical maximum stable rate (and, with `slo`, the maximum rate
    meeting the SLOs) by bisection on the rate using the runs' stability verdicts; one
    dict per policy (and per combination of other `grid` keys) with `critical_rate`
    (theory), `max_stable_rate`, `max_stable_load` (with `max_stable_upper_bound` true
    when no probe was stable: the first rate judged unstable, an upper bound, None
    when every probe was inconclusive;
    `max_stable_lower_bound` true when every probe was), `inconclusive_low`/`_high` and
    `inconclusive_probes` (the rates judged inconclusive between the two),
    `unstable_rate` (the first rate judged unstable, None if none was),
    `inconclusive_above_unstable` (probes above it judged inconclusive: verdicts not
    monotone in the rate), `failed_rate` (a failed probe, which leaves the group's
    answers None) and the number of probes (`llmsched.analysis.search`).

    `policies` and `seeds` (default: the configuration's seed, else 0) or the grid's `policy` and `seed` lists,
    not both; every seed runs at each probe."""
    if fixed.get("seed") is not None:
        raise ConfigError(
            f"max_stable_rate runs every seed at each probe: give seeds=[...], not seed={fixed['seed']!r}"
        )
    g = dict(parse_grid(grid))
    # the grid's lists were overwritten by the defaults: grid={"seed": [1, 2]} ran seed 0 alone
    for name, key, given in (("policies", "policy", policies), ("seeds", "seed", seeds)):
        if given is not None and key in g:
            raise ConfigError(f"{name}= and the grid's {key!r} both list the {name}: give one")
    if policies is not None:
        g["policy"] = check_policy_names(policies)
    if seeds is not None:
        # (neither given: the configuration's seed, as `sweep --search` runs it, else 0;
        # seed 0 replaced a configuration's seed 3 silently)
        g["seed"] = list(check_seeds(seeds))
    res = run_sweep(
        config,
        g,
        out_dir=out_dir,
        backend=backend,
        workers=workers,
        address=address,
        search="max-stable-rate",
        slo=slo,
        tol=tol,
        search_hi=search_hi,
        progress=progress,
        plots=plots,
        **fixed,
    )
    return res.search
