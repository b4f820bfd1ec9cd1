"""What the serverless runtime does to be fast changes no result: instances time a batch's
steps a few at a time (`ServerSim.first_steps`, `extend`) and give the same batches as
timing them all at once and as stepping one step at a time; requests.csv, built as byte
matrices, holds the text Python's own formatting gives."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from llmsched.core import make_cost_model
from llmsched.core.request import NS, Request
from llmsched.core.state import UNLIMITED
from llmsched.policies import make_scheduler
from llmsched.sim import serverless
from llmsched.sim.csv_rows import IntField, format_rows, names_field, seconds_field
from llmsched.sim.server import ServerSim
from llmsched.sim.serverless import run_serverless
from llmsched.workload.serverless import ServerlessRequests, load_serverless

PROFILE = "profile:h200-llama-3.2-1b"  # step times depend on the context: one per step


def _server(first_steps: int) -> ServerSim:
    sched = make_scheduler("sarathi", b_max=256)
    cost = make_cost_model(PROFILE)
    sched.bind_cost_model(cost)
    sim = ServerSim(sched, cost)
    sim.first_steps = first_steps
    for i, (prompt, output) in enumerate([(300, 400), (120, 250), (50, 600)]):
        sim.add(Request(i, 0, prompt, output))
    return sim


def _batches(sim: ServerSim, limit: int) -> list[tuple[int, list[int]]]:
    """Run to completion (or `limit`), extending each batch as far as it goes."""
    out = []
    t = 0
    extended = 0
    while t < limit:
        end = sim.begin(t, limit)
        if end is None:
            break
        while sim.extendable:
            end = sim.extend()
            extended += 1
        _, start, count, durs, _, _ = sim.batch
        assert count == len(durs) and end == start + sum(durs)
        out.append((start, list(durs)))
        sim.end()
        t = end
    return out, extended


@pytest.mark.parametrize("limit", [UNLIMITED, 3 * NS])
def test_a_batch_timed_a_few_steps_at_a_time_equals_one_timed_at_once(limit):
    lazy, extended = _batches(_server(2), limit)
    at_once, none = _batches(_server(UNLIMITED), limit)
    assert extended > 0 and none == 0
    assert lazy == at_once
    assert max(len(d) for _, d in lazy) > 8  # batches long enough to need several extensions


def test_a_cut_stops_an_extendable_batch_at_the_first_boundary_after_it():
    lazy, ref = _server(2), _server(UNLIMITED)
    t = 0
    while True:  # to the first batch of more than 6 steps
        lazy.begin(t)
        t = ref.begin(t)
        if ref.batch[2] > 6:
            break
        while lazy.extendable:
            lazy.extend()
        lazy.end()
        ref.end()
    assert lazy.extendable and lazy.batch[2] == 2
    start, full = ref.batch[1], list(ref.batch[3])
    cut = start + sum(full[:5]) - 1  # during the 5th step: the last one kept
    while lazy.busy_until < cut:
        lazy.extend()
    assert lazy.truncate(cut) == ref.truncate(cut) == start + sum(full[:5])
    assert not lazy.extendable and lazy.batch[3] == ref.batch[3] == full[:5]
    lazy.end()
    ref.end()
    assert lazy.state.backlog_tokens == ref.state.backlog_tokens and lazy.now == ref.now


def _crowded(n: int, alpha: float | None = None):
    cfg = yaml.safe_load(open("examples/serverless/crowded.yaml"))
    if alpha is not None:
        cfg["platform"]["serverlessllm"]["alpha_s_per_token"] = alpha
    return load_serverless(cfg).replaced(num_requests=n)


def test_the_platform_gives_the_same_results_whether_instances_time_steps_lazily_or_not(monkeypatch):
    spec = _crowded(500, alpha=0.001)  # (hand-overs, and migrations called off)
    calls = {"extend": 0}
    extend = ServerSim.extend

    def counted(self):
        calls["extend"] += 1
        return extend(self)

    monkeypatch.setattr(ServerSim, "extend", counted)
    lazy = run_serverless(spec)
    assert calls["extend"] > 0
    monkeypatch.setattr(serverless, "FIRST_STEPS", UNLIMITED)
    at_once = run_serverless(spec)
    exact = run_serverless(spec, fast=False)
    for other in (at_once, exact):
        for k in ("ttft_ns", "e2e_ns", "queue_ns", "instance", "tokens", "migrations", "cold"):
            assert np.array_equal(getattr(lazy, k), getattr(other, k)), k
        assert lazy.instances == other.instances
        assert (lazy.itl.count, lazy.itl.total, lazy.itl.total_sq) == (
            other.itl.count,
            other.itl.total,
            other.itl.total_sq,
        )
        assert lazy.end_ns == other.end_ns
    assert lazy.migrations.sum() > 0  # ServerLessLLM migrated: drained instances stopped extending
    assert lazy.steps == exact.steps


# ---- requests.csv's text ----------------------------------------------------------------------------
def _text(field) -> list[str]:
    return format_rows([field], "\n").splitlines()


def test_integers_as_python_writes_them():
    v = np.array([0, 7, 9, 10, 99, 100, 123456, 10**12 + 5, -1, -40, 2**62], dtype=np.int64)
    assert _text(IntField(v)) == [str(x) for x in v.tolist()]
    shown = v >= 0
    assert _text(IntField(v, shown)) == [str(x) if x >= 0 else "" for x in v.tolist()]


def test_seconds_with_nine_decimals_and_unreached_as_empty():
    v = np.array([0, 1, NS - 1, NS, 12 * NS + 345, 2254 * NS + 999_999_999, -1, 10**14], dtype=np.int64)
    expected = [f"{x // NS}.{x % NS:09d}" if x >= 0 else "" for x in v.tolist()]
    assert _text(seconds_field(v)) == expected


def test_rows_join_fields_with_commas_and_any_model_name():
    names = ["llama-8b-a", "modèle-ü", "", "x"]
    which = np.array([1, 0, 2, 3, 1])
    ids = np.arange(5, dtype=np.int64)
    secs = np.array([-1, 5, NS, 3 * NS + 1, 0], dtype=np.int64)
    text = format_rows([IntField(ids), names_field(names, which), seconds_field(secs)], "\n")
    assert text == "".join(f"{i},{names[w]},{s}\n" for i, w, s in zip(ids, which, [_py(x) for x in secs]))


def _py(ns: int) -> str:
    return f"{ns // NS}.{ns % NS:09d}" if ns >= 0 else ""


def _one_gpu(**platform) -> dict:
    return {
        "cluster": {
            "remote_bandwidth_gbps": 2.0,
            "nodes": [{"count": 1, "gpus": 1, "gpu_memory_gb": 80, "dram_gb": 50, "dram_bandwidth_gbps": 20}],
        },
        "models": {"m": {"weights_gb": 2.5, "cost_model": PROFILE, "b_max": 256}},
        "workload": {"rate": 1, "num_requests": 1},
        "platform": {"init_s": 0, "keep_alive_s": "never", **platform},
    }


def _run(rows, fast: bool = True):
    spec = load_serverless(_one_gpu())
    reqs = ServerlessRequests(
        np.array([r[0] for r in rows]) / NS,
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.zeros(len(rows), dtype=np.int64),
        ["m"],
    )
    assert np.array_equal(np.round(reqs.arrival_s * NS).astype(np.int64), [r[0] for r in rows])
    return run_serverless(spec, fast=fast, requests=reqs)


def test_a_request_arriving_exactly_where_a_batch_is_timed_to_joins_there(monkeypatch):
    """The batch is timed up to a boundary that a request reaches at that very instant: it
    joins there, as when every step is timed at once, not after the batch goes on."""
    ends = []
    begin = ServerSim.begin

    def noted(self, now, limit=UNLIMITED):
        end = begin(self, now, limit)
        if self.extendable:
            ends.append(end)
        return end

    monkeypatch.setattr(ServerSim, "begin", noted)
    alone = [(NS // 10, 200, 400)]
    _run(alone)
    t = ends[len(ends) // 2]  # where a decode batch was timed to at first
    rows = alone + [(t, 30, 5)]
    lazy = _run(rows)
    monkeypatch.setattr(serverless, "FIRST_STEPS", UNLIMITED)
    for other in (_run(rows), _run(rows, fast=False)):
        assert np.array_equal(lazy.ttft_ns, other.ttft_ns) and np.array_equal(lazy.e2e_ns, other.e2e_ns)
        assert lazy.instances == other.instances
    assert lazy.queue_ns[1] == 0  # it was admitted at its arrival: a boundary


def test_steps_done_at_any_time_of_a_batch():
    """`steps_done` (routers ask it at every arrival, and it walks on from its last answer)
    counts the steps that ended by `t`, whether asked forward, backward, after `extend` or
    after `truncate`."""
    sim = _server(first_steps=4)
    t = 0
    while True:  # a batch of many decode steps, its first four timed
        end = sim.begin(t)
        if sim.batch[2] > 1 and sim.extendable:
            break
        sim.end()
        t = end

    def brute(at):
        _, start, count, durs, _, _ = sim.batch
        ends = np.cumsum([start, *durs])[1:]
        return int((ends <= at).sum())

    start = sim.batch[1]
    times = [start + k * 997_000 for k in range(200)]
    for at in times[:30] + times[5:1:-1]:
        assert sim.steps_done(at) == brute(at)
    sim.extend()
    sim.extend()
    assert sim.batch[2] > 8
    for at in times:
        assert sim.steps_done(at) == brute(at)
    assert sim.steps_done(sim.busy_until) == sim.batch[2]
    cut = start + sum(sim.batch[3][:5]) + 1  # an arrival inside step 6: five steps remain done
    sim.truncate(cut)
    assert sim.batch[2] == 6
    for at in times:
        assert sim.steps_done(at) == brute(at)
