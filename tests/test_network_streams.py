"""The network simulator's random streams: every stream of a run has its own numpy seed,
however many job types, call nodes, delays and servers the network has."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.core.request import NS
from llmsched.sim.network import run_network, stream_entropy
from llmsched.workload.network import NetworkSpec

N_TYPES = 15


def _many_types(seed: int) -> NetworkSpec:
    call = {"call": {"server": "s0", "prompt": "uniform:1,50", "output": "uniform:1,9"}}
    jobs = {
        f"T{i}": {
            "arrival": {"rate": 0.5 + i},
            "route": [
                {"call": {**call["call"], "server": f"s{i % 3}"}},
                {"delay": "exp:0.01"},
                {"loop": {"repeat_prob": 0.4, "body": [call]}},
            ],
        }
        for i in range(N_TYPES)
    }
    servers = {f"s{k}": {"b_max": 256, "replicas": 2} for k in range(3)}
    return NetworkSpec.from_dict({"servers": servers, "jobs": jobs, "num_jobs": 600, "seed": seed})


def _first_draw(entropy: list[int]) -> int:
    return int(np.random.default_rng(entropy).integers(0, 2**63))


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 5])
def test_every_stream_of_a_network_with_many_job_types_has_its_own_seed(seed):
    spec = _many_types(seed)
    n_calls = sum(len(job.calls()) for job in spec.jobs)
    n_delays = N_TYPES
    streams = {f"arrivals {ti}": stream_entropy(seed, "arrivals", ti) for ti in range(N_TYPES)}
    streams["loop"] = stream_entropy(seed, "loop")
    streams.update({f"lengths {k}": stream_entropy(seed, "lengths", k) for k in range(n_calls)})
    streams.update({f"delays {k}": stream_entropy(seed, "delays", k) for k in range(n_delays)})
    streams.update({f"pool {k}": stream_entropy(seed, "pool", k) for k in range(len(spec.servers))})
    by_draw: dict[int, str] = {}
    for name, entropy in streams.items():
        draw = _first_draw(entropy)
        assert draw not in by_draw, f"{name} and {by_draw[draw]} draw the same numbers"
        by_draw[draw] = name


def test_job_types_below_seven_keep_their_streams_and_the_run_uses_every_types_own():
    seed = 3
    spec = _many_types(seed)
    for ti in range(7):
        assert stream_entropy(seed, "arrivals", ti) == [seed, ti]
    st = run_network(spec)
    arrival = np.frombuffer(st.job_arrival, dtype=np.int64)
    types = np.frombuffer(st.job_type, dtype=np.int64)
    for ti, job in enumerate(spec.jobs):
        mine = np.sort(arrival[types == ti])
        assert len(mine) > 0
        rng = np.random.default_rng(stream_entropy(seed, "arrivals", ti))
        expected = np.round(job.arrival.times(rng, len(mine)) * NS).astype(np.int64)
        assert np.array_equal(mine, expected), f"job type {ti}'s arrivals are not drawn from its own stream"


# numpy splits a seed of 2**32 or more into two words: [seed, 11, 7] read as [low, high, 11, 7]
WIDE_SEEDS = [5, 5 + 2**32, 5 + 7 * 2**32, 5 + 11 * 2**32, 5 + 13 * 2**32, 5 + 1_000_003 * 2**32, 5 + 2**64, 2**128]


def test_no_two_seeds_share_a_stream_past_32_bits():
    # the loop stream of seed 11 * 2**32 + 5 was the length stream of call node 7 of seed 5
    spec = _many_types(0)
    n_calls = sum(len(job.calls()) for job in spec.jobs)
    by_draw: dict[int, str] = {}
    for seed in WIDE_SEEDS:
        streams = [("arrivals", ti) for ti in range(N_TYPES)] + [("loop", 0)]
        streams += [("lengths", k) for k in range(n_calls)] + [("delays", k) for k in range(N_TYPES)]
        streams += [("pool", k) for k in range(len(spec.servers))]
        for kind, index in streams:
            draw = _first_draw(stream_entropy(seed, kind, index))
            name = f"seed {seed} {kind} {index}"
            assert draw not in by_draw, f"{name} and {by_draw[draw]} draw the same numbers"
            by_draw[draw] = name


@pytest.mark.parametrize("seed", [0, 5, 2**32 - 1])
def test_seeds_below_32_bits_keep_their_streams(seed):
    # (the golden outputs hold the runs themselves)
    assert stream_entropy(seed, "loop") == [seed, 7]
    assert stream_entropy(seed, "lengths", 4) == [seed, 11, 4]
    assert stream_entropy(seed, "delays", 2) == [seed, 13, 2]
    assert stream_entropy(seed, "pool", 1) == [seed, 1_000_003, 1]
    assert stream_entropy(seed, "arrivals", 3) == [seed, 3]
    assert stream_entropy(seed, "arrivals", 9) == [seed, 9, 0, 1]


def test_a_run_with_a_wide_seed_is_reproducible_and_differs_from_its_low_word():
    a, b = run_network(_many_types(2**40 + 3)), run_network(_many_types(2**40 + 3))
    low = run_network(_many_types(3))
    assert bytes(a.call_prompt) == bytes(b.call_prompt) and bytes(a.job_arrival) == bytes(b.job_arrival)
    assert bytes(a.call_prompt) != bytes(low.call_prompt)
