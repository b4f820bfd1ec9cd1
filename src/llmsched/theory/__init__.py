"""Theory: the mathematics of one server's stability, with no simulation and no figures.

- `bounds`: theorem 2's token capacity `b_max / t(b_max)`, the work per request, the
  critical arrival rate and the `capacity(...)` report (with `k_max`, from the region).
- the two-dimensional stability region with a batch-size cap (`stability_region`,
  `StabilityRegion`, ...): computed in `llmsched.core.region`, because the adaptive
  policy needs it and policies sit below this package; exported here.
- `verdict`: stable or not, from a run's unfinished-work time series.
- `means`: a workload's mean prompt and output lengths, and their mix (`LengthMix`), by
  sampling it.

Theorem 2 is from paper 1 ("Throughput-optimal scheduling for LLM inference and AI
agents"); `docs/stability.md` explains all of it. Importing this package costs numpy and
`llmsched.workload`, not scipy (the region's LP and the verdict's `batch` method import
it when they run) and not matplotlib (figures live in `llmsched.analysis.figures`).
"""

from ..core.length_mix import LengthMix
from ..core.region import (
    StabilityRegion,
    convex_hull,
    feasible_shape,
    representative_step_time,
    stability_region,
    workload_point,
)
from .bounds import CapacityReport, capacity, peak_token_capacity, step_time_at_budget, token_capacity, work_per_request
from .means import (
    DEFAULT_SAMPLES,
    cached_workload_mix,
    ideal_cached_prompt,
    rate_unit,
    requests_per_rate,
    workload_means,
    workload_mix,
)
from .verdict import (
    INCONCLUSIVE,
    STABLE,
    UNSTABLE,
    Verdict,
    batch_slope,
    describe_verdict,
    fixed_b_critical_value,
    hac_slope,
    predicted_growth,
    stability_verdict,
)

__all__ = [
    "CapacityReport",
    "capacity",
    "token_capacity",
    "work_per_request",
    "step_time_at_budget",
    "peak_token_capacity",
    "StabilityRegion",
    "stability_region",
    "feasible_shape",
    "representative_step_time",
    "workload_point",
    "convex_hull",
    "Verdict",
    "stability_verdict",
    "predicted_growth",
    "hac_slope",
    "batch_slope",
    "fixed_b_critical_value",
    "describe_verdict",
    "STABLE",
    "UNSTABLE",
    "INCONCLUSIVE",
    "workload_means",
    "workload_mix",
    "LengthMix",
    "requests_per_rate",
    "rate_unit",
    "ideal_cached_prompt",
    "cached_workload_mix",
    "DEFAULT_SAMPLES",
]
