"""Analysis: capacity, the stability region with a batch-size cap, stability verdicts.

Names are imported on first use, so that `llmsched --help` does not pay for scipy.
`llmsched.analysis.capacity` is the module; its `capacity(...)` function is the report."""

from ..core.lazy import lazy_getattr

_EXPORTS = {
    "CapacityReport": "capacity", "token_capacity": "capacity",
    "work_per_request": "capacity",
    "StabilityRegion": "region", "plot_region": "region", "stability_region": "region",
    "workload_point": "region",
    "Verdict": "verdict", "predicted_growth": "verdict", "stability_verdict": "verdict",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
