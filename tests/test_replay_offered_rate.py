"""Replaying a run's requests.csv (`--trace`) reproduces the run: its summary equals the
run's except wall_s. The offered rate (and offered_token_rate, utilisation,
policy_utilisation, the predicted growth) come from the arrivals in whole ns, as the
clock took them and as requests.csv writes them, not from the unrounded float arrivals
(they differed at the 12th digit)."""

from __future__ import annotations

import json

import pytest

from llmsched.cli import main


@pytest.mark.parametrize("extra", [[], ["--cost-model", "paper", "--k-max", "8"]])
def test_replaying_requests_csv_gives_the_same_summary(tmp_path, capsys, extra):
    a, b = tmp_path / "A", tmp_path / "B"
    common = ["simulate", "--quiet", *extra]
    assert main([*common, "--num-requests", "300", "--rate", "20", "--out", str(a)]) == 0
    assert main([*common, "--trace", str(a / "requests.csv"), "--out", str(b)]) == 0
    capsys.readouterr()
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa["offered_rate"] is not None
    differ = sorted(k for k in set(sa) | set(sb) if k != "wall_s" and sa.get(k) != sb.get(k))
    assert differ == []
