"""Trace formats (plain, Azure, BurstGPT, Mooncake) and prefix-cache block ids on traces."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from llmsched.core.errors import ConfigError
from llmsched.workload import Trace, WorkloadSpec, make_trace, read_trace
from llmsched.workload.blocks import chain_ragged, reblock, take_rows
from llmsched.workload.trace import TraceWarning, read_burstgpt_csv, read_mooncake_jsonl, trace_format

FIX = Path(__file__).resolve().parent / "data" / "traces" / "formats"
MOONCAKE = FIX / "mooncake.jsonl"
BURSTGPT = FIX / "burstgpt.csv"
AZURE24 = FIX / "azure_2024.csv"
PLAIN_BLOCKS = FIX / "plain_blocks.csv"

# the fixture's rows in arrival order: (arrival_s, input_length, output, hash_ids)
MOONCAKE_ROWS = [
    (0.0, 1100, 10, [0, 1, 2]),
    (0.1, 600, 1, [4, 5]),
    (0.25, 1536, 5, [0, 1, 3]),
    (1.0, 300, 1, [6]),  # output_length 0 counts as 1
    (1.5005, 2048, 7, [0, 1, 3, 7]),
]


def _common(a, b) -> int:
    """Length of the common leading run of two id sequences."""
    a, b = a or (), b or ()
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sharing(blocks) -> list:
    """Per-request block ids relabelled 0, 1, 2, ... by first appearance: what requests
    share, whatever the ids' values (reading a CSV chains its ids, so the values change)."""
    labels: dict = {}
    return [None if b is None else tuple(labels.setdefault(x, len(labels)) for x in b) for b in blocks]


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------ detection
@pytest.mark.parametrize(
    "path, fmt", [(MOONCAKE, "mooncake"), (BURSTGPT, "burstgpt"), (AZURE24, "azure"), (PLAIN_BLOCKS, "plain")]
)
def test_each_fixture_is_recognised(path, fmt):
    assert trace_format(path) == fmt
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert len(read_trace(path)) >= 3


def test_unknown_format_names_the_formats(tmp_path):
    p = _write(tmp_path, "x.csv", "when,what\n1,2\n")
    with pytest.raises(ConfigError) as info:
        read_trace(p)
    msg = str(info.value)
    assert "\n" not in msg and "when,what" in msg
    for name in ("plain CSV", "Azure CSV", "BurstGPT CSV", "Mooncake JSON lines"):
        assert name in msg


# ------------------------------------------------------------------ Mooncake
def test_mooncake_fields_and_order():
    t = read_mooncake_jsonl(MOONCAKE, block_size=None)
    assert t.arrival_s.tolist() == [r[0] for r in MOONCAKE_ROWS]
    assert t.prompt.tolist() == [r[1] for r in MOONCAKE_ROWS]
    assert t.output.tolist() == [r[2] for r in MOONCAKE_ROWS]
    assert t.block_size == 512
    # 10 full blocks, 5 distinct ids (0,1 shared by three requests, 3 by two): an unbounded cache hits 5
    d = t.describe()
    assert d["full_blocks"] == 10 and d["block_reuse"] == 0.5
    # at the trace's own 512-token blocks: one id per full block, the partial last one dropped
    blocks = t.blocks()
    assert [len(b or ()) for b in blocks] == [r[1] // 512 for r in MOONCAKE_ROWS]
    # two requests share exactly as many leading ids as their hash_ids agree on (within full blocks)
    for i, ri in enumerate(MOONCAKE_ROWS):
        for j, rj in enumerate(MOONCAKE_ROWS):
            want = min(_common(ri[3], rj[3]), ri[1] // 512, rj[1] // 512)
            assert _common(blocks[i], blocks[j]) == want, (i, j)


def test_mooncake_at_cache_block_sizes():
    t16 = read_trace(MOONCAKE)  # the default cache block size
    assert t16.block_size == 16
    assert [len(b or ()) for b in t16.blocks()] == [r[1] // 16 for r in MOONCAKE_ROWS]
    b = t16.blocks()
    # rows 0 and 2 share hash ids 0, 1 = 1024 tokens = 64 blocks of 16, then differ
    assert _common(b[0], b[2]) == 64
    # rows 2 and 4 share 3 full 512-token blocks = 96 blocks of 16 (all of row 2's)
    assert _common(b[2], b[4]) == 96 == len(b[2])
    # row 3: 300 tokens in one partial source block still gives its 18 full 16-token blocks
    assert len(b[3]) == 18 and _common(b[3], b[0]) == 0
    # ids are distinct within a request (a chained hash never repeats along a prefix)
    assert all(len(set(x)) == len(x) for x in b if x)
    t1024 = read_trace(MOONCAKE, block_size=1024)
    b = t1024.blocks()
    assert [len(x or ()) for x in b] == [1, 0, 1, 0, 2]
    assert b[0] == b[2] and b[4][0] == b[0][0]
    # the id of a 1024-token block: the 512-token ids chained again, at its last one
    t512 = read_trace(MOONCAKE, block_size=512)
    row = np.array(t512.blocks()[4], dtype=np.int64)
    assert b[4] == tuple(chain_ragged(row, np.array([0, len(row)]))[[1, 3]].tolist())
    with pytest.raises(ConfigError, match="512-token blocks onto 48-token.*divide"):
        read_trace(MOONCAKE, block_size=48)
    with pytest.raises(ConfigError, match="^block_size must be a positive integer, got 0$"):
        read_trace(MOONCAKE, block_size=0)


def test_mooncake_slow_path_equals_fast(tmp_path):
    # other key order and an extra key: not Mooncake's own layout, read by json line by line
    lines = []
    for line in MOONCAKE.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            lines.append(json.dumps({"hash_ids": d["hash_ids"], "note": "x", **{k: d[k] for k in list(d)[:3]}}))
    p = _write(tmp_path, "other.jsonl", "\n".join(lines) + "\n")
    assert read_trace(p) == read_trace(MOONCAKE)


@pytest.mark.parametrize(
    "line, pattern",
    [
        ('{"timestamp": 5, "input_length": 10, "output_length": 2', "line 2 is not a JSON object"),
        ('{"timestamp": 5, "input_length": 10, "hash_ids": []}', "line 2 has no 'output_length'"),
        ('{"timestamp": 5, "input_length": -10, "output_length": 2, "hash_ids": []}', "line 2 key 'input_length'"),
        ('{"timestamp": 5, "input_length": 10.5, "output_length": 2, "hash_ids": []}', "line 2 key 'input_length'"),
        ('{"timestamp": "soon", "input_length": 10, "output_length": 2, "hash_ids": []}', "line 2 key 'timestamp'"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1.5]}', "line 2 key 'hash_ids'"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1,,2]}', "line 2"),
        ("[1, 2, 3]", "line 2 is not a JSON object"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, , 2]}', "line 2 is not a JSON"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 2,]}', "line 2 is not a JSON"),
        # json.loads keeps a repeated key's last value: it replayed at 9 ms, silently
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [], "timestamp": 9}',
            "line 2 gives key 'timestamp' twice",
        ),
    ],
)
def test_mooncake_bad_rows_name_the_line(tmp_path, line, pattern):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'
    p = _write(tmp_path, "bad.jsonl", f"{good}\n{line}\n{good}\n")
    with pytest.raises(ConfigError, match=pattern) as info:
        read_trace(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)


MOONCAKE_ROW = '{{"timestamp": {}, "input_length": {}, "output_length": {}, "hash_ids": [{}]}}'


@pytest.mark.parametrize(
    "values",
    [
        ("1.", 10, 2, "0"),  # JSON has no '1.' nor '.5': numpy read 1.0 and 0.5
        (".5", 10, 2, "0"),
        ("-.5", 10, 2, "0"),
        (5, "007", 2, "0"),  # nor leading zeros: numpy read 7
        (5, 10, "00", "0"),
        (5, 10, 2, "007, 1"),
        (5, 10, 2, "-01"),
        (5, 10, 2, "-, 1"),  # a lone sign: numpy read 0
        (5, "-", 2, "0"),
        ("5 6", "", 2, "0"),  # a value split by a space, the count made up by an empty one
    ],
)
def test_mooncake_fast_path_refuses_numbers_json_refuses(tmp_path, values):
    """Mooncake's layout is read by a fast parser; numbers spelt as JSON does not allow
    were read there (`1.` as 1, `007` as 7), where json.loads, which reads every other
    layout, refuses them. Both now give json's one-line error naming the line."""
    good = MOONCAKE_ROW.format(0, 10, 2, 0)
    line = MOONCAKE_ROW.format(*values)
    with pytest.raises(ValueError):
        json.loads(line)
    p = _write(tmp_path, "bad.jsonl", f"{good}\n{line}\n{good}\n")
    with pytest.raises(ConfigError, match="line 2 is not a JSON object: Expecting") as info:
        read_trace(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)
    # the same file in another key order, which only json.loads reads: the same refusal
    other = "\n".join(r.replace('{"timestamp": ', '{"note": 0, "timestamp": ') for r in (good, line, good))
    q = _write(tmp_path, "bad_other.jsonl", other + "\n")
    with pytest.raises(ConfigError, match="line 2 is not a JSON object: Expecting"):
        read_trace(q)


def test_mooncake_fast_path_reads_json_numbers_as_json_does(tmp_path, monkeypatch):
    """Zeros, fractions and signs that JSON allows stay on the fast parser, read as
    json.loads reads them."""
    import llmsched.workload.trace as trace_mod

    rows = [
        MOONCAKE_ROW.format("0", "10", "0", "0, 10, 100"),
        MOONCAKE_ROW.format("0.5", "100", "1", "-0, 105"),
        MOONCAKE_ROW.format("1.05", "512", "20", "-7, 0"),
        MOONCAKE_ROW.format("100.0", "1000", "3", "1000000000000000000"),
    ]
    p = _write(tmp_path, "ok.jsonl", "\n".join(rows) + "\n")
    monkeypatch.setattr(trace_mod, "_mooncake_slow", lambda *a: pytest.fail("slow path used"))
    # (rows 1 to 3 hold more ids than their prompts' blocks: dropped, and counted)
    with pytest.warns(TraceWarning, match=r"of 3 row\(s\)"):
        fast = read_mooncake_jsonl(p, block_size=None)
    monkeypatch.undo()
    other = "\n".join(r.replace('{"timestamp": ', '{"note": 0, "timestamp": ') for r in rows)
    with pytest.warns(TraceWarning, match=r"of 3 row\(s\)"):
        slow = read_mooncake_jsonl(_write(tmp_path, "ok_other.jsonl", other + "\n"), block_size=None)
    assert fast == slow
    want = [json.loads(r) for r in rows]
    assert fast.arrival_s.tolist() == [(d["timestamp"] - 0) / 1000 for d in want]
    assert fast.prompt.tolist() == [d["input_length"] for d in want]


def test_mooncake_big_fast_and_exact(tmp_path, monkeypatch):
    """Many rows in Mooncake's layout: read by the fast parser (the line-by-line one is
    not called), with the sharing structure of the hash ids."""
    import llmsched.workload.trace as trace_mod

    monkeypatch.setattr(trace_mod, "_mooncake_slow", lambda *a: pytest.fail("slow path used"))
    rng = np.random.default_rng(1)
    n = 3000
    rows = []
    for i in range(n):
        k = int(rng.integers(1, 6))
        shared = int(rng.integers(0, 3))
        ids = list(range(shared)) + [1000 + 10 * i + j for j in range(k)]
        rows.append({"timestamp": i * 7, "input_length": 512 * len(ids) - 5, "output_length": 3, "hash_ids": ids})
    fast = _write(tmp_path, "fast.jsonl", "\n".join(json.dumps(r) for r in rows))
    t = read_trace(fast, block_size=512)
    b = t.blocks()
    for i in range(0, n, 97):
        for j in range(0, n, 89):
            want = min(_common(rows[i]["hash_ids"], rows[j]["hash_ids"]), len(rows[i]["hash_ids"]) - 1)
            want = min(want, len(rows[j]["hash_ids"]) - 1)
            assert _common(b[i], b[j]) == want


# ------------------------------------------------------------------ BurstGPT
def test_burstgpt_reads_filters_and_counts_failures():
    with pytest.warns(TraceWarning, match="dropped 2 failed request"):
        t = read_burstgpt_csv(BURSTGPT)
    # failed rows (6 s and 8.5 s) dropped; arrival = Timestamp - first kept; 0 request tokens -> 1
    assert t.arrival_s.tolist() == [0.0, 2.0, 3.0, 4.5]
    assert t.prompt.tolist() == [100, 1, 50, 300] and t.output.tolist() == [20, 30, 5, 40]
    with pytest.warns(TraceWarning, match="dropped 1 failed"):
        chat = read_trace(BURSTGPT, model="chatgpt")
    assert chat.prompt.tolist() == [100, 1, 50]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no failed row among these: no warning
        api = read_trace(BURSTGPT, model="GPT-4", log_type="API log")
    assert api.prompt.tolist() == [300] and api.arrival_s.tolist() == [0.0]
    with pytest.warns(TraceWarning):
        both = read_trace(BURSTGPT, log_type=["Conversation log", "API log"])
    assert len(both) == 4
    with pytest.raises(ConfigError, match="no rows with Model 'llama'.*ChatGPT, GPT-4"):
        read_trace(BURSTGPT, model="llama")
    with pytest.raises(ConfigError, match="BurstGPT traces only"):
        read_trace(MOONCAKE, model="ChatGPT")


def test_burstgpt_bad_row_names_the_line(tmp_path):
    head = BURSTGPT.read_text().splitlines()[0]
    p = _write(tmp_path, "b.csv", f"{head}\n1,ChatGPT,10,2,12,API log\n2,ChatGPT,ten,2,12,API log\n")
    with pytest.raises(ConfigError, match="line 3 column 'Request tokens'.*'ten'"):
        read_trace(p)
    p = _write(tmp_path, "c.csv", f"{head}\n1,ChatGPT,10,2,12,API log\n2,ChatGPT,10,-2,8,API log\n")
    with pytest.raises(ConfigError, match="line 3 column 'Response tokens'"):
        read_trace(p)


# ------------------------------------------------------------------ Azure 2024 and plain
def test_azure_2024_timestamps_with_offsets():
    t = read_trace(AZURE24)
    assert np.allclose(t.arrival_s, [0.0, 0.49007, 0.99007])
    assert t.prompt.tolist() == [4808, 1, 3180] and t.output.tolist() == [10, 3, 8]
    assert t.block_ids is None and all(b is None for b in t.blocks())


def test_plain_csv_with_block_ids():
    t = read_trace(PLAIN_BLOCKS, block_size=None)
    # chained on reading, as Mooncake's hash_ids are: (11 12 13) and (11 12) share two blocks
    assert t.block_size == 32 and _sharing(t.blocks()) == [(0, 1, 2), (0, 1), None]
    assert t.blocks()[1] == tuple(chain_ragged([11, 12], [0, 2]).tolist())
    t64 = read_trace(PLAIN_BLOCKS, block_size=64)
    b64 = t64.blocks()
    assert len(b64[0]) == 1 and b64[0] == b64[1] and b64[2] is None  # 11 12 in both
    t16 = read_trace(PLAIN_BLOCKS)
    b = t16.blocks()
    assert [len(x or ()) for x in b] == [6, 4, 0]
    assert b[0][:4] == b[1]


@pytest.mark.parametrize(
    "rows, pattern",
    [
        ("0.0,100,5,11 x 13\n", "line 2 column 'block_ids@32'.*'11 x 13'"),
        ("0.0,100,5,11 12 13 14 15\n", "line 2 column 'block_ids@32': 5 block ids for a 100-token prompt"),
        ("0.0,100,5,1.5\n", "line 2 column 'block_ids@32'"),
    ],
)
def test_plain_csv_bad_block_ids(tmp_path, rows, pattern):
    p = _write(tmp_path, "p.csv", "arrival_s,prompt_tokens,output_tokens,block_ids@32\n" + rows)
    with pytest.raises(ConfigError, match=pattern):
        read_trace(p)
    p = _write(tmp_path, "q.csv", "arrival_s,prompt_tokens,output_tokens,block_ids@0\n0,1,1,\n")
    with pytest.raises(ConfigError, match="block size in column 'block_ids@0'"):
        read_trace(p)


# ------------------------------------------------------------------ Trace with block ids
def test_trace_operations_keep_block_ids(tmp_path):
    t = read_trace(MOONCAKE)
    b = t.blocks()
    assert t.slice(1, 3).blocks() == b[1:3] and t.head(2).blocks() == b[:2]
    assert t.slice(3).blocks() == b[3:] and t.slice(-2).blocks() == b[-2:] and t.slice(4, 2).blocks() == []
    assert t.time_scaled(2).blocks() == b and t.until(0.3).blocks() == b[:3]
    c = t.copy()
    assert c == t and c.block_ids is not t.block_ids
    c.block_ids[0] += 1
    assert c != t
    assert t != t.with_blocks(None, None)
    # fewer prompt tokens: ids beyond the new prompts' full blocks are dropped
    short = t.with_lengths(prompt=np.full(len(t), 40))
    assert short.blocks() == [x[:2] for x in b]
    # a CSV round trip keeps everything but the ids' values (chained on reading): what
    # the requests share, at this block size and others
    p = tmp_path / "t.csv"
    t.to_csv(p)
    assert p.read_text().splitlines()[0] == "arrival_s,prompt_tokens,output_tokens,block_ids@16"
    back = Trace.from_csv(p)
    assert back.with_blocks(None, None) == t.with_blocks(None, None) and read_trace(p) == back
    assert np.array_equal(back.block_ptr, t.block_ptr) and _sharing(back.blocks()) == _sharing(b)
    for size in (8, 32, 64):
        assert _sharing(back.blocks(size)) == _sharing(t.blocks(size))
    # requests carry the ids, at the trace's block size or another one
    reqs = list(t.requests())
    assert [r.blocks for r in reqs] == b
    assert [r.blocks for r in t.requests(block_size=32)] == t.with_block_size(32).blocks()
    # re-blocked a few requests at a time, as when stored at the source's 512-token blocks
    src = read_trace(MOONCAKE, block_size=None)
    assert list(src.iter_blocks(16, chunk=2)) == b == src.blocks(16)
    assert all(r.blocks is None for r in read_trace(AZURE24).requests())


def test_read_trace_takes_a_named_trace_as_simulate_does():
    from llmsched.workload import resolve_dataset

    # read_trace('azure-conv') (and `validate --trace azure-conv`) said the file did not exist
    assert read_trace("azure-conv") == read_trace(resolve_dataset("azure-conv")) == read_trace(" AZURE-CONV")
    with pytest.raises(ConfigError, match="file nothing.csv does not exist"):
        read_trace("nothing.csv")


def test_lines_of_spaces_are_blank_lines(tmp_path):
    p = tmp_path / "t.csv"
    blanks = '   \n1,20,2,b\n\t\n,,,\n"","","",""\n\n'
    p.write_text(f"arrival_s,prompt_tokens,output_tokens,tag\n0,10,1,a\n{blanks}2,30,3,c\n")
    t = read_trace(p)  # numpy said: could not convert string '   ' to float64 at row 1, column 1
    assert t.prompt.tolist() == [10, 20, 30] and t.tag.tolist() == ["a", "b", "c"]
    # a bad value after them is still named by its line
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n  \n1,x,2\n")
    with pytest.raises(ConfigError, match="line 4 column 'prompt_tokens': cannot read 'x' as a number"):
        read_trace(p)
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n  \n-1,5,2\n")
    with pytest.raises(ConfigError, match="line 4 column 'arrival_s'"):
        read_trace(p)
    # Python reads 2_0 as 20, numpy refuses it: the line was not named
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n2,2_0,4\n")
    with pytest.raises(ConfigError, match="line 3 column 'prompt_tokens': cannot read '2_0' as a number"):
        read_trace(p)


def test_mooncake_hash_ids_at_the_int64_limits_are_read(tmp_path):
    """2**63 - 1 and -2**63 are 64-bit integers: they were refused as not."""
    hi, lo = 2**63 - 1, -(2**63)
    rows = [MOONCAKE_ROW.format(0, 1100, 2, f"{hi}, {lo}"), MOONCAKE_ROW.format(10, 1100, 2, f"{hi}, 1")]
    p = _write(tmp_path, "limits.jsonl", "\n".join(rows) + "\n")
    t = read_trace(p)
    first, second = t.blocks()  # chained ids: the same first 512 tokens, then different ones
    n = 512 // t.block_size
    assert len(t) == 2 and first[:n] == second[:n] and first[n] != second[n]
    # unsigned 64-bit hashes (xxhash64's) from 2**63 up are read as their bits; past them, refused
    p = _write(tmp_path, "over.jsonl", MOONCAKE_ROW.format(0, 40, 2, 2**64) + "\n")
    with pytest.raises(ConfigError, match="hash_ids"):
        read_trace(p)


@pytest.mark.parametrize("extra_key", [False, True])  # the fast path and json's
def test_mooncake_ids_past_the_prompt_are_dropped_and_counted(tmp_path, extra_key):
    """A row with more hash_ids than its input_length needs (ceil(input_length / 512)) had
    the extra ids dropped without a word; now they are dropped and counted on one line,
    naming the first such row's line. Mooncake's published traces have no such row."""
    rows = [
        MOONCAKE_ROW.format(0, 600, 2, "1, 2"),  # 2 ids for 600 tokens: as many as it needs
        MOONCAKE_ROW.format(10, 1000, 2, "1, 3, 4, 5"),  # 4 for 1000: 2 too many
        MOONCAKE_ROW.format(20, 10, 2, "7, 8"),  # 2 for 10: 1 too many
    ]
    if extra_key:
        rows[0] = rows[0][:-1] + ', "note": "x"}'
    p = _write(tmp_path, "extra.jsonl", "\n".join(rows) + "\n")
    with pytest.warns(TraceWarning, match=r"of 2 row\(s\) .* \(first: line 2, 4 ids for 1000 tokens, at most 2\)"):
        t = read_trace(p, block_size=None)
    assert np.diff(t.block_ptr).tolist() == [2, 2, 1]  # kept: the ids of the prompt's blocks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rows with the ids they need: no warning
        read_trace(_write(tmp_path, "fit.jsonl", "\n".join(rows[:1]) + "\n"))
        read_trace(MOONCAKE)


def test_blank_lines_before_the_header_are_skipped(tmp_path):
    """The header was read from the first line only: a file starting with a blank line
    was "empty"."""
    from llmsched.workload.lengths import parse_length_law

    p = tmp_path / "t.csv"
    p.write_text("\n  \n,,\narrival_s,prompt_tokens,output_tokens,tag\n0,10,1,a\n\n1,20,2,b\n")
    t = read_trace(p)
    assert trace_format(p) == "plain" and t.prompt.tolist() == [10, 20] and t.tag.tolist() == ["a", "b"]
    p.write_text("\n\narrival_s,prompt_tokens,output_tokens\n0,10,1\n1,x,2\n")  # named by its own line
    with pytest.raises(ConfigError, match="line 5 column 'prompt_tokens': cannot read 'x' as a number"):
        read_trace(p)
    p.write_text("\n\narrival_s,prompt_tokens,output_tokens\n0,10,1\n-1,5,2\n")
    with pytest.raises(ConfigError, match="line 5 column 'arrival_s'"):
        read_trace(p)
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("\r\n   \r\nprompt_tokens\r\n7\r\n7\r\n")
    assert parse_length_law(f"empirical:{lengths}", "prompt").sample(np.random.default_rng(0), 3).tolist() == [7, 7, 7]
    p.write_text("\n \n")
    with pytest.raises(ConfigError, match="t.csv is empty"):
        read_trace(p)


def test_csv_round_trip_keeps_partial_last_blocks(tmp_path):
    # kept at a source block size (read_trace(..., block_size=None)), a prompt's last block
    # may be partial: its id re-blocks into the full finer blocks it holds
    ids, ptr = [1, 2, 3, 4, 5, 6], [0, 2, 3, 6]
    t = Trace([0.0, 1.0, 2.0], [100, 64, 130], [1, 2, 3], block_ids=ids, block_ptr=ptr, block_size=64)
    assert t.blocks() == [(1,), (3,), (4, 5)]  # handed out: full blocks only
    p = tmp_path / "t.csv"
    t.to_csv(p)
    assert p.read_text().splitlines()[1:] == ["0.0,100,1,1 2", "1.0,64,2,3", "2.0,130,3,4 5 6"]
    back = Trace.from_csv(p)
    assert read_trace(p, block_size=None) == back and np.array_equal(back.block_ptr, t.block_ptr)
    assert back.with_blocks(None, None) == t.with_blocks(None, None)
    assert _sharing(back.blocks()) == _sharing(t.blocks())
    assert _sharing(back.blocks(16)) == _sharing(t.blocks(16))
    assert len(t.with_block_size(16).block_ids) == 6 + 4 + 8


def test_trace_rejects_inconsistent_block_ids():
    with pytest.raises(
        ConfigError, match="request 0 has 4 block ids but its 40-token prompt holds only 3 blocks of 16"
    ):
        Trace([0.0], [40], [1], block_ids=[1, 2, 3, 4], block_ptr=[0, 4])
    with pytest.raises(ConfigError, match="block_ptr must have 3 offsets"):
        Trace([0.0, 1.0], [40, 40], [1, 1], block_ids=[1], block_ptr=[0, 1])
    with pytest.raises(ConfigError, match="both block_ids and block_ptr"):
        Trace([0.0], [40], [1], block_ids=[1])


def test_make_trace_replays_block_ids():
    full = read_trace(MOONCAKE)
    t = make_trace(WorkloadSpec(arrival=f"trace:{MOONCAKE}", num_requests=3))
    assert t == full.head(3)
    t32 = make_trace(WorkloadSpec(arrival=f"trace:{MOONCAKE}"), block_size=32)
    assert t32 == read_trace(MOONCAKE, block_size=32)
    # lengths redrawn from a law: the trace's ids cut to the new prompts' full blocks
    r = make_trace(WorkloadSpec(arrival=f"trace:{MOONCAKE}", prompt="const:100"))
    assert r.blocks() == [x[:6] for x in full.blocks()]
    with pytest.raises(ConfigError, match="BurstGPT traces only"):
        WorkloadSpec(arrival=f"trace:{MOONCAKE}", trace_model="GPT-4")
    with pytest.warns(TraceWarning):
        g = make_trace(WorkloadSpec(arrival=f"trace:{BURSTGPT}", trace_model="GPT-4"))
    assert g.prompt.tolist() == [300]


# ------------------------------------------------------------------ the hashing
def test_chained_ids_follow_prefixes():
    values = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 9, 2, 3], dtype=np.int64)
    ptr = np.array([0, 3, 6, 10, 13])
    ids = chain_ragged(values, ptr)
    rows = [tuple(ids[a:b].tolist()) for a, b in zip(ptr[:-1], ptr[1:])]
    assert rows[0] == rows[2][:3]  # the same prefix: the same ids
    assert rows[0][:2] == rows[1][:2] and rows[0][2] != rows[1][2]  # diverge at block 3
    # the same block content after a different prefix gets a different id
    assert rows[3][1:] != rows[0][1:] and not set(rows[3]) & set(rows[0])
    # deterministic, and a row's ids do not depend on the other rows
    assert np.array_equal(chain_ragged(values, ptr), ids)
    assert chain_ragged(values[3:6], [0, 3]).tolist() == list(rows[1])


def test_reblock_and_take_rows_hand_cases():
    ids = np.array([10, 20, 30, 40, 50], dtype=np.int64)
    ptr = np.array([0, 3, 3, 5])
    # 32 -> 16: two ids per source id, capped at prompt // 16
    out, optr = reblock(ids, ptr, np.array([100, 5, 33]), 32, 16)
    assert np.diff(optr).tolist() == [6, 0, 2]
    assert out[0] != out[1] and len(set(out.tolist())) == 8
    # 32 -> 64: the chained id of every second source block; a lone or partial pair gives none
    out, optr = reblock(ids, ptr, np.array([128, 64, 64]), 32, 64)
    assert out.tolist() == chain_ragged(ids, ptr)[[1, 4]].tolist() and optr.tolist() == [0, 1, 1, 2]
    # per-block ids (a hand-written file): a cache block whose first source block differs
    # is not shared even when its last one agrees (it was: the raw last id stood for both)
    per_block = np.array([1, 2, 3, 4, 9, 2, 3, 4], dtype=np.int64)
    out, optr = reblock(per_block, np.array([0, 4, 8]), np.array([64, 64]), 16, 32)
    assert optr.tolist() == [0, 2, 4] and set(out[:2].tolist()).isdisjoint(out[2:].tolist())
    same = np.array([1, 2, 3, 4, 1, 2, 3, 5], dtype=np.int64)  # differs in the last source block only
    out, _ = reblock(same, np.array([0, 4, 8]), np.array([64, 64]), 16, 32)
    assert out[0] == out[2] and out[1] != out[3]
    sub, sptr = take_rows(ids, ptr, np.array([2, 0]))
    assert sub.tolist() == [40, 50, 10, 20, 30] and sptr.tolist() == [0, 2, 5]


# ------------------------------------------------------------------ command line
def test_cli_reads_every_format_and_filters(tmp_path):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "llmsched.cli", "simulate", "--cost-model", "paper", "--out", "", "--json", *args],
            capture_output=True,
            text=True,
        )

    proc = run("--trace", str(BURSTGPT), "--trace-model", "ChatGPT")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_requests"] == 3
    # the dropped failed row is reported on one line
    assert proc.stderr.strip() == (
        f"llmsched simulate: warning: trace {BURSTGPT}: dropped 1 failed request(s) with 0 response tokens"
    )
    proc = run("--trace", str(MOONCAKE))
    assert proc.returncode == 0 and json.loads(proc.stdout)["num_requests"] == 5
    bad = _write(tmp_path, "bad.txt", "hello\n")
    for args in (["--trace", str(bad)], ["--trace", str(MOONCAKE), "--trace-log-type", "API log"]):
        proc = run(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Mooncake JSON lines" in run("--trace", str(bad)).stderr


@pytest.mark.parametrize("flag", ["--trace-model", "--trace-log-type"])
def test_a_burstgpt_filter_that_names_nothing_is_refused(capsys, flag):
    """`--trace-model ,` (or `' , '`) named no model and kept every row, as no filter does."""
    from helpers import one_line_error

    key = flag[2:].replace("-", "_")
    for given in (",", " , "):
        argv = ["simulate", "--trace", str(BURSTGPT), flag, given, "--cost-model", "paper", "--out", ""]
        one_line_error(capsys, argv, f"{key} ({flag}) ',' names nothing")
    with pytest.raises(ConfigError, match="names nothing"):
        read_trace(
            BURSTGPT, model=[] if key == "trace_model" else None, log_type=[" "] if key != "trace_model" else None
        )
    with warnings.catch_warnings():  # (its failed row dropped)
        warnings.simplefilter("ignore")
        assert read_trace(BURSTGPT, model="ChatGPT,") == read_trace(
            BURSTGPT, model="ChatGPT"
        )  # (an empty name beside one)


def test_chain_ragged_is_the_prefix_recurrence(monkeypatch):
    """The vectorised hash equals its definition computed step by step:
    H_k = P * H_(k-1) + mix(value_k) mod 2**64, id_k = mix(H_k + k * G + root)."""
    from llmsched.workload import blocks as B

    p, mask = int(B._M1), (1 << 64) - 1
    rng = np.random.default_rng(0)
    values = rng.integers(-(2**62), 2**62, size=60)
    ptr = np.array([0, 7, 7, 40, 60])
    ids = B.chain_ragged(values, ptr)

    def m(x: int) -> int:
        return int(B.mix(np.array([x & mask], dtype=np.uint64))[0])

    for a, b in zip(ptr[:-1], ptr[1:]):
        h = 0
        for k in range(b - a):
            h = (h * p + m(int(values[a + k]) + int(B._GOLDEN))) & mask
            want = m(h + k * int(B._GOLDEN) + int(B._ROOT))
            assert int(np.int64(ids[a + k]).view(np.uint64)) == want
    # hashed a few ids at a time: the same ids (rows never straddle chunks)
    monkeypatch.setattr(B, "_CHUNK", 8)
    assert np.array_equal(B.chain_ragged(values, ptr), ids)


def test_python_api_takes_the_trace_options():
    import llmsched

    with pytest.warns(TraceWarning):
        r = llmsched.simulate(trace=str(BURSTGPT), trace_model="ChatGPT", cost_model="paper", verdict=False)
    assert r.summary["num_requests"] == 3 and r.config["workload"]["trace_model"] == "ChatGPT"
    r = llmsched.simulate(
        cost_model="paper", rate=2, num_requests=50, system_prompt=64, turns=2, think_time_s=1.0, verdict=False
    )
    assert r.summary["num_requests"] == 50 and r.config["workload"]["turns"] == "const:2"


def test_gzip_compressed_files_are_read_as_the_text_they_hold(tmp_path):
    """They failed with "'utf-8' codec can't decode byte 0x8b in position 1"."""

    from llmsched.workload.lengths import parse_length_law

    plain = tmp_path / "t.csv"
    plain.write_text("\narrival_s,prompt_tokens,output_tokens,tag\n0,10,1,a\n\n0.5,20,2,b\n")
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(packed) == read_trace(plain)
    moon = tmp_path / "m.jsonl.gz"
    moon.write_bytes(gzip.compress(MOONCAKE.read_bytes()))
    assert trace_format(moon) == "mooncake" and read_trace(moon) == read_trace(MOONCAKE)
    law = parse_length_law(f"empirical:{packed}", "output")
    assert sorted(set(law.sample(np.random.default_rng(0), 50).tolist())) == [1, 2]
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(gzip.compress(b"arrival_s,prompt_tokens,output_tokens\n0,10,1\n1,x,2\n"))
    with pytest.raises(ConfigError, match="bad.csv.gz is malformed: line 3 column 'prompt_tokens'"):
        read_trace(bad)
    bad.write_bytes(packed.read_bytes()[:30])  # cut short
    with pytest.raises(ConfigError, match="^cannot read file .*bad.csv.gz: "):
        read_trace(bad)


def test_a_binary_file_is_named_as_not_text(tmp_path, capsys):
    from helpers import one_line_error

    p = tmp_path / "t.csv"
    p.write_bytes(b"\xff\xfe\x00arrival_s")
    one_line_error(capsys, ["simulate", "--trace", str(p), "--out", ""], "t.csv: it is not UTF-8 text")


@pytest.mark.parametrize("compress", [False, True])
def test_a_byte_that_is_not_utf8_past_the_first_chunk_is_one_line(tmp_path, capsys, compress):
    """A Latin-1 byte past the header's 8 KiB (a CSV saved from a spreadsheet, an accented
    tag deep in the file) escaped as a UnicodeDecodeError traceback: numpy's decode error
    is a ValueError, whose handler read the file again and raised it anew. The line and the
    byte of the file are named (the decoder's own offset counts from a read chunk)."""
    from helpers import one_line_error

    rows = ["arrival_s,prompt_tokens,output_tokens,tag"] + [f"{i * 0.1:.1f},100,20,chat" for i in range(2000)]
    rows[1500] = "150.0,100,20,caf\xe9"
    data = ("\n".join(rows) + "\n").encode("latin-1")
    p = tmp_path / ("t.csv.gz" if compress else "t.csv")
    p.write_bytes(gzip.compress(data) if compress else data)
    at = data.index(b"\xe9")
    one_line_error(capsys, ["simulate", "--trace", str(p), "--out", ""], f"not UTF-8 text (line 1501, byte {at})")
    lengths = tmp_path / "lengths.csv"  # a character cut off at the end of the file
    lengths.write_bytes(b"prompt_tokens,output_tokens\n" + b"100,20\n" * 2000 + b"5,\xef")
    for argv in (
        ["simulate", "--prompt", f"empirical:{lengths}", "--output", "5", "--num-requests", "10", "--out", ""],
        ["capacity", "--lengths", str(lengths)],
    ):
        one_line_error(capsys, argv, "lengths.csv: it is not UTF-8 text (line 2002, byte ")


def test_a_parquet_table_reads_as_its_csv(tmp_path, capsys, monkeypatch):
    """`--parquet` writes requests.parquet beside requests.csv: given back as a trace (or a
    length file), it failed with "'utf-8' codec can't decode byte"."""
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import one_line_error

    from llmsched import simulate
    from llmsched.workload.lengths import parse_length_law

    run = tmp_path / "run"
    result = simulate(
        cost_model="const:1", rate=5, num_requests=30, prompt="uniform:5,50", output="const:3", out_dir=str(run)
    )
    result.write_parquet(run)
    from_parquet, from_csv = read_trace(run / "requests.parquet"), read_trace(run / "requests.csv")
    assert trace_format(run / "requests.parquet") == "plain" and from_parquet == from_csv
    law = parse_length_law(f"empirical:{run / 'requests.parquet'}", "prompt")
    assert law.expected() == pytest.approx(from_csv.prompt.mean())
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": [5, 0], "output_tokens": [1, 1]}), bad)
    with pytest.raises(ConfigError, match="row 2 column 'prompt_tokens': 0 tokens is below the minimum of 1"):
        read_trace(bad)
    pq.write_table(pa.table({"arrival_s": ["0", "soon"], "prompt_tokens": [5, 6], "output_tokens": [1, 1]}), bad)
    with pytest.raises(ConfigError, match=r"column 'arrival_s' \(string\) cannot be read as numbers"):
        read_trace(bad)
    # block ids as a list column read as the CSV's space-separated text; a column that is
    # not text is named as such (it read "cannot be read as timestamps")
    csv_path, blocks = tmp_path / "b.csv", tmp_path / "b.parquet"
    csv_path.write_text("arrival_s,prompt_tokens,output_tokens,block_ids@16\n0,20,1,1 2\n1,40,2,1 2 3\n")
    table = {"arrival_s": [0.0, 1.0], "prompt_tokens": [20, 40], "output_tokens": [1, 2]}
    pq.write_table(pa.table({**table, "block_ids@16": [[1, 2], [1, 2, 3]]}), blocks)
    assert read_trace(blocks) == read_trace(csv_path)
    pq.write_table(pa.table({**table, "tag": [{"a": 1}, {"a": 2}]}), bad)
    with pytest.raises(ConfigError, match=r"column 'tag' \(struct<a: int64>\) cannot be read as text$"):
        read_trace(bad)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    one_line_error(
        capsys,
        ["simulate", "--trace", str(bad), "--out", ""],
        "bad.parquet is a Parquet file: reading it needs pyarrow",
    )
    one_line_error(
        capsys, ["simulate", "--prompt", f"empirical:{bad}:prompt_tokens", "--out", ""], "--prompt: ", "needs pyarrow"
    )


@pytest.mark.parametrize("column", ["arrival_s", "prompt_tokens", "output_tokens"])
def test_a_null_parquet_cell_is_named_as_null(tmp_path, capsys, column):
    """A null cell was read as NaN and reported as one ("row 2 column 'arrival_s': nan is not
    a time >= 0"): the table holds no value there, which the message now says."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import one_line_error

    from llmsched.workload.lengths import parse_length_law

    table = {"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [5, 6, 7], "output_tokens": [1, 1, 1]}
    table[column] = [table[column][0], None, table[column][2]]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(table), path)
    err = one_line_error(
        capsys, ["simulate", "--trace", str(path), "--out", ""], f"row 2 column '{column}' holds no value (null)"
    )
    assert "nan" not in err
    with pytest.raises(ConfigError, match=f"row 2 column '{column}' holds no value"):
        parse_length_law(f"empirical:{path}:{column}", "prompt").expected()


def test_a_json_lines_trace_read_as_a_csv_says_so(tmp_path):
    """`Trace.from_csv` of a Mooncake JSON-lines file said its first line "holds a number
    ('1'): the file needs a header line", about a file that is no CSV at all."""
    from llmsched.core.errors import ConfigError
    from llmsched.workload import Trace, read_trace

    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="is not a CSV file: its first line is JSON .*read_trace"):
        Trace.from_csv(p)
    assert list(read_trace(p).prompt) == [10]


@pytest.mark.parametrize(
    "prompt, said",
    [
        ([[1, 2, 3], 5], "got lists among numbers"),  # numpy's ValueError, a traceback
        (np.array([[1, 2, 3], 5], dtype=object), "got lists among numbers"),
        ([[1, 2, 3], [4, 5, 6]], "got an array of shape (2, 3)"),  # flattened into 6 lengths
    ],
)
def test_token_id_lists_where_lengths_go_are_refused(prompt, said):
    """A prompt column of token-id lists (all or some rows) is no column of lengths."""
    import llmsched

    with pytest.raises(ConfigError) as e:
        Trace(arrival_s=[0.0, 1.0], prompt=prompt, output=[3, 3])
    assert str(e.value).startswith(f"trace prompt must hold one length per request, {said}"), str(e.value)
    assert "give len(ids)" in str(e.value)

    class Duck:  # an object with the arrays, as simulate takes it
        arrival_s, output = np.array([0.0, 1.0]), np.array([3, 3])

    Duck.prompt = prompt
    with pytest.raises(ConfigError, match="must hold one length per request"):
        llmsched.simulate(trace=Duck(), cost_model="paper")
    # a vector of one length per request stays one, whatever its shape
    for column in ([[7], [8]], [[7, 8]], np.array([7, 8])):
        assert Trace(arrival_s=[0.0, 1.0], prompt=column, output=[3, 3]).prompt.tolist() == [7, 8]


def test_to_csv_is_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write stopped between its blocks of rows (Ctrl-C, a full disk) left the first
    100,000 rows: a shorter trace that reads as valid, the earlier file lost. Now the
    earlier file stays as it was, and no temporary file is left."""
    import llmsched.workload.trace as trace_module

    f = tmp_path / "t.csv"
    small = Trace(arrival_s=[0.0, 1.0], prompt=[5, 6], output=[3, 3])
    small.to_csv(f)
    n = 150_000
    big = Trace(arrival_s=np.arange(n, dtype=np.float64), prompt=np.full(n, 7), output=np.full(n, 2))
    calls = 0

    def stop_late(x):
        nonlocal calls
        calls += 1
        if calls > 120_000:  # (in the second block of rows)
            raise KeyboardInterrupt
        return repr(x)

    monkeypatch.setattr(trace_module, "repr", stop_late, raising=False)
    with pytest.raises(KeyboardInterrupt):
        big.to_csv(f)
    monkeypatch.undo()
    assert read_trace(f) == small
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    with pytest.raises(
        ConfigError, match=r"^cannot write trace file .*x.csv: \[Errno 20\] Not a directory: '.*x.csv'$"
    ):
        small.to_csv(f / "x.csv")  # (the file's name, not a temporary one's)
