"""Prefix caching's block ids at 8 bytes each: the simulator hands each request a read-only
memoryview onto the trace's int64 ids (`Trace.iter_block_views`) instead of a tuple of
Python ints (about 40 bytes an id, and an unbounded cache keeps every request's), with the
very same runs; and multi-turn conversations' ids are copied a chunk of rows at a time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from llmsched.core import make_cost_model
from llmsched.policies.spec import SchedulerSpec
from llmsched.sim.simulator import simulate_trace
from llmsched.workload import Trace, WorkloadSpec, make_trace
from llmsched.workload import blocks as blocks_mod
from llmsched.workload.blocks import chain_ragged, prefix_rows


def _family_trace(n: int, blocks_per_prompt: int, source: int, partial: bool = False) -> Trace:
    """n prompts of `blocks_per_prompt` 16-token blocks (ids at `source` tokens a block),
    each one's first half shared with a family of four; `partial`: prompts end inside
    their last block (its id is kept in the trace, never handed out)."""
    rng = np.random.default_rng(0)
    prompt = np.full(n, blocks_per_prompt * 16, dtype=np.int64)
    counts = prompt // source
    if partial:
        prompt -= rng.integers(1, 16, n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    values = rng.integers(0, 2**62, int(ptr[-1]))
    for i in range(n):
        k = int(counts[i]) // 2
        values[ptr[i] : ptr[i] + k] = np.arange(k) + 1000 * (i % 4)
    return Trace(
        np.arange(n) * 0.5, prompt, np.full(n, 4), block_ids=chain_ragged(values, ptr), block_ptr=ptr, block_size=source
    )


@pytest.mark.parametrize("source, target", [(16, 16), (16, 32), (512, 16), (512, 512), (32, 64)])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_block_views_are_the_block_tuples(source, target, partial, chunk):
    tr = _family_trace(40, 64, source, partial)
    views = list(tr.iter_block_views(target, chunk=chunk))
    tuples = tr.blocks(target)
    assert [None if v is None else tuple(v) for v in views] == tuples
    assert any(t is not None for t in tuples)
    for v in views:
        if v is not None:
            assert v.readonly and v.format == "q" and isinstance(v[0], int)
            with pytest.raises(TypeError):
                v[0] = 1  # the trace's ids cannot be changed through a request
    # a trace without ids: None for every request
    bare = Trace(np.arange(3.0), np.full(3, 40), np.full(3, 2))
    assert list(bare.iter_block_views(16)) == [None] * 3


def _run(tr, blocks_size: int, kv, blocks_list=None):
    cost = make_cost_model("const:1")
    sched = SchedulerSpec(
        policy="sarathi", b_max=2048, kv_capacity=kv, prefix_caching=True, block_size=blocks_size
    ).build()
    sched.bind_cost_model(cost)
    if blocks_list is not None:  # the simulator takes a `blocks` list as given (tuples)
        tr = Trace(tr.arrival_s, tr.prompt, tr.output)
        tr.blocks = blocks_list
    return simulate_trace(tr, sched, cost)


@pytest.mark.parametrize("source, target, kv", [(16, 16, None), (16, 16, 60_000), (512, 16, 90_000), (16, 32, 40_000)])
def test_a_run_on_block_views_is_the_run_on_tuples(source, target, kv):
    tr = _family_trace(120, 96, source, partial=True)
    views = _run(tr, target, kv)
    tuples = _run(tr, target, kv, blocks_list=tr.blocks(target))
    assert views.prefix == tuples.prefix and views.steps == tuples.steps
    if kv is not None:
        assert views.prefix["evictions"] > 0  # the capacity evicts: LRU order matters
    for field in ("ttft_ns", "e2e_ns", "queue_ns", "preemptions", "prefix_hits"):
        assert np.array_equal(getattr(views, field), getattr(tuples, field)), field


def test_an_unbounded_cache_holds_block_ids_at_a_few_bytes_each():
    # tuples of Python ints cost about 40 bytes per id (60 here with the chunk's list),
    # and an unbounded cache keeps every request's; views share the trace's 8-byte ids
    n, per = 300, 512
    tr = _family_trace(n, per, 16)
    tracemalloc.start()
    try:
        stats = _run(tr, 16, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.prefix["hit_tokens"] > 0 and stats.prefix["evictions"] == 0
    assert peak < 8 * n * per, (peak, peak / (n * per))


def test_prefix_rows_peak_memory_stays_near_its_output(monkeypatch):
    # every turn of a conversation copies its earlier turns' ids: the output is many times
    # the input, and the whole-array version held about 4 output-sized index arrays at once
    monkeypatch.setattr(blocks_mod, "_CHUNK", 1 << 14)
    m, turns, per_turn = 50, 8, 128
    ptr = np.arange(m + 1, dtype=np.int64) * turns * per_turn
    ids = np.arange(int(ptr[-1]), dtype=np.int64)
    rows = np.repeat(np.arange(m), turns)
    counts = np.tile(np.arange(1, turns + 1) * per_turn, m)
    tracemalloc.start()
    try:
        out, new_ptr = prefix_rows(ids, ptr, rows, counts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert new_ptr[-1] == out.shape[0] == int(counts.sum())
    # row 3 is conversation 0's first 4 turns: its first 512 ids
    assert out[new_ptr[3] : new_ptr[4]].tolist() == list(range(4 * per_turn))
    assert peak < 1.5 * out.nbytes, (peak, out.nbytes)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_conversation_ids_do_not_depend_on_the_chunks(monkeypatch, chunk):
    spec = WorkloadSpec(
        turns="geometric:4",
        think_time_s=5,
        rate=2,
        num_requests=300,
        system_prompt=100,
        prompt="sharegpt",
        output="sharegpt",
        seed=4,
    )
    whole = make_trace(spec, 16)
    monkeypatch.setattr(blocks_mod, "_CHUNK", chunk)
    t = make_trace(spec, 16)
    assert np.array_equal(t.block_ptr, whole.block_ptr) and t.block_ids.tobytes() == whole.block_ids.tobytes()


def test_the_default_chunk_keeps_reblock_scratch_small():
    # 512-token ids to 16 (2M ids out): with a chunk of a million ids the temporaries
    # (about 8 chunk-sized arrays) peaked at about 5x the output
    n = 2000
    ptr = np.arange(n + 1, dtype=np.int64) * 32
    ids = np.arange(int(ptr[-1]), dtype=np.int64)
    prompt = np.full(n, 32 * 512, dtype=np.int64)
    tracemalloc.start()
    try:
        out, _ = blocks_mod.reblock(ids, ptr, prompt, 512, 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == (n * 1024,)
    assert peak < 1.5 * out.nbytes, (peak, out.nbytes)
