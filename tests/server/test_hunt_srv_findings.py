"""Bugs found by the serve/bench bug hunt (report-only branch): each test fails on the
code it was written against and passes once the bug is fixed."""

from __future__ import annotations

import httpx
from srv_helpers import running_server

from llmsched.server.app import ServerConfig
from llmsched.server.backends import SchedulerOptions, make_sim_backend

MODEL = "llmsched-sim"


def test_server_default_max_tokens_is_clamped_to_the_room_left():
    """--default-max-tokens is the server's default, not the client's request: vLLM's
    get_max_tokens takes min(max_model_len - prompt, default), so a prompt that leaves
    less room gets what fits, not a 400 saying 'you requested 130 tokens'."""
    backend = make_sim_backend(SchedulerOptions(), "const:1", max_model_len=100)
    with running_server(backend, ServerConfig(default_max_tokens=50)) as (base, _):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "abcd" * 80}]}  # 80 tokens
        r = httpx.post(base + "/v1/chat/completions", json=chat, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == 20
        assert body["choices"][0]["finish_reason"] == "length"
