"""A prompt law over a trace with block ids: only blocks full in both the new prompt and
the traced one keep their ids (a partial last traced block's id stands for its tokens only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmsched.cli import main
from llmsched.workload import Trace, WorkloadSpec, make_trace

# two requests of 20 tokens at 16-token blocks: one full block (7) and a partial one (8)
PARTIAL = "arrival_s,prompt_tokens,output_tokens,block_ids@16\n0,20,2,7 8\n5,20,2,7 8\n"
MOONCAKE = (
    '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
    '{"timestamp": 5000, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
)


def _simulate(capsys, *argv) -> dict:
    code = main(["simulate", *argv, "--cost-model", "paper", "--out", "", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("block", [None, "8"])
def test_a_longer_prompt_does_not_make_a_partial_block_a_hit(capsys, tmp_path, block):
    """--prompt const:40 on the trace: the requests share only their 20 traced tokens, one
    full 16-token block; at the trace's own block size the partial block's id was handed
    out as a second full block (32 hit tokens)."""
    p = tmp_path / "pbp.csv"
    p.write_text(PARTIAL)
    extra = [] if block is None else ["--block-size", block]
    d = _simulate(capsys, "--trace", str(p), "--prefix-caching", "--prompt", "const:40", *extra)["prefix_cache"]
    assert (d["hit_tokens"], d["queried_tokens"]) == (16, 80)
    # the trace's own prompts: unchanged
    d = _simulate(capsys, "--trace", str(p), "--prefix-caching")["prefix_cache"]
    assert (d["hit_tokens"], d["queried_tokens"]) == (16, 40)


def test_make_trace_cuts_ids_to_the_traced_full_blocks(tmp_path):
    p = tmp_path / "pbp.csv"
    p.write_text(PARTIAL)
    t = make_trace(WorkloadSpec(arrival=f"trace:{p}", prompt="const:40"), block_size=16)
    assert [len(b) for b in t.blocks()] == [1, 1]
    m = tmp_path / "mc.jsonl"
    m.write_text(MOONCAKE)
    t = make_trace(WorkloadSpec(arrival=f"trace:{m}", prompt="const:1100"), block_size=512)
    assert [len(b) for b in t.blocks()] == [1, 1]  # 512 shared tokens, not 1,024
    t = make_trace(WorkloadSpec(arrival=f"trace:{m}"), block_size=512)
    assert [len(b) for b in t.blocks()] == [1, 1]


def test_with_lengths_keeps_a_partial_id_only_while_the_prompt_does_not_grow():
    t = Trace([0.0, 1.0], [20, 20], [2, 2], block_ids=[7, 8, 7, 8], block_ptr=[0, 2, 4], block_size=16)
    longer = t.with_lengths(prompt=[40, 40])
    assert [len(b) for b in longer.blocks()] == [1, 1]  # what the simulator is handed
    assert np.diff(longer.block_ptr).tolist() == [1, 1]
    # not longer: the stored partial id stays (its tokens are still the trace's)
    assert np.diff(t.with_lengths(prompt=[20, 18]).block_ptr).tolist() == [2, 2]
    assert np.diff(t.with_lengths(prompt=[15, 16]).block_ptr).tolist() == [1, 1]
