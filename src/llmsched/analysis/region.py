"""The stability region with a batch-size cap (MODEL.md section 5), and its figure.

The region itself is computed in `llmsched.core.region` (policies use it too); this
module re-exports it and draws it.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.region import (StabilityRegion, convex_hull, feasible_shape,  # noqa: F401
                           representative_step_time, stability_region, workload_point)


def plot_region(region: StabilityRegion, point: tuple[float, float] | None = None,
                path: str = "region.png", *, title: str | None = None,
                point_label: str = "workload") -> str:
    """Draw the region (tokens/s) and, if given, the workload point with its ray to the
    boundary (the critical scale). Writes a PNG (Agg, no display needed); returns path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
