"""Vanilla vLLM (V0 without chunked prefill): prefill first, no mixing.

Rule: while a prompt can be admitted, steps are prefill-only and hold whole prompts,
FCFS, as many as fit the budget; otherwise the step is decode-only (one token per
decoder, up to the budget). Not work-conserving.
Open case, our choice: a prompt longer than the step's token budget (b_max, or an
admission policy's token limit, such as TWP's window) can never fit whole, so when it
reaches the head of the queue and the step is empty it runs alone in prefill-only
chunks of that budget (real vLLM refuses prompts over b_max); whole prompts may fill
what its last chunk leaves.
"""

from .base import BatchPolicy, Planner


class VanillaVLLM(BatchPolicy):
    name = "vllm"
    summary = "prefill-only steps of whole prompts while any can be admitted, else decode-only steps"

    def build(self, p: Planner):
        p.take_running_prefills()  # only a prompt longer than the step's budget is ever left half done
        head = p.state.waiting.first()
        if not p.prefill and head is not None and p.prefill_left(head) > p.tokens:
            p.admit(head)  # too long to fit whole: starts alone, chunked
        else:
            p.admit_waiting(whole=True)
        if p.prefill:
            return p.plan(decode_first=False)
        p.take_decodes()
        return p.plan(decode_first=True)
