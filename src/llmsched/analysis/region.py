"""Former home of the stability region's names, kept for existing imports: the region is
computed in `llmsched.core.region` and exported by `llmsched.theory`; its figure is
`llmsched.analysis.figures.plot_region`."""

from ..theory import (  # noqa: F401
    StabilityRegion,
    convex_hull,
    feasible_shape,
    representative_step_time,
    stability_region,
    workload_point,
)
from .figures import plot_region  # noqa: F401

__all__ = [
    "StabilityRegion",
    "stability_region",
    "feasible_shape",
    "representative_step_time",
    "workload_point",
    "convex_hull",
    "plot_region",
]
