"""Small helpers shared by the simulator tests."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from llmsched.core import make_cost_model
from llmsched.policies import make_scheduler
from llmsched.sim.result import SimResult
from llmsched.sim.simulator import simulate_trace

_HERE = Path(__file__).resolve().parent
_GIVEN = os.environ.get("LLMSCHED_TRACES")
_SHARED = Path(_GIVEN) if _GIVEN else _HERE.parent.parent / "shared" / "traces"
FULL_TRACES = (_SHARED / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv").is_file()
# The traces the library reads: $LLMSCHED_TRACES when set (tests compare its draws with
# these files: a checkout away from ../shared run with it set compared the full traces'
# draws with the excerpts), else the real traces when this checkout sits next to
# ../shared, else 2,000-row excerpts of them.
TRACES = _SHARED if FULL_TRACES or _GIVEN else _HERE / "data" / "traces"


def fake_summary(**metrics) -> dict:
    """A point's summary from a test's stand-in for `run_point`: the keys every finished
    run's summary holds (`SUMMARY_KEYS`; a stored summary without them is damaged, and its
    point is simulated again on resume), then `metrics`."""
    from llmsched.analysis.runner import SUMMARY_KEYS  # noqa: PLC0415

    return {**dict.fromkeys(SUMMARY_KEYS, 0), **metrics}


def trace(rows):
    """rows: (arrival_s, prompt, output) tuples, in arrival order."""
    a, p, o = zip(*rows)
    return SimpleNamespace(arrival_s=np.array(a, float), prompt=np.array(p), output=np.array(o), tag=None)


def run(rows_or_trace, policy="sarathi", cost="const:10", fast=True, admission="fcfs", **limits):
    """Simulate and return (SimResult, list of steps.csv rows as dicts)."""
    tr = trace(rows_or_trace) if isinstance(rows_or_trace, list) else rows_or_trace
    sched = make_scheduler(policy, admission=admission, **limits)
    buf = io.StringIO()
    stats = simulate_trace(tr, sched, make_cost_model(cost), fast=fast, steps_file=buf)
    res = SimResult({}, stats, tr.arrival_s, tr.prompt, tr.output, None)
    steps = []
    for line in buf.getvalue().splitlines():
        step, start, dur, pf, dec, k, entries = line.split(",")
        steps.append(
            dict(
                step=int(step),
                start=float(start),
                duration=float(dur),
                prefill=int(pf),
                decode=int(dec),
                batch=int(k),
                entries=entries,
            )
        )
    return res, steps


def entries(steps):
    return [s["entries"] for s in steps]


def one_line_error(capsys, argv, *words) -> str:
    """Run the CLI's `main(argv)`: it must end with exit code 2 and one line on stderr (no
    traceback) holding every one of `words`; returns the line."""
    from llmsched.cli import main  # noqa: PLC0415

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def dump_half_then_interrupt(obj, f, **kw) -> None:
    """A `json.dump` stand-in that writes half of the text and then stops as Ctrl-C would:
    patched in, it tests that a result file survives an interrupted write."""
    import json  # noqa: PLC0415

    text = json.dumps(obj, **kw)
    f.write(text[: len(text) // 2])
    f.flush()
    raise KeyboardInterrupt


def run_steps(sched, prompts_by_step, output=2):
    """Plan and run one step per entry of `prompts_by_step` on a new state of `sched`,
    adding that entry's prompts (a request of `output` tokens each) first; returns the state."""
    from llmsched.core.request import Request  # noqa: PLC0415

    state = sched.new_state()
    rid = 0
    for step, prompts in enumerate(prompts_by_step):
        for prompt in prompts:
            state.add(Request(rid, step, prompt, output))
            rid += 1
        plan = sched.plan(state)
        state.begin_step(plan, step)
        state.end_step(plan, step + 1)
    return state


def tiny_llama_config():
    """A one-layer llama of 64 tokens' vocabulary, built in memory (no file, no download)."""
    from llmsched.engine.loader import ModelConfig  # noqa: PLC0415 - torch only where used

    return ModelConfig(
        arch="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    )
