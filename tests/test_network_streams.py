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
