"""FasterTransformer-style: decode first, no mixing.

Rule: while any request decodes, steps are decode-only (one token per decoder, up to
the budget); prefill waits. Only when no request decodes does a step run prefill,
FCFS, with prompts split into chunks of at most the budget. Not work-conserving: new
requests wait for the whole running batch to finish decoding.
"""

from .base import BatchPolicy, Planner


class FasterTransformer(BatchPolicy):
    name = "fastertransformer"
    summary = "decode-only steps while any request decodes; prefill (chunked by b_max) only when none does"
    waiting_via_planner = True

    def build(self, p: Planner):
        if p.take_decodes():
            return p.plan(decode_first=True)
        p.take_running_prefills()
        p.admit_waiting()
        return p.plan(decode_first=False)
