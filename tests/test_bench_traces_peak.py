"""benchmarks/bench_traces.py: a case's peak memory is its own process's, whatever the parent
held when it started it, and a run writes only the generated files its cases read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_traces.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmHWM is Linux's")
def test_a_case_peak_is_not_the_parent_peak():
    """ru_maxrss carries the parent's RSS at fork across exec: a parent holding 400 MB made
    every case report at least 0.4 GB."""
    stmt = "make_trace(WorkloadSpec(arrival='poisson', rate=1, num_requests=10, prompt='const:10', output='const:10'))"
    parent = (
        "import subprocess, sys\n"
        "held = bytearray(400_000_000)\n"
        "held[::4096] = b'x' * len(held[::4096])\n"  # touched: resident
        f"r = subprocess.run([sys.executable, {str(SCRIPT)!r}, '--child', {stmt!r}], capture_output=True, text=True)\n"
        "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); sys.exit(r.returncode)\n"
    )
    r = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["requests"] == 10
    assert 0.005 < out["peak_gb"] < 0.3, out  # a Python with numpy: tens of MB


def test_only_the_files_the_cases_read_are_generated(tmp_path):
    traces = tmp_path / "traces"
    (traces / "azure_conv_2023").mkdir(parents=True)
    (traces / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    )
    (traces / "mooncake_synthetic").mkdir()
    (traces / "mooncake_synthetic" / "synthetic_trace.jsonl").write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n'
        '{"timestamp": 40, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]}\n'
    )
    files = tmp_path / "files"
    env = {**ENV, "LLMSCHED_TRACES": str(traces)}
    argv = [sys.executable, str(SCRIPT), "--repeat", "1", "--dir", str(files)]
    r = subprocess.run([*argv, "--cases", "mooncake-sample-512"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "mooncake-sample-512" in r.stdout
    assert not files.exists()  # the 1M-row files (460 MB with the real sample) not written


def test_make_files_writes_what_the_cases_read(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_traces  # noqa: PLC0415
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(bench_traces, "N", 50)
    sample = tmp_path / "sample.jsonl"
    sample.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n')
    files = bench_traces._make_files(tmp_path / "f", sample, ["azure", "mooncake-sample"])
    assert set(files) == {"plain", "mooncake"} and not (tmp_path / "f").exists()
    bench_traces._make_files(tmp_path / "f", sample, ["plain-1m"])
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["plain_1m.csv"]
    bench_traces._make_files(tmp_path / "f", sample, ["mooncake-1m-512", "plain-1m"])
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["mooncake_1m.jsonl", "plain_1m.csv"]
    assert len((tmp_path / "f" / "mooncake_1m.jsonl").read_text().splitlines()) == 50
