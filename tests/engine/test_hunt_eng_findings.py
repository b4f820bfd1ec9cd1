"""Failing tests from the engine / KV bug hunt (report-only): each shows one finding."""

from __future__ import annotations

import csv

SMALL_GRID = dict(
    tokens=[1, 8, 32, 64], batches=[1, 4], contexts=[16, 64], chunks=[16, 32], chunk_contexts=[0, 32], lm_tokens=[1, 8]
)


def test_profile_decode_batches_reach_max_num_seqs(tiny_model, tmp_path):
    """The engine decodes up to min(max_num_seqs, b_max) sequences in a step; the LM-head
    grid reaches that load but the decode-attention grid stops at the largest grid batch
    below it, so a step of 5-6 decoders is extrapolated from batches 1 and 4."""
    from llmsched.engine.profiler import profile

    out = tmp_path / "prof.csv"
    profile(
        tiny_model,
        out,
        max_num_seqs=6,
        max_model_len=256,
        b_max=64,
        grid=SMALL_GRID,
        reps=1,
        warmup=0,
        min_s=0,
        calibrate=False,
    )
    rows = list(csv.DictReader(open(out)))
    lm = {int(r["tokens"]) for r in rows if r["table"] == "lm_head"}
    dec = {int(r["batch"]) for r in rows if r["table"] == "decode_attn"}
    assert max(lm) == 6
    assert max(dec) == 6, f"decode_attn batches {sorted(dec)}, lm_head rows {sorted(lm)}"
