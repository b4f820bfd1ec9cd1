"""A sweep's point keys stamp the named datasets they read, and what `simulate` refuses
stops a sweep before any run (exit 2, one line, no results folder)."""

import pytest

from llmsched.analysis import sweep
from llmsched.cli import main

BASE = dict(cost_model="paper", prompt="geometric:200", output="geometric:101", num_requests=600)
CLI = ["--cost-model", "paper", "--prompt", "geometric:200", "--output", "geometric:101"]


# -- 5. what simulate refuses stops a sweep before any run ------------------------------


@pytest.mark.parametrize(
    "files, args, msg",
    [
        ({"bad.csv": "a,b\n1,2\n"}, ["--trace", "bad.csv"], "not a trace in a known format"),
        (
            {"neg.csv": "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-3,5\n"},
            ["--trace", "neg.csv"],
            "-3 tokens is below the minimum",
        ),
        (
            {"lens.csv": "prompt_tokens,output_tokens\nx,y\n"},
            [*CLI[:2], "--prompt", "empirical:lens.csv", "--output", "geometric:11"],
            "malformed",
        ),
        ({}, [*CLI[:6], "--sample-interval", "1e-9"], "at least 1 microsecond"),
        ({}, [*CLI[:6], "--grid", "slo=ttft_ms=100"], "slo must be a mapping"),
    ],
)
def test_bad_inputs_stop_a_sweep_before_any_run(tmp_path, monkeypatch, capsys, files, args, msg):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    calls = []
    monkeypatch.setattr(sweep, "run_point", lambda cfg: calls.append(cfg) or {"wall_s": 0.0})
    grid = [] if "--grid" in args else ["--grid", "policy=sarathi,orca"]
    argv = ["sweep", *args, *grid, "--num-requests", "50", "--workers", "1", "--no-plots", "--out", "out"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and msg in err and "Traceback" not in err
    assert calls == [] and not (tmp_path / "out").exists()
