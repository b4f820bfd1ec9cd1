"""The command line for clusters, networks and serverless platforms: outputs, and one-line
errors with exit code 2."""

import json
import os

import pytest
from helpers import one_line_error

from llmsched.api import OUTPUT_ONLY_KEYS
from llmsched.cli import main
from llmsched.core.paths import recorded_path
from llmsched.core.profile import PROFILES_DIR
from llmsched.workload.datasets import _strings
from llmsched.workload.lengths import parse_length_law

EX = "examples"


def test_simulate_cluster_from_flags(tmp_path, capsys):
    rc = main(
        [
            "simulate",
            "--cost-model",
            "paper",
            "--replicas",
            "3",
            "--router",
            "round-robin",
            "--rate",
            "20",
            "--prompt",
            "geometric:100",
            "--output",
            "geometric:20",
            "--num-requests",
            "300",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["completed_jobs"] == 300 and set(s["servers"]["cluster"]["replicas"]) == {
        "cluster[0]",
        "cluster[1]",
        "cluster[2]",
    }
    # round-robin: each replica gets every third call
    calls = [r["num_requests"] for r in s["servers"]["cluster"]["replicas"].values()]
    assert calls == [100, 100, 100]
    assert (tmp_path / "jobs.csv").is_file() and (tmp_path / "servers" / "cluster[2]" / "requests.csv").is_file()


def test_simulate_network_file_and_capacity(capsys):
    assert (
        main(["simulate", "--network", f"{EX}/networks/tandem.yaml", "--num-requests", "200", "--out", "", "--json"])
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    assert s["num_jobs"] == 200 and s["num_calls"] == 400 and s["verdict"] in ("stable", "inconclusive")
    assert main(["capacity", "--network", f"{EX}/networks/tandem.yaml", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["bottleneck"] == s["bottleneck"] and rep["critical_scale"] > 1


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--prompt", "bogus:3"], "--prompt"),
        (["--turns", "nope"], "--turns"),
        (["--admission-option", "foo"], "--admission-option"),
        (["--slo", "ttft_ms"], "--slo"),
    ],
)
def test_a_flag_a_network_file_makes_moot_is_refused_before_its_value_is_read(capsys, flags, flag):
    """`capacity --network F --prompt bad` reported the bad law, then (once mended) that
    --prompt does not apply; `--admission-option foo` its KEY=VALUE form."""
    net = f"{EX}/networks/tandem.yaml"
    if flag != "--slo":  # (capacity has no --slo)
        one_line_error(capsys, ["capacity", "--network", net, *flags], f"{flag} does not apply")
    one_line_error(capsys, ["simulate", "--network", net, *flags, "--out", ""], f"{flag} does not apply")


def test_capacity_refuses_an_admission_option_before_reading_it(capsys):
    argv = ["capacity", "--cost-model", "paper", "--mean-prompt", "100", "--mean-output", "10"]
    one_line_error(capsys, [*argv, "--admission-option", "foo"], "--admission-option does not apply")
    one_line_error(capsys, ["capacity", "--prompt", "bogus:3", "--max-running", "3"], "--max-running does not apply")


def _judged_without_a_guarantee(net, capsys, below: float, reasons: dict) -> str:
    """`capacity --network` (JSON) gives no feed-forward guarantee for these `reasons` at a
    utilisation under `below`, nor does a run's `traffic_stable`; returns capacity's text."""
    assert main(["capacity", "--network", str(net), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["max_utilisation"] < below and rep["feedforward"]
    assert rep["stable"] is None and rep["not_throughput_optimal"] == reasons
    assert main(["simulate", "--network", str(net), "--num-requests", "40", "--out", "", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["traffic_stable"] is None
    assert main(["capacity", "--network", str(net)]) == 0
    return capsys.readouterr().out


def test_capacity_and_a_run_do_not_call_a_fastertransformer_network_stable(tmp_path, capsys):
    net = tmp_path / "ft.yaml"
    net.write_text(
        "servers:\n  s1: {policy: fastertransformer, cost_model: paper}\n  s2: {policy: sarathi, cost_model: paper}\n"
        "jobs:\n  A:\n    arrival: {rate: 0.5}\n    route:\n"
        "      - call: {server: s1, prompt: geometric:100, output: geometric:20}\n"
        "      - call: {server: s2, prompt: geometric:100, output: geometric:20}\n"
    )
    out = _judged_without_a_guarantee(net, capsys, 0.1, {"s1": "fastertransformer"})
    assert "s1 (fastertransformer) runs a policy that is not work-conserving" in out


def test_capacity_and_a_run_do_not_call_a_network_with_a_kv_capacity_stable(tmp_path, capsys):
    """A finite kv_capacity only added a note: capacity said "stable under work-conserving
    policies" at 48% of capacity (kv_capacity 8000), where a run served 0.187 jobs/s of 1.1."""
    net = tmp_path / "kv.yaml"
    net.write_text(
        "servers:\n  gen: {policy: sarathi, b_max: 512, cost_model: paper, kv_capacity: 8000}\n"
        "jobs:\n  chat:\n    arrival: {process: poisson, rate: 1.1}\n    route:\n"
        '      - call: {server: gen, prompt: "geometric:1000,max=4000", output: "geometric:500,max=2000"}\n'
    )
    assert "stable under" not in _judged_without_a_guarantee(net, capsys, 0.5, {"gen": "kv_capacity 8000"})
    # a cluster from the flags with --kv-capacity: the same judgement
    argv = ["simulate", "--cost-model", "paper", "--replicas", "2", "--rate", "1", "--prompt", "geometric:100"]
    argv += ["--output", "geometric:20", "--num-requests", "40", "--out", "", "--json"]
    assert main([*argv, "--kv-capacity", "8000"]) == 0
    assert json.loads(capsys.readouterr().out)["traffic_stable"] is None
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["traffic_stable"] is True


def test_a_cluster_refuses_a_trace_without_pointing_to_a_network_file(tmp_path, capsys):
    """The refusal said "or describe the cluster in a --network file", whose job types
    refuse a trace's arrivals too."""
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,prompt,output\n0.0,100,20\n0.5,200,30\n")
    argv = ["simulate", "--cost-model", "paper", "--replicas", "2", "--trace", str(trace), "--out", ""]
    err = one_line_error(capsys, argv, "one server only", "replay:PATH")
    assert "describe the cluster in a --network file" not in err
    # the single server's own message still lists its trace forms
    one_line_error(capsys, ["simulate", "--cost-model", "paper", "--arrival", "foo"], "trace:PATH, azure-conv")


def test_capacity_judges_a_network_config_as_simulate_runs_it(tmp_path, capsys):
    """`capacity --config RUN/config.json` of a cluster or network run was refused (naming
    `capacity --network FILE`) while `simulate --config` runs the same file: it is judged
    as --network FILE judges it, with the flags that allows; a sweep still refuses it."""
    path = "examples/networks/agent_dag.yaml"
    assert main(["capacity", "--network", path, "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert main(["capacity", "--config", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == judged
    one_line_error(capsys, ["capacity", "--config", path, "--rate", "3"], "--config FILE (a network's", "--rate")
    run = tmp_path / "run"
    argv = ["simulate", "--cost-model", "paper", "--replicas", "2", "--num-requests", "20", "--out", str(run)]
    assert main([*argv, "--quiet"]) == 0
    assert main(["capacity", "--network", str(run / "config.json"), "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert main(["capacity", "--config", str(run / "config.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == judged
    # a serverless platform has no capacity analysis: still refused naming what runs it
    one_line_error(capsys, ["capacity", "--config", f"{EX}/serverless/small.yaml"], "simulate --serverless FILE")
    argv = ["sweep", "--config", path, "--grid", "seed=0", "--out", "x"]
    one_line_error(capsys, argv, "llmsched simulate --network FILE")


def test_simulate_serverless(capsys):
    assert (
        main(
            [
                "simulate",
                "--serverless",
                f"{EX}/serverless/small.yaml",
                "--num-requests",
                "200",
                "--platform-scheduler",
                "fcfs",
                "--out",
                "",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    assert s["scheduler"] == "fcfs" and s["completed"] == 200 and s["cold_starts"] >= 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["simulate", "--network", f"{EX}/networks/tandem.yaml", "--rate", "3"], "--rate does not apply"),
        (["simulate", "--router", "jsq"], "give --replicas"),
        (["simulate", "--replicas", "2", "--router", "fastest"], "unknown router"),
        (["simulate", "--network", "/no/such.yaml"], "does not exist"),
        (["simulate", "--serverless", f"{EX}/serverless/small.yaml", "--rate", "3"], "--rate does not apply"),
        (["simulate", "--serverless", f"{EX}/serverless/small.yaml", "--platform-scheduler", "nope"], "nope"),
        (["simulate", "--platform-scheduler", "twp"], "is for --serverless"),
        (["capacity", "--network", f"{EX}/networks/tandem.yaml", "--b-max", "256"], "does not apply"),
    ],
)
def test_bad_network_input_is_one_line_exit_2(args, message, capsys):
    assert main([*args, "--out", ""] if args[0] == "simulate" else args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_reproduce_network_experiments_are_wired(tmp_path, capsys):
    assert main(["reproduce", "rybko-stolyar", "--quick", "--out", str(tmp_path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"rows", "summary", "files"} <= set(res) and (tmp_path / "table.csv").is_file()
    assert main(["reproduce", "clusters", "--workload", "sharegpt", "--quick", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workload is an option of `reproduce stability` and `reproduce twp`" in err[0]
    assert main(["reproduce", "agents", "--tol", "0.1", "--quick", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["llmsched reproduce: error: --tol is an option of `reproduce stability`, not of `reproduce agents`"]


@pytest.mark.parametrize(
    "experiment, limit",
    [
        ("clusters", "1,250,000 jobs per replica with 16 replicas"),
        ("agents", "20,000,000"),
        ("rybko-stolyar", "20,000,000"),
    ],
)
def test_reproduce_jobs_over_the_limit_are_refused_before_the_folder(tmp_path, capsys, experiment, limit):
    """The runs refused it after the folder was made (an empty folder left), the clusters'
    error naming 16 times the number given and a duration_s the experiment does not take."""
    out = tmp_path / "out"
    flags = ["reproduce", experiment, "--num-requests", "30000000", "--workers", "1", "--out", str(out)]
    one_line_error(capsys, flags, f"num_jobs must be at most {limit}, got 30,000,000")
    assert not out.exists()


def test_json_alone_writes_nothing_and_a_rerun_leaves_no_stale_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small = [
        "--cost-model",
        "paper",
        "--rate",
        "5",
        "--num-requests",
        "50",
        "--prompt",
        "const:20",
        "--output",
        "const:5",
    ]
    assert main(["simulate", *small, "--json"]) == 0
    assert not (tmp_path / "results").exists()
    out = tmp_path / "run"
    assert main(["simulate", *small, "--out", str(out), "--steps", "--quiet"]) == 0
    (out / "queue.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # a figure of this run
    assert (out / "steps.csv").is_file()
    assert main(["simulate", *small, "--out", str(out), "--quiet"]) == 0
    assert not (out / "steps.csv").exists() and not (out / "queue.png").exists()
    assert (out / "requests.csv").is_file()


def test_yaml_configs_merge_reproduce_and_suggest(tmp_path, capsys):
    import yaml

    # the shipped example runs (shortened), and a run's own config.json reproduces it
    out = tmp_path / "a"
    assert (
        main(
            [
                "simulate",
                "--config",
                "examples/configs/simulate.yaml",
                "--num-requests",
                "300",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    first = json.loads(capsys.readouterr().out)
    assert set(first["tags"]) == {"chat", "summarise"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["provenance"]["llmsched_version"] and "time_utc" in cfg["provenance"]
    assert main(["simulate", "--config", str(out / "config.json"), "--out", "", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("completed", "mean_ttft_ms", "p99_itl_ms", "steps"):
        assert again[key] == first[key]
    # a workload section fills in the defaults key by key, as --rate does
    (tmp_path / "w.yaml").write_text(
        yaml.safe_dump({"cost_model": "paper", "workload": {"rate": 5, "num_requests": 60}})
    )
    assert main(["simulate", "--config", str(tmp_path / "w.yaml"), "--out", "", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 60
    # typos get a suggestion, in one line
    (tmp_path / "t.yaml").write_text("bmax: 256\n")
    assert main(["simulate", "--config", str(tmp_path / "t.yaml"), "--out", ""]) == 2
    assert "did you mean 'b_max'" in capsys.readouterr().err
    (tmp_path / "t2.yaml").write_text("workload: {rte: 3}\n")
    assert main(["simulate", "--config", str(tmp_path / "t2.yaml"), "--out", ""]) == 2
    assert "did you mean 'rate'" in capsys.readouterr().err


def test_slo_goodput_and_twp_target(capsys):
    base = [
        "simulate",
        "--cost-model",
        "paper",
        "--rate",
        "6",
        "--prompt",
        "geometric:200",
        "--output",
        "geometric:100",
        "--num-requests",
        "800",
        "--out",
        "",
        "--json",
    ]
    assert main([*base, "--admission", "twp", "--slo", "itl_p99_ms=80", "--slo", "ttft_ms=3000"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["slo"] == {"itl_ms": 80.0, "ttft_ms": 3000.0} and 0 < s["goodput_share"] <= 1
    assert s["goodput"] <= s["request_throughput"] + 1e-9
    # a limit nobody meets gives no goodput; a generous one counts every request
    assert main([*base, "--slo", "ttft_ms=0.001"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"] == 0
    assert main([*base, "--slo", "e2el_ms=1e9"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput_share"] == 1.0
    # TWP takes the objective as its ITL target
    import llmsched

    r = llmsched.simulate(
        cost_model="paper", admission="twp", slo={"itl_p99_ms": 80}, rate=2, num_requests=50, verdict=False
    )
    assert r.config["admission_options"] == {} and r.summary["slo"] == {"itl_ms": 80.0}


def test_network_arrivals_past_the_clock_are_one_line_exit_2(tmp_path, capsys):
    """A rate of 1e-300 jobs/s puts the arrivals past any clock: it crashed the network
    simulator (a TypeError after an int64 overflow)."""
    f = tmp_path / "slow.yaml"
    f.write_text(
        "servers:\n  s: {cost_model: paper}\njobs:\n  A:\n    arrival: {process: poisson, rate: 1e-300}\n"
        "    route:\n      - call: {server: s, prompt: const:10, output: const:5}\nnum_jobs: 5\n"
    )
    assert main(["simulate", "--network", str(f), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "arrival times must be below 1e+09 s" in err[0], err


def test_reproduce_findings_print_one_row_per_finding():
    """`reproduce clusters|agents|rybko-stolyar` print their summary's findings one per row
    (they printed whole JSON objects in one cell)."""
    from llmsched.cli.analysis import _finding_rows

    summary = {
        "dag": {"bottleneck": "writer", "critical_scale": 2.7200239022100408, "utilisation": {"s1": 0.85}},
        "verdicts": ["stable", "unstable"],
        "peaks": [33408.0, 128.0],
        "by_load": [{"load": 0.5, "best": "jsq"}, {"load": 0.9, "best": None}],
        "empty": [],
        "ok": True,
    }
    assert list(_finding_rows("", summary)) == [
        ("dag.bottleneck", "writer"),
        ("dag.critical_scale", "2.72"),
        ("dag.utilisation.s1", "0.85"),
        ("verdicts", "stable, unstable"),
        ("peaks", "33,408, 128"),
        ("by_load[0].load", "0.5"),
        ("by_load[0].best", "jsq"),
        ("by_load[1].load", "0.9"),
        ("by_load[1].best", "None"),
        ("empty", "(none)"),
        ("ok", "True"),
    ]


PROFILE = "llama-3-8b"  # of the shipped h200 tables, named below by a relative path


@pytest.mark.parametrize("kind", ["single", "network", "serverless"])
def test_a_run_config_names_its_files_absolute_so_it_reruns_from_anywhere(tmp_path, monkeypatch, capsys, kind):
    # config.json kept relative paths as written: a rerun from another folder found no file
    here, elsewhere = tmp_path / "a", tmp_path / "b"
    (here / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    trace = here / "sub" / "t.csv"
    rows = "".join(f"{i / 4},{20 + i},{3 + i % 4}\n" for i in range(40))
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    profile = os.path.relpath(PROFILES_DIR / "h200", here)
    monkeypatch.chdir(here)
    if kind == "single":
        argv = ["simulate", "--trace", "sub/t.csv", "--cost-model", f"profile:{profile}#{PROFILE}"]
        flag, table = "--config", "requests.csv"
    elif kind == "network":
        laws = {"prompt": "empirical:sub/t.csv:prompt_tokens", "output": "replay:sub/t.csv:output_tokens"}
        net = {
            "servers": {"s": {"cost_model": f"profile:{profile}#{PROFILE}"}},
            "jobs": {
                "j": {"arrival": {"process": "poisson", "rate": 2.0}, "route": [{"call": {"server": "s", **laws}}]}
            },
            "num_jobs": 30,
        }
        (here / "net.json").write_text(json.dumps(net))
        argv, flag, table = ["simulate", "--network", "net.json"], "--network", "jobs.csv"
    else:
        platform = {
            "cluster": {"nodes": [{"name": "n", "gpus": 1, "gpu_memory_gb": 80}]},
            "models": {"m": {"weights_gb": 16, "cost_model": f"profile:{profile}#{PROFILE}"}},
            "workload": {"trace": "sub/t.csv"},
        }
        (here / "p.json").write_text(json.dumps(platform))
        argv, flag, table = ["simulate", "--serverless", "p.json"], "--serverless", "requests.csv"
    assert main([*argv, "--out", "run", "--quiet"]) == 0
    config = json.loads((here / "run" / "config.json").read_text())
    # what a rerun reads (the output-only keys record the command line and labels as given)
    named = [s for s in _strings({k: v for k, v in config.items() if k not in OUTPUT_ONLY_KEYS}) if "/" in s]
    assert named and all(str(trace) in s or str(PROFILES_DIR / "h200") in s for s in named), named
    assert sum(str(trace) in s for s in named) == (2 if kind == "network" else 1)
    monkeypatch.chdir(elsewhere)
    assert main(["simulate", flag, str(here / "run" / "config.json"), "--out", "again", "--quiet"]) == 0, (
        capsys.readouterr().err
    )
    assert (elsewhere / "again" / table).read_text() == (here / "run" / table).read_text()


def test_a_dataset_name_is_recorded_as_written(tmp_path, monkeypatch):
    # a path as given and a law's own text keep a dataset's name (labels, sweep points); a
    # run's config.json records the file it resolved to instead (test_rerun_config.py)
    monkeypatch.chdir(tmp_path)
    assert recorded_path("azure-conv") == "azure-conv" and parse_length_law("sharegpt", "prompt").to_str() == "sharegpt"
    (tmp_path / "azure-conv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    assert recorded_path("azure-conv") == str(tmp_path / "azure-conv")  # a file of that name is read instead


def test_network_summary_prints_fill_and_cache_hit_utilisations_together(monkeypatch):
    """With `utilisation_net_of_hits` present the net-of-hits text replaced the
    fill-capacity one, so a server over what filling steps to b_max serves read as below
    capacity."""
    from types import SimpleNamespace

    from llmsched.cli import simulate as sim_cli

    printed = {}
    monkeypatch.setattr(sim_cli, "print_table", lambda title, rows, head=None: printed.update(rows))
    server = {"replicas": [0], "calls": 10, "p99_ttft_ms": 1.0, "verdict": "stable", "prefix_cache": None}
    servers = {
        "a": {**server, "utilisation": 0.5, "fill_utilisation": 1.2, "utilisation_net_of_hits": 0.4},
        "b": {**server, "utilisation": 0.5, "fill_utilisation": 0.5, "utilisation_net_of_hits": 0.4},
        "c": {**server, "utilisation": 0.5, "fill_utilisation": 1.2},
    }
    summary = {
        "num_calls": 30,
        "completed_jobs": 5,
        "arrived_jobs": 5,
        "num_jobs": 5,
        "job_throughput": 1.0,
        "mean_job_latency_ms": 1.0,
        "p50_job_latency_ms": 1.0,
        "p99_job_latency_ms": 1.0,
        "servers": servers,
        "bottleneck": None,
        "verdict": "stable",
        "wall_s": 0.1,
    }
    sim_cli.print_network_summary(SimpleNamespace(summary=summary))
    rows = {k.split(" (")[0]: v for k, v in printed.items() if k.startswith("server ")}
    assert rows["server a"].startswith(
        "load 120.0% of what filling steps to b_max serves (50.0% of the best policy's; 40.0% net of cache hits), "
    )
    assert rows["server b"].startswith("load 50.0% of capacity (40.0% net of cache hits), ")
    assert rows["server c"].startswith(
        "load 120.0% of what filling steps to b_max serves (50.0% of the best policy's), "
    )


def test_a_network_runs_config_json_records_its_run_options_and_reproduces_it(tmp_path):
    """`--max-time` (and `--exact`, `--sample-interval`) were not in config.json: rerun from
    it, a run stopped at 5 s ran to its end (12.5 s)."""
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--num-requests", "200", "--max-time", "5", "--exact", "--sample-interval", "0.01", "--quiet"]
    assert main(["simulate", "--network", "examples/networks/cluster.yaml", *args, "--out", str(a)]) == 0
    run = json.loads((a / "config.json").read_text())["run"]
    assert run == {"max_time_s": 5.0, "sample_interval_s": 0.01, "fast": False}
    assert main(["simulate", "--network", str(a / "config.json"), "--quiet", "--out", str(b)]) == 0
    for name in ("calls.csv", "jobs.csv", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa["duration"] == sb["duration"] < 5.1
    # an argument given replaces the file's
    from llmsched.sim.network_result import simulate_network

    longer = simulate_network(a / "config.json", max_time_s=8.0)
    assert longer.config["run"]["max_time_s"] == 8.0 and longer.summary["duration"] > sa["duration"]


@pytest.mark.parametrize(
    "run, message",
    [
        ({"max_time_s": -1}, "run.max_time_s"),
        ({"fast": "yes"}, "run.fast: must be true or false"),
        ({"sample_interval": 1}, "unknown"),
        ([1], "run"),
    ],
)
def test_a_bad_run_section_is_one_line(tmp_path, capsys, run, message):
    import yaml

    spec = yaml.safe_load(open("examples/networks/cluster.yaml"))
    spec["run"] = run
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["simulate", "--network", str(path), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_call_over_the_kv_capacity_names_the_file_and_key_or_the_flag(tmp_path, capsys):
    """Found mid-run (the call's prompt holds the resent context), the error named neither
    the network file nor, for a cluster, --kv-capacity: only "raise kv_capacity"."""
    net = tmp_path / "agent.yaml"
    net.write_text(
        "servers:\n  s1: {policy: sarathi, b_max: 256, cost_model: paper}\n"
        "  s2: {policy: sarathi, b_max: 256, cost_model: paper, kv_capacity: 500}\n"
        "jobs:\n  A:\n    arrival: {process: poisson, rate: 1.0}\n    route:\n"
        "      - call: {server: s1, prompt: 200, output: 100}\n"
        "      - call: {server: s2, prompt: 150, output: 100, context: true}\n"
        "num_jobs: 10\n"
    )
    err = one_line_error(capsys, ["simulate", "--network", str(net), "--out", ""])
    assert err.endswith(
        "agent.yaml: a call of class 'A.2' (job 0) needs 549 KV tokens (prompt 450 + output 100 - 1) but the "
        "KV capacity (servers.s2.kv_capacity) is 500: it can never complete (raise it, or bound the context "
        "its route resends)"
    )
    cluster = ["simulate", "--replicas", "2", "--prompt", "200", "--output", "10", "--num-requests", "5"]
    err = one_line_error(capsys, [*cluster, "--kv-capacity", "100", "--out", ""])
    # one server's words (request 0 needs 209 KV tokens ...), and the flag that sets the capacity
    assert err.endswith(
        "request 0 needs 209 KV tokens (prompt 200 + output 10 - 1) but the KV capacity (--kv-capacity) is 100: "
        "it can never complete (raise it)"
    )


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--policy", "foo"], "unknown batch policy 'foo' (known: "),
        (["--admission", "twp", "--admission-option", "beta=2"], "twp: beta must be a number > 0 and < 1, got 2"),
        (["--cost-model", "const:1e9"], "const cost model times must be at most 1e+06 ms, got 1e+09 ms"),
        (["--router", "foo"], "unknown router 'foo'; known: random, "),
        (["--replicas", "5000"], "replicas must be at most 4,096, got 5000"),
    ],
)
def test_a_cluster_from_the_flags_is_refused_in_the_flags_words(capsys, flags, said):
    """Its errors named servers.cluster, a key of the network the flags generate, which the
    user never wrote (`servers.cluster: unknown batch policy 'foo'`); now one server's words."""
    cluster = ["simulate", "--replicas", "2", "--cost-model", "paper", "--num-requests", "5", "--out", ""]
    err = one_line_error(capsys, [*cluster, *flags], said)
    assert "servers.cluster" not in err, err


def test_a_call_over_the_kv_capacity_of_cluster_network_names_its_keyword(tmp_path):
    """From Python the error named servers.cluster.kv_capacity, a key of the network
    cluster_network generated, not the kv_capacity= the caller gave it."""
    import pickle

    import llmsched
    from llmsched.core.errors import ConfigError

    opts = {"prompt": "200", "output": "10", "num_requests": 5, "cost_model": "paper"}
    with pytest.raises(ConfigError) as e:
        llmsched.simulate_network(llmsched.cluster_network(kv_capacity=100, replicas=2, **opts), scale=2)
    assert str(e.value) == (
        "request 0 needs 209 KV tokens (prompt 200 + output 10 - 1) but the KV capacity "
        "(kv_capacity= of cluster_network) is 100: it can never complete (raise it)"
    )
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kv_capacity: 100\n")
    with pytest.raises(ConfigError, match=r"\(kv_capacity of cluster_network's config\) is 100"):
        llmsched.simulate_network(llmsched.cluster_network(cfg, replicas=2, **opts))
    # the network's own form (to_dict, a file) names its key, as a network file's run does
    net = llmsched.cluster_network(kv_capacity=100, replicas=2, **opts).to_dict()
    with pytest.raises(ConfigError, match=r"\(servers\.cluster\.kv_capacity\) is 100"):
        llmsched.simulate_network(net)


def test_a_call_over_the_kv_capacity_pickles_as_a_worker_process_sends_it(tmp_path):
    """`reproduce` runs networks in worker processes: the error must come back whole."""
    import pickle

    from llmsched.core.errors import ConfigError
    from llmsched.sim.network_result import simulate_network

    net = {
        "servers": {"s": {"policy": "sarathi", "b_max": 256, "cost_model": "paper", "kv_capacity": 100}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [{"call": {"server": "s", "prompt": 200, "output": 10}}],
            }
        },
        "num_jobs": 3,
    }
    with pytest.raises(ConfigError) as e:
        simulate_network(net)
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is type(e.value) and str(back) == str(e.value)
    assert str(back).startswith("a call of class 'A.1' (job 0) needs 209 KV tokens (prompt 200 + output 10 - 1)")
    assert "(servers.s.kv_capacity) is 100" in str(back)
