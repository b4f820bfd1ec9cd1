"""Former home of `workload_means`, kept for existing imports: it lives in
`llmsched.theory.means` (import it from `llmsched.theory`)."""

from ..theory.means import DEFAULT_SAMPLES, workload_means  # noqa: F401

__all__ = ["workload_means", "DEFAULT_SAMPLES"]
