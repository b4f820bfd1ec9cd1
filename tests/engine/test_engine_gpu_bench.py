"""benchmarks/gpu_engine.py runs end to end on the CPU with --small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_engine_small_runs_on_cpu(tmp_path):
    out = tmp_path / "g.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_engine.py"), "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["small"] and res["device"] == "cpu"
    assert {d["batch"] for d in res["decode"]} == {1, 2, 4, 8, 16}
    assert all(d["step_ms"] > 0 and d["roofline_ms"] > 0 for d in res["decode"])
    assert res["prefill"] and res["overhead"]["running"] == 16
    sv = res["sim_vs_real"]
    assert sv["requests"] == 10 and sv["ttft_p50_error"] is not None and sv["itl_p50_error"] is not None
    assert (tmp_path / "gpu_engine_profile.csv").is_file()
