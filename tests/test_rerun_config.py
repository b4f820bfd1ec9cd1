"""A run's config.json reruns it with `simulate --config`: from another folder, under
another $LLMSCHED_TRACES (a named dataset is recorded as the file it was read from), and
for a cluster's, network's or serverless platform's run too (run as --network /
--serverless would)."""

import json

import numpy as np
import pytest
from helpers import one_line_error

import llmsched
from llmsched.cli import main
from llmsched.core.errors import ConfigError

SHAREGPT = "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
AZURE = "azure_conv_2023/AzureLLMInferenceTrace_conv.csv"


def _traces(folder, seed):
    """A traces folder with small sharegpt and azure-conv files, their values drawn from `seed`."""
    rng = np.random.default_rng(seed)
    p = folder / SHAREGPT
    p.parent.mkdir(parents=True)
    rows = "".join(f"{a},{b}\n" for a, b in rng.integers(1, 400, size=(200, 2)))
    p.write_text("num_prefill_tokens,num_decode_tokens\n" + rows)
    p = folder / AZURE
    p.parent.mkdir(parents=True)
    t = np.cumsum(rng.uniform(0.01, 0.2, 200))
    rows = "".join(
        f"2023-11-16 18:{int(s // 60):02d}:{s % 60:010.7f},{a},{b}\n"
        for s, (a, b) in zip(t, rng.integers(1, 400, size=(200, 2)), strict=True)
    )
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)


@pytest.fixture
def two_traces(tmp_path, monkeypatch):
    """(run folder, rerun folder): the first holds traces folder `traces` (named relatively by
    $LLMSCHED_TRACES, the current folder), the second other files of the same names."""
    here, elsewhere = tmp_path / "a", tmp_path / "b"
    _traces(here / "traces", 1)
    _traces(elsewhere / "traces", 2)
    monkeypatch.chdir(here)
    monkeypatch.setenv("LLMSCHED_TRACES", "traces")
    return here, elsewhere


SERVERLESS = {
    "cluster": {"nodes": [{"name": "n", "gpus": 2, "gpu_memory_gb": 80}]},
    "models": {"m": {"weights_gb": 16, "cost_model": "paper"}},
}

CASES = {
    "lengths": (["--prompt", "sharegpt", "--output", "sharegpt", "--rate", "5"], "--config", "requests.csv"),
    "replay": (["--prompt", "replay:azure-conv", "--output", "sharegpt", "--rate", "5"], "--config", "requests.csv"),
    "trace": (["--arrival", "azure-conv"], "--config", "requests.csv"),
    "cluster": (
        ["--replicas", "2", "--prompt", "sharegpt", "--output", "sharegpt", "--rate", "5"],
        "--network",
        "calls.csv",
    ),
    "serverless-lengths": (
        {**SERVERLESS, "workload": {"rate": 5, "prompt": "sharegpt", "output": "sharegpt", "num_requests": 60}},
        "--serverless",
        "requests.csv",
    ),
    "serverless-trace": (
        {**SERVERLESS, "workload": {"trace": "azure-conv", "num_requests": 60}},
        "--serverless",
        "requests.csv",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_dataset_run_reruns_the_same_under_another_traces_folder(two_traces, monkeypatch, capsys, case):
    # config.json named the dataset alone: a rerun read whatever file the traces folder then
    # held (another $LLMSCHED_TRACES, or a relative one from another folder), exit 0
    here, elsewhere = two_traces
    flags, rerun_flag, table = CASES[case]
    if isinstance(flags, dict):
        (here / "p.json").write_text(json.dumps(flags))
        argv = ["simulate", "--serverless", "p.json"]
    else:
        argv = ["simulate", "--cost-model", "paper", "--num-requests", "60", *flags]
    assert main([*argv, "--out", "run", "--quiet"]) == 0, capsys.readouterr().err
    monkeypatch.chdir(elsewhere)  # its own `traces` holds other lengths and arrivals
    config = str(here / "run" / "config.json")
    assert main(["simulate", rerun_flag, config, "--out", "again", "--quiet"]) == 0, capsys.readouterr().err
    assert (elsewhere / "again" / table).read_text() == (here / "run" / table).read_text()
    # (a run by the name here reads the other files: the test tells them apart)
    other = ["simulate", "--serverless", str(here / "p.json")] if isinstance(flags, dict) else argv
    assert main([*other, "--out", "other", "--quiet"]) == 0
    assert (elsewhere / "other" / table).read_text() != (here / "run" / table).read_text()


def _simulate_paper(num_requests: int, output: str) -> int:
    """`simulate` on the paper model, sharegpt prompts, into `run/`."""
    argv = ["simulate", "--cost-model", "paper", "--num-requests", str(num_requests), "--prompt", "sharegpt"]
    return main([*argv, "--output", output, "--out", "run", "--quiet"])


def test_a_dataset_is_recorded_as_its_file_with_the_column_read(two_traces):
    here, _ = two_traces
    assert _simulate_paper(20, "replay:sharegpt") == 0
    w = json.loads((here / "run" / "config.json").read_text())["workload"]
    path = str((here / "traces" / SHAREGPT).resolve())
    assert (w["prompt"], w["output"]) == (f"empirical:{path}:num_prefill_tokens", f"replay:{path}:num_decode_tokens")


def test_a_config_json_that_names_a_dataset_still_reads_the_traces_folder(two_traces, capsys):
    # the older form (the name alone) reruns as before: from the traces folder
    here, _ = two_traces
    assert _simulate_paper(40, "sharegpt") == 0
    config = json.loads((here / "run" / "config.json").read_text())
    config["workload"].update(prompt="sharegpt", output="sharegpt")
    (here / "old.json").write_text(json.dumps(config))
    assert main(["simulate", "--config", "old.json", "--out", "again", "--quiet"]) == 0, capsys.readouterr().err
    assert (here / "again" / "requests.csv").read_text() == (here / "run" / "requests.csv").read_text()


NETWORK_RUN = ["simulate", "--cost-model", "paper", "--replicas", "2", "--rate", "20", "--num-requests", "80"]
SERVERLESS_PLATFORM = {**SERVERLESS, "workload": {"rate": 5, "num_requests": 60}}


@pytest.mark.parametrize("kind", ["network", "serverless"])
def test_config_takes_a_network_or_serverless_runs_config_json(tmp_path, monkeypatch, capsys, kind):
    # `--config DIR/config.json` stopped with "unknown configuration option 'jobs'" ('cluster')
    monkeypatch.chdir(tmp_path)
    if kind == "network":
        argv, tables = NETWORK_RUN, ("calls.csv", "jobs.csv")
    else:
        (tmp_path / "p.json").write_text(json.dumps(SERVERLESS_PLATFORM))
        argv, tables = ["simulate", "--serverless", "p.json"], ("requests.csv", "instances.csv")
    assert main([*argv, "--out", "run", "--quiet"]) == 0
    assert main(["simulate", "--config", "run/config.json", "--out", "again", "--quiet"]) == 0, capsys.readouterr().err
    for t in tables:
        assert (tmp_path / "again" / t).read_text() == (tmp_path / "run" / t).read_text()
    # the run options --network / --serverless take apply, as there
    assert main(["simulate", "--config", "run/config.json", "--num-requests", "10", "--out", "few", "--quiet"]) == 0
    table = tables[1] if kind == "network" else tables[0]
    assert len((tmp_path / "few" / table).read_text().splitlines()) == 11
    # flags that do not apply: one line naming --config's file and what it runs as
    one_line_error(
        capsys,
        ["simulate", "--config", "run/config.json", "--policy", "vllm", "--out", "x"],
        "--config FILE",
        f"--{kind} FILE",
        "--policy does not apply",
    )
    one_line_error(
        capsys,
        ["simulate", "--config", "run/config.json", "--replicas", "2", "--out", "x"],
        "--config FILE",
        f"--{kind} FILE",
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["network", "serverless"])
def test_a_network_or_platform_as_one_servers_config_is_refused_naming_the_flag(tmp_path, capsys, kind):
    # from Python, and beside a --network / --serverless file (or a pipe the command reads once)
    d = {"servers": {"s": {}}, "jobs": {}} if kind == "network" else SERVERLESS_PLATFORM
    (tmp_path / "c.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=f"configuration .*`llmsched simulate --{kind} FILE` runs it"):
        llmsched.simulate(str(tmp_path / "c.json"))
    one_line_error(
        capsys,
        ["sweep", "--config", str(tmp_path / "c.json"), "--grid", "b_max=256", "--out", str(tmp_path / "s")],
        f"--{kind} FILE",
    )


def test_a_synthetic_runs_config_with_its_requests_csv_reruns_it(tmp_path, capsys):
    """`--config DIR/config.json --trace DIR/requests.csv` of a synthetic run applied the
    config's workload to the file: its rate rescaled the arrivals (9 req/s for the 8.72 the
    gamma draws made), its laws redrew the lengths and its count cut the file."""
    run = tmp_path / "r"
    argv = ["simulate", "--cost-model", "paper", "--arrival", "gamma", "--cv", "3", "--rate", "9"]
    argv += ["--num-requests", "400", "--prompt", "const:400", "--output", "const:50", "--max-time", "20"]
    assert main([*argv, "--out", str(run), "--quiet"]) == 0
    again = tmp_path / "again"
    rerun = ["simulate", "--config", str(run / "config.json"), "--trace", str(run / "requests.csv")]
    assert main([*rerun, "--out", str(again), "--quiet"]) == 0
    a = json.loads((run / "summary.json").read_text())
    b = json.loads((again / "summary.json").read_text())
    assert [k for k in a if k != "wall_s" and a[k] != b.get(k)] == []
    # the Python call with the path, as with Trace.from_csv
    c = llmsched.simulate(str(run / "config.json"), trace=str(run / "requests.csv")).summary
    assert c["offered_rate"] == a["offered_rate"] and c["completed"] == a["completed"]


def test_a_results_folder_or_a_point_record_as_config_says_what_to_give(tmp_path, capsys):
    """A results folder was "give the YAML file's path" (its config.json is one); a sweep's
    point record was "unknown configuration option 'config'"."""
    out = tmp_path / "run"
    assert main(["simulate", "--cost-model", "paper", "--num-requests", "5", "--out", str(out)]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["simulate", "--config", str(out)], "is a folder", str(out / "config.json"))
    config = json.loads((out / "config.json").read_text())
    record = tmp_path / "point.json"
    record.write_text(json.dumps({"key": "abc", "config": config, "summary": {}}))
    one_line_error(capsys, ["simulate", "--config", str(record), "--out", ""], "sweep's point record", "'config'")
    (tmp_path / "only.json").write_text(json.dumps(config))
    assert main(["simulate", "--config", str(tmp_path / "only.json"), "--out", ""]) == 0
