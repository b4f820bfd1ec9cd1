"""An option given beside a SchedulerSpec was silently dropped (prefix_caching=True left
caching off; admission, b_max and k_max were the spec's)."""

from __future__ import annotations

import pytest

from llmsched.core.errors import ConfigError
from llmsched.policies.spec import SchedulerSpec


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefix_caching": True}, "prefix_caching True differs from the SchedulerSpec's prefix_caching False"),
        ({"admission": "twp"}, "admission 'twp' differs from the SchedulerSpec's admission 'fcfs'"),
        ({"b_max": 64}, "b_max 64 differs from the SchedulerSpec's b_max 512"),
        ({"k_max": 2}, "k_max 2 differs from the SchedulerSpec's k_max None"),
        ({"max_num_seqs": 8}, "max_num_seqs 8 differs from the SchedulerSpec's max_running 4"),
        ({"admission_options": {"a": 1}}, "admission_options {'a': 1} differs from the SchedulerSpec's"),
    ],
)
def test_an_option_that_differs_from_the_specs_is_refused(tiny_model, kwargs, message):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace("{", r"\{")):
        LLM(tiny_model, scheduler=SchedulerSpec(policy="sarathi", max_running=4), **kwargs)


def test_an_option_equal_to_the_specs_is_the_spec(tiny_model):
    from llmsched.engine import LLM, LLMEngine

    spec = SchedulerSpec(policy="sarathi", admission="spf", b_max=64, k_max=2, prefix_caching=True, max_running=4)
    llm = LLM(tiny_model, scheduler=spec, prefix_caching=True, b_max=64, k_max=2, admission="spf", max_num_seqs=4)
    eng = llm.engine
    assert eng.state.prefix is not None and (eng.b_max, eng.k_max, eng.max_num_seqs) == (64, 2, 4)
    assert eng.scheduler.name.startswith("sarathi+spf")
    # without a spec the options are the engine's, with their defaults
    eng = LLMEngine(tiny_model, max_model_len=64)
    assert (eng.b_max, eng.k_max, eng.max_num_seqs, eng.spec.admission, eng.state.prefix) == (
        512,
        None,
        256,
        "fcfs",
        None,
    )


def test_the_engine_takes_whole_float_limits_as_the_simulator_does(tiny_model):
    """`LLMEngine(b_max=64.0)` was refused ("b_max must be a positive integer, got 64.0")
    while `simulate(b_max=64.0)` ran b_max 64; they come back as ints."""
    import numpy as np

    from llmsched.engine import LLMEngine

    eng = LLMEngine(tiny_model, max_model_len=64, b_max=64.0, k_max=np.float64(2), max_num_seqs=np.float32(4))
    assert (eng.b_max, eng.k_max, eng.max_num_seqs) == (64, 2, 4)
    assert all(type(v) is int for v in (eng.b_max, eng.k_max, eng.max_num_seqs))
    with pytest.raises(ConfigError, match=r"^b_max must be a positive integer, got 64\.5$"):
        LLMEngine(tiny_model, max_model_len=64, b_max=64.5)
