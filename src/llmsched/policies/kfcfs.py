"""K-FCFS: fill the budget from the oldest requests first, whatever their phase.

Rule: walk the running requests (decoders and running prefills) in arrival order, then
the waiting queue in admission order (arrival order under FCFS admission, shortest prompt
first under `spf`), each waiting request after the decoders older than it; each takes its
demand, one decode token or a prefill chunk as large as the budget left, until the budget
or the batch cap is full. Work-conserving; a younger request overtakes only when an older
one cannot be served (a full step) or when the admission order puts it first.
"""

from .base import BatchPolicy, Planner


class KFCFS(BatchPolicy):
    name = "kfcfs"
    summary = "oldest requests first, any phase: decode tokens and prefill chunks by arrival (work-conserving)"
    work_conserving = True

    def build(self, p: Planner):
        state = p.state
        served = 0
        for r in sorted(state.prefilling, key=lambda q: q.key):
            served += p.take_decodes(p.decoders_before(r.key) - served)
            p.take_prefill(r)
        for r in state.waiting:
            served += p.take_decodes(p.decoders_before(r.key) - served)
            if not p.admit(r):
                break
        p.take_decodes()
        return p.plan(decode_first=True)
