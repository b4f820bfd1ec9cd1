"""A length or trace file without a header line: its first row was taken for the column
name and lost (`replay:` of `4000,10,20` gave 10, 20, 10; `empirical:` never drew 4000).
A first line holding a number is refused in one line, whichever reader meets it."""

from __future__ import annotations

import pytest
from helpers import one_line_error

from llmsched import simulate
from llmsched.core.errors import ConfigError
from llmsched.workload import read_trace
from llmsched.workload.csvio import read_columns, read_header
from llmsched.workload.lengths import Empirical

NEEDS = "the file needs a header line naming its column, such as prompt_tokens"


@pytest.mark.parametrize("law", ["replay:{f}", "empirical:{f}", "empirical:{f}:4000"])
def test_a_length_file_without_header_is_refused(tmp_path, capsys, law):
    f = tmp_path / "nohdr.txt"
    f.write_text("4000\n10\n20\n")
    argv = ["simulate", "--prompt", law.format(f=f), "--output", "const:5", "--num-requests", "3"]
    one_line_error(capsys, [*argv, "--rate", "1", "--out", ""], f"first line '4000' is a number: {NEEDS}")


@pytest.mark.parametrize("first", ["4000", " 4000 ", "1e3", "-7", ".5", "12."])
def test_every_reader_refuses_a_numeric_first_line(tmp_path, first):
    f = tmp_path / "n.csv"
    f.write_text(f"\n{first}\n10\n")
    for read in (
        read_header,
        lambda p: read_columns(p, {first.strip(): "float"}),
        lambda p: Empirical(str(p)).values(),
    ):
        with pytest.raises(ConfigError, match="is a number: the file needs a header line"):
            read(f)


def test_a_trace_without_header_is_refused(tmp_path, capsys):
    """It was refused before too, but as 'not a trace in a known format'."""
    f = tmp_path / "t.csv"
    f.write_text("0.5,100,20\n1.0,200,30\n")
    with pytest.raises(ConfigError, match=r"holds a number \('0.5'\).*arrival_s,prompt_tokens,output_tokens"):
        read_trace(str(f))
    one_line_error(capsys, ["simulate", "--trace", str(f), "--out", ""], "first line '0.5,100,20' holds a number")


def test_a_two_column_length_file_without_header_is_refused(tmp_path):
    f = tmp_path / "pairs.csv"
    f.write_text("4000,300\n10,5\n")
    with pytest.raises(ConfigError, match="such as prompt_tokens,output_tokens"):
        Empirical(str(f), role="prompt").values()


@pytest.mark.parametrize("name", ["prompt_tokens", "p95", "1b_tokens", "x1e3", "nan", "inf"])
def test_a_header_that_is_a_name_still_reads(tmp_path, name):
    """Names, even with digits in them, are column names; only a number is data."""
    f = tmp_path / "ok.txt"
    f.write_text(f"{name}\n10\n20\n")
    assert list(Empirical(str(f), sequential=True).values()) == [10, 20]
    assert (
        simulate(prompt=f"replay:{f}", output="const:5", num_requests=3, cost_model="const:1").summary["completed"] == 3
    )
