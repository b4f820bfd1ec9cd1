"""Workload inputs a bug hunt found read wrongly or answered with a traceback: a too-wide
CSV row hidden by a short one, trace times past the clock in serverless replay, seeds of
2**64 and more with block ids, time_scale on synthetic arrivals, a slow model among
per-model rates, delay laws in config.json, `empirical:` on a JSON Lines file, and numpy's
warnings on time-zone offsets and on a time_scale that overflows."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest
import yaml
from helpers import one_line_error

from llmsched import simulate
from llmsched.cli import main
from llmsched.core.checks import check_seeds
from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec, make_trace, read_trace
from llmsched.workload.serverless import load_serverless, make_serverless_requests

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


# ------------------------------------------------------------------ too-wide CSV rows
@pytest.mark.parametrize(
    "text, message",
    [
        # one extra comma, one line short by one: the file's comma count is the header's times
        # its lines (read as prompt 1, output 500)
        (HEADER + "0,1,500,60\n,\n2,3,4\n", "line 2 has 4 fields but the header names 3"),
        (HEADER + "0,1,500,60\r\n,\r\n2,3,4\r\n", "line 2 has 4 fields"),
        (HEADER.replace("\n", "\r") + "0,1,500,60\r,\r2,3,4\r", "line 2 has 4 fields"),
        ("\n\n" + HEADER + "0,1,500,60\n,\n2,3,4\n", "line 4 has 4 fields"),
        ("arrival_s,prompt_tokens,output_tokens,note\n0,1,500,60,x\n1,20,5\n", "line 2 has 5 fields"),
        # a wide row before a short one that numpy stops at: the first bad line is named
        (HEADER + "0,10,5\n1,1,500,60\n2,10,5\n3,7\n", "line 3 has 4 fields but the header names 3"),
    ],
)
def test_a_wide_row_is_refused_whatever_the_other_rows_hold(tmp_path, capsys, text, message):
    f = tmp_path / "t.csv"
    f.write_bytes(text.encode())
    one_line_error(capsys, ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""], message)


def test_a_wide_row_of_an_empirical_length_file_is_refused(tmp_path, capsys):
    """`empirical:ewidth.csv:x` read [1, 7], the 500 of `1,500,a` dropped."""
    f = tmp_path / "ewidth.csv"
    f.write_text("x,note\n1,500,a\n7\n")
    argv = ["simulate", "--prompt", f"empirical:{f}:x", "--num-requests", "5", "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, "line 2 has 3 fields but the header names 2")


def test_short_blank_and_trailing_empty_fields_still_read(tmp_path):
    """What the fast path sends to the slower count: no row wider than its header."""
    f = tmp_path / "t.csv"
    f.write_text(HEADER + "0,10,5\n\n1,20,6,,\n   \n,,,,,\n2,30,7")
    t = read_trace(f)
    assert t.arrival_s.tolist() == [0, 1, 2] and t.prompt.tolist() == [10, 20, 30] and t.output.tolist() == [5, 6, 7]


# ---------------------------------------------------- serverless trace times vs the clock
def _serverless_yaml(tmp_path, workload: dict):
    with open(os.path.join(EXAMPLES, "serverless", "small.yaml")) as fh:
        cfg = yaml.safe_load(fh)
    cfg["workload"] = workload
    path = tmp_path / "sl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("last", ["2e9", "1e20"])
def test_serverless_trace_times_past_the_clock_are_refused(tmp_path, capsys, last):
    """2e9 s was replayed (one server's replay refuses it); 1e20 s was an OverflowError."""
    trace = tmp_path / "far.csv"
    trace.write_text(HEADER + f"0,10,10\n{last},10,5\n")
    path = _serverless_yaml(tmp_path, {"trace": str(trace)})
    one_line_error(
        capsys,
        ["simulate", "--serverless", str(path), "--out", ""],
        "workload.trace: its arrival times reach",
        "past the simulator's clock of 1e+09 s",
    )


def test_serverless_trace_times_divided_by_time_scale_fit_the_clock(tmp_path):
    trace = tmp_path / "far.csv"
    trace.write_text(HEADER + "0,10,10\n2e9,10,5\n")
    spec = load_serverless(_serverless_yaml(tmp_path, {"trace": str(trace), "time_scale": 10}))
    assert make_serverless_requests(spec).arrival_s.tolist() == [0.0, 2e8]


# ------------------------------------------------------------------------ huge seeds
def test_a_seed_of_2_to_the_64_or_more_builds_block_ids(capsys):
    """np.uint64(seed) raised OverflowError: `--seed` is kept exactly however large."""
    from llmsched.workload.blocks import seed_bits  # noqa: PLC0415

    argv = ["simulate", "--cost-model", "paper", "--num-requests", "50", "--seed", str(2**64)]
    argv += ["--turns", "geometric:3", "--think-time", "5", "--prefix-caching", "--out", ""]
    assert main(argv) == 0, capsys.readouterr().err
    spec = {"prompt": "const:64", "output": "const:2", "system_prompt": 32, "num_requests": 20, "rate": 1}

    def ids(seed):
        return make_trace(WorkloadSpec.from_dict({**spec, "seed": seed})).block_ids

    # a large seed is folded into 64 bits by a hash: not onto 0 (masking) nor any small seed
    wide = [2**64, 2**65, 2**64 + 1, 2**128, 3 * 2**64]
    assert len({seed_bits(s) for s in wide}) == len(wide)
    assert all(seed_bits(s) >= 2**32 for s in wide)
    assert not np.array_equal(ids(2**64), ids(0)) and not np.array_equal(ids(2**64), ids(1))
    # seeds below 2**64 keep their ids (as the golden tests hold them)
    assert [seed_bits(s) for s in (0, 1, 12345, 2**63, 2**64 - 1)] == [0, 1, 12345, 2**63, 2**64 - 1]


# ---------------------------------------------------------- time_scale, synthetic arrivals
def test_time_scale_divides_synthetic_arrivals_before_the_clock_check():
    """Refused: 5,000 arrivals at 1e-6/s end near 5e9 s unscaled, but 5,000 s scaled."""
    r = simulate(cost_model="const:1", rate=1e-6, time_scale=1e6, num_requests=5000)
    assert r.summary["completed"] == 5000


def test_a_time_scale_below_one_is_checked_on_the_scaled_clock(capsys):
    argv = ["simulate", "--cost-model", "const:1", "--rate", "1", "--time-scale", "1e-6", "--num-requests", "5000"]
    one_line_error(capsys, [*argv, "--out", ""], "and time_scale 1e-06 arrival 5,000 comes at", "below 1e+09 s")


# -------------------------------------------------------- serverless per-model rates
def _per_model(tmp_path, rates: dict, n: int):
    wl = {"models": {m: {"rate": r} for m, r in rates.items()}, "num_requests": n}
    return load_serverless(_serverless_yaml(tmp_path, wl))


def test_a_slow_model_among_per_model_rates_does_not_refuse_the_merged_workload(tmp_path):
    """Each model drew num_requests and was checked alone: the slow one's 20,000th arrival
    at 2e9 s refused a workload whose 20,000 merged requests arrive within 2,100 s."""
    r = make_serverless_requests(_per_model(tmp_path, {"llama-3-8b": 10, "llama-3.2-1b": 1e-5}, 20000))
    assert len(r) == 20000 and r.arrival_s[-1] < 2100
    assert np.all(np.diff(r.arrival_s) >= 0)


def test_per_model_rates_too_slow_for_the_clock_name_the_models(tmp_path, capsys):
    path = _serverless_yaml(tmp_path, {"models": {"llama-3-8b": {"rate": 1e-7}}, "num_requests": 2000})
    one_line_error(
        capsys,
        ["simulate", "--serverless", str(path), "--out", ""],
        "workload.models.llama-3-8b: arrival times must be below 1e+09 s",
        "not the 2,000 asked for",
    )


# ------------------------------------------------------- network delays in config.json
def test_a_network_rerun_from_its_config_json_is_the_same_run(tmp_path):
    """Delay laws were written with :g (exponential:1.23457 for 1.23456789)."""
    net = {
        "servers": {"agent": {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "kv_capacity": 200000}},
        "jobs": {
            "coder": {
                "arrival": {"process": "poisson", "rate": 0.5},
                "route": [
                    {"call": {"server": "agent", "prompt": "geometric:300", "output": "geometric:150"}},
                    {"delay": "exponential:1.23456789"},
                    {"delay": "uniform:0.123456789,2.987654321"},
                    {"call": {"server": "agent", "prompt": "geometric:200", "output": "geometric:100"}},
                ],
            }
        },
        "num_jobs": 100,
        "seed": 0,
    }
    spec = tmp_path / "net.yaml"
    spec.write_text(yaml.safe_dump(net))
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["simulate", "--network", str(spec), "--out", str(first), "--quiet"]) == 0
    assert main(["simulate", "--network", str(first / "config.json"), "--out", str(second), "--quiet"]) == 0
    for name in ("jobs.csv", "calls.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


# --------------------------------------------------------- empirical: on JSON Lines
def test_empirical_lengths_from_a_json_lines_file_say_what_it_is(tmp_path, capsys):
    """The error dumped the first JSON line as a CSV header, and offered a 'column' of it."""
    f = tmp_path / "mc.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 100, "output_length": 6, "hash_ids": [0, 1]}\n')
    for law in (f"empirical:{f}", f"replay:{f}", f"empirical:{f}:input_length"):
        line = one_line_error(
            capsys,
            ["simulate", "--prompt", law, "--num-requests", "5", "--cost-model", "const:1", "--out", ""],
            "is not a CSV file: its first line is JSON",
            "--trace",
        )
        assert "hash_ids" not in line


# ----------------------------------------------------------------- numpy's warnings
def test_a_parquet_trace_with_utc_offsets_reads_without_a_warning(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "TIMESTAMP": ["2023-01-01 00:00:00+00:00", "2023-01-01 00:00:02+00:00"],
            "ContextTokens": [10, 20],
            "GeneratedTokens": [1, 2],
        }
    )
    f = tmp_path / "az.parquet"
    pq.write_table(table, f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = read_trace(f)
    assert t.arrival_s.tolist() == [0.0, 2.0]


@pytest.mark.parametrize("option", [["--time-scale", "1e-320"], ["--rate", "1e-320"]])
def test_a_time_scale_that_overflows_the_times_is_refused_in_one_line(tmp_path, capsys, option):
    """A RuntimeWarning, then an inf that skipped the clock check."""
    f = tmp_path / "t.csv"
    f.write_text(HEADER + "0,10,5\n1,20,6\n2,30,7\n")
    argv = ["simulate", "--trace", str(f), *option, "--cost-model", "const:1", "--out", ""]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_line_error(capsys, argv, "overflow to infinity, past the simulator's clock of 1e+09 s")


def test_a_float_seed_past_2_to_the_53_is_refused_in_a_config(tmp_path, capsys):
    """`seed: 1e308` (a float in YAML) ran as a 309-digit seed no one wrote, where `--seed
    1e308` is refused; a whole float below 2**53 is the number written and still runs."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {num_requests: 10, seed: 1.0e+308}\n")
    one_line_error(capsys, ["simulate", "--config", str(bad), "--out", ""], "seed", "2**53", "write its digits")
    ok = tmp_path / "ok.yaml"
    ok.write_text("workload: {num_requests: 10, seed: 3.0}\n")
    assert main(["simulate", "--config", str(ok), "--out", "", "--json"]) == 0
    with pytest.raises(ConfigError, match="below 2"):
        check_seeds([1e300])


# -------------------------------------------------------- timestamps a ns clock cannot hold
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    "first, second, line",
    [
        # numpy wrapped these around by 2**64 ns (584 years) silently: a year 1439 typo read
        # as a time of 2023, 1500 as 2085, a second past 2262-04-11 23:47:16 as 1677
        ("1439-06-01 18:15:46.6805900", "2023-11-16 18:15:50.9951690", 2),
        ("2023-11-16 18:15:46.6805900", "1500-11-16 18:15:50.9951690", 3),
        ("2262-04-11 23:47:16", "2262-04-11 23:47:17", 3),
        ("2023-11-16 18:15:46", "+12023-11-16 18:15:46", 3),
        ("1677-09-21T00:12:43+00:00", "1677-09-21 00:13:00", 2),
    ],
)
def test_a_timestamp_outside_what_nanoseconds_hold_is_refused(tmp_path, capsys, first, second, line):
    f = tmp_path / "az.csv"
    f.write_text(f"{AZURE}{first},374,44\n{second},396,109\n")
    argv = ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, f"line {line} column 'TIMESTAMP'", "is outside 1677-09-21 to 2262-04-11")


def test_a_number_of_seconds_in_a_timestamp_column_is_named_as_one(tmp_path, capsys):
    f = tmp_path / "az.csv"
    f.write_text(f"{AZURE}1700000000,374,44\n1700000002,396,109\n")
    argv = ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, "line 2", "numpy reads a bare number as a year", "'arrival_s'")


def test_timestamps_at_the_edges_of_the_nanosecond_clock_still_read(tmp_path):
    f = tmp_path / "az.csv"
    f.write_text(f"{AZURE}1677-09-21 00:12:44,10,1\n1677-09-21 00:12:46.5,20,2\n")
    assert read_trace(f).arrival_s.tolist() == [0.0, 2.5]
    f.write_text(f"{AZURE}2262-04-11 23:47:14+00:00,10,1\n2262-04-11 23:47:16.25+00:00,20,2\n")
    assert read_trace(f).arrival_s.tolist() == [0.0, 2.25]


@pytest.mark.parametrize(
    "rows, line, has",
    [
        # read as 10:00 UTC beside 10:00:01+02:00 (08:00:01 UTC): 2 h apart, not 1 s
        (["2023-11-16 10:00:00+02:00", "", "2023-11-16 10:00:01+02:00", "2023-11-16 10:00:02"], 5, "has no"),
        (["2023-11-16T10:00:00", "2023-11-16T10:00:01Z"], 3, "has a"),
        (["2023-11-16 10:00:00", "2023-11-16 10:00:01-0130"], 3, "has a"),
    ],
)
def test_timestamps_with_and_without_a_utc_offset_are_refused(tmp_path, capsys, rows, line, has):
    """A time without an offset was taken as UTC beside offset ones, silently: arrivals
    shifted by the offset."""
    f = tmp_path / "az.csv"
    f.write_text(AZURE + "".join(f"{r},10,1\n" if r else "\n" for r in rows))
    argv = ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, f"az.csv line {line} column 'TIMESTAMP'", f"{has} UTC offset, unlike line 2's")


def test_timestamps_with_one_utc_offset_each_or_none_still_read(tmp_path):
    f = tmp_path / "az.csv"
    f.write_text(f"{AZURE}2023-11-16 10:00:00+02:00,10,1\n2023-11-16 09:00:01+01:00,20,2\n2023-11-16 08:00:02Z,5,1\n")
    assert read_trace(f).arrival_s.tolist() == [0.0, 1.0, 2.0]
    f.write_text(f"{AZURE}2023-11-16 10:00:00,10,1\n2023-11-16 10:00:01.5,20,2\n")
    assert read_trace(f).arrival_s.tolist() == [0.0, 1.5]


def test_a_parquet_timestamp_column_outside_the_nanosecond_clock_is_refused(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    stamps = np.array(["2023-01-01T00:00:00", "1500-01-01T00:00:00"], dtype="datetime64[us]")
    table = pa.table({"TIMESTAMP": pa.array(stamps), "ContextTokens": [10, 20], "GeneratedTokens": [1, 2]})
    f = tmp_path / "az.parquet"
    pq.write_table(table, f)
    argv = ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, "row 2 column 'TIMESTAMP'", "is outside 1677-09-21 to 2262-04-11")


def test_a_pipe_given_as_a_trace_is_named_as_one(tmp_path, capsys):
    """`--trace <(...)` said only "/dev/fd/63 is not a file" (a trace is read more than
    once: a pipe cannot be)."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    argv = ["simulate", "--trace", str(fifo), "--cost-model", "const:1", "--out", ""]
    one_line_error(capsys, argv, "is not a file (a pipe: write it to a file first)")


def test_a_missing_empirical_file_with_a_column_is_named_without_it(capsys):
    """`--prompt empirical:nosuch.csv:num_prefill_tokens` said "file
    nosuch.csv:num_prefill_tokens does not exist": the column is no part of the file."""
    from helpers import one_line_error

    line = one_line_error(
        capsys, ["simulate", "--prompt", "empirical:nosuch.csv:num_prefill_tokens", "--out", ""], "does not exist"
    )
    assert "file nosuch.csv does not exist" in line


def test_trace_head_and_until_refuse_what_is_no_count_or_time():
    """`Trace.head(2.5)` ran 2 requests, `head(-1)` none (not all but the last, as a slice
    would) and `head("5")` read the string; `until("1")` compared a string with the times."""
    spec = WorkloadSpec(rate=5, num_requests=20, prompt="const:10", output="const:5")
    trace = make_trace(spec)
    assert len(trace.head(5)) == len(trace.head(np.int64(5))) == len(trace.head(5.0)) == 5
    assert len(trace.head(0)) == 0 and len(trace.until(-1)) == 0
    for bad in (2.5, -1, "5", True, None):
        with pytest.raises(ConfigError, match=r"^Trace.head: n must be a whole number >= 0, got "):
            trace.head(bad)
    assert len(trace.until(np.float32(1.0))) == len(trace.until(1)) > 0
    for bad in ("1", None, float("nan")):
        with pytest.raises(ConfigError, match=r"^Trace.until: duration_s must be a number of seconds, got "):
            trace.until(bad)


@pytest.mark.parametrize("given", ["", "  ", ["a.csv"], 123, b"t.csv"])
def test_a_workload_trace_that_is_no_path_is_refused_naming_the_key(capsys, tmp_path, given):
    """`trace: ""` said "a trace file is given but arrival is 'poisson'" and `trace: [a.csv]`
    "file ['a.csv'] does not exist": a list or a number was looked for as a file."""
    said = f"trace must be a trace file's path or a dataset's name, got {given!r}"
    with pytest.raises(ConfigError, match=r"^" + re.escape(said) + "$"):
        WorkloadSpec(trace=given)
    if not isinstance(given, bytes):  # (YAML has no bytes)
        f = tmp_path / "c.yaml"
        f.write_text(yaml.safe_dump({"cost_model": "paper", "workload": {"trace": given}}))
        one_line_error(capsys, ["simulate", "--config", str(f), "--out", ""], said)
    t = tmp_path / "t.csv"
    t.write_text(HEADER + "0,5,3\n")
    assert WorkloadSpec(trace=t).trace == str(t)  # (a path object is a path)
