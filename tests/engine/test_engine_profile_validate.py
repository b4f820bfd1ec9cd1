"""Profile round trip (profile -> cost model -> simulation) and the sim-vs-real check."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

SMALL_GRID = dict(tokens=[1, 8, 32, 64], batches=[1, 4], contexts=[16, 64], chunks=[16, 32],
                  chunk_contexts=[0, 32], lm_tokens=[1, 8])


def test_profile_round_trip(tiny_model, tmp_path):
    from llmsched.core import make_cost_model
    from llmsched.core.profile import validate_steps
    from llmsched.engine.profiler import profile
    from llmsched.policies import make_scheduler
    from llmsched.sim.result import SimResult
    from llmsched.sim.simulator import simulate_trace

    s = profile(tiny_model, tmp_path / "prof.csv", max_num_seqs=8, max_model_len=256, b_max=64,
                grid=SMALL_GRID, reps=1, warmup=0)
    assert s["layers"] == 2 and s["cost_model"].endswith(",overlap=0")
    model = make_cost_model(s["cost_model"])
    assert model.layers == 2
    assert model.step_time(32, 4, 4 * 50, [(32, 0)], 5) > model.step_time(0, 1, 10, [], 1) > 0
    assert len(validate_steps(model)) >= 3
    tr = SimpleNamespace(arrival_s=np.array([0.0, 0.01, 0.02]), prompt=np.array([20, 40, 9]),
                         output=np.array([5, 3, 8]), tag=None)
    stats = simulate_trace(tr, make_scheduler("sarathi", b_max=32), model)
    res = SimResult({}, stats, tr.arrival_s, tr.prompt, tr.output, None)
    assert res.summary["completed"] == 3 and res.summary["mean_ttft_ms"] > 0


def test_validate_reports_errors(tiny_model, tmp_path):
    from llmsched.engine.validate import METRICS, STATS, validate
    trace = tmp_path / "trace.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens"]
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(8):
        t += float(rng.exponential(0.01))
        rows.append(f"{t:.4f},{int(rng.integers(4, 40))},{int(rng.integers(2, 10))}")
    trace.write_text("\n".join(rows) + "\n")
    res = validate(tiny_model, trace, "sarathi,orca", b_max=32, max_num_seqs=8, reps=1)
    assert set(res["policies"]) == {"sarathi", "orca"}
    for pol in res["policies"].values():
        for m in METRICS:
            for st in STATS:
                e = pol["errors"][f"{m}_{st}"]
                assert e["real_ms"] > 0 and e["sim_ms"] > 0 and np.isfinite(e["rel_error"])


def test_validate_rejects_bad_input(tiny_model, tmp_path):
    from llmsched.core.errors import ConfigError
    from llmsched.engine.validate import validate
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    with pytest.raises(ConfigError, match="unknown batch policy"):
        validate(tiny_model, trace, "nosuch")
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,5\n")
    with pytest.raises(ConfigError, match="max length"):
        validate(tiny_model, trace, "sarathi", max_model_len=256, profile="const:1")
