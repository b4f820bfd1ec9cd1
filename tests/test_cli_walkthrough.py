"""What a reviewer walking the README and docs as a new user tripped over: a sweep help
example that failed as written, a range without its number of points, a capacity report
that did not say which mean was given, output files whose missing folders were refused
where output folders are made, `--trace` help silent on gzip, Parquet and `--prompt`,
per-request SLO errors that hid the short names, and a benchmark that failed at import
without the shared traces."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import one_line_error

from llmsched.analysis.grid import parse_grid
from llmsched.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _help(command: str) -> dict[str, str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {o: a.help for a in sub._actions for o in a.option_strings}


def test_the_sweep_grid_help_example_runs_as_written(tmp_path, capsys):
    """It read `policy=sarathi,orca,vllm  rate=1:20:20 ... load=0.5:1.2:8`: one --grid takes
    one key, and rate with load is refused."""
    example = _help("sweep")["--grid"]
    specs = re.findall(r"--grid (\S+)", example)
    assert len(specs) >= 2
    assert parse_grid(specs)  # each spec one key, no rate beside load
    # the example's keys, shrunk to one point each, run as a sweep
    small = [f"{s.split('=')[0]}={s.split('=')[1].split(',')[0].split(':')[0]}" for s in specs]
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "20", "--no-plots", "--quiet"]
    argv += [x for s in small for x in ("--grid", s)]
    assert main([*argv, "--out", str(tmp_path / "sweep")]) == 0


@pytest.mark.parametrize("key, text", [("load", "0.5:1.2"), ("rate", "1:20"), ("b_max", " 256 : 512 ")])
def test_a_range_without_its_number_of_points_says_so(key, text, tmp_path, capsys):
    out = tmp_path / "sweep"
    one_line_error(capsys, ["sweep", "--grid", f"{key}={text}", "--out", str(out)], "LO:HI:N", "number of points")
    assert not out.exists()


@pytest.mark.parametrize("key, text", [("load", "0.5:1:3:4"), ("rate", "1:20:3:4:5")])
def test_a_range_of_more_than_three_parts_says_so(key, text, tmp_path, capsys):
    """It said "values must be positive numbers" (load) or "rate must be a number"."""
    out = tmp_path / "sweep"
    one_line_error(capsys, ["sweep", "--grid", f"{key}={text}", "--out", str(out)], "LO:HI:N", "three parts")
    assert not out.exists()


def test_capacity_says_which_mean_was_given_and_which_sampled(capsys, tmp_path):
    def source(*argv):
        assert main(["capacity", "--json", "--cost-model", "paper", "--samples", "2000", *argv]) == 0
        return json.loads(capsys.readouterr().out)["means_source"]

    assert source("--mean-prompt", "200") == "prompt given, output sampled (2,000 draws)"
    assert source("--mean-output", "100") == "output given, prompt sampled (2,000 draws)"
    both = ["capacity", "--json", "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "100"]
    assert main(both) == 0
    assert json.loads(capsys.readouterr().out)["means_source"] == "given"
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n2,300,30\n")
    assert source("--trace", str(trace), "--mean-output", "100") == "output given, prompt from the trace"
    assert source("--trace", str(trace)) == "trace"
    # a law given with the trace replaces its lengths: named as such (it said "trace")
    law = source("--trace", str(trace), "--prompt", "const:5")
    assert law == "prompt from the prompt law, output from the trace"
    law = source("--trace", str(trace), "--mean-prompt", "9", "--output", "const:3")
    assert law == "prompt given, output from the output law"
    assert main(["capacity", "--cost-model", "paper", "--samples", "2000", "--mean-prompt", "200"]) == 0
    assert "(prompt given, output sampled (2,000 draws))" in capsys.readouterr().out


def test_capacity_plot_makes_its_missing_folders_as_every_out_does(tmp_path, capsys):
    png = tmp_path / "new" / "deeper" / "region.png"
    argv = ["capacity", "--json", "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101"]
    assert main([*argv, "--plot", str(png)]) == 0
    assert json.loads(capsys.readouterr().out)["plot"] == str(png)
    assert png.stat().st_size > 1000
    f = tmp_path / "afile"
    f.write_text("keep\n")
    one_line_error(capsys, [*argv, "--plot", str(f / "region.png")], "is a file, not a folder")
    assert f.read_text() == "keep\n"


def test_validate_json_makes_its_missing_folders(tmp_path, monkeypatch):
    from llmsched.analysis import validate as validation

    result = {"model": "m", "trace_requests": 3, "policies": {"orca": {}}}
    monkeypatch.setattr(validation, "validate", lambda *a, **k: result)
    monkeypatch.setattr("llmsched.cli.analysis.engine_setup", lambda args: {})
    monkeypatch.setattr("llmsched.cli.analysis.render_validation", lambda res: None)
    out = tmp_path / "new" / "deeper" / "v.json"
    argv = ["validate", "--model", str(tmp_path), "--trace", str(tmp_path / "t.csv"), "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text()) == result


def test_trace_help_names_gzip_parquet_and_what_prompt_and_output_do():
    h = _help("simulate")["--trace"]
    assert "gzip" in h and "Parquet" in h
    assert "--prompt or --output replaces the trace's prompt or output lengths" in h


def test_prompt_and_output_replace_a_traces_lengths(tmp_path, capsys):
    """What that help says, on a three-request trace."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n2,300,30\n")

    def tokens(*argv):
        run = ["simulate", "--trace", str(trace), "--cost-model", "paper", "--out", "", "--json", "--quiet"]
        assert main([*run, *argv]) == 0
        s = json.loads(capsys.readouterr().out)
        return s["total_input_tokens"], s["total_output_tokens"]

    assert tokens() == (600, 60)
    assert tokens("--prompt", "const:7") == (21, 60)
    assert tokens("--output", "const:5") == (600, 15)


def test_an_unknown_per_request_slo_lists_the_short_names_too(capsys):
    err = one_line_error(capsys, ["simulate", "--slo", "ttfb=100", "--out", ""], "ttft_ms")
    assert "without _ms: ttft, tpot, itl, e2el" in err
    assert (
        main(
            ["simulate", "--slo", "ttft=100000", "--cost-model", "paper", "--num-requests", "5", "--out", "", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["goodput_share"] == 1.0


def _bench_traces(traces: Path, *argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMSCHED_TRACES": str(traces), "PYTHONPATH": str(ROOT / "src")}
    script = ROOT / "benchmarks" / "bench_traces.py"
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=env, timeout=60)


def test_bench_traces_help_and_missing_traces_without_a_traceback(tmp_path):
    """It resolved the Azure trace at import: --help raised a ConfigError traceback."""
    missing = tmp_path / "no-traces"
    r = _bench_traces(missing, "--help")
    assert r.returncode == 0 and "--repeat" in r.stdout, r.stderr
    r = _bench_traces(missing, "--dir", str(tmp_path / "files"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "azure-conv" in r.stderr
    assert not (tmp_path / "files").exists()  # nothing generated before the check


def test_bench_traces_unknown_case_is_refused_before_any_file_is_written(tmp_path):
    r = _bench_traces(tmp_path / "no-traces", "--cases", "azure,nope", "--dir", str(tmp_path / "files"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "'nope'" in r.stderr and "turns-100k" in r.stderr
    assert not (tmp_path / "files").exists()


def test_bench_traces_case_names_are_the_cases_it_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_traces  # noqa: PLC0415
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cases = bench_traces._cases({"plain": tmp_path / "p", "mooncake": tmp_path / "m"}, tmp_path / "a", tmp_path / "b")
    assert tuple(cases) == bench_traces.CASES
