"""A model waiting on a migration's victim should take a GPU that frees meanwhile (bug hunt)."""

from __future__ import annotations

import numpy as np

from llmsched.sim.serverless import run_serverless
from llmsched.workload.serverless import ServerlessRequests, load_serverless


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
