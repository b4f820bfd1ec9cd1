"""Analysis: capacity, the stability region with a batch-size cap, stability verdicts."""

from .capacity import CapacityReport, capacity, token_capacity, work_per_request
from .region import StabilityRegion, plot_region, stability_region, workload_point
from .verdict import Verdict, predicted_growth, stability_verdict

__all__ = [
    "CapacityReport", "capacity", "token_capacity", "work_per_request",
    "StabilityRegion", "plot_region", "stability_region", "workload_point",
    "Verdict", "predicted_growth", "stability_verdict",
]
