"""Analysis: experiments built on `llmsched.simulate` and on `llmsched.theory`.

- sweeps (`sweep.run_sweep`, `sweep.max_stable_rate`), made of `grid` (specs),
  `points` (resolving, keying and running one point), `runner` (process pool / Ray
  backends, resumable storage), `search` (rate bisection) and `tables` (results.csv,
  results.parquet);
- `reproduce`: paper 1's headline experiment; `counterexample`: workloads inside the
  k_max region where a full-budget policy is unstable; `validate`: simulator vs engine;
- `figures`: every figure of this package (matplotlib is imported only to draw).

The theory (capacity, stability region, verdict, workload means) lives in
`llmsched.theory`; its names are re-exported here for existing code. Experiment names
are imported on first use.
"""

from ..core.lazy import lazy_dir, lazy_getattr
from ..theory import (
    CapacityReport,
    StabilityRegion,
    Verdict,
    capacity,
    predicted_growth,
    stability_region,
    stability_verdict,
    token_capacity,
    work_per_request,
    workload_means,
    workload_point,
)

_EXPORTS = {
    "plot_region": "figures",
    "run_sweep": "sweep",
    "max_stable_rate": "sweep",
    "SweepResult": "sweep",
    "reproduce_stability": "reproduce",
    "find_counterexample": "counterexample",
}

__all__ = [
    "CapacityReport",
    "StabilityRegion",
    "Verdict",
    "capacity",
    "predicted_growth",
    "stability_region",
    "stability_verdict",
    "token_capacity",
    "work_per_request",
    "workload_means",
    "workload_point",
    "plot_region",
    "run_sweep",
    "max_stable_rate",
    "SweepResult",
    "reproduce_stability",
    "find_counterexample",
]
__getattr__ = lazy_getattr(__name__, _EXPORTS)
__dir__ = lazy_dir(globals(), _EXPORTS)
