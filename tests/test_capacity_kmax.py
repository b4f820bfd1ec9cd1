"""A batch-size cap below b_max: no stability guarantee for work-conserving policies
(paper 1), a request's prefill per step capped at the longest prompt in the region, and
runs judged by the requests in the system too (docs/stability.md)."""

import json

import numpy as np
import pytest

from llmsched import simulate
from llmsched.api import REQUESTS_GROWTH_SHARE
from llmsched.cli import main
from llmsched.core.guarantee import CAP, HELD, POLICY, HoldReason, reasons_text
from llmsched.policies import admission_holds_back, batch_holds_back, is_throughput_optimal
from llmsched.theory import capacity, describe_verdict
from llmsched.theory.means import largest_prompt
from llmsched.theory.network import traffic
from llmsched.workload.lengths import parse_length_law

T128 = 0.01128 + 0.03547  # t(128) of the paper model: the fastest step, 46.75 ms
KMAX = ["--cost-model", "paper", "--b-max", "512", "--k-max", "16"]
# paper 1's counterexample (`capacity --find-counterexample`): inside the k_max 16 region
# by 17.7%, Sarathi unstable
COUNTER = [*KMAX, "--mean-prompt", "1024", "--mean-output", "128", "--rate", "2.05"]


def run_json(capsys, *argv):
    assert main(["capacity", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def table(capsys, monkeypatch):
    """The text table of `capacity ARGV`, one line a row (a terminal wide enough not to wrap)."""
    monkeypatch.setenv("COLUMNS", "1000")

    def run(*argv) -> str:
        assert main(["capacity", *argv]) == 0
        return "\n".join(" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines())

    return run


@pytest.mark.parametrize(
    "policy, b_max, k_max, why",
    [
        ("sarathi", 512, 16, [(CAP, "k_max 16 < b_max 512")]),
        ("Orca", 512, 511, [(CAP, "k_max 511 < b_max 512")]),
        ("kfcfs", 512, 16, [(CAP, "k_max 16 < b_max 512")]),
        ("sarathi", 512, 512, []),  # a cap of b_max requests cannot bind
        ("sarathi", 512, None, []),
        ("adaptive", 512, 16, []),  # it picks its steps from the region
        ("ft", 512, 16, [(POLICY, "fastertransformer")]),  # not work-conserving, cap or not
        ("vllm", 512, None, [(POLICY, "vllm")]),
        ("no-such-policy", 512, None, [(POLICY, "no-such-policy")]),
    ],
)
def test_a_binding_cap_takes_the_guarantee_of_work_conserving_policies(policy, b_max, k_max, why):
    reasons = batch_holds_back(policy, b_max, k_max)
    assert reasons == [HoldReason(kind, text) for kind, text in why]
    assert [str(r) for r in reasons] == [text for _, text in why]
    assert is_throughput_optimal(policy, b_max, k_max) is (not why)


def test_an_admission_that_limits_steps_or_a_running_cap_holds_work_back():
    assert admission_holds_back("fcfs") == [] and admission_holds_back("spf") == []
    assert admission_holds_back("twp", 4) == [HoldReason(HELD, "twp admission"), HoldReason(HELD, "max_running 4")]
    assert reasons_text(admission_holds_back("DynamicBatch")) == "dynamicbatch admission"


def test_capacity_promises_no_work_conserving_policy_stability_under_a_binding_cap(capsys, table):
    """capacity said throughput_optimal true, 'inside ... yes' and a work-conserving fluid
    growth of 0 where `simulate` finds Sarathi unstable (444 tokens/s)."""
    r = run_json(capsys, *COUNTER, "--policy", "sarathi")
    assert r["inside"] is True and r["scale"] == pytest.approx(1.177, abs=1e-3)
    assert r["throughput_optimal"] is False and r["not_throughput_optimal"] == "k_max 16 < b_max 512"
    out = table(*COUNTER, "--policy", "sarathi")
    assert "k_max 16 < b_max 512: a policy filling every step (sarathi) can be unstable inside the region" in out
    assert "not a guarantee for sarathi" in out
    assert "(work-conserving)" not in out and "fluid backlog growth (at lambda*'s steps)" in out
    # adaptive keeps the guarantee where the region is exact (prompts of 113 tokens, one
    # chunk of the (113, 15) vertex each), not where it is only an upper bound (given
    # means: no prompt length known; it said true there too); without a cap that binds,
    # sarathi keeps it
    exact = [*KMAX, "--prompt", "const:113", "--output", "const:128", "--policy", "adaptive"]
    ok = run_json(capsys, *exact)
    assert ok["throughput_optimal"] is True and ok["not_throughput_optimal"] is None
    bound = run_json(capsys, *COUNTER, "--policy", "adaptive")
    assert bound["capacity"]["region_exact"] is False and bound["throughput_optimal"] is False
    assert bound["not_throughput_optimal"] == "the region is an upper bound (region_exact false)"
    assert "adaptive picks its steps from the region, but the region is an upper bound" in table(
        *COUNTER, "--policy", "adaptive"
    )
    free = [*KMAX[:5], "512", *COUNTER[6:]]
    r = run_json(capsys, *free, "--policy", "sarathi")
    assert r["throughput_optimal"] is True and r["not_throughput_optimal"] is None
    assert "fluid backlog growth (work-conserving)" in table(*free, "--policy", "sarathi")
    # a policy that is not work-conserving keeps its own reason
    out = table(*COUNTER, "--policy", "ft")
    assert "fastertransformer is not work-conserving" in out


def _kmax_network(policy: str, k_max: int = 16) -> dict:
    return {
        "servers": {"s1": {"policy": policy, "b_max": 512, "k_max": k_max, "cost_model": "paper"}},
        "jobs": {
            "req": {
                "arrival": {"process": "poisson", "rate": 2.05},
                "route": [{"call": {"server": "s1", "prompt": "const:1024", "output": "const:128"}}],
            }
        },
        "num_jobs": 600,
    }


def test_the_network_verdict_promises_nothing_for_a_server_with_a_binding_cap():
    """`capacity --network` said 'stable under work-conserving policies' of the counterexample
    as a one-server network, which `simulate --network` finds unstable."""
    rep = traffic(_kmax_network("sarathi"))
    assert rep.max_utilisation < 1 and rep.feedforward
    assert rep.stable is None and rep.not_throughput_optimal == {"s1": "k_max 16 < b_max 512"}
    assert "server s1 (k_max 16 < b_max 512) caps the requests per step below the token budget" in rep.verdict
    assert "the guarantee does not apply" in rep.verdict and "not work-conserving" not in rep.verdict
    ok = traffic(_kmax_network("adaptive"))
    assert ok.stable is True and ok.not_throughput_optimal == {}
    assert traffic(_kmax_network("sarathi", k_max=512)).stable is True
    # a server that is not work-conserving and one with a binding cap: both named, each for its reason
    net = _kmax_network("sarathi")
    net["servers"]["s2"] = {"policy": "vllm", "b_max": 512, "cost_model": "paper"}
    net["jobs"]["req"]["route"].append({"call": {"server": "s2", "prompt": "const:100", "output": "const:10"}})
    both = traffic(net)
    assert both.not_throughput_optimal == {"s1": "k_max 16 < b_max 512", "s2": "vllm"}
    assert "server s2 (vllm) runs a policy that is not work-conserving" in both.verdict
    assert "server s1 (k_max 16 < b_max 512) caps the requests per step" in both.verdict
    # a cap and a pacing admission: the cap's server also leaves budget idle
    paced = _kmax_network("sarathi")
    paced["servers"]["s1"]["admission"] = "twp"
    rep = traffic(paced)
    assert rep.not_throughput_optimal == {"s1": "k_max 16 < b_max 512, twp admission"}
    assert "server s1 (twp admission) holds work back" in rep.verdict
    assert "server s1 (k_max 16 < b_max 512) caps the requests per step" in rep.verdict
    assert "not work-conserving" not in rep.verdict  # its policy, sarathi, is
    # a policy no registry knows (the API takes any name; the CLI refuses it) has no guarantee
    # as a batch policy, not as something that holds work back
    unknown = traffic(_kmax_network("no-such-policy", k_max=512))
    assert unknown.not_throughput_optimal == {"s1": "no-such-policy"}
    assert "server s1 (no-such-policy) runs a policy that is not work-conserving" in unknown.verdict
    assert "holds work back" not in unknown.verdict


# ----------------------------------------------------------------- prefill per request


def test_lambda_star_with_a_cap_is_no_more_than_what_the_slots_can_finish(capsys, table):
    """k_max 2, prompts of 100, outputs of 2 tokens: each request is in at least 2 steps
    (its prefill and one decode), each step holds 2 requests and takes at least t(128), so
    no policy finishes more than 2 / (2 t(128)) = 21.39 req/s; lambda* said 23.935 (its
    vertex (127, 1) takes 127 prefill tokens from one request)."""
    bound = 2 / (2 * T128)
    given = ["--cost-model", "paper", "--b-max", "512", "--k-max", "2", "--output", "const:2"]
    r = run_json(capsys, *given, "--prompt", "const:100")
    assert r["largest_prompt"] == 100
    assert r["capacity"]["critical_rate"] == pytest.approx(bound)
    assert r["region"]["max_prefill_per_request"] == 100
    shapes = {(v["prefill_tokens"], v["decode_tokens"]) for v in r["region"]["vertices"]}
    assert (100, 1) in shapes and max(x for x, y in shapes if y > 0) == 100
    # the same lambda* in the theory's own call, and in a run's
    assert capacity("paper", 512, 100, 2, k_max=2, max_prefill_per_request=100).critical_rate == pytest.approx(bound)
    res = simulate(
        cost_model="paper", b_max=512, k_max=2, prompt="const:100", output="const:2", rate=5, num_requests=300
    )
    assert res.summary["critical_rate"] == pytest.approx(bound)
    # given means have no longest prompt: lambda* assumes any number, and says so
    m = run_json(
        capsys, "--cost-model", "paper", "--b-max", "512", "--k-max", "2", "--mean-prompt", "100", "--mean-output", "2"
    )
    assert m["largest_prompt"] is None and m["capacity"]["critical_rate"] > bound * 1.1
    out = table("--cost-model", "paper", "--b-max", "512", "--k-max", "2", "--mean-prompt", "100", "--mean-output", "2")
    assert "region: prefill per request in a step any number (no longest prompt known: --mean-prompt" in out
    # long prompts change nothing; nor does a cap that cannot bind report the longest prompt
    long = run_json(capsys, *KMAX, "--prompt", "const:1024", "--output", "const:128")
    assert long["largest_prompt"] == 1024
    assert long["capacity"]["critical_rate"] == pytest.approx(capacity("paper", 512, 1024, 128, k_max=16).critical_rate)
    assert "largest_prompt" not in run_json(capsys, "--cost-model", "paper", "--prompt", "const:100", "--output", "2")


def test_the_longest_prompt_of_a_workload(tmp_path):
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens\n30,4\n250,7\n90,1\n")
    assert parse_length_law(f"empirical:{lengths}:prompt_tokens").largest() == 250
    assert parse_length_law("uniform:3,77").largest() == 77
    assert parse_length_law("geometric:mean=20,max=300").largest() == 300
    assert parse_length_law("geometric:20").largest() is None
    assert parse_length_law("lognormal:mean=50,sigma=1").largest() is None
    assert parse_length_law("lognormal:mean=50,sigma=1,max=400").largest() == 400
    base = {"prompt": "const:100", "output": "const:5"}
    assert largest_prompt(base) == 100
    assert largest_prompt({**base, "system_prompt": 12}) == 112
    assert largest_prompt({**base, "prompt": "geometric:100"}) is None
    assert largest_prompt({**base, "prompt": f"empirical:{lengths}", "output": f"empirical:{lengths}"}) == 250
    # a class's own law and system prompt
    classes = [{"tag": "a", "prompt": "const:300"}, {"tag": "b", "system_prompt": 250}]
    assert largest_prompt({**base, "classes": classes}) == 350
    # a conversation's third turn: three turns' text and the first two outputs
    assert largest_prompt({**base, "turns": "uniform:1,3", "think_time_s": 1.0}) == 3 * 100 + 2 * 5
    assert largest_prompt({**base, "turns": "geometric:3", "think_time_s": 1.0}) is None
    # a replayed trace: its longest prompt
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,40,3\n0.5,170,2\n1.0,60,9\n")
    assert largest_prompt({"trace": str(trace)}) == 170


# ------------------------------------------------------------------ requests in the system


def _run(policy: str, k_max, rate: float, n: int = 12_000) -> dict:
    return simulate(
        policy=policy,
        cost_model="paper",
        b_max=512,
        k_max=k_max,
        prompt="const:100",
        output="const:2",
        rate=rate,
        num_requests=n,
        seed=0,
    ).summary


def test_decoders_piling_up_under_a_cap_are_called_unstable():
    """Orca at 94% of lambda* with k_max 2: thousands of decoders with one token left each
    pile up; the backlog grows by about 10 tokens/s against a threshold of 43 and the
    token verdict alone said inconclusive. The requests in the system grow by about 10 a
    second, past a quarter of lambda*."""
    s = _run("orca", 2, 20.0)
    assert s["critical_rate"] == pytest.approx(2 / (2 * T128))
    lo, _ = s["backlog_growth_ci"]
    assert 0 < lo and s["backlog_growth_tokens_per_s"] < s["verdict_threshold_tokens_per_s"]  # tokens: slow drift
    assert s["requests_verdict"] == "unstable"
    assert s["requests_threshold_per_s"] == pytest.approx(REQUESTS_GROWTH_SHARE * s["critical_rate"])
    assert s["requests_growth_per_s"] > s["requests_threshold_per_s"] and s["requests_growth_ci"][0] > 0
    assert s["verdict"] == "unstable" and s["stable"] is False
    assert s["verdict_reason"].startswith("the number of requests in the system grows faster than the threshold")
    assert "k_max 2 < b_max 512" in s["verdict_reason"]
    line = describe_verdict(s)
    assert line.startswith("UNSTABLE (") and "tok/s" in line and "); requests in the system " in line
    # well inside the region the requests stay level: stable on both counts
    low = _run("orca", 2, 12.0)
    assert low["verdict"] == "stable" and low["requests_verdict"] == "stable"


def test_a_stable_policys_decoders_warming_up_are_not_called_unstable():
    """Adaptive at 0.98 of lambda* (k_max 16, 4,000 requests, seed 4), stable in long runs
    (docs/stability.md): over the judged half its tokens drift up, and its requests grow
    at 12% of lambda*, with an interval above 2% of it; at the tokens' 2% the requests
    would have called it unstable."""
    lam = capacity("paper", 512, 1024, 128, k_max=16).critical_rate
    s = simulate(
        policy="adaptive:cost=paper",
        cost_model="paper",
        b_max=512,
        k_max=16,
        prompt="const:1024",
        output="const:128",
        rate=0.98 * lam,
        num_requests=4000,
        seed=4,
    ).summary
    assert s["backlog_growth_ci"][0] > 0 and s["requests_growth_ci"][0] > 0.02 * lam
    assert s["requests_verdict"] == "inconclusive" and s["verdict"] == "inconclusive"


@pytest.mark.parametrize("k_max", [None, 512, 4096])
def test_runs_without_a_binding_cap_are_judged_by_tokens_alone(k_max):
    s = _run("orca", k_max, 20.0, n=2000)
    assert not {k for k in s if k.startswith("requests_")}
    assert np.isfinite(s["verdict_threshold_tokens_per_s"]) and s["verdict"] in ("stable", "unstable", "inconclusive")


def test_a_replica_scales_its_threshold_as_one_server_does(monkeypatch):
    """A replica's verdict took theorem 2's b_max / t(b_max) for its threshold where one
    server (and the network's work) take `fill_capacity`: with a binding k_max, the
    region's rate, 2,777 tokens/s here against 3,343."""
    import llmsched.sim.network_result as nr
    from llmsched.sim.network_result import simulate_network

    seen = []

    def spy(*args, **kwargs):
        if kwargs.get("decode_of") != "job":
            seen.append(kwargs["capacity"])
        return judge(*args, **kwargs)

    judge = nr.stability_verdict
    monkeypatch.setattr(nr, "stability_verdict", spy)
    net = _kmax_network("adaptive")
    net["num_jobs"] = 200
    simulate_network(net).summary
    fill = capacity("paper", 512, 1024, 128, k_max=16).fill_capacity
    assert fill < 0.9 * 512 / (0.01128 + 4 * 0.03547)
    assert seen == [pytest.approx(fill)]
    # without a binding cap: theorem 2's capacity, exactly as before
    seen.clear()
    net["servers"]["s1"]["k_max"] = None
    simulate_network(net).summary
    assert seen == [traffic(net).server("s1").replica_token_capacity]


def test_the_counterexample_search_prints_no_table_of_a_workload_it_did_not_try(capsys):
    base = ["capacity", *KMAX, "--find-counterexample", "--workers", "1", "--num-requests", "40", "--seeds", "0"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "no counterexample confirmed among 16 candidate workloads" in out and "llmsched capacity" not in out
    # a workload given is the one candidate: its table stays
    assert main([*base, "--prompt", "const:1024", "--output", "const:128"]) == 0
    out = capsys.readouterr().out
    assert "llmsched capacity" in out and "1,024.0 / 128.0 tokens" in out


def test_the_counterexample_search_without_its_table_names_the_region_plot(capsys, tmp_path):
    plot = tmp_path / "region.png"
    base = ["capacity", *KMAX, "--find-counterexample", "--workers", "1", "--num-requests", "40", "--seeds", "0"]
    assert main([*base, "--plot", str(plot)]) == 0
    assert plot.is_file() and f"region plot: {plot}" in capsys.readouterr().out


def test_a_network_server_caps_prefill_per_request_as_one_server_does():
    """A capped network server's lambda* left the region's prefill per request unbounded
    (one server's capacity caps it at the longest prompt): 0.8593 against 0.8556 jobs/s."""
    from llmsched.analysis.capacity_report import capacity_report
    from llmsched.workload.network import load_network

    for k_max in (2, 4):
        server = {"policy": "sarathi", "b_max": 512, "k_max": k_max, "cost_model": "paper"}
        call = {"call": {"server": "s", "prompt": "const:100", "output": "const:50"}}
        job = {"arrival": {"process": "poisson", "rate": 1.0}, "route": [call]}
        net = traffic(load_network({"servers": {"s": server}, "jobs": {"j": job}, "num_jobs": 1000, "seed": 0}))
        one = capacity_report(None, cost_model="paper", b_max=512, k_max=k_max, prompt="const:100", output="const:50")
        assert net.critical_rates["j"] == pytest.approx(one["capacity"]["critical_rate"], rel=1e-12)


def test_capacity_takes_whole_float_caps_and_refuses_a_non_bool_peak():
    """`capacity(k_max=16.0)` was refused while `simulate(k_max=16.0)` ran k_max 16; and
    `peak="no"` (truthy) was taken as true, silently."""
    from llmsched.core.errors import ConfigError

    args = ("paper", 512, 1024, 128)
    ref = capacity(*args, k_max=16)
    for k in (16.0, np.float64(16)):
        got = capacity(*args, k_max=k)
        assert got.k_max == 16 and type(got.k_max) is int and got.critical_rate == ref.critical_rate
    assert capacity("paper", 512.0, 1024, 128).critical_rate == capacity(*args).critical_rate
    for bad in (16.5, float("inf"), True):
        with pytest.raises(ConfigError, match="k_max must be a positive integer"):
            capacity(*args, k_max=bad)
    for bad in ("no", 1, None):
        with pytest.raises(ConfigError, match="^peak must be true or false, got") as e:
            capacity(*args, peak=bad)
        assert "\n" not in str(e.value)
    assert capacity(*args, peak=False).peak_token_capacity is None
