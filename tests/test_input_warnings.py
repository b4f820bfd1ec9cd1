"""Implausible inputs: one warning line on stderr, and the run goes on (issue 12, item 9)."""

import json

import numpy as np
import pytest

import llmsched
from llmsched.cli import main
from llmsched.core.cost import make_cost_model
from llmsched.core.errors import ConfigError, InputWarning
from llmsched.workload import Trace

BASE = ["--rate", "5", "--num-requests", "60", "--prompt", "const:100", "--output", "const:10", "--json"]


def run(capsys, *argv):
    code = main(["simulate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": warning: " in line]


def test_a_plausible_run_warns_nothing(capsys):
    code, out, err = run(capsys, *BASE, "--cost-model", "const:1")
    assert code == 0 and err == ""
    code, out, err = run(capsys, *BASE)  # the default H200 profile, inside its grid
    assert code == 0 and err == ""


def test_a_block_size_without_prefix_caching_warns(capsys):
    code, out, err = run(capsys, *BASE, "--cost-model", "const:1", "--block-size", "32")
    assert code == 0 and warnings_of(err) == [
        "llmsched simulate: warning: block_size=32 has no effect without prefix caching (--prefix-caching)"
    ]
    code, out, err = run(
        capsys, *BASE, "--cost-model", "const:1", "--block-size", "32", "--prefix-caching", "--system-prompt", "64"
    )
    assert code == 0 and err == ""


def test_prefix_caching_on_a_workload_without_block_ids_warns(capsys, tmp_path):
    """`--prefix-caching` on a trace without block ids (plain CSV, Azure, BurstGPT) or a
    synthetic workload with no shared prefix ran at a 0.0% hit rate and said nothing."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,64,4\n0.1,64,4\n0.2,64,4\n")
    code, out, err = run(capsys, "--trace", str(trace), "--prefix-caching", "--cost-model", "const:1", "--json")
    assert code == 0 and json.loads(out)["prefix_cache"]["token_hit_rate"] == 0
    assert warnings_of(err) == [
        f"llmsched simulate: warning: prefix caching has nothing to hit: trace {trace} has no block ids (a "
        "block_ids@B column or Mooncake's hash_ids; Azure and BurstGPT traces have none), so every prompt is a miss"
    ]
    code, out, err = run(capsys, *BASE, "--cost-model", "const:1", "--prefix-caching")
    assert code == 0 and warnings_of(err) == [
        "llmsched simulate: warning: prefix caching has nothing to hit: the synthetic workload shares no "
        "prefixes (give it --system-prompt N or --turns), so every prompt is a miss"
    ]
    # the same trace with block ids: prompts 2 and 3 hit the first one's blocks
    ids = " ".join(str(i) for i in range(1, 5))
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens,block_ids@16\n" + "".join(f"{t},64,4,{ids}\n" for t in (0, 1, 2))
    )
    code, out, err = run(capsys, "--trace", str(trace), "--prefix-caching", "--cost-model", "const:1", "--json")
    assert code == 0 and err == "" and json.loads(out)["prefix_cache"]["token_hit_rate"] > 0
    with pytest.warns(InputWarning, match="the trace has no block ids"):
        llmsched.simulate(trace=Trace(np.array([0.0, 1.0]), np.array([64, 64]), np.array([4, 4])), prefix_caching=True)


def test_prefix_caching_with_no_prompt_longer_than_a_block_warns(capsys, tmp_path):
    """A trace with block ids whose prompts are all at most one block long at the chosen
    block size hits nothing (a hit is whole blocks short of the last prompt token): it ran
    at a 0.0% hit rate and said nothing."""
    trace = tmp_path / "t.csv"
    ids = " ".join(str(i) for i in range(1, 5))
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens,block_ids@16\n" + "".join(f"{t},64,4,{ids}\n" for t in (0, 1, 2))
    )
    args = ["--trace", str(trace), "--prefix-caching", "--cost-model", "const:1", "--json"]
    code, out, err = run(capsys, *args, "--block-size", "64")
    assert code == 0 and json.loads(out)["prefix_cache"]["token_hit_rate"] == 0
    assert warnings_of(err) == [
        "llmsched simulate: warning: prefix caching has nothing to hit: no prompt is longer than one 64-token "
        "block (a hit is whole blocks and leaves the prompt's last token to compute), so every prompt is a miss "
        "(a smaller block size would find the shared prefixes)"
    ]
    code, out, err = run(capsys, *args, "--block-size", "32")  # one block of each prompt to hit
    assert code == 0 and err == "" and json.loads(out)["prefix_cache"]["token_hit_rate"] > 0


def test_a_step_under_a_tenth_of_a_millisecond_warns_once(capsys):
    code, out, err = run(capsys, *BASE, "--cost-model", "const:0.01")
    assert code == 0 and json.loads(out)["completed"] == 60  # the run went on
    assert err.splitlines() == warnings_of(err) and len(warnings_of(err)) == 1
    assert "llmsched simulate: warning:" in err and "0.01 ms, under 0.1 ms" in err
    code, out, err = run(capsys, *BASE, "--cost-model", "linear:c=0.02,a=0.00001")
    assert code == 0 and "under 0.1 ms" in err


def test_a_trace_slower_than_a_hundredth_of_a_request_per_second_warns(tmp_path, capsys):
    trace = tmp_path / "ms.csv"  # times written in milliseconds
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n200,10,5\n400,12,5\n600,9,4\n")
    code, out, err = run(capsys, "--trace", str(trace), "--cost-model", "paper", "--json")
    assert code == 0 and json.loads(out)["completed"] == 4
    assert len(warnings_of(err)) == 1 and "0.005 req/s" in err and "in seconds" in err
    # rescaled on purpose: no warning
    code, out, err = run(capsys, "--trace", str(trace), "--cost-model", "paper", "--json", "--time-scale", "1000")
    assert code == 0 and err == ""


def test_a_profile_far_past_its_grid_warns(capsys):
    code, out, err = run(
        capsys, "--rate", "0.5", "--num-requests", "3", "--prompt", "const:70000", "--output", "const:5", "--json"
    )
    assert code == 0 and json.loads(out)["completed"] == 3
    assert len(warnings_of(err)) == 1
    assert "extrapolated far past its grid" in err and "context up to 70,004 (measured up to 32,768)" in err
    # a decode batch past the grid only where a cap allows it (b_max alone bounds it loosely)
    code, out, err = run(capsys, *BASE, "--b-max", "2048")
    assert code == 0 and err == ""
    code, out, err = run(capsys, *BASE, "--b-max", "2048", "--k-max", "2048")
    assert code == 0 and err == ""  # 60 requests: at most 60 decode together, inside the grid
    code, out, err = run(capsys, *BASE, "--num-requests", "1500", "--b-max", "2048", "--max-running", "1200")
    assert "decode batch up to 1,200 (measured up to 512)" in err
    # without a cap, the largest decode batch the run reached (mean 2,749.8 of a grid to
    # 512 ran without a word)
    uncapped = ["--prompt", "const:10", "--output", "const:1000", "--num-requests", "3000", "--rate", "1000"]
    code, out, err = run(capsys, *uncapped, "--b-max", "4096", "--json")
    assert code == 0 and len(warnings_of(err)) == 1
    assert "was extrapolated far past its grid: decode batch up to 3,000 (measured up to 512) in this run" in err
    cost = make_cost_model("profile")
    assert cost.extrapolation(512, 256, 10_000) == []
    far = cost.extrapolation(20_000, 2_000, 10_000)
    assert [f.split(" up to")[0] for f in far] == ["token load (b_max)", "decode batch", "prefill chunk"]


def test_an_ignored_rate_is_refused_or_warned(tmp_path, capsys):
    # the command line refuses --rate with a rate or load grid (test_cli_flag_audit); so
    # does the API, for every option the grid also sets (it warned for the rate, and took
    # the grid's value of any other without a word)
    from llmsched.analysis.sweep import run_sweep

    fixed = dict(cost_model="paper", prompt="const:100", output="const:10", num_requests=50, rate=3.0)
    with pytest.raises(ConfigError, match="rate=3.0 and the grid's 'load' both set each point's rate"):
        run_sweep(None, ["load=0.5"], out_dir=tmp_path / "s", workers=1, plots=False, progress=False, **fixed)
    with pytest.raises(ConfigError, match="seed=3 and the grid's 'seed' both set each point's seed"):
        run_sweep(None, ["seed=0,1"], out_dir=tmp_path / "s", workers=1, plots=False, progress=False, seed=3)
    assert not (tmp_path / "s").exists()
    trace = Trace(np.array([0.0, 0.5, 1.0]), np.array([10, 20, 30]), np.array([5, 5, 5]), None)
    with pytest.warns(InputWarning, match="rate=5 is ignored: the caller's trace"):
        r = llmsched.simulate(trace=trace, rate=5, cost_model="paper")
    assert r.summary["completed"] == 3


def test_validate_and_simulate_share_the_b_max_default():
    import inspect

    from llmsched.analysis.validate import validate
    from llmsched.cli import build_parser
    from llmsched.policies.spec import SchedulerSpec

    assert inspect.signature(validate).parameters["b_max"].default == SchedulerSpec().b_max == 512
    args = build_parser().parse_args(["validate", "--model", "m", "--trace", "t.csv"])
    assert args.b_max == 512


def test_capacity_gives_simulates_input_warnings(capsys):
    """`llmsched capacity` was silent on inputs `simulate` warns about: a one-token step
    under 0.1 ms, a profile far past its grid. It calls the same checks."""

    def cap(*argv):
        code = main(["capacity", *argv, "--json"])
        out = capsys.readouterr()
        assert code == 0 and json.loads(out.out)["capacity"]["critical_rate"] > 0  # it went on
        return warnings_of(out.err)

    assert cap() == [] and cap("--cost-model", "const:1") == []
    (w,) = cap("--cost-model", "const:0.01")
    assert w.startswith("llmsched capacity: warning:") and "0.01 ms, under 0.1 ms" in w
    (w,) = cap("--prompt", "const:70000", "--output", "const:5")
    assert "extrapolated far past its grid" in w and "context up to 70,004 (measured up to 32,768)" in w
    (w,) = cap("--mean-prompt", "70000", "--mean-output", "5")
    assert "context up to 70,004 (measured up to 32,768)" in w
    (w,) = cap("--b-max", "2048", "--k-max", "2048")
    assert "decode batch up to 2,048 (measured up to 512)" in w


def test_a_network_cluster_and_serverless_run_warn_of_steps_under_a_tenth_of_a_millisecond(tmp_path, capsys):
    """Said on one server; a network's servers, a --replicas cluster and a serverless
    platform's models ran such a cost model without a word."""
    fast = "const:0.00001"
    network = tmp_path / "net.yaml"
    network.write_text(
        "servers:\n"
        f"  s1: {{policy: sarathi, b_max: 512, cost_model: '{fast}'}}\n"
        f"  s2: {{policy: sarathi, b_max: 512, cost_model: '{fast}'}}\n"
        "jobs:\n"
        "  A: {arrival: {process: poisson, rate: 1.0}, route: ["
        "{call: {server: s1, prompt: 'const:10', output: 'const:5'}}, "
        "{call: {server: s2, prompt: 'const:10', output: 'const:5'}}]}\n"
        "num_jobs: 5\n"
    )
    platform = tmp_path / "platform.yaml"
    platform.write_text(
        "cluster: {nodes: [{name: n, gpus: 1, gpu_memory_gb: 80}]}\n"
        f"models: {{a: {{weights_gb: 16, cost_model: '{fast}'}}}}\n"
        "workload: {rate: 1, num_requests: 5}\n"
    )
    said = f"the cost model '{fast}' times a one-token step at 1e-05 ms, under 0.1 ms"
    for argv in (
        ["--network", str(network)],
        ["--cost-model", fast, "--num-requests", "5", "--replicas", "2"],
        ["--serverless", str(platform)],
    ):
        code, out, err = run(capsys, *argv, "--out", "", "--quiet")
        assert code == 0, err
        assert [said in line for line in warnings_of(err)] == [True], (argv, err)  # once per cost model


def test_a_network_a_cluster_and_a_platform_warn_of_a_profile_far_past_its_grid(tmp_path, capsys):
    """Said on one server (70,004-token contexts on a grid to 32,768); a network's servers,
    a --replicas cluster and a serverless platform's models ran the same contexts without a
    word."""
    long = ["--prompt", "const:70000", "--output", "const:5"]
    network = tmp_path / "net.yaml"
    network.write_text(
        "servers:\n"
        "  s1: {policy: sarathi, b_max: 512, cost_model: profile}\n"
        "  s2: {policy: sarathi, b_max: 512, cost_model: profile}\n"
        "jobs:\n"
        "  A: {arrival: {process: poisson, rate: 0.5}, route: ["
        "{call: {server: s1, prompt: 'const:70000', output: 'const:5'}}, "
        "{call: {server: s2, prompt: 'const:10', output: 'const:5'}}]}\n"
        "num_jobs: 3\n"
    )
    platform = tmp_path / "platform.yaml"
    platform.write_text(
        "cluster: {nodes: [{name: n, gpus: 2, gpu_memory_gb: 80}]}\n"
        "models: {a: {weights_gb: 16, kv_capacity: 100000}, b: {weights_gb: 16, kv_capacity: 100000}}\n"
        "workload: {rate: 0.5, num_requests: 3, prompt: 'const:70000', output: 'const:5'}\n"
    )
    said = "extrapolated far past its grid: decode context up to 70,004 (measured up to 32,768)"
    for argv in (
        ["--network", str(network)],
        [*long, "--rate", "0.5", "--num-requests", "3", "--replicas", "2"],
        ["--serverless", str(platform)],
    ):
        code, out, err = run(capsys, *argv, "--out", "", "--quiet")
        assert code == 0, err
        assert [said in line for line in warnings_of(err)] == [True], (argv, err)  # s1's calls only, once
    code, out, err = run(capsys, *BASE, "--replicas", "2", "--out", "", "--quiet")  # inside the grid: no word
    assert code == 0 and err == ""
