"""Messages fit what was given: a trace replay refused for its rate names --rate, not a
--time-scale never given; a gamma cv whose realised rate spreads past 100% is said to give
no rate at all, not a "+-1414%", and advice past the request limit asks for a lower cv."""

from __future__ import annotations

from helpers import one_line_error

from llmsched.cli import main
from llmsched.workload.arrivals import MAX_REQUESTS, loose_rate

TRACE = "arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n1.0,10,5\n2.0,10,5\n"


def test_a_tiny_rate_names_rate_not_time_scale(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text(TRACE)
    err = one_line_error(capsys, ["simulate", "--trace", str(f), "--rate", "1e-9", "--out", ""], "--rate 1e-09")
    assert "--time-scale" not in err
    err = one_line_error(capsys, ["simulate", "--trace", str(f), "--time-scale", "1e-12", "--out", ""], "clock")
    assert "--time-scale K divides them" in err


def test_a_spread_past_100_percent_says_the_rate_means_nothing(capsys):
    text = loose_rate(1000, 5_000)
    assert "means nothing (cv / sqrt(n) = 14.1, over 100%)" in text
    assert "+-1414%" not in text
    assert f"use a lower cv (+-10% would need 100,000,000 requests, over the limit of {MAX_REQUESTS:,})" in text
    assert "varies by about +-42%" in loose_rate(30, 5_000)  # under 100%: the spread, as before
    run = ["--arrival", "gamma", "--rate", "5", "--cv", "1000", "--num-requests", "100"]
    assert main(["simulate", *run, "--prompt", "const:5", "--output", "const:2", "--out", ""]) == 0
    assert "the realised rate of 100 requests means nothing" in capsys.readouterr().err
