"""The serverless runtime: cold starts from the tier holding the checkpoint, LRU tiers,
keep-alive and scale to zero, scale-out bounded by free GPUs, ServerlessLLM's placement and
live migration, each platform scheduler's rule on a hand case, no request lost or
duplicated, fast == step by step, the YAML spec and its errors, the files."""

from __future__ import annotations

import copy
import csv
import itertools
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched.core import ConfigError
from llmsched.core.request import NS
from llmsched.policies.dynamic_batch import DynamicBatch
from llmsched.policies.twp import TWP
from llmsched.sim.serverless import run_serverless
from llmsched.sim.serverless_result import ServerlessResult, simulate_serverless
from llmsched.workload.serverless import (
    PLATFORM_SCHEDULERS,
    ServerlessRequests,
    load_serverless,
    make_serverless_requests,
)

EXAMPLE = "examples/serverless/small.yaml"
MS = NS // 1000


def base(**platform) -> dict:
    """One node, one 80 GB GPU, DRAM 20 GB/s, SSD 5 GB/s, remote 2 GB/s; model `m` of 10 GB
    whose steps take 10 ms; no init time."""
    return {
        "cluster": {
            "remote_bandwidth_gbps": 2.0,
            "nodes": [
                {
                    "count": 1,
                    "gpus": 1,
                    "gpu_memory_gb": 80,
                    "dram_gb": 50,
                    "dram_bandwidth_gbps": 20,
                    "ssd_gb": 100,
                    "ssd_bandwidth_gbps": 5,
                }
            ],
        },
        "models": {"m": {"weights_gb": 10, "cost_model": "const:10"}},
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"init_s": 0, "keep_alive_s": "never", **platform},
    }


def run(cfg: dict, rows, fast: bool = True, max_time_s: float | None = None):
    """Run `rows` of (arrival_s, model, prompt, output) on the platform `cfg`."""
    spec = load_serverless(cfg)
    names = list(spec.models)
    rows = sorted(rows, key=lambda r: r[0])
    reqs = ServerlessRequests(
        np.array([r[0] for r in rows], dtype=float),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([names.index(r[1]) for r in rows], dtype=np.int64),
        names,
    )
    return run_serverless(spec, fast=fast, requests=reqs, max_time_s=max_time_s)


def inst(stats, i):
    return stats.instances[i]


def ns(s: float) -> int:
    return round(s * NS)


# ---- cold starts and tiers ----------------------------------------------------------------------
@pytest.mark.parametrize("tier,load_s", [("dram", 10 / 20), ("ssd", 10 / 5), ("remote", 10 / 2)])
@pytest.mark.parametrize("scheduler", ["fcfs", "serverlessllm"])
def test_cold_start_is_init_plus_size_over_the_bandwidth_of_the_tier_holding_the_checkpoint(tier, load_s, scheduler):
    cfg = base(scheduler=scheduler, init_s=0.5)
    node = cfg["cluster"]["nodes"][0]
    if tier != "remote":
        node[tier] = ["m"]
    if tier == "dram":
        node["ssd"] = ["m"]  # the fastest tier holding it counts
    speedup = 2.0 if scheduler == "serverlessllm" else 1.0
    s = run(cfg, [(1.0, "m", 10, 1)])
    i = inst(s, 0)
    assert i["tier"] == tier
    assert i["ready_ns"] - i["created_ns"] == ns(0.5) + ns(load_s / speedup)
    # the request waits through the cold start: TTFT = cold start + its one 10 ms step
    assert s.ttft_ns[0] == ns(0.5) + ns(load_s / speedup) + 10 * MS
    assert s.cold[0] == 1


@pytest.mark.parametrize("scheduler", ["fcfs", "serverlessllm"])
def test_the_fastest_tier_is_the_one_with_the_most_bandwidth_whatever_its_kind(scheduler):
    # an SSD at 1 GB/s holding the checkpoint, the remote store at 10 GB/s: it loads from
    # the remote store (it was read from the SSD, the kind order, 10 times slower)
    cfg = base(scheduler=scheduler)
    cfg["cluster"]["remote_bandwidth_gbps"] = 10.0
    cfg["cluster"]["nodes"][0].update(ssd=["m"], ssd_bandwidth_gbps=1.0)
    speedup = 2.0 if scheduler == "serverlessllm" else 1.0
    i = inst(run(cfg, [(0.0, "m", 10, 1)]), 0)
    assert i["tier"] == "remote" and i["ready_ns"] - i["created_ns"] == ns(10 / 10 / speedup)


def _tiers(cfg, order):
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "abc"}
    cfg["platform"]["keep_alive_s"] = 1
    s = run(cfg, [(100.0 * k, m, 10, 1) for k, m in enumerate(order)])
    assert [i["model"] for i in s.instances] == list(order)
    return [i["tier"] for i in s.instances]


def test_dram_cache_fills_on_load_and_evicts_least_recently_used():
    cfg = base()
    cfg["cluster"]["nodes"][0].update(dram_gb=25, ssd_gb=100)
    # a, b fill DRAM (2 x 10 GB of 25); reading a refreshes it, so c evicts b, not a
    assert _tiers(cfg, "abaca") == ["remote", "remote", "dram", "remote", "dram"]
    cfg = base()
    cfg["cluster"]["nodes"][0].update(dram_gb=25, ssd_gb=100)
    # without the refresh a is the oldest: c evicts it and a comes back from the SSD
    assert _tiers(cfg, "abca") == ["remote", "remote", "remote", "ssd"]


def test_ssd_fills_from_the_remote_store_and_evicts_least_recently_used():
    cfg = base()
    cfg["cluster"]["nodes"][0].update(dram_gb=0, ssd_gb=25)
    assert _tiers(cfg, "abaca") == ["remote", "remote", "ssd", "remote", "ssd"]
    cfg = base()
    cfg["cluster"]["nodes"][0].update(dram_gb=0, ssd_gb=25)
    assert _tiers(cfg, "abcab") == ["remote", "remote", "remote", "remote", "remote"]


def test_a_load_fills_the_ssd_and_dram_by_kind_whatever_their_bandwidths():
    # docs/serverless.md: a load from the SSD fills DRAM even when DRAM (1 GB/s) is slower
    # than the SSD (5 GB/s). b from the remote store (0.5 GB/s) evicts a from the 15 GB SSD,
    # so a comes back from DRAM: filled by the SSD load (a "faster tiers only" rule would
    # have left DRAM without a and loaded it from the remote store)
    cfg = base()
    cfg["cluster"]["remote_bandwidth_gbps"] = 0.5
    cfg["cluster"]["nodes"][0].update(dram_gb=25, dram_bandwidth_gbps=1, ssd_gb=15, ssd_bandwidth_gbps=5, ssd=["a"])
    assert _tiers(cfg, "aba") == ["ssd", "remote", "dram"]


def test_a_checkpoint_larger_than_a_tier_is_never_cached_there():
    cfg = base()
    cfg["cluster"]["nodes"][0].update(dram_gb=5, ssd_gb=5)
    assert _tiers(cfg, "aa") == ["remote", "remote"]


def test_loads_on_one_node_queue_behind_each_other():
    cfg = base()
    cfg["cluster"]["nodes"][0]["gpus"] = 2
    cfg["models"]["n"] = {"weights_gb": 10, "cost_model": "const:10"}
    s = run(cfg, [(0.0, "m", 10, 1), (1.0, "n", 10, 1)])
    a, b = s.instances
    assert a["load_start_ns"] == 0 and a["loaded_ns"] == ns(5)
    assert b["created_ns"] == ns(1) and b["load_start_ns"] == ns(5) and b["loaded_ns"] == ns(10)


# ---- keep-alive, scale to zero, reclaim -------------------------------------------------------------
def test_keep_alive_expires_and_the_model_scales_to_zero():
    cfg = base(keep_alive_s=5)
    s = run(cfg, [(0.0, "m", 10, 1), (100.0, "m", 10, 1)])
    a, b = s.instances
    finish0 = s.e2e_ns[0]
    assert a["stop_reason"] == "keep-alive" and a["stop_ns"] == finish0 + ns(5)
    assert b["created_ns"] == ns(100) and b["tier"] == "dram"  # the first load filled the cache
    # the run ends at the last completion; the platform still pays for the keep-alive after it
    assert s.end_ns == ns(100) + s.e2e_ns[1]
    assert b["stop_reason"] == "keep-alive" and b["stop_ns"] == s.end_ns + ns(5)
    res = simulate_serverless(cfg)  # GPU-seconds: the time instances hold the GPU, loading included
    rows = res.instances
    assert res.summary["gpu_seconds"] == pytest.approx(sum(r["stop_ns"] - r["gpu_from_ns"] for r in rows) / NS)
    # kept alive: one instance serves both, and holds its GPU to the end
    s = run(base(keep_alive_s="never"), [(0.0, "m", 10, 1), (100.0, "m", 10, 1)])
    assert len(s.instances) == 1 and s.instances[0]["routed"] == 2 and s.instances[0]["stop_reason"] == "end"


def test_a_request_during_keep_alive_cancels_the_expiry():
    s = run(base(keep_alive_s=5), [(0.0, "m", 10, 1), (8.0, "m", 10, 1), (12.0, "m", 10, 1), (30.0, "m", 10, 1)])
    a, b = s.instances
    assert a["routed"] == 3 and a["stop_reason"] == "keep-alive"
    assert a["stop_ns"] == ns(12) + s.e2e_ns[2] + ns(5)


def test_the_run_ends_at_its_last_completion_and_a_models_bill_follows_its_own_keep_alive():
    """An instance kept alive (`never`) was billed to the run's last event of any kind:
    another model's keep-alive expiry (model a's GPU-seconds followed model b's keep-alive,
    5 or 500 s), or under a time limit the limit itself when a request was still to
    arrive, but the last completion when none was (reason "time limit" both ways). Now the
    run ends at the last completion, a `never` instance's bill with it, and an instance
    with a keep-alive is billed to its expiry, whichever model finishes last."""
    cfg = base(keep_alive_s="never")
    cfg["cluster"]["nodes"][0]["gpus"] = 2
    cfg["models"]["n"] = {"weights_gb": 10, "cost_model": "const:10"}
    bills = []
    for keep in (5, 500):
        cfg["models"]["n"]["keep_alive_s"] = keep
        s = run(cfg, [(0.0, "m", 10, 3), (0.0, "n", 10, 3)])
        last = int((s.arrival_ns + s.e2e_ns).max())
        assert s.end_ns == last
        kept, expiring = s.instances
        assert (kept["stop_ns"], kept["stop_reason"]) == (last, "end")
        assert (expiring["stop_ns"], expiring["stop_reason"]) == (s.e2e_ns[1] + ns(keep), "keep-alive")
        bills.append(kept["stop_ns"] - kept["gpu_from_ns"])
    assert bills[0] == bills[1]
    # a model with a keep-alive pays for it whether another model's traffic ends before or after
    cfg["models"]["m"]["keep_alive_s"] = 30
    own = []
    for other_until in (3.0, 100.0):
        s = run(cfg, [(0.0, "m", 10, 3), (other_until, "n", 10, 3)])
        (a,) = [i for i in s.instances if i["model"] == "m"]
        assert a["stop_reason"] == "keep-alive" and a["stop_ns"] == s.e2e_ns[0] + ns(30)
        own.append(a["stop_ns"] - a["gpu_from_ns"])
    assert own[0] == own[1]
    del cfg["models"]["m"]["keep_alive_s"]
    # a keep-alive that expires before the run's end still stops its instance then
    cfg["models"]["n"]["keep_alive_s"] = 1
    s = run(cfg, [(0.0, "n", 10, 3), (20.0, "m", 10, 3)])
    n_inst, m_inst = s.instances
    assert n_inst["stop_reason"] == "keep-alive" and n_inst["stop_ns"] == s.e2e_ns[0] + ns(1) < s.end_ns
    assert m_inst["stop_ns"] == s.end_ns == ns(20) + s.e2e_ns[1] and m_inst["stop_reason"] == "end"
    # a time limit after every request finished: the run ended first, reason "end"
    one = run(cfg, [(0.0, "m", 10, 3)], max_time_s=100)
    assert one.instances[0]["stop_reason"] == "end" and one.instances[0]["stop_ns"] == one.end_ns == one.e2e_ns[0]
    # a request still to arrive at the limit: the clock runs to it, as one server's does
    cut = run(cfg, [(0.0, "m", 10, 3), (200.0, "m", 10, 3)], max_time_s=100)
    assert not cut.arrived[1] and cut.e2e_ns[0] == one.e2e_ns[0]
    assert cut.instances[0]["stop_reason"] == "time limit" and cut.instances[0]["stop_ns"] == cut.end_ns == ns(100)


def test_an_instance_still_starting_at_the_runs_end_is_billed_through_its_start(tmp_path):
    """A scale-out instance kept alive (`never`) whose load was under way at the last
    completion: its load and init still ran (its `loaded`/`ready` times were recorded, and
    its cold start counted in `cold_start_time_s`), but its bill stopped at the run's end,
    before it loaded (stop 20.2 s < loaded 25 s < ready 27 s: 0.2 GPU-s for 7 s of
    start). Now it holds its GPU to its ready time (reason "ready after end"), and the
    summary's totals are those of instances.csv."""
    cfg = base(keep_alive_s="never", init_s=2, scale_out_tokens=1000)
    node = cfg["cluster"]["nodes"][0]
    node.update(gpus=2, dram_gb=0, ssd_gb=0)  # every load from the remote store: 5 s
    rows = [(0.0, "m", 100, 10), (20.0, "m", 5000, 10)]
    s = run(cfg, rows)
    a, b = s.instances
    assert s.end_ns == ns(20) + s.e2e_ns[1] < ns(21)  # instance 0 served both
    assert (a["stop_ns"], a["stop_reason"]) == (s.end_ns, "end")
    assert b["created_ns"] == b["gpu_from_ns"] == ns(20) and b["routed"] == 0
    assert (b["loaded_ns"], b["ready_ns"]) == (ns(25), ns(27))
    assert (b["stop_ns"], b["stop_reason"]) == (ns(27), "ready after end")
    assert s.instances == run(cfg, rows, fast=False).instances
    # the summary's totals are the instances' records
    spec = load_serverless(cfg)
    names = list(spec.models)
    reqs = ServerlessRequests(
        np.array([r[0] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([names.index(r[1]) for r in rows], dtype=np.int64),
        names,
    )
    res = ServerlessResult(run_serverless(spec, requests=reqs), spec.to_dict())
    out = res.write(tmp_path / "o")
    with open(out / "instances.csv") as f:
        table = list(csv.DictReader(f))
    summary = res.summary
    assert summary["gpu_seconds"] == pytest.approx(sum(float(r["gpu_seconds"]) for r in table))
    assert summary["gpu_seconds"] == pytest.approx((s.end_ns + ns(7)) / NS)
    assert summary["cold_start_time_s"] == pytest.approx(sum(float(r["cold_start_s"]) for r in table)) == 14
    assert [r["stop_reason"] for r in table] == ["end", "ready after end"]
    # a time limit before the start ends: nothing after it is simulated, its times are not
    # reached and its cold start is left out of the totals
    cut = ServerlessResult(run_serverless(spec, requests=reqs, max_time_s=20.1), spec.to_dict())
    b = cut.instances[1]
    assert (b["loaded_ns"], b["ready_ns"], b["stop_ns"], b["stop_reason"]) == (-1, -1, ns(20.1), "time limit")
    assert cut.summary["cold_start_time_s"] == 7 and cut.summary["max_cold_start_s"] == 7
    assert cut.summary["cold_starts"] == 1 and cut.summary["cold_starts_unfinished"] == 1


def test_a_model_kept_alive_is_billed_to_the_last_completion_of_any_model():
    """docs/serverless.md's example: a model kept alive (`never`) pays until the run's end,
    the last completion of any model, so its GPU-seconds grow with another model's traffic
    (22.1 or 112.1 s), not with that model's keep-alive."""
    cfg = base(init_s=2)
    cfg["cluster"]["remote_bandwidth_gbps"] = 1.0
    cfg["cluster"]["nodes"][0].update(gpus=2, dram_gb=0, ssd_gb=0)
    cfg["models"] = {
        "a": {"weights_gb": 10, "cost_model": "const:10", "keep_alive_s": "never"},
        "b": {"weights_gb": 10, "cost_model": "const:10", "keep_alive_s": 5},
    }
    bills = {}
    for at, keep in ((1.0, 5), (100.0, 5), (100.0, 50)):
        cfg["models"]["b"]["keep_alive_s"] = keep
        s = run(cfg, [(0.0, "a", 100, 10), (at, "b", 100, 10)])
        a = next(i for i in s.instances if i["model"] == "a")
        assert a["stop_reason"] == "end" and a["stop_ns"] == s.end_ns
        bills[at, keep] = (a["stop_ns"] - a["gpu_from_ns"]) / NS
    assert bills == {(1.0, 5): 22.1, (100.0, 5): 112.1, (100.0, 50): 112.1}


def test_a_model_without_instance_takes_the_gpu_of_an_idle_one_or_waits_for_it():
    cfg = base()
    cfg["models"]["n"] = {"weights_gb": 10, "cost_model": "const:10"}
    s = run(cfg, [(0.0, "m", 10, 1), (50.0, "n", 10, 1)])
    a, b = s.instances
    assert a["stop_reason"] == "reclaimed" and a["stop_ns"] == ns(50) and b["gpu_from_ns"] == ns(50)
    # m busy with a long request: n waits until m's instance is idle
    s = run(cfg, [(0.0, "m", 10, 500), (6.0, "n", 10, 1)])
    a, b = s.instances
    assert a["stop_ns"] == s.e2e_ns[0] and b["created_ns"] == s.e2e_ns[0]
    assert s.ttft_ns[1] > s.e2e_ns[0] - ns(6)


# ---- scale-out ------------------------------------------------------------------------------------------
def two_nodes(**platform) -> dict:
    cfg = base(**platform)
    cfg["cluster"]["nodes"][0]["count"] = 2
    return cfg


def test_scale_out_stops_at_the_free_gpus_and_never_takes_an_idle_instance():
    cfg = two_nodes(scale_out_tokens=0, max_instances=8)
    s = run(cfg, [(0.01 * k, "m", 100, 200) for k in range(10)])
    assert len(s.instances) == 2  # two GPUs
    cfg["models"]["n"] = {"weights_gb": 10, "cost_model": "const:10", "max_instances": 1}
    s = run(cfg, [(0.0, "n", 10, 1)] + [(20.0 + 0.01 * k, "m", 100, 200) for k in range(10)])
    assert [i["model"] for i in s.instances] == ["n", "m"]  # n's idle instance keeps its GPU
    assert s.instances[0]["stop_reason"] == "end"


def test_scale_out_when_queued_work_per_instance_exceeds_the_threshold():
    cfg = two_nodes(scale_out_tokens=1000)
    # 600 tokens of work: below the threshold; 1200: above, a second instance starts
    s = run(cfg, [(0.0, "m", 100, 500), (0.1, "m", 100, 1)])
    assert len(s.instances) == 1
    s = run(cfg, [(0.0, "m", 100, 500), (0.1, "m", 100, 600)])
    assert len(s.instances) == 2 and s.instances[1]["created_ns"] == ns(0.1)
    cfg["platform"]["max_instances"] = 1
    s = run(cfg, [(0.0, "m", 100, 500), (0.1, "m", 100, 600)])
    assert len(s.instances) == 1


def _check_gpus(spec, s):
    """No GPU holds two instances at once; instances per model within max_instances; an
    instance is reclaimed only for a model with no other instance at that moment."""
    by_gpu = {}
    for r in s.instances:
        by_gpu.setdefault(r["gpu"], []).append((r["gpu_from_ns"], r["stop_ns"]))
    for spans in by_gpu.values():
        spans.sort()
        for (a0, a1), (b0, b1) in itertools.pairwise(spans):
            assert a1 <= b0
    assert s.peak_gpus <= spec.num_gpus
    for m in spec.models:
        rows = [r for r in s.instances if r["model"] == m]
        for r in rows:
            alive = sum(1 for q in rows if q["created_ns"] <= r["created_ns"] < q["stop_ns"])
            assert alive <= spec.max_instances(m)
    for r in s.instances:
        if r["stop_reason"] == "reclaimed":
            # (the new instance, or one that waited for a migration's GPU and took this instead)
            new = [q for q in s.instances if q["gpu"] == r["gpu"] and q["gpu_from_ns"] == r["stop_ns"]]
            assert len(new) == 1
            others = [
                q
                for q in s.instances
                if q["model"] == new[0]["model"] and q is not new[0] and q["created_ns"] <= r["stop_ns"] < q["stop_ns"]
            ]
            assert not others


# ---- ServerlessLLM -------------------------------------------------------------------------------------
def test_serverlessllm_starts_where_the_checkpoint_is_closest_fcfs_takes_the_first_free_gpu():
    cfg = two_nodes(init_s=0.5)
    cfg["cluster"]["nodes"] = [
        dict(cfg["cluster"]["nodes"][0], count=1, name="a"),
        dict(cfg["cluster"]["nodes"][0], count=1, name="b", dram=["m"]),
    ]
    s = run(cfg, [(0.0, "m", 10, 1)])
    assert s.instances[0]["gpu"] == "a/gpu0" and s.instances[0]["tier"] == "remote"
    cfg["platform"]["scheduler"] = "serverlessllm"
    s = run(cfg, [(0.0, "m", 10, 1)])
    i = s.instances[0]
    assert i["gpu"] == "b/gpu0" and i["tier"] == "dram"
    assert i["ready_ns"] - i["created_ns"] == ns(0.5) + ns(10 / (20 * 2.0))
    # the load queue counts: while b's loader reads a 60 GB checkpoint from its SSD (6 s),
    # m's remote load on a (2.5 s) beats its DRAM load on b (5.9 s wait + 0.25 s)
    cfg["models"]["big"] = {"weights_gb": 60, "cost_model": "const:10"}
    cfg["cluster"]["nodes"][1].update(gpus=2, ssd=["big"])
    s = run(cfg, [(0.0, "big", 10, 1), (0.1, "m", 10, 1)])
    assert [i["gpu"] for i in s.instances] == ["b/gpu0", "a/gpu0"]
    assert [i["tier"] for i in s.instances] == ["ssd", "remote"]


def migration_case(
    scheduler: str, rows=None, fast: bool = True, max_time_s=None, alpha=None, migration=True, b_fits_a1=True, **a
):
    """Two GPUs on two nodes; model a runs two long requests on its two instances; model b
    arrives at t = 1.005 s when no GPU is free. `b_fits_a1=False`: a1's node is too small
    for b (50 GB), which can then only migrate a0 and never take a1's GPU."""
    cfg = two_nodes(scheduler=scheduler, scale_out_tokens=0)
    cfg["cluster"]["remote_bandwidth_gbps"] = 10
    cfg["models"] = {
        "a": {"weights_gb": 10, "cost_model": "const:10", **a},
        "b": {"weights_gb": 10, "cost_model": "const:10"},
    }
    if not b_fits_a1:
        node = cfg["cluster"]["nodes"][0]
        cfg["cluster"]["nodes"] = [dict(node, count=1, name="n0"), dict(node, count=1, name="n1", gpu_memory_gb=40)]
        cfg["models"]["b"]["weights_gb"] = 50
    if alpha is not None:
        cfg["platform"]["serverlessllm"] = {"alpha_s_per_token": alpha}
    if not migration:
        cfg["platform"]["serverlessllm"] = {"migration": False}
    rows = rows or [(0.0, "a", 100, 1000), (0.1, "a", 100, 1000), (1.005, "b", 10, 5)]
    return run(cfg, rows, fast=fast, max_time_s=max_time_s)


def test_serverlessllm_live_migration_frees_a_gpu_and_conserves_tokens():
    s = migration_case("serverlessllm")
    a0, a1, b = s.instances
    # a: two instances from the first request (threshold 0); ready at 0.5 s (10 GB at 2 x 10 GB/s)
    assert (a0["model"], a1["model"], b["model"]) == ("a", "a", "b") and a0["ready_ns"] == ns(0.5)
    # request 0 prefilled at 0.51 s (token 1), one token per 10 ms. At the boundary after
    # 1.005 s (t0 = 1.01 s) it has 51 tokens: n0 = 100 + 51. It keeps decoding on a0 while
    # a1 recomputes them (0.01 * 151 + 0.1 = 1.61 s, to 2.62 s), then the d = 161 tokens
    # emitted meanwhile (1.61 s more): it leaves a0 at 4.23 s with 373 tokens, and a1
    # decodes it on from its next step, without a prefill
    hand = ns(1.01) + ns(0.01 * 151 + 0.1) + ns(0.01 * 161)
    assert hand == ns(4.23)
    assert a0["stop_reason"] == "migrated" and a0["stop_ns"] == hand
    assert b["created_ns"] == ns(1.005) and b["gpu_from_ns"] == hand and b["ready_ns"] == hand + ns(0.5)
    assert list(s.migrations) == [1, 0, 0] and s.instance[0] == a1["instance"] and a0["migrated_out"] == 1
    assert s.migrated_tokens == 151 + 161  # recomputed at a1: n0, then d
    # 372 gaps of request 0 on a0 (tokens 1..373), its other 627 on a1 with request 1's 999
    assert a0["itl_count"] == 372 and a1["itl_count"] == 627 + 999
    assert a0["busy_ns"] == hand - ns(0.5)  # a0 decoded it until the hand-over
    # no pause: every gap of every request is one 10 ms step, so request 0 finishes as if
    # it had never moved (first token at 0.51 s, 999 steps more)
    assert s.itl.max == s.itl.min == ns(0.01)
    assert s.e2e_ns[0] == ns(0.51) + 999 * ns(0.01)
    assert (s.e2e_ns >= 0).all() and list(s.tokens) == [1000, 1000, 5]
    # every token once: each token after the first is one inter-token gap
    assert s.itl.count == int((s.output - 1).sum())
    exact = migration_case("serverlessllm", fast=False)
    assert exact.instances == s.instances and np.array_equal(exact.e2e_ns, s.e2e_ns)
    # without ServerlessLLM, b waits for an instance of a to finish
    s = migration_case("fcfs")
    assert list(s.migrations) == [0, 0, 0]
    first_done = min(s.e2e_ns[0], s.e2e_ns[1] + ns(0.1))
    assert s.instances[2]["created_ns"] == first_done == s.instances[2]["gpu_from_ns"]
    assert s.ttft_ns[2] > first_done - ns(1.005)


@pytest.mark.parametrize("fast", [True, False])
def test_a_model_waiting_for_a_gpu_migrates_once_a_victim_becomes_ready(fast):
    """b arrives at 0.2 s while both of a's instances are still loading: no GPU is free,
    none idle, no instance to migrate, so b waits. At 0.5 s both become ready (a1 second),
    each with a request queued: a1's readiness makes a0 a victim (the lower number of two
    equal estimates: nothing runs yet), its request moves to a1 at once and b takes its GPU
    then. It used to wait for a request of a to finish (10 s)."""
    rows = [(0.0, "a", 100, 1000), (0.1, "a", 100, 1000), (0.2, "b", 10, 5)]
    s = migration_case("serverlessllm", rows, fast=fast)
    a0, a1, b = s.instances
    assert a0["ready_ns"] == a1["ready_ns"] == ns(0.5)
    assert a0["stop_reason"] == "migrated" and a0["stop_ns"] == ns(0.5) and a0["migrated_out"] == 1
    assert b["created_ns"] == b["gpu_from_ns"] == ns(0.5) and b["ready_ns"] == ns(1.0)
    assert s.ttft_ns[2] == ns(1.0) + 10 * MS - ns(0.2)
    assert list(s.instance) == [a1["instance"]] * 2 + [b["instance"]] and list(s.migrations) == [0, 0, 0]
    assert (s.tokens == s.output).all() and s.itl.count == int((s.output - 1).sum())
    # only ServerlessLLM migrates: under FCFS (or with migration off) b waits for a GPU to free
    for scheduler, migration in (("fcfs", True), ("serverlessllm", False)):
        s = migration_case(scheduler, rows, fast=fast, migration=migration)
        assert s.instances[2]["gpu_from_ns"] > ns(10) and list(s.migrations) == [0, 0, 0]


def test_a_request_that_finishes_before_its_hand_over_finishes_at_the_source():
    """Request 0 has 300 tokens: its last at 0.51 + 2.99 = 3.5 s, before its hand-over
    (4.23 s): no migration; the GPU frees at its finish."""
    rows = [(0.0, "a", 100, 300), (0.1, "a", 100, 1000), (1.005, "b", 10, 5)]
    s = migration_case("serverlessllm", rows)
    a0, a1, b = s.instances
    assert list(s.migrations) == [0, 0, 0] and s.migrated_tokens == 0 and a0["migrated_out"] == 0
    assert s.instance[0] == a0["instance"] and s.e2e_ns[0] == ns(3.5)
    assert a0["stop_reason"] == "migrated" and a0["stop_ns"] == b["gpu_from_ns"] == ns(3.5)
    assert (s.tokens == s.output).all() and s.itl.count == int((s.output - 1).sum())


@pytest.mark.parametrize("fast", [True, False])
def test_waiting_requests_a_migration_moves_keep_their_place(fast):
    """A waiting request moved off a migration's victim went to the back of the
    destination's queue: request 1 (arrival 0.1), routed to the scale-out instance A1, was
    moved to A0 behind request 2 (arrival 0.2), which waited there for KV room, and got its
    first token after it (5.11 against 5.01 s)."""
    cfg = base(
        scheduler="serverlessllm",
        router="round-robin",
        keep_alive_s=30,
        scale_out_tokens=100,
        serverlessllm={"load_speedup": 1, "alpha_s_per_token": 0.0001, "beta_s": 0.01},
    )
    cfg["cluster"]["remote_bandwidth_gbps"] = 1
    node = cfg["cluster"]["nodes"][0]
    node.update(gpus=2, dram_gb=0, ssd_bandwidth_gbps=10, ssd=["a", "b"])
    cfg["models"] = {
        "a": {"weights_gb": 10, "cost_model": "const:10", "kv_capacity": 900},
        "b": {"weights_gb": 10, "cost_model": "const:10"},
    }
    s = run(cfg, [(0.0, "a", 500, 400), (0.1, "a", 500, 10), (0.2, "a", 500, 10), (0.3, "b", 100, 10)], fast=fast)
    assert s.ttft_ns[1] == ns(4.91) and s.ttft_ns[2] == ns(4.91)
    assert [int(s.arrival_ns[i] + s.ttft_ns[i]) for i in (1, 2)] == [ns(5.01), ns(5.11)]  # in arrival order


def test_a_destination_without_kv_room_recomputes_the_migrated_request():
    """KV capacity 2,000 tokens. a0 runs request 0 (900-token prompt), a1 request 1 (1,000):
    a0 migrates (fewer tokens). With alpha 1 ms/token request 0 hands over at 2.17 s with
    167 tokens: its 1,066 KV slots do not fit beside request 1's 1,166; it joins a1's queue
    to recompute, which waits for request 1 to finish (request 1 alone may need 1,999)."""
    rows = [(0.0, "a", 900, 1000), (0.1, "a", 1000, 1000), (1.005, "b", 10, 5)]
    s = migration_case("serverlessllm", rows, alpha=0.001, kv_capacity=2000)
    a0, a1, b = s.instances
    n0 = 900 + 51
    t1 = ns(1.01) + ns(0.001 * n0 + 0.1)  # 2.061 s: 155 tokens emitted by then
    d = 155 - 51
    assert s.migrated_tokens == n0 + d and list(s.migrations) == [1, 0, 0]
    assert a0["stop_ns"] == ns(2.17) and t1 + ns(0.001 * d) <= ns(2.17)  # the boundary after 2.165 s
    assert s.instance[0] == a1["instance"] and (s.tokens == s.output).all()
    assert s.itl.count == int((s.output - 1).sum())
    # request 0 resumes after request 1's finish and its own recompute: a long pause
    r1_done = ns(0.1) + s.e2e_ns[1]
    assert s.e2e_ns[0] >= r1_done + ns(0.01) + (1000 - 167) * ns(0.01)
    assert s.itl.max >= r1_done - ns(2.17)
    # with room (no capacity) it decodes on at a1 without a pause
    s = migration_case("serverlessllm", rows, alpha=0.001)
    assert s.migrated_tokens == n0 + d and s.itl.max == ns(0.01)


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_a_hand_over_to_an_idle_instance_puts_no_idle_time_in_the_itl_feedback(admission, monkeypatch):
    """a0 (request 0: 10-token prompt) migrates from 1.01 s; a1 finishes request 1 at
    1.5 s and sits idle until request 0 joins it at 2.43 s (b cannot take a1's GPU, which
    would call the migration off). Every step takes 10 ms, so every ITL sample of the
    closed-loop policy is 10 ms: the first step after the join used to be measured from
    a1's last step before its idle time (0.94 s, EWMA 0.196 s)."""
    policy = {"twp": TWP, "dynamicbatch": DynamicBatch}[admission]
    ewma = []
    observe_batch = policy.observe_batch

    def spy(self, *batch):
        observe_batch(self, *batch)
        ewma.append(self.l_ewma)

    monkeypatch.setattr(policy, "observe_batch", spy)
    rows = [(0.0, "a", 10, 1000), (0.1, "a", 500, 100), (1.005, "b", 10, 5)]
    s = migration_case("serverlessllm", rows, fast=False, b_fits_a1=False, admission=admission)  # (one step a batch)
    a0, a1, _ = s.instances
    assert a0["stop_ns"] == ns(2.43) and list(s.migrations) == [1, 0, 0] and s.instance[0] == a1["instance"]
    assert s.e2e_ns[1] == ns(1.5) - ns(0.1)  # a1 idle from 1.5 s to the hand-over
    assert max(e for e in ewma if e is not None) == pytest.approx(0.01)
    fast = migration_case("serverlessllm", rows, b_fits_a1=False, admission=admission)
    assert fast.instances == s.instances and np.array_equal(fast.e2e_ns, s.e2e_ns)


def test_the_gpu_frees_at_the_last_hand_over():
    """a0 runs requests 0 (100-token prompt) and 2 (50): request 2 hands over first, at
    1.01 + (0.01 * 101 + 0.1) + 0.01 * 111 = 3.23 s, and a0 decodes request 0 on alone
    until its hand-over at 4.23 s, where the GPU frees."""
    rows = [(0.0, "a", 100, 1000), (0.1, "a", 100, 1000), (0.2, "a", 50, 1000), (1.005, "b", 10, 5)]
    for fast in (True, False):
        s = migration_case("serverlessllm", rows, fast=fast)
        a0, a1, b = s.instances
        assert list(s.migrations) == [1, 0, 1, 0] and s.instance[0] == s.instance[2] == a1["instance"]
        assert s.migrated_tokens == (151 + 161) + (101 + 111)
        assert a0["stop_ns"] == b["gpu_from_ns"] == ns(4.23) and a0["migrated_out"] == 2
        # request 2's 272 gaps on a0 (to 3.23 s), request 0's 372 (to 4.23 s)
        assert a0["itl_count"] == 272 + 372 and s.itl.max == ns(0.01)
        assert (s.tokens == s.output).all() and s.itl.count == int((s.output - 1).sum())


def called_off(s) -> int:
    """Migrations called off: instances that waited for a migration's GPU (created before
    they got a GPU, which only they do) and took a GPU no migration's victim freed."""
    freed = {(r["gpu"], r["stop_ns"]) for r in s.instances if r["stop_reason"] == "migrated"}
    waited = [r for r in s.instances if r["gpu_from_ns"] > r["created_ns"]]
    return sum((r["gpu"], r["gpu_from_ns"]) not in freed for r in waited)


@pytest.mark.parametrize("alpha", [0.001, 0.0003])
def test_crowded_migrations_fast_equals_step_by_step(alpha):
    """crowded.yaml at 600 requests, with a faster recompute than its own (where every
    migration is called off before a hand-over): 6 hand-overs at 1 ms per token, and 3
    migrations called off (a GPU freed first); 28 hand-overs at 0.3 ms, 2 called off."""
    cfg = yaml.safe_load(open("examples/serverless/crowded.yaml"))
    cfg["platform"]["serverlessllm"]["alpha_s_per_token"] = alpha
    spec = load_serverless(cfg).replaced(num_requests=600)
    fast = run_serverless(spec)
    exact = run_serverless(spec, fast=False)
    assert fast.migrations.sum() == {0.001: 6, 0.0003: 28}[alpha]
    assert called_off(fast) == {0.001: 3, 0.0003: 2}[alpha]
    assert (fast.e2e_ns >= 0).all() and (fast.tokens == fast.output).all()
    assert fast.itl.count == int((fast.output - 1).sum())
    _check_gpus(spec, fast)
    for k in ("ttft_ns", "e2e_ns", "queue_ns", "instance", "migrations", "tokens", "preemptions"):
        assert np.array_equal(getattr(fast, k), getattr(exact, k)), k
    assert fast.instances == exact.instances and fast.migrated_tokens == exact.migrated_tokens
    assert (fast.itl.count, fast.itl.total, fast.end_ns) == (exact.itl.count, exact.itl.total, exact.end_ns)


def test_a_migration_decided_at_a_step_boundary_of_the_victim_fast_equals_step_by_step():
    """A reviewer's random platform: another instance goes idle at 18.670227828 s, exactly a
    step boundary of the victim, and its plan decides the migration. Step by step, the
    victim (the lower number) had planned its next step at that instant first, so its
    hand-over started a step later; the fast path cut the victim's batch at the instant
    (request 22 finished 10 ms later, 1 more migrated token). Since a waiting model tries
    to migrate as soon as an instance becomes ready beside another (before the batch
    ends and plans of that instant), this platform's migrations are decided then (1,434
    migrated tokens became 2,587); the two paths still agree."""
    cfg = {
        "cluster": {
            "remote_bandwidth_gbps": 4,
            "nodes": [
                {"name": "g0", "count": 1, "gpus": 3, "gpu_memory_gb": 80, "dram_gb": 10,
                 "dram_bandwidth_gbps": 20, "ssd_gb": 100, "ssd_bandwidth_gbps": 2},
                {"name": "g1", "count": 1, "gpus": 4, "gpu_memory_gb": 80, "dram_gb": 25,
                 "dram_bandwidth_gbps": 20, "ssd_gb": 20, "ssd_bandwidth_gbps": 0.5},
            ],
        },
        "models": {
            "m0": {"cost_model": "const:10", "kv_capacity": 3000, "weights_gb": 10},
            "m1": {"cost_model": "const:3", "kv_capacity": 6000, "weights_gb": 5},
            "m2": {"cost_model": "linear:c=5,a=0.05", "kv_capacity": 100000, "weights_gb": 5, "keep_alive_s": 0.5},
            "m3": {"cost_model": "const:3", "kv_capacity": 100000, "weights_gb": 1, "keep_alive_s": 3},
        },
        "platform": {
            "scheduler": "serverlessllm", "router": "least-loaded", "init_s": 0.5, "keep_alive_s": 5,
            "scale_out_tokens": 200,
            "serverlessllm": {"load_speedup": 1, "alpha_s_per_token": 0.0001, "beta_s": 0},
        },
        "workload": {
            "arrival": "gamma", "cv": 3, "rate": 5, "num_requests": 28, "seed": 47, "prompt": "uniform:10,1000",
            "output": "uniform:200,2000", "popularity": {"m0": 10, "m1": 1, "m2": 1, "m3": 1},
        },
    }  # fmt: skip
    spec = load_serverless(cfg)
    fast, exact = run_serverless(spec), run_serverless(spec, fast=False)
    assert fast.migrations.sum() >= 1 and (fast.tokens == fast.output).all()
    for k in ("ttft_ns", "e2e_ns", "queue_ns", "instance", "migrations", "tokens"):
        assert np.array_equal(getattr(fast, k), getattr(exact, k)), k
    # (2,443 since moved waiting requests keep their arrival order at the destination)
    assert fast.instances == exact.instances and fast.migrated_tokens == exact.migrated_tokens == 2443


def test_a_time_limit_before_the_hand_over_leaves_the_request_at_its_source():
    """Stopped at 3 s, request 0 is still decoding at a0 (its hand-over is due at 4.23 s):
    not migrated, in the system, a0 still holds its GPU."""
    s = migration_case("serverlessllm", max_time_s=3)
    exact = migration_case("serverlessllm", max_time_s=3, fast=False)
    assert s.instances == exact.instances and np.array_equal(s.ttft_ns, exact.ttft_ns)
    a0 = s.instances[0]
    assert list(s.migrations) == [0, 0, 0] and s.migrated_tokens == 0
    assert s.instance[0] == a0["instance"] and s.e2e_ns[0] < 0 and s.ttft_ns[0] == ns(0.51)
    assert a0["stop_reason"] == "time limit" and a0["stop_ns"] == ns(3)
    assert s.instances[2]["gpu_from_ns"] < 0  # b never got the GPU


def test_a_migration_past_the_clock_is_a_clear_error(tmp_path):
    """alpha_s_per_token is bounded, alpha * tokens is not: a migration that would land past
    the simulator's clock is refused with one line (it used to spin the event loop forever)."""
    cfg = two_nodes(scheduler="serverlessllm", scale_out_tokens=0)
    cfg["cluster"]["remote_bandwidth_gbps"] = 10
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["platform"]["serverlessllm"] = {"alpha_s_per_token": 1e8}
    rows = [(0.0, "a", 100, 1000), (0.1, "a", 100, 1000), (1.005, "b", 10, 5)]
    with pytest.raises(ConfigError, match=r"migrating a request of 151 tokens takes 1\.51e\+10 s .*past the"):
        run(cfg, rows)
    cfg["platform"]["serverlessllm"] = {"alpha_s_per_token": 1e6}  # lands by 1.6e8 s: runs
    assert list(run(cfg, rows).tokens) == [1000, 1000, 5]
    crowded = yaml.safe_load(open("examples/serverless/crowded.yaml"))  # migrates within 600 requests
    crowded["platform"]["serverlessllm"]["alpha_s_per_token"] = 1e9
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(crowded))
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmsched",
            "simulate",
            "--serverless",
            str(path),
            "--num-requests",
            "600",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "past the simulator's clock" in proc.stderr
    assert not (out / "summary.json").exists()


def test_an_event_past_the_clock_is_a_clear_error():
    """Each load is within the clock, five queued on one node are not."""
    cfg = base()
    cfg["cluster"]["nodes"][0]["gpus"] = 5
    cfg["cluster"]["remote_bandwidth_gbps"] = 1e-9  # a 1 GB checkpoint loads in 1e9 s
    cfg["models"] = {k: {"weights_gb": 1, "cost_model": "const:10"} for k in "abcde"}
    with pytest.raises(ConfigError, match=r"an event falls at 5e\+09 s of simulated time, past the simulator's"):
        run(cfg, [(0.0, k, 10, 2) for k in "abcde"])
    assert (run(cfg, [(0.0, k, 10, 2) for k in "abcd"]).e2e_ns > 0).all()


def test_migration_needs_a_sibling_instance():
    cfg = two_nodes(scheduler="serverlessllm", scale_out_tokens=1e9)
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "abc"}
    s = run(cfg, [(0.0, "a", 100, 1000), (0.1, "b", 100, 1000), (7.0, "c", 10, 5)])
    assert s.migrations.sum() == 0
    assert s.instances[2]["created_ns"] == min(s.e2e_ns[0], s.e2e_ns[1] + ns(0.1))


# ---- each platform scheduler's admission and routing rule --------------------------------------------
def queued_during_cold_start(scheduler, **model):
    cfg = base(scheduler=scheduler)
    cfg["models"]["m"].update(model)
    prompts = [10, 8, 6, 4, 2]
    return run(cfg, [(0.1 * k, "m", p, 1) for k, p in enumerate(prompts)])


def test_fcfs_admits_in_arrival_order_priority_shortest_prompt_first():
    s = queued_during_cold_start("fcfs", k_max=1)
    start = s.arrival_ns + s.queue_ns
    assert list(np.argsort(start)) == [0, 1, 2, 3, 4]
    assert s.instances[0]["admission"] == "fcfs"
    s = queued_during_cold_start("priority", k_max=1)
    start = s.arrival_ns + s.queue_ns
    assert list(np.argsort(start)) == [4, 3, 2, 1, 0]
    assert s.instances[0]["admission"] == "spf"


def burst(scheduler, **model):
    cfg = base(scheduler=scheduler)
    cfg["models"]["m"].update(b_max=4096, **model)
    return run(cfg, [(0.01 * k, "m", 10, 50) for k in range(30)])


def test_fcfs_has_no_concurrency_bound():
    s = burst("fcfs")
    assert (s.arrival_ns + s.queue_ns == s.instances[0]["ready_ns"]).all()
    assert s.instances[0]["max_batch_size"] == 30


def test_dynamicbatch_caps_the_batch_size():
    s = burst("dynamicbatch", admission_options={"dynamicbatch": {"c0": 4, "c_max": 4}})
    i = s.instances[0]
    assert i["admission"] == "dynamicbatch" and i["max_batch_size"] == 4
    start = s.arrival_ns + s.queue_ns
    finish = s.arrival_ns + s.e2e_ns
    assert (start[4:] >= np.sort(finish)[:26]).all()  # a fifth joins only when one has left


def test_twp_paces_the_token_load_with_its_window():
    s = burst("twp", admission_options={"twp": {"h_min": 16, "h_max": 16, "max_active": 8}})
    i = s.instances[0]
    assert i["admission"] == "twp" and i["max_token_load"] <= 16
    assert burst("fcfs").instances[0]["max_token_load"] > 16


def test_admission_options_may_be_flat_or_keyed_by_policy():
    cfg = base(scheduler="dynamicbatch")
    cfg["models"]["m"]["admission_options"] = {"c0": 2, "c_max": 2}
    s = run(cfg, [(0.0, "m", 10, 20)] * 6)
    assert s.instances[0]["max_batch_size"] == 2
    cfg["models"]["m"]["admission_options"] = {"twp": {"h_min": 16}}  # another policy's: unused
    s = run(cfg, [(0.0, "m", 10, 20)] * 6)
    assert s.instances[0]["max_batch_size"] == 6


def rr_case(scheduler, router=None):
    cfg = two_nodes(scheduler=scheduler, scale_out_tokens=0)
    if router:
        cfg["platform"]["router"] = router
    rows = [(0.0, "m", 10, 1), (10.0, "m", 1000, 2000)] + [(10.001 * 1 + 0.001 * k, "m", 10, 10) for k in range(1, 5)]
    return run(cfg, rows)


def test_round_robin_routes_in_rotation_least_loaded_to_the_least_work():
    s = rr_case("round-robin")
    assert len(s.instances) == 2
    assert list(s.instance) == [0, 1, 0, 1, 0, 1]  # the first started instance 0 cold
    s = rr_case("fcfs")
    assert list(s.instance) == [0, 0, 1, 1, 1, 1]
    s = rr_case("fcfs", router="round-robin")
    assert list(s.instance) == [0, 1, 0, 1, 0, 1]


def test_least_loaded_router_takes_the_least_unfinished_work_then_the_oldest(monkeypatch):
    """The router skips an instance whose work left after its batch is no less than the
    best so far (a lower bound): its choice is still the exact minimum of every candidate's
    unfinished work at the arrival, the oldest on a tie, with batches timed a few steps at
    a time (a profile) and cut by arrivals."""
    from llmsched.sim import serverless as sv

    cfg = base(scale_out_tokens=50, max_instances=4)
    cfg["cluster"]["nodes"][0]["count"] = 4
    cfg["models"]["m"]["cost_model"] = "profile:h200-llama-3.2-1b"
    rng = np.random.default_rng(3)
    times = 20 + np.cumsum(rng.exponential(0.003, 400))  # once four instances are ready
    rows = [(0.001 * k, "m", 100, 1) for k in range(6)]  # (they start four)
    rows += [
        (float(t), "m", int(p), int(o)) for t, p, o in zip(times, rng.integers(10, 900, 400), rng.integers(1, 300, 400))
    ]
    route, unfinished = sv._Runtime.route, sv.ServerSim.unfinished
    counted = [0, 0]  # candidates, and the work counts the router made

    def count(sim, t):
        counted[1] += 1
        return unfinished(sim, t)

    def exact(self, model, t):
        cands = model.ready or model.live
        monkeypatch.setattr(sv.ServerSim, "unfinished", count)
        got = route(self, model, t)
        monkeypatch.setattr(sv.ServerSim, "unfinished", unfinished)
        if len(cands) > 1:
            counted[0] += len(cands)
            work = [i.sim.unfinished(t) for i in cands]
            assert got is cands[work.index(min(work))]
        return got

    monkeypatch.setattr(sv._Runtime, "route", exact)
    s = run(cfg, rows)
    assert len(s.instances) == 4 and (s.e2e_ns >= 0).all()
    assert counted[0] > 1000 and counted[1] < 0.8 * counted[0]  # checked often, and the bound skipped some


def test_round_robin_rotation_goes_on_when_an_instance_becomes_ready():
    """The router took `rr % len(ready)` with a counter, so when a third instance became
    ready the rotation repeated one: 0,1,0,1,1,2,0,1 after the cold start."""
    cfg = base(scheduler="round-robin", scale_out_tokens=11, keep_alive_s=100, init_s=1)
    cfg["cluster"]["nodes"][0]["count"] = 3
    cfg["cluster"]["remote_bandwidth_gbps"] = 1.0
    cfg["cluster"]["nodes"][0].update(dram_gb=0, ssd_gb=0)
    rows = [(0, 10), (20, 10), (21, 10), (22, 100), (22, 100), (40, 10), (41, 10), (42, 10), (43, 10)]
    s = run(cfg, [(t, "m", p, 3) for t, p in rows])
    assert [i["ready_ns"] for i in s.instances] == [ns(11), ns(11), ns(33)]  # the third: from t = 22
    assert list(s.instance) == [0, 1, 0, 1, 0, 1, 2, 0, 1]


def test_another_scheduler_routes_by_its_own_default_unless_the_file_names_a_router(tmp_path):
    """A file with `scheduler: round-robin` and no router, run under --platform-scheduler
    fcfs: `replaced` rebuilt the spec from `to_dict`, which wrote the router in use, so the
    round-robin scheduler's rotation became an explicit router and fcfs kept it."""
    spec = load_serverless(two_nodes(scheduler="round-robin"))
    assert spec.platform.routing == "round-robin"
    for s in ("fcfs", "twp", "serverlessllm"):
        assert spec.replaced(scheduler=s).platform.routing == "least-loaded", s
    named = load_serverless(two_nodes(scheduler="fcfs", router="round-robin"))
    assert named.replaced(scheduler="twp").platform.routing == "round-robin"  # the file's own: kept
    # config.json keeps the router as the file gave it and re-runs the same run
    res = simulate_serverless(spec, tmp_path, num_requests=30)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["platform"]["router"] is None and res.summary["router"] == "round-robin"
    again = simulate_serverless(config)
    assert again.summary["router"] == "round-robin"
    assert np.array_equal(again.stats.e2e_ns, res.stats.e2e_ns) and again.instances == res.instances
    assert simulate_serverless(config, scheduler="fcfs", num_requests=5).summary["router"] == "least-loaded"


# ---- no request lost or duplicated; fast == step by step -------------------------------------------
# load-only models time a batch at once; the profile's step times depend on the context,
# so its batches are timed a few steps at a time (`ServerSim.extend`)
COST_MODELS = ["paper", "linear:c=5,a=0.05", "const:10", "profile:h200-llama-3.2-1b"]


@st.composite
def platforms(draw):
    n_models = draw(st.integers(1, 3))
    groups = []
    for g in range(draw(st.integers(1, 2))):
        groups.append(
            {
                "name": f"g{g}",
                "count": draw(st.integers(1, 2)),
                "gpus": draw(st.integers(1, 2)),
                "gpu_memory_gb": draw(st.sampled_from([40, 80])),
                "dram_gb": draw(st.sampled_from([0, 20, 50])),
                "dram_bandwidth_gbps": 20,
                "ssd_gb": draw(st.sampled_from([0, 30, 200])),
                "ssd_bandwidth_gbps": 5,
            }
        )
    models = {}
    for i in range(n_models):
        models[f"m{i}"] = {
            "weights_gb": draw(st.sampled_from([2, 10, 30])),
            "cost_model": draw(st.sampled_from(COST_MODELS)),
            "b_max": draw(st.sampled_from([32, 128, 512])),
            "kv_capacity": draw(st.sampled_from([None, 1200])),
        }
        if draw(st.booleans()):
            models[f"m{i}"]["k_max"] = draw(st.integers(2, 8))
    return {
        "cluster": {"remote_bandwidth_gbps": draw(st.sampled_from([2, 10])), "nodes": groups},
        "models": models,
        "workload": {
            "arrival": "gamma",
            "cv": draw(st.sampled_from([1, 3])),
            "rate": draw(st.sampled_from([2, 8, 20])),
            "popularity": draw(st.sampled_from(["uniform", "zipf:1.5"])),
            "num_requests": 120,
            "prompt": "uniform:1,300",
            "output": "uniform:1,200",
            "seed": draw(st.integers(0, 50)),
        },
        "platform": {
            "scheduler": draw(st.sampled_from(PLATFORM_SCHEDULERS)),
            "keep_alive_s": draw(st.sampled_from([0, 0.5, 3, "never"])),
            "scale_out_tokens": draw(st.sampled_from([0, 500, 5000])),
            "init_s": draw(st.sampled_from([0, 0.3])),
            "serverlessllm": {"alpha_s_per_token": draw(st.sampled_from([0.0001, 0.01]))},
        },
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(platforms())
def test_no_request_lost_or_duplicated_and_fast_equals_step_by_step(cfg):
    spec = load_serverless(cfg)
    fast = run_serverless(spec)
    n = len(fast.arrival_ns)
    assert (fast.e2e_ns >= 0).all()  # every request finished ...
    assert sum(r["completed"] for r in fast.instances) == n  # ... exactly once
    assert (fast.tokens == fast.output).all()  # with all its tokens
    assert fast.itl.count == int((fast.output - 1).sum())  # none emitted twice
    assert all(r["stop_ns"] >= 0 for r in fast.instances)
    _check_gpus(spec, fast)
    exact = run_serverless(spec, fast=False)
    for k in ("ttft_ns", "e2e_ns", "queue_ns", "instance", "migrations", "cold"):
        assert np.array_equal(getattr(fast, k), getattr(exact, k)), k
    assert fast.instances == exact.instances
    assert fast.itl.total == exact.itl.total and fast.end_ns == exact.end_ns


def test_busy_platform_with_migrations_loses_nothing():
    """Many models on few GPUs under ServerlessLLM: GPUs change hands by migration (3
    victims, 5 running requests handed over), reclaim and keep-alive; every request
    finishes once with all its tokens."""
    cfg = two_nodes(scheduler="serverlessllm", scale_out_tokens=200, keep_alive_s=0.5)
    cfg["cluster"]["nodes"][0]["gpus"] = 2
    cfg["models"] = {f"m{i}": {"weights_gb": 5, "cost_model": "paper", "b_max": 256} for i in range(5)}
    cfg["workload"] = {
        "arrival": "gamma",
        "cv": 3,
        "rate": 30,
        "popularity": "zipf:0.8",
        "num_requests": 600,
        "prompt": "uniform:1,400",
        "output": "uniform:1,300",
        "seed": 9,
    }
    cfg["platform"]["serverlessllm"] = {"alpha_s_per_token": 0.0005}
    spec = load_serverless(cfg)
    s = run_serverless(spec)
    assert s.migrations.sum() > 0
    assert sorted({r["stop_reason"] for r in s.instances}) == ["keep-alive", "migrated", "reclaimed"]
    assert (s.e2e_ns >= 0).all() and (s.tokens == s.output).all()
    assert s.itl.count == int((s.output - 1).sum())
    _check_gpus(spec, s)
    exact = run_serverless(spec, fast=False)
    assert np.array_equal(s.e2e_ns, exact.e2e_ns) and s.instances == exact.instances


# ---- the spec ---------------------------------------------------------------------------------------------
def test_popularity_splits_the_total_rate():
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "abc"}
    cfg["workload"] = {"rate": 10, "popularity": "zipf:1", "num_requests": 6000}
    reqs = make_serverless_requests(load_serverless(cfg))
    share = np.bincount(reqs.model, minlength=3) / len(reqs)
    assert share == pytest.approx(np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3), abs=0.02)
    cfg["workload"] = {
        "rate": 10,
        "popularity": {"a": 1, "c": 3},
        "num_requests": 4000,
        "models": {"b": {"share": 0}, "c": {"prompt": "const:77"}},
    }
    reqs = make_serverless_requests(load_serverless(cfg))
    share = np.bincount(reqs.model, minlength=3) / len(reqs)
    assert share == pytest.approx([0.25, 0, 0.75], abs=0.03)
    assert (reqs.prompt[reqs.model == 2] == 77).all()


@pytest.mark.parametrize(
    "workload",
    [{"popularity": {"a": 1e308, "b": 1e308}}, {"models": {"a": {"share": 1e308}, "b": {"share": 1e308}}}],
)
def test_weights_whose_sum_overflows_are_one_line(tmp_path, capsys, workload):
    """Each weight is finite but their sum is not: the shares were inf / inf = nan and the
    model draw raised numpy's ValueError ("Probabilities do not sum to 1"), a traceback."""
    from helpers import one_line_error

    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["workload"] = {"rate": 10, "num_requests": 40, **workload}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(cfg))
    line = one_line_error(capsys, ["simulate", "--serverless", str(path), "--out", ""], "big.yaml: workload.popularity")
    assert "sum to a finite number" in line
    with pytest.raises(ConfigError, match="sum to a finite number"):
        load_serverless(cfg)
    cfg["workload"] = {"rate": 10, "num_requests": 40, "popularity": {"a": 1e307, "b": 3e307}}  # (finite: it runs)
    assert np.bincount(make_serverless_requests(load_serverless(cfg)).model, minlength=2)[1] > 20


def test_popularity_null_is_uniform(tmp_path):
    """`popularity: null` validated (the draw read it as uniform), ran the whole simulation
    and then crashed writing config.json (`dict(None)`); it is the default, uniform."""
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["workload"] = {"rate": 10, "popularity": None, "num_requests": 40}
    res = simulate_serverless(cfg, out_dir=tmp_path)
    assert res.config["workload"]["popularity"] == "uniform"
    assert json.loads((tmp_path / "config.json").read_text())["workload"]["popularity"] == "uniform"
    cfg["workload"]["popularity"] = "uniform"
    assert np.array_equal(simulate_serverless(cfg).stats.req_model, res.stats.req_model)


def test_a_rate_per_model():
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["workload"] = {"duration_s": 200, "models": {"a": {"rate": 4}, "b": {"rate": 1, "arrival": "gamma", "cv": 2}}}
    reqs = make_serverless_requests(load_serverless(cfg))
    counts = np.bincount(reqs.model, minlength=2)
    assert counts[0] == pytest.approx(800, rel=0.15) and counts[1] == pytest.approx(200, rel=0.3)
    assert (np.diff(reqs.arrival_s) >= 0).all()


def test_a_model_with_its_own_arrival_kind_does_not_inherit_the_workloads_cv():
    """Workload `arrival: gamma, cv: 3` and model b `{rate: 9, arrival: poisson}`: b took
    the workload's cv, meant for gamma, and the file was refused (`cv=3.0 applies to gamma
    arrivals only`). A model keeping the workload's arrival still inherits its cv."""
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    wl = {"arrival": "gamma", "cv": 3, "num_requests": 4000, "models": {"a": {"rate": 1}, "b": {"rate": 9}}}
    cfg["workload"] = copy.deepcopy(wl)
    cfg["workload"]["models"]["b"]["arrival"] = "poisson"
    reqs = make_serverless_requests(load_serverless(cfg))
    cfg["workload"]["models"] = {"a": {"rate": 1, "arrival": "gamma", "cv": 3}, "b": {"rate": 9, "arrival": "poisson"}}
    same = make_serverless_requests(load_serverless(cfg))
    assert np.array_equal(reqs.arrival_s, same.arrival_s) and np.array_equal(reqs.model, same.model)

    def gaps_cv(i):
        g = np.diff(reqs.arrival_s[reqs.model == i])
        return g.std() / g.mean()

    assert gaps_cv(0) > 2 and gaps_cv(1) == pytest.approx(1, abs=0.1)  # a: gamma cv 3; b: poisson
    cfg["workload"] = wl  # b keeps the workload's gamma: its cv too
    bursty = make_serverless_requests(load_serverless(cfg))
    g = np.diff(bursty.arrival_s[bursty.model == 1])
    assert g.std() / g.mean() > 2


def test_a_trace_with_a_model_column(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,model\n0.5,10,2,b\n0.1,20,3,a\n2.0,5,1,b\n")
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["workload"] = {"trace": str(p)}
    reqs = make_serverless_requests(load_serverless(cfg))
    assert (
        list(reqs.arrival_s) == [0.1, 0.5, 2.0] and list(reqs.model) == [0, 1, 1] and list(reqs.prompt) == [20, 10, 5]
    )
    res = simulate_serverless(cfg)
    assert res.summary["completed"] == 3
    p.write_text("arrival_s,prompt_tokens,output_tokens,model\n0.5,10,2,zz\n")
    with pytest.raises(ConfigError, match="workload.trace: .*unknown model 'zz'"):
        make_serverless_requests(load_serverless(cfg))
    # the row and value are named ("times >= 0" alone for a nan sent users looking for a sign)
    for bad in ("nan", "-1"):
        p.write_text(f"arrival_s,prompt_tokens,output_tokens,model\n0.5,10,2,a\n{bad},10,2,b\n")
        with pytest.raises(ConfigError, match=f"arrival_s must be finite times >= 0, got {float(bad)!r} in data row 2"):
            make_serverless_requests(load_serverless(cfg))


def test_a_relative_trace_path_is_read_from_the_current_directory(tmp_path, monkeypatch):
    """As every path of a --config or --network file: from where the command runs, not
    from the YAML file's folder (the error says so)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,5\n")
    cfg = base()
    cfg["workload"] = {"trace": "t.csv"}
    (sub / "p.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"workload.trace: file t.csv does not exist \(a relative path is read from the current directory\)",
    ):
        load_serverless("sub/p.yaml")
    cfg["workload"]["trace"] = "sub/t.csv"
    (sub / "p.yaml").write_text(yaml.safe_dump(cfg))
    assert simulate_serverless("sub/p.yaml").summary["completed"] == 2
    monkeypatch.chdir(sub)
    with pytest.raises(ConfigError, match="file sub/t.csv does not exist"):
        load_serverless("p.yaml")


def test_kv_capacity_from_bytes_per_token_and_requests_that_cannot_fit():
    cfg = base()
    cfg["models"]["m"].update(kv_bytes_per_token=1e6)  # (0.9 x 80 - 10) GB / 1 MB = 62,000 tokens
    spec = load_serverless(cfg)
    assert spec.kv_capacity("m", spec.nodes[0]) == 62000
    cfg["models"]["m"].update(kv_bytes_per_token=None, kv_capacity=100)
    with pytest.raises(ConfigError, match="request 0 of model m needs 109 KV tokens"):
        run(cfg, [(0.0, "m", 100, 10)])


BAD = [
    (lambda c: c["cluster"]["nodes"][0].update(ssd=["nope"]), "cluster.nodes[0].ssd[0]: unknown model 'nope'"),
    (lambda c: c["workload"].update(models={"zz": {"share": 1}}), "workload.models.zz: unknown model 'zz'"),
    (lambda c: c["workload"].update(popularity={"q": 1}), "workload.popularity.q: unknown model 'q'"),
    # a key YAML reads as a number: it said "unknown model '8' (did you mean '8'?)"
    (lambda c: c["workload"].update(popularity={8: 1}), "keys of workload.popularity must be strings, got 8"),
    (
        lambda c: c["cluster"]["nodes"][0].update(ssd_bandwidth_gbps=-1),
        "cluster.nodes[0].ssd_bandwidth_gbps: must be a number > 0, got -1",
    ),
    (lambda c: c["cluster"].update(remote_bandwidth_gbps=-2), "cluster.remote_bandwidth_gbps: must be a number > 0"),
    (lambda c: c["models"]["m"].update(weights_gb=200), "models.m: no GPU is large enough: 200 GB"),
    # the weights fit: the line names the KV token, not the weights (it read "10 GB of weights
    # ... but the largest GPU offers 0.9 x 80 GB")
    (
        lambda c: c["models"]["m"].update(kv_bytes_per_token=1e12),
        "models.m: no GPU is large enough: one KV token (1e+12 bytes) does not fit beside",
    ),
    (lambda c: c["platform"].update(scheduler="fifo"), "platform.scheduler: unknown scheduler 'fifo'"),
    (lambda c: c["platform"].update(router="random"), "platform.router: unknown router 'random'"),
    (
        lambda c: c["platform"].update(scheduler="round-robin", router="least-loaded"),
        "platform.router: the round-robin",
    ),
    (lambda c: c["platform"].update(keep_alive_s=-1), "platform.keep_alive_s: must be a number >= 0"),
    (lambda c: c["models"]["m"].update(cost_model="nope"), "models.m.cost_model: unknown cost model"),
    (lambda c: c["models"]["m"].update(wieghts=3), "models.m: unknown key 'wieghts'"),
    (lambda c: c.update(extra=1), "unknown key 'extra'"),
    (lambda c: c.pop("models"), "models: missing section 'models'"),
    (lambda c: c["workload"].update(rate=None, num_requests=3), "workload: needs a total rate"),
    (lambda c: c["workload"].update(num_requests=None), "workload: needs num_requests or duration_s"),
    (lambda c: c["workload"].update(prompt="weird:3"), "workload.prompt: unknown length law"),
    (lambda c: c["cluster"]["nodes"][0].update(dram=["m"], dram_gb=5), "cluster.nodes[0].dram: the listed checkpoints"),
    (lambda c: c["models"]["m"].update(kv_capacity=10, kv_bytes_per_token=5), "models.m: give kv_bytes_per_token or"),
    (lambda c: c["platform"].update(serverlessllm={"load_speedup": 0}), "platform.serverlessllm.load_speedup: must be"),
    # sizes and times that no clock or memory could hold: one line, not a hang or an overflow
    (lambda c: c["cluster"]["nodes"][0].update(count=1e30), "cluster.nodes[0].count: must be at most 65,536"),
    # a number in quotes is text, as in a network file (it ran as the number)
    (
        lambda c: c["cluster"]["nodes"][0].update(gpus="2"),
        "cluster.nodes[0].gpus: must be a whole number >= 1, got '2' (a number in quotes: write it without them)",
    ),
    (lambda c: c["workload"].update(rate="5"), "workload.rate: must be a number > 0, got '5' (a number in quotes"),
    (lambda c: c["models"]["m"].update(weights_gb="16"), "models.m.weights_gb: must be a number > 0, got '16' (a"),
    # each group within its caps, the whole not: 65,536 nodes of 1,024 GPUs ran out of
    # memory after 19 s (MemoryError), and the number of groups was not capped at all
    (
        lambda c: c["cluster"]["nodes"][0].update(count=65536, gpus=1024),
        "cluster.nodes: 67,108,864 GPUs in all (nodes x GPUs per node: 65,536 x 1,024), more than the 1,048,576",
    ),
    (
        lambda c: c["cluster"].update(
            nodes=[{"name": f"g{i}x", "count": 65536, "gpus": 1, "gpu_memory_gb": 80} for i in range(17)]
        ),
        "cluster.nodes: 1,114,112 GPUs in all (nodes x GPUs per node: 65,536 x 1, 65,536 x 1, 65,536 x 1, ... "
        "(17 groups)), more than the 1,048,576 a platform may have",
    ),
    (lambda c: c["platform"].update(keep_alive_s=1e30), "platform.keep_alive_s: must be at most 1e+09"),
    (lambda c: c["platform"].update(init_s=1e30), "platform.init_s: must be at most 1e+09"),
    (
        lambda c: c["cluster"]["nodes"][0].update(ssd_bandwidth_gbps=1e-300),
        "models.m: loading 10 GB at 1e-300 GB/s (cluster.nodes[0]) takes 1e+301 s, more than 1e+09 s",
    ),
    # a name stripped in tiers and traces but not as the key: "m " in a tier meant model "m"
    (
        lambda c: c["models"].update({"m ": {"weights_gb": 40, "cost_model": "const:10"}}),
        "models: model name 'm ' has spaces at its start or end; write it 'm'",
    ),
]


@pytest.mark.parametrize("mutate,message", BAD)
def test_bad_spec_is_one_clear_config_error(mutate, message):
    cfg = copy.deepcopy(base())
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        load_serverless(cfg)
    text = str(e.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    "path, value, shown",
    [
        ("platform", False, "False (bool)"),
        ("platform", 0, "0 (int)"),
        ("platform", "", "'' (str)"),
        ("platform", [], "[] (list)"),
        ("run", [], "[] (list)"),
        ("workload", 5, "5 (int)"),
        ("platform.serverlessllm", False, "False (bool) (to turn its live migration off: serverlessllm: {migration"),
        ("workload.models", 0, "0 (int)"),
    ],
)
def test_a_section_of_another_type_is_refused_not_taken_as_empty(tmp_path, path, value, shown):
    """`d.get(section) or {}` took `platform: false`, `run: []` or `workload.models: 0` for
    an empty section (exit 0, every default), and `serverlessllm: false` left migration on."""
    cfg = copy.deepcopy(base(scheduler="serverlessllm"))
    *parents, key = path.split(".")
    node = cfg
    for k in parents:
        node = node[k]
    node[key] = value
    what = key if key != "models" else path
    message = f"{path}: {what} must be a mapping, got {shown}"
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as e:
        load_serverless(cfg)
    assert "\n" not in str(e.value)
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="^p.yaml: " + re.escape(message)):
        load_serverless(str(f))
    node[key] = None  # null (`platform:` with nothing after it) is a section left out
    if path != "workload":  # (an empty workload has no rate)
        load_serverless(cfg)


def test_a_float_seed_past_2_53_is_refused_and_an_integer_seed_is_kept_exactly(tmp_path):
    """`seed: 1e308` (a float in YAML) ran as a 309-digit seed that no one wrote, where
    `--seed 1e308` is refused; and an integer seed went through a float (2**64 + 3 ran as
    2**64)."""
    cfg = copy.deepcopy(base())
    cfg["workload"]["seed"] = 1e308
    message = "workload.seed: seed must be a whole number >= 0 written as an integer, got 1e+308"
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_serverless(cfg)
    for seed in (2**64 + 3, 10**30 + 1):
        cfg["workload"]["seed"] = seed
        spec = load_serverless(cfg)
        assert spec.workload.seed == seed and spec.replaced(seed=seed + 1).workload.seed == seed + 1
    cfg["workload"]["seed"] = 3.0  # a whole float below 2**53 is its integer
    assert load_serverless(cfg).workload.seed == 3
    with pytest.raises(ConfigError, match="^seed must be a whole number >= 0 written as an integer"):
        load_serverless(cfg).replaced(seed=1e308)


def test_a_platform_of_the_most_gpus_allowed_loads_and_one_more_is_refused_on_the_command_line(tmp_path, capsys):
    """The cap on all GPUs together: 1,048,576 of them (16 node groups of 65,536 nodes of
    one GPU: one node object per GPU, the most memory per GPU) load; one GPU more is one
    line, exit 2, naming the total and the cap."""
    from llmsched.cli import main

    cfg = base()
    cfg["cluster"]["nodes"] = [{"name": f"g{i}x", "count": 65536, "gpus": 1, "gpu_memory_gb": 80} for i in range(16)]
    assert load_serverless(cfg).num_gpus == 1 << 20
    cfg["cluster"]["nodes"].append({"name": "one", "count": 1, "gpus": 1, "gpu_memory_gb": 80})
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["simulate", "--serverless", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "big.yaml: cluster.nodes: 1,048,577 GPUs in all" in err and "1,048,576" in err


def test_node_names_two_groups_make_alike_are_refused(tmp_path, capsys):
    """`node` x 2 names its nodes node0 and node1, as does a group `node1`: instances.csv
    showed two instances on `node1/gpu0` (of different nodes)."""
    from helpers import one_line_error

    cfg = base()
    group = cfg["cluster"]["nodes"][0]
    cfg["cluster"]["nodes"] = [{**group, "name": "node", "count": 2}, {**group, "name": "node1"}]
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(cfg))
    line = one_line_error(capsys, ["simulate", "--serverless", str(path), "--out", str(tmp_path / "o")], "'node1'")
    assert "cluster.nodes[0], group 'node' (count 2" in line and "cluster.nodes[1], group 'node1'" in line
    assert not (tmp_path / "o").exists()
    cfg["cluster"]["nodes"][1]["name"] = "other"
    assert [g.node_names() for g in load_serverless(cfg).nodes] == [["node0", "node1"], ["other"]]


def test_a_slow_tier_that_cannot_hold_the_checkpoint_is_never_a_load_source():
    cfg = base()
    cfg["cluster"]["nodes"][0].update(ssd_gb=0, ssd_bandwidth_gbps=1e-300)  # no SSD to load from
    load_serverless(cfg)  # no "loading ... takes" error: the remote store and DRAM serve it
    cfg["cluster"]["nodes"][0].update(ssd_gb=100)
    with pytest.raises(ConfigError, match="loading 10 GB at 1e-300 GB/s"):
        load_serverless(cfg)


def test_a_token_budget_past_the_limit_names_the_model():
    cfg = base()
    cfg["models"]["m"]["b_max"] = 10**30  # once an overflow (a histogram of b_max + 1 counts)
    with pytest.raises(ConfigError, match="^models.m: b_max must be at most 1,048,576 tokens per step") as e:
        simulate_serverless(cfg)
    assert "\n" not in str(e.value)


def test_bad_scheduler_options_name_the_model():
    cfg = base(scheduler="twp")
    cfg["models"]["m"]["admission_options"] = {"nope": 1}
    with pytest.raises(ConfigError, match="^models.m: admission policy 'twp': unknown option 'nope'"):
        simulate_serverless(cfg)


def test_options_a_policy_does_not_take_and_unknown_policies_are_one_line_naming_the_file(tmp_path, capsys):
    """Flat admission options for TWP under --platform-scheduler fcfs leaked a TypeError
    (`admission policy 'fcfs': FCFS() takes no arguments`); `{twp: 3}` was read as flat
    options (`twp: unknown option 'twp'`); an unknown admission or batch policy passed
    load_serverless and failed when the run began, without the file's name."""
    from helpers import one_line_error

    from llmsched.policies import make_admission_policy, make_batch_policy

    cfg = base(scheduler="twp")
    cfg["models"]["m"]["admission_options"] = {"itl_target_ms": 40}
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert simulate_serverless(str(path)).summary["completed"] == 1  # twp takes it
    for sched in ("fcfs", "serverlessllm", "priority"):
        with pytest.raises(ConfigError) as e:
            simulate_serverless(str(path), scheduler=sched)
        adm = "spf" if sched == "priority" else "fcfs"
        assert str(e.value) == (
            f"flat.yaml: models.m: admission policy '{adm}': unknown option 'itl_target_ms' ({adm} takes no options)"
        )
    line = one_line_error(capsys, ["simulate", "--serverless", str(path), "--platform-scheduler", "fcfs", "--out", ""])
    assert "unknown option 'itl_target_ms'" in line and "takes no arguments" not in line
    cfg["models"]["m"]["admission_options"] = {"twp": {"itl_target_ms": 40}}  # keyed: only twp's
    path.write_text(yaml.safe_dump(cfg))
    assert simulate_serverless(str(path), scheduler="fcfs").summary["completed"] == 1
    for opts, message in (
        ({"twp": 3}, "models.m.admission_options.twp: the options of admission policy twp must be a mapping"),
        ({"twp": {"h_min": 16}, "itl_target_ms": 40}, "models.m.admission_options: mixes options keyed by"),
    ):
        cfg["models"]["m"]["admission_options"] = opts
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            load_serverless(cfg)
    cfg["models"]["m"]["admission_options"] = {}
    for key, message in (("admission", "unknown admission policy 'nope'"), ("policy", "unknown batch policy 'nope'")):
        bad = copy.deepcopy(cfg)
        bad["models"]["m"][key] = "nope"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError, match=f"^flat.yaml: models.m: {message}"):
            simulate_serverless(str(path))
        one_line_error(capsys, ["simulate", "--serverless", str(path), "--out", ""], f"flat.yaml: models.m: {message}")
    # the same message for one server
    with pytest.raises(ConfigError, match=r"^admission policy 'spf': unknown option 'x' \(spf takes no options\)$"):
        make_admission_policy("spf", x=1)
    with pytest.raises(ConfigError, match=r"^batch policy 'adaptive': unknown option 'x' \(known: cost, mean_prompt"):
        make_batch_policy("adaptive", x=1)


def test_bad_yaml_file_is_one_line(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("cluster: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as e:
        load_serverless(str(p))
    assert "\n" not in str(e.value)
    p.write_text(
        "cluster:\n  nodes: [{gpus: 1, gpu_memory_gb: 24}]\nmodels:\n  big: {weights_gb: 40}\n"
        "workload: {rate: 1, num_requests: 1}\n"
    )
    with pytest.raises(ConfigError, match="^p.yaml: models.big: no GPU is large enough") as e:
        load_serverless(str(p))
    with pytest.raises(ConfigError, match="does not exist"):
        load_serverless(str(tmp_path / "missing.yaml"))


# ---- the example, the API and the files --------------------------------------------------------------
@pytest.mark.parametrize("scheduler", PLATFORM_SCHEDULERS)
def test_the_example_runs_under_every_scheduler(scheduler):
    res = simulate_serverless(EXAMPLE, scheduler=scheduler, num_requests=60)
    s = res.summary
    assert s["scheduler"] == scheduler and s["completed"] == 60 and s["cold_starts"] >= 3
    assert set(s["models"]) == {"llama-3-8b", "llama-3.2-1b", "codellama-34b"}
    assert sum(m["completed"] for m in s["models"].values()) == 60
    for key in (
        "request_throughput",
        "p50_ttft_ms",
        "p95_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "itl_cv",
        "p99_e2el_ms",
        "cold_start_time_s",
        "gpu_seconds",
        "instances_used",
    ):
        assert s[key] is not None and s[key] >= 0, key


def test_the_crowded_example_loses_nothing():
    spec = load_serverless("examples/serverless/crowded.yaml").replaced(num_requests=300)
    s = run_serverless(spec)
    assert (s.e2e_ns >= 0).all() and (s.tokens == s.output).all()
    assert s.itl.count == int((s.output - 1).sum())
    _check_gpus(spec, s)


def test_a_time_limit_stops_the_run_and_the_gpu_bill_there():
    res = simulate_serverless(EXAMPLE, scheduler="fcfs", num_requests=300, max_time_s=20)
    s = res.summary
    assert 0 < s["completed"] < 300 and s["unfinished"] == 300 - s["completed"]
    assert s["arrived"] == int((res.stats.arrival_ns < 20 * NS).sum()) < 300
    for i in res.instances:  # at the limit, or at the end of its step that crosses it
        assert i["stop_reason"] == "time limit"
        assert i["stop_ns"] == 20 * NS or (20 * NS < i["stop_ns"] <= 20 * NS + 200 * MS and i["busy_ns"] > 0)
        assert i["busy_ns"] <= i["stop_ns"] - i["gpu_from_ns"]
    assert s["sim_end_s"] == max(i["stop_ns"] for i in res.instances) / NS
    assert s["gpu_seconds"] <= 20.2 * s["gpus"]


@pytest.mark.parametrize("limit", [3, 20, None])
def test_cold_starts_count_only_the_starts_that_finished_under_a_time_limit(limit):
    """An instance still starting at the limit used to count in `cold_starts` (3 s: 5 cold
    starts, none finished, total 0 s; its begun load in `loads_by_tier`); now it counts in
    `cold_starts_unfinished`, and `cold_starts` x the mean is the total."""
    res = simulate_serverless(EXAMPLE, scheduler="fcfs", num_requests=300, max_time_s=limit)
    s = res.summary
    ready = [i for i in res.instances if i["ready_ns"] >= 0]
    assert s["cold_starts"] == len(ready) and s["cold_starts_unfinished"] == len(res.instances) - len(ready)
    assert sum(s["loads_by_tier"].values()) == sum(1 for i in res.instances if i["loaded_ns"] >= 0)
    if s["cold_starts"]:
        assert s["cold_start_time_s"] == pytest.approx(s["cold_starts"] * s["mean_cold_start_s"])
    for name, m in s["models"].items():
        rows = [i for i in res.instances if i["model"] == name]
        assert m["cold_starts"] + m["cold_starts_unfinished"] == len(rows)
    if limit is None:
        assert s["cold_starts_unfinished"] == 0
    if limit == 3:
        assert s["cold_starts"] == 0 and s["cold_starts_unfinished"] == 5 and s["cold_start_time_s"] == 0


def test_a_time_limit_keeps_the_step_that_crosses_it_as_one_server_does():
    """One request decoding across the limit: the fast path's last batch (hundreds of steps,
    its end past the limit) used to be dropped whole, 1 step against the step-by-step
    path's 385; both keep every step that starts before the limit, the last one crossing
    it, like the single-server simulator, and the GPU is billed until that step ends."""
    cfg = base()
    cfg["models"]["m"]["cost_model"] = "paper"
    rows = [(1.0, "m", 100, 1000)]
    spec = load_serverless(cfg)
    names = list(spec.models)
    reqs = ServerlessRequests(np.array([1.0]), np.array([100]), np.array([1000]), np.array([0]), names)
    fast = run_serverless(spec, max_time_s=20, requests=reqs)
    exact = run_serverless(spec, max_time_s=20, requests=reqs, fast=False)
    assert fast.steps == exact.steps > 250 and fast.itl.count == exact.itl.count == fast.steps - 1
    assert fast.instances == exact.instances and fast.end_ns == exact.end_ns
    i = inst(fast, 0)
    step = fast.itl.total // fast.itl.count  # one request decoding: every step takes as long
    assert 20 * NS < i["stop_ns"] == fast.end_ns < 20 * NS + step  # the crossing step ends there
    assert i["ready_ns"] + i["busy_ns"] == i["stop_ns"]  # busy from ready to the end, no gap
    assert fast.tokens[0] == 0 and fast.e2e_ns[0] < 0  # unfinished, its first token reported
    assert fast.ttft_ns[0] == exact.ttft_ns[0] > 0
    full = run(cfg, rows)
    assert fast.ttft_ns[0] == full.ttft_ns[0]


@pytest.mark.parametrize("scheduler", PLATFORM_SCHEDULERS)
def test_fast_equals_step_by_step_under_a_time_limit(scheduler):
    spec = load_serverless("examples/serverless/crowded.yaml").replaced(num_requests=300)
    for limit in (5.81, 10.6, 31.12):
        fast = simulate_serverless(spec, scheduler=scheduler, max_time_s=limit)
        exact = simulate_serverless(spec, scheduler=scheduler, max_time_s=limit, fast=False)
        a, b = dict(fast.summary), dict(exact.summary)
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b, (limit, [k for k in a if a[k] != b[k]])
        assert a["steps"] > 0 and a["itl_count"] > 0 and a["busy_gpu_seconds"] > 0
        for k in ("ttft_ns", "e2e_ns", "queue_ns", "tokens", "preemptions", "migrations", "arrived"):
            assert np.array_equal(getattr(fast.stats, k), getattr(exact.stats, k)), (limit, k)
        assert fast.instances == exact.instances


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(platforms(), st.floats(0.05, 25))
def test_a_time_limit_is_the_same_run_stopped_and_fast_equals_step_by_step(cfg, limit):
    """The run stopped at `limit` is the full run up to there: every request reports what it
    reached by then (first token, first scheduling, finish), wherever it is: at an
    instance, in a migration's hand-over, or waiting for an instance to start."""
    spec = load_serverless(cfg)
    cut = run_serverless(spec, max_time_s=limit)
    exact = run_serverless(spec, max_time_s=limit, fast=False)
    for k in ("ttft_ns", "e2e_ns", "queue_ns", "instance", "migrations", "cold", "tokens", "preemptions", "arrived"):
        assert np.array_equal(getattr(cut, k), getattr(exact, k)), k
    assert cut.instances == exact.instances
    for k in ("steps", "end_ns"):
        assert getattr(cut, k) == getattr(exact, k), k
    assert (cut.itl.count, cut.itl.total) == (exact.itl.count, exact.itl.total)
    for r in cut.instances:
        assert r["gpu_from_ns"] < 0 or r["busy_ns"] <= r["stop_ns"] - r["gpu_from_ns"]
    full = run_serverless(spec)
    t = ns(limit)
    assert np.array_equal(cut.arrived, full.arrival_ns < t)
    for k in ("ttft_ns", "queue_ns", "e2e_ns"):
        reached = (getattr(full, k) >= 0) & (full.arrival_ns + getattr(full, k) < t)
        assert np.array_equal(getattr(cut, k)[reached], getattr(full, k)[reached]), k
        assert (getattr(cut, k)[~cut.arrived] < 0).all(), k


def test_a_time_limit_during_a_migration_keeps_what_the_migrated_requests_reached():
    """crowded.yaml under ServerlessLLM (0.3 ms per recomputed token) stopped at 8.5 s while
    a chat instance is migrating (from 8.16 s; request 221 hands over at 8.31 s, request
    233 at 9.0 s): 233 is still at its source, in the system, with its first token and
    scheduling reported; the victim still holds its GPU."""
    cfg = yaml.safe_load(open("examples/serverless/crowded.yaml"))
    cfg["platform"]["serverlessllm"]["alpha_s_per_token"] = 0.0003
    spec = load_serverless(cfg).replaced(num_requests=300)
    full = run_serverless(spec)
    victim = next(r for r in full.instances if r["stop_reason"] == "migrated")
    assert victim["instance"] == 0 and full.migrations[221] == full.migrations[233] == 1
    cut = run_serverless(spec, max_time_s=8.5)
    exact = run_serverless(spec, max_time_s=8.5, fast=False)
    assert cut.instances == exact.instances and np.array_equal(cut.ttft_ns, exact.ttft_ns)
    assert cut.migrations[221] == 1 and cut.instance[221] != 0
    moving = np.flatnonzero((full.migrations > 0) & (cut.migrations == 0))
    assert 233 in moving and (cut.e2e_ns[moving] < 0).all() and (cut.instance[moving] == 0).all()
    assert (cut.ttft_ns[moving] == full.ttft_ns[moving]).all() and (cut.ttft_ns[moving] > 0).all()
    assert (cut.queue_ns[moving] == full.queue_ns[moving]).all() and cut.arrived[moving].all()
    assert cut.instances[0]["stop_reason"] == "time limit"


def test_a_time_limit_before_the_first_arrival_ends_the_clock_there():
    res = simulate_serverless(EXAMPLE, scheduler="fcfs", num_requests=20, max_time_s=0.01)
    s = res.summary
    assert res.stats.arrival_ns.min() > 0.01 * NS
    assert s["sim_end_s"] == 0.01 and s["arrived"] == 0 and s["completed"] == 0 and s["duration"] == 0.0


def test_a_time_limit_before_any_completion_reports_the_time_simulated():
    res = simulate_serverless(EXAMPLE, scheduler="fcfs", num_requests=50, max_time_s=3)
    s = res.summary
    assert s["completed"] == 0 and s["sim_end_s"] == 3.0
    first = float(res.stats.arrival_ns.min()) / NS
    assert s["duration"] == pytest.approx(3.0 - first)  # not a 1e-12 placeholder
    assert s["request_throughput"] == s["output_throughput"] == 0.0


def test_files(tmp_path):
    res = simulate_serverless(EXAMPLE, out_dir=tmp_path, scheduler="serverlessllm", num_requests=40, seed=2)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["completed"] == 40 and summary["gpu_seconds"] > 0
    config = json.loads((tmp_path / "config.json").read_text())
    again = simulate_serverless(config)  # config.json reproduces the run
    assert np.array_equal(again.stats.e2e_ns, res.stats.e2e_ns)
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40 and {"model", "instance", "ttft_s", "migrations", "cold_start"} <= set(rows[0])
    assert {r["model"] for r in rows} <= {"llama-3-8b", "llama-3.2-1b", "codellama-34b"}
    with open(tmp_path / "instances.csv") as f:
        inst = list(csv.DictReader(f))
    assert len(inst) == summary["instances_used"]
    assert {r["instance"] for r in rows} <= {r["instance"] for r in inst}
    assert sum(float(r["gpu_seconds"]) for r in inst) == pytest.approx(summary["gpu_seconds"], rel=1e-6)


def test_overrides_scale_the_rate_and_keep_the_spec():
    spec = load_serverless(EXAMPLE)
    fast = spec.replaced(scale=2, scheduler="priority", seed=5, num_requests=50)
    assert fast.workload.rate == 2 * spec.workload.rate and fast.platform.scheduler == "priority"
    assert spec.platform.scheduler == "twp" and spec.workload.num_requests == 2000
    with pytest.raises(ConfigError, match="scheduler: unknown scheduler"):
        spec.replaced(scheduler="lifo")


def test_the_table_prints_a_dash_for_what_a_run_stopped_early_has_not_measured(tmp_path, capsys):
    """--max-time before the first arrival: no GPU-seconds, so no busy share (None); the
    table (not --json) printed it with a format and crashed with a TypeError."""
    from llmsched.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(base()))
    assert main(["simulate", "--serverless", str(path), "--max-time", "0.1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "0 (-)" in out and "0 / 0 / 1" in out  # GPU-seconds (busy share); completed / arrived / all
    assert "unfinished" not in out  # no instance started before the limit
    assert main(["simulate", "--serverless", str(path), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "1 / 1" in out and "%" in out


def test_a_request_taken_off_an_instance_leaves_no_completion_entry_there():
    # a preempted decoder keeps a stale completion entry; while the victim of a migration
    # decodes on, an entry left for a request that moved could match the activation number
    # it gets at another instance (review of the two-round hand-over)
    from llmsched.core.request import Request
    from llmsched.policies import make_scheduler
    from llmsched.sim.serverless import _State

    sched = make_scheduler("sarathi", b_max=64)
    st = _State(sched.constraints, sched.admission.waiting_key())
    r = Request(0, 0, 10, 5, "m")
    st.add(r)
    for t in (0, 10):  # the prefill step, then its first decode step activates it
        plan = sched.plan(st)
        st.begin_step(plan, t)
        st.end_step(plan, t + 10)
    assert [e[2] for e in st._heap] == [r]
    st._preempt(r, 20)
    st.take(r, 20)
    assert st._heap == [] and not st.running and not st.waiting


def test_slo_reports_goodput_overall_and_per_model(tmp_path, capsys):
    """`--slo` with `--serverless` (refused before): goodput counts the finished requests
    within every objective, as requests.csv's columns show them, overall and per model."""
    from helpers import one_line_error

    from llmsched.cli import main

    out = tmp_path / "o"
    argv = ["simulate", "--serverless", EXAMPLE, "--num-requests", "400", "--out", str(out)]
    assert main([*argv, "--slo", "ttft_ms=500", "--slo", "itl=30", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["slo"] == {"ttft_ms": 500.0, "itl_ms": 30.0}
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    good = {}
    for r in rows:
        ok = r["finished"] == "1" and float(r["ttft_s"]) <= 0.5 and (r["tpot_s"] == "" or float(r["tpot_s"]) <= 0.030)
        good[r["model"]] = good.get(r["model"], 0) + ok
    done = {m: sum(r["finished"] == "1" and r["model"] == m for r in rows) for m in good}
    assert 0 < sum(good.values()) < len(rows)  # the limits bite, not all or nothing
    assert s["goodput_share"] == pytest.approx(sum(good.values()) / sum(done.values()))
    assert s["goodput"] == pytest.approx(sum(good.values()) / s["duration"])
    for m, block in s["models"].items():
        assert block["goodput_share"] == (pytest.approx(good[m] / done[m]) if done[m] else None)
    # without --slo no goodput; a run statistic is not a per-request SLO
    assert main([*argv, "--json"]) == 0
    assert "goodput" not in json.loads(capsys.readouterr().out)
    one_line_error(capsys, [*argv, "--slo", "p99_itl_ms=30"], "per request")


def test_an_objective_met_exactly_is_met_whenever_the_request_ran():
    """Every request's TPOT is exactly 10 ms (10 ms steps): one arriving at 110 s failed
    `itl_ms=10`, its (116.03 - 116.01) / 2 coming to 10.000000000000231 ms in float
    seconds. Objectives are compared on the clock's integer nanoseconds."""
    cfg = base(init_s=1, keep_alive_s=1)
    rows = [(t, "m", 10, 3) for t in (0, 30, 50, 70, 90, 110, 1234.567)]
    spec = load_serverless(cfg)
    stats = run(cfg, rows)
    assert ((stats.e2e_ns - stats.ttft_ns) == 2 * 10 * MS).all()
    from llmsched.sim.serverless_result import ServerlessResult

    for slo, share in (({"itl_ms": 10}, 1.0), ({"tpot_ms": 9.999999}, 0.0), ({"e2el_ms": 6030}, 1.0)):
        res = ServerlessResult(stats, spec.to_dict(), wall_s=0.0, slo=slo)
        assert res.summary["goodput_share"] == share, slo
    ttft = int(stats.ttft_ns[0])  # a cold start: the longest
    res = ServerlessResult(stats, spec.to_dict(), wall_s=0.0, slo={"ttft_ms": ttft / 1e6, "tpot_ms": 10})
    assert res.summary["goodput_share"] == 1.0


def test_asking_a_trace_for_more_requests_than_it_has_says_so(tmp_path):
    from llmsched.core.errors import InputWarning

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,model\n0,10,3,m\n1,10,3,m\n")
    cfg = base()
    cfg["workload"] = {"trace": str(trace), "num_requests": 5}
    with pytest.warns(InputWarning, match="the trace has 2 requests: num_requests=5 replays them all"):
        assert len(make_serverless_requests(load_serverless(cfg)).arrival_s) == 2
    import warnings

    from llmsched.analysis.reproduce_twp import platform_capacity

    with warnings.catch_warnings():  # asked not to warn, and the capacity's "up to N" sample
        warnings.simplefilter("error", InputWarning)
        assert len(make_serverless_requests(load_serverless(cfg), warn_short=False).arrival_s) == 2
        assert platform_capacity(load_serverless(cfg), samples=5)["models"]["m"]["share"] == 1.0


def test_workload_options_that_would_do_nothing_are_refused():
    """`time_scale` divides a trace's times and `popularity` splits a total rate or a
    trace: for synthetic arrivals, or with a rate per model, they were accepted, recorded
    in config.json, and changed nothing."""
    cfg = base()
    cfg["workload"]["time_scale"] = 4
    with pytest.raises(ConfigError, match=r"workload.time_scale: divides a trace's times"):
        load_serverless(cfg)
    cfg = base()
    cfg["workload"] = {"models": {"m": {"rate": 3}}, "duration_s": 10, "popularity": "zipf:1.2"}
    with pytest.raises(ConfigError, match=r"workload.popularity: splits a total rate"):
        load_serverless(cfg)
    cfg["workload"]["popularity"] = "Uniform"  # the default, however spelled
    load_serverless(cfg)
    cfg = base()
    cfg["workload"]["popularity"] = "zipf:1.2"  # with a total rate it chooses the model
    load_serverless(cfg)


def test_options_keyed_for_a_policy_not_in_use_are_checked_too():
    """`{twp: {h_min: 0}}` under FCFS passed: the error came only once someone switched the
    platform scheduler to twp."""
    cfg = base(scheduler="fcfs")
    for opts, message in (
        ({"twp": {"h_min": 0}}, "models.m.admission_options.twp: twp: h_min must be an integer >= 1"),
        ({"twp": {"nope": 1}}, "models.m.admission_options.twp: admission policy 'twp': unknown option 'nope'"),
        (
            {"twp": {"itl_target_ms": 40}, "dynamic-batch": {"c_max": 0}},
            "models.m.admission_options.dynamicbatch: dynamicbatch: c_max must be an integer >= 1",
        ),
    ):
        cfg["models"]["m"]["admission_options"] = opts
        for sched in ("fcfs", "serverlessllm"):
            with pytest.raises(ConfigError, match="^" + re.escape(message)):
                simulate_serverless(cfg, scheduler=sched)
    # the policy in use names the model alone, as before
    with pytest.raises(ConfigError, match="^models.m: dynamicbatch: c_max must be"):
        simulate_serverless(cfg, scheduler="dynamicbatch")
    cfg["models"]["m"]["admission_options"] = {"twp": {"h_min": 16}, "dynamicbatch": {"c_max": 2}}
    assert simulate_serverless(cfg).summary["completed"] == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"arrival": "gamma"}, "workload.arrival: a trace keeps its own arrival times"),
        ({"arrival": "weird"}, "workload.arrival: a trace keeps its own arrival times"),
        ({"prompt": "const:5"}, "workload.prompt: a trace keeps its own prompt lengths"),
        ({"output": "const:7"}, "workload.output: a trace keeps its own output lengths"),
        ({"models": {"a": {"prompt": "const:5"}}}, "workload.models.a.prompt: a trace keeps its own prompt"),
        ({"popularity": "zipf:3"}, "workload.trace: has a model column naming each request's model: workload.pop"),
        ({"models": {"a": {"share": 100}}}, "workload.trace: has a model column .*workload.models.a.share does"),
    ],
)
def test_a_trace_refuses_what_it_would_ignore(tmp_path, extra, message):
    """Each of these ran the trace as it is, silently (`arrival: weird` was never read)."""
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,model\n0,100,10,a\n0.5,200,20,b\n1,50,5,a\n")
    cfg = base()
    cfg["models"] = {k: {"weights_gb": 10, "cost_model": "const:10"} for k in "ab"}
    cfg["workload"] = {"trace": str(p), **extra}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="^p.yaml: " + message):
        simulate_serverless(str(path))
    cfg["workload"] = {"trace": str(p)}
    res = simulate_serverless(cfg, out_dir=str(tmp_path / "run"))
    assert res.summary["completed"] == 3
    # a run's config.json, which records the default length laws, runs again
    again = simulate_serverless(str(tmp_path / "run" / "config.json"))
    assert again.summary["completed"] == 3


def test_a_trace_is_not_an_arrival_process():
    cfg = base()
    for arrival in ("azure-conv", "trace:x.csv"):
        cfg["workload"] = {"rate": 1, "num_requests": 1, "arrival": arrival}
        with pytest.raises(ConfigError, match="^workload.arrival: a trace is given as workload.trace"):
            load_serverless(cfg)


def test_a_request_too_large_for_the_smaller_gpus_names_their_node_group(tmp_path):
    cfg = base()
    node = cfg["cluster"]["nodes"][0]
    cfg["cluster"]["nodes"] = [{**node, "name": "small", "gpu_memory_gb": 24}, {**node, "name": "big"}]
    cfg["models"]["m"] = {"weights_gb": 16, "kv_bytes_per_token": 131072, "cost_model": "const:10"}
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,50000,10\n")
    cfg["workload"] = {"trace": str(p)}
    with pytest.raises(ConfigError, match="needs 50009 KV tokens .* but an instance on node group small holds 42724"):
        simulate_serverless(cfg)


def _run_files(out) -> dict:
    """A run's files, the summary without its wall time."""
    files = {f: (out / f).read_text() for f in ("requests.csv", "instances.csv", "config.json")}
    summary = json.loads((out / "summary.json").read_text())
    del summary["wall_s"]
    return {**files, "summary": summary}


def test_a_runs_config_json_records_its_options_and_reproduces_it(tmp_path, capsys):
    """config.json recorded the platform but not the run's own options: a run cut by
    --max-time 12 (284 of 300 requests completed), rerun from its config.json, completed
    all 300; --slo's goodput and --exact were lost too. It records them now (`run`), and
    the rerun is the same run, file for file (the flags baked into the platform as well:
    --platform-scheduler, --num-requests, --seed, --scale)."""
    from llmsched.cli import main

    flags = ["--num-requests", "300", "--max-time", "12", "--exact", "--slo", "ttft_ms=3000"]
    flags += ["--seed", "3", "--scale", "1.5", "--platform-scheduler", "serverlessllm"]
    first, again = tmp_path / "first", tmp_path / "again"
    assert main(["simulate", "--serverless", "examples/serverless/crowded.yaml", *flags, "--out", str(first)]) == 0
    assert main(["simulate", "--serverless", str(first / "config.json"), "--out", str(again)]) == 0
    capsys.readouterr()
    ran = _run_files(first)
    assert json.loads(ran["config.json"])["run"] == {"max_time_s": 12.0, "fast": False, "slo": {"ttft_ms": 3000.0}}
    assert ran["summary"]["completed"] < ran["summary"]["num_requests"] == 300 and "goodput" in ran["summary"]
    assert _run_files(again) == ran
    # the API reads it back too; an argument given replaces the file's option
    config = json.loads((first / "config.json").read_text())
    res = simulate_serverless(config)
    assert res.summary["completed"] == ran["summary"]["completed"] and res.slo == {"ttft_ms": 3000.0}
    longer = simulate_serverless(config, max_time_s=1000, slo={"e2el_ms": 1e6})
    assert longer.summary["completed"] == 300 and longer.config["run"]["max_time_s"] == 1000
    assert longer.slo == {"e2el_ms": 1e6} and longer.config["run"]["fast"] is False
    # a platform file may set them; a mistake there is one line naming its place
    cfg = base()
    cfg["workload"] = {"arrival": "deterministic", "rate": 1, "num_requests": 5}
    cfg["run"] = {"max_time_s": 2.5}
    assert simulate_serverless(cfg).summary["arrived"] == 2  # (at 1 and 2 s)
    for run_options, message in (
        ({"max_time_s": -1}, "run.max_time_s: must be a positive number of seconds up to 1e+09 (or null), got -1"),
        ({"fast": "yes"}, "run.fast: must be true or false, got 'yes'"),
        ({"slo": {"ttft": "x"}}, "run.slo: SLO ttft must be a positive number of milliseconds, got 'x'"),
        ({"max_time": 3}, "run: unknown key 'max_time'"),
        (3, "run: run must be a mapping, got 3"),
    ):
        cfg["run"] = run_options
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            simulate_serverless(cfg)


def test_config_json_records_each_models_twp_constants_as_a_single_server_run(tmp_path):
    """A serverless run's config.json left out what TWP derived from each model's b_max and
    cost model (its window bounds, B_max, ...), which a single-server run records."""
    from llmsched.api import simulate

    cfg = base(scheduler="twp")
    cfg["models"] = {
        "small": {"weights_gb": 10, "cost_model": "paper", "b_max": 256},
        "large": {"weights_gb": 10, "cost_model": "paper", "b_max": 1024, "k_max": 64},
    }
    cfg["workload"] = {"rate": 2, "num_requests": 20, "popularity": "uniform"}
    simulate_serverless(cfg, out_dir=tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for name, m in cfg["models"].items():
        recorded = config["schedulers"][name]
        alone = simulate(admission="twp", cost_model="paper", b_max=m["b_max"], k_max=m.get("k_max"), num_requests=5)
        assert recorded["admission"] == alone.config["scheduler"]["admission"]
        assert recorded["admission"]["resolved"]["H_max"] == m["b_max"]  # each model's own b_max
        assert recorded["batch_policy"] == "sarathi" and recorded["b_max"] == m["b_max"]
        assert recorded["k_max"] == m.get("k_max") and "kv_capacity_tokens" not in recorded  # (each node group's)
    again = simulate_serverless(config)  # the recorded schedulers are read back and ignored
    assert again.summary["completed"] == 20
    fcfs = simulate_serverless(cfg, scheduler="fcfs")
    assert fcfs.config["schedulers"]["small"]["admission"] == {"name": "fcfs"}


def test_one_instance_ready_at_0_runs_twp_as_one_server():
    """A request arriving during a step joined the serverless queue at once, and TWP's
    window counted it in the step's feedback (one server, the virtual GPU and the engine
    add it at the step's end, after the feedback): TTFTs differed (15.36 against 15.20 ms
    on the three requests below). Now the same, fast and step by step, on random traces
    with arrivals on a 1 ms grid (ties with step ends included)."""
    from llmsched.core.cost import make_cost_model
    from llmsched.policies import make_scheduler
    from llmsched.sim.serverless import run_serverless
    from llmsched.sim.simulator import simulate_trace
    from llmsched.workload.serverless import ServerlessRequests, load_serverless
    from llmsched.workload.trace import Trace

    cost = "linear:c=5,a=0.02"
    cfg = {
        "cluster": {"remote_bandwidth_gbps": 1, "nodes": [{"count": 1, "gpus": 1, "gpu_memory_gb": 80}]},
        "models": {"m": {"weights_gb": 1e-12, "cost_model": cost, "b_max": 512}},
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"scheduler": "twp", "init_s": 0, "keep_alive_s": "never"},
    }
    cases = [(np.array([0.0, 0.001, 0.001]), np.array([219, 244, 40]), np.array([38, 128, 26]))]
    for seed in range(12):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(5, 40))
        cases.append((np.sort(rng.integers(0, 300, n)) / 1000, rng.integers(1, 600, n), rng.integers(1, 120, n)))
    for arr, p, o in cases:
        one = simulate_trace(Trace(arr, p, o), make_scheduler("sarathi", "twp", b_max=512), make_cost_model(cost))
        reqs = ServerlessRequests(arr, p, o, np.zeros(len(arr), np.int64), ["m"])
        for fast in (True, False):
            sls = run_serverless(load_serverless(cfg), fast=fast, requests=reqs)
            for k in ("ttft_ns", "e2e_ns", "queue_ns"):
                assert np.array_equal(getattr(sls, k), getattr(one, k)), (k, fast, arr)


def test_another_scheduler_is_checked_for_loads_it_could_not_clock():
    """ServerlessLLM's 2x faster loads passed the 1e9 s limit; swapped for FCFS
    (--platform-scheduler) the run went ahead with a 1.6e9 s cold start, and its
    config.json was then refused."""
    cfg = base(scheduler="serverlessllm")
    cfg["cluster"]["remote_bandwidth_gbps"] = 8e-9
    cfg["cluster"]["nodes"][0].update(dram_gb=0, ssd_gb=0)
    spec = load_serverless(cfg)  # 10 GB / (2 x 8e-9 GB/s): 6.25e8 s; FCFS 1.25e9 s
    with pytest.raises(ConfigError, match=r"models\.m: loading 10 GB at 8e-09 GB/s .* more than 1e\+09 s"):
        spec.replaced(scheduler="fcfs")


def test_round_robin_keeps_every_instance_alive_at_light_load():
    """docs/serverless.md ("Routing"): after a burst scales a model out, rotation sends each
    instance a request every N / rate seconds (4 / 0.5 = 8 s), less than keep_alive_s, so
    none expires; least-loaded sends the light load to the oldest instance and the others
    expire. The documented GPU-seconds (758 against 2,541) are these runs'."""
    path = "examples/serverless/light_tail.yaml"
    least, rotation = (simulate_serverless(path, scheduler=s) for s in ("fcfs", "round-robin"))
    last = rotation.summary["sim_end_s"] * NS
    assert len(least.instances) == len(rotation.instances) == 4
    assert sorted(r["stop_ns"] < 60 * NS for r in least.instances) == [False, True, True, True]
    assert all(r["stop_ns"] > last for r in rotation.instances)
    assert round(least.summary["gpu_seconds"]) == 758 and round(rotation.summary["gpu_seconds"]) == 2541
