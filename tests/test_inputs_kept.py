"""A run never replaces or removes a file it reads: a trace, a `replay:` table or a
serverless platform's trace that sits in the run's own output folder under a name the
run writes (requests.csv, a stale requests.parquet, a network replica's files) is
refused with one line (exit code 2), before the run, and stays byte for byte."""

import os

import pytest
from helpers import one_line_error

from llmsched import simulate
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.sim.network_result import simulate_network
from llmsched.sim.serverless_result import simulate_serverless

SMALL = ["--cost-model", "paper", "--quiet"]


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A finished single-server run's folder, results/, in the current folder."""
    monkeypatch.chdir(tmp_path)
    simulate(rate=5, num_requests=60, cost_model="paper", out_dir="results")
    return tmp_path / "results"


def _refused(capsys, argv, kept, named=None):
    before = kept.read_bytes()
    one_line_error(capsys, argv, named or str(kept.relative_to(os.getcwd())), "would replace")
    assert kept.read_bytes() == before


def test_trace_in_its_out_folder_is_refused_and_kept(run_dir, capsys):
    argv = ["simulate", "--trace", "results/requests.csv", "--rate", "2", "--num-requests", "20", *SMALL]
    _refused(capsys, argv, run_dir / "requests.csv")
    assert (run_dir / "summary.json").exists()  # (the earlier run's files stay too)


def test_parquet_trace_a_run_would_remove_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    simulate(rate=5, num_requests=60, cost_model="paper", out_dir="results", parquet=True)
    # (a run without --parquet removes the earlier run's Parquet tables as stale)
    _refused(capsys, ["simulate", "--trace", "results/requests.parquet", *SMALL], tmp_path / "results/requests.parquet")


def test_replay_law_from_its_out_folder_is_refused(run_dir, capsys):
    argv = ["simulate", "--prompt", "replay:results/requests.csv:prompt_tokens"]
    argv += ["--output", "replay:results/requests.csv:output_tokens", "--rate", "2", "--num-requests", "20", *SMALL]
    _refused(capsys, argv, run_dir / "requests.csv")


def test_trace_reached_through_links_is_refused(run_dir, capsys):
    (run_dir.parent / "link.csv").symlink_to(run_dir / "requests.csv")  # a link to the run's file
    (run_dir.parent / "same").symlink_to(run_dir)  # the folder by another name
    for trace in ("link.csv", "same/requests.csv"):
        argv = ["simulate", "--trace", trace, "--num-requests", "20", *SMALL]
        _refused(capsys, argv, run_dir / "requests.csv", trace)


def test_trace_under_another_name_in_the_out_folder_runs_and_stays(run_dir):
    mine = run_dir / "my_trace.csv"
    mine.write_bytes((run_dir / "requests.csv").read_bytes())
    before = mine.read_bytes()
    simulate(trace="results/my_trace.csv", num_requests=20, cost_model="paper", out_dir="results")
    assert mine.read_bytes() == before
    assert (run_dir / "summary.json").exists()


def test_result_write_over_its_own_trace_is_refused(run_dir):
    before = (run_dir / "requests.csv").read_bytes()
    result = simulate(trace="results/requests.csv", num_requests=20, cost_model="paper")
    with pytest.raises(ConfigError, match="would replace"):
        result.write("results")
    assert (run_dir / "requests.csv").read_bytes() == before


SERVERLESS = """cluster:
  nodes:
    - {name: node, count: 1, gpus: 2, gpu_memory_gb: 80}
models:
  m1: {weights_gb: 16, kv_bytes_per_token: 131072, cost_model: paper}
workload:
  WORKLOAD
  num_requests: 30
"""


def test_serverless_trace_in_its_out_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gen.yaml").write_text(SERVERLESS.replace("WORKLOAD", "rate: 5"))
    simulate_serverless("gen.yaml", out_dir="out")
    (tmp_path / "replay.yaml").write_text(SERVERLESS.replace("WORKLOAD", "trace: out/requests.csv"))
    _refused(
        capsys, ["simulate", "--serverless", "replay.yaml", "--out", "out", "--quiet"], tmp_path / "out/requests.csv"
    )
    with pytest.raises(ConfigError, match="would replace"):
        simulate_serverless("replay.yaml", out_dir="out")
    simulate_serverless("replay.yaml", out_dir="elsewhere")  # (another folder: runs)


NETWORK = """servers:
  s1: {policy: sarathi, b_max: 512, cost_model: paper}
jobs:
  req:
    arrival: {process: poisson, rate: 3.0}
    route:
      - call: {server: s1, prompt: "replay:TABLE:prompt_tokens", output: const:20}
num_jobs: 30
"""


def test_network_replay_table_in_its_out_folder_is_refused(run_dir, capsys):
    net = run_dir.parent / "net.yaml"
    net.write_text(NETWORK.replace("TABLE", "results/requests.csv"))
    _refused(capsys, ["simulate", "--network", "net.yaml", "--out", "results", "--quiet"], run_dir / "requests.csv")
    # a replica's file that a rerun into the network's folder would replace
    simulate_network("net.yaml", out_dir="net")
    net.write_text(NETWORK.replace("TABLE", "net/servers/s1/requests.csv"))
    replica = run_dir.parent / "net/servers/s1/requests.csv"
    before = replica.read_bytes()
    with pytest.raises(ConfigError, match="servers/s1/requests.csv"):
        simulate_network("net.yaml", out_dir="net")
    assert replica.read_bytes() == before


@pytest.mark.parametrize("name, search", [("search.csv", False), ("results.csv", True)])
def test_a_sweep_s_trace_in_its_out_folder_is_refused_and_kept(run_dir, tmp_path, capsys, name, search):
    """A sweep removed a file of its own kind left from an earlier sweep (search.csv after a
    plain sweep, results.csv after a search) after its runs: a trace kept there was lost."""
    out = tmp_path / "sw"
    first = ["sweep", "--trace", "results/requests.csv", "--grid", "policy=orca", "--out", "sw", *SMALL]
    assert main(first + ([] if search else ["--search", "max-stable-rate", "--tol", "0.5"])) == 0
    (out / name).write_bytes((run_dir / "requests.csv").read_bytes())
    files = sorted(p.name for p in out.iterdir())
    argv = ["sweep", "--trace", f"sw/{name}", "--grid", "policy=orca,sarathi", "--out", "sw", *SMALL]
    if search:
        argv += ["--search", "max-stable-rate"]
    capsys.readouterr()
    _refused(capsys, argv, out / name)
    assert sorted(p.name for p in out.iterdir()) == files  # nothing run, nothing written
