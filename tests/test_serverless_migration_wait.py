"""ServerlessLLM's migrations and the GPUs that free meanwhile: a model waiting for a victim's GPU
takes one that frees and calls the migration off; a hand-over's destination neither expires
nor becomes a migration's victim."""

from __future__ import annotations

import math

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


def _requests(spec, rows) -> ServerlessRequests:
    """The requests of `rows`, each (arrival_s, model, prompt, output)."""
    names = list(spec.models)
    return ServerlessRequests(
        np.array([r[0] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([names.index(r[1]) for r in rows], dtype=np.int64),
        names,
    )


def _run(scheduler: str):
    spec = load_serverless(_platform(scheduler))
    # a's first instance decodes 3,000 tokens (30 s); its second finishes a 1,000-token prompt
    # and 200 tokens by about 5 s, then expires 1 s later; b is busy for 50 s; c arrives at 3 s
    # when every GPU is busy, so ServerlessLLM migrates a's first instance (the cheaper victim)
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 1000, 200), (0.002, "b", 100, 5000), (3.0, "c", 10, 5)]
    return run_serverless(spec, requests=_requests(spec, rows))


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
    return run_serverless(spec, requests=_requests(spec, rows), fast=fast)


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


def test_the_destination_of_a_hand_over_in_flight_is_no_migration_victim():
    """As above, with a third instance of a (a2, on the small node, decoding request 2) and
    d arriving at 2 s, when every GPU is busy. a1, idle and waiting for request 0, runs
    nothing, so its migration looked free: d used to migrate it, it stopped at once and
    request 0 went to a2 to recompute its KV cache. Now d migrates a2, whose request 2
    hands over to a1 as well, and neither request pauses."""
    cfg = {
        "cluster": {
            "remote_bandwidth_gbps": 10.0,
            "nodes": [_node(name="big"), _node(name="small", gpus=2, gpu_memory_gb=40)],
        },
        "models": {
            "a": {"weights_gb": 10, "cost_model": "const:10", "keep_alive_s": 1, "max_instances": 3},
            "c": {"weights_gb": 50, "cost_model": "const:10"},
            "d": {"weights_gb": 10, "cost_model": "const:10"},
        },
    }
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 100, 100), (0.002, "a", 100, 5000)]
    rows += [(1.0, "c", 10, 5), (2.0, "d", 10, 5)]
    s = _run_rows(cfg, rows)
    a0, a1, a2, c, d = s.instances
    assert [r["model"] for r in s.instances] == ["a", "a", "a", "c", "d"]
    assert s.e2e_ns[1] < ns(1.5) and d["created_ns"] == ns(2.0) < a0["stop_ns"]  # a1 idle, receiving, at 2 s
    assert a1["stop_reason"] == "keep-alive" and a1["completed"] == 3
    assert s.instance[0] == s.instance[2] == a1["instance"] and list(s.migrations) == [1, 0, 1, 0, 0]
    assert a2["stop_reason"] == "migrated" and d["gpu"] == a2["gpu"] and d["gpu_from_ns"] == a2["stop_ns"]
    assert s.itl.max == ns(0.01)  # no request paused
    _conserved(s)
    _same(s, _run_rows(cfg, rows, fast=False))


def test_an_instance_waiting_for_a_migration_brings_its_recomputes_to_another_node_group():
    """a's instances: a0 on the big node decodes request 0, a1 on the small node goes idle
    at 1.5 s (keep-alive 1.005 s). c (50 GB, big node only) migrates a0 at 2.503 s; a1
    expires at 2.505 s, before a0's next step boundary (2.51 s), so request 0's hand-over
    has no destination and d takes a1's GPU. At the hand-over (8.73 s) request 0 goes to a
    new instance of a, to recompute its KV cache; it migrates b0 on the big node, and
    when d goes idle on the small node it takes d's GPU instead, with the small node's KV
    capacity (its queue moved to a new batch loop, request 0 still to recompute)."""
    cfg = {
        "cluster": {
            "remote_bandwidth_gbps": 10.0,
            "nodes": [_node(name="big", gpus=2), _node(name="small", gpus=2, gpu_memory_gb=40)],
        },
        "models": {
            "a": {
                "weights_gb": 10,
                "cost_model": "const:10",
                "keep_alive_s": 1.005,
                "max_instances": 2,
                "kv_bytes_per_token": 1_000_000,
            },
            "b": {"weights_gb": 10, "cost_model": "const:10", "max_instances": 2},
            "c": {"weights_gb": 50, "cost_model": "const:10"},
            "d": {"weights_gb": 10, "cost_model": "const:10"},
        },
    }
    rows = [(0.0, "a", 100, 3000), (0.001, "a", 100, 100), (0.002, "b", 3000, 5000), (0.003, "b", 3000, 5000)]
    rows += [(2.503, "c", 10, 3000), (2.506, "d", 10, 1000)]
    s = _run_rows(cfg, rows)
    spec = s.spec
    big, small = spec.nodes
    a0, a1, b0, b1, c, d, a2 = s.instances
    assert [r["model"] for r in s.instances] == ["a", "a", "b", "b", "c", "d", "a"]
    assert a1["stop_reason"] == "keep-alive" and a1["stop_ns"] == ns(2.505) < a0["stop_ns"]
    assert a0["stop_reason"] == "migrated" and c["gpu"] == a0["gpu"] and c["gpu_from_ns"] == a0["stop_ns"]
    assert d["gpu"] == a1["gpu"] and d["stop_reason"] == "reclaimed"
    assert a2["created_ns"] == a0["stop_ns"] < a2["gpu_from_ns"] == d["stop_ns"] and a2["gpu"] == d["gpu"]
    assert spec.kv_capacity("a", big) == a0["kv_capacity"] != a2["kv_capacity"] == spec.kv_capacity("a", small)
    assert b0["stop_reason"] == b1["stop_reason"] == "end" and b0["migrated_out"] == b1["migrated_out"] == 0
    assert list(s.migrations) == [1, 0, 0, 0, 0, 0] and s.instance[0] == a2["instance"]
    # request 0 pauses from its last token at a0 until a2 has recomputed its KV cache: its
    # prompt and the tokens a0 emitted (one a step from a0's start), in chunks of 512 tokens
    context = 100 + (a0["stop_ns"] - a0["ready_ns"]) // ns(0.01)
    assert s.itl.max == a2["ready_ns"] + math.ceil(context / 512) * ns(0.01) - a0["stop_ns"]
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


def test_queued_tells_the_requests_that_joined_to_recompute():
    """`relocate` rebuilds a waiting instance's queue from `queued()`: a request that joined
    to recompute its KV cache (with the preempted ones, at the head) must join the new
    queue the same way, whatever the admission order of the others."""
    from llmsched.core.request import Request
    from llmsched.policies import make_scheduler
    from llmsched.sim.serverless import _State

    sched = make_scheduler("sarathi", b_max=64)
    st = _State(sched.constraints, sched.admission.waiting_key())
    first, later, moved = Request(0, 0, 10, 5, "m"), Request(1, 5, 10, 5, "m"), Request(2, 9, 10, 5, "m")
    st.add(first)
    st.add(later)
    moved.prefill_target = moved.prompt + 3  # (three tokens emitted elsewhere)
    st.add_recompute(moved)
    assert st.queued() == [(moved, True), (first, False), (later, False)]
    assert st.waiting.is_preempted(moved) and not st.waiting.is_preempted(first)
    st.take(moved, 10)
    assert st.queued() == [(first, False), (later, False)] and not st.waiting.is_preempted(moved)
