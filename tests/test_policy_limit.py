"""A policy's own limit where full steps of b_max serve less than lambda*'s steps (b / t(b)
peaks below b_max): `capacity` and `simulate` said `throughput_optimal: true`, "inside: yes"
and a fluid growth of 0 for Sarathi at rates where it is unstable (docs/stability.md,
"Work and capacity")."""

import json

import pytest

import llmsched
from llmsched.analysis.points import critical_rate_of, policy_critical_rate_of, resolve_point
from llmsched.cli import main
from llmsched.core.guarantee import CAP, FILL, POLICY, HoldReason
from llmsched.policies import batch_holds_back, is_throughput_optimal, policy_capacity
from llmsched.theory import capacity

# paper model, b_max 600 (not a multiple of b0 = 128): t(600) = 11.28 + 5 * 35.47 ms, while
# b / t(b) peaks at b = 512 (t(512) = 153.16 ms); work 200 + 101 - 1 = 300 tokens
T600, T512, WORK = 0.18863, 0.15316, 300
B600 = ["--cost-model", "paper", "--b-max", "600", "--mean-prompt", "200", "--mean-output", "101"]


def run_json(capsys, *argv):
    assert main(["capacity", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def table(capsys, monkeypatch, *argv) -> str:
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["capacity", *argv]) == 0
    return "\n".join(" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize(
    "policy, b_max, k_max, peak, why",
    [
        ("sarathi", 600, None, 512, [(FILL, "b / t(b) peaks at b = 512 < b_max 600")]),
        ("orca", 600, 600, 512, [(FILL, "b / t(b) peaks at b = 512 < b_max 600")]),  # a cap that cannot bind
        ("sarathi", 600, 16, 512, [(CAP, "k_max 16 < b_max 600")]),
        ("sarathi", 512, None, 512, []),  # the peak at b_max: theorem 2 holds
        ("adaptive", 600, None, 512, []),  # it runs lambda*'s steps
        ("vllm", 600, None, 512, [(POLICY, "vllm")]),
    ],
)
def test_a_peak_below_b_max_takes_the_guarantee_of_a_policy_filling_every_step(policy, b_max, k_max, peak, why):
    assert batch_holds_back(policy, b_max, k_max, peak) == [HoldReason(k, t) for k, t in why]
    assert is_throughput_optimal(policy, b_max, k_max, peak) is (not why)


def test_policy_capacity_is_the_fill_capacity_of_a_work_conserving_policy():
    assert policy_capacity("sarathi", 600, None, best=3342.9, fill=3180.8) == 3180.8
    assert policy_capacity("adaptive", 600, None, best=3342.9, fill=3180.8) == 3342.9
    assert policy_capacity("sarathi", 600, 16, best=1000.0, fill=1000.0) is None  # a binding cap
    assert policy_capacity("fastertransformer", 600, None, best=3342.9, fill=3180.8) is None
    assert policy_capacity("sarathi", 600, None, 3342.9, 3180.8, held=True) is None  # e.g. twp admission


def test_capacity_reports_sarathi_below_its_own_limit_not_lambda_star(capsys, monkeypatch):
    """b_max 600: Sarathi fills every step to 600 tokens, 3,180.8 tokens/s = 10.603 req/s,
    while lambda* = 11.143 runs 512-token steps; at 11 req/s `simulate` finds Sarathi
    unstable (174 tokens/s on 8,000 requests) and adaptive stable."""
    r = run_json(capsys, *B600, "--rate", "11", "--policy", "sarathi")
    c = r["capacity"]
    assert c["critical_rate"] == pytest.approx(512 / T512 / WORK)  # lambda* itself unchanged
    assert r["inside"] is True  # the region holds the rate: some policy serves it
    assert r["throughput_optimal"] is False and r["not_throughput_optimal"] == "b / t(b) peaks at b = 512 < b_max 600"
    assert r["not_throughput_optimal_kinds"] == ["fill"]
    assert r["policy_critical_rate"] == pytest.approx(600 / T600 / WORK)
    assert r["policy_inside"] is False and r["policy_utilisation"] == pytest.approx(11 * WORK * T600 / 600)
    assert r["policy_predicted_growth_tokens_per_s"] == pytest.approx(11 * WORK - 600 / T600)
    assert c["predicted_growth_tokens_per_s"] == 0.0  # at lambda*'s steps (adaptive's)
    out = table(capsys, monkeypatch, *B600, "--rate", "11", "--policy", "sarathi")
    assert "sarathi fills every step to b_max 600, but b / t(b) peaks at b = 512" in out
    assert "not a guarantee for sarathi: NOT below its own limit 10.603 req/s (103.7%)" in out
    assert "fluid backlog growth (sarathi: full steps of b_max) 119.2 tokens/s" in out
    ok = run_json(capsys, *B600, "--rate", "11", "--policy", "adaptive")
    assert ok["throughput_optimal"] is True and ok["policy_inside"] is True
    assert ok["not_throughput_optimal_kinds"] == []
    assert ok["policy_critical_rate"] == pytest.approx(c["critical_rate"])
    ft = run_json(capsys, *B600, "--rate", "11", "--policy", "ft")
    assert ft["policy_critical_rate"] is None and ft["policy_inside"] is None
    # b_max a multiple of b0: full steps are the best; Sarathi keeps theorem 2's guarantee
    full = run_json(capsys, "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101", "--rate", "11")
    assert full["throughput_optimal"] is True
    assert full["policy_critical_rate"] == pytest.approx(full["capacity"]["critical_rate"])


def test_simulate_predicts_the_growth_of_its_own_policy():
    """paper:variant=max, const 200/50, 1 req/s: 2.2% of lambda* (steps of b = 128), but
    Sarathi fills every step to 512 and serves 0.151 req/s; the run predicted a growth of 0
    and its backlog grew by over 200 tokens/s."""
    s = llmsched.simulate(
        cost_model="paper:variant=max",
        prompt="const:200",
        output="const:50",
        b_max=512,
        rate=1.0,
        num_requests=600,
        policy="sarathi",
    ).summary
    assert s["utilisation"] < 0.05  # of lambda*, the best policy's
    assert s["policy_critical_rate"] == pytest.approx(s["token_capacity"] / 249)
    assert s["policy_utilisation"] > 5
    assert s["predicted_backlog_growth_tokens_per_s"] > 150 and s["verdict"] == "unstable"
    # behind a running cap no theorem gives the policy's limit
    capped = llmsched.simulate(
        cost_model="paper:variant=max", prompt="const:200", output="const:50", b_max=512, rate=1.0,
        num_requests=600, policy="sarathi", max_running=4,
    ).summary  # fmt: skip
    assert capped["policy_critical_rate"] is None and capped["policy_utilisation"] is None


def test_the_verdicts_threshold_scales_with_the_policys_own_limit():
    """paper:variant=max, const 200/50, b_max 512: adaptive runs lambda*'s steps of 128
    tokens (11,348 tokens/s), but the threshold was 2% of full steps' 37.6 tokens/s (0.75
    tokens/s), so a stable run at 0.9 lambda* was 'inconclusive: too short'. Sarathi, whose
    limit is the full steps', keeps its threshold."""
    kw = dict(cost_model="paper:variant=max", prompt="const:200", output="const:50", b_max=512, num_requests=4000)
    s = llmsched.simulate(**kw, rate=41.0, policy="adaptive").summary
    assert s["policy_critical_rate"] == pytest.approx(s["critical_rate"])
    assert s["verdict_threshold_tokens_per_s"] == pytest.approx(0.02 * s["critical_rate"] * 249)
    assert s["verdict"] == "stable"
    s = llmsched.simulate(**kw, rate=0.13, policy="sarathi").summary
    assert s["verdict_threshold_tokens_per_s"] == pytest.approx(0.02 * s["token_capacity"])
    assert s["verdict"] == "stable"


def cluster(policy: str, rate: float, control: str = "none"):
    kw = dict(cost_model="paper:variant=max", prompt="const:200", output="const:50", b_max=512, num_requests=2000)
    spec = llmsched.cluster_network(replicas=2, rate=rate, policy=policy, **kw)
    spec.control = control
    res = llmsched.simulate_network(spec)
    return res, res.summary["servers"]["cluster"], res.traffic.server("cluster")


@pytest.mark.parametrize("control", ["none", "backpressure"])
@pytest.mark.parametrize("scale, verdict", [(0.9, "stable"), (1.1, "unstable")])
def test_a_clusters_thresholds_scale_with_the_policys_own_limit(scale, verdict, control):
    """The network's rule, as one server's: adaptive's cluster at 0.9 lambda* was judged
    'inconclusive: run longer' against 2% of full steps' 75 tokens/s (1.5) while serving
    20,418 tokens/s; now its replicas, pool and the network's work take 2% of lambda*'s
    steps (454 the pool's, 227 a replica's); above lambda* still unstable. Under
    back-pressure too (until 2026-12-04 it kept 1.5 there: 'inconclusive: run longer' at
    0.9), where the replicas' backlogs leave the buffer out (their verdicts, at 1.1,
    inconclusive) and the pool, buffer counted, decides."""
    lam = 2 * capacity("paper:variant=max", 512, 200, 50).critical_rate
    res, srv, load = cluster("adaptive", scale * lam, control)
    assert load.capacity > 100 * load.fill_capacity  # (b / t(b) peaks far below b_max)
    assert srv["pool_verdict"]["threshold_tokens_per_s"] == pytest.approx(0.02 * load.capacity)
    for r in res.replicas():
        assert r.stability["verdict_threshold_tokens_per_s"] == pytest.approx(0.01 * load.capacity)
        assert r.stability["verdict"] == verdict or control == "backpressure" and verdict == "unstable"
    assert res.summary["network_work_verdict"]["threshold_tokens_per_s"] == pytest.approx(0.02 * load.capacity)
    assert srv["verdict"] == srv["pool_verdict"]["verdict"] == verdict
    assert res.summary["network_work_verdict"]["verdict"] == verdict


def test_a_sarathi_clusters_thresholds_keep_full_steps():
    res, srv, load = cluster("sarathi", 0.26)
    assert srv["pool_verdict"]["threshold_tokens_per_s"] == 0.02 * load.fill_capacity
    for r in res.replicas():
        assert r.stability["verdict_threshold_tokens_per_s"] == pytest.approx(0.01 * load.fill_capacity, rel=1e-12)
    assert res.summary["network_work_verdict"]["threshold_tokens_per_s"] == 0.02 * load.fill_capacity
    assert srv["verdict"] == "stable"


def test_a_search_reports_the_policy_limit_of_its_group():
    fixed = {"cost_model": "paper", "b_max": 600, "prompt": "const:200", "output": "const:101", "num_requests": 100}
    sarathi = resolve_point(None, fixed, {"policy": "sarathi"})
    assert critical_rate_of(sarathi) == pytest.approx(512 / T512 / WORK)
    assert policy_critical_rate_of(sarathi) == pytest.approx(600 / T600 / WORK)
    assert policy_critical_rate_of(resolve_point(None, fixed, {"policy": "adaptive"})) == pytest.approx(
        512 / T512 / WORK
    )
    assert policy_critical_rate_of(resolve_point(None, fixed, {"policy": "vllm"})) is None
    assert policy_critical_rate_of(resolve_point(None, {**fixed, "max_running": 4}, {"policy": "sarathi"})) is None


def test_a_finite_kv_capacity_makes_the_policys_limit_unknown():
    """prompts 200, outputs 101, b_max 512, kv_capacity 2000 (six requests' KV): Sarathi's
    full-step limit is 11.14 req/s, but at 6 req/s the KV cache binds, preemptions redo
    work and the run is unstable (+1,400 tokens/s): the summary said policy_critical_rate
    11.14 and a predicted growth of 0."""
    opts = {"cost_model": "paper", "prompt": "const:200", "output": "const:101", "b_max": 512, "policy": "sarathi"}
    s = llmsched.simulate(**opts, rate=6.0, num_requests=3000, kv_capacity=2000).summary
    assert s["verdict"] == "unstable" and s["preemptions"] > 0
    assert s["policy_critical_rate"] is None and s["policy_utilisation"] is None
    # the growth falls back to lambda*'s steps (a lower bound on the policy's)
    assert s["predicted_backlog_growth_tokens_per_s"] == 0.0
    # a search's groups take the same rule
    fixed = {**opts, "num_requests": 100}
    assert policy_critical_rate_of(resolve_point(None, {**fixed, "kv_capacity": 2000})) is None
    assert policy_critical_rate_of(resolve_point(None, fixed)) == pytest.approx(512 / T512 / WORK)


def test_the_python_capacity_keeps_lambda_star_the_best_policys():
    r = capacity("paper", 600, 200, 101, rate=11)
    assert r.critical_rate == pytest.approx(512 / T512 / WORK) and r.fill_capacity == pytest.approx(600 / T600)
    assert r.peak_load == 512
