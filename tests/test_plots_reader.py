"""`llmsched plot` reads only the columns it draws, streamed: a million-request
requests.csv was held whole as lists of strings (889 MB peak for an 87 MB file)."""

import csv
import math
import tracemalloc

import numpy as np
import pytest

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.plots import _read_csv

HEAD = "id,tag,arrival_s,prompt_tokens,output_tokens,queue_s,ttft_s,tpot_s,e2e_s,preemptions,arrived,finished"


def _requests_csv(path, n):
    """A requests.csv as `simulate --out` writes it: every fifth request unfinished (empty
    latency fields), the last tenth not arrived."""
    lines = [HEAD]
    for i in range(n):
        t = i * 0.01
        if i % 5:
            lat = f"{0.001 * (i % 7):.9f},{0.002 + i * 1e-6:.9f},{0.001:.9f},{0.5 + i * 1e-5:.9f}"
        else:
            lat = ",,,"
        lines.append(f"{i},,{t:.9f},{100 + i % 900},{50 + i % 400},{lat},0,{int(i < 0.9 * n)},{int(bool(i % 5))}")
    path.write_text("\r\n".join(lines) + "\r\n")


def test_columns_read_are_the_numbers_in_the_file(tmp_path):
    p = tmp_path / "requests.csv"
    _requests_csv(p, 500)
    got = _read_csv(p, ("arrival_s", "ttft_s", "e2e_s"), ("arrived", "finished", "not_there"))
    assert list(got) == ["arrival_s", "ttft_s", "e2e_s", "arrived", "finished"]  # only those asked for
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    for name, col in got.items():
        want = [float(r[name]) if r[name] != "" else math.nan for r in rows]
        assert col.dtype == np.float64 and col.flags.writeable
        assert np.array_equal(col, want, equal_nan=True), name
    assert np.isnan(got["ttft_s"]).sum() == 100


def test_a_big_requests_csv_is_not_held_whole_in_memory(tmp_path):
    """20,000 rows (1.5 MB): the rows as lists of strings peaked at 15 MB; the five
    columns plotted are 0.8 MB of numbers (1.1 MB peak)."""
    p = tmp_path / "requests.csv"
    _requests_csv(p, 20_000)
    tracemalloc.start()
    try:
        cols = _read_csv(p, ("arrival_s", "ttft_s", "e2e_s"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cols["arrival_s"]) == 20_000
    assert peak < 4e6, f"peak {peak / 1e6:.1f} MB"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("arrival_s,e2e_s\n1,2\n", "has no column ttft_s"),
        ("arrival_s,ttft_s,e2e_s\n1,2,3\n4,5\n", "line 3 has 2 fields, the header 3"),
        ("arrival_s,ttft_s,e2e_s\n1,2,3\n4,5,6,7\n", "line 3 has 4 fields, the header 3"),
        ("arrival_s,ttft_s,e2e_s\n1,2,3\n\n", "line 3 has 0 fields"),
        ("arrival_s,ttft_s,e2e_s\n1,2,3\n4,fast,6\n", "line 3 column ttft_s holds 'fast', not a number"),
        # an optional column plotted from is checked as well (`finished` read as text matched nothing)
        ("arrival_s,ttft_s,e2e_s,finished\n1,2,3,yes\n", "line 2 column finished holds 'yes', not a number"),
        (b"arrival_s,ttft_s,e2e_s\n1,2,\xff\n", "cannot be read"),
    ],
)
def test_a_damaged_file_is_one_config_error(tmp_path, text, message):
    p = tmp_path / "requests.csv"
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    with pytest.raises(ConfigError, match=message):
        _read_csv(p, ("arrival_s", "ttft_s", "e2e_s"), ("arrived", "finished"))


def test_plot_refuses_a_requests_csv_whose_finished_column_is_not_numbers(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["simulate", "--num-requests", "50", "--cost-model", "paper", "--rate", "5", "--quiet", "--out", str(run)]
    assert main(argv) == 0
    lines = (run / "requests.csv").read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",yes"
    (run / "requests.csv").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "requests.csv line 2 column finished" in err
    assert not list(run.glob("*.png"))
