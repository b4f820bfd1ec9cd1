"""Former home of the stability verdict, kept for existing imports: it lives in
`llmsched.theory.verdict` (import it from `llmsched.theory`)."""

from ..theory.verdict import (  # noqa: F401
    Verdict,
    batch_slope,
    fixed_b_critical_value,
    hac_slope,
    predicted_growth,
    stability_verdict,
)

__all__ = ["Verdict", "stability_verdict", "predicted_growth", "hac_slope", "batch_slope", "fixed_b_critical_value"]
