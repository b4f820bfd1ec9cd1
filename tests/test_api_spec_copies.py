"""A network's or a serverless platform's result describes the run that was made: the spec a
caller passes is copied whole, so editing it after the call (the next point of a loop) does
not change the earlier result's summary; `simulate_serverless(out_dir=...)` refuses a folder
it may not write into before the run, not after it."""

import pytest

import llmsched
from llmsched.core.errors import ConfigError
from llmsched.sim.serverless_result import simulate_serverless
from llmsched.workload.network import NetworkSpec
from llmsched.workload.serverless import load_serverless


def test_a_serverless_result_keeps_its_scheduler_when_the_spec_is_edited_after():
    spec = load_serverless("examples/serverless/small.yaml")
    spec.platform.scheduler = "fcfs"
    first = simulate_serverless(spec, max_time_s=20)  # (no option that rebuilds the spec)
    spec.platform.scheduler = "twp"  # the next run of a loop over schedulers
    for m in spec.models.values():
        m.b_max = 64
    assert first.summary["scheduler"] == "fcfs"
    assert {m["admission"] for m in first.summary["models"].values()} == {"fcfs"}
    fresh = simulate_serverless("examples/serverless/small.yaml", scheduler="fcfs", max_time_s=20)
    assert first.summary["models"] == fresh.summary["models"]


def test_a_network_result_keeps_its_servers_when_the_spec_is_edited_after():
    spec = NetworkSpec.from_yaml("examples/networks/tandem.yaml")
    first = llmsched.simulate_network(spec, num_jobs=200)
    for s in spec.servers.values():  # the next point of a b_max sweep
        s.b_max = 128
    fresh = llmsched.simulate_network(NetworkSpec.from_yaml("examples/networks/tandem.yaml"), num_jobs=200).summary
    assert first.summary["servers"] == fresh["servers"]
    assert first.summary["network_work_verdict"] == fresh["network_work_verdict"]


def test_simulate_serverless_refuses_a_folder_before_the_run(tmp_path, monkeypatch):
    import llmsched.sim.serverless_result as sr

    (tmp_path / "requests.csv").write_text("mine\n")
    monkeypatch.setattr(sr, "run_serverless", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(ConfigError, match="holds 'requests.csv'"):
        simulate_serverless("examples/serverless/small.yaml", out_dir=tmp_path)
    assert (tmp_path / "requests.csv").read_text() == "mine\n"
