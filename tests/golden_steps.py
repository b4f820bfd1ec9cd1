"""Canonical step records of the simulator, the virtual GPU and the engine on fixed inputs.

`tests/data/golden/steps.json` holds their SHA-256 as the code before the one-runtime
refactor produced them (`python tests/golden_steps.py > tests/data/golden/steps.json`,
run against that commit); `test_golden_steps.py` recomputes them with today's code. Only
public APIs are used, so the same file runs against both."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

POLICIES = ("sarathi", "orca", "vllm", "fastertransformer", "kfcfs")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def simulator_steps(policy: str, kv_capacity: int | None) -> str:
    import llmsched

    with tempfile.TemporaryDirectory() as d:
        llmsched.simulate(
            policy=policy,
            b_max=256,
            kv_capacity=kv_capacity,
            cost_model="paper",
            rate=4.0,
            prompt="geometric:120",
            output="geometric:60",
            num_requests=150,
            seed=3,
            record_steps=True,
            verdict=False,
            out_dir=d,
        )
        steps = _without_evicted((Path(d) / "steps.csv").read_text())
        return steps + _without_arrived((Path(d) / "requests.csv").read_text())


def _without_evicted(text: str) -> str:
    """steps.csv without its `ID:x` entries (a request preempted before the step), which
    came after the digests were taken: every other byte must stay the same."""
    out = []
    for line in text.splitlines(keepends=True):
        head, _, entries = line.rstrip("\n").rpartition(",")
        kept = " ".join(e for e in entries.split(" ") if not e.endswith(":x"))
        out.append(f"{head},{kept}\n")
    return "".join(out)


def _without_arrived(text: str) -> str:
    """requests.csv without its `arrived` column, which came after the digests were taken
    (issue 12): every other byte must stay the same. These runs have no stop time, so
    every request arrived."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text, newline="")))
    k = rows[0].index("arrived")
    assert all(r[k] == "1" for r in rows[1:])
    out = io.StringIO(newline="")
    csv.writer(out, lineterminator="\n").writerows([r[:k] + r[k + 1 :] for r in rows])  # read_text gave \n ends
    return out.getvalue()


def virtual_steps(policy: str) -> str:
    from llmsched.core.engine_api import SamplingParams
    from llmsched.policies import make_scheduler
    from llmsched.sim.virtual import VirtualEngine

    ve = VirtualEngine(make_scheduler(policy, b_max=64, kv_capacity=600), "paper", realtime=False)
    lines = []
    for i in range(30):
        ve.advance_to(i * 0.05)
        params = SamplingParams(
            max_tokens=5 + (i * 7) % 40,
            min_tokens=i % 3,
            stop=["tok tok tok tok tok"] if i % 4 == 1 else [],
            stop_token_ids=[0] if i % 9 == 2 else [],
        )
        ve.add_request(f"r{i}", range(3 + (i * 13) % 90), params, arrival_time=i * 0.05)
        for o in ve.step():
            lines.append(f"{ve.state.now} {o.request_id} {o.new_text!r} {o.finish_reason} {o.stop_reason}")
    while ve.has_unfinished_requests():
        for o in ve.step():
            lines.append(f"{ve.state.now} {o.request_id} {o.new_text!r} {o.finish_reason} {o.stop_reason}")
    return "\n".join(lines)


def engine_steps(policy: str, model_dir: str) -> str:
    from llmsched.core.engine_api import SamplingParams
    from llmsched.engine import LLM

    llm = LLM(model_dir, scheduler=policy, b_max=32, num_blocks=12, max_num_seqs=8)
    llm.engine.step_log = []
    prompts = [[5 + (7 * i + j) % 200 for j in range(3 + (11 * i) % 40)] for i in range(8)]
    params = [SamplingParams(max_tokens=4 + (5 * i) % 17, temperature=0) for i in range(8)]
    outs = llm.generate(prompts, params)
    log = [(p, d, n) for _, _, p, d, n in llm.engine.step_log]
    return json.dumps(
        {"steps": log, "tokens": [o.token_ids for o in outs], "preemptions": [o.preemptions for o in outs]}
    )


def make_model(path: str) -> str:
    from llmsched.engine import make_tiny_model

    return str(
        make_tiny_model(
            path,
            vocab_size=258,  # (256 was silently raised to 258, the smallest vocabulary)
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=64,
            seed=0,
        )
    )


def golden() -> dict:
    out = {}
    for p in POLICIES:
        out[f"simulator/{p}"] = _digest(simulator_steps(p, None))
        out[f"simulator/{p}/kv"] = _digest(simulator_steps(p, 900))
        out[f"virtual/{p}"] = _digest(virtual_steps(p))
    with tempfile.TemporaryDirectory() as d:
        model = make_model(d)
        for p in POLICIES:
            out[f"engine/{p}"] = _digest(engine_steps(p, model))
    return out


if __name__ == "__main__":
    json.dump(golden(), sys.stdout, indent=1, sort_keys=True)
    print()
