"""Figures of the analysis package (matplotlib, Agg canvas: no display needed).

matplotlib is imported inside the functions that draw, so importing this module is cheap.
- `new_figure`, `save_figure`: a figure with n panels side by side; an atomic PNG write.
- `plot_region`: the stability region with a batch-size cap (docs/stability.md) and a
  workload point with its ray to the boundary.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..theory import StabilityRegion

__all__ = ["new_figure", "save_figure", "plot_region"]


def new_figure(n: int = 1, width: float = 7.0):
    """A figure with `n` panels in one row: (figure, [axes])."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(width if n == 1 else width * 0.75 * n, 4.3), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def save_figure(fig, path: Path) -> str:
    """Lay out and write `fig` as a PNG at `path` (whole or not at all); returns the path."""
    path = Path(path)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return str(path)


def plot_region(region: StabilityRegion, point: tuple[float, float] | None = None,
                path: str = "region.png", *, title: str | None = None,
                point_label: str = "workload") -> str:
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
        ax.annotate(f"({int(x)},{int(y)})", (vx, vy), textcoords="offset points", xytext=(4, 4),
                    fontsize=7, color="tab:blue")
    if point is not None:
        p, d = float(point[0]), float(point[1])
        s = region.max_scale(p, d)
        inside = s >= 1.0
        ax.plot([p], [d], "o" if inside else "x", color="tab:green" if inside else "tab:red",
                ms=8, label=f"{point_label} ({'inside' if inside else 'outside'}, scale limit {s:.3g})")
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
