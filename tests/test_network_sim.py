"""The network simulator: fast path == step by step on random networks, one server equals
the single-server simulator, routes run in order, joins wait for every branch, no job or
call is lost or duplicated."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmsched.cli import main
from llmsched.core import ConfigError, make_cost_model
from llmsched.core.request import NS
from llmsched.policies import make_scheduler
from llmsched.sim.network import run_network
from llmsched.sim.network_result import network_backlog, simulate_network
from llmsched.sim.simulator import simulate_trace
from llmsched.workload import Trace
from llmsched.workload.network import NetworkSpec

POLICIES = ["sarathi", "orca", "vllm", "fastertransformer", "kfcfs"]
ROUTERS = ["random", "round-robin", "jsq", "least-tokens", "power-of-two"]


def _a(col):
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)


@st.composite
def networks(draw):
    n_servers = draw(st.integers(1, 3))
    servers = {}
    for i in range(n_servers):
        s = {
            "policy": draw(st.sampled_from(POLICIES)),
            "b_max": draw(st.sampled_from([32, 64, 128])),
            "cost_model": draw(st.sampled_from(["paper", "linear:c=5,a=0.05", "const:10"])),
            "replicas": draw(st.integers(1, 3)),
            "router": draw(st.sampled_from(ROUTERS)),
        }
        if draw(st.booleans()):
            s["kv_capacity"] = draw(st.sampled_from([400, 1000]))
        if draw(st.booleans()):
            s["k_max"] = draw(st.integers(2, 8))
        servers[f"s{i}"] = s

    def call():
        context = draw(st.booleans())
        return {
            "call": {
                "server": f"s{draw(st.integers(0, n_servers - 1))}",
                "prompt": f"uniform:1,{draw(st.integers(2, 80))}",
                "output": f"uniform:1,{draw(st.integers(2, 30))}",
                "context": context,
                "cached": context and draw(st.booleans()),
            }
        }

    def route(depth):
        nodes = [call()]
        for _ in range(draw(st.integers(0, 2))):
            kind = draw(st.sampled_from(["call", "delay", "fork", "loop"] if depth < 2 else ["call", "delay"]))
            if kind == "call":
                nodes.append(call())
            elif kind == "delay":
                nodes.append(
                    {"delay": draw(st.sampled_from(["exponential:0.01", "exponential:0.2", "per_token:0.001"]))}
                )
            elif kind == "fork":
                nodes.append({"fork": [route(depth + 1) for _ in range(draw(st.integers(2, 3)))]})
            else:
                loop = {"body": route(depth + 1)}
                if draw(st.booleans()):
                    loop["times"] = draw(st.integers(1, 3))
                else:
                    loop["repeat_prob"] = draw(st.sampled_from([0.2, 0.5]))
                nodes.append({"loop": loop})
        return nodes

    jobs = {
        f"j{k}": {
            "arrival": {
                "process": draw(st.sampled_from(["poisson", "gamma"])),
                "rate": draw(st.sampled_from([0.5, 2.0, 8.0])),
                **({"cv": 3.0} if draw(st.booleans()) else {}),
            },
            "route": route(0),
        }
        for k in range(draw(st.integers(1, 2)))
    }
    for jd in jobs.values():
        if jd["arrival"]["process"] == "poisson":
            jd["arrival"].pop("cv", None)
    return {
        "servers": servers,
        "jobs": jobs,
        "num_jobs": draw(st.integers(5, 40)),
        "seed": draw(st.integers(0, 100)),
        "control": draw(st.sampled_from(["none", "backpressure"])),
    }


def _fingerprint(stats):
    reps = [
        (
            r["name"],
            r["sim"].steps,
            r["sim"].busy,
            dict(r["sim"].batch_hist),
            r["sim"].itl.count,
            r["sim"].itl.total,
            r["sim"].series.cols,  # the time series too: a delivery joins at the next boundary on both paths
        )
        for r in stats.replicas
    ]
    return (
        bytes(stats.job_finish),
        bytes(stats.call_e2e),
        bytes(stats.call_ttft),
        bytes(stats.call_queue),
        bytes(stats.call_replica),
        reps,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(networks())
def test_fast_path_equals_step_by_step_on_random_networks(d):
    try:
        fast = run_network(NetworkSpec.from_dict(d), fast=True)
    except ConfigError as e:  # a resent context outgrew a server's KV cache: refused, not stuck
        assert "can never complete" in str(e)
        assume(False)
    exact = run_network(NetworkSpec.from_dict(d), fast=False)
    assert _fingerprint(fast) == _fingerprint(exact)
    # no job or call lost or duplicated: every job finished, every call finished once
    assert (_a(fast.job_finish) >= 0).all()
    assert (_a(fast.call_e2e) >= 0).all()
    assert int(_a(fast.job_calls).sum()) == len(fast.call_arrival)


def test_one_server_network_equals_the_single_server_simulator():
    d = {
        "servers": {"gpu": {"policy": "sarathi", "b_max": 256, "kv_capacity": 3000, "cost_model": "paper"}},
        "jobs": {
            "chat": {
                "arrival": {"process": "poisson", "rate": 3.0},
                "route": [{"call": {"server": "gpu", "prompt": "geometric:150", "output": "geometric:60"}}],
            }
        },
        "num_jobs": 400,
        "seed": 5,
    }
    stats = run_network(NetworkSpec.from_dict(d))
    arrival = _a(stats.call_arrival)
    tr = Trace(arrival / 1e9, _a(stats.call_prompt), _a(stats.call_output))
    sched = make_scheduler("sarathi", b_max=256, kv_capacity=3000)
    ref = simulate_trace(tr, sched, make_cost_model("paper"))
    # the simulator rounds arrival seconds back to ns: compare on its own clock
    assert np.array_equal(
        np.asarray(ref.e2e_ns) + np.round(tr.arrival_s * 1e9).astype(np.int64), _a(stats.call_e2e) + arrival
    )
    assert np.array_equal(np.asarray(ref.ttft_ns), _a(stats.call_ttft))
    assert ref.steps == stats.replicas[0]["sim"].steps


def test_routes_run_in_order_and_joins_wait_for_every_branch():
    d = {
        "servers": {"a": {"b_max": 128}, "b": {"b_max": 128, "replicas": 2, "router": "round-robin"}},
        "jobs": {
            "j": {
                "arrival": {"process": "poisson", "rate": 2.0},
                "route": [
                    {"call": {"server": "a", "prompt": "const:40", "output": "const:5", "class": "first"}},
                    {
                        "fork": [
                            [
                                {
                                    "call": {
                                        "server": "b",
                                        "prompt": "uniform:1,100",
                                        "output": "uniform:1,20",
                                        "class": "left",
                                    }
                                }
                            ],
                            [
                                {
                                    "call": {
                                        "server": "a",
                                        "prompt": "const:10",
                                        "output": "uniform:1,30",
                                        "class": "right",
                                    }
                                },
                                {
                                    "loop": {
                                        "times": 2,
                                        "body": [
                                            {
                                                "call": {
                                                    "server": "b",
                                                    "prompt": "const:5",
                                                    "output": "const:3",
                                                    "context": True,
                                                    "class": "again",
                                                }
                                            }
                                        ],
                                    }
                                },
                            ],
                        ]
                    },
                    {"call": {"server": "a", "prompt": "const:5", "output": "const:5", "class": "last"}},
                ],
            }
        },
        "num_jobs": 60,
        "seed": 3,
    }
    stats = run_network(NetworkSpec.from_dict(d))
    arr, e2e = _a(stats.call_arrival), _a(stats.call_e2e)
    calls = defaultdict(dict)
    for cid, (job, cls) in enumerate(zip(_a(stats.call_job), stats.call_class)):
        calls[job].setdefault(cls, []).append(cid)
    for job, by in calls.items():
        assert {k: len(v) for k, v in by.items()} == {"first": 1, "left": 1, "right": 1, "again": 2, "last": 1}
        end = lambda c: arr[c] + e2e[c]  # noqa: E731
        first, left, right, last = by["first"][0], by["left"][0], by["right"][0], by["last"][0]
        a1, a2 = by["again"]
        assert arr[left] == end(first) and arr[right] == end(first)
        assert arr[a1] == end(right) and arr[a2] == end(a1)
        assert arr[last] == max(end(left), end(a2))  # the join waits for both branches
        assert _a(stats.job_finish)[job] == end(last)
        # the loop resends the branch's context: right's prompt and output, then again's
        p = _a(stats.call_prompt)
        o = _a(stats.call_output)
        assert p[a1] == 5 + 40 + 5 + 10 + o[right]
        assert p[a2] == p[a1] + 3 + 5  # a1 added its 5 new prompt tokens and 3 outputs


def test_results_and_files(tmp_path):
    res = simulate_network("examples/networks/tandem.yaml", num_jobs=300, out_dir=tmp_path)
    s = res.summary
    assert s["completed_jobs"] == 300 and s["num_calls"] == 600
    assert set(s["servers"]) == {"s1", "s2"} and s["bottleneck"] in ("s1", "s2")
    assert s["mean_job_latency_ms"] > 0 and s["p99_job_latency_ms"] >= s["p50_job_latency_ms"]
    for name in ("summary.json", "config.json", "jobs.csv", "calls.csv", "servers/s1/requests.csv"):
        assert (tmp_path / name).is_file()
    jobs = (tmp_path / "jobs.csv").read_text().splitlines()
    assert jobs[0] == "job,type,arrival_s,finish_s,latency_s,calls,arrived,finished" and len(jobs) == 301
    calls = (tmp_path / "calls.csv").read_text().splitlines()
    assert len(calls) == 601 and calls[1].split(",")[3] == "s1"


def test_a_replica_s_config_json_records_its_scheduler_as_one_server_s_does(tmp_path):
    """docs/twp.md: the run's config.json records TWP's resolved constants
    (`scheduler.admission.resolved`); a network's or cluster's replica folder recorded only
    its replica and server, so `--admission twp` on replicas showed none of them."""
    import json

    from llmsched import simulate

    cost = "profile:h200-llama-3.2-1b"
    net = {
        "servers": {"s": {"admission": "twp", "cost_model": cost, "replicas": 2}},
        "jobs": {"A": {"arrival": {"rate": 2.0}, "route": [{"call": {"server": "s", "prompt": 100, "output": 10}}]}},
        "num_jobs": 20,
    }
    simulate_network(net, out_dir=tmp_path)
    one = simulate(num_requests=20, rate=2, admission="twp", cost_model=cost).config["scheduler"]
    for replica in ("s[0]", "s[1]"):
        cfg = json.loads((tmp_path / "servers" / replica / "config.json").read_text())
        assert cfg["replica"] == replica and cfg["server"] == "s"
        assert cfg["scheduler"]["admission"]["resolved"] == one["admission"]["resolved"]
        assert cfg["scheduler"]["batch_policy"] == "sarathi" and cfg["scheduler"]["b_max"] == 512


def _replica_counts(spec):
    st = simulate_network(spec).stats
    rep = _a(st.call_replica)
    names = np.asarray(st.call_class)
    return {c: np.bincount(rep[names == c], minlength=2).tolist() for c in sorted(set(names.tolist()))}


def test_round_robin_rotates_over_the_pools_calls_in_delivery_order():
    """docs/networks.md's rule: the turns go to the pool's calls as delivered, busy
    replicas included. One call per job splits evenly at any load; a route of two calls
    at the pool, jobs not overlapping, sends each class to one replica."""
    server = {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "replicas": 2, "router": "round-robin"}
    call = {"server": "s", "prompt": "const:2000", "output": "const:10"}
    for rate in (0.2, 20.0):
        one = {"arrival": {"process": "deterministic", "rate": rate}, "route": [{"call": call}]}
        counts = _replica_counts({"servers": {"s": server}, "jobs": {"A": one}, "num_jobs": 101})
        assert counts == {"A.1": [51, 50]}
    short = {**call, "prompt": "const:10"}
    two = {"arrival": {"process": "deterministic", "rate": 0.2}, "route": [{"call": call}, {"call": short}]}
    assert _replica_counts({"servers": {"s": server}, "jobs": {"A": two}, "num_jobs": 100}) == {
        "A.1": [100, 0],
        "A.2": [0, 100],
    }


def test_backpressure_serves_the_class_with_the_largest_queue_differential():
    from llmsched.sim.network import successors

    spec = NetworkSpec.from_yaml("examples/networks/rybko_stolyar.yaml")
    assert successors(spec) == {"A.1": {"A.2"}, "A.2": set(), "B.1": {"B.2"}, "B.2": set()}
    d = spec.to_dict()
    d.update(control="backpressure", num_jobs=400)
    for srv in d["servers"].values():
        srv["priority"] = []
    stats = run_network(NetworkSpec.from_dict(d))
    assert (_a(stats.job_finish) >= 0).all() and len(stats.call_arrival) == 800


def test_backpressure_rates_a_cached_class_by_the_work_it_computes():
    """Max-pressure weighs a class by its calls per token of work. A `cached: true` call
    computes only its new tokens (1 here, and 39 decode tokens), not the 1,000-token
    context whose KV it receives; counting that context as work rated the decode class 25
    times too slow, and it waited longer than the 839-token plain calls beside it (2.0 s
    against 1.6 s at 89% load; 0.25 s against 2.5 s now)."""
    d = {
        "servers": {
            "pre": {"policy": "sarathi", "b_max": 2048, "cost_model": "paper"},
            "s": {"policy": "sarathi", "b_max": 512, "cost_model": "paper"},
        },
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 3.4},
                "route": [
                    {"call": {"server": "pre", "prompt": "const:1000", "output": "const:1"}},
                    {
                        "call": {
                            "server": "s",
                            "prompt": "const:1",
                            "output": "const:40",
                            "context": True,
                            "cached": True,
                            "class": "dec",
                        }
                    },
                ],
            },
            "B": {
                "arrival": {"process": "poisson", "rate": 3.4},
                "route": [{"call": {"server": "s", "prompt": "const:800", "output": "const:40", "class": "plain"}}],
            },
        },
        "control": "backpressure",
        "num_jobs": 3000,
    }
    stats = run_network(NetworkSpec.from_dict(d))
    cls = np.asarray(stats.call_class)
    queue = _a(stats.call_queue)
    assert 2 * queue[cls == "dec"].mean() < queue[cls == "plain"].mean()


def test_backpressure_takes_a_steps_budget_of_prefill_not_of_cached_context():
    """A replica with nothing waiting takes about a step's budget of prefill tokens from its
    buffer. A `cached: true` call prefills only its new token, but its whole prompt (the
    300-token context whose KV arrives computed) was counted: the decode server took one
    call a step and, at 22% load, its calls waited 57 s on average (23 ms without control)."""
    decode = {"server": "decode", "prompt": "const:1", "output": "const:6", "context": True, "cached": True}
    d = {
        "servers": {
            "prefill": {"policy": "sarathi", "b_max": 2048, "cost_model": "paper", "replicas": 16},
            "decode": {"policy": "sarathi", "b_max": 256, "cost_model": "paper"},
        },
        "jobs": {
            "chat": {
                "arrival": {"process": "poisson", "rate": 113.0},
                "route": [
                    {"call": {"server": "prefill", "prompt": "const:300", "output": "const:1"}},
                    {"call": {**decode, "class": "decode"}},
                ],
            }
        },
        "control": "backpressure",
        "num_jobs": 3000,
    }
    stats = run_network(NetworkSpec.from_dict(d))
    queue = _a(stats.call_queue)[np.asarray(stats.call_class) == "decode"]
    assert queue.mean() < 0.2 * NS


def test_backpressure_network_is_judged_on_its_work_buffers_included():
    """Under back-pressure a server's calls wait in its buffer, which its replicas' backlogs
    leave out: the tandem example at 1.3 times its critical scale, s2 overloaded, was
    inconclusive (s2's replica saw a flat backlog); the network's work, buffers counted,
    grows, and it decides the network's verdict (and s2's own, its buffer counted)."""
    from llmsched.theory.network import traffic

    d = NetworkSpec.from_yaml("examples/networks/tandem.yaml").to_dict()
    d.update(control="backpressure", num_jobs=8000)
    scale = 1.3 * traffic(d).critical_scale
    s = simulate_network(d, scale=scale).summary
    assert s["servers"]["s2"]["replicas"]["s2"]["verdict"] != "unstable"  # (the buffer is not the replica's)
    assert s["network_work_verdict"]["verdict"] == "unstable"
    assert s["verdict"] == "unstable" and s["stable"] is False


@pytest.mark.parametrize("replicas", [1, 2])
def test_backpressure_servers_judge_their_buffer_too(replicas, capsys, monkeypatch):
    """A server's verdict under back-pressure counts the calls waiting in its buffer: s2 of
    the tandem example at 1.3 times its critical scale (one replica, 4,000 jobs) was
    'inconclusive', its calls piling up in its buffer at 1,200 tokens/s; with two replicas
    (s1 the bottleneck at 1.1 times, 8,000 jobs) s1 was 'stable' with its buffer growing.
    Each is unstable or no longer stable now, judged on its pool: replicas and buffer."""
    from llmsched.cli import simulate as sim_cli
    from llmsched.theory.network import traffic

    d = NetworkSpec.from_yaml("examples/networks/tandem.yaml").to_dict()
    d["servers"]["s2"]["replicas"] = replicas
    d.update(control="backpressure", num_jobs=4000 * replicas)
    res = simulate_network(d, scale=(1.3 if replicas == 1 else 1.1) * traffic(d).critical_scale)
    servers = res.summary["servers"]
    name = "s2" if replicas == 1 else "s1"
    srv = servers[name]
    assert all(r["verdict"] != "unstable" for r in srv["replicas"].values())
    assert srv["buffer_growth_ci"][0] > 0
    assert srv["verdict"] == srv["pool_verdict"]["verdict"] != "stable" and srv["stable"] is not True
    if replicas == 1:
        # (the fluid rate at which s2 falls behind: offered - capacity)
        assert srv["buffer_growth_ci"][0] > 0.5 * (srv["offered_tokens_per_s"] - srv["capacity_tokens_per_s"]) > 0
        assert srv["verdict"] == "unstable"
        monkeypatch.setenv("COLUMNS", "400")
        sim_cli.print_network_summary(res)
        out = capsys.readouterr().out
        growth = f"{srv['buffer_growth_tokens_per_s']:,.1f} tokens/s"
        assert f"unstable (buffer included; back-pressure buffer growth {growth})" in out
    d.update(control="none", num_jobs=200)
    assert not any("buffer" in k for k in simulate_network(d).summary["servers"]["s2"])


def test_priorities_keep_the_fast_path_exact_and_serve_the_priority_class_first():
    spec = NetworkSpec.from_yaml("examples/networks/rybko_stolyar.yaml")
    d = spec.to_dict()
    d["num_jobs"] = 400
    fast = run_network(NetworkSpec.from_dict(d))
    exact = run_network(NetworkSpec.from_dict(d), fast=False)
    assert _fingerprint(fast) == _fingerprint(exact)
    # at s1, B's long calls (priority) wait less than A's short calls (no priority) in the queue
    cls = np.asarray(fast.call_class)
    queue = _a(fast.call_queue)
    assert queue[cls == "B.2"].mean() < queue[cls == "A.1"].mean()


def test_a_cyclic_network_is_judged_on_its_total_work():
    """Rybko-Stolyar with exit priorities: each server's own backlog has no steady slope (it
    swings to the other server), the network's total work grows: the network is unstable."""
    res = simulate_network("examples/networks/rybko_stolyar.yaml", num_jobs=8000)
    s = res.summary
    assert s["network_work_verdict"]["verdict"] == "unstable"
    assert s["verdict"] == "unstable"


def test_disaggregated_prefill_and_decode():
    """A prefill server hands each request's KV cache to a decode server after a transfer
    delay per token; the decode server computes only the new tokens, and the traffic
    equations charge it only those."""
    from llmsched.theory.network import traffic

    spec = NetworkSpec.from_yaml("examples/networks/disaggregated.yaml")
    d = spec.to_dict()
    d["num_jobs"] = 600
    spec = NetworkSpec.from_dict(d)
    stats = run_network(spec)
    cls = np.asarray(stats.call_class)
    arr, e2e, prompt, out = (_a(c) for c in (stats.call_arrival, stats.call_e2e, stats.call_prompt, stats.call_output))
    pre, dec = np.flatnonzero(cls == "prefill"), np.flatnonzero(cls == "decode")
    assert len(pre) == len(dec) == 600
    # per job: the decode call resends prompt + first token, plus one new token, after 20 us a token
    by_job = {int(j): i for i, j in zip(pre, _a(stats.call_job)[pre])}
    for i in dec:
        j = by_job[int(_a(stats.call_job)[i])]
        context = prompt[j] + out[j]
        assert prompt[i] == context + 1
        assert arr[i] == arr[j] + e2e[j] + round(0.00002 * context * 1e9)
    # the decode replicas computed 1 prefill token and output - 1 decode tokens a call, not the context
    work = sum(sum(b * n for b, n in r["sim"].load_hist.items()) for r in stats.replicas if r["server"] == "decode")
    assert work == int(out[dec].sum())
    rep = traffic(spec)
    assert rep.server("decode").offered_tokens_per_s == pytest.approx(4.0 * 200, rel=1e-6)
    assert rep.server("prefill").offered_tokens_per_s == pytest.approx(4.0 * 800, rel=1e-6)


def test_a_decode_server_saturates_where_the_traffic_equations_say():
    """Overloaded with 8,000-token handed-over contexts, the decode server (H200 profile)
    serves about what `traffic` gives as its capacity: its steps attend to the contexts."""
    from llmsched.theory.network import traffic

    d = {
        "servers": {
            "prefill": {"policy": "sarathi", "b_max": 65536, "cost_model": "const:1"},
            "decode": {"policy": "sarathi", "b_max": 256, "cost_model": "profile"},
        },
        "jobs": {
            "chat": {
                "arrival": {"process": "poisson", "rate": 30},
                "route": [
                    {"call": {"server": "prefill", "prompt": "const:8000", "output": "const:1"}},
                    {
                        "call": {
                            "server": "decode",
                            "prompt": "const:1",
                            "output": "const:200",
                            "context": True,
                            "cached": True,
                        }
                    },
                ],
            }
        },
        "num_jobs": 1500,
        "seed": 0,
    }
    spec = NetworkSpec.from_dict(d)
    cap = traffic(spec).server("decode").capacity
    stats = run_network(spec)
    dec = np.asarray(stats.call_server) == "decode"
    end = (_a(stats.call_arrival) + _a(stats.call_e2e))[dec] / NS
    served = 200 * np.count_nonzero((end >= 20) & (end < 50)) / 30  # tokens/s while overloaded
    assert served == pytest.approx(cap, rel=0.1)


def test_cached_needs_context():
    d = NetworkSpec.from_yaml("examples/networks/disaggregated.yaml").to_dict()
    d["jobs"]["chat"]["route"][2]["call"]["context"] = False
    with pytest.raises(ConfigError, match="cached: true needs context: true"):
        NetworkSpec.from_dict(d)


def test_a_stop_before_any_job_completes_reports_the_time_simulated():
    res = simulate_network("examples/networks/tandem.yaml", num_jobs=50, max_time_s=0.6)
    s = res.summary
    assert s["completed_jobs"] == 0 and s["arrived_jobs"] > 0 and s["job_throughput"] == 0.0
    start = float(res.job_arrival_ns.min()) / NS
    assert s["duration"] == pytest.approx(res.stats.end_ns / NS - start) and s["duration"] > 0.1  # not 1e-12
    # a stop before the first job: the clock ends at the stop, not at that job's arrival
    early = simulate_network("examples/networks/tandem.yaml", num_jobs=50, max_time_s=0.05)
    assert not early.job_arrived.any() and early.stats.end_ns == round(0.05 * NS)


def test_max_time_holds_back_delays_and_deliveries_too(tmp_path):
    # each job makes one call, then thinks for 30 s: stopped at 2 s, no job may finish
    spec = tmp_path / "delay.yaml"
    spec.write_text(
        "servers:\n  s1: {policy: sarathi, b_max: 512, cost_model: const:10}\n"
        "jobs:\n  req:\n    arrival: {process: poisson, rate: 1.0}\n    route:\n"
        "      - call: {server: s1, prompt: const:50, output: const:2}\n      - delay: const:30\n"
        "num_jobs: 5\nseed: 0\n"
    )
    res = simulate_network(str(spec), max_time_s=2.0)
    assert res.summary["completed_jobs"] == 0
    assert res.stats.end_ns == 2 * NS
    assert (res.job_arrival_ns[res.job_arrived] < 2 * NS).all() and (
        res.job_arrival_ns[~res.job_arrived] >= 2 * NS
    ).all()
    none = simulate_network(str(spec), max_time_s=0.01)  # before the first job
    assert not none.job_arrived.any() and none.summary["duration"] == 0.0


def _thinks_past_the_clock(output="const:5"):
    """Two jobs whose route thinks 5 x 1e9 s between two calls: their second calls fall
    past the clock's end (2**62 ns, 4.6e9 s)."""
    call = {"call": {"server": "s1", "prompt": "const:100", "output": output}}
    return {
        "servers": {"s1": {"policy": "sarathi", "b_max": 512, "cost_model": "const:1e6"}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [call, {"loop": {"times": 5, "body": [{"delay": "const:1e9"}]}}, call],
            }
        },
        "num_jobs": 2,
        "seed": 0,
    }


@pytest.mark.parametrize("fast", [True, False])
def test_a_run_going_past_the_clock_without_a_stop_is_a_clear_error(fast):
    """Events at or after 2**62 ns were dropped as if a stop time had been reached: the run
    ended there with exit 0 and its jobs silently unfinished."""
    line = r"^network: the run would go on past the simulator's clock \(4\.612e\+09 s\) with jobs unfinished"
    with pytest.raises(ConfigError, match=line):
        simulate_network(_thinks_past_the_clock(), fast=fast)


def test_a_batch_past_the_clock_is_the_same_clear_error():
    """The fast path's one batch of a call of 9.3e6 steps of 1e3 s ends past 2**63 ns:
    its finish overflowed the int64 columns (OverflowError)."""
    with pytest.raises(ConfigError, match=r"past the simulator's clock"):
        simulate_network(_thinks_past_the_clock(output="const:9300000"))


def test_a_stop_time_holds_back_what_falls_past_the_clock_as_before(tmp_path, capsys):
    res = simulate_network(_thinks_past_the_clock(), max_time_s=1e9)
    assert res.summary["completed_jobs"] == 0 and res.stats.end_ns == 10**18
    spec = tmp_path / "think.yaml"
    spec.write_text(yaml.safe_dump(_thinks_past_the_clock()))
    assert main(["simulate", "--network", str(spec), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "past the simulator's clock" in err[0] and "--max-time" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_call_in_flight_at_the_stop_keeps_its_queue_time_ttft_and_preemptions(tmp_path):
    """calls.csv left queue_s and ttft_s blank and preemptions 0 for a call running at the
    stop although it was admitted, had its first token and was preempted before it, where
    one server's requests.csv records them."""
    spec = tmp_path / "one.yaml"
    spec.write_text(
        "servers:\n  A: {policy: sarathi, b_max: 512, cost_model: 'const:10'}\n"
        "jobs:\n  J:\n    arrival: {process: deterministic, rate: 1}\n    route:\n"
        "      - call: {server: A, prompt: 'const:100', output: 'const:5'}\nnum_jobs: 3\nseed: 0\n"
    )
    main(["simulate", "--network", str(spec), "--max-time", "2.04", "--out", str(tmp_path / "o")])
    calls = _csv(tmp_path / "o" / "calls.csv")
    late = calls[calls["call"] == 1][0]  # arrived at 2.00, prefilled 2.00-2.01, decoding at the stop
    assert late["finished"] == 0 and late["queue_s"] == 0.0 and late["ttft_s"] == pytest.approx(0.01)
    assert np.isnan(late["e2e_s"])
    one = tmp_path / "one_server"
    argv = ["simulate", "--arrival", "deterministic", "--rate", "1", "--num-requests", "3"]
    argv += ["--prompt", "const:100", "--output", "const:5", "--cost-model", "const:10", "--max-time", "2.04"]
    main([*argv, "--out", str(one)])
    req = _csv(one / "requests.csv")
    assert req[req["id"] == 1][0]["ttft_s"] == late["ttft_s"]
    # preempted before the stop: the count stays
    spec.write_text(
        "servers:\n  A: {policy: sarathi, b_max: 512, cost_model: 'const:10', kv_capacity: 250}\n"
        "jobs:\n  J:\n    arrival: {process: deterministic, rate: 1000}\n    route:\n"
        "      - call: {server: A, prompt: 'const:100', output: 'const:100'}\nnum_jobs: 2\nseed: 0\n"
    )
    full = simulate_network(str(spec))
    cut = simulate_network(str(spec), max_time_s=1.0)
    assert list(full.stats.call_preempt) == [0, 1]
    assert list(cut.stats.call_preempt) == [0, 1] and cut.summary["completed_jobs"] == 1


def _csv(path):
    return np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8", ndmin=1)


def test_max_time_makes_no_call_after_the_stop_and_lists_the_jobs_that_never_arrived(tmp_path, capsys):
    """A call ending in the step across the stop moved its job on: its next call was listed
    with its arrival after the stop and no replica, and the jobs due after the stop were not
    listed at all (num_jobs 1 of 3). As one server: nothing arrives at or after the stop,
    and every job of the workload is listed, `arrived` 0 for those that never did."""
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "servers:\n  s0: {policy: orca, b_max: 256, cost_model: paper}\n"
        "jobs:\n  J0:\n    arrival: {process: deterministic, rate: 1.0}\n    route:\n"
        "      - call: {server: s0, prompt: const:50, output: const:5}\n"
        "      - call: {server: s0, prompt: const:50, output: const:5}\n"
        "num_jobs: 3\nseed: 0\n"
    )
    for fast in (True, False):
        out = tmp_path / f"run{fast}"
        res = simulate_network(str(spec), max_time_s=1.2, fast=fast, out_dir=out)
        calls, jobs = _csv(out / "calls.csv"), _csv(out / "jobs.csv")
        # the first call (1.0 s to 1.23375 s) ends in the step across the stop: no second call
        assert len(calls) == 1 and calls["finished"][0] == 1 and calls["arrival_s"][0] == 1.0
        assert jobs["arrival_s"].tolist() == [1.0, 2.0, 3.0]
        assert jobs["arrived"].tolist() == [1, 0, 0] and jobs["calls"].tolist() == [1, 0, 0]
        assert jobs["finished"].tolist() == [0, 0, 0]
        s = res.summary
        assert (s["num_jobs"], s["arrived_jobs"], s["completed_jobs"], s["unfinished_jobs"]) == (3, 1, 0, 3)
        assert s["num_calls"] == 1 and s["job_types"]["J0"]["jobs"] == 3 and s["job_types"]["J0"]["arrived"] == 1
        assert network_backlog(res)["arrival_end_s"] == 1.0
    assert main(["simulate", "--network", str(spec), "--max-time", "1.2", "--out", ""]) == 0
    assert "jobs completed / arrived / in the workload" in capsys.readouterr().out


def test_a_stopped_run_ends_with_its_last_step_on_both_paths():
    """The network's clock took the time of every batch end it popped, also of one a call's
    delivery had cut short: stopped at 3 s, the fast path ended at the end its batch had
    before the cut, the step-by-step path at the last step's end, and each replica's
    sim_end_s and busy_fraction differed. Seed 3 has such a cut batch (checked with a
    counter of superseded batch ends: two, at 3.035727406 s, past the last step's end)."""
    spec = {
        "servers": {"s": {"policy": "vllm", "b_max": 256, "cost_model": "paper"}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 2.0},
                "route": [{"call": {"server": "s", "prompt": "geometric:100", "output": "geometric:20"}}],
            }
        },
        "num_jobs": 20,
        "seed": 3,
    }
    fast, exact = (simulate_network(spec, max_time_s=3.0, fast=f) for f in (True, False))
    last_step = fast.stats.replicas[0]["sim"].now
    assert fast.stats.end_ns == exact.stats.end_ns == last_step == 3_024_447_406
    assert fast.replicas()[0].summary == exact.replicas()[0].summary


@pytest.mark.parametrize("name", ["agent_dag", "fork_join", "rybko_stolyar", "disaggregated"])
@pytest.mark.parametrize("stop", [3.0, 11.0])
def test_max_time_lists_only_calls_that_arrived(name, stop, tmp_path):
    res = simulate_network(f"examples/networks/{name}.yaml", num_jobs=60, max_time_s=stop, out_dir=tmp_path)
    calls, jobs = _csv(tmp_path / "calls.csv"), _csv(tmp_path / "jobs.csv")
    assert len(calls) == res.summary["num_calls"]
    if len(calls):
        assert (calls["arrival_s"] < stop).all() and (calls["replica"] != "").all()
    assert len(jobs) == res.summary["num_jobs"] == 60
    assert ((jobs["arrival_s"] < stop) == (jobs["arrived"] == 1)).all()
    assert (jobs["calls"] == np.bincount(calls["job"], minlength=60)).all()
    assert res.summary["arrived_jobs"] == int(jobs["arrived"].sum())
    assert res.summary["completed_jobs"] + res.summary["unfinished_jobs"] == 60


def test_a_replica_that_never_stepped_holds_no_backlog(tmp_path):
    # stopped after 5 s, one of agent_dag's replicas has run no step: no time series
    res = simulate_network("examples/networks/agent_dag.yaml", num_jobs=800, max_time_s=5, out_dir=tmp_path)
    assert min(len(r.timeseries["time_s"]) for r in res.replicas()) == 0
    assert res.summary["verdict"] in ("stable", "unstable", "inconclusive")
    assert (tmp_path / "calls.csv").read_text().count("\n") == res.summary["num_calls"] + 1


# ------------------------------------------------------------------------- b / t(b) peaking below b_max
def _peaked(b_max, k_max, rate, prompt, output, num_jobs, cost="paper:variant=max"):
    server = {"policy": "sarathi", "b_max": b_max, "cost_model": cost}
    if k_max is not None:
        server["k_max"] = k_max
    return {
        "servers": {"s1": server},
        "jobs": {
            "j": {
                "arrival": {"process": "poisson", "rate": rate},
                "route": [{"call": {"server": "s1", "prompt": prompt, "output": output}}],
            }
        },
        "num_jobs": num_jobs,
        "seed": 0,
    }


@pytest.mark.parametrize(
    "spec",
    [
        _peaked(512, None, 0.3, "const:200", "const:50", 600),
        _peaked(512, 1000, 0.3, "const:200", "const:50", 600),
        _peaked(300, 1000, 9.0, "geometric:200", "geometric:101", 3000, cost="paper"),
    ],
)
def test_filling_b_max_is_unstable_where_the_traffic_equations_say(spec):
    # the traffic equations: a policy filling every step to b_max (Sarathi) is over its
    # capacity, the best policy (smaller steps) is not; Sarathi's backlog grows
    res = simulate_network(spec)
    t, s = res.traffic, res.summary
    assert t.stable is None and "is unstable there" in t.verdict
    assert s["servers"]["s1"]["verdict"] == "unstable" and s["verdict"] == "unstable"
    # the network's work is judged against what such a policy serves, not the peak
    work = s["network_work_verdict"]
    assert work["verdict"] == "unstable"
    assert work["threshold_tokens_per_s"] == pytest.approx(0.02 * t.server("s1").fill_capacity, rel=1e-6)


@pytest.mark.parametrize(
    "spec",
    [
        _peaked(128, None, 0.3, "const:200", "const:50", 600),
        _peaked(256, None, 9.0, "geometric:200", "geometric:101", 3000, cost="paper"),
    ],
)
def test_steps_of_the_peak_load_serve_it(spec):
    # the same traffic with b_max at the peak's load: stable, as the verdict says smaller
    # steps could be
    res = simulate_network(spec)
    assert res.traffic.stable is True and res.summary["verdict"] == "stable"
