"""Sarathi-Serve: decodes first, then chunked prefill.

Rule: every decoding request gets one decode token; the rest of the budget goes to
prefill chunks, first to running requests in prefill (oldest admitted first), then to
waiting requests in admission order, each taking as much as fits, so a step holds
prefill from as few requests as possible. Work-conserving.
"""

from .base import BatchPolicy, Planner


class Sarathi(BatchPolicy):
    name = "sarathi"
    summary = "decode tokens first, then prefill chunks FCFS filling the budget (work-conserving)"
    work_conserving = True
    waiting_via_planner = True

    def build(self, p: Planner):
        p.take_decodes()
        p.take_running_prefills()
        p.admit_waiting()
        return p.plan(decode_first=True)
