"""Simulator speed with prefix caching on against off, on the same workload.

Workload: Poisson arrivals; each prompt is one of `--families` shared system prompts
(`--system` tokens) followed by a lognormal user part (mean `--user` tokens, sigma 1,
at most 8192); geometric outputs (mean 128, at most 2048). Block ids are chained per
`--block-size` tokens: a family's system blocks are shared, the rest are the request's
own. Sarathi-Serve, b_max 512, the H200 Llama-3-8B profile, a KV capacity of
`--kv-capacity` tokens, at `--load` x theorem 2's lambda* without caching. Each mode runs
`--repeat` times in this process; the best wall time counts, and the best CPU time
(user + system of this process: less sensitive to other jobs on a shared machine).
`--families 0`: no prompt shares a block (caching on finds nothing to reuse and takes the
very same steps as off: its pure bookkeeping cost).

With sharing, caching on also simulates a different, lighter run (less prefill, so more
and smaller steps), so the wall time per simulated step is reported beside the wall time.

    python benchmarks/bench_prefix.py                       # 20k requests, 16-token blocks
    python benchmarks/bench_prefix.py --block-size 512 --requests 50000

Prints one JSON line: wall and CPU seconds off and on, their ratios (the goal: at most
1.5), steps, and the hit rate.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from llmsched.core import make_cost_model
from llmsched.policies.spec import SchedulerSpec
from llmsched.sim.simulator import simulate_trace
from llmsched.theory import LengthMix, capacity
from llmsched.workload import Trace


def workload(n: int, families: int, system: int, user: float, block: int, load: float, cost, seed: int = 0):
    rng = np.random.default_rng(seed)
    fam = rng.integers(0, max(families, 1), n)
    mu = np.log(user) - 0.5
    own = np.minimum(np.round(rng.lognormal(mu, 1.0, n)), 8192).astype(np.int64) + 1
    prompt = system + own
    output = np.minimum(rng.geometric(1 / 128, n), 2048)
    lam = capacity(cost, 512, float(prompt.mean()), float(output.mean()), mix=LengthMix(prompt, output)).critical_rate
    arrival = np.cumsum(rng.exponential(1 / (load * lam), n))
    blocks = []
    for i in range(n):
        k = int(prompt[i]) // block
        shared = min(k, system // block) if families else 0
        # ids: (family, position) for the shared system prompt, (request, position) after it;
        # distinct tuples hash to distinct ids, and equal leading ids mean equal prefixes
        ids = [hash((int(fam[i]), j)) for j in range(shared)] + [hash(("r", i, j)) for j in range(shared, k)]
        blocks.append(tuple(ids) or None)
    tr = Trace(arrival, prompt, output)
    tr.blocks = blocks  # the simulator takes a `blocks` list at the cache's block size
    return tr


def run(tr, cost, on: bool, block: int, kv: int) -> tuple[float, float, object]:
    """(wall s, CPU s of this process, stats) of one simulation."""
    sched = SchedulerSpec(policy="sarathi", b_max=512, kv_capacity=kv, prefix_caching=on, block_size=block).build()
    sched.bind_cost_model(cost)
    t = time.perf_counter()
    c = time.process_time()
    stats = simulate_trace(tr, sched, cost)
    return time.perf_counter() - t, time.process_time() - c, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--families", type=int, default=16)
    ap.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    ap.add_argument("--user", type=float, default=512, help="mean user prompt tokens")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--kv-capacity", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cost = make_cost_model("profile:h200-llama-3-8b")
    tr = workload(a.requests, a.families, a.system, a.user, a.block_size, a.load, cost)
    best = {}
    cpu = {}
    stats = {}
    for _ in range(a.repeat):
        for on in (False, True):  # alternate, so that a busy machine slows both alike
            w, c, s = run(tr, cost, on, a.block_size, a.kv_capacity)
            best[on] = min(best.get(on, w), w)
            cpu[on] = min(cpu.get(on, c), c)
            stats[on] = s
    pc = stats[True].prefix
    print(
        json.dumps(
            {
                "requests": a.requests,
                "block_size": a.block_size,
                "wall_off_s": round(best[False], 3),
                "wall_on_s": round(best[True], 3),
                "ratio_on_off": round(best[True] / best[False], 3),
                "ratio_per_step": round(best[True] / stats[True].steps / (best[False] / stats[False].steps), 3),
                "cpu_off_s": round(cpu[False], 3),
                "cpu_on_s": round(cpu[True], 3),
                "cpu_ratio_on_off": round(cpu[True] / cpu[False], 3),
                "steps_off": stats[False].steps,
                "steps_on": stats[True].steps,
                "token_hit_rate": round(pc["token_hit_rate"], 4),
                "evictions": pc["evictions"],
            }
        )
    )


if __name__ == "__main__":
    main()
