"""Figures of the analysis package (matplotlib, Agg canvas: no display needed).

matplotlib is imported inside the functions that draw, so importing this module is cheap.
- `new_figure`, `save_figure`: a figure with n panels side by side; an atomic PNG write.
- `plot_region`: the stability region with a batch-size cap (docs/stability.md) and a
  workload point with its ray to the boundary.
- `plot_sweep`: a sweep's throughput, latency and maximum-stable-rate figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core.palette import group_styles
from ..core.paths import save_figure
from ..theory import StabilityRegion
from .grid import NON_GROUP_KEYS
from .tables import group_label

__all__ = ["new_figure", "save_figure", "plot_region", "plot_sweep", "run_name", "plain_log_ticks", "symlog_y"]


def new_figure(n: int = 1, width: float = 7.0):
    """A figure with `n` panels in one row: (figure, [axes])."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(width if n == 1 else width * 0.75 * n, 4.3), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def plain_log_ticks(ax, which: str = "x") -> None:
    """Label a log axis (call after drawing) in plain numbers (2, 5, 10, 20) with no labels
    on its minor ticks: matplotlib's labels its minor ticks 2x10^0, 3x10^0, ... when the
    data span less than a decade or so, and they overlap. Ticks at 1, 2 and 5 of each
    decade over two decades or less (evenly spaced ones under a factor of 3, where 1, 2
    and 5 leave one tick or none); matplotlib's decades beyond."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: PLC0415

    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    if lo > 0 and hi / lo < 3:
        axis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 5, 10]))
    elif lo > 0 and math.log10(hi / lo) <= 2:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def symlog_y(ax, linthresh: float) -> None:
    """A symlog y axis (linear within +-`linthresh`) with major ticks at 0 and the decades
    from `linthresh` out. matplotlib's own locator finds the first decade as
    floor(log(1000) / log(10)), which is 2 (the quotient is 2.9999...), so with linthresh
    1000 it put a 10^2 tick inside the linear part, printed over the 0 tick."""
    from matplotlib.ticker import SymmetricalLogLocator  # noqa: PLC0415

    class Decades(SymmetricalLogLocator):
        def tick_values(self, vmin, vmax):
            ticks = super().tick_values(vmin, vmax)
            if max(abs(vmin), abs(vmax)) <= linthresh:  # only the linear part shows
                return ticks
            return [v for v in ticks if v == 0 or abs(v) >= linthresh]

    ax.set_yscale("symlog", linthresh=linthresh)
    ax.yaxis.set_major_locator(Decades(linthresh=linthresh, base=10))


RUN_KEYS = (("policy", "{}"), ("admission", "admission {}"), ("cost_model", "{}"), ("b_max", "b_max {}"))
RUN_KEYS += (("k_max", "k_max {}"), ("prompt", "prompt {}"), ("output", "output {}"))
RUN_KEYS += (("system_prompt", "system prompt {}"), ("prefix_caching", "prefix caching"))
RUN_KEYS += (("num_requests", "{:,} requests"),)


def run_name(rows: list[dict], skip: Sequence[str] = ()) -> str:
    """What the rows of a sweep share, for figure titles: `vllm, paper, b_max 512, prompt
    geometric:200, output geometric:101, 2,000 requests` (keys that vary are left out)."""
    parts = []
    for key, fmt in RUN_KEYS:
        # (a search's rows name their policy in `policy_name` alone)
        # (a sweep by duration sets no num_requests: its runs' own counts, the metric)
        alt = {"policy": "policy_name", "num_requests": "metric_num_requests"}.get(key)
        vals = {r.get(key) or (r.get(alt) if alt else None) for r in rows}
        vals.discard(None)
        vals.discard("")
        if key in skip or len(vals) != 1:
            continue
        v = vals.pop()
        # (a results.csv read back holds "0" and "True"/"False" as text)
        if key == "system_prompt" and str(v) in ("0", "0.0"):
            continue
        if key == "prefix_caching" and str(v).lower() not in ("true", "1"):
            continue
        if key == "admission" and v == "fcfs":  # (every run's default)
            continue
        if key == "num_requests":
            try:
                v = int(float(v))
            except (TypeError, ValueError):
                continue
        parts.append(fmt.format(v))
    return ", ".join(parts)


def _legend(ax) -> None:
    """A legend, if anything drawn has a label (a sweep whose points all failed has none,
    and matplotlib would warn)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _wrap(text: str, width: int) -> str:
    import textwrap  # noqa: PLC0415

    return "\n".join(textwrap.wrap(text, width)) if text else ""


def plot_region(
    region: StabilityRegion,
    point: tuple[float, float] | None = None,
    path: str = "region.png",
    *,
    title: str | None = None,
    point_label: str = "workload",
) -> str:
    """Draw the region (tokens/s) and, if given, the workload point with its ray to the
    boundary (the critical scale). Writes a PNG (Agg, no display needed); returns path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(6.0, 5.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    v = region.vertices
    if len(v) >= 3:
        ax.fill(v[:, 0], v[:, 1], alpha=0.25, color="tab:blue", label="stability region")
    closed = np.vstack([v, v[:1]])
    ax.plot(closed[:, 0], closed[:, 1], "-", color="tab:blue", lw=1.5)
    ax.plot(v[:, 0], v[:, 1], "o", color="tab:blue", ms=4)
    for (vx, vy), (x, y, _t) in zip(v, region.vertex_shapes):
        if vx == 0.0 and vy == 0.0:
            continue
        ax.annotate(
            f"({int(x)},{int(y)})", (vx, vy), textcoords="offset points", xytext=(4, 4), fontsize=7, color="tab:blue"
        )
    if point is not None:
        p, d = float(point[0]), float(point[1])
        s = region.max_scale(p, d)
        inside = s >= 1.0
        ax.plot(
            [p],
            [d],
            "o" if inside else "x",
            color="tab:green" if inside else "tab:red",
            ms=8,
            label=f"{point_label} ({'inside' if inside else 'outside'}, scale limit {s:.3g})",
        )
        if math.isfinite(s) and s > 0:
            ax.plot([0, s * p], [0, s * d], "--", color="gray", lw=1)
            ax.plot([s * p], [s * d], "s", color="gray", ms=5)
    ax.set_xlabel("prefill tokens / s")
    ax.set_ylabel("decode tokens / s")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    kmax = "none" if region.k_max is None else region.k_max
    ax.set_title(title or f"stability region, b_max={region.b_max}, k_max={kmax}", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def _groups(rows: list[dict], grid_keys: Sequence[str], errors: bool = False) -> dict[str, list[dict]]:
    """The rows of each group (`grid_keys` without rate, load and seed), failed points
    left out unless `errors`."""
    gkeys = [k for k in grid_keys if k not in NON_GROUP_KEYS]
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("error") and not errors:
            continue
        out.setdefault(group_label(r, gkeys), []).append(r)
    return out


def _offered(r: dict) -> float | None:
    """The request rate a row's run offered (requests/s): its `offered_rate`, which counts
    every turn of a conversation and a time scale's speed-up (a grid's `rate` is in the
    workload's unit, conversations/s with turns, and absent for a trace at its own rate)."""
    v = r.get("offered_rate")
    if v is None:
        v = r.get("rate")
    return None if v is None else float(v)


def _lambda_star(rows: list[dict]) -> float | None:
    """The group's lambda* (requests/s): the median over its rows of `point_critical_rate`,
    the one `llmsched capacity` reports and a grid's load is a fraction of (each seed's
    lengths sample it, so seeds differ slightly); for rows without it (a table written
    before it was a column), the median of the runs' own `critical_rate`, each from the
    requests of its run."""
    for key in ("point_critical_rate", "critical_rate"):
        lams = [float(r[key]) for r in rows if r.get(key)]
        if lams:
            return float(statistics.median(lams))
    return None


def _x_of(rows: list[dict]):
    """x of each row: the grid's load, else the offered request rate over the group's
    lambda* (`_lambda_star`), else the offered rate; and whether x is relative to lambda*."""
    if rows and all(r.get("load") is not None for r in rows):
        return [float(r["load"]) for r in rows], True
    lam = _lambda_star(rows)
    offered = [_offered(r) for r in rows]
    if lam and all(v is not None for v in offered):
        return [v / lam for v in offered], True
    return offered, False


def _grid_value(r: dict) -> float | None:
    """The grid point a row belongs to, whatever its seed: its load, else its rate, else
    (a trace at its own rate) its offered rate."""
    x = next((r.get(k) for k in ("load", "rate", "offered_rate") if r.get(k) is not None), None)
    return None if x is None else round(float(x), 9)


def _by_x(rows: list[dict], metric: str):
    """Mean of `metric` over the seeds of each grid point (`_grid_value`), placed at the
    mean of their x (`_x_of`: each seed's run offers a slightly different rate, and
    points of their own would zigzag); (xs, ys) in order of x."""
    pts: dict[float, tuple[list[float], list[float]]] = {}
    xs_all, _ = _x_of(rows)
    for x, r in zip(xs_all, rows):
        v, g = r.get(metric), _grid_value(r)
        if x is None or v is None or g is None:
            continue
        xs, vs = pts.setdefault(g, ([], []))
        xs.append(float(x))
        vs.append(float(v))
    out = sorted((sum(xs) / len(xs), sum(vs) / len(vs)) for xs, vs in pts.values())
    return [p[0] for p in out], [p[1] for p in out]


def _same_curve(a: tuple, b: tuple) -> bool:
    """Whether two (xs, ys) curves are one (to a relative 1e-6)."""
    return len(a[0]) == len(b[0]) and all(
        math.isclose(u, v, rel_tol=1e-6, abs_tol=1e-9) for p, q in zip(a, b) for u, v in zip(p, q)
    )


_TOKEN_KEYS = ("total_token_throughput", "offered_token_rate")


def _plot_offered(ax, curves: list[tuple], colors: list, what: str = "offered tokens/s") -> None:
    """The offered tokens/s (or work, `what`) of each group (`curves`: its (xs, ys)): one
    gray dotted line when every group was offered the same, else each group's thin dotted
    line in its colour (a grid over k_max or the workload offers each group its own load)."""
    curves_drawn = [(c, col) for c, col in zip(curves, colors) if c[0]]
    if not curves_drawn:
        return
    first = curves_drawn[0][0]
    # a one-point sweep's dotted line has no length: only a marker shows it
    fmt = ".:" if all(len(c[0]) == 1 for c, _ in curves_drawn) else ":"
    if all(_same_curve(c, first) for c, _ in curves_drawn):
        ax.plot(*first, fmt, color="gray", lw=1, label=what)
        return
    for (xs, ys), col in curves_drawn:
        ax.plot(xs, ys, fmt, color=col, lw=0.8, alpha=0.8)
    ax.plot([], [], fmt, color="gray", lw=0.8, label=f"{what} (dotted, each group's colour)")


def _empirical_max_stable(rows: list[dict]) -> float | None:
    """Largest offered request rate (requests/s) below which every grid point (all
    seeds) was judged stable.

    Points are one grid value: the grid's load when it has one, else its rate, else (a
    trace at its own rate) the offered rate. With a load, lambda* is sampled with each
    seed's lengths, so the seeds' rates differ slightly: they are one point all the same,
    stable only when every seed's run is (a failed run is not), and its rate is the
    smallest of its seeds' offered rates."""
    by_point: dict[float, list[dict]] = {}
    for r in rows:
        x = _grid_value(r)
        if x is not None:
            by_point.setdefault(x, []).append(r)
    best = None
    for x in sorted(by_point):
        rs = by_point[x]
        if all(r.get("stable") is True and not r.get("error") and _offered(r) is not None for r in rs):
            best = min(_offered(r) for r in rs)
        else:
            break
    return best


def plot_sweep(
    rows: list[dict],
    out_dir,
    grid_keys: Sequence[str],
    search: list[dict] | None = None,
    name: str | None = None,
) -> list[str]:
    """A sweep's figures in `out_dir`: `throughput.png` (served vs offered tokens/s) and
    `latency.png` (p99 TTFT and ITL) against the offered load, one line per group of the
    grid (`grid_keys` without rate, load and seed; each policy in its colour of
    `llmsched.core.palette`), and `max_stable_rate.png` (each group's empirical maximum
    stable rate, from the grid or from a `search` table, against lambda*; "none" where no
    rate was stable). Titles name the run (`name`, else what the rows share). Returns the
    paths written."""
    out = Path(out_dir)
    groups = _groups(rows, grid_keys)
    files = []
    if name is None:
        name = run_name(rows or search or [], skip=grid_keys)
    uses_load = all(_x_of(rs)[1] for rs in groups.values()) if groups else False
    xlabel = "offered load (rate / critical rate lambda*)" if uses_load else "offered rate (requests/s)"
    styles = group_styles(list(groups))
    if rows and search is None:
        fig, (ax,) = new_figure()
        # with prefix-cache hits the tokens served and offered exceed the work, and only the
        # work is bounded by the token capacity: plot the work, where every row with hits has it
        # (a sweep resumed from points stored before these fields: tokens, not a line with gaps)
        hit_rows = [r for r in rows if r.get("cached_prompt_tokens_per_request")]
        work = bool(hit_rows) and all(
            r.get("work_throughput") is not None and r.get("offered_work_rate") for r in hit_rows
        )
        served_key, offered_key = ("work_throughput", "offered_work_rate") if work else _TOKEN_KEYS
        offered = []
        for (label, rs), st in zip(groups.items(), styles):
            xs, ys = _by_x(rs, served_key)
            if xs:
                ax.plot(xs, ys, ms=3, label=label, **st)
            offered.append(_by_x(rs, offered_key))
        _plot_offered(ax, offered, [st["color"] for st in styles], "offered work/s" if work else "offered tokens/s")
        caps = [r.get("token_capacity") for r in rows if r.get("token_capacity")]
        if caps and len(set(round(c, 6) for c in caps)) == 1:
            ax.axhline(caps[0], color="gray", ls="--", lw=1, label="token capacity b_max/t(b_max)")
        if uses_load:
            ax.axvline(1.0, color="gray", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        if work:
            ax.set_ylabel("served work/s (uncached prompt + output - 1)")
        else:
            ax.set_ylabel("served tokens/s (prompt + output)")
        ax.set_title(_wrap(f"Throughput vs offered load: {name}" if name else "Throughput vs offered load", 70))
        ax.grid(alpha=0.3)
        _legend(ax)
        files.append(save_figure(fig, out / "throughput.png"))

        fig, axes = new_figure(2)
        for ax, metric, title, what in (
            (axes[0], "p99_ttft_ms", "p99 TTFT", "finished requests"),
            (axes[1], "p99_itl_ms", "p99 ITL", "every gap"),
        ):
            for (label, rs), st in zip(groups.items(), styles):
                xs, ys = _by_x(rs, metric)
                if xs:
                    ax.plot(xs, ys, ms=3, label=label, **st)
            ax.set_yscale("log")
            plain_log_ticks(ax, "y")  # (4.6x10^2, 4.8x10^2, ... under a decade)
            if uses_load:
                ax.axvline(1.0, color="gray", ls=":", lw=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{title} (ms)")
            ax.set_title(f"{title} ({what}) vs offered load", fontsize=10)
            ax.grid(alpha=0.3, which="both")
        _legend(axes[0])
        if name:
            fig.suptitle(_wrap(f"Latency vs offered load: {name}", 110), fontsize=10)
        files.append(save_figure(fig, out / "latency.png"))

    bars = []
    if search is not None:
        gkeys = [k for k in grid_keys if k not in NON_GROUP_KEYS]
        for s in search:
            # no probe stable: the row's rate is an upper bound, no rate found (a bar of "none")
            found = 0.0 if s.get("max_stable_upper_bound") else s.get("max_stable_rate")
            bars.append((group_label(s, gkeys), found, s.get("critical_rate"), s.get("max_slo_rate")))
    else:
        # a failed seed keeps its point from counting as stable: every seed must be
        for label, rs in _groups(rows, grid_keys, errors=True).items():
            bars.append((label, _empirical_max_stable(rs), _lambda_star(rs), None))
    if bars:
        units = {s.get("rate_unit") for s in search or ()} - {None, "req/s"}
        unit = units.pop() if len(units) == 1 else "requests/s"
        files.append(_plot_max_stable(bars, out / "max_stable_rate.png", name, search is not None, unit))
    return files


def _plot_max_stable(bars: list[tuple], path: Path, name: str, searched: bool, unit: str = "requests/s") -> str:
    """One bar per group in its policy's colour, its value written above it ("none" where
    no rate qualified), lambda* as a dashed line over each bar; rates in `unit` (a
    search's with turns: conversations/s, lambda* converted as well)."""
    fig, (ax,) = new_figure(width=max(6.0, 1.2 * len(bars) + 2.5))
    xs = list(range(len(bars)))
    slo = any(b[3] is not None for b in bars)
    w = 0.4 if slo else 0.7
    styles = group_styles([b[0] for b in bars])
    top = max([b[1] or 0.0 for b in bars] + [b[2] or 0.0 for b in bars] + [b[3] or 0.0 for b in bars] + [1e-9])
    pad = 0.015 * top

    def bar(x, v, color, hatch=None):
        ax.bar(x, v or 0.0, width=w, color=color, alpha=0.85, hatch=hatch, edgecolor="white" if hatch else None)
        label = "none" if not v else f"{v:.3g}"  # None, or 0: no probed rate qualified
        box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}
        ax.text(x, (v or 0.0) + pad, label, ha="center", va="bottom", fontsize=8, bbox=box)

    for x, b, st in zip(xs, bars, styles):
        bar(x - (w / 2 if slo else 0), b[1], st["color"])
        if slo:
            bar(x + w / 2, b[3], st["color"], hatch="//")
        if b[2]:
            ax.plot([x - 0.45, x + 0.45], [b[2], b[2]], "k--", lw=1.5)
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    handles = [Patch(facecolor="darkgray", label="max stable rate" + (" (bisection)" if searched else " (grid)"))]
    if slo:
        handles.append(Patch(facecolor="darkgray", hatch="//", edgecolor="white", label="max rate meeting the SLOs"))
    handles.append(Line2D([], [], color="k", ls="--", label="lambda* (theorem 2; with k_max the 2-D region)"))
    ax.set_xticks(xs)
    ax.set_xticklabels(
        [b[0] for b in bars], rotation=20 if len(bars) > 3 else 0, ha="right" if len(bars) > 3 else "center"
    )
    ax.set_ylabel(f"arrival rate ({unit})")
    title = "Empirical maximum stable rate vs the critical rate lambda*"
    ax.set_title(_wrap(f"{title}: {name}" if name else title, 60), fontsize=10)
    ax.set_ylim(0, top * 1.35)
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)
