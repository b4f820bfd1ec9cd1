"""Orca: prefill first, then decodes, in mixed steps.

Rule: prefill chunks come first, FCFS (running requests in prefill, then waiting
requests), up to the budget; the budget left serves one decode token per decoding
request in decode order. Work-conserving; decoders wait while prefill fills the budget.
"""

from .base import BatchPolicy, Planner


class Orca(BatchPolicy):
    name = "orca"
    summary = "prefill chunks first (FCFS), then one decode token per decoder in mixed steps (work-conserving)"
    work_conserving = True
    waiting_via_planner = True

    def build(self, p: Planner):
        p.take_running_prefills()
        p.admit_waiting()
        p.take_decodes()
        return p.plan(decode_first=False)
