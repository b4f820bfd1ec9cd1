"""Options a command would ignore or mishandle are refused with one line and exit code 2
(a zero that silently became the default, a flag that does not apply, a number past the
clock), and what a run writes matches what it reports."""

import os
import warnings

import pytest
from helpers import one_line_error

from llmsched.cli import main
from llmsched.core.errors import count_text
from llmsched.workload.serverless import _shares, load_serverless

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
SERVERLESS = os.path.join(EXAMPLES, "serverless", "small.yaml")
RUN = ["--cost-model", "paper", "--num-requests", "20", "--rate", "2", "--out", ""]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["reproduce", "stability", "--quick", "--num-requests", "0"], ["--num-requests"]),
        # an empty file name read as "not given": the default workload, server or capacity ran
        # contradictory: --quiet silently won
        (["simulate", "--progress", "--quiet", "--num-requests", "5", "--out", ""], ["--progress and --quiet"]),
        (["sweep", "--grid", "seed=0", "--progress", "--quiet"], ["--progress and --quiet"]),
        (["simulate", "--serverless", "", "--num-requests", "5"], ["--serverless", "expected a file"]),
        (["simulate", "--network", " ", "--num-requests", "5"], ["--network", "expected a file"]),
        (["simulate", "--trace", "", "--out", ""], ["--trace", "expected a file"]),
        (["simulate", "--config", "", "--out", ""], ["--config", "expected a file"]),
        (["capacity", "--network", ""], ["--network", "expected a file"]),
        (["sweep", "--config", "", "--grid", "load=0.5"], ["--config", "expected a file"]),
        (["reproduce", "prefix-caching", "--trace", ""], ["--trace", "expected a file"]),
        (["reproduce", "stability", "--quick", "--search-requests", "0"], ["--search-requests"]),
        (["reproduce", "twp", "--quick", "--num-requests", "0"], ["--num-requests"]),
        (["reproduce", "prefix-caching", "--quick", "--block-size", "0"], ["--block-size"]),
        (["reproduce", "stability", "--quick", "--kv-capacities", "100"], ["--kv-capacities", "prefix-caching"]),
        (["reproduce", "clusters", "--quick", "--block-size", "4"], ["--block-size", "prefix-caching"]),
        (["simulate", *RUN, "--max-time", "1e300"], ["max_time_s", "1e+09"]),
        (["simulate", *RUN, "--max-time", "nan"], ["max_time_s"]),
        (["simulate", *RUN, "--sample-interval", "1e300"], ["sample_interval_s"]),
        (["simulate", *RUN, "--replicas", "2", "--max-time", "inf"], ["max_time_s"]),
        (["simulate", "--serverless", SERVERLESS, "--max-time", "1e300", "--out", ""], ["max_time_s"]),
        (["simulate", "--serverless", SERVERLESS, "--duration", "10", "--out", ""], ["--duration does not apply"]),
        (
            ["simulate", "--serverless", SERVERLESS, "--sample-interval", "1", "--out", "o"],
            ["--sample-interval does not apply to --serverless", "no time series"],
        ),
        (["simulate", *RUN, "--scale", "2"], ["--scale", "--rate"]),
        (["simulate", *RUN, "--slo", "ttft_ms=100", "--slo", "ttft_ms=200"], ["ttft_ms is given twice"]),
        (["simulate", *RUN, "--slo", "ttft_ms=100", "--slo", "ttft=5000"], ["ttft and ttft_ms", "same objective"]),
        (
            ["simulate", "--serverless", SERVERLESS, "--slo", "itl_ms=5", "--slo", "itl_p99_ms=50", "--out", ""],
            ["itl_p99_ms and itl_ms are the same objective"],
        ),
        (
            ["capacity", "--cost-model", "paper", "--mean-prompt", "1000", "--mean-output", "200"]
            + ["--kv-capacity", "100"],
            ["--kv-capacity does not apply"],
        ),
        (
            ["capacity", "--cost-model", "paper", "--mean-prompt", "100", "--mean-output", "20", "--admission", "twp"],
            ["--admission does not apply"],
        ),
        (
            ["capacity", "--cost-model", "paper", "--k-max", "16", "--mean-prompt", "200", "--mean-output", "101"]
            + ["--plot", "region.xyz"],
            [".png, .pdf, .svg"],
        ),
    ],
)
def test_refused(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, argv, *words)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "admission, takes",
    [
        ("fcfs", "fcfs takes no options"),
        ("spf", "spf takes no options"),
        ("twp", "known: eps, itl_target_ms, alpha"),
        ("dynamicbatch", "known: itl_target_ms, alpha, beta, delta, c_min"),
    ],
)
def test_an_unknown_admission_option_reads_the_same_for_every_policy(capsys, admission, takes):
    line = one_line_error(capsys, ["simulate", *RUN, "--admission", admission, "--admission-option", "foo=1"])
    assert line.startswith(f"llmsched simulate: error: admission policy '{admission}': unknown option 'foo' ({takes}")


@pytest.mark.parametrize(
    "text, words",
    [
        ("b_max: null\n", ["b_max must be a positive integer, got None"]),
        ("b_max: 1.0e+300\n", ["got 1e+300"]),  # not three hundred digits
        ("max_time_s: 1.0e+300\n", ["max_time_s"]),
        ("workload:\n  num_requests: 1.0e+300\n", ["num_requests=1e+300"]),
    ],
)
def test_config_values(capsys, tmp_path, text, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cost_model: paper\n" + text)
    err = one_line_error(capsys, ["simulate", "--config", str(cfg), "--out", ""], *words)
    assert len(err) < 200


def test_serverless_memory_past_any_gpu(capsys, tmp_path):
    text = open(SERVERLESS).read()
    for gb in ("1.0e+300", "2.0e+6"):
        f = tmp_path / "g.yaml"
        f.write_text(text.replace("gpu_memory_gb: 80", f"gpu_memory_gb: {gb}"))
        assert f"gpu_memory_gb: {gb}" in f.read_text()
        one_line_error(capsys, ["simulate", "--serverless", str(f), "--out", ""], "gpu_memory_gb", "at most")
    # within the bound, the KV cache it leaves is capped where it is as good as unlimited
    f.write_text(text.replace("gpu_memory_gb: 80", "gpu_memory_gb: 1.0e+6").replace("131072", "1.0e-9"))
    spec = load_serverless(str(f))
    group = spec.nodes[0]
    assert spec.kv_capacity("llama-3-8b", group) == 1 << 40


def test_zipf_with_a_huge_exponent_warns_nothing(tmp_path):
    f = tmp_path / "z.yaml"
    text = open(SERVERLESS).read()
    assert "popularity: zipf:1.2" in text
    f.write_text(text.replace("popularity: zipf:1.2", "popularity: zipf:1e308"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = load_serverless(str(f))
        shares = _shares(spec.workload, spec.models)
    assert shares.tolist() == [1.0, 0.0, 0.0]  # all traffic to the first model


def test_plot_name_without_suffix_is_the_png_written(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["capacity", "--cost-model", "paper", "--k-max", "16", "--mean-prompt", "200", "--mean-output", "101"]
    assert main([*argv, "--plot", "region"]) == 0
    assert "region.png" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["region.png"]
    assert main([*argv, "--plot", "r.svg"]) == 0
    assert (tmp_path / "r.svg").read_text().lstrip().startswith("<?xml")


def test_a_sweep_rerun_leaves_no_stale_outputs(tmp_path):
    out = tmp_path / "sw"
    base = ["sweep", "--cost-model", "paper", "--num-requests", "60", "--out", str(out)]
    assert main([*base, "--grid", "rate=1,2"]) == 0
    assert (out / "throughput.png").exists() and (out / "latency.png").exists()
    assert main([*base, "--grid", "rate=1", "--no-plots"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "results.csv" in names and "points" in names
    assert not names & {"throughput.png", "latency.png", "max_stable_rate.png", "search.csv", "search.json"}


def test_count_text():
    assert count_text(1_048_576) == "1,048,576"
    assert count_text(int(1e300)) == "1e+300"
    assert count_text(10**400) == "about 1e+400"  # float(n) overflowed: a traceback, exit 1


def test_an_integer_past_a_floats_range_is_one_line(capsys):
    one_line_error(capsys, ["simulate", "--b-max", "1" + "0" * 400, "--out", ""], "b_max", "about 1e+400")


def test_reproduce_stability_says_why_the_search_disagrees(tmp_path, capsys):
    import json

    assert main(["reproduce", "stability", "--quick", "--policies", "sarathi,vllm", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    short = [r["policy"] for r in rows if r["stable_at_load"] is True and r["max_stable_load"] < 0.9]
    assert short  # quick probes are too short for loads near 0.9
    assert f"note: {', '.join(short)} stable at load 0.9" in out and "--search-requests" in out


def test_reproduce_stability_with_no_probe_judged_shows_no_rate_found(tmp_path, capsys):
    """Probes of one request are never judged: the table showed "max stable rate 0.000"
    beside "stable at load 0.9: yes", and no note (a load of 0 read as no load); then
    `< inconclusive_low`, an upper bound no verdict supported."""
    import json

    argv = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--search-requests", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads((tmp_path / "table.json").read_text())["rows"]
    # every probe inconclusive: no answer, no bound (it held 0.0, then the smallest rate probed)
    assert row["unstable_rate"] is None and row["inconclusive_low"] > 0
    assert row["max_stable_upper_bound"] is False and row["max_stable_lower_bound"] is False
    assert row["max_stable_rate"] is None and row["max_stable_load"] is None
    assert f"< {row['inconclusive_low']:,.3f}" not in out and "0.000" not in out
    assert "note: sarathi stable at load 0.9" in out and "--search-requests" in out


NETWORK = os.path.join(EXAMPLES, "networks", "tandem.yaml")


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--rate", "5"], "--rate"),
        (["--plot", "x.png"], "--plot"),
        (["--cached-fraction", "0.5"], "--cached-fraction"),
        (["--find-counterexample"], "--find-counterexample"),
        (["--samples", "10"], "--samples"),
        (["--mean-prompt", "100"], "--mean-prompt"),
        (["--lengths", "sharegpt"], "--lengths"),
    ],
)
def test_capacity_of_a_network_names_the_flag_that_does_not_apply(capsys, tmp_path, monkeypatch, extra, flag):
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, ["capacity", "--network", NETWORK, *extra], f"{flag} does not apply")
    assert list(tmp_path.iterdir()) == []


def test_counterexample_options_need_the_search(capsys):
    base = ["capacity", "--cost-model", "paper", "--mean-prompt", "100", "--mean-output", "20"]
    for extra in (["--load", "0.5"], ["--seeds", "0,1"], ["--workers", "2"]):
        one_line_error(capsys, [*base, *extra], f"{extra[0]} is an option of --find-counterexample")


def test_a_cluster_takes_the_run_options_of_its_config(tmp_path, capsys):
    import csv
    import json

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "cost_model: paper\nmax_time_s: 20\nfast: false\n"
        "workload:\n  rate: 10\n  prompt: geometric:200\n  output: geometric:100\n  num_requests: 300\n"
    )
    assert main(["simulate", "--config", str(cfg), "--replicas", "2", "--out", str(tmp_path / "a"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["duration"] <= 20.0  # stopped by the config's max_time_s
    last = {}
    for k in (1, 2):
        argv = ["simulate", "--cost-model", "paper", "--replicas", "2", "--rate", "10", "--num-requests", "100"]
        argv += ["--prompt", "geometric:200", "--output", "geometric:100", "--time-scale", str(k)]
        assert main([*argv, "--out", str(tmp_path / f"t{k}"), "--quiet"]) == 0
        with open(tmp_path / f"t{k}" / "jobs.csv") as f:
            last[k] = max(float(r["arrival_s"]) for r in csv.DictReader(f))
    assert last[2] == pytest.approx(last[1] / 2, rel=1e-6)  # twice as fast
    one_line_error(capsys, ["simulate", *RUN, "--replicas", "2", "--slo", "ttft_ms=100"], "slo", "one server")
    # the request count's limit in the words a single server uses (not the network's num_jobs)
    too_many = ["simulate", "--replicas", "2", "--num-requests", "100000000", "--out", ""]
    one_line_error(capsys, too_many, "num_requests=100,000,000 exceeds the limit of 20,000,000")


def test_a_cluster_refuses_classes_with_deterministic_arrivals(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "cost_model: paper\nworkload:\n  arrival: deterministic\n  rate: 10\n  num_requests: 20\n"
        "  classes: [{tag: a, share: 1}, {tag: b, share: 1}]\n"
    )
    argv = ["simulate", "--config", str(cfg), "--replicas", "2", "--out", ""]
    one_line_error(capsys, argv, "--replicas", "poisson arrivals", "deterministic stream")
    assert main(["simulate", "--config", str(cfg), "--out", "", "--quiet"]) == 0  # one server draws one stream


def test_a_resumed_sweep_reruns_a_point_whose_trace_changed(tmp_path):
    import csv

    trace, out = tmp_path / "t.csv", tmp_path / "sw"
    argv = ["sweep", "--trace", str(trace), "--cost-model", "paper", "--grid", "seed=0", "--out", str(out), "--quiet"]
    for prompt in (100, 5000):
        trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{t},{prompt},5\n" for t in (0, 0.5, 1)))
        assert main(argv) == 0
        with open(out / "results.csv") as f:
            assert [int(float(r["total_input_tokens"])) for r in csv.DictReader(f)] == [3 * prompt]


def test_a_sweep_with_failed_points_exits_1(tmp_path, capsys, monkeypatch):
    import llmsched.analysis.sweep as sweep

    argv = ["sweep", "--cost-model", "paper", "--num-requests", "50", "--grid", "kv_capacity=10,100000"]
    # a point simulate would refuse is refused before any run, naming the point
    one_line_error(capsys, [*argv, "--out", str(tmp_path / "sw0"), "--quiet"], "grid point kv_capacity=10: ")
    assert not (tmp_path / "sw0").exists()
    # a point that fails while it runs is recorded; the rest is kept
    run = sweep.run_point

    def fail_small(cfg):
        return {"error": "SimulationStuck: stuck"} if cfg["workload"]["seed"] == 1 else run(cfg)

    monkeypatch.setattr(sweep, "run_point", fail_small)
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "50", "--workers", "1", "--grid", "seed=0,1"]
    assert main([*argv, "--out", str(tmp_path / "sw"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1 of 2 points failed" in err and "stuck" in err
    assert (tmp_path / "sw" / "results.csv").is_file()


def test_a_grid_points_bad_length_law_is_named_once(capsys):
    """`grid point prompt=bogus:3: prompt: unknown length law 'bogus:3'` named the key twice;
    a search's group named no point at all."""
    base = ["sweep", "--cost-model", "paper", "--num-requests", "10", "--quiet"]
    err = one_line_error(capsys, [*base, "--rate", "1", "--grid", "prompt=const:100|bogus:3"])
    assert "error: grid point prompt=bogus:3: unknown length law 'bogus:3'" in err and err.count("prompt") == 1
    # with other keys the point's faulty value comes first, the problem once after it
    err = one_line_error(capsys, [*base, "--rate", "1", "--grid", "policy=sarathi,orca", "--grid", "output=5|const:0"])
    assert "error: grid point output=const:0, policy=sarathi: const length must be >= 1" in err
    assert err.count("output") == 1
    err = one_line_error(capsys, [*base, "--search", "max-stable-rate", "--grid", "prompt=const:100|bogus:3"])
    assert "error: grid point prompt=bogus:3: unknown length law 'bogus:3'" in err and err.count("prompt") == 1
    # an error about no key of the point is kept whole
    one_line_error(capsys, [*base, "--rate", "1", "--grid", "kv_capacity=10"], "grid point kv_capacity=10: request 0")


def test_search_options_need_the_search(capsys):
    base = ["sweep", *RUN[:4], "--grid", "rate=1"]
    one_line_error(capsys, [*base, "--tol", "0.1"], "--tol is an option of --search")
    one_line_error(capsys, [*base, "--search-hi", "2"], "--search-hi is an option of --search")
    one_line_error(capsys, [*base, "--address", "1.2.3.4:6379"], "--backend ray")


@pytest.mark.parametrize("experiment", ["stability", "clusters", "agents", "rybko-stolyar", "twp"])
@pytest.mark.parametrize("seeds", ["0,,1", "0,", ",1", "0, ,1"])
def test_reproduce_seeds_with_an_empty_item_are_refused(tmp_path, capsys, experiment, seeds):
    """`--seeds 0,,1` ran as 0,1 (the empty item dropped); `sweep --grid seed=0,,1` refused it."""
    out = tmp_path / "o"
    one_line_error(
        capsys, ["reproduce", experiment, "--quick", "--seeds", seeds, "--out", str(out)], "--seeds: empty value"
    )
    assert not out.exists()


def test_counterexample_seeds_with_an_empty_item_are_refused(capsys):
    base = ["capacity", "--cost-model", "paper", "--mean-prompt", "100", "--mean-output", "20", "--find-counterexample"]
    one_line_error(capsys, [*base, "--seeds", "1,,2"], "--seeds: empty value in '1,,2'")


def test_reproduce_prefix_caching_lists(tmp_path, capsys):
    """`--kv-capacities 1000000,1000000` ran every cell twice (duplicate rows); an empty
    item was an error about whole numbers."""
    from llmsched.analysis.reproduce_prefix import reproduce_prefix_caching
    from llmsched.core.errors import ConfigError

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    out = tmp_path / "o"
    base = ["reproduce", "prefix-caching", "--quick", "--trace", str(trace), "--out", str(out)]
    one_line_error(capsys, [*base, "--kv-capacities", "1000000,1000000"], "kv_capacities: 1000000 is given twice")
    one_line_error(capsys, [*base, "--kv-capacities", "1000000,,8000000"], "--kv-capacities: empty value")
    one_line_error(capsys, [*base, "--kv-capacities", "1e6"], "--kv-capacities must be a comma-separated list")
    for kw, words in (
        ({"loads": (0.6, 0.6)}, "loads: 0.6 is given twice"),
        ({"kv_capacities": (8000, 8000.0)}, "kv_capacities: 8000 is given twice"),
        ({"kv_capacities": (1.5,)}, "whole numbers of tokens"),
        ({"kv_capacities": ()}, "whole numbers of tokens"),
    ):
        with pytest.raises(ConfigError, match=words):
            reproduce_prefix_caching(str(trace), out_dir=out, **kw)
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, owners",
    [
        (["twp", "--b-max", "16"], "`reproduce stability` and `reproduce prefix-caching`, not of `reproduce twp`"),
        (["twp", "--cost-model", "paper"], "`reproduce stability` and `reproduce prefix-caching`, not of"),
        (["clusters", "--load", "0.5"], "`reproduce stability`, `reproduce twp` and `reproduce prefix-caching`, not"),
        (["agents", "--policies", "sarathi"], "`reproduce stability` and `reproduce twp`, not of `reproduce agents`"),
        (["rybko-stolyar", "--tol", "0.1"], "`reproduce stability`, not of `reproduce rybko-stolyar`"),
    ],
)
def test_a_reproduce_option_names_every_experiment_that_takes_it(tmp_path, capsys, argv, owners):
    """`reproduce twp --b-max 16` named `reproduce stability` alone, but prefix-caching takes
    --b-max, --cost-model and --load too."""
    one_line_error(capsys, ["reproduce", argv[0], "--quick", *argv[1:], "--out", str(tmp_path / "o")], owners)


def test_reproduce_help_names_the_experiments_of_its_shared_options(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prefix-caching: one load" in text
    assert "stability, prefix-caching: override the token budget" in text


@pytest.mark.parametrize("spec", ["const:0", "const:-1", "const:nan", "const:inf"])
def test_a_bad_constant_step_time_names_const(capsys, spec):
    """`const:0` was refused as a "linear cost model needs c >= 0, a >= 0" error."""
    err = one_line_error(capsys, ["simulate", "--cost-model", spec, "--out", ""], f"'{spec}'", "constant step time")
    assert "linear" not in err
