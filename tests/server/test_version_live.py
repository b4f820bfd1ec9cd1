"""`GET /version` shows the scheduler as it is now and the cost model bound to it, on both
backends: TWP's resolved values (B_max, the window's bounds) exist only once it has seen
a step, and the engine's `--cost-model` (what TWP and DynamicBatch calibrate from) was
missing from the engine's /version."""

from __future__ import annotations

import httpx
from srv_helpers import post, running_server, wait_for


def test_sim_version_shows_twp_resolved_after_a_step():
    with running_server(admission="twp", cost="paper") as (base, srv):
        before = httpx.get(base + "/version").json()["scheduler"]["admission"]
        assert before["name"] == "twp" and "resolved" not in before
        r = post(base, "/v1/completions", {"model": "llmsched-sim", "prompt": [1] * 8, "max_tokens": 3})
        assert r.status_code == 200
        assert wait_for(lambda: not srv.config.app.state.engine.streams)
        v = httpx.get(base + "/version").json()
    resolved = v["scheduler"]["admission"]["resolved"]
    # the paper model: B_0 = B_max = 128, L* = 1.5 l_min (docs/twp.md)
    assert resolved["B_max"] == 128 and resolved["measured"] is False
    assert v["cost_model"]["name"].startswith("paper")


def test_engine_version_names_its_cost_model(tmp_path):
    from llmsched.engine import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_engine_backend

    model = make_tiny_model(tmp_path / "model")
    backend = make_engine_backend(
        str(model),
        SchedulerOptions(admission="twp", max_running=8),
        num_blocks=64,
        block_size=16,
        max_model_len=512,
        cost_model="paper",
    )
    with running_server(backend) as (base, _):
        v = httpx.get(base + "/version").json()
    assert v["backend"] == "engine" and v["cost_model"]["name"].startswith("paper")
