"""Tests of llmsched.theory.network: the traffic equations against hand-solved networks
(tandem, fork-join, loops with an exit probability and fixed counts, context growth),
against an independent execution of the routes, and the per-server capacity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmsched.core.length_mix import LengthMix
from llmsched.theory.bounds import capacity
from llmsched.theory.network import (
    MIX_SAMPLES,
    law_mean,
    network_capacity_report,
    network_capacity_rows,
    network_server_rows,
    route_moments,
    traffic,
)
from llmsched.workload.arrivals import Poisson
from llmsched.workload.lengths import Constant, Geometric, Lognormal, Uniform
from llmsched.workload.network import (
    Call,
    Delay,
    DelayLaw,
    Fork,
    JobType,
    Loop,
    NetworkSpec,
    ServerSpec,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "networks"
T512 = 0.01128 + 4 * 0.03547  # paper model: t(512) = c + a * ceil(512 / 128)
C512 = 512 / T512  # theorem 2: tokens/s of one replica at b_max = 512


def call(server, prompt, output, context=False, cls=""):
    return Call(server, Constant(prompt), Constant(output), context, cls)


def network(routes: dict, servers=("s1", "s2", "s3"), rates=None, **server_kw) -> NetworkSpec:
    rates = rates or {}
    srv = {s: ServerSpec(s, **server_kw.get(s, {})) for s in servers}
    jobs = [JobType(name, Poisson(rates.get(name, 1.0)), r) for name, r in routes.items()]
    return NetworkSpec(srv, jobs, num_jobs=1000)


def offered(rep, server):
    return rep.server(server).offered_tokens_per_s


# ------------------------------------------------------------------------- hand-solved networks
def test_tandem():
    net = network({"A": [call("s1", 100, 10), call("s2", 50, 20)]}, servers=("s1", "s2"), rates={"A": 2.0})
    rep = traffic(net)
    assert offered(rep, "s1") == pytest.approx(2 * (100 + 10 - 1))
    assert offered(rep, "s2") == pytest.approx(2 * (50 + 20 - 1))
    s1 = rep.server("s1")
    assert s1.visit_rate == pytest.approx(2.0)
    assert s1.prefill_tokens_per_s == pytest.approx(200) and s1.decode_tokens_per_s == pytest.approx(18)
    assert s1.token_capacity == pytest.approx(C512) and s1.capacity == pytest.approx(C512)
    assert s1.utilisation == pytest.approx(218 / C512)
    assert rep.bottleneck == "s1" and rep.max_utilisation == pytest.approx(218 / C512)
    assert rep.critical_scale == pytest.approx(C512 / 218)
    assert rep.critical_rates["A"] == pytest.approx(2 * C512 / 218)
    j = rep.job("A")
    assert (j.calls_per_job, j.work_per_job, j.prefill_tokens_per_job, j.decode_tokens_per_job) == pytest.approx(
        (2, 109 + 69, 150, 28)
    )
    assert rep.feedforward and rep.cycle is None and rep.stable is True
    # at the critical scale the bottleneck is exactly at capacity
    at = traffic(net.scaled(rep.critical_scale))
    assert at.max_utilisation == pytest.approx(1.0) and at.stable is False
    assert traffic(net.scaled(0.5)).max_utilisation == pytest.approx(rep.max_utilisation / 2)


def test_fork_join_with_context():
    # fork: branch 1 one call at s1; branch 2 two calls at s2, the second resending the
    # branch's context; after the join a call at s3 resends everything.
    route = [
        Fork([[call("s1", 100, 10)], [call("s2", 200, 30), call("s2", 10, 10, context=True)]]),
        Delay(DelayLaw("const", 1.0)),
        call("s3", 5, 5, context=True),
    ]
    rep = traffic(network({"F": route}, rates={"F": 1.5}))
    assert offered(rep, "s1") == pytest.approx(1.5 * 109)
    assert offered(rep, "s2") == pytest.approx(1.5 * (229 + (230 + 10 + 10 - 1)))
    ctx_at_join = 110 + 230 + 20
    assert offered(rep, "s3") == pytest.approx(1.5 * (ctx_at_join + 5 + 5 - 1))
    assert rep.class_load("s3", "F.4").mean_context == pytest.approx(ctx_at_join)
    assert rep.class_load("s3", "F.4").mean_prompt == pytest.approx(ctx_at_join + 5)
    assert rep.class_load("s2", "F.3").mean_context == pytest.approx(230)
    assert rep.server("s2").visit_rate == pytest.approx(3.0)
    assert rep.job("F").context_added_per_job == pytest.approx(ctx_at_join + 10)
    assert rep.bottleneck == "s2"


def _pairs_series(p, terms=4000):
    """E[N(N-1)/2] for N geometric on {1, 2, ...} with P(N = n) = (1-p) p^(n-1), summed."""
    n = np.arange(1, terms + 1, dtype=float)
    return float(np.sum((1 - p) * p ** (n - 1) * n * (n - 1) / 2))


@pytest.mark.parametrize("p", [0.0, 0.25, 0.6, 0.9])
def test_loop_with_exit_probability(p):
    en = 1 / (1 - p)
    assert _pairs_series(p) == pytest.approx(p / (1 - p) ** 2, rel=1e-9, abs=1e-12)
    plain = traffic(network({"L": [Loop([call("s1", 10, 4)], repeat_prob=p)]}, servers=("s1",), rates={"L": 2.0}))
    assert plain.server("s1").visit_rate == pytest.approx(2 * en)
    assert plain.job("L").visits == {"L.1": pytest.approx(en)}
    assert offered(plain, "s1") == pytest.approx(2 * en * 13)
    # with context: entered with c0 = 110 after a first call; pass i resends c0 + i * 14
    ctx = traffic(
        network(
            {"L": [call("s2", 100, 10), Loop([call("s1", 10, 4, context=True)], repeat_prob=p)]},
            servers=("s1", "s2"),
            rates={"L": 2.0},
        )
    )
    expected_context_sum = 110 * en + 14 * _pairs_series(p)
    assert offered(ctx, "s1") == pytest.approx(2 * (expected_context_sum + en * 13))
    assert ctx.class_load("s1", "L.2").mean_context == pytest.approx(expected_context_sum / en)
    assert ctx.job("L").context_added_per_job == pytest.approx(110 + 14 * en)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_fixed_times_loop(n):
    rep = traffic(
        network(
            {
                "L": [
                    call("s2", 100, 10),
                    Loop([call("s1", 10, 4, context=True)], times=n),
                    call("s2", 1, 1, context=True),
                ]
            },
            servers=("s1", "s2"),
        )
    )
    hand_context = sum(110 + i * 14 for i in range(n))
    assert offered(rep, "s1") == pytest.approx(hand_context + n * 13)
    assert rep.server("s1").visit_rate == pytest.approx(n)
    # the last call resends the first call's tokens and every pass's
    assert offered(rep, "s2") == pytest.approx(109 + (110 + 14 * n + 1 + 1 - 1))


def test_context_growth_hand_case_agent_dag():
    rep = traffic(EXAMPLES / "agent_dag.yaml")
    # plan: geometric:300 / geometric:100; the fork reads the plan (400 tokens);
    # search 200 / 150 and code 100 / 80 in parallel; answer 50 / 250 reads all of it
    assert rep.class_load("planner", "plan").work_per_visit == pytest.approx(300 + 100 - 1)
    assert rep.class_load("workers", "search").mean_context == pytest.approx(400)
    assert rep.class_load("workers", "search").work_per_visit == pytest.approx(400 + 200 + 150 - 1)
    assert rep.class_load("workers", "code").work_per_visit == pytest.approx(400 + 100 + 80 - 1)
    answer_context = 400 + 350 + 180
    assert rep.class_load("writer", "answer").mean_context == pytest.approx(answer_context)
    assert offered(rep, "writer") == pytest.approx(answer_context + 50 + 250 - 1)
    w = rep.server("workers")
    assert w.replicas == 2 and w.token_capacity == pytest.approx(2 * C512)
    assert w.utilisation == pytest.approx((749 + 579) / (2 * C512))
    assert rep.bottleneck == "writer" and rep.feedforward


def test_length_law_means_are_used():
    net = network({"A": [Call("s1", Geometric(200, max=300), Uniform(1, 9))]}, servers=("s1",))
    rep = traffic(net)
    q = 1 - 1 / 200
    assert offered(rep, "s1") == pytest.approx((1 - q**300) / (1 - q) + 5 - 1)


def test_lognormal_mean_of_the_rounded_clipped_law():
    law = Lognormal(3, sigma=1.5, max=40)
    s = law.log_sigma
    mu = math.log(3) - s * s / 2

    def cdf(x):  # P(X <= x), X lognormal(mu, s)
        return 0.5 * math.erfc(-(math.log(x) - mu) / (s * math.sqrt(2)))

    # E[clip(rint(X), 1, 40)] as the sum of k P(rint(X) = k)
    direct = cdf(1.5) + 40 * (1 - cdf(39.5)) + sum(k * (cdf(k + 0.5) - cdf(k - 0.5)) for k in range(2, 40))
    assert law_mean(law) == pytest.approx(direct, rel=1e-12)
    # no max: the tail beyond the exact terms is integrated in closed form
    wide = Lognormal(2000, sigma=2.0)
    x = wide.sample(np.random.default_rng(3), 2_000_000)
    assert law_mean(wide) == pytest.approx(x.mean(), rel=0.02)
    assert law_mean(Lognormal(1000, sigma=0.5)) == pytest.approx(1000, rel=1e-9)
    assert law_mean(Constant(7)) == 7.0


# ------------------------------------------------------------------------- an independent check
def _walk(route, ctx, rng, records):
    """Execute a route once (constant lengths; loops sampled); returns the context added.
    records: (server, class, prompt tokens sent, output tokens)."""
    added = 0.0
    for node in route:
        if isinstance(node, Call):
            p, o = node.prompt.value, node.output.value
            records.append((node.server, node.cls, p + (ctx + added if node.context else 0), o))
            added += p + o
        elif isinstance(node, Fork):
            added += sum(_walk(b, ctx + added, rng, records) for b in node.branches)
        elif isinstance(node, Loop):
            passes = node.times if node.times is not None else int(rng.geometric(1 - node.repeat_prob))
            for _ in range(passes):
                added += _walk(node.body, ctx + added, rng, records)
    return added


def _nested_fixed():
    inner = Loop(
        [
            call("s2", 3, 2, context=True),
            Fork([[call("s1", 1, 1, context=True)], [call("s3", 2, 3), call("s3", 1, 2, context=True)]]),
        ],
        times=3,
    )
    return [
        call("s1", 20, 5),
        Loop([call("s2", 7, 3, context=True), inner, call("s1", 2, 2, context=True)], times=2),
        Fork([[Loop([call("s2", 4, 4, context=True)], times=2)], [call("s3", 9, 1, context=True)]]),
        call("s1", 1, 1, context=True),
    ]


def _nested_random():
    inner = Loop([call("s2", 3, 2, context=True), call("s1", 1, 1, context=True)], repeat_prob=0.5)
    return [
        call("s1", 20, 5),
        Loop(
            [
                call("s2", 7, 3, context=True),
                inner,
                Fork([[call("s3", 2, 2, context=True)], [Loop([call("s1", 1, 3, context=True)], times=2)]]),
            ],
            repeat_prob=0.3,
        ),
        call("s3", 1, 1, context=True),
    ]


def _loads_by_walking(route, n, seed=0):
    rng = np.random.default_rng(seed)
    totals: dict = {}
    for _ in range(n):
        records = []
        _walk(route, 0.0, rng, records)
        for server, _cls, p, o in records:
            totals[server] = totals.get(server, 0.0) + p + o - 1
    return {k: v / n for k, v in totals.items()}


def test_nested_fixed_loops_and_forks_exactly():
    route = _nested_fixed()
    rep = traffic(network({"N": route}))
    walked = _loads_by_walking(route, 1)  # deterministic: one execution is the mean
    for s in ("s1", "s2", "s3"):
        assert offered(rep, s) == pytest.approx(walked[s], rel=1e-12)


def test_nested_random_loops_against_execution():
    route = _nested_random()
    rep = traffic(network({"N": route}))
    walked = _loads_by_walking(route, 50_000, seed=1)
    for s in ("s1", "s2", "s3"):
        assert offered(rep, s) == pytest.approx(walked[s], rel=0.03)


def test_route_moments():
    m = route_moments([call("s1", 10, 5), Loop([call("s1", 1, 1, context=True, cls="x")], times=2)])
    assert m["context_added"] == pytest.approx(15 + 4)
    assert m["classes"][("s1", "x")] == {
        "visits": 2.0,
        "context_visits": 2.0,
        "context_sum": 15 + 17,
        "prompt_new": 2.0,
        "output": 2.0,
        "cached_context_visits": 0.0,
        "cached_context_sum": 0.0,
    }


# ------------------------------------------------------------------------- capacity
def test_replicas_and_random_weights():
    rep = traffic(network({"A": [call("s1", 100, 10)]}, servers=("s1",), s1={"replicas": 4, "router": "round-robin"}))
    assert rep.server("s1").token_capacity == pytest.approx(4 * C512)
    assert rep.server("s1").busiest_replica_share == pytest.approx(0.25)
    w = traffic(
        network(
            {"A": [call("s1", 100, 10)]},
            servers=("s1",),
            s1={"replicas": 2, "router": "random", "router_options": {"weights": [1, 3]}},
        )
    )
    s = w.server("s1")
    assert s.busiest_replica_share == pytest.approx(0.75)
    assert s.token_capacity == pytest.approx(C512 / 0.75)
    assert s.utilisation == pytest.approx(109 * 0.75 / C512)


@pytest.mark.parametrize("k_max", [4, 16])
def test_k_max_region_matches_single_server_capacity(k_max):
    rate = 1.5
    rep = traffic(network({"A": [call("s1", 200, 101)]}, servers=("s1",), rates={"A": rate}, s1={"k_max": k_max}))
    ref = capacity("paper", 512, 200, 101, k_max=k_max, rate=rate)
    s = rep.server("s1")
    assert s.utilisation == pytest.approx(ref.utilisation, rel=1e-6)
    assert s.capacity == pytest.approx(ref.effective_capacity, rel=1e-6)
    # prompts of 200 cut into the face's chunks a step's slots cannot always take: an upper bound
    assert s.binding == ref.binding and s.region_exact is False
    assert rep.critical_rates["A"] == pytest.approx(ref.critical_rate, rel=1e-6)


def test_k_max_with_replicas_scales_the_region():
    one = traffic(network({"A": [call("s1", 200, 101)]}, servers=("s1",), s1={"k_max": 8}))
    four = traffic(network({"A": [call("s1", 200, 101)]}, servers=("s1",), s1={"k_max": 8, "replicas": 4}))
    assert four.server("s1").utilisation == pytest.approx(one.server("s1").utilisation / 4, rel=1e-6)
    assert four.server("s1").capacity == pytest.approx(4 * one.server("s1").capacity, rel=1e-6)


def test_context_dependent_cost_model_matches_single_server_capacity():
    rate = 4.0
    rep = traffic(
        network(
            {"A": [call("s1", 1000, 200)]},
            servers=("s1",),
            rates={"A": rate},
            s1={"cost_model": "profile", "b_max": 1024},
        )
    )
    ref = capacity("profile", 1024, 1000, 200, rate=rate, mix=_const_mix(1000, 200))
    assert rep.server("s1").contexts == "length mix"
    assert rep.server("s1").utilisation == pytest.approx(ref.utilisation, rel=1e-9)
    assert rep.server("s1").step_time_at_b_max_s == pytest.approx(ref.step_time_at_b_max_s)


def _disaggregated(system=0, rate=4.0, k_max=None):
    """8,000-token prompts prefilled on s1, handed over (`cached: true`) to s2 with one new
    token and 200 output tokens, timed by the H200 profile."""
    route = [
        call("s1", 8000, 1, cls="prefill"),
        Call("s2", Constant(1), Constant(200), context=True, cls="decode", cached=True),
    ]
    s2 = {"cost_model": "profile", "b_max": 256, "k_max": k_max}
    net = NetworkSpec(
        {"s1": ServerSpec("s1"), "s2": ServerSpec("s2", **s2)},
        [JobType("A", Poisson(rate), route, system_prompt=system)],
        num_jobs=1000,
    )
    return traffic(net)


@pytest.mark.parametrize("system", [0, 64])
def test_a_cached_context_is_held_but_not_work(system):
    """A handed-over context (and system prompt) is part of the call's prompt, as calls.csv
    counts it, and of the context the server's steps attend to, but not of its work."""
    dec = _disaggregated(system).class_load("s2", "decode")
    assert dec.mean_context == pytest.approx(8001)
    assert dec.mean_cached_prompt == pytest.approx(system + 8001)
    assert dec.mean_prompt == pytest.approx(system + 8001 + 1)
    assert dec.work_per_visit == pytest.approx(1 + 199)
    assert dec.prefill_tokens_per_s == pytest.approx(4.0 * 1)
    # the handed-over context grows pass after pass as a resent one does: 15, then 17
    handed = Call("s1", Constant(1), Constant(1), True, "x", cached=True)
    m = route_moments([call("s1", 10, 5), Loop([handed], times=2)], 3)
    assert m["classes"][("s1", "x")] == {
        "visits": 2.0,
        "context_visits": 0.0,
        "context_sum": 0.0,
        "prompt_new": 2.0,
        "output": 2.0,
        "cached_context_visits": 2.0,
        "cached_context_sum": 15 + 17,
    }


@pytest.mark.parametrize("k_max", [None, 64])
def test_a_cached_context_server_is_timed_with_the_context_it_holds(k_max):
    """The decode server's steps attend to the 8,001 handed-over tokens of every call: its
    capacity is one server's with that prompt, the cached part not work (timed with the
    new token alone, it was 27,140 tokens/s a replica instead of about 3,650)."""
    rate, system = 4.0, 64
    s = _disaggregated(system, rate, k_max).server("s2")
    ref = capacity("profile", 256, system + 8002, 200, k_max=k_max, rate=rate, cached_prompt=system + 8001)
    assert s.mean_prompt == pytest.approx(system + 8002) and s.mean_cached_prompt == pytest.approx(system + 8001)
    assert s.step_time_at_b_max_s == pytest.approx(ref.step_time_at_b_max_s)
    assert s.replica_token_capacity == pytest.approx(ref.token_capacity)
    assert s.utilisation == pytest.approx(ref.utilisation, rel=1e-9)
    assert s.replica_token_capacity < 5_000


def test_idle_server_and_json():
    rep = traffic(network({"A": [call("s1", 10, 2)]}, servers=("s1", "s2")))
    idle = rep.server("s2")
    assert idle.utilisation == 0.0 and math.isinf(idle.max_scale) and idle.mean_prompt is None
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["servers"][1]["max_scale"] is None
    assert [s["name"] for s in d["servers"]] == ["s1", "s2"]


def test_paper_max_variant_note():
    rep = traffic(
        network({"A": [call("s1", 10, 2)]}, servers=("s1",), s1={"cost_model": "paper:c=1,a=1,b0=128,variant=max"})
    )
    assert any("b/t(b) peaks below b_max" in n for n in rep.notes)


# a load-only model whose b / t(b) peaks below b_max (theorem 2's assumption fails): the
# network's capacity follows one server's (`theory.bounds.capacity`)
MAX_VARIANT = "paper:variant=max"  # t(b) = c + a * max(0, b - 128): b / t(b) peaks at b = 128


def _const_mix(prompt: int, output: int) -> LengthMix:
    """The length mix a server's constant-length calls give (`MIX_SAMPLES` draws)."""
    return LengthMix(np.full(MIX_SAMPLES, prompt), np.full(MIX_SAMPLES, output))


def _one_server(cost, b_max, prompt, output, rate, k_max=None):
    kw = {"cost_model": cost, "b_max": b_max, "k_max": k_max}
    return traffic(network({"A": [call("s1", prompt, output)]}, servers=("s1",), rates={"A": rate}, s1=kw))


@pytest.mark.parametrize(
    "cost, b_max, prompt, output, rate, k_max",
    [
        (MAX_VARIANT, 512, 200, 50, 0.3, None),
        (MAX_VARIANT, 512, 200, 50, 0.3, 1000),  # cannot bind
        (MAX_VARIANT, 512, 200, 50, 0.3, 512),  # cannot bind
        ("paper", 300, 200, 101, 9.0, None),  # ceil model: b / t(b) peaks at b = 256
        ("paper", 300, 200, 101, 9.0, 299),  # binds nowhere near the peak's load
        ("paper", 300, 200, 101, 9.0, 1000),
    ],
)
def test_peak_below_b_max_matches_single_server_capacity(cost, b_max, prompt, output, rate, k_max):
    rep = _one_server(cost, b_max, prompt, output, rate, k_max)
    ref = capacity(cost, b_max, prompt, output, k_max=k_max, rate=rate)
    s = rep.server("s1")
    assert ref.peak_token_capacity > ref.token_capacity * 1.01  # the case at hand
    assert s.capacity == pytest.approx(ref.effective_capacity, rel=1e-6)
    assert s.capacity == pytest.approx(ref.peak_token_capacity, rel=1e-6)
    assert s.utilisation == pytest.approx(ref.utilisation, rel=1e-6)
    assert s.binding == ref.binding
    assert rep.critical_rates["A"] == pytest.approx(ref.critical_rate, rel=1e-6)
    # what a policy filling every step to b_max serves: theorem 2's C, over-offered here
    assert s.fill_capacity == pytest.approx(ref.token_capacity, rel=1e-9)
    assert s.fill_utilisation == pytest.approx(rate * ref.work_per_request / ref.token_capacity, rel=1e-9)
    assert s.utilisation < 1 < s.fill_utilisation
    # neither "every policy's backlog grows" (smaller steps serve it) nor "stable under
    # work-conserving policies" (Sarathi fills b_max and is unstable: test_network_sim)
    assert rep.stable is None
    assert "every policy" not in rep.verdict and "stable under work-conserving" not in rep.verdict
    assert "filling every step to b_max" in rep.verdict and "is unstable there" in rep.verdict
    assert f"b = {ref.peak_load} < b_max" in rep.verdict
    if k_max is not None and k_max >= b_max:
        assert s.binding.endswith(f"k_max {k_max} >= b_max cannot bind")


@pytest.mark.parametrize("k_max", [None, 1000])
def test_peak_below_b_max_verdicts_at_either_end(k_max):
    # ceil model, b_max 300: C = 2,549.1 tokens/s (steps filled to 300), peak 3,113.6 (b = 256)
    below = _one_server("paper", 300, 200, 101, 8.0, k_max)  # 2,400 tokens/s offered
    assert below.stable is True and below.verdict.startswith("stable under work-conserving policies")
    # the full steps' capacity is the verdict's (fill_utilisation), not a reason that
    # withdraws it (`_holds_back` gives no FILL reason)
    assert below.not_throughput_optimal == {}
    over = _one_server("paper", 300, 200, 101, 11.0, k_max)  # 3,300 tokens/s: over the peak
    assert over.stable is False and "every policy's backlog grows" in over.verdict
    assert over.max_utilisation == pytest.approx(3300 / over.server("s1").peak_token_capacity, rel=1e-9)


@pytest.mark.parametrize("k_max", [512, 1000])
def test_k_max_at_or_above_b_max_cannot_bind(k_max):
    rate = 10.0
    free = _one_server("paper", 512, 200, 101, rate).server("s1")
    capped = _one_server("paper", 512, 200, 101, rate, k_max).server("s1")
    assert capped.capacity == free.capacity == pytest.approx(C512)
    assert capped.utilisation == free.utilisation and capped.region_exact is None
    assert capped.binding == f"token budget (theorem 2); k_max {k_max} >= b_max cannot bind"
    # a context-dependent model: as one server's capacity, not the region's 2-D answer
    prof = _one_server("profile", 512, 1000, 200, 2.0, k_max).server("s1")
    ref = capacity("profile", 512, 1000, 200, k_max=k_max, rate=2.0, mix=_const_mix(1000, 200))
    assert prof.capacity == pytest.approx(ref.effective_capacity, rel=1e-9)
    assert prof.fill_capacity == prof.capacity and prof.binding == ref.binding


def test_normal_models_fill_capacity_is_capacity():
    s = _one_server("paper", 512, 200, 101, 1.5, 16).server("s1")  # a binding cap
    assert s.fill_capacity == s.capacity and s.fill_utilisation == s.utilisation


def test_idle_server_with_peak_below_b_max():
    rep = traffic(
        network({"A": [call("s1", 10, 2)]}, servers=("s1", "s2"), s2={"cost_model": MAX_VARIANT, "k_max": 64})
    )
    idle = rep.server("s2")
    peak = capacity(MAX_VARIANT, 512, 200, 50).peak_token_capacity
    assert idle.capacity == pytest.approx(peak) and idle.peak_load == 128
    assert idle.fill_capacity == pytest.approx(idle.token_capacity) and idle.utilisation == 0.0
    assert idle.binding.startswith("token budget at b = 128 < b_max")


# ------------------------------------------------------------------------- stability verdicts
def test_rybko_stolyar_is_cyclic():
    rep = traffic(EXAMPLES / "rybko_stolyar.yaml")
    assert rep.max_utilisation < 1 and not rep.feedforward
    assert rep.stable is None and set(rep.cycle) == {"s1", "s2"} and rep.cycle[0] == rep.cycle[-1]
    assert "Rybko-Stolyar" in rep.verdict
    # each server: a short call of one type and a long call of the other
    assert offered(rep, "s1") == pytest.approx(3.6 * ((64 + 32 - 1) + (512 + 128 - 1)))
    long_load = 2 * 3.6 * (512 + 128 - 1) / C512
    assert long_load > 1 > rep.max_utilisation  # the virtual station is overloaded


def test_cycle_detection():
    # a loop at one server is not a cycle through servers; a loop across two is
    assert traffic(network({"A": [Loop([call("s1", 5, 5)], repeat_prob=0.5), call("s2", 1, 1)]})).feedforward
    assert not traffic(network({"A": [Loop([call("s1", 5, 5), call("s2", 1, 1)], times=2)]})).feedforward
    assert traffic(network({"A": [Loop([call("s1", 5, 5), call("s2", 1, 1)], times=1)]})).feedforward
    # s1 -> (s2 | a branch without calls) -> s1
    assert not traffic(
        network({"A": [call("s1", 5, 5), Fork([[call("s2", 1, 1)], [Delay(DelayLaw("const", 1))]]), call("s1", 1, 1)]})
    ).feedforward
    assert traffic(
        network({"A": [call("s1", 5, 5), Fork([[call("s2", 1, 1)], [Delay(DelayLaw("const", 1))]]), call("s3", 1, 1)]})
    ).feedforward
    overloaded = traffic(network({"A": [call("s1", 100, 10)]}, servers=("s1",), rates={"A": 100.0}))
    assert overloaded.stable is False and overloaded.verdict.startswith("unstable")


def test_cycle_is_made_of_moves_jobs_make():
    """A fork with a branch of delays only: the call after the join follows the other
    branch's call, not the call before the fork. The report named the cycle s1 -> s2 -> s1,
    a move from s1 to s2 that no job makes (the real one runs through s3)."""
    tool = [Delay(DelayLaw("const", 1))]
    rep = traffic(
        network(
            {
                "A": [call("s1", 5, 5), Fork([[call("s3", 1, 1)], tool]), call("s2", 1, 1)],
                "B": [call("s2", 1, 1), call("s1", 1, 1)],
            }
        )
    )
    assert rep.cycle == ["s1", "s3", "s2", "s1"]


@pytest.mark.parametrize("name", ["tandem", "agent_dag", "fork_join", "rybko_stolyar", "cluster"])
def test_shipped_examples_report(name):
    rep = network_capacity_report(EXAMPLES / f"{name}.yaml")
    json.dumps(rep, allow_nan=False)
    assert rep["source"].endswith(f"{name}.yaml")
    assert 0 < rep["max_utilisation"] < 1
    rows = network_server_rows(rep)
    assert len(rows) == 1 + len(rep["servers"]) and len({len(r) for r in rows}) == 1
    assert all(isinstance(c, str) for r in rows for c in r)
    kv = network_capacity_rows(rep)
    assert kv[1][0] == "verdict" and all(len(r) == 2 for r in kv)
    assert traffic(EXAMPLES / f"{name}.yaml").rows() == [tuple(r) for r in rows]


def test_fill_capacity_is_one_servers_rule_where_the_region_beats_c():
    """H200 profile, b_max 512, means 1000/200, k_max 256: the region's step shapes beat
    the one step C / w times. The best policy's capacity exceeded C then (one server's
    threshold took min(effective, C), the network's the region's capacity); lambda* is never
    above C / w for a context-dependent model now (it fell as k_max grew past b_max), the
    region's rate is `shape_bound_rate`, and both take `CapacityReport.fill_capacity`."""
    ref = capacity("profile", 512, 1000, 200, k_max=256, rate=1.0, peak=False, mix=_const_mix(1000, 200))
    assert ref.shape_bound_rate * ref.work_per_request > ref.token_capacity * 1.002
    assert ref.effective_capacity == ref.fill_capacity == ref.token_capacity
    s = _one_server("profile", 512, 1000, 200, 1.0, 256).server("s1")
    assert s.capacity == pytest.approx(ref.effective_capacity, rel=1e-9)
    assert s.fill_capacity == pytest.approx(ref.fill_capacity, rel=1e-9) == s.capacity
    assert s.fill_utilisation == pytest.approx(s.offered_tokens_per_s / ref.token_capacity, rel=1e-9)


def test_a_load_only_server_scans_its_loads_once(monkeypatch):
    """The network took the peak from `peak_token_capacity` and `capacity` scanned again."""
    from llmsched.theory import bounds

    calls = []
    real = bounds._load_peak
    monkeypatch.setattr(bounds, "_load_peak", lambda cost, b_max: calls.append(b_max) or real(cost, b_max))
    s = _one_server(MAX_VARIANT, 512, 200, 50, 0.3).server("s1")
    assert calls == [512] and s.peak_load == 128
    calls.clear()
    idle = traffic(network({"A": [call("s1", 10, 2)]}, servers=("s1", "s2"), s2={"cost_model": MAX_VARIANT})).server(
        "s2"
    )
    assert idle.peak_load == 128 and idle.binding.startswith("token budget at b = 128 < b_max")
    assert calls == [512, 512]  # once for each server (s1 serves the paper model)


def test_the_fill_verdict_says_why_other_steps_serve_more():
    """Filling b_max falls short of the best policy where a load-only model's b / t(b)
    peaks below b_max, cap or no cap; the verdict gives the report's reason (it used to
    name the peak's load, None for the region)."""
    for k_max in (None, 300):
        s = _one_server(MAX_VARIANT, 512, 200, 50, 0.1, k_max).server("s1")
        assert s.fill_capacity < s.capacity
        rate = 1.001 * s.fill_capacity / s.offered_tokens_per_s * 0.1
        v = _one_server(MAX_VARIANT, 512, 200, 50, rate, k_max)
        assert v.stable is None and "smaller steps (t(b)/b is least at b = 128 < b_max)" in v.verdict
        assert "None" not in v.verdict
    # a profile's region beating C under a cap no longer raises the capacity above C
    prof = _one_server("profile", 512, 1000, 200, 1.0, 300).server("s1")
    assert prof.fill_capacity == prof.capacity


@pytest.mark.parametrize(
    "server, why",
    [
        ({"admission": "twp"}, "twp admission"),  # its window paces admission
        ({"admission": "dynamicbatch"}, "dynamicbatch admission"),  # its cap on the running requests
        ({"max_running": 4}, "max_running 4"),
        ({"policy": "ft", "admission": "TWP", "max_running": 2}, "fastertransformer, twp admission, max_running 2"),
    ],
)
def test_an_admission_that_can_idle_the_budget_gets_no_guarantee(server, why):
    """The feed-forward guarantee judged the batch policy alone: a Sarathi server behind
    TWP's window, DynamicBatch's cap or a running cap was called stable."""
    routes = {"A": [call("s1", 100, 10), call("s2", 50, 20)]}
    rep = traffic(network(routes, servers=("s1", "s2"), s1=server))
    assert rep.max_utilisation < 1 and rep.feedforward
    assert rep.stable is None and rep.not_throughput_optimal == {"s1": why}
    held = ", ".join(r for r in why.split(", ") if r != "fastertransformer")
    assert f"server s1 ({held}) holds work back (an admission, a running cap" in rep.verdict
    if why.startswith("fastertransformer"):
        assert "server s1 (fastertransformer) runs a policy that is not work-conserving" in rep.verdict
    else:  # the batch policy (sarathi) is work-conserving: not named as if it were not
        assert "runs a policy that is not work-conserving" not in rep.verdict
    assert "the guarantee does not apply" in rep.verdict
    # an admission that only orders the queue keeps the guarantee
    for order in ("fcfs", "spf"):
        ok = traffic(network(routes, servers=("s1", "s2"), s1={"admission": order}))
        assert ok.stable is True and ok.not_throughput_optimal == {}


def test_a_kv_capacity_gets_no_feed_forward_guarantee():
    """A finite kv_capacity only added a note: one Sarathi server at 48% of its capacity,
    kv_capacity 8000, was called stable, yet served 0.187 jobs/s of 1.1 (docs/networks.md)."""
    routes = {"A": [call("s1", 1000, 500)]}
    rep = traffic(network(routes, servers=("s1", "s2"), rates={"A": 1.1}, s1={"kv_capacity": 8000}))
    assert rep.max_utilisation < 1 and rep.feedforward
    assert rep.stable is None and rep.not_throughput_optimal == {"s1": "kv_capacity 8000"}
    assert "server s1 (kv_capacity 8000) holds work back" in rep.verdict and "s2" not in rep.verdict
    assert network_capacity_report(network(routes, s1={"kv_capacity": 8000}))["stable"] is None
    # a server without calls is not judged, whatever its cache
    ok = traffic(network(routes, servers=("s1", "s2"), rates={"A": 1.1}, s2={"kv_capacity": 8000}))
    assert ok.stable is True and ok.not_throughput_optimal == {}


def test_back_pressure_gets_no_feed_forward_guarantee():
    routes = {"A": [call("s1", 100, 10), call("s2", 50, 20)]}
    spec = network(routes, servers=("s1", "s2", "s3"))  # s3 gets no calls
    assert traffic(spec).stable is True
    spec.control = "backpressure"
    rep = traffic(spec)
    assert rep.stable is None
    assert rep.not_throughput_optimal == {"s1": "backpressure control", "s2": "backpressure control"}


def test_the_feed_forward_guarantee_names_servers_that_are_not_throughput_optimal():
    routes = {"A": [call("s1", 100, 10), call("s2", 50, 20)]}
    policies = {"s1": {"policy": "sarathi"}, "s2": {"policy": "FT"}, "s3": {"policy": "vllm"}}  # s3 gets no calls
    rep = traffic(network(routes, **policies))
    assert rep.max_utilisation < 1 and rep.feedforward
    assert rep.stable is None and rep.not_throughput_optimal == {"s2": "fastertransformer"}
    assert "server s2 (fastertransformer) runs a policy that is not work-conserving" in rep.verdict
    assert "the guarantee does not apply" in rep.verdict and "s3" not in rep.verdict
    both = traffic(network(routes, s1={"policy": "vllm"}, s2={"policy": "ft"}))
    assert both.stable is None and both.not_throughput_optimal == {"s1": "vllm", "s2": "fastertransformer"}
    assert "servers s1 (vllm), s2 (fastertransformer) run policies that are not work-conserving" in both.verdict
    # adaptive is not work-conserving but stable inside the region (max-weight)
    for wc in ("orca", "kfcfs", "sarathi-serve", "adaptive:cost=paper"):
        ok = traffic(network(routes, s1={"policy": wc}, s2={"policy": wc}, s3={"policy": "vllm"}))
        assert ok.stable is True and ok.not_throughput_optimal == {} and ok.verdict.startswith("stable under")
    # over capacity every policy is unstable, work-conserving or not
    over = traffic(network(routes, rates={"A": 100.0}, **policies))
    assert over.stable is False and over.not_throughput_optimal == {"s2": "fastertransformer"}
    assert network_capacity_report(network(routes, **policies))["not_throughput_optimal"] == {"s2": "fastertransformer"}


def test_every_kind_of_reason_is_named():
    """`_named_policies` had no FILL group: a reason of that kind raised KeyError."""
    from llmsched.core.guarantee import CAP, FILL, HELD, POLICY, HoldReason
    from llmsched.theory.network import _named_policies

    fill = HoldReason(FILL, "b / t(b) peaks at b = 512 < b_max 600")
    assert _named_policies({"s1": [fill]}) == (
        "server s1 (b / t(b) peaks at b = 512 < b_max 600) fills every step to b_max, which serves less than "
        "smaller steps: a policy doing so is stable only below its full steps' capacity"
    )
    why = {
        "a": [HoldReason(POLICY, "fastertransformer")],
        "b": [HoldReason(HELD, "twp admission"), fill],
        "c": [HoldReason(CAP, "k_max 16 < b_max 512")],
    }
    text = _named_policies(why)
    assert "server a (fastertransformer) runs a policy" in text and "server b (twp admission) holds" in text
    assert "server c (k_max 16 < b_max 512) caps" in text and "server b (b / t(b) peaks" in text
