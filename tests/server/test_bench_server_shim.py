"""benchmarks/bench_server.py --vllm: the sitecustomize shim it gives `vllm bench serve`
hides the media packages whose wheels cannot load with CPU torch, and vLLM's C kernels."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_vllm_shim_hides_what_cannot_load(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_server", ROOT / "benchmarks" / "bench_server.py")
    bench_server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_server)
    (tmp_path / "sitecustomize.py").write_text(bench_server.SHIM)
    hidden = ("torchvision", "torchaudio", "torchcodec", "vllm._C")
    # hidden: None in sys.modules, so that importing it fails whether it is installed or not
    probe = f"import sys; print([sys.modules.get(name, 'absent') for name in {hidden!r}])"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == repr([None] * len(hidden)), p.stdout
