"""`llmsched plot DIR`: figures from a simulation's output folder."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .core.errors import ConfigError


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ConfigError(f"{path} is missing: is this a `llmsched simulate --out` folder?")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ConfigError(f"{path} is empty")
    head, body = rows[0], rows[1:]
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(head):
        vals = [r[j] for r in body]
        try:
            cols[name] = np.array([float(v) if v != "" else np.nan for v in vals])
        except ValueError:
            cols[name] = np.array(vals)
    return cols


def _figure():
    from matplotlib.figure import Figure  # noqa: PLC0415 (Agg canvas, no display needed)

    fig = Figure(figsize=(7, 4.2), dpi=110)
    return fig, fig.add_subplot(1, 1, 1)


def _cdf(ax, values: np.ndarray, weights: np.ndarray | None = None, label: str | None = None):
    order = np.argsort(values)
    v = values[order]
    w = np.ones_like(v) if weights is None else weights[order]
    c = np.cumsum(w)
    ax.plot(v, c / c[-1], label=label)


def plot_dir(folder: str | Path) -> list[Path]:
    """Draw queue.png, ttft_cdf.png, itl_cdf.png and token_load.png into `folder`."""
    d = Path(folder)
    if not d.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    out = []

    ts = _read_csv(d / "timeseries.csv")
    fig, ax = _figure()
    ax.plot(ts["time_s"], ts["waiting_requests"], label="waiting")
    ax.plot(ts["time_s"], ts["running_requests"], label="running")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    ax.set_title("Queue length over time")
    ax.legend()
    out.append(_save(fig, d / "queue.png"))

    req = _read_csv(d / "requests.csv")
    ttft = req["ttft_s"][~np.isnan(req["ttft_s"])] * 1e3
    fig, ax = _figure()
    if len(ttft):
        _cdf(ax, ttft)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Time to first token, CDF")
    out.append(_save(fig, d / "ttft_cdf.png"))

    itl = _read_csv(d / "itl_histogram.csv")
    fig, ax = _figure()
    if len(itl["itl_ms"]):
        _cdf(ax, itl["itl_ms"], itl["count"])
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("fraction of gaps")
    ax.set_title("Inter-token latency, CDF")
    out.append(_save(fig, d / "itl_cdf.png"))

    load = _read_csv(d / "load_histogram.csv")
    fig, ax = _figure()
    ax.bar(
        load["token_load"],
        load["steps"],
        width=max(1.0, float(np.ptp(load["token_load"])) / 100 if len(load["token_load"]) else 1),
    )
    ax.set_xlabel("token load b of a step")
    ax.set_ylabel("steps")
    ax.set_title("Token-load histogram")
    out.append(_save(fig, d / "token_load.png"))
    return out


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
    return path
