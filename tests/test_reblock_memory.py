"""Re-blocking a trace's ids a chunk of rows at a time, and not at all when nothing reads them:
the same ids as the whole-array version, a small peak, and the same runs."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from llmsched.api import simulate
from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec, make_trace, read_trace
from llmsched.workload import blocks as blocks_mod
from llmsched.workload import spec as spec_mod
from llmsched.workload.blocks import chain, chain_ragged, reblock


def _reblock_whole(ids, ptr, prompt, source, target):
    """`reblock` as it was, on whole arrays at once (the reference for the chunked one)."""
    ids = np.asarray(ids, dtype=np.int64)
    ptr = np.asarray(ptr, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    counts = np.diff(ptr)
    if target <= source:
        r = source // target
        keep = np.minimum(counts * r, prompt // target)
        new_ptr = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=new_ptr[1:])
        row = np.repeat(np.arange(len(keep)), keep)
        j = np.arange(int(new_ptr[-1]), dtype=np.int64) - new_ptr[:-1][row]
        src = ids[ptr[:-1][row] + j // r]
        out = src if r == 1 else chain(src, j % r).view(np.int64)
        return np.ascontiguousarray(out, dtype=np.int64), new_ptr
    r = target // source
    keep = np.minimum(counts // r, prompt // target)
    new_ptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(keep, out=new_ptr[1:])
    row = np.repeat(np.arange(len(keep)), keep)
    m = np.arange(int(new_ptr[-1]), dtype=np.int64) - new_ptr[:-1][row]
    return chain_ragged(ids, ptr)[ptr[:-1][row] + (m + 1) * r - 1], new_ptr


def _ragged(rng, n, source, max_blocks=12):
    """n rows of random ids (some rows empty), prompts that end anywhere in a block
    (sometimes exactly on one, sometimes past the ids), as a trace reader gives them."""
    counts = rng.integers(0, max_blocks + 1, n)
    counts[rng.random(n) < 0.2] = 0
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    ids = rng.integers(-(2**63), 2**63 - 1, int(ptr[-1]), dtype=np.int64)
    prompt = np.maximum(counts, 1) * source - rng.integers(0, source, n)  # partial last blocks
    exact = rng.random(n) < 0.3
    prompt[exact] = np.maximum(counts[exact], 1) * source
    longer = rng.random(n) < 0.1
    prompt[longer] += source * 3  # more tokens than the ids cover
    return ids, ptr, np.maximum(prompt, 1)


@pytest.mark.parametrize(
    "source, target",
    [(512, 16), (512, 512), (16, 16), (32, 16), (512, 1), (16, 64), (512, 1024), (1, 512), (48, 16)],
)
@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_chunked_reblock_equals_the_whole_array_one(monkeypatch, source, target, chunk):
    monkeypatch.setattr(blocks_mod, "_CHUNK", chunk)  # many chunks, rows longer than one
    rng = np.random.default_rng(source * 7919 + target)
    for n in (0, 1, 3, 57):
        ids, ptr, prompt = _ragged(rng, n, source)
        got, gptr = reblock(ids, ptr, prompt, source, target)
        want, wptr = _reblock_whole(ids, ptr, prompt, source, target)
        assert got.dtype == np.int64 and gptr.dtype == np.int64
        assert np.array_equal(gptr, wptr) and got.tobytes() == want.tobytes(), (n, chunk)
    # every row empty, and ids for no tokens of a prompt
    ptr = np.zeros(4, dtype=np.int64)
    got, gptr = reblock(np.zeros(0, dtype=np.int64), ptr, np.array([1, 5, 9000]), source, target)
    assert got.shape == (0,) and gptr.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_chain_ragged_does_not_depend_on_the_chunks(monkeypatch, chunk):
    rng = np.random.default_rng(5)
    ids, ptr, _ = _ragged(rng, 40, 16)
    whole = chain_ragged(ids, ptr)
    monkeypatch.setattr(blocks_mod, "_CHUNK", chunk)
    assert chain_ragged(ids, ptr).tobytes() == whole.tobytes()


def test_reblock_refuses_sizes_that_do_not_divide():
    ptr = np.array([0, 1])
    with pytest.raises(ConfigError, match="^cannot map the trace's 512-token blocks onto 48-token cache blocks"):
        reblock(np.array([1]), ptr, np.array([512]), 512, 48)
    with pytest.raises(ConfigError, match="^cannot map the trace's 16-token blocks onto 24-token cache blocks"):
        reblock(np.array([1]), ptr, np.array([512]), 16, 24)


def test_reblock_peak_memory_stays_near_its_output(monkeypatch):
    # the whole-array version held about 8 output-sized temporaries at once
    monkeypatch.setattr(blocks_mod, "_CHUNK", 1 << 15)
    n = 2000
    ptr = np.arange(n + 1, dtype=np.int64) * 32  # 32 ids of 512 tokens a row -> 1024 ids of 16
    ids = np.arange(int(ptr[-1]), dtype=np.int64)
    prompt = np.full(n, 32 * 512, dtype=np.int64)
    tracemalloc.start()
    try:
        out, _ = reblock(ids, ptr, prompt, 512, 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == (n * 1024,)
    assert peak < 1.5 * out.nbytes, (peak, out.nbytes)


def _write_mooncake(path, n=240):
    """Shared prefixes of four roots, own tails, prompts that end in a full or a partial
    512-token block (or have no ids)."""
    lines = []
    for i in range(n):
        shared, own = (i * 7) % 31, (i * 5) % 9
        ids = [1000 * (i % 4) + j for j in range(shared)] + [10**6 + 100 * i + j for j in range(own)]
        last = (512, 1, 300, 511)[i % 4]
        inp = (len(ids) - 1) * 512 + last if ids else 1 + (i * 37) % 600
        row = {"timestamp": 13 * i, "input_length": inp, "output_length": 1 + i % 40, "hash_ids": ids}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_make_trace_without_blocks_builds_no_cache_block_ids(tmp_path, monkeypatch):
    path = _write_mooncake(tmp_path / "mc.jsonl")
    monkeypatch.setattr(spec_mod, "_TRACE_CACHE", {})
    fine = read_trace(path, block_size=16)  # what the old reading built, at 32x the source's ids
    tracemalloc.start()
    try:
        t = make_trace(WorkloadSpec(arrival=f"trace:{path}"), 16, blocks=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert t.block_ids is None and np.array_equal(t.prompt, fine.prompt)
    # the cached read keeps the file's 512-token ids, not ids cut to 16 tokens
    assert [c.block_size for c in spec_mod._TRACE_CACHE.values()] == [512]
    assert peak < fine.block_ids.nbytes, (peak, fine.block_ids.nbytes)
    # block sizes that cannot be mapped are refused where the ids are wanted; without them
    # (no prefix cache) the block size is unused, and the run warns of that instead
    with pytest.raises(ConfigError, match="512-token blocks onto 48-token cache blocks"):
        make_trace(WorkloadSpec(arrival=f"trace:{path}"), 48)
    assert make_trace(WorkloadSpec(arrival=f"trace:{path}"), 48, blocks=False).block_ids is None


@pytest.mark.parametrize("block_size", [16, 32, 512, 1024])
@pytest.mark.parametrize("prompt", [None, "uniform:1,30000", "const:700"])
def test_make_trace_ids_equal_reading_the_trace_at_the_block_size(tmp_path, block_size, prompt):
    path = _write_mooncake(tmp_path / "mc.jsonl")
    spec = WorkloadSpec(arrival=f"trace:{path}", num_requests=200, prompt=prompt, seed=3)
    t = make_trace(spec, block_size)
    # the old way: the whole trace read at block_size, its head's ids cut to the full blocks
    # of the new prompts and the trace's own (a partial last block's id is its tokens only)
    head = read_trace(path, block_size=block_size).head(200)
    ids, ptr = reblock(head.block_ids, head.block_ptr, np.minimum(t.prompt, head.prompt), block_size, block_size)
    assert t.block_size == block_size
    assert np.array_equal(t.block_ptr, ptr) and t.block_ids.tobytes() == ids.tobytes()


def test_prefix_caching_run_on_a_mooncake_trace_is_unchanged(tmp_path):
    path = _write_mooncake(tmp_path / "mc.jsonl")
    # the numbers of these runs before re-blocking was chunked and done per run
    want = {
        16: ((2289745, 1776416, 143004, 111026, 31972), 1.0833333333333333, 7401.733333333334),
        1024: ((2289745, 1709056, 2132, 1669, 457), 1.15, 7121.066666666667),
    }
    keys = ("queried_tokens", "hit_tokens", "queried_blocks", "hit_blocks", "cached_blocks")
    for bs, (pc, ttft, cached) in want.items():
        s = simulate(trace=str(path), prefix_caching=True, block_size=bs, cost_model="const:1", b_max=4096).summary
        assert s["completed"] == 240
        assert tuple(s["prefix_cache"][k] for k in keys) == pc
        assert s["mean_ttft_ms"] == ttft and s["cached_prompt_tokens_per_request"] == cached
