"""The network reproductions (`llmsched.analysis.reproduce_networks`): quick modes run,
write their files, and measure what the docs claim; the network's unfinished work
against a direct count."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmsched.analysis import reproduce_networks as rn
from llmsched.core.errors import ConfigError
from llmsched.sim.network_result import simulate_network
from llmsched.theory.network import traffic


def _files_ok(res: dict, names: list[str]) -> None:
    written = {p.rsplit("/", 1)[-1] for p in res["files"]}
    for name in names:
        assert name in written
    for p in res["files"]:
        with open(p, "rb") as f:
            head = f.read(8)
        assert head  # written, not empty
        if p.endswith(".png"):
            assert head.startswith(b"\x89PNG")
    json.dumps(res, default=str)


def test_clusters_quick_jsq_beats_random_and_light_load_is_stable(tmp_path):
    res = rn.reproduce_clusters(out_dir=tmp_path, quick=True)
    _files_ok(res, ["clusters_p99.png", "clusters_ttft.png", "table.csv", "table.json"])
    rows = res["rows"]
    assert {(r["router"], r["load"]) for r in rows} == {("random", 0.5), ("random", 0.9), ("jsq", 0.5), ("jsq", 0.9)}
    at = {(r["router"], r["load"]): r for r in rows}
    # tail latency: JSQ below random at 90% of the pool's capacity (seed 0)
    assert at[("jsq", 0.9)]["p99_job_latency_ms"] < at[("random", 0.9)]["p99_job_latency_ms"]
    assert at[("jsq", 0.9)]["p99_ttft_ms"] < at[("random", 0.9)]["p99_ttft_ms"]
    # at half load every replica is judged stable, and so is the pool's total backlog
    for router in ("random", "jsq"):
        r = at[(router, 0.5)]
        assert r["verdict"] == "stable" and r["replica_verdicts"] == "4/0/0"
        assert r["pool_backlog_verdict"] == "stable"
    # the load is the traffic equations' fraction of the pool's capacity
    for r in rows:
        assert r["utilisation"] == pytest.approx(r["load"])
    by = {e["load"]: e for e in res["summary"]["by_load"]}
    assert by[0.9]["jsq_vs_random_p99"] < 1
    saved = json.loads((tmp_path / "table.json").read_text())
    assert len(saved["rows"]) == 4 and saved["meta"]["jobs_per_replica"] == 1000


def test_agents_quick_dag_stable_at_90_unstable_at_110_and_under_fastertransformer(tmp_path):
    res = rn.reproduce_agents(out_dir=tmp_path, quick=True)
    _files_ok(res, ["agents_backlog.png", "agents_backlog.csv", "table.csv", "table.json"])
    at = {(r["policy"], r["load"]): r for r in res["rows"] if r["workflow"] == "dag"}
    assert set(at) == {("sarathi", 0.9), ("sarathi", 1.1), ("fastertransformer", 0.9)}
    assert at[("sarathi", 0.9)]["verdict"] == "stable"
    assert at[("sarathi", 1.1)]["verdict"] == "unstable"
    assert "writer:unstable" in at[("sarathi", 1.1)]["server_verdicts"]  # the bottleneck
    assert at[("fastertransformer", 0.9)]["verdict"] == "unstable"
    assert at[("fastertransformer", 0.9)]["network_backlog_verdict"] == "unstable"
    s = res["summary"]["dag"]
    assert s["bottleneck"] == "writer"
    assert s["sarathi"] == {0.9: ["stable"], 1.1: ["unstable"]}
    assert s["ft_smallest_unstable_load"] == 0.9
    header = (tmp_path / "agents_backlog.csv").read_text().splitlines()[0]
    assert header == "run,time_s,planner,workers,writer,network"


def test_rybko_stolyar_quick_verdict_flips_with_the_priority_order(tmp_path):
    res = rn.reproduce_rybko_stolyar(out_dir=tmp_path, quick=True)
    _files_ok(res, ["rybko_stolyar_backlog.png", "rybko_stolyar_backlog.csv", "table.csv", "table.json"])
    at = {r["order"]: r for r in res["rows"]}
    for o in ("exit", "entry"):
        th = res["summary"][o]
        # each server below capacity, the two exiting (long) classes above one server
        assert th["utilisation"]["s1"] < 1 and th["utilisation"]["s2"] < 1
        assert th["exiting_classes_load"] > 1
    assert at["exit"]["network_backlog_verdict"] == "unstable"
    assert at["entry"]["network_backlog_verdict"] == "stable"
    assert at["entry"]["verdict"] == "stable"
    # the unstable order piles work up far beyond the stable one
    assert at["exit"]["p99_job_latency_ms"] > 20 * at["entry"]["p99_job_latency_ms"]
    if rn.backpressure_available():
        assert "backpressure" in at and at["backpressure"]["control"] == "backpressure"
    else:
        assert "backpressure" not in at


def test_rybko_stolyar_peaks_and_series_are_of_the_window_the_verdict_judges(tmp_path):
    """table.csv's peak backlog (761,856 tokens at s1 in --quick) took in the drain after the
    last arrival while the series CSV and figure stopped at 1.02x the last arrival, thinned
    (their largest: 137,728), and the summary's peaks by tenth came from the thinned series.
    All three are of the arrival window now, from every sample, and agree."""
    import csv

    res = rn.reproduce_rybko_stolyar(out_dir=tmp_path, quick=True, orders=["exit", "entry"])
    with open(tmp_path / "rybko_stolyar_backlog.csv") as f:
        series = list(csv.DictReader(f))
    nb = rn.network_backlog(simulate_network(rn.rybko_stolyar_network("exit"), num_jobs=3000, seed=0))
    end = nb["arrival_end_s"]
    win = nb["time_s"] <= end
    for row in res["rows"]:
        o = row["order"]
        mine = [r for r in series if r["run"] == o]
        assert float(mine[-1]["time_s"]) <= end + 1e-3  # (the CSV's 3 decimals)
        tenths = res["summary"][o]["backlog_peaks_by_tenth_while_arriving"]
        for srv in ("s1", "s2"):
            peak = row[f"peak_backlog_{srv}_while_arriving_tokens"]
            assert max(float(r[srv]) for r in mine) == peak
            assert max(v for v in tenths[srv] if v is not None) == peak
            if o == "exit":  # the unthinned series of the same run, in its window
                assert peak == nb["servers"][srv][win].max()
    # the case: after the last arrival the oscillation goes on, s1's backlog higher still
    exit_row = next(r for r in res["rows"] if r["order"] == "exit")
    assert nb["servers"]["s1"].max() > 2 * exit_row["peak_backlog_s1_while_arriving_tokens"]


def test_rybko_stolyar_network_offers_each_server_the_load():
    for load in (0.5, 0.85):
        rep = traffic(rn.rybko_stolyar_network("exit", load=load))
        assert rep.server("s1").utilisation == pytest.approx(load)
        assert rep.server("s2").utilisation == pytest.approx(load)
        # exiting classes: 2 * load * long / (short + long)
        assert rep.class_load("s1", "B.2").offered_tokens_per_s / rep.server("s1").capacity == pytest.approx(
            load * 1024 / 1152
        )
    assert rn.rybko_stolyar_network("entry")["servers"]["s1"]["priority"] == ["A.1"]
    with pytest.raises(ConfigError, match="unknown Rybko-Stolyar order"):
        rn.rybko_stolyar_network("sideways")


def test_network_backlog_counts_calls_still_to_come():
    """The network's unfinished work: the servers' backlogs plus, for every job in the
    network, the work of each call not yet delivered, checked against a direct count."""
    net = {
        "servers": {"s1": {"policy": "sarathi"}, "s2": {"policy": "sarathi"}},
        "jobs": {
            "j": {
                "arrival": {"process": "poisson", "rate": 4.0},
                "route": [
                    {"call": {"server": "s1", "prompt": "geometric:200", "output": "geometric:20"}},
                    {"delay": "exponential:0.3"},
                    {"call": {"server": "s2", "prompt": "geometric:100", "output": "geometric:30", "context": True}},
                ],
            }
        },
        "num_jobs": 300,
        "seed": 3,
    }
    res = simulate_network(net)
    nb = rn.network_backlog(res)
    st = res.stats
    t = nb["time_s"]
    servers = nb["servers"]["s1"] + nb["servers"]["s2"]
    job_at = np.frombuffer(st.job_arrival, dtype=np.int64) / 1e9
    call_job = np.frombuffer(st.call_job, dtype=np.int64)
    call_at = np.frombuffer(st.call_arrival, dtype=np.int64) / 1e9
    work = np.frombuffer(st.call_prompt, dtype=np.int64) + np.frombuffer(st.call_output, dtype=np.int64) - 1
    for i in range(0, len(t), 37):
        pending = sum(int(w) for j, a, w in zip(call_job, call_at, work) if job_at[j] <= t[i] < a)
        assert nb["network"][i] == pytest.approx(servers[i] + pending)
    assert (nb["network"] >= servers - 1e-9).all()
    assert nb["verdict"]["verdict"] in ("stable", "unstable", "inconclusive")


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown router"):
        rn.reproduce_clusters(out_dir=tmp_path, quick=True, routers=["fastest"])
    with pytest.raises(ConfigError, match="unknown cluster workload"):
        rn.reproduce_clusters(out_dir=tmp_path, quick=True, workload="chat")
    with pytest.raises(ConfigError, match="unknown workflow"):
        rn.reproduce_agents(out_dir=tmp_path, quick=True, workflows=["tree"])
    with pytest.raises(ConfigError, match="loads must be positive"):
        rn.reproduce_agents(out_dir=tmp_path, quick=True, loads=[0])
    with pytest.raises(ConfigError, match="at least one seed"):
        rn.reproduce_rybko_stolyar(out_dir=tmp_path, quick=True, seeds=[])


def test_backpressure_is_stable_where_exit_priority_is_not():
    """Rybko-Stolyar at 0.85 of each server's capacity, the exiting classes needing 1.5 of
    one server: exit priority piles work up, max-pressure keeps the network's work bounded."""
    verdicts = {}
    for order in ("exit", "backpressure"):
        d = rn.rybko_stolyar_network(order, load=0.85)
        d["num_jobs"] = 12000
        res = simulate_network(d)
        verdicts[order] = (rn.network_backlog(res)["verdict"]["verdict"], res.summary["p99_job_latency_ms"])
    assert verdicts["exit"][0] == "unstable"
    assert verdicts["backpressure"][0] == "stable"
    assert verdicts["backpressure"][1] < verdicts["exit"][1] / 20
