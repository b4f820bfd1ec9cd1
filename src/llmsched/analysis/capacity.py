"""Former home of theorem 2's capacity functions, kept for existing imports: they live in
`llmsched.theory.bounds` (import them from `llmsched.theory`).

`from llmsched.analysis import capacity` gives the `capacity` function; once this module
has been imported it is `llmsched.analysis.capacity` too, so the module calls through to
the function to keep that spelling working either way. To be removed when nothing
imports it (tests/test_theorem2.py and two benchmarks still do).
"""

import sys
import types

from ..theory.bounds import (  # noqa: F401
    CapacityReport,
    capacity,
    peak_token_capacity,
    step_time_at_budget,
    token_capacity,
    work_per_request,
)

__all__ = [
    "CapacityReport",
    "capacity",
    "token_capacity",
    "work_per_request",
    "step_time_at_budget",
    "peak_token_capacity",
]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return capacity(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
