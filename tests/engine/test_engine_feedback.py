"""What a closed-loop admission policy learns from the engine: `StepFeedback.emitted()`
lists every token the step emitted, recomputes after a preemption included."""

from __future__ import annotations

import collections

from llmsched.core.engine_api import SamplingParams
from llmsched.policies import ADMISSION_POLICIES, AdmissionPolicy, register_admission_policy


class _Counting(AdmissionPolicy):
    name = "test-counting"
    closed_loop = True

    def __init__(self):
        self.tokens = collections.Counter()  # request -> tokens reported emitted
        self.resumed = 0

    def observe(self, state, feedback) -> None:
        for r, n in feedback.emitted():
            self.tokens[r.payload.request_id] += n
        self.resumed += len(feedback.resumed)


def test_closed_loop_policy_sees_every_emitted_token_under_preemption(tiny_model):
    from llmsched.engine.engine import LLMEngine

    register_admission_policy("test-counting", _Counting)
    try:
        # 4 + 8 blocks of 16: a 128-token cache, 4 x (12 + 40) tokens of work -> preemptions
        eng = LLMEngine(
            tiny_model,
            scheduler="vllm",
            admission="test-counting",
            b_max=128,
            max_num_seqs=4,
            num_blocks=12,
            block_size=16,
            max_model_len=512,
        )
    finally:
        ADMISSION_POLICIES.pop("test-counting", None)
    policy = eng.scheduler.admission
    policy = getattr(policy, "inner", policy)  # under the engine's max_num_seqs cap
    assert isinstance(policy, _Counting)
    for i in range(4):
        eng.add_request(
            str(i), list(range(3 + i, 15 + i)), SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        )
    produced = collections.Counter()
    while eng.has_unfinished_requests():
        for o in eng.step():
            produced[o.request_id] += len(o.new_token_ids)
    assert eng.preemptions > 0
    assert produced == {str(i): 40 for i in range(4)}
    assert policy.tokens == produced
    assert policy.resumed > 0
