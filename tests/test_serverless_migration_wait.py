"""ServerlessLLM's migrations and the GPUs that free meanwhile: a model waiting for a victim's GPU
takes one that frees and calls the migration off; a hand-over's destination does not expire."""

from __future__ import annotations

import numpy as np

from llmsched.core.request import NS
from llmsched.sim.serverless import run_serverless
from llmsched.workload.serverless import ServerlessRequests, load_serverless


def ns(seconds: float) -> int:
    return round(seconds * NS)


def _platform(scheduler: str) -> dict:
    """One node of 3 GPUs; a has two instances (the second by scale-out), b one, c none."""
    return {
        "cluster": {
            "remote_bandwidth_gbps": 10.0,
            "nodes": [{"count": 1, "gpus": 3, "gpu_memory_gb": 80, "dram_gb": 0, "ssd_gb": 0}],
        },
        "models": {
            "a": {"weights_gb": 10, "cost_model": "const:10", "max_instances": 2, "keep_alive_s": 1},
            "b": {"weights_gb": 10, "cost_model": "const:10"},
            "c": {"weights_gb": 10, "cost_model": "const:10"},
        },
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"scheduler": scheduler, "init_s": 0, "keep_alive_s": "never", "scale_out_tokens": 0},
    }


def _run(scheduler: str):
    spec = load_serverless(_platform(scheduler))
    names = list(spec.models)
    # a's first instance decodes 3,000 tokens (30 s); its second finishes a 1,000-token prompt
    # and 200 tokens by about 5 s, then expires 1 s later; b is busy for 50 s; c arrives at 3 s
    # when every GPU is busy, so ServerlessLLM migrates a's first instance (the cheaper victim)
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 1000, 200), (0.002, "b", 100, 5000), (3.0, "c", 10, 5)]
    reqs = ServerlessRequests(
        np.array([r[0] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([names.index(r[1]) for r in rows], dtype=np.int64),
        names,
    )
    return run_serverless(spec, requests=reqs)


def test_a_model_waiting_on_a_migration_takes_a_gpu_that_frees_meanwhile():
    s = _run("serverlessllm")
    rows = s.instances
    c = next(r for r in rows if r["model"] == "c")
    # the first GPU freed after c's request arrived (a's second instance's keep-alive expiry)
    first_free = min(r["stop_ns"] for r in rows if r is not c and r["stop_ns"] > c["created_ns"])
    assert c["gpu_from_ns"] <= first_free, (
        f"c waited for the victim's GPU until {c['gpu_from_ns'] / 1e9:.2f} s "
        f"while a GPU was free from {first_free / 1e9:.2f} s"
    )


def _node(**k) -> dict:
    return {"count": 1, "gpus": 1, "gpu_memory_gb": 80, "dram_gb": 0, "ssd_gb": 0, **k}


def _run_rows(cfg: dict, rows, fast: bool = True):
    """Run `rows` of (arrival_s, model, prompt, output) on the ServerlessLLM platform `cfg`
    (10 GB/s remote store, no init time, instances kept alive unless a model says)."""
    cfg = {
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"scheduler": "serverlessllm", "init_s": 0, "keep_alive_s": "never", "scale_out_tokens": 0},
        **cfg,
    }
    spec = load_serverless(cfg)
    names = list(spec.models)
    reqs = ServerlessRequests(
        np.array([r[0] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([names.index(r[1]) for r in rows], dtype=np.int64),
        names,
    )
    return run_serverless(spec, requests=reqs, fast=fast)


def _conserved(s) -> None:
    assert (s.e2e_ns >= 0).all() and (s.tokens == s.output).all()
    assert sum(r["completed"] for r in s.instances) == len(s.output)
    assert s.itl.count == int((s.output - 1).sum())  # no token emitted twice


def _same(fast, exact) -> None:
    assert fast.instances == exact.instances and fast.migrated_tokens == exact.migrated_tokens
    for k in ("ttft_ns", "e2e_ns", "instance", "migrations", "tokens"):
        assert np.array_equal(getattr(fast, k), getattr(exact, k)), k


def test_the_destination_of_a_hand_over_in_flight_does_not_expire():
    """c (50 GB) fits only the big node: it migrates a0 there at 1.0 s, whose request 0
    (n0 about 150 tokens) hands over to a1, on the small node, at 4.2 s. a1 finishes
    request 1 at 1.5 s and has a 1 s keep-alive; c cannot take its GPU. a1 used to expire
    at 2.5 s, so request 0 left a0 for a new cold instance of a (a 0.51 s pause, its KV
    cache recomputed): now a1 waits for it and request 0 decodes on there without a pause,
    and a1's keep-alive starts when its requests are done."""
    cfg = {
        "cluster": {"remote_bandwidth_gbps": 10.0, "nodes": [_node(name="big"), _node(name="small", gpu_memory_gb=40)]},
        "models": {
            "a": {"weights_gb": 10, "cost_model": "const:10", "keep_alive_s": 1},
            "c": {"weights_gb": 50, "cost_model": "const:10"},
        },
    }
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 100, 100), (1.0, "c", 10, 5)]
    s = _run_rows(cfg, rows)
    a0, a1, c = s.instances
    assert [r["model"] for r in s.instances] == ["a", "a", "c"]  # no new instance of a
    assert a0["stop_reason"] == "migrated" and c["gpu_from_ns"] == a0["stop_ns"] and c["gpu"] == a0["gpu"]
    assert list(s.migrations) == [1, 0, 0] and s.instance[0] == a1["instance"]
    assert s.e2e_ns[1] < ns(1.5) < a0["stop_ns"]  # a1 idle well past its keep-alive before the hand-over
    assert s.itl.max == ns(0.01)  # request 0 never paused
    assert a1["stop_reason"] == "keep-alive" and a1["stop_ns"] == s.e2e_ns[0] + ns(1)
    _conserved(s)
    _same(s, _run_rows(cfg, rows, fast=False))


def test_a_migration_called_off_keeps_what_was_handed_over_and_the_rest_at_the_victim():
    """a0 runs request 0 (2,000-token prompt) and request 2 (10); a1 runs request 1 (3,000),
    so c, at 2 s, migrates a0. Request 2 hands over to a1 within a few seconds; request 0's
    recompute takes over 20 s. b's instance goes idle at 6.5 s: c takes its GPU and the
    migration is called off: request 2 stays at a1 (migrated once), request 0 finishes at
    a0, which serves on; no token is lost or emitted twice. c's request used to wait for
    request 0 to finish at a0 (30.5 s)."""
    cfg = {
        "cluster": {"remote_bandwidth_gbps": 10.0, "nodes": [_node(gpus=3)]},
        "models": {
            "a": {"weights_gb": 10, "cost_model": "const:10", "max_instances": 2},
            "b": {"weights_gb": 10, "cost_model": "const:10", "keep_alive_s": 5},
            "c": {"weights_gb": 10, "cost_model": "const:10"},
        },
    }
    rows = [(0.0, "a", 2000, 3000), (0.001, "a", 3000, 8000), (0.002, "a", 10, 3000), (0.003, "b", 100, 500)]
    rows.append((2.0, "c", 10, 5))
    s = _run_rows(cfg, rows)
    a0, a1, b, c = s.instances
    assert [r["model"] for r in s.instances] == ["a", "a", "b", "c"]
    assert b["stop_reason"] == "reclaimed" and c["gpu"] == b["gpu"] and c["gpu_from_ns"] == b["stop_ns"]
    assert c["created_ns"] == ns(2.0) < c["gpu_from_ns"] == ns(0.003) + s.e2e_ns[3]  # b's finish
    assert a0["stop_reason"] == "end" and a0["migrated_out"] == 1
    assert list(s.migrations) == [0, 0, 1, 0, 0]
    assert s.migrated_tokens > 0
    assert s.instance[0] == a0["instance"] and s.instance[2] == a1["instance"] and a0["completed"] == 1
    assert s.e2e_ns[4] < ns(6)
    _conserved(s)
    _same(s, _run_rows(cfg, rows, fast=False))


def test_an_instance_waiting_for_a_migration_takes_another_node_groups_gpu_with_its_kv_capacity():
    """c (1 MB of KV cache per token) migrates a0, on the 80 GB node (62,000 KV tokens),
    at 1.5 s; b's instance on the 40 GB node goes idle at 3 s and c takes its GPU instead:
    its instance's KV capacity is that node's (26,000 tokens)."""
    cfg = {
        "cluster": {
            "remote_bandwidth_gbps": 10.0,
            "nodes": [_node(name="g1"), _node(name="g2", gpus=2, gpu_memory_gb=40)],
        },
        "models": {
            "a": {"weights_gb": 10, "cost_model": "const:10", "max_instances": 2},
            "b": {"weights_gb": 10, "cost_model": "const:10"},
            "c": {"weights_gb": 10, "cost_model": "const:10", "kv_bytes_per_token": 1_000_000},
        },
    }
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 500, 3000), (0.002, "b", 100, 200), (1.5, "c", 10, 5)]
    s = _run_rows(cfg, rows)
    spec = s.spec
    big, small = spec.nodes
    a0, a1, b, c = s.instances
    assert a0["gpu"] == "g1/gpu0" and b["gpu"] == "g2/gpu1" and b["stop_reason"] == "reclaimed"
    assert c["created_ns"] == ns(1.5) and c["gpu"] == b["gpu"] and c["gpu_from_ns"] == b["stop_ns"]
    assert spec.kv_capacity("c", big) == 62_000 and c["kv_capacity"] == spec.kv_capacity("c", small) == 26_000
    assert a0["stop_reason"] == "end" and list(s.migrations) == [0, 0, 0, 0]
    _conserved(s)
    _same(s, _run_rows(cfg, rows, fast=False))
