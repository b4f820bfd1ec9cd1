"""`llmsched capacity`: numbers against hand computation (paper model), JSON, region, errors."""

import json

import pytest

from llmsched.cli import main

T512 = 0.01128 + 4 * 0.03547  # t(512) of the paper model: 153.16 ms
T128 = 0.01128 + 0.03547  # t(128): 46.75 ms
C = 512 / T512  # theorem 2's token capacity, tokens/s


def run_json(capsys, *argv):
    assert main(["capacity", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_theorem2_numbers_by_hand(capsys):
    r = run_json(
        capsys,
        "--cost-model",
        "paper",
        "--b-max",
        "512",
        "--mean-prompt",
        "200",
        "--mean-output",
        "101",
        "--rate",
        "10",
    )
    c = r["capacity"]
    assert c["step_time_at_b_max_s"] == pytest.approx(T512)
    assert c["token_capacity"] == pytest.approx(C)
    assert c["work_per_request"] == 300
    assert c["critical_rate"] == pytest.approx(C / 300)  # 11.143 req/s
    assert r["utilisation"] == pytest.approx(10 * 300 / C)  # 89.7 %
    assert r["inside"] is True
    assert r["scale"] == pytest.approx(C / 300 / 10)
    assert c["predicted_growth_tokens_per_s"] == 0
    assert r["means_source"] == "given" and "region" not in r


def test_outside_the_bound(capsys):
    r = run_json(capsys, "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101", "--rate", "12")
    assert r["inside"] is False and r["scale"] < 1
    assert r["capacity"]["predicted_growth_tokens_per_s"] == pytest.approx(12 * 300 - C)


def test_k_max_region_by_hand(capsys, tmp_path):
    # the ray (200, 100) leaves the region on the edge between shapes (113, 15) and
    # (0, 16), both at load 128: lambda (200, 100) = a (113, 15)/t + (1 - a) (0, 16)/t
    # gives lambda = 16 / (t(128) (100 + 200/113))
    lam = 16 / (T128 * (100 + 200 / 113))
    png = tmp_path / "region.png"
    r = run_json(
        capsys,
        "--cost-model",
        "paper",
        "--b-max",
        "512",
        "--k-max",
        "16",
        "--mean-prompt",
        "200",
        "--mean-output",
        "101",
        "--rate",
        "3",
        "--plot",
        str(png),
    )
    assert r["capacity"]["critical_rate"] == pytest.approx(lam, rel=1e-9)
    assert r["inside"] is True and r["scale"] == pytest.approx(lam / 3)
    shapes = {(v["prefill_tokens"], v["decode_tokens"]) for v in r["region"]["vertices"]}
    assert {(512, 0), (497, 15), (113, 15), (0, 16)} <= shapes
    assert png.stat().st_size > 1000 and r["plot"] == str(png)
    out = run_json(
        capsys,
        "--cost-model",
        "paper",
        "--b-max",
        "512",
        "--k-max",
        "16",
        "--mean-prompt",
        "200",
        "--mean-output",
        "101",
        "--rate",
        "3.5",
    )
    assert out["inside"] is False and out["margin"] < 0


def test_a_trace_gives_its_arrival_rate_whatever_gives_the_means(capsys, tmp_path):
    """With both means given, the trace's rate was dropped (no utilisation, rate null)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\r\n0,10,5\r\n1,20,6\r\n3,20,6\r\n")
    base = ["--cost-model", "paper", "--trace", str(trace)]
    for means in ([], ["--mean-prompt", "200"], ["--mean-prompt", "200", "--mean-output", "101"]):
        r = run_json(capsys, *base, *means)
        assert r["rate"] == pytest.approx(2 / 3), means  # two gaps over 3 s
    cap = r["capacity"]
    assert cap["work_per_request"] == 300 and r["utilisation"] == pytest.approx((2 / 3) / cap["critical_rate"])


def test_means_by_sampling_laws(capsys):
    r = run_json(capsys, "--cost-model", "paper", "--prompt", "const:200", "--output", "const:101")
    assert r["capacity"]["mean_prompt"] == 200 and r["capacity"]["mean_output"] == 101
    assert r["capacity"]["critical_rate"] == pytest.approx(C / 300)
    assert "rate" not in r
    g = run_json(
        capsys, "--cost-model", "paper", "--prompt", "geometric:200", "--output", "geometric:101", "--samples", "50000"
    )
    assert g["capacity"]["mean_prompt"] == pytest.approx(200, rel=0.03)
    assert g["means_source"].startswith("sampled")


def test_text_output(capsys):
    assert (
        main(["capacity", "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101", "--rate", "10"]) == 0
    )
    out = capsys.readouterr().out
    assert "11.143 req/s" in out and "3,342.9 tokens/s" in out and "89.7%" in out


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--cost-model", "nope", "--mean-prompt", "1", "--mean-output", "1"], "unknown cost model"),
        (["--cost-model", "paper", "--mean-prompt", "-5", "--mean-output", "10"], "mean prompt"),
        (["--cost-model", "paper", "--mean-prompt", "5", "--mean-output", "10", "--rate", "-1"], "rate"),
        (["--cost-model", "paper", "--prompt", "bogus:1"], "length law"),
        (["--cost-model", "paper", "--lengths", "sharegpt", "--prompt", "const:3"], "not both"),
        (["--cost-model", "paper", "--find-counterexample"], "k-max"),
        # means no request has: the report came out, silent and meaningless
        (["--cost-model", "paper", "--mean-prompt", "1e-300"], "--mean-prompt: the mean prompt must be a number of"),
        (["--cost-model", "paper", "--mean-output", "0.5"], "--mean-output: the mean output must be a number of"),
        (["--cost-model", "paper", "--mean-prompt", "1e30"], "from 1 to 1,073,741,824, got 1e+30"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, argv, msg):
    assert main(["capacity", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err


def test_theorem_2_failing_one_lambda_star_with_or_without_a_cap_that_cannot_bind(capsys):
    """paper:variant=max: 0.151 req/s without --k-max, 45.57 with --k-max 100000 before;
    now lambda* = max_b b / t(b) / w (at b = 128) both ways, C / w printed as theorem 2's
    rate, and a note says theorem 2 does not give lambda*."""
    base = ["--cost-model", "paper:variant=max", "--mean-prompt", "200", "--mean-output", "50"]
    lams = {run_json(capsys, *base, *k)["capacity"]["critical_rate"] for k in ([], ["--k-max", "100000"])}
    assert len(lams) == 1 and lams.pop() == pytest.approx(128 / 0.01128 / 249)
    assert main(["capacity", *base, "--rate", "1"]) == 0
    out = capsys.readouterr().out
    assert "45.572 req/s" in out and "theorem 2 rate C / w" in out and "0.151 req/s" in out
    # sarathi (the default policy) fills every step to b_max: its own growth, not lambda*'s steps'
    assert "theorem 2 does not give lambda*" in out and "fluid backlog growth (sarathi: full steps of b_max)" in out


def test_capacity_report_refuses_options_its_bounds_do_not_model():
    """The command line refused them (flags and --config); the Python call took them."""
    from llmsched.analysis.capacity_report import capacity_report
    from llmsched.core.errors import ConfigError

    for key, value in (("kv_capacity", 1000), ("max_running", 3), ("admission", "twp"), ("prefix_caching", True)):
        with pytest.raises(ConfigError, match=f"{key}: capacity's bounds do not model"):
            capacity_report(cost_model="paper", mean_prompt=200, mean_output=101, **{key: value})
    assert capacity_report(cost_model="paper", mean_prompt=200, mean_output=101)["capacity"]["critical_rate"] > 11


@pytest.mark.parametrize(
    "policy, name, conserving",
    [
        ("sarathi", "sarathi", True),
        ("ORCA", "orca", True),
        ("adaptive", "adaptive", True),  # not work-conserving, but stable inside the region
        ("ft", "fastertransformer", False),
        ("vllm", "vllm", False),
    ],
)
def test_a_policy_that_is_not_throughput_optimal_gets_no_guarantee(capsys, policy, name, conserving):
    """capacity --policy fastertransformer said 'inside the stability region: yes' as if
    lambda* were its stable region; paper 1: it is not, below it the queue may grow."""
    means = ["--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101", "--rate", "10"]
    r = run_json(capsys, *means, "--policy", policy)
    assert (r["policy"], r["throughput_optimal"], r["inside"]) == (name, conserving, True)
    assert main(["capacity", *means, "--policy", policy]) == 0
    out = capsys.readouterr().out
    assert ("not a guarantee for " + name in out) is not conserving
    assert ("is not work-conserving" in out) is not conserving


MEANS = ["--mean-prompt", "200", "--mean-output", "101"]
LAWS = ["--prompt", "const:200", "--output", "const:101"]  # the means drawn (200,000 requests)


@pytest.mark.parametrize(
    "argv, rate",
    [
        ([*MEANS, "--rate", "1e-9"], 1e-9),  # its one checked request came at 3.3e9 s: refused
        ([*LAWS, "--rate", "1e-9"], 1e-9),
        ([*MEANS, "--rate", "1e-300"], 1e-300),
        ([*MEANS, "--rate", "1e-9", "--arrival", "gamma", "--cv", "3"], 1e-9),
        # 1e-3 req/s offered: the draws of the mean lengths came at up to 2e17 s
        ([*LAWS, "--rate", "1e9", "--time-scale", "1e-12"], 1e-3),
    ],
)
def test_a_tiny_rate_is_answered_without_a_run(capsys, argv, rate):
    """`capacity --rate 1e-9` was refused: 'arrival times must be below 1e+09 s: at rate
    1e-09/s arrival 1 comes at 3.29353e+09 s', for the one request drawn to check the
    workload, which capacity never runs. The utilisation is the rate over lambda*."""
    base = ["--cost-model", "paper"]
    r = run_json(capsys, *base, *argv)
    assert r["request_rate"] == pytest.approx(rate)
    assert r["utilisation"] == pytest.approx(rate * 300 / C) and r["inside"] is True


def test_a_tiny_rate_from_a_config_is_answered_and_bad_rates_are_still_refused(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload:\n  arrival: {process: gamma, rate: 1.0e-9, cv: 2}\n")
    assert main(["capacity", "--config", str(cfg), "--mean-prompt", "200", "--mean-output", "101"]) == 0
    capsys.readouterr()
    for argv, says in (
        (["--rate", "2e9", "--time-scale", "1e-12"], "at most 1e+09 requests per second"),
        (["--rate", "0"], "positive number"),
        (["--rate", "1e-9", "--cv", "2"], "gamma"),
    ):
        assert main(["capacity", "--mean-prompt", "200", "--mean-output", "101", *argv]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_workload_with_a_duration_is_answered_whatever_its_count(capsys, tmp_path):
    """`duration_s: 100` at `--rate 0.001` was refused, 'the workload is empty: no request
    arrives within duration_s=100.0', and a duration at a high rate for a count over the
    limit: capacity runs none of these requests. A bad duration is still refused."""
    for rate, duration in (("0.001", "100"), ("1.0e-9", "100"), ("1000", "1.0e9")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"workload:\n  duration_s: {duration}\n")
        r = run_json(capsys, "--config", str(cfg), "--cost-model", "paper", *LAWS, "--rate", rate)
        assert r["request_rate"] == pytest.approx(float(rate))
        assert r["utilisation"] == pytest.approx(float(rate) * 300 / C)
    for duration, says in (("-3", "positive number"), ("abc", "must be a number")):
        cfg.write_text(f"workload:\n  rate: 0.001\n  duration_s: {duration}\n")
        assert main(["capacity", "--config", str(cfg), *MEANS]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_configs_rate_is_the_rate_capacity_judges(capsys, tmp_path):
    """A config's synthetic `rate:` (or an inline `poisson:5`) was checked and then
    dropped: no utilisation, no scale, unless --rate repeated it; simulate runs that rate
    (times time_scale). simulate's default rate, which nobody chose, still gives none."""
    cfg = tmp_path / "c.yaml"
    for workload, offered in (
        ("rate: 0.001\n  duration_s: 100", 0.001),
        ("arrival: poisson:5", 5.0),
        ("arrival: gamma\n  rate: 3\n  cv: 2\n  time_scale: 2", 6.0),
    ):
        cfg.write_text(f"workload:\n  {workload}\n")
        r = run_json(capsys, "--config", str(cfg), "--cost-model", "paper", *LAWS)
        assert r["request_rate"] == pytest.approx(offered)
        assert r["utilisation"] == pytest.approx(offered * 300 / C)
    cfg.write_text("workload:\n  prompt: const:200\n")
    assert "utilisation" not in run_json(capsys, "--config", str(cfg), "--cost-model", "paper", *LAWS)


def test_a_tiny_rate_prints_its_digits(capsys, monkeypatch):
    """--rate 1e-6 printed '0.000 req/s (0.0 tokens/s)', utilisation '0.0%'."""
    monkeypatch.setenv("COLUMNS", "300")
    base = ["capacity", "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101"]
    assert main([*base, "--rate", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "1e-06 req/s (0.0003 tokens/s)" in out and "0.000 req/s" not in out
    assert f"{1e-6 * 300 / C * 100:.3g}%" in out and "margin +1.11e+09%" in out
    assert main([*base, "--rate", "10"]) == 0  # ordinary rates as before
    out = capsys.readouterr().out
    assert "10.000 req/s (3,000.0 tokens/s)" in out and "89.7%" in out


def test_a_tiny_capacity_prints_its_digits(capsys, monkeypatch):
    """A slow model's lambda* printed '0.000 req/s' (JSON 5.33e-05) and a fast one's
    t(b_max) '0.00 ms': the table's figures get 3 significant digits where they would print 0."""
    monkeypatch.setenv("COLUMNS", "300")
    means = ["--mean-prompt", "2000", "--mean-output", "1001"]
    assert main(["capacity", "--cost-model", "const:100000", "--b-max", "16", *means, "--rate", "1e-4"]) == 0
    out = capsys.readouterr().out
    # C = 16 / 100 s = 0.16 tokens/s, w = 3,000 tokens: lambda* = 5.33e-05 req/s
    assert "5.33e-05 req/s (token budget" in out and "0.000 req/s" not in out
    assert main(["capacity", "--cost-model", "const:0.001", "--b-max", "512", *means]) == 0
    assert "0.001 ms" in capsys.readouterr().out
