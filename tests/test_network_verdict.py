"""The short-window rule of the stability verdict on network runs: each server's verdict
counts its window in that server's decode times, the network's work in job decode times
(docs/stability.md, "Limits seen")."""

import numpy as np
import pytest

from llmsched.core.request import NS
from llmsched.sim.network_result import network_backlog, simulate_network
from llmsched.theory import stability_verdict
from llmsched.theory.network import traffic
from llmsched.workload.network import NetworkSpec, load_network


def run(name: str, load: float, num_jobs: int, seed: int):
    """An example network with its bottleneck at `load` of its capacity."""
    spec = load_network(f"examples/networks/{name}.yaml")
    return simulate_network(spec, scale=load * traffic(spec).critical_scale, num_jobs=num_jobs, seed=seed)


def test_decode_times_are_each_servers_mean_step_time_times_its_decodes():
    res = run("agent_dag", 0.7, 300, 0)
    s = res.summary
    reps = res.replicas()
    calls_per_job = {}
    for name, srv in s["servers"].items():
        mine = [r for r in reps if r.config["server"] == name]  # the workers pool has two
        busy = sum(r.stats.busy_ns for r in mine) / NS
        steps = sum(r.stats.steps for r in mine)
        output = np.concatenate([r.output for r in mine])
        assert srv["decode_time_s"] == pytest.approx(busy / steps * (output.mean() - 1.0))
        calls_per_job[name] = len(output) / s["num_jobs"]
    assert len([r for r in reps if r.config["server"] == "workers"]) == 2
    # a job's: every call it makes, one after another
    job = sum(calls_per_job[n] * srv["decode_time_s"] for n, srv in s["servers"].items())
    assert res.job_decode_time_s() == pytest.approx(job)
    assert s["network_work_verdict"]["decode_time_s"] == pytest.approx(job)


def test_a_short_run_of_a_stable_network_is_not_called_unstable():
    """Tandem at 70% of its bottleneck (s2), 300 jobs, seed 1: s2's backlog grows over its
    judged 33 s with an interval wholly above the threshold, and its network's work too;
    both were called unstable before the rule, with a decode at s2 of about 11 s."""
    res = run("tandem", 0.7, 300, 1)
    s = res.summary
    s2 = s["servers"]["s2"]
    (rep,) = s2["replicas"].values()
    assert rep["backlog_growth_ci"][0] > 0.02 * s2["capacity_tokens_per_s"]  # the interval alone: unstable
    assert rep["verdict"] == "inconclusive" and rep["verdict_reason"].startswith("too short to call unstable")
    assert s2["verdict"] == "inconclusive" and s["verdict"] == "inconclusive"
    # its summary.json carries the threshold h, as one server's does (docs/stability.md)
    (mine,) = [r for r in res.replicas() if r.config["server"] == "s2"]
    assert mine.summary["verdict_threshold_tokens_per_s"] > 0
    work = s["network_work_verdict"]
    assert work["backlog_growth_tokens_per_s"] > work["threshold_tokens_per_s"] and work["backlog_growth_ci"][0] > 0
    assert work["verdict"] == "inconclusive"
    assert work["reason"].startswith("too short to call unstable") and "job service times" in work["reason"]
    # run longer and the same network is judged stable
    longer = run("tandem", 0.7, 3000, 1).summary
    assert longer["verdict"] == "stable" and longer["network_work_verdict"]["verdict"] == "stable"


def test_the_network_work_window_counts_job_decode_times_not_call_ones():
    """agent_dag at 70%, 1,000 jobs, seed 38: the network's work grows at 106 tokens/s over
    256 judged seconds, enough to be called unstable against the longest call's decode
    (the writer's, 19 s) but not against a job's (planner, two workers and writer: 38 s)."""
    res = run("agent_dag", 0.7, 1000, 38)
    s = res.summary
    work = s["network_work_verdict"]
    assert work["verdict"] == "inconclusive" and work["reason"].startswith("too short to call unstable")
    longest_call = max(srv["decode_time_s"] for srv in s["servers"].values())
    assert work["decode_time_s"] > 1.5 * longest_call
    nb = network_backlog(res)
    keep = nb["time_s"] <= nb["arrival_end_s"]
    cap = traffic(load_network("examples/networks/agent_dag.yaml")).server("writer").capacity
    by_call = stability_verdict(nb["time_s"][keep], nb["network"][keep], capacity=cap, decode_time_s=longest_call)
    assert by_call.verdict == "unstable"
    assert run("agent_dag", 0.7, 3000, 38).summary["network_work_verdict"]["verdict"] == "stable"


@pytest.mark.parametrize(("load", "num_jobs"), [(1.15, 5000), (2.0, 300)])
def test_an_overloaded_network_is_still_unstable(load, num_jobs):
    """The rule hides no instability of long runs, nor of short ones that grow fast."""
    s = run("tandem", load, num_jobs, 0).summary
    assert s["servers"]["s2"]["verdict"] == "unstable" and s["verdict"] == "unstable"
    assert s["network_work_verdict"]["verdict"] == "unstable"


def test_a_replica_or_server_that_receives_no_call_leaves_the_verdict_to_the_others():
    """A declared server no route calls, and a replica its router's weights never pick, have
    no queue: they kept every verdict above them inconclusive however long the run."""
    call = {"prompt": 50, "output": 5}
    net = {
        "servers": {
            "s": {"b_max": 512},
            "idle": {"b_max": 512, "replicas": 2},
            "w": {"b_max": 512, "replicas": 2, "router": "random", "router_options": {"weights": [1, 0]}},
        },
        "jobs": {
            "A": {
                "arrival": {"rate": 2},
                "route": [{"call": {"server": "s", **call}}, {"call": {"server": "w", **call}}],
            }
        },
        "num_jobs": 2000,
    }
    s = simulate_network(net).summary
    unused = [*s["servers"]["idle"]["replicas"].values(), s["servers"]["w"]["replicas"]["w[1]"]]
    for rep in unused:
        assert rep["num_requests"] == 0
        assert rep["verdict"] == "stable" and rep["stable"] is True and rep["verdict_reason"].startswith("no calls")
    worker = s["servers"]["w"]["replicas"]["w[0]"]
    assert worker["num_requests"] == 2000
    assert s["servers"]["idle"]["verdict"] == "stable"
    assert s["servers"]["w"]["verdict"] == worker["verdict"]
    assert s["servers"]["s"]["verdict"] == worker["verdict"] == "stable"
    assert s["verdict"] == "stable" and s["stable"] is True


def test_the_network_work_counts_a_cached_calls_new_tokens_only():
    """A `cached: true` call's resent context arrives with its KV computed, so the server
    prefills only its new tokens (the traffic equations and the replica's backlog count
    those); the network's work counted its whole prompt until its delivery, and dropped by
    the handed-over context there."""
    spec = NetworkSpec.from_dict(
        {
            "servers": {"prefill": {"cost_model": "const:10"}, "decode": {"cost_model": "const:10"}},
            "jobs": {
                "A": {
                    "arrival": {"process": "deterministic", "rate": 1},
                    "route": [
                        {"call": {"server": "prefill", "prompt": 100, "output": 1}},
                        {"delay": 1},
                        {"call": {"server": "decode", "prompt": 1, "output": 50, "context": True, "cached": True}},
                    ],
                }
            },
            "num_jobs": 1,
        }
    )
    res = simulate_network(spec)
    st = res.stats
    arrival = np.frombuffer(st.call_arrival, dtype=np.int64) / NS
    end = arrival + np.frombuffer(st.call_e2e, dtype=np.int64) / NS
    assert list(np.frombuffer(st.call_prompt, dtype=np.int64)) == [100, 102]  # 100 + 1 resent, 1 new
    b = network_backlog(res)
    t = b["time_s"]
    waiting = b["network"] - sum(b["servers"].values())  # the calls jobs have still to make
    during_transfer = (t > end[0]) & (t < arrival[1])
    assert during_transfer.sum() > 10
    assert set(waiting[during_transfer]) == {1 + 50 - 1}  # not 102 + 50 - 1
    # at delivery the decode server takes exactly that work
    after = np.flatnonzero(t >= arrival[1])[0]
    assert waiting[after] == 0 and b["servers"]["decode"][after] == 1 + 50 - 1


def _think(rate: float, delay: str, num_jobs: int) -> dict:
    """Two servers and a cyclic route s1 -> think time -> s2 -> s1 (a hunter's think.yaml)."""

    def call(server, prompt, output):
        return {"call": {"server": server, "prompt": f"const:{prompt}", "output": f"const:{output}"}}

    srv = {"policy": "sarathi", "b_max": 512, "cost_model": "paper"}
    route = [call("s1", 50, 5), {"delay": delay}, call("s2", 400, 20), call("s1", 50, 5)]
    return {
        "servers": {"s1": dict(srv), "s2": dict(srv)},
        "jobs": {"A": {"arrival": {"process": "poisson", "rate": rate}, "route": route}},
        "num_jobs": num_jobs,
        "seed": 0,
    }


def test_think_time_counts_in_the_network_works_short_window():
    """A cyclic network at 12.5% of its bottleneck with 150-s think times, 600 jobs: the calls
    still to come count from each job's arrival, so the network's work fills up for several
    think times; its growth (83 tokens/s, interval 59 to 108) was called unstable against
    the short window of a job's decode time alone (1.4 s), not the 151 s a job takes."""
    res = simulate_network(_think(1.0, "exponential:150", 600))
    s = res.summary
    assert {n: srv["verdict"] for n, srv in s["servers"].items()} == {"s1": "stable", "s2": "stable"}
    assert res.traffic.cycle and s["max_utilisation"] < 0.15
    work = s["network_work_verdict"]
    # the growth and its interval alone: unstable
    assert work["backlog_growth_tokens_per_s"] > work["threshold_tokens_per_s"] and work["backlog_growth_ci"][0] > 0
    assert work["delay_s"] == pytest.approx(150.0) and work["decode_time_s"] < 2
    assert work["verdict"] == "inconclusive" and work["reason"].startswith("too short to call unstable")
    # a job's calls' service times (their prefill steps too) and its think time
    assert "delay-inclusive job service times (151.6 s each)" in work["reason"]
    assert s["verdict"] == "inconclusive"
    # a longer run of shorter think times is stable; an overloaded one is still unstable
    assert simulate_network(_think(1.0, "exponential:100", 3000)).summary["verdict"] == "stable"
    over = simulate_network(_think(10.0, "exponential:5", 3000)).summary  # s2 at 125%
    assert over["network_work_verdict"]["verdict"] == "unstable" and over["verdict"] == "unstable"


def test_a_routes_expected_delay_adds_its_branches_and_loop_passes():
    from llmsched.theory.network import route_delay_s

    spec = NetworkSpec.from_dict(
        {
            "servers": {"s": {}},
            "jobs": {
                "A": {
                    "arrival": {"rate": 1},
                    "system_prompt": 4,
                    "route": [
                        {"call": {"server": "s", "prompt": "const:10", "output": "const:6"}},
                        {"delay": "per_token:0.5"},  # context 16 + system 4: 10 s
                        {"fork": [[{"delay": "uniform:1,3"}], [{"delay": "exponential:5"}]]},  # 2 + 5
                        {
                            "loop": {  # 3 passes: 3 x 1 s + per_token at contexts 16+4, 20+4, 24+4 tokens
                                "times": 3,
                                "body": [
                                    {"delay": 1},
                                    {"call": {"server": "s", "prompt": "const:2", "output": "const:2"}},
                                    {"delay": "per_token:0.25"},
                                ],
                            }
                        },
                    ],
                }
            },
            "num_jobs": 1,
        }
    )
    job = spec.jobs[0]
    per_token = 0.25 * ((16 + 4 + 4) + (20 + 4 + 4) + (24 + 4 + 4))
    assert route_delay_s(job.route, job.system_prompt) == pytest.approx(10 + 2 + 5 + 3 + per_token)
    # a geometric loop: E[N] = 1 / (1 - p) passes
    loop = NetworkSpec.from_dict(
        {
            "servers": {"s": {}},
            "jobs": {
                "A": {
                    "arrival": {"rate": 1},
                    "route": [
                        {"call": {"server": "s", "prompt": 1, "output": 1}},
                        {"loop": {"repeat_prob": 0.75, "body": [{"delay": 2}]}},
                    ],
                }
            },
            "num_jobs": 1,
        }
    ).jobs[0]
    assert route_delay_s(loop.route) == pytest.approx(8.0)


def _pool(replicas: int, router: str, rate: float, num_jobs: int, seed: int, prompt: str, output: str) -> dict:
    srv = {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "replicas": replicas, "router": router}
    call = {"server": "s", "prompt": prompt, "output": output}
    return {
        "servers": {"s": srv},
        "jobs": {"A": {"arrival": {"process": "poisson", "rate": rate}, "route": [{"call": call}]}},
        "num_jobs": num_jobs,
        "seed": seed,
    }


def test_a_lightly_loaded_pool_is_judged_on_its_pooled_backlog():
    """8 round-robin replicas at 7% load, 2,000 jobs, seed 1: one replica's backlog grows by
    1.4 tokens/s (interval 0.65 to 2.1, the threshold 67), which made the server and the
    network inconclusive; the pool's backlog (threshold 535) is stable."""
    s = simulate_network(_pool(8, "round-robin", 8, 2000, 1, "geometric:200", "geometric:50")).summary
    srv = s["servers"]["s"]
    odd = {k: r for k, r in srv["replicas"].items() if r["verdict"] != "stable"}
    assert list(odd) == ["s[4]"] and odd["s[4]"]["backlog_growth_ci"][0] > 0
    assert odd["s[4]"]["verdict_reason"].startswith("the backlog grows")
    pool = srv["pool_verdict"]
    assert pool["verdict"] == "stable" and pool["threshold_tokens_per_s"] == pytest.approx(
        0.02 * srv["fill_capacity_tokens_per_s"]
    )
    assert srv["verdict"] == "stable" and s["verdict"] == "stable"


def test_a_replica_that_took_one_call_is_not_judged_by_its_arrival_share():
    """512 JSQ replicas at 0.06% load, 600 jobs: replicas that took a single call had "0 of
    1 arrivals in the judged window's second half", inconclusive, and so the server."""
    s = simulate_network(_pool(512, "jsq", 100, 600, 0, "const:100", "const:10")).summary
    srv = s["servers"]["s"]
    ones = [r for r in srv["replicas"].values() if r["num_requests"] == 1]
    assert ones and all(r["verdict"] == "stable" for r in ones)
    assert srv["verdict"] == "stable" and s["verdict"] == "stable"


def test_a_pool_is_unstable_when_a_replica_is():
    """Weighted random sends one replica of three 3/4 of the calls: that one is overloaded,
    at 115% of its capacity (the pool with it); the server stays unstable."""
    net = _pool(3, "random", 17, 4000, 0, "geometric:200", "geometric:101")
    net["servers"]["s"]["router_options"] = {"weights": [1, 1, 6]}
    s = simulate_network(net).summary
    srv = s["servers"]["s"]
    assert srv["replicas"]["s[2]"]["verdict"] == "unstable"
    assert srv["verdict"] == "unstable" and s["verdict"] == "unstable"
