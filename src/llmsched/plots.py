"""`llmsched plot DIR`: figures from a simulation's output folder."""

from __future__ import annotations

import csv
import json
from array import array
from operator import itemgetter
from pathlib import Path

import numpy as np

from .core.errors import ConfigError
from .core.palette import color_of
from .core.paths import (
    RUN_OUTPUTS,
    RUN_PROOFS,
    check_out_file,
    interrupted_message,
    is_someone_elses_file,
    run_kind,
    save_figure,
)
from .theory.means import rate_unit
from .workload.trace import mean_rate


def _read_csv(path: Path, need: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The `need`ed columns of a results CSV and those of `optional` it has, as float
    arrays (an empty field: NaN); a missing, cut or foreign file is a ConfigError naming
    it (checked before any figure is drawn). The file is streamed and only these columns
    kept, 8 bytes a value: a million-request requests.csv is not held whole as text."""
    if not path.is_file():
        raise ConfigError(
            f"{path.name} is missing from {str(path.parent)!r}: is this a `llmsched simulate --out` folder?"
        )
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            if head is None:
                raise ConfigError(f"{path} is empty")
            missing = [c for c in need if c not in head]
            if missing:
                raise ConfigError(
                    f"{path} has no column {', '.join(missing)}: not a file `llmsched simulate --out` wrote"
                )
            where = {name: j for j, name in enumerate(head)}
            names = list(dict.fromkeys(c for c in (*need, *optional) if c in where))
            k, width = len(names), len(head)
            pick = itemgetter(*(where[c] for c in names)) if k > 1 else lambda r, j=where[names[0]]: (r[j],)
            values = array("d")  # row after row, `k` values each
            for r in reader:
                if len(r) != width:
                    raise ConfigError(
                        f"{path} line {reader.line_num} has {len(r)} fields, the header {width}: "
                        "the file is cut or damaged"
                    )
                try:
                    values.extend(tuple(map(float, pick(r))))
                except ValueError:  # an empty field (NaN), or a value that is not a number
                    values.extend(_numbers(path, reader.line_num, names, pick(r)))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path} cannot be read: {e}") from None
    table = np.frombuffer(values, dtype=np.float64).reshape(-1, k)
    return {name: table[:, j].copy() for j, name in enumerate(names)}


def _numbers(path: Path, line: int, names: list[str], texts: tuple[str, ...]) -> list[float]:
    """A row's fields as numbers, an empty one NaN; ConfigError naming the line and
    column of one that is not a number."""
    out = []
    for name, v in zip(names, texts):
        try:
            out.append(float(v) if v != "" else np.nan)
        except ValueError:
            raise ConfigError(f"{path} line {line} column {name} holds {v!r}, not a number") from None
    return out


def _refuse_blank(path: Path, table: dict[str, np.ndarray], columns: tuple[str, ...], rows=None) -> None:
    """ConfigError naming the first line (of `rows`, a mask; else any) where one of
    `columns` is empty: a blank count or a finished request's blank TTFT would bend a
    CDF (a NaN sum) or drop a point its title still counts."""
    for c in columns:
        bad = np.isnan(table[c]) if rows is None else np.isnan(table[c]) & rows
        if bad.any():
            line = int(np.argmax(bad)) + 2  # (line 1: the header)
            what = "a finished request's row" if rows is not None else "every row"
            raise ConfigError(f"{path} line {line} column {c} is empty: {what} must hold a number there")


def _figure():
    from matplotlib.figure import Figure  # noqa: PLC0415 (Agg canvas, no display needed)

    fig = Figure(figsize=(7, 4.2), dpi=110)
    return fig, fig.add_subplot(1, 1, 1)


def cdf_steps(values: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of `values` (weighted: a histogram's values and counts) as the
    corners of a step plot (`where="post"`): 0 from 0 (or the least value, if negative)
    up to the least value, then at each distinct value the fraction at or below it. A
    straight line between the corners would claim values between a histogram's bins."""
    order = np.argsort(values, kind="stable")
    v = np.asarray(values, dtype=np.float64)[order]
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)[order]
    c = np.cumsum(w)
    if not len(v) or c[-1] <= 0:
        return np.zeros(0), np.zeros(0)
    last = np.append(v[1:] != v[:-1], True)  # one corner per distinct value
    return np.append(min(0.0, v[0]), v[last]), np.append(0.0, c[last] / c[-1])


def _cdf(ax, values: np.ndarray, weights: np.ndarray | None = None, label: str | None = None, color=None):
    x, y = cdf_steps(values, weights)
    ax.step(x, y, where="post", label=label, color=color)


def _config(folder: Path) -> dict | None:
    """The run's config.json, or None without a readable one (a mapping)."""
    try:
        c = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return c if isinstance(c, dict) else None


def _server_config(folder: Path) -> dict | None:
    """The run's config.json; for a network's or cluster's server folder (servers/NAME/,
    whose config.json names only its replica and server) that server's spec from the
    run's root config.json, with `replica` added; None when neither holds a policy."""
    c = _config(folder)
    if c is None or "policy" in c:
        return c
    root = _config(folder.resolve().parent.parent) if folder.resolve().parent.name == "servers" else None
    servers = (root or {}).get("servers")
    spec = servers.get(c.get("server")) if isinstance(servers, dict) and isinstance(c.get("server"), str) else None
    if not isinstance(spec, dict) or "policy" not in spec:
        return None
    return {**spec, "replica": str(c.get("replica", folder.resolve().name))}


def _arrived(req: dict[str, np.ndarray]) -> np.ndarray:
    """The arrival times of the requests that arrived: under a time limit requests.csv
    also lists those due at or after it (`arrived` 0)."""
    arrived = req.get("arrived")
    return req["arrival_s"] if arrived is None else req["arrival_s"][arrived == 1]


def run_title(folder: Path, config: dict | None = None, arrival_s: np.ndarray | None = None) -> str:
    """The run a folder holds, for figure titles: `sarathi, b_max 512, paper, poisson 5
    req/s, 2,000 requests`. Policy, limits and cost model from its config.json (or
    `config`); the rate the requests came at, a synthetic process's rate times its
    time_scale or a trace's replayed mean rate (n - 1) / span, and their number from the
    run's arrival times (requests.csv's `arrival_s` of the requests that arrived, or
    `arrival_s`). A network's or cluster's server folder: its server's spec from the run's
    config.json, after the replica's name. The folder's name without a config naming a
    policy."""
    c = config if config is not None else _server_config(folder)
    if c is None or "policy" not in c:
        return folder.resolve().name
    if arrival_s is None:
        try:
            arrival_s = _arrived(_read_csv(folder / "requests.csv", ("arrival_s",), ("arrived",)))
        except ConfigError:
            arrival_s = None
    parts = [str(c["policy"])]
    if c.get("admission") not in (None, "fcfs"):
        parts[0] += f" + {c['admission']}"
    if c.get("replica"):  # one server of a network or cluster
        parts[0] = f"{c['replica']}: {parts[0]}"
    parts.append(f"b_max {c.get('b_max')}")
    if c.get("k_max"):
        parts.append(f"k_max {c['k_max']}")
    parts.append(str(c.get("cost_model", "")).removeprefix("profile:"))
    w = c.get("workload")
    w = w if isinstance(w, dict) else {}
    scale = w.get("time_scale")
    scale = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) else 1.0
    if w.get("trace"):
        parts.append(f"trace {Path(str(w['trace'])).name}")
        rate = mean_rate(arrival_s) if arrival_s is not None else float("nan")
        if rate == rate:  # not nan: two arrivals at different times
            parts[-1] += f" at {rate:.3g} req/s"
    elif isinstance(w.get("rate"), (int, float)) and not isinstance(w["rate"], bool):
        # with turns the process starts conversations; their later turns add requests
        parts.append(f"{w.get('arrival', 'poisson')} {w['rate'] * scale:g} {rate_unit(w)}")
    # a shared system prompt served from a prefix cache changes the load many times over
    if w.get("system_prompt"):
        parts.append(f"system prompt {w['system_prompt']}")
    if c.get("prefix_caching") is True:
        parts.append("prefix caching")
    if arrival_s is not None:
        parts.append(f"{len(arrival_s):,} requests")
    return ", ".join(parts)


def _last_finish(req: dict[str, np.ndarray], done: np.ndarray) -> float | None:
    """When the run's last request finished (arrival + e2e), if every request that arrived
    finished; else None. Not the summary's `sim_end_s`: a network's server folder has the
    whole network's end there, long after its own last request (it idles in between)."""
    if int(done.sum()) != len(_arrived(req)) or not done.any():
        return None
    end = float(np.nanmax(req["arrival_s"][done] + req["e2e_s"][done]))
    return end if end == end else None


def queue_series(ts: dict[str, np.ndarray], end_s: float | None = None):
    """(time_s, waiting, running) of queue.png: the timeseries' samples, and with `end_s`
    (when the last request finished, given when every request did) a last sample there
    with none waiting or running, so the figure does not stop at the last step's start."""
    t, w, r = ts["time_s"], ts["waiting_requests"], ts["running_requests"]
    if end_s is not None and (not len(t) or end_s > t[-1]):
        t, w, r = np.append(t, end_s), np.append(w, 0.0), np.append(r, 0.0)
    return t, w, r


def load_steps(loads: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(edges, heights) of the token-load histogram as one step outline: a one-token-wide
    bar [b - 0.5, b + 0.5] of height `steps` for each load b, and height 0 between loads
    no step had."""
    order = np.argsort(loads, kind="stable")
    b, n = np.asarray(loads, dtype=float)[order], np.asarray(steps, dtype=float)[order]
    lo, hi = b - 0.5, b + 0.5
    gap = lo[1:] > hi[:-1]
    starts = np.concatenate([lo, hi[:-1][gap]])
    heights = np.concatenate([n, np.zeros(int(gap.sum()))])
    by_start = np.argsort(starts, kind="stable")
    return np.append(starts[by_start], hi[-1]), heights[by_start]


FIGURES = ("queue.png", "ttft_cdf.png", "itl_cdf.png", "token_load.png")


def _refuse_other_kind(d: Path) -> None:
    """A folder of a sweep or a `reproduce` experiment, a sweep's points/ or a network's
    servers/ is refused for what it is (it was "timeseries.csv is missing", as for a folder
    of no run)."""
    kind = run_kind(d)
    if kind is None and d.resolve().name == "points" and run_kind(d.resolve().parent) == "sweep":
        raise ConfigError(
            f"{d} holds a sweep's point records: `llmsched plot` draws one server's run (`llmsched simulate --out`)"
        )
    if kind is None and d.resolve().name == "servers" and run_kind(d.resolve().parent) == "network":
        replicas = sorted(p.name for p in d.iterdir() if (p / "timeseries.csv").is_file())
        where = f": plot one of them, e.g. {d / replicas[0]}" if replicas else ""
        raise ConfigError(f"{d} holds the replica folders of a network's run{where}")
    if kind is None or not (kind == "sweep" or kind.startswith("reproduce ")):
        return
    if not (d / RUN_PROOFS[kind][0]).exists():  # (a results.csv of the user's is no sweep)
        return
    what = "a sweep's results" if kind == "sweep" else f"a `llmsched {kind}` run's results"
    figures = [f for f in RUN_OUTPUTS[kind] if f.endswith(".png") and (d / f).is_file()]
    drawn = f"; its own figures are there ({', '.join(figures)})" if figures else ""
    raise ConfigError(f"{d} holds {what}: `llmsched plot` draws one server's run (`llmsched simulate --out`){drawn}")


def plot_dir(folder: str | Path) -> list[str]:
    """Draw queue.png, ttft_cdf.png, itl_cdf.png and token_load.png into `folder`; every
    title names the run (`run_title`)."""
    if str(folder) == "":  # (Path("") is the current folder)
        raise ConfigError(f"the folder is {str(folder)!r}, an empty path: name a `llmsched simulate --out` folder")
    d = Path(folder)
    if not d.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    stopped = interrupted_message(d)  # (its files: some of the new run's, the earlier run's removed)
    if stopped is not None:
        raise ConfigError(stopped)
    if (d / "calls.csv").is_file() and (d / "servers").is_dir():
        replicas = sorted(p.name for p in (d / "servers").iterdir() if (p / "timeseries.csv").is_file())
        where = f": plot a replica's folder, e.g. {d / 'servers' / replicas[0]}" if replicas else ""
        raise ConfigError(f"{folder} holds a network's run (calls.csv, jobs.csv, servers/){where}")
    if (d / "instances.csv").is_file() and not (d / "timeseries.csv").is_file():
        raise ConfigError(
            f"{folder} holds a serverless platform's run (instances.csv, requests.csv): "
            "`llmsched plot` draws one server's run (`llmsched simulate --out`)"
        )
    if not (d / "timeseries.csv").is_file():
        _refuse_other_kind(d)
    # every file is read and checked first: a damaged one must not leave half the figures redrawn
    ts = _read_csv(d / "timeseries.csv", ("time_s", "waiting_requests", "running_requests"))
    req = _read_csv(d / "requests.csv", ("arrival_s", "ttft_s", "e2e_s"), ("arrived", "finished"))
    itl = _read_csv(d / "itl_histogram.csv", ("itl_ms", "count"))
    load = _read_csv(d / "load_histogram.csv", ("token_load", "steps"))
    done = req["finished"] == 1 if "finished" in req else ~np.isnan(req["e2e_s"])
    _refuse_blank(d / "requests.csv", req, ("ttft_s",), done)
    _refuse_blank(d / "itl_histogram.csv", itl, ("itl_ms", "count"))
    _refuse_blank(d / "load_histogram.csv", load, ("token_load", "steps"))
    for png in FIGURES:  # (a figure's path blocked by a folder must not leave the others redrawn)
        check_out_file(d / png, "figure")
        # an earlier figure is redrawn, a file of the user's under its name is kept (notes
        # in queue.png were replaced, exit 0)
        if is_someone_elses_file(d / png):
            raise ConfigError(f"{d / png} exists and is not a figure: move it away, `llmsched plot` would replace it")
    out = []
    config = _server_config(d)
    name = run_title(d, config, _arrived(req))
    color = color_of(str((config or {}).get("policy", "")))

    fig, ax = _figure()
    t, waiting, running = queue_series(ts, _last_finish(req, done))
    # counts hold from one sample to the next: a straight line would claim counts between
    ax.plot(t, waiting, label="waiting", drawstyle="steps-post")
    ax.plot(t, running, label="running", drawstyle="steps-post")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    ax.set_title(f"Queue length over time\n{name}", fontsize=10)
    ax.legend()
    out.append(save_figure(fig, d / "queue.png"))

    ttft = req["ttft_s"][done] * 1e3
    fig, ax = _figure()
    if len(ttft):
        _cdf(ax, ttft, color=color)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of finished requests")
    ax.set_title(
        f"Time to first token, CDF of the {int(done.sum()):,} finished requests (of {len(_arrived(req)):,})\n{name}",
        fontsize=10,
    )
    out.append(save_figure(fig, d / "ttft_cdf.png"))

    fig, ax = _figure()
    if len(itl["itl_ms"]):
        _cdf(ax, itl["itl_ms"], itl["count"], color=color)
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("fraction of gaps")
    arrived = req["arrived"] == 1 if "arrived" in req else np.ones(len(done), dtype=bool)
    # (the note only where a request arrived and did not finish: its gaps count too)
    note = " (unfinished requests' tokens included)" if (arrived & ~done).any() else ""
    if not len(itl["itl_ms"]):  # (an empty plot said nothing of why)
        note = ": none (no request emitted a second token)"
    ax.set_title(f"Inter-token latency, CDF of every gap{note}\n{name}", fontsize=10)
    out.append(save_figure(fig, d / "itl_cdf.png"))

    fig, ax = _figure()
    # a bar per token load, one token wide: the histogram counts every load exactly (a
    # wider bar, a 1/100 of the range, overlapped its neighbours and drew counts over
    # loads no step had); the outline keeps a bar far under a pixel in sight. One artist
    # for them all: a patch per bar took most of the command for thousands of loads
    if len(load["token_load"]):
        edges, heights = load_steps(load["token_load"], load["steps"])
        ax.stairs(heights, edges, fill=True, color=color, edgecolor=color, linewidth=0.4)
    ax.set_xlabel("token load b of a step")
    ax.set_ylabel("steps")
    ax.set_title(f"Token-load histogram\n{name}", fontsize=10)
    out.append(save_figure(fig, d / "token_load.png"))
    return out
