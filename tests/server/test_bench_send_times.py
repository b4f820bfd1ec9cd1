"""`run_bench`'s `_sent_s` (when each request was sent) shows a late client, and
benchmarks/bench_server.py (and bench_vs_sim_kv.py, which shares its `as_sent`) replays
the simulator on those times. They used `queue_times`, which since vLLM's definition (the
wait for a --max-concurrency slot) is ~0 without a limit however late the client was: the
simulator "as sent" was the one as planned, and "added" counted the client's lateness."""

from __future__ import annotations

import asyncio
import os
import sys
import types

import numpy as np
from srv_helpers import running_server

from llmsched.server import bench
from llmsched.server.bench import BenchConfig, Workload, run_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_server  # noqa: E402

OVERSLEEP = 0.03


def test_a_late_client_shows_in_the_send_times_and_the_replay(monkeypatch):
    # every sleep of the dispatcher oversleeps: each request after the first is sent
    # OVERSLEEP late (the lateness does not add up: the next delay is from the schedule)
    slow = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    slow.sleep = lambda delay, *a: asyncio.sleep(delay + OVERSLEEP if delay > 0 else delay, *a)
    monkeypatch.setattr(bench, "asyncio", slow)
    n = 6
    wl = Workload(np.arange(n) * 0.1, np.full(n, 8), np.full(n, 2))
    with running_server(cost="const:1") as (base, _):
        res = run_bench(BenchConfig(base_url=base, num_prompts=n, quiet=True, num_warmups=0), wl)
    assert res["completed"] == n
    late = np.asarray(res["_sent_s"]) - wl.arrival_s
    # (a timer may wake ~1 ms early; the bound leaves room for that, none for a missing oversleep)
    assert np.all(late[1:] >= OVERSLEEP - 0.005), late
    # the replay is on the sent times: from the first request's, each later one OVERSLEEP
    # later than planned (queue_times, the old source, moved none of them)
    wl_sent, order = bench_server.as_sent(wl, res)
    assert order.tolist() == list(range(n))
    assert wl_sent.arrival_s[0] == 0.0
    assert np.all(wl_sent.arrival_s[1:] - wl.arrival_s[1:] >= OVERSLEEP - 0.005 - late[0]), wl_sent.arrival_s
    np.testing.assert_array_equal(wl_sent.prompt, wl.prompt)
