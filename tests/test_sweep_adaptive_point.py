"""A sweep point runs exactly what `simulate` runs with the same options: plain
`adaptive` on a context-dependent cost model (the default profile) estimates the
workload means from the requests it sees in both (a sweep once filled them in from
sampled workload means, so its point differed from the standalone run)."""

from __future__ import annotations

import csv
import json

from llmsched import SimConfig, simulate
from llmsched.analysis.sweep import run_sweep
from llmsched.core.cost import make_cost_model


def test_sweep_adaptive_point_equals_simulate_on_the_default_profile(tmp_path):
    assert not make_cost_model(SimConfig().cost_model).load_only  # context-dependent
    opts = {"num_requests": 300, "rate": 20.0}
    res = run_sweep(None, {"policy": ["adaptive"]}, out_dir=tmp_path, workers=1, progress=False, plots=False, **opts)
    assert (res.ran, res.errors) == (1, 0)
    (point,) = [json.loads(p.read_text()) for p in (tmp_path / "points").glob("*.json")]
    assert point["config"]["policy"] == "adaptive"
    alone = simulate(policy="adaptive", **opts).summary
    swept = point["summary"]
    assert set(swept) == set(alone)
    differ = sorted(k for k in alone if k != "wall_s" and swept[k] != alone[k])
    assert differ == []
    # the table shows what ran
    with open(tmp_path / "results.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["policy"], row["policy_name"], row["policy_options"]) == ("adaptive", "adaptive", "{}")
