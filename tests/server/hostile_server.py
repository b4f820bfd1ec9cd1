"""A server for test_hostile.py, run as its own process (so its RSS can be measured):

    python tests/server/hostile_server.py --port P [--model DIR] [--step-ms 40] [limits]

Without --model: the virtual GPU with --step-ms steps (const:STEP_MS). With --model: the
PyTorch engine on that (tiny) model, each step padded to --step-ms with a sleep, as a GPU's
step would take that long while the host waits (the test measures the server's stalls, not
the tiny model's speed)."""

from __future__ import annotations

import argparse
import time

from llmsched.server.app import ServerConfig
from llmsched.server.backends import SchedulerOptions, make_engine_backend, make_sim_backend
from llmsched.server.serving import serve


class PaddedCore:
    """An engine core whose steps take at least `pad_s` seconds."""

    def __init__(self, inner, pad_s: float):
        self.inner = inner
        self.pad_s = pad_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self):
        t0 = time.perf_counter()
        out = self.inner.step()
        left = self.pad_s - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--step-ms", type=float, default=40.0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--read-timeout", type=float, default=30.0)
    p.add_argument("--max-body-bytes", type=int, default=ServerConfig.max_body_bytes)
    a = p.parse_args()
    if a.model:
        import torch

        torch.set_num_threads(1)
        backend = make_engine_backend(
            a.model,
            SchedulerOptions(b_max=512, max_running=64),
            max_model_len=a.max_model_len,
            num_blocks=2048,
            block_size=16,
            seed=0,
        )
        backend.core = PaddedCore(backend.core, a.step_ms / 1e3)
    else:
        backend = make_sim_backend(SchedulerOptions(b_max=2048), f"const:{a.step_ms:g}", max_model_len=a.max_model_len)
    serve(backend, ServerConfig(port=a.port, read_timeout=a.read_timeout, max_body_bytes=a.max_body_bytes))


if __name__ == "__main__":
    main()
