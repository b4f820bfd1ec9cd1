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


# every kind of stream: arrivals and pools by index; lengths, delays and loops by index,
# visit and block of jobs
def _kinds(n_types: int, n_calls: int, n_delays: int, n_loops: int, n_pools: int):
    keyed = [("lengths", n_calls), ("delays", n_delays), ("loop", n_loops)]
    out = [("arrivals", ti, 0, 0) for ti in range(n_types)] + [("pool", k, 0, 0) for k in range(n_pools)]
    for kind, count in keyed:
        out += [(kind, i, v, b) for i in range(count) for v in range(3) for b in range(3)]
    return out


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 5])
def test_every_stream_of_a_network_with_many_job_types_has_its_own_seed(seed):
    spec = _many_types(seed)
    n_calls = sum(len(job.calls()) for job in spec.jobs)
    by_draw: dict[int, str] = {}
    for kind, index, visit, block in _kinds(N_TYPES, n_calls, N_TYPES, N_TYPES, len(spec.servers)):
        draw = _first_draw(stream_entropy(seed, kind, index, visit, block))
        name = f"{kind} {index} visit {visit} block {block}"
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
    # numpy read [11 * 2**32 + 5, 7] as [5, 11, 7]: without the seed's words written out, the
    # loop stream of seed 11 * 2**32 + 5 would be a length stream of seed 5
    spec = _many_types(0)
    n_calls = sum(len(job.calls()) for job in spec.jobs)
    by_draw: dict[int, str] = {}
    for seed in WIDE_SEEDS:
        for kind, index, visit, block in _kinds(N_TYPES, n_calls, 3, 3, len(spec.servers)):
            draw = _first_draw(stream_entropy(seed, kind, index, visit, block))
            name = f"seed {seed} {kind} {index} visit {visit} block {block}"
            assert draw not in by_draw, f"{name} and {by_draw[draw]} draw the same numbers"
            by_draw[draw] = name


@pytest.mark.parametrize("seed", [0, 5, 2**32 - 1])
def test_seeds_below_32_bits_keep_their_arrival_and_router_streams(seed):
    # (the golden outputs hold the runs themselves)
    assert stream_entropy(seed, "pool", 1) == [seed, 1_000_003, 1]
    assert stream_entropy(seed, "arrivals", 3) == [seed, 3]
    assert stream_entropy(seed, "arrivals", 9) == [seed, 9, 0, 1]
    # the streams keyed by job block: five words, so none is an arrival or router stream
    assert stream_entropy(seed, "loop", 2, 1, 0) == [seed, 7, 2, 1, 0]
    assert stream_entropy(seed, "lengths", 4, 0, 3) == [seed, 11, 4, 0, 3]
    assert stream_entropy(seed, "delays", 2, 0, 0) == [seed, 13, 2, 0, 0]


def test_a_run_with_a_wide_seed_is_reproducible_and_differs_from_its_low_word():
    a, b = run_network(_many_types(2**40 + 3)), run_network(_many_types(2**40 + 3))
    low = run_network(_many_types(3))
    assert bytes(a.call_prompt) == bytes(b.call_prompt) and bytes(a.job_arrival) == bytes(b.job_arrival)
    assert bytes(a.call_prompt) != bytes(low.call_prompt)
