"""Prefix caching in the network simulator: per-replica caches, calls that carry block ids
built from the job's token stream (system prompt, `context: grow`, forks), the metrics,
the traffic equations' view of the prompts, and the command line."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from llmsched.api import cluster_network
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.prefix_cache import PrefixCache
from llmsched.sim.network import _GOLDEN, _MASK, _ROOT, _Stream, _SystemPrompt
from llmsched.sim.network_result import merge_prefix_stats, simulate_network
from llmsched.theory.network import traffic
from llmsched.workload.blocks import chain, mix
from llmsched.workload.blocks import chain_int as _chain
from llmsched.workload.blocks import mix_int as _mix
from llmsched.workload.network import NetworkSpec

BS = 16
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "networks"


def call(prompt, output, server="s", **extra):
    return {"call": {"server": server, "prompt": f"const:{prompt}", "output": f"const:{output}", **extra}}


def network(route, *, caching=True, jobs=1, rate=0.05, system=0, context="grow", servers=None, **job):
    """One job type on server `s` (unlimited KV, Sarathi); deterministic arrivals far apart
    unless told, so every job runs alone."""
    server = {"policy": "sarathi", "b_max": 512, "prefix_caching": caching, "block_size": BS}
    jt = {"arrival": {"process": "deterministic", "rate": rate}, "route": route, "context": context, **job}
    if system:
        jt["system_prompt"] = system
    return {"servers": servers or {"s": server}, "jobs": {"A": jt}, "num_jobs": jobs, "seed": 3}


def tokens_computed(res, replica=0) -> int:
    """Token processings (prefill + decode) the replica's steps carried."""
    return sum(b * c for b, c in res.stats.replicas[replica]["sim"].load_hist.items())


def cache(res, server="s") -> dict:
    return res.summary["servers"][server]["prefix_cache"]


# ------------------------------------------------------------------------------ block ids
def test_chaining_is_the_workloads_rule():
    rng = np.random.default_rng(0)
    prev = rng.integers(0, 2**63, 50, dtype=np.uint64)
    value = rng.integers(0, 2**63, 50, dtype=np.uint64)
    assert [_mix(int(x)) for x in value] == mix(value).tolist()
    assert [_chain(int(p), int(v)) for p, v in zip(prev, value)] == chain(prev, value).tolist()


def test_stream_blocks_cover_full_blocks_and_grow_as_prefixes():
    s = _Stream(_SystemPrompt(11, 0), writer=22)
    assert s.blocks(BS, 15) is None  # no full block
    s.append(100)  # call 1's prompt
    first = s.blocks(BS, 100)
    assert len(first) == 100 // BS
    s.append(20)  # its output
    s.append(50)  # call 2's new prompt
    second = s.blocks(BS, 170)
    assert len(second) == 170 // BS and second[: len(first)] == first
    assert len(set(second)) == len(second)
    # a stream computed in one go gives the same ids as one computed as it grew
    fresh = _Stream(_SystemPrompt(11, 0), writer=22)
    fresh.append(170)
    assert fresh.blocks(BS, 170) == second
    # another writer (another job) shares nothing; each id stands for its whole prefix
    other = _Stream(_SystemPrompt(11, 0), writer=23)
    other.append(170)
    assert not set(other.blocks(BS, 170)) & set(second)
    # block k's content is (writer + k * golden), chained from the root
    expected, prev = [], _ROOT
    for k in range(len(second)):
        prev = _chain(prev, (22 + k * _GOLDEN) & _MASK)
        expected.append(prev)
    assert list(second) == expected


def test_system_prompt_blocks_are_shared_up_to_the_block_it_straddles():
    system = _SystemPrompt(7, 40)  # 40 system tokens: 2 full blocks
    a, b = _Stream(system, writer=100), _Stream(system, writer=200)
    a.append(30)
    b.append(30)
    ia, ib = a.blocks(BS, 70), b.blocks(BS, 70)
    assert ia[:2] == ib[:2] and ia[2] != ib[2]  # block 2 holds system and own tokens
    assert list(ia[:2]) == system.ids(BS)
    # a stream asked first for a prefix of the system prompt continues it consistently
    c = _Stream(system, writer=100)
    c.append(30)
    assert c.blocks(BS, 16) == ia[:1] and c.blocks(BS, 70) == ia


def test_fork_branches_share_the_base_and_diverge():
    base = _Stream(_SystemPrompt(7, 0), writer=1)
    base.append(48)
    left, right = base.fork(2), base.fork(3)
    left.append(20)
    right.append(20)
    il, ir = left.blocks(BS, 68), right.blocks(BS, 68)
    assert il[:3] == ir[:3] == base.blocks(BS, 48) and il[3] != ir[3]


# ------------------------------------------------------------------------------ hand cases
def test_context_grow_second_call_reuses_the_first_calls_full_blocks():
    route = [call(100, 20), call(50, 10)]
    on = simulate_network(network(route))
    off = simulate_network(network(route, caching=False))
    prompts = np.frombuffer(on.stats.call_prompt, dtype=np.int64).tolist()
    assert prompts == [100, 100 + 20 + 50]  # call 2 resends call 1's prompt and output
    pc = cache(on)
    # call 1 cached its 6 full prompt blocks (96 tokens); call 2 starts with them
    assert (pc["hit_blocks"], pc["hit_tokens"]) == (6, 96)
    assert pc["queried_tokens"] == 100 + 170
    # its prefill computes only the rest: 96 token processings fewer than without caching
    assert tokens_computed(off) == (100 + 19) + (170 + 9)
    assert tokens_computed(on) == tokens_computed(off) - 96
    assert "prefix_cache" not in off.summary["servers"]["s"]
    # the summary puts the measured savings against the traffic equations' load
    srv = on.summary["servers"]["s"]
    assert srv["prefix_saved_work_share"] == pytest.approx(96 / 298)
    assert srv["utilisation_net_of_hits"] == pytest.approx(srv["utilisation"] * (1 - 96 / 298))
    assert "utilisation_net_of_hits" not in off.summary["servers"]["s"]


def test_per_call_context_true_gives_the_same_ids_as_grow():
    grow = simulate_network(network([call(100, 20), call(50, 10)]))
    flags = simulate_network(network([call(100, 20), call(50, 10, context=True)], context="per-call"))
    assert cache(grow) == cache(flags)


def test_a_call_without_context_shares_only_the_system_prompt():
    # call 2 does not resend the context: its prompt is the system prompt and its own tokens
    route = [call(100, 20), call(50, 10)]
    res = simulate_network(network(route, context="per-call", system=64))
    assert np.frombuffer(res.stats.call_prompt, dtype=np.int64).tolist() == [164, 114]
    assert cache(res)["hit_tokens"] == 64


def test_system_prompt_is_hit_across_jobs_of_the_type_on_the_same_replica():
    res = simulate_network(network([call(10, 5)], jobs=5, system=64, context="per-call"))
    pc = cache(res)
    assert pc["hit_tokens"] == 4 * 64 and pc["hit_blocks"] == 4 * 4  # every job but the first
    # two replicas in turn: each keeps its own cache, so each one's first job misses
    server = {
        "policy": "sarathi",
        "prefix_caching": True,
        "block_size": BS,
        "replicas": 2,
        "router": "round-robin",
    }
    res = simulate_network(network([call(10, 5)], jobs=4, system=64, context="per-call", servers={"s": server}))
    reps = res.summary["servers"]["s"]["replicas"]
    assert [r["prefix_cache"]["hit_tokens"] for r in reps.values()] == [64, 64]
    assert cache(res)["hit_tokens"] == 128 and res.summary["prefix_cache"]["hit_tokens"] == 128


def test_job_types_have_their_own_system_prompts():
    d = network([call(10, 5)], jobs=4, system=64, context="per-call")
    d["jobs"]["B"] = {**d["jobs"]["A"], "arrival": {"process": "deterministic", "rate": 0.05}}
    res = simulate_network(d)  # A, B, A, B: each type's first job misses
    assert cache(res)["hit_tokens"] == 2 * 64


def test_join_resends_the_branches_in_route_order():
    # branch A (64 new tokens) ends after branch B (16) because of its delay; the join's
    # context is still the base, then A's, then B's: its head is A's prompt (7 blocks)
    route = [
        call(32, 16),
        {"fork": [[{"delay": 5}, call(64, 16)], [call(16, 16)]]},
        call(16, 4),
    ]
    res = simulate_network(network(route))
    prompts = np.frombuffer(res.stats.call_prompt, dtype=np.int64).tolist()
    assert prompts == [32, 48 + 16, 48 + 64, 48 + 80 + 32 + 16]  # B is delivered before A
    # B hits call 1's two prompt blocks and caches the base's third block (call 1's
    # output, now part of a prompt); A, later, hits all three; the join hits A's 7
    assert cache(res)["hit_tokens"] == 2 * BS + 3 * BS + 7 * BS


def test_caching_without_shared_prefixes_changes_nothing():
    d = network([call(100, 20), call(50, 10)], context="per-call", jobs=30, rate=4.0)
    d["jobs"]["A"]["arrival"] = {"process": "poisson", "rate": 4.0}
    on, off = simulate_network(d), simulate_network({**d, "servers": {"s": {"policy": "sarathi"}}})
    assert cache(on)["hit_tokens"] == 0
    assert np.array_equal(on.job_latency_s, off.job_latency_s)


def test_system_prompt_without_caching_is_a_longer_prompt():
    with_system = simulate_network(network([call(100, 20)], caching=False, jobs=20, rate=3.0, system=50))
    longer = simulate_network(network([call(150, 20)], caching=False, jobs=20, rate=3.0))
    assert np.array_equal(with_system.job_latency_s, longer.job_latency_s)


def agent(kv_capacity=None, replicas=1):
    server = {
        "policy": "sarathi",
        "b_max": 256,
        "prefix_caching": True,
        "block_size": BS,
        "kv_capacity": kv_capacity,
        "replicas": replicas,
        "router": "jsq",
    }
    route = [
        {"call": {"server": "s", "prompt": "geometric:120", "output": "geometric:30"}},
        {"delay": "exponential:0.2"},
        {"fork": [[call(40, 10)], [{"call": {"server": "s", "prompt": "uniform:10,80", "output": "const:8"}}]]},
        {"loop": {"repeat_prob": 0.5, "body": [call(30, 6)]}},
    ]
    d = network(route, jobs=150, system=200, servers={"s": server})
    d["jobs"]["A"]["arrival"] = {"process": "poisson", "rate": 3.0}
    return d


@pytest.mark.parametrize("kv,replicas", [(None, 1), (6000, 1), (6000, 2)])
def test_fast_path_equals_step_by_step_with_caching(kv, replicas):
    fast = simulate_network(agent(kv, replicas), fast=True)
    exact = simulate_network(agent(kv, replicas), fast=False)
    for col in ("call_ttft", "call_e2e", "call_queue", "call_prompt", "call_replica", "call_preempt"):
        assert getattr(fast.stats, col) == getattr(exact.stats, col), col
    assert cache(fast) == cache(exact)
    assert cache(fast)["hit_tokens"] > 0
    if kv is not None and replicas == 1:
        assert cache(fast)["evictions"] > 0  # the test reaches the evicting path


def test_caching_lowers_latency_of_the_agent():
    on = simulate_network(agent())
    d = agent()
    d["servers"]["s"]["prefix_caching"] = False
    off = simulate_network(d)
    assert on.summary["completed_jobs"] == off.summary["completed_jobs"] == 150
    assert np.nanmean(on.job_latency_s) < np.nanmean(off.job_latency_s)


# ------------------------------------------------------------------------------ theory, files
def test_traffic_sees_the_system_prompt_and_the_growing_context():
    grow = traffic(network([call(100, 20), call(50, 10)], system=30))
    flags = traffic(network([call(100, 20), call(50, 10, context=True)], system=30, context="per-call"))
    assert grow.class_load("s", "A.1").mean_prompt == pytest.approx(30 + 100)
    assert grow.class_load("s", "A.2").mean_prompt == pytest.approx(30 + 120 + 50)
    assert grow.to_dict()["servers"] == flags.to_dict()["servers"]
    assert any("prefix caching is on" in n for n in grow.notes)
    assert not any("prefix caching" in n for n in traffic(network([call(1, 1)], caching=False)).notes)


def test_calls_csv_and_config_round_trip(tmp_path):
    d = network([call(100, 20), call(50, 10)], system=30, jobs=2)
    res = simulate_network(d, out_dir=tmp_path)
    with open(tmp_path / "calls.csv") as f:
        assert [int(r["prompt_tokens"]) for r in csv.DictReader(f)] == [130, 200, 130, 200]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["servers"]["s"]["prefix_caching"] is True and cfg["jobs"]["A"]["system_prompt"] == 30
    again = simulate_network(cfg)
    assert cache(again) == cache(res)
    replica = json.loads((tmp_path / "servers" / "s" / "summary.json").read_text())
    assert replica["prefix_cache"]["hit_tokens"] == cache(res)["hit_tokens"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["servers"]["s"]["prefix_cache"]["token_hit_rate"] == pytest.approx(
        cache(res)["hit_tokens"] / cache(res)["queried_tokens"]
    )
    off = NetworkSpec.from_dict(network([call(1, 1)], caching=False, context="per-call")).to_dict()
    assert "prefix_caching" not in off["servers"]["s"] and "context" not in off["jobs"]["A"]


def test_merged_prefix_stats_take_the_rates_of_the_sums():
    a, b = PrefixCache(16).stats(), PrefixCache(16).stats()
    a.update(queried_tokens=80, hit_tokens=32, queried_blocks=5, hit_blocks=2)
    b.update(queried_tokens=20, hit_tokens=20, queried_blocks=1, hit_blocks=1)
    m = merge_prefix_stats([a, b])
    assert list(m) == [
        "queried_tokens", "hit_tokens", "queried_blocks", "hit_blocks", "prefill_tokens_saved",
        "first_admission_hit_tokens", "preempted_queried_tokens", "preempted_hit_tokens",
        "preempted_queried_blocks", "preempted_hit_blocks", "evictions", "cached_blocks", "free_cached_blocks",
        "block_size",
        "token_hit_rate", "block_hit_rate",
    ]  # fmt: skip
    assert m["token_hit_rate"] == 52 / 100 and m["block_hit_rate"] == 3 / 6 and m["block_size"] == 16
    none = merge_prefix_stats([PrefixCache(16).stats(), PrefixCache(32).stats()])
    assert none["token_hit_rate"] == none["block_hit_rate"] == 0.0 and none["block_size"] is None


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d["servers"]["s"].update(block_size=0), "servers.s: block_size must be a positive integer, got 0"),
        (lambda d: d["servers"]["s"].update(prefix_caching="yes"), "servers.s: prefix_caching must be true or false"),
        (lambda d: d["jobs"]["A"].update(context="grows"), "jobs.A: unknown context 'grows' (did you mean 'grow'?)"),
        (lambda d: d["jobs"]["A"].update(system_prompt=-1), "jobs.A: system_prompt (tokens) must be a whole number"),
        (
            lambda d: d["jobs"]["A"]["route"][1]["call"].update(context=False),
            "jobs.A.route[1].call: context: false in a job type whose context is grow",
        ),
    ],
)
def test_bad_config_is_one_line(edit, message):
    d = network([call(100, 20), call(50, 10)])
    edit(d)
    with pytest.raises(ConfigError) as e:
        NetworkSpec.from_dict(d)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------ command line
def test_cli_replicas_with_prefix_caching_and_system_prompt(capsys, tmp_path):
    argv = [
        "simulate",
        "--cost-model",
        "paper",
        "--replicas",
        "2",
        "--prefix-caching",
        "--system-prompt",
        "512",
        "--rate",
        "8",
        "--prompt",
        "geometric:100",
        "--output",
        "geometric:20",
        "--num-requests",
        "300",
        "--out",
        str(tmp_path),
    ]
    assert main([*argv, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    pc = s["servers"]["cluster"]["prefix_cache"]
    # every call starts with the 32 shared blocks; only each replica's first call misses them
    assert pc["block_size"] == 16 and pc["hit_blocks"] >= 32 * (300 - 2)
    assert all(r["prefix_cache"]["hit_tokens"] > 0 for r in s["servers"]["cluster"]["replicas"].values())
    assert main([*argv, "--block-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "cluster prefix cache hits: tokens / blocks" in out


def test_cluster_network_passes_caching_and_system_prompts_per_class():
    net = cluster_network(
        {
            "workload": {
                "arrival": "poisson",
                "rate": 2,
                "num_requests": 10,
                "system_prompt": 100,
                "classes": [{"tag": "chat", "system_prompt": 300}, {"tag": "code"}],
            },
            "prefix_caching": True,
            "block_size": 32,
        },
        replicas=2,
    )
    assert (net.servers["cluster"].prefix_caching, net.servers["cluster"].block_size) == (True, 32)
    assert {j.name: j.system_prompt for j in net.jobs} == {"chat": 300, "code": 100}


def test_cli_replicas_refuses_turns(capsys):
    rc = main(["simulate", "--replicas", "2", "--turns", "geometric:3", "--think-time", "5", "--rate", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--turns is for one server" in err and "\n" not in err


def test_disaggregated_with_a_system_prompt_hands_over_its_kv_too():
    """The decode call's handed-over KV holds the system prompt and the context: it waits
    their transfer and computes none of them; the prefill server's cache serves the
    system prompt to every job but the first."""
    d = NetworkSpec.from_yaml("examples/networks/disaggregated.yaml").to_dict()
    d["num_jobs"] = 200
    d["jobs"]["chat"]["system_prompt"] = 256
    for s in d["servers"].values():
        s["prefix_caching"] = True
    res = simulate_network(d)
    st = res.stats
    cls = np.asarray(st.call_class)
    arr, e2e, prompt, out = (
        np.frombuffer(c, dtype=np.int64) for c in (st.call_arrival, st.call_e2e, st.call_prompt, st.call_output)
    )
    job = np.frombuffer(st.call_job, dtype=np.int64)
    pre, dec = np.flatnonzero(cls == "prefill"), np.flatnonzero(cls == "decode")
    first = {int(job[i]): i for i in pre}
    for i in dec:
        j = first[int(job[i])]
        assert prompt[j] == 256 + (prompt[i] - 256 - out[j] - 1)  # the same system prompt heads both
        assert arr[i] == arr[j] + e2e[j] + round(0.00002 * (prompt[j] + out[j]) * 1e9)
    work = sum(tokens_computed(res, k) for k, r in enumerate(st.replicas) if r["server"] == "decode")
    assert work == int(out[dec].sum())  # one prefill token and output - 1 decode tokens a call
    assert cache(res, "prefill")["hit_tokens"] == 199 * 256


def test_a_caching_server_over_its_prompt_token_capacity_is_not_declared_certainly_unstable():
    # agent_loop: every prompt token counted offers 127.5% of capacity, but hits save about
    # 85% of the prefill and the run is stable: the report may not say "every policy"
    spec = NetworkSpec.from_yaml(EXAMPLES / "agent_loop.yaml")
    spec.num_jobs = 800
    report = traffic(spec)
    summary = simulate_network(spec).summary
    agent = report.server("agent")
    assert agent.utilisation > 1.0
    assert summary["verdict"] == "stable"
    assert report.stable is None and summary["traffic_stable"] is None
    assert "every policy's backlog grows" not in report.verdict and "check by simulation" in report.verdict
    # the bound is sound: the measured hits leave at least that much load
    assert agent.least_utilisation <= summary["servers"]["agent"]["utilisation_net_of_hits"] < agent.utilisation
    # the critical scale counts every prompt token: a lower end, not the network's limit
    assert summary["critical_scale_exact"] is False and report.critical_scale_exact is False
    assert report.critical_scale < 1.0 < report.max_critical_scale == pytest.approx(1.0 / agent.least_utilisation)


def test_the_least_utilisation_takes_out_every_resent_context_and_system_prompt_token():
    # per job: call 1 works 30 + 100 + 19 tokens, 30 of them hittable (the system prompt);
    # call 2 works 30 + 120 + 50 + 9, 150 hittable (system prompt and resent context)
    rep = traffic(network([call(100, 20), call(50, 10)], system=30))
    s = rep.server("s")
    assert s.least_utilisation == pytest.approx(s.utilisation * (358 - 180) / 358)
    assert rep.stable is True  # far below capacity
    assert rep.critical_scale_exact is False and rep.max_critical_scale == pytest.approx(1 / s.least_utilisation)
    off = traffic(network([call(100, 20), call(50, 10)], system=30, caching=False)).server("s")
    assert off.least_utilisation == off.utilisation == pytest.approx(s.utilisation)


def test_a_caching_server_over_capacity_even_net_of_every_hit_is_unstable():
    over = network([call(100, 20), call(50, 10)], system=30)
    s = traffic(over).server("s")
    over["jobs"]["A"]["arrival"]["rate"] = 0.05 * 1.2 / s.least_utilisation
    rep = traffic(over)
    assert rep.server("s").least_utilisation == pytest.approx(1.2)
    assert rep.stable is False and "even if every resent context and system-prompt token hit" in rep.verdict
    # between the two bounds: no verdict
    over["jobs"]["A"]["arrival"]["rate"] = 0.05 * 0.8 / s.least_utilisation
    rep = traffic(over)
    assert rep.max_utilisation > 1.0 and rep.stable is None
    # nothing a cache could serve (no system prompt, no resent context): over capacity is over
    plain = network([call(100, 20)], context="per-call")
    plain["jobs"]["A"]["arrival"]["rate"] = 0.05 * 1.5 / traffic(plain).max_utilisation
    rep = traffic(plain)
    assert rep.stable is False and rep.critical_scale_exact is True
    assert rep.max_critical_scale == pytest.approx(rep.critical_scale)


def test_a_max_time_stop_counts_the_saved_share_over_admitted_calls():
    """A run cut by max_time_s holds calls that never reached a cache: counted as misses
    they made prefix_saved_work_share 0.0185 where the full run's is 0.488 (and
    utilisation_net_of_hits too high). The share is over the admitted calls' work."""
    spec = network([call(2100, 50)], system=2048, rate=40, jobs=3000, arrival={"process": "poisson", "rate": 40})
    cut = simulate_network(spec, max_time_s=20).summary["servers"]["s"]["prefix_saved_work_share"]
    full = simulate_network(spec).summary["servers"]["s"]["prefix_saved_work_share"]
    assert cut == pytest.approx(full, rel=0.05)
