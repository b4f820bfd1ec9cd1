"""Numbers from numpy (an element of an array, a loop over np.arange) are accepted wherever
a Python int or float is, and come back as Python ones; a bool is never a number."""

import re

import numpy as np
import pytest

import llmsched
from llmsched import Constraints, make_scheduler
from llmsched.core.engine_api import SamplingParams
from llmsched.core.errors import ConfigError
from llmsched.core.slo import check_request_slo
from llmsched.policies.spec import SchedulerSpec
from llmsched.theory.bounds import capacity, token_capacity


def test_capacity_takes_numpy_integers():
    assert capacity("paper", np.int64(512), 200, 101) == capacity("paper", 512, 200, 101)
    assert token_capacity("paper", np.int32(512)) == token_capacity("paper", 512)


def test_constraints_take_numpy_integers_and_refuse_bools():
    c = Constraints(
        b_max=np.int64(256), k_max=np.int64(4), kv_capacity=np.uint32(10_000), prefix_block_size=np.int8(16)
    )
    assert c == Constraints(b_max=256, k_max=4, kv_capacity=10_000, prefix_block_size=16)
    assert all(type(v) is int for v in (c.b_max, c.k_max, c.kv_capacity, c.prefix_block_size))
    for name in ("b_max", "k_max", "kv_capacity", "prefix_block_size"):
        with pytest.raises(ConfigError, match="must be a positive integer, got True"):
            Constraints(**{name: True})


def test_constraints_take_whole_floats_as_simulate_does():
    """`Constraints(k_max=np.float64(3))` was refused while `simulate(k_max=3.0)` ran k_max 3
    (core.checks.whole_as_int's rule, which capacity() follows too)."""
    for whole in (3.0, np.float64(3), np.float32(3)):
        c = Constraints(b_max=whole * 100, k_max=whole, kv_capacity=whole * 1000, prefix_block_size=whole)
        assert c == Constraints(b_max=300, k_max=3, kv_capacity=3000, prefix_block_size=3)
        assert all(type(v) is int for v in (c.b_max, c.k_max, c.kv_capacity, c.prefix_block_size))
        s = make_scheduler("sarathi", b_max=whole * 100, k_max=whole, max_running=whole)
        assert s.constraints == Constraints(b_max=300, k_max=3) and type(s.admission.max_running) is int
        spec = SchedulerSpec(b_max=whole * 100, k_max=whole, max_running=whole, block_size=whole)
        assert spec.build().constraints == Constraints(b_max=300, k_max=3)
    assert llmsched.simulate(k_max=np.float64(3), num_requests=5).config["k_max"] == 3
    for bad in (3.5, np.float64(3.5), float("inf"), float("nan"), 0.0, "3"):
        with pytest.raises(ConfigError, match=re.escape(f"k_max must be a positive integer, got {bad!r}")):
            Constraints(k_max=bad)
        with pytest.raises(ConfigError, match="max_running must be a positive integer"):
            make_scheduler("sarathi", max_running=bad)


def test_a_scheduler_spec_keeps_whole_floats_as_the_ints_it_runs():
    """`SchedulerSpec(k_max=np.float64(3), b_max=64.0).to_dict()` kept 3.0 and 64.0 (only the
    built scheduler's limits became ints): a recorded spec showed floats."""
    limits = ("b_max", "k_max", "kv_capacity", "max_running", "block_size")
    for whole in (4.0, np.float64(4), np.float32(4), np.int64(4)):
        spec = SchedulerSpec(**dict.fromkeys(limits, whole * 16))
        for d in (spec.to_dict(), SchedulerSpec.from_mapping({"k_max": whole}).to_dict(), spec.replace().to_dict()):
            assert all(type(d[k]) is int for k in limits if d[k] is not None), d
        assert spec.to_dict()["k_max"] == 64 and spec.replace(k_max=whole).k_max == 4
    # what is no whole number is left for build to refuse, as before
    for bad in (3.5, True, "3"):
        assert SchedulerSpec(k_max=bad).k_max is bad
        with pytest.raises(ConfigError, match=re.escape(f"k_max must be a positive integer, got {bad!r}")):
            SchedulerSpec(k_max=bad).build()


def test_make_scheduler_takes_numpy_integers():
    s = make_scheduler("sarathi", b_max=np.int64(256), k_max=np.int64(8), max_running=np.int64(4))
    assert s.constraints == Constraints(b_max=256, k_max=8)
    assert s.admission.max_running == 4 and type(s.admission.max_running) is int


def test_sampling_params_take_numpy_numbers():
    p = SamplingParams(
        max_tokens=np.int64(3),
        min_tokens=np.int64(1),
        seed=np.int64(7),
        temperature=np.float32(0.5),
        top_p=np.float64(0.9),
        top_k=np.int64(5),
        logprobs=np.int64(2),
        stop_token_ids=[np.int64(2)],
        logit_bias={np.int64(3): np.float32(1.5)},
    )
    assert (p.max_tokens, p.min_tokens, p.seed, p.top_k, p.logprobs) == (3, 1, 7, 5, 2)
    assert type(p.max_tokens) is int and type(p.temperature) is float and p.temperature == 0.5
    assert p.stop_token_ids == [2] and p.logit_bias == {3: 1.5}
    for name in ("max_tokens", "temperature", "top_p", "logprobs"):
        with pytest.raises(ConfigError, match=f"{name} must be"):
            SamplingParams(**{name: True})


def test_request_slo_takes_numpy_numbers():
    assert check_request_slo({"ttft_ms": np.int64(100), "itl_ms": np.float32(50)}) == {"ttft_ms": 100.0, "itl_ms": 50.0}
    with pytest.raises(ConfigError, match="SLO ttft_ms must be a positive number"):
        check_request_slo({"ttft_ms": True})


def test_simulate_takes_numpy_slo():
    common = dict(policy="sarathi", rate=5, num_requests=20, cost_model="paper", seed=1)
    a = llmsched.simulate(**common, slo={"ttft_ms": np.int64(100), "itl_ms": np.float32(50)})
    b = llmsched.simulate(**common, slo={"ttft_ms": 100, "itl_ms": 50.0})
    assert a.slo == b.slo
    assert {k: v for k, v in a.summary.items() if "wall" not in k} == {
        k: v for k, v in b.summary.items() if "wall" not in k
    }


def test_simulate_network_takes_a_numpy_scale():
    from pathlib import Path

    from llmsched.sim.network_result import simulate_network

    net = str(Path(__file__).resolve().parents[1] / "examples" / "networks" / "tandem.yaml")
    a = simulate_network(net, scale=np.float32(0.5), num_jobs=30, seed=1)
    b = simulate_network(net, scale=0.5, num_jobs=30, seed=1)
    same = {k: v for k, v in a.summary.items() if "wall" not in k}
    assert same == {k: v for k, v in b.summary.items() if "wall" not in k}
    for bad in (True, np.float32(-0.5)):
        with pytest.raises(ConfigError, match="scale must be a positive number"):
            simulate_network(net, scale=bad, num_jobs=30)


def test_workload_means_takes_a_numpy_sample_count():
    import numpy as np

    from llmsched.core.errors import ConfigError
    from llmsched.theory import workload_means

    wl = {"prompt": "const:10", "output": "const:5", "rate": 1}
    assert workload_means(wl, samples=np.int64(1000)) == workload_means(wl, samples=1000) == (10.0, 5.0)
    with pytest.raises(ConfigError, match="samples must be a whole number"):
        workload_means(wl, samples=True)
