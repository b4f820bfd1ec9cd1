"""Failing test from the engine / KV bug hunt (report-only): the simulator side."""

from __future__ import annotations


def test_simulate_prefix_caching_on_a_trace_without_block_ids_says_so(tmp_path, capsys):
    """`--prefix-caching` on a trace with no block ids cannot hit anything; the run reports
    a 0.0% hit rate with no word that the flag had nothing to work on."""
    from llmsched.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,64,4\n0.1,64,4\n0.2,64,4\n")
    rc = main(["simulate", "--trace", str(trace), "--prefix-caching", "--out", ""])
    err = capsys.readouterr().err
    assert rc in (0, None)
    assert "block" in err.lower(), f"no warning on stderr: {err!r}"
