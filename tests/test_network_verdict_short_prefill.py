"""The short-window guard of a network's verdicts on prefill-heavy, tiny-output calls
(prompts of 200 tokens, outputs of 1-2), as one server's (tests/test_verdict_short_prefill.py).

A replica's, a pool's and the network's work verdicts counted their judged window in call
*decode* times, mean step x (mean output - 1): 0 for outputs of 1 token, so the guard was
off and short runs of stable networks at 30-80% load were called unstable (out of 240 runs
each: 11 one-server networks, 20 tandems, 20 pools of two). They now count it as one server
does (`theory.verdict.service_steps`, `short_window_time_s`): a call's service time with its
prefill steps, floored at 25 arrival gaps of the calls at that replica or pool (of the jobs,
for the network's work).
"""

import math

import pytest

from llmsched.api import MIN_JUDGED_ARRIVALS, guard_time_s
from llmsched.sim.network_result import simulate_network
from llmsched.theory.network import traffic
from llmsched.theory.verdict import MIN_DECODE_TIMES
from llmsched.workload.network import NetworkSpec

SERVER = {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}


def network(kind: str, output: int) -> NetworkSpec:
    def call(server):
        return {"call": {"server": server, "prompt": "const:200", "output": f"const:{output}"}}

    servers, route = {"s": SERVER}, [call("s")]
    if kind == "tandem":
        servers, route = {"s1": SERVER, "s2": SERVER}, [call("s1"), call("s2")]
    elif kind == "pool":
        servers = {"s": {**SERVER, "replicas": 2, "router": "round-robin"}}
    job = {"arrival": {"process": "poisson", "rate": 1.0}, "route": route}
    return NetworkSpec.from_dict({"servers": servers, "jobs": {"j": job}})


def run(kind: str, output: int, load: float, num_jobs: int, seed: int):
    spec = network(kind, output)
    return simulate_network(spec, scale=load * traffic(spec).critical_scale, num_jobs=num_jobs, seed=seed)


@pytest.mark.parametrize(
    "kind, output, load, num_jobs, seed",
    [
        ("single", 1, 0.8, 20, 0),  # the replica and the network's work: unstable
        ("single", 1, 0.8, 50, 1),
        ("tandem", 1, 0.5, 50, 11),  # s2 and the network's work
        ("tandem", 2, 0.3, 20, 17),  # both servers and the work, outputs of 2 (a step's decode)
        ("pool", 1, 0.5, 50, 1),  # replica p[0], the pool and the work
        ("pool", 1, 0.3, 20, 9),  # the pool and the work
    ],
)
def test_a_short_run_of_a_stable_prefill_heavy_network_is_not_called_unstable(kind, output, load, num_jobs, seed):
    s = run(kind, output, load, num_jobs, seed).summary
    verdicts = [r["verdict"] for srv in s["servers"].values() for r in srv["replicas"].values()]
    verdicts += [srv["pool_verdict"]["verdict"] for srv in s["servers"].values() if "pool_verdict" in srv]
    verdicts += [srv["verdict"] for srv in s["servers"].values()]
    work = s["network_work_verdict"]
    assert "unstable" not in verdicts and work["verdict"] != "unstable" and s["verdict"] != "unstable"
    assert work["reason"].startswith("too short to call unstable")
    assert "job service (at least 25 arrival gaps) times" in work["reason"]


@pytest.mark.parametrize("kind", ["single", "tandem", "pool"])
def test_a_long_overloaded_prefill_heavy_network_is_still_unstable(kind):
    s = run(kind, 1, 1.1, 3000, 0).summary
    assert s["verdict"] == "unstable" and s["network_work_verdict"]["verdict"] == "unstable"


def test_the_guard_times_are_one_servers():
    """A call's service time is its server's mean step time times ceil(prompt / b_max) +
    output - 1 steps (one step here); a one-server network's replica gets the guard time a
    single server's run of the same calls would (`api.guard_time_s`)."""
    res = run("single", 1, 0.8, 300, 0)
    (rep,) = res.replicas()
    step = rep.stats.busy_ns / 1e9 / rep.stats.steps
    s = res.summary
    assert s["servers"]["s"]["service_time_s"] == pytest.approx(step * max(1, math.ceil(200 / 512)))
    assert s["servers"]["s"]["decode_time_s"] == 0.0  # what the guard counted before
    assert res.guard_time("s", rep.arrival_s)[0] == pytest.approx(guard_time_s(rep, 512)[0])
    assert res.guard_time("s", rep.arrival_s)[1] == "service (at least 25 arrival gaps)"
    work = s["network_work_verdict"]
    jobs = res.job_arrival_ns / 1e9
    floor = MIN_JUDGED_ARRIVALS / MIN_DECODE_TIMES * (jobs.max() - jobs.min()) / (len(jobs) - 1)
    assert work["guard_time_s"] == pytest.approx(max(work["service_time_s"], floor))
