"""Adaptive with a context-dependent cost model refits its region at 1, 2, 4, ... requests
seen: the engine ran each solve (0.13-0.23 s a solve, docs/engine.md) inside `plan`, stalling the
step and every request in it (a 1 ms inter-token latency became 145 ms). The engine now
runs them on a worker thread and installs each result at a step boundary."""

from __future__ import annotations

import sys
import threading

from llmsched.core.engine_api import SamplingParams


def test_adaptive_refits_run_off_the_engine_thread(tiny_model, monkeypatch):
    import llmsched.core.region as region
    from llmsched.engine import LLMEngine

    eng = LLMEngine(tiny_model, scheduler="adaptive", b_max=64, max_num_seqs=4, cost_model="profile:h200-llama-3.2-1b")
    policy = eng.scheduler.batch
    me = threading.current_thread()
    calls = {"engine": 0, "worker": 0}
    real = region.stability_region

    def counted(*a, **k):
        calls["engine" if threading.current_thread() is me else "worker"] += 1
        return real(*a, **k)

    monkeypatch.setattr(region, "stability_region", counted)  # after the region solved at build
    switch = sys.getswitchinterval()
    params = SamplingParams(max_tokens=4)
    for i in range(10):
        eng.add_request(f"r{i}", [5 + i, 6, 7, 8 + i], params)
        eng.step()
    while eng.has_unfinished_requests():
        eng.step()
    assert calls["engine"] == 0  # no step waited for a solve
    # let the refit in flight end, and the next step install it
    for i in range(10, 20):
        if eng._job is None and policy._job is None:
            break
        if eng._job is not None:
            eng._job[2].result()
        eng.add_request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=1))
        while eng.has_unfinished_requests():
            eng.step()
    assert calls["engine"] == 0 and calls["worker"] >= 1
    # the region in use is the one fitted to the requests seen (prompts of 3-4 tokens), not
    # the placeholder means' of the build
    assert policy._key[3] < 10 and (policy._cands, policy._time) == policy._regions[policy._key]
    assert sys.getswitchinterval() == switch  # restored once no job runs
    eng.close()
