"""Common random numbers in the network simulator: a job's lengths, think times and loop
passes depend on the seed, the node, the job and the visit, not on the run's timing, so
two runs that differ only in a server compare the same jobs (`sim.network._Draws`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import llmsched.sim.network as network
from llmsched.sim.network import run_network
from llmsched.workload.network import NetworkSpec


def _spec(planner: dict, seed: int = 4, route_extra: list | None = None) -> NetworkSpec:
    route = [
        {"call": {"server": "planner", "prompt": "geometric:80", "output": "geometric:30", "class": "plan"}},
        {"delay": "exponential:0.2"},
        {
            "fork": [
                [{"call": {"server": "worker", "prompt": "uniform:1,400", "output": "geometric:40", "class": "w1"}}],
                [
                    {
                        "loop": {
                            "repeat_prob": 0.5,
                            "body": [
                                {"call": {"server": "worker", "prompt": "geometric:50", "output": "geometric:20"}},
                                {"delay": "uniform:0.01,0.3"},
                            ],
                        }
                    }
                ],
            ]
        },
        {"call": {"server": "planner", "prompt": "const:20", "output": "geometric:60", "context": True}},
        *(route_extra or []),
    ]
    return NetworkSpec.from_dict(
        {
            "servers": {"planner": planner, "worker": {"policy": "sarathi", "b_max": 256, "replicas": 2}},
            "jobs": {"agent": {"arrival": {"rate": 3.0}, "route": route}},
            "num_jobs": 300,
            "seed": seed,
        }
    )


def _calls_by_job(stats) -> dict[int, list[tuple[str, int, int]]]:
    """Each job's calls as sorted (class, prompt, output) triples: the order of a fork's
    branches' calls depends on the timing, their draws must not."""
    jobs: dict[int, list] = {}
    for j, cls, p, o in zip(stats.call_job, stats.call_class, stats.call_prompt, stats.call_output):
        jobs.setdefault(j, []).append((cls, p, o))
    return {j: sorted(calls) for j, calls in jobs.items()}


def _job_times(stats) -> np.ndarray:
    return np.frombuffer(stats.job_finish, dtype=np.int64) - np.frombuffer(stats.job_arrival, dtype=np.int64)


@pytest.mark.parametrize(
    "other",
    [
        {"policy": "sarathi", "b_max": 256, "cost_model": "paper:c=40,a=120,b0=64"},  # a slower GPU
        {"policy": "vllm", "b_max": 512},
        {"policy": "sarathi", "b_max": 256, "replicas": 3, "router": "random"},
    ],
)
def test_changing_one_server_keeps_every_jobs_lengths_and_loop_passes(other):
    base = run_network(_spec({"policy": "sarathi", "b_max": 256}))
    changed = run_network(_spec(other))
    # the runs did differ: the changed server's timing moved the jobs' times
    assert not np.array_equal(_job_times(base), _job_times(changed))
    a, b = _calls_by_job(base), _calls_by_job(changed)
    assert a.keys() == b.keys() and len(a) == 300
    differing = [j for j in a if a[j] != b[j]]
    assert differing == [], f"{len(differing)} of {len(a)} jobs ran other calls, e.g. job {differing[:1]}"
    # the loop made a geometric number of passes: the test covers repeat decisions
    passes = [sum(c[0] not in ("plan", "w1", "agent.4") for c in calls) for calls in a.values()]
    assert min(passes) == 1 and max(passes) >= 4


def test_think_times_do_not_depend_on_other_servers():
    """A job type of think times and calls on a server of its own takes the same time in
    both runs, whatever the other type's server does."""
    own_call = {"call": {"server": "own", "prompt": "geometric:30", "output": "geometric:5"}}
    think = {"loop": {"repeat_prob": 0.6, "body": [{"delay": "uniform:0.1,0.2"}]}}
    solo = [{"delay": "exponential:0.5"}, think, own_call]
    route = [{"call": {"server": "planner", "prompt": "geometric:80", "output": "geometric:30"}}]
    durations = []
    for cost in ("paper", "paper:c=40,a=120,b0=64"):
        spec = NetworkSpec.from_dict(
            {
                "servers": {
                    "planner": {"policy": "sarathi", "b_max": 256, "cost_model": cost},
                    "own": {"policy": "sarathi", "b_max": 256},
                },
                "jobs": {
                    "thinker": {"arrival": {"rate": 2.0}, "route": solo},
                    "caller": {"arrival": {"rate": 2.0}, "route": route},
                },
                "num_jobs": 400,
                "seed": 9,
            }
        )
        st = run_network(spec)
        types = np.frombuffer(st.job_type, dtype=np.int64)
        durations.append(_job_times(st)[types == 0])
    assert len(durations[0]) > 100
    assert np.array_equal(durations[0], durations[1])


def test_dropping_cached_blocks_draws_them_again_the_same(monkeypatch):
    spec = _spec({"policy": "sarathi", "b_max": 256})
    full = run_network(spec)
    monkeypatch.setattr(network, "_BLOCK", 16)
    small_blocks = run_network(spec)
    monkeypatch.setattr(network, "_CACHED_BLOCKS", 1)
    one_cached = run_network(spec)
    assert bytes(small_blocks.call_prompt) == bytes(one_cached.call_prompt)
    assert bytes(small_blocks.call_output) == bytes(one_cached.call_output)
    assert bytes(small_blocks.job_finish) == bytes(one_cached.job_finish)
    # the block size is part of the key: other blocks, other draws (the laws are the same)
    assert bytes(full.call_prompt) != bytes(small_blocks.call_prompt)


def test_each_visit_of_a_node_in_a_loop_draws_anew():
    """Keyed by the job alone, a loop's passes would repeat the first pass's lengths."""
    call = {"call": {"server": "s", "prompt": "uniform:1,100000", "output": "const:1"}}
    route = [{"loop": {"times": 3, "body": [call]}}]
    spec = NetworkSpec.from_dict(
        {
            "servers": {"s": {"policy": "sarathi", "b_max": 4096}},
            "jobs": {"j": {"arrival": {"rate": 1.0}, "route": route}},
            "num_jobs": 50,
            "seed": 1,
        }
    )
    st = run_network(spec)
    by_job = _calls_by_job(st)
    assert all(len(calls) == 3 for calls in by_job.values())
    assert all(len({p for _, p, _ in calls}) == 3 for calls in by_job.values())


def test_a_replay_law_gives_job_j_row_j(tmp_path):
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt,output\n" + "".join(f"{10 + i},{1 + i % 7}\n" for i in range(40)))
    call = {"server": "s", "prompt": f"replay:{lengths}:prompt", "output": f"replay:{lengths}:output"}
    spec = NetworkSpec.from_dict(
        {
            "servers": {"s": {"policy": "sarathi", "b_max": 256}},
            "jobs": {"j": {"arrival": {"rate": 5.0}, "route": [{"call": call}]}},
            "num_jobs": 30,
            "seed": 0,
        }
    )
    st = run_network(spec)
    for j, p, o in zip(st.call_job, st.call_prompt, st.call_output):
        assert (p, o) == (10 + j, 1 + j % 7)


def test_a_node_object_placed_twice_draws_anew_at_each_place():
    """`[call] * 2` in Python puts one object twice: keyed by its id alone, both places had
    one index and visit 0, so every job's two calls got the same lengths."""
    one = {"call": {"server": "s", "prompt": "uniform:1,100000", "output": "const:1"}}
    base = NetworkSpec.from_dict(
        {
            "servers": {"s": {"b_max": 4096}},
            "jobs": {"j": {"arrival": {"rate": 1.0}, "route": [one]}},
            "num_jobs": 40,
            "seed": 2,
        }
    )
    (job,) = base.jobs
    spec = replace(base, jobs=[replace(job, route=[job.route[0], job.route[0]])])
    by_job = _calls_by_job(run_network(spec))
    assert all(len(calls) == 2 for calls in by_job.values())
    assert sum(calls[0][1] == calls[1][1] for calls in by_job.values()) <= 1


def test_many_loop_passes_keep_their_blocks_cached():
    """A `times: 100` loop needs 200 (node, visit) blocks at once: a cache of 64, oldest
    first, drew 137,587 blocks for 2,000 jobs (13.6 s against 2.0 s before the draws were
    keyed by job). Counted here: every block is drawn about once."""
    body = [{"delay": "exponential:0.01"}, {"call": {"server": "s", "prompt": "geometric:20", "output": "const:2"}}]
    spec = NetworkSpec.from_dict(
        {
            "servers": {"s": {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}},
            "jobs": {"j": {"arrival": {"rate": 5.0}, "route": [{"loop": {"times": 40, "body": body}}]}},
            "num_jobs": 300,
            "seed": 0,
        }
    )
    drawn = []
    real = network._Draws.block

    def counting(self, job, visit):
        key = (self.kind, self.index, visit, job // network._BLOCK)
        if key not in self.cache:
            drawn.append(key)
        return real(self, job, visit)

    network._Draws.block = counting
    try:
        run_network(spec)
    finally:
        network._Draws.block = real
    assert len(drawn) == len(set(drawn)) == 2 * 40  # two nodes, 40 visits, one block of jobs
