"""Network runs: the workload a network's calls draw, the inputs `simulate_network` refuses,
runs stopped by `max_time_s`, back-pressure with routers, and the files' consistency."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import TRACES, one_line_error

from llmsched.analysis import reproduce_networks as rn
from llmsched.cli import main
from llmsched.core import ConfigError
from llmsched.core.request import NS
from llmsched.sim.network import run_network, stream_entropy
from llmsched.sim.network_result import network_backlog, simulate_network
from llmsched.theory.network import traffic
from llmsched.workload import WorkloadSpec, make_trace, parse_length_law
from llmsched.workload.network import NetworkSpec

ARXIV = TRACES / "arxiv_lengths" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"


def _a(col):
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)


def _cluster(prompt: str, output: str, num_jobs: int, **server) -> NetworkSpec:
    srv = {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "replicas": 2, "router": "jsq", **server}
    return NetworkSpec.from_dict(
        {
            "servers": {"s": srv},
            "jobs": {
                "A": {
                    "arrival": {"process": "poisson", "rate": 0.5},
                    "route": [{"call": {"server": "s", "prompt": prompt, "output": output}}],
                }
            },
            "num_jobs": num_jobs,
        }
    )


def test_a_call_on_one_dataset_draws_prompt_and_output_from_the_same_row():
    # the README: prompt and output are "sampled jointly when prompt and output come from the
    # same file"; a network's calls drew them independently (22 of 2,000 pairs existed)
    rows = np.loadtxt(ARXIV, delimiter=",", skiprows=1, usecols=(0, 1))
    prompts, outputs = np.maximum(rows[:, 0], 1).astype(int), np.maximum(rows[:, 1], 1).astype(int)
    pairs = set(zip(prompts.tolist(), outputs.tolist()))
    st = run_network(_cluster("arxiv", "arxiv", 3000))
    p, o = _a(st.call_prompt), _a(st.call_output)
    assert len(p) == 3000
    assert all(pair in pairs for pair in zip(p.tolist(), o.tolist()))
    one = make_trace(WorkloadSpec(arrival="poisson", rate=1, num_requests=3000, prompt="arxiv", output="arxiv"))
    file_corr = np.corrcoef(prompts, outputs)[0, 1]  # about -0.46
    one_corr = np.corrcoef(one.prompt, one.output)[0, 1]
    net_corr = np.corrcoef(p, o)[0, 1]
    assert file_corr < -0.3 and one_corr < -0.3 and net_corr < -0.3
    assert abs(net_corr - file_corr) < 0.1


TANDEM = "examples/networks/tandem.yaml"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_jobs": -1}, "num_jobs must be a whole number >= 1, got -1"),
        ({"num_jobs": 1.5}, "num_jobs must be a whole number >= 1, got 1.5"),
        ({"num_jobs": "many"}, "num_jobs must be a whole number >= 1, got 'many'"),
        ({"num_jobs": True}, "num_jobs must be a whole number >= 1, got True"),
        ({"num_jobs": 1e30}, "num_jobs must be at most 20,000,000 (or give a duration_s), got 1e+30"),
        ({"seed": -1}, "seed must be a whole number >= 0, got -1"),
        ({"seed": 1.5}, "seed must be a whole number >= 0, got 1.5"),
        ({"seed": "x"}, "seed must be a whole number >= 0, got 'x'"),
        ({"fast": "no"}, "fast must be true or false, got 'no'"),
        ({"fast": 0}, "fast must be true or false, got 0"),
    ],
)
def test_simulate_network_refuses_bad_run_options_in_one_line(options, message):
    # numpy raised its own ValueError / TypeError on these; fast="no" ran the fast path
    with pytest.raises(ConfigError) as err:
        simulate_network(TANDEM, **{"num_jobs": 20, **options})
    assert str(err.value) == message


def test_run_options_that_are_whole_numbers_in_another_type_are_taken():
    # as the file's num_jobs and seed are (and one server's seed): 3.0 and numpy's 30 are
    # whole numbers; a string is not, in the file as here
    res = simulate_network(TANDEM, num_jobs=np.int64(30), seed=3.0)
    assert res.summary["num_jobs"] == 30 and res.config["seed"] == 3
    with pytest.raises(ConfigError, match=r"^num_jobs must be a whole number >= 1, got '30' \(a number in quotes"):
        simulate_network(TANDEM, num_jobs="30")


def test_simulate_network_leaves_the_callers_spec_unchanged():
    spec = NetworkSpec.from_yaml(TANDEM)
    res = simulate_network(spec, num_jobs=25, seed=4)
    assert (spec.num_jobs, spec.seed) == (20000, 0)
    assert (res.summary["num_jobs"], res.config["seed"]) == (25, 4)


def _no_nan(text: str):
    """json.loads that fails on NaN / Infinity (JSON has neither)."""

    def refuse(name):
        raise AssertionError(f"{name} in a summary")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "network",
    [
        TANDEM,
        _cluster("geometric:100", "geometric:20", 50),
        {**_cluster("geometric:100", "geometric:20", 50).to_dict(), "control": "backpressure"},
    ],
    ids=["tandem", "cluster", "backpressure"],
)
def test_a_run_stopped_before_the_first_job_arrives_writes_an_empty_result(network, tmp_path):
    # it raised numpy's "zero-size array to reduction operation minimum"; one server writes a
    # summary with nothing completed, and so does a network now
    first = simulate_network(network, num_jobs=50).job_arrival_ns.min() / 1e9
    stop = first / 2
    res = simulate_network(network, num_jobs=50, max_time_s=stop, out_dir=tmp_path)
    s = _no_nan((tmp_path / "summary.json").read_text())
    assert (s["arrived_jobs"], s["completed_jobs"], s["num_calls"], s["steps"]) == (0, 0, 0, 0)
    assert s["num_jobs"] == s["unfinished_jobs"] == 50  # listed, never arrived (as one server's requests)
    assert s["job_throughput"] == 0.0 and s["mean_job_latency_ms"] is None
    assert s["verdict"] == "inconclusive" and s["network_work_verdict"]["verdict"] == "inconclusive"
    for srv in s["servers"].values():
        assert (srv["calls"], srv["completed_calls"]) == (0, 0)
    jobs = np.genfromtxt(tmp_path / "jobs.csv", delimiter=",", names=True, dtype=None, encoding="utf-8")
    assert len(jobs) == 50 and (jobs["arrived"] == 0).all() and (jobs["calls"] == 0).all()
    assert (tmp_path / "calls.csv").read_text().count("\n") == 1
    for rep in res.stats.replicas:
        folder = tmp_path / "servers" / rep["name"]
        assert _no_nan((folder / "summary.json").read_text())["completed"] == 0
        assert (folder / "requests.csv").is_file() and (folder / "timeseries.csv").is_file()
    assert network_backlog(res)["arrival_end_s"] is None


@pytest.mark.parametrize(
    "args",
    [
        ["--network", TANDEM, "--max-time", "0.2"],
        ["--replicas", "2", "--cost-model", "paper", "--max-time", "0.01"],
    ],
)
def test_the_command_line_writes_a_run_stopped_before_the_first_arrival(args, tmp_path, capsys):
    assert main(["simulate", *args, "--out", str(tmp_path), "--quiet"]) == 0
    s = _no_nan((tmp_path / "summary.json").read_text())
    assert (s["arrived_jobs"], s["completed_jobs"]) == (0, 0) and s["num_jobs"] > 0


def _backpressure_pool(router: str, **options) -> NetworkSpec:
    d = _cluster("geometric:100", "geometric:50", 3000, replicas=3, router=router, **options).to_dict()
    d["control"] = "backpressure"
    d["jobs"]["A"]["arrival"]["rate"] = 1.0
    return NetworkSpec.from_dict(d)


def test_backpressure_routes_by_the_servers_router_and_weights():
    # back-pressure buffered calls at the pool and let any free replica take them: the
    # weight-0 replica got a third of the calls, while `capacity` counted the weights
    spec = _backpressure_pool("random", router_options={"weights": [1, 0, 2]})
    st = run_network(spec)
    counts = np.bincount(_a(st.call_replica), minlength=3)
    assert counts.sum() == 3000 and counts[1] == 0
    share = counts.max() / counts.sum()
    assert abs(share - 2 / 3) < 0.03
    assert traffic(spec).server("s").busiest_replica_share == 2 / 3  # what the capacity report uses
    assert (_a(st.call_e2e) >= 0).all()  # every call still ran


def test_backpressure_round_robin_deals_the_calls_in_turn():
    st = run_network(_backpressure_pool("round-robin"))
    assert (_a(st.call_replica) == np.arange(3000) % 3).all()


def test_jobs_csv_counts_the_calls_of_unfinished_jobs_as_calls_csv_lists_them(tmp_path):
    # `calls` was set when a job finished only: 30 of 54 jobs of this run said 0
    simulate_network(TANDEM, num_jobs=300, max_time_s=20, out_dir=tmp_path)
    jobs = np.genfromtxt(tmp_path / "jobs.csv", delimiter=",", names=True, dtype=None, encoding="utf-8")
    calls = np.genfromtxt(tmp_path / "calls.csv", delimiter=",", names=True, dtype=None, encoding="utf-8")
    listed = np.bincount(calls["job"], minlength=len(jobs))
    assert (jobs["calls"] == listed).all()
    unfinished = (jobs["finished"] == 0) & (jobs["arrived"] == 1)
    assert unfinished.sum() > 10 and (jobs["calls"][unfinished] > 0).all()


@pytest.mark.parametrize("experiment", ["clusters", "agents", "rybko-stolyar"])
def test_reproduce_refuses_a_repeated_seed_before_running(experiment, tmp_path, capsys):
    # --seeds 0,0 ran every cell twice: duplicate rows in table.csv
    out = tmp_path / "out"
    assert main(["reproduce", experiment, "--quick", "--seeds", "0,0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("seed 0 is given twice: each seed runs every cell once, list it once")
    assert len(err.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("seeds", "message"), [([1, 2, 1], "seed 1 is given twice"), ([-1], "got -1"), ([0.5], "got 0.5")]
)
def test_reproduce_functions_refuse_bad_seeds(seeds, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        rn.reproduce_rybko_stolyar(out_dir=tmp_path, quick=True, seeds=seeds)


def test_a_folder_given_as_the_network_file_is_called_a_folder(tmp_path, capsys):
    with pytest.raises(ConfigError) as err:
        NetworkSpec.from_yaml(tmp_path)
    assert str(err.value) == f"network file {str(tmp_path)!r} is a folder, not a file: give the YAML file's path"
    assert main(["capacity", "--network", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="does not exist"):  # a missing path still says so
        NetworkSpec.from_yaml(tmp_path / "missing.yaml")


def test_a_replay_law_reads_the_files_rows_in_order_past_the_first_block():
    # the network draws lengths 4,096 at a time; a replay law restarted at row 0 each block
    values = parse_length_law("replay:sharegpt", "prompt").values()
    d = {
        "servers": {"s": {"cost_model": "const:1"}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 0.01},
                "route": [{"call": {"server": "s", "prompt": "replay:sharegpt", "output": "replay:sharegpt"}}],
            }
        },
        "num_jobs": 9000,
    }
    st = run_network(NetworkSpec.from_dict(d))
    rows = np.arange(9000) % len(values)
    assert (_a(st.call_prompt) == values[rows]).all()
    outputs = parse_length_law("replay:sharegpt", "output").values()
    assert (_a(st.call_output) == outputs[rows]).all()


@pytest.mark.parametrize("command", ["simulate", "capacity"])
@pytest.mark.parametrize(
    "field, message",
    [
        ("policy: foo", "servers.s1: unknown batch policy 'foo'"),
        ("policy: sarathi, admission: bogus", "servers.s1: unknown admission policy 'bogus'"),
    ],
)
def test_a_servers_scheduler_is_checked_naming_it_and_the_file(capsys, tmp_path, command, field, message):
    """`capacity --network` reported on an unknown policy; `simulate --network` refused it
    without saying which server or file."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "examples", "networks", "tandem.yaml")).read()
    assert "policy: sarathi" in text
    f = tmp_path / "n.yaml"
    f.write_text(text.replace("policy: sarathi", field))
    argv = [command, "--network", str(f)] + (["--out", ""] if command == "simulate" else [])
    one_line_error(capsys, argv, "n.yaml: " + message)


def test_a_file_with_neither_num_jobs_nor_duration_is_one_line_naming_the_file(capsys, tmp_path):
    """The file's other errors name it; this one named neither the file nor where to look."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "examples", "networks", "tandem.yaml")).read()
    f = tmp_path / "n.yaml"
    f.write_text(text.replace("num_jobs: 20000", ""))
    one_line_error(capsys, ["simulate", "--network", str(f), "--out", ""], "n.yaml: give num_jobs or duration_s")
    assert main(["simulate", "--network", str(f), "--num-requests", "5", "--out", "", "--quiet"]) == 0
    with pytest.raises(ConfigError, match="^give num_jobs or duration_s"):  # (no file: nothing to name)
        simulate_network(NetworkSpec.from_yaml(f))


def _common_and_rare(num_jobs: int, rare_rate: float, common_rate: float = 1e-3) -> dict:
    call = {"call": {"server": "s", "prompt": 5, "output": 1}}
    return {
        "servers": {"s": {"b_max": 64}},
        "jobs": {
            "common": {"arrival": {"rate": common_rate}, "route": [call]},
            "rare": {"arrival": {"rate": rare_rate}, "route": [call]},
        },
        "num_jobs": num_jobs,
    }


def test_a_rare_job_types_unused_arrivals_past_the_time_limit_do_not_refuse_the_network():
    """Each type draws num_jobs arrivals and the merge keeps num_jobs of them all: the rare
    type's 3,000th, near 1.5e9 s, is never used, and was refused as past the 1e9 s limit."""
    spec = NetworkSpec.from_dict(_common_and_rare(3000, 2e-6))
    st = run_network(spec)
    arrival, types = _a(st.job_arrival), _a(st.job_type)
    assert len(arrival) == 3000 and arrival.max() < 1e9 * NS
    for ti, job in enumerate(spec.jobs):
        mine = np.sort(arrival[types == ti])
        assert len(mine) > 0  # the rare type's first arrivals are among the jobs
        gaps = np.random.default_rng(stream_entropy(spec.seed, "arrivals", ti)).exponential(1 / job.arrival.rate, 3000)
        assert np.array_equal(mine, np.round(np.cumsum(gaps)[: len(mine)] * NS).astype(np.int64))


def test_arrivals_that_would_be_used_past_the_time_limit_are_refused_naming_the_job_type(capsys, tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text(json.dumps(_common_and_rare(3000, 1e-7)))
    assert main(["simulate", "--network", str(f), "--out", "", "--quiet"]) == 0  # 'common' brings 3,000 in time
    capsys.readouterr()
    f.write_text(json.dumps(_common_and_rare(3000, 1e-7, common_rate=1e-6)))  # 1,000 and 100 by 1e9 s
    one_line_error(
        capsys, ["simulate", "--network", str(f), "--out", ""], "job types 'common', 'rare'", "1e+09 s", "3,000"
    )
    alone = _common_and_rare(40, 1e-8)
    del alone["jobs"]["common"]
    f.write_text(json.dumps(alone))
    one_line_error(capsys, ["simulate", "--network", str(f), "--out", ""], "job type 'rare'", "1e+09 s")


@pytest.mark.parametrize("command", ["simulate", "capacity"])
@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["servers"]["s2"].update(
                replicas=2, router="random", router_options={"weights": [1e308, 1e308]}
            ),
            "n.yaml: servers.s2.router_options: weights must sum to a finite number",
        ),
        (lambda d: d.update(num_jobs=10**30), "n.yaml: num_jobs: num_jobs must be at most 20,000,000"),
        (lambda d: d.update(num_jobs=1e30), "n.yaml: num_jobs: num_jobs must be at most 20,000,000"),
    ],
)
def test_weights_that_overflow_and_a_huge_num_jobs_are_refused_by_both_commands(
    capsys, tmp_path, command, edit, message
):
    """Weights of 1e308 each summed to inf: capacity divided by zero, simulate raised numpy's
    "probabilities do not sum to 1"; num_jobs 1e30 was taken by capacity and refused by
    simulate as "num_requests=1e+30", a name the file does not use."""
    d = NetworkSpec.from_yaml(TANDEM).to_dict()
    edit(d)
    f = tmp_path / "n.yaml"
    f.write_text(json.dumps(d))
    argv = [command, "--network", str(f)] + (["--out", ""] if command == "simulate" else [])
    one_line_error(capsys, argv, message)


def test_a_huge_num_jobs_beside_a_duration_is_taken_as_before():
    # the duration stops the arrivals first, as it does for one server's num_requests
    d = NetworkSpec.from_yaml(TANDEM).to_dict()
    d.update(num_jobs=10**30, duration_s=20)
    res = simulate_network(d)
    assert 0 < res.summary["num_jobs"] < 1000 and res.job_arrival_ns.max() <= 20 * NS
