"""Speed of a user's run with prefix caching on against off, on the same workload.

Workload: Poisson arrivals; each prompt is one of `--families` shared system prompts
(`--system` tokens) followed by a lognormal user part (mean `--user` tokens, sigma 1,
at most 8192); geometric outputs (mean 128, at most 2048). The trace carries block ids
as a user's `Trace` does (`block_ids` / `block_ptr`, int64, at `--block-size` tokens): a
family's system blocks are shared, the rest are the request's own. Sarathi-Serve, b_max
512, the H200 Llama-3-8B profile, a KV capacity of `--kv-capacity` tokens, at `--load` x
theorem 2's lambda* without caching. `--families 0`: no prompt shares a block (caching on
finds nothing to reuse and takes the very same steps as off: its pure bookkeeping cost).

What is timed is what a user runs: `llmsched.simulate(trace=..., out_dir=DIR)` (as
`llmsched simulate --out DIR` calls it), with `prefix_caching=True, block_size=B` for
caching on and neither for off: the simulation, the stability verdict, the summary and
writing the output files (into a fresh temporary folder, removed after each run). Each
mode runs once untimed (one-time costs: lazy imports, caches), then `--repeat` times in
this process, alternating; the best wall time counts, and the best CPU time (user +
system of this process: less sensitive to other jobs on a shared machine).
Separately labelled (`loop_*`): the wall time of the simulation's batch
loop alone (`SimResult.wall_s`), the best of the same runs, which leaves out the verdict,
the summary and the files.

With sharing, caching on also simulates a different, lighter run (less prefill, so more
and smaller steps), so the loop's wall time per simulated step is reported too.

    python benchmarks/bench_prefix.py                       # 20k requests, 16-token blocks
    python benchmarks/bench_prefix.py --block-size 512 --requests 50000

Prints one JSON line: wall and CPU seconds of the whole run off and on, their ratios (the
goal: at most 1.5), the batch loop's, steps, and the hit rate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from _cli import config_errors, positive_float, positive_int

import llmsched
from llmsched.core import make_cost_model
from llmsched.theory import LengthMix, capacity
from llmsched.workload import Trace

PROFILE = "profile:h200-llama-3-8b"


def workload(n: int, families: int, system: int, user: float, block: int, load: float, cost, seed: int = 0) -> Trace:
    """The trace, with its block ids as a user's `Trace` carries them (int64 ragged arrays)."""
    rng = np.random.default_rng(seed)
    fam = rng.integers(0, max(families, 1), n)
    mu = np.log(user) - 0.5
    own = np.minimum(np.round(rng.lognormal(mu, 1.0, n)), 8192).astype(np.int64) + 1
    prompt = system + own
    output = np.minimum(rng.geometric(1 / 128, n), 2048)
    lam = capacity(cost, 512, float(prompt.mean()), float(output.mean()), mix=LengthMix(prompt, output)).critical_rate
    arrival = np.cumsum(rng.exponential(1 / (load * lam), n))
    k = prompt // block  # full blocks per prompt
    shared = np.minimum(k, system // block) if families else np.zeros(n, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(k, out=ptr[1:])
    req = np.repeat(np.arange(n, dtype=np.int64), k)
    pos = np.arange(ptr[-1], dtype=np.int64) - ptr[:-1][req]  # a block's position in its prompt
    # ids: (family, position) for the shared system prompt, (request, position) after it;
    # distinct pairs give distinct ids, equal leading ids mean equal prefixes. The position
    # takes the low bits, as many as the longest prompt's blocks need (20 for all but
    # prompts of over 2**20 blocks, whose positions spilled into the owner's bits: two
    # requests of a family shared blocks of their own text)
    owner = np.where(pos < shared[req], fam[req], max(families, 1) + req)
    ids = (owner << max(20, int(k.max(initial=0)).bit_length())) | pos
    return Trace(arrival, prompt, output, block_ids=ids, block_ptr=ptr, block_size=block)


def run(tr: Trace, on: bool, block: int, kv: int) -> tuple[float, float, object]:
    """(wall s, CPU s of this process, SimResult) of one user's run, files included."""
    caching = {"prefix_caching": True, "block_size": block} if on else {}
    with tempfile.TemporaryDirectory(prefix="bench_prefix_") as tmp:
        out = Path(tmp) / "run"
        t = time.perf_counter()
        c = time.process_time()
        result = llmsched.simulate(
            trace=tr, out_dir=out, policy="sarathi", b_max=512, kv_capacity=kv, cost_model=PROFILE, **caching
        )
        return time.perf_counter() - t, time.process_time() - c, result


def main() -> None:
    with config_errors("bench_prefix"):
        _main()


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=positive_int, default=20000)
    ap.add_argument("--block-size", type=positive_int, default=16)
    ap.add_argument("--families", type=int, default=16)
    ap.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    ap.add_argument("--user", type=positive_float, default=512, help="mean user prompt tokens")
    ap.add_argument("--load", type=positive_float, default=0.9)
    ap.add_argument("--kv-capacity", type=positive_int, default=500_000)
    ap.add_argument("--repeat", type=positive_int, default=3)
    a = ap.parse_args()
    if a.families < 0 or a.system < 0:
        ap.error("--families and --system must be at least 0")
    cost = make_cost_model(PROFILE)
    tr = workload(a.requests, a.families, a.system, a.user, a.block_size, a.load, cost)
    for on in (False, True):  # untimed: the first run pays one-time costs (imports, caches)
        run(tr, on, a.block_size, a.kv_capacity)
    best, cpu, loop, res = {}, {}, {}, {}
    for _ in range(a.repeat):
        for on in (False, True):  # alternate, so that a busy machine slows both alike
            w, c, r = run(tr, on, a.block_size, a.kv_capacity)
            best[on] = min(best.get(on, w), w)
            cpu[on] = min(cpu.get(on, c), c)
            loop[on] = min(loop.get(on, r.wall_s), r.wall_s)
            res[on] = r
    steps = {on: res[on].stats.steps for on in (False, True)}
    pc = res[True].stats.prefix
    print(
        json.dumps(
            {
                "requests": a.requests,
                "block_size": a.block_size,
                "families": a.families,
                "wall_off_s": round(best[False], 3),
                "wall_on_s": round(best[True], 3),
                "ratio_on_off": round(best[True] / best[False], 3),
                "cpu_off_s": round(cpu[False], 3),
                "cpu_on_s": round(cpu[True], 3),
                "cpu_ratio_on_off": round(cpu[True] / cpu[False], 3),
                "loop_wall_off_s": round(loop[False], 3),
                "loop_wall_on_s": round(loop[True], 3),
                "loop_ratio_on_off": round(loop[True] / loop[False], 3),
                "loop_ratio_per_step": round(loop[True] / steps[True] / (loop[False] / steps[False]), 3),
                "steps_off": steps[False],
                "steps_on": steps[True],
                "token_hit_rate": round(pc["token_hit_rate"], 4),
                "evictions": pc["evictions"],
            }
        )
    )


if __name__ == "__main__":
    main()
