"""A plain trace's block ids (`block_ids@B`: each row's ids as space-separated text, what
`Trace.to_csv` writes) are read without a numpy str array, which holds every row at the
width of the longest row, four bytes a character: Mooncake's trace written by `to_csv`
(78 MB, its longest row 243,786 characters) took 7.5 GB to read, and failed with a
MemoryError under a 3 GB limit. A Parquet table's block ids (text or lists) likewise."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from llmsched.cli import main
from llmsched.workload import Trace, read_trace
from llmsched.workload.blocks import chain_ragged
from llmsched.workload.csvio import read_columns

SHORT = 200  # rows of one block id
LONG_IDS = 5000  # one row's ids: about 100,000 characters (a numpy str array: 80 MB)


def _long_row_trace() -> Trace:
    n = SHORT + 1
    counts = np.ones(n, dtype=np.int64)
    counts[SHORT // 2] = LONG_IDS
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    ids = np.random.default_rng(1).integers(-(2**62), 2**62, int(ptr[-1]))
    ids[ptr[:-1]] = 7  # every prompt starts with the same block: shared under prefix caching
    tag = np.array([f"c{i % 3}" for i in range(n)])
    return Trace(np.arange(n) * 0.1, counts * 16, np.full(n, 2), tag, block_ids=ids, block_ptr=ptr, block_size=16)


def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _check_read(path, tr: Trace) -> None:
    back, peak = _peak(lambda: read_trace(path))
    # reading chains the ids as Mooncake's are (what they share is kept)
    chained = chain_ragged(tr.block_ids, tr.block_ptr)
    assert back == Trace(tr.arrival_s, tr.prompt, tr.output, tr.tag, chained, tr.block_ptr, tr.block_size)
    assert peak < 20e6, f"reading {path.name} peaked at {peak / 1e6:.0f} MB"  # (with a str array: 82 to 163 MB)


def test_a_long_block_ids_row_reads_in_its_own_size(tmp_path):
    tr = _long_row_trace()
    path = tmp_path / "t.csv"
    tr.to_csv(path)
    assert 90_000 < max(len(line) for line in path.read_text().splitlines()) < 110_000
    _check_read(path, tr)
    # the text kind: Python strings, stripped; the short text columns are still str arrays
    cols = read_columns(path, {"tag": "str"}, {"block_ids@16": "text"})
    assert cols["block_ids@16"].dtype == object and cols["tag"].dtype.kind == "U"
    path.write_text("arrival_s,prompt_tokens,output_tokens,tag,block_ids@16\n0,32, 1 , a , 1 2 \n1,16,1,b,\n")
    cols = read_columns(path, {"tag": "str"}, {"block_ids@16": "text"})
    assert cols["block_ids@16"].tolist() == ["1 2", ""] and cols["tag"].tolist() == ["a", "b"]


@pytest.mark.parametrize("as_lists", [False, True])
def test_a_long_block_ids_row_of_a_parquet_table(tmp_path, as_lists):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tr = _long_row_trace()
    rows = [tr.block_ids[a:b].tolist() for a, b in zip(tr.block_ptr[:-1], tr.block_ptr[1:])]
    path = tmp_path / "t.parquet"
    table = {"arrival_s": tr.arrival_s, "prompt_tokens": tr.prompt, "output_tokens": tr.output, "tag": tr.tag}
    blocks = rows if as_lists else [" ".join(map(str, r)) for r in rows]
    pq.write_table(pa.table({**table, "block_ids@16": blocks}), path)
    _check_read(path, tr)


def test_the_cli_simulates_a_trace_with_a_long_block_ids_row(tmp_path, capsys):
    tr = _long_row_trace()
    path = tmp_path / "t.csv"
    tr.to_csv(path)
    argv = ["simulate", "--trace", str(path), "--cost-model", "paper", "--prefix-caching", "--json", "--out", ""]
    rc, peak = _peak(lambda: main(argv))
    assert rc in (0, None)
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == len(tr) and summary["prefix_cache"]["hit_blocks"] > 0
    assert peak < 40e6, f"the CLI peaked at {peak / 1e6:.0f} MB"
