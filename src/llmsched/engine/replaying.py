"""Real-time replay of a trace through the engine, as the simulator would see it.

The replay treats arrivals as the simulator does: at every step boundary it adds the
requests whose arrival time has passed; when idle it waits for the next arrival and
starts a step at once (sleeping until about 1 ms before it, then polling). Prompts are
random token ids and `ignore_eos` keeps the output lengths exact. `llmsched profile`
calibrates with it and `llmsched validate` (`llmsched.analysis.validate`) compares it with
the simulator.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.engine_api import SamplingParams
from ..core.errors import ConfigError


def check_trace(trace, engine, default_limit: bool = False) -> None:
    """Refuse a trace the engine cannot replay whole. `default_limit`: the engine's
    max_model_len is the command's default on the CPU, not one the user gave."""
    need = trace.prompt + trace.output

    def which(i: int) -> str:
        # by arrival and lengths, not the index alone: the trace is sorted by arrival, so
        # 'request 0' was not always the file's first row
        return (
            f"trace request {i} (arriving at {float(trace.arrival_s[i]):g} s: {int(trace.prompt[i])} prompt "
            f"+ {int(trace.output[i])} output tokens)"
        )

    bad = np.nonzero(need > engine.max_model_len)[0]
    if len(bad):
        i = int(bad[0])
        longest, limit = engine.config.max_len, engine.max_model_len
        if limit < longest and default_limit:
            what = (
                f"max_model_len {limit} (the default on the CPU; --max-model-len raises it up to the model's own "
                f"max length, {longest})"
            )
        elif limit < longest:  # (--max-model-len, not the model, sets it)
            what = f"max_model_len {limit} (--max-model-len; the model's own max length is {longest})"
        else:
            what = f"the model's max length {limit} (max_position_embeddings in its config.json)"
        raise ConfigError(f"{which(i)} needs {int(need[i])} tokens, more than {what}")
    bad = np.nonzero(need - 1 > engine.kv_capacity)[0]
    if len(bad):
        i = int(bad[0])
        raise ConfigError(
            f"{which(i)} needs {int(need[i]) - 1} KV tokens, more than the KV cache holds ({engine.kv_capacity})"
        )


def replay(engine, trace, seed: int = 0, start_delay_s: float = 0.02, steps: list | None = None) -> dict:
    """Replay `trace` through `engine` in real time; per-request TTFT, E2E (s) and all
    inter-token gaps (s).

    The loop does what the simulator does at step boundaries: it adds every request
    whose arrival time has passed, then runs a step if there is work; when the engine is
    idle it waits for the next arrival (sleeping until shortly before it, then polling)
    and starts the step at once. `steps`: a list that receives one `StepRecord` per step
    (the plan as the cost model sees it, the measured times, whether it followed an idle
    wait)."""

    rng = np.random.default_rng(seed)
    vocab = engine.config.vocab_size
    n = len(trace.arrival_s)
    arrival = np.asarray(trace.arrival_s, dtype=np.float64)
    arrival = arrival - arrival[0]
    prompts = [rng.integers(0, vocab, int(p)).tolist() for p in trace.prompt]
    params = [SamplingParams(max_tokens=int(o), temperature=0, ignore_eos=True) for o in trace.output]
    t0 = engine.now() + start_delay_s
    seqs = []
    i = 0
    idle = True
    last = None
    t_done = None
    woke = None  # arrival time of the request that ended an idle wait
    while i < n or engine.has_unfinished_requests():
        now = engine.now()
        while i < n and t0 + arrival[i] <= now:
            rid = f"validate-{i}"
            if idle and woke is None:
                woke = t0 + arrival[i]
            engine.add_request(rid, prompts[i], params[i], arrival_ns=round(float(t0 + arrival[i]) * 1e9))
            seqs.append(engine.sequence(rid))
            i += 1
        if engine.has_unfinished_requests():
            if steps is not None:
                t_call = engine.now()
                if last is not None and not idle:
                    last.cycle_s = t_call - last.t_call
                last = None
            engine.step()
            if steps is not None and engine.last_plan is not None and not engine.last_plan.is_empty():
                last = StepRecord(t_call, idle, engine.last_step_args, engine.last_forward_s, engine.last_step_s)
                if idle:
                    last.lag_s = None if woke is None else t_call - woke
                    last.idle_s = None if t_done is None else t_call - t_done
                steps.append(last)
                t_done = engine.now()
            idle = False
            woke = None
            continue
        idle = True
        wait = t0 + arrival[i] - engine.now()
        if wait > 0.002:
            time.sleep(wait - 0.001)
    ttft = np.array([s.token_times[0] - s.arrival for s in seqs])
    e2e = np.array([s.token_times[-1] - s.arrival for s in seqs])
    itl = np.concatenate([np.diff(s.token_times) for s in seqs]) if seqs else np.zeros(0)
    return {"ttft": ttft, "e2e": e2e, "itl": itl, "duration_s": float(max(s.token_times[-1] for s in seqs) - t0)}


class StepRecord:
    """One real step of a replay: `args` (the `CostModel.step_time` arguments of its
    plan), `forward_s` (the forward pass and sampling), `step_s` (planning + forward),
    `cycle_s` (from this step's start to the next one's, when the next followed at once,
    else None: host work included), `after_idle` (the engine had been idle before it);
    for such a step `idle_s` (how long the engine had been idle; None for the first) and
    `lag_s` (from the arrival that ended the wait to the step's start, where the
    simulator starts it at the arrival: the request's `add_request` and the loop)."""

    __slots__ = ("t_call", "after_idle", "args", "forward_s", "step_s", "cycle_s", "idle_s", "lag_s")

    def __init__(self, t_call, after_idle, args, forward_s, step_s):
        self.t_call, self.after_idle, self.args = t_call, after_idle, args
        self.forward_s, self.step_s, self.cycle_s = forward_s, step_s, None
        self.idle_s = self.lag_s = None


def step_ratios(steps: list, cost) -> dict:
    """Real step time (start to next start, host work included) against the cost model's
    time for the same plan, medians: `busy_ratio` over steps that followed another step
    at once, `after_idle_ratio` over the first steps after an idle wait; and
    `idle_start_lag_ms`, how long after the arrival that ends an idle wait its step
    starts (the simulator starts it at the arrival).

    `busy_steps` and `after_idle_steps` count every step of each kind; `busy_timed` and
    `after_idle_timed` those in the ratios: a step that no other followed at once (the
    last before an idle wait) has no start-to-next-start time (a trace of one-token
    requests arriving apart has two steps after idle and none timed)."""
    busy = [s.cycle_s / cost.step_time(*s.args) for s in steps if s.cycle_s is not None and not s.after_idle]
    cold = [s.cycle_s / cost.step_time(*s.args) for s in steps if s.cycle_s is not None and s.after_idle]
    lags = [s.lag_s for s in steps if s.lag_s is not None]
    n_cold = sum(1 for s in steps if s.after_idle)
    return {
        "real": len(steps),
        "busy_steps": len(steps) - n_cold,
        "busy_timed": len(busy),
        "busy_ratio": float(np.median(busy)) if busy else None,
        "after_idle_steps": n_cold,
        "after_idle_timed": len(cold),
        "after_idle_ratio": float(np.median(cold)) if cold else None,
        "idle_start_lag_ms": float(np.median(lags) * 1e3) if lags else None,
    }


def warm_up(engine, requests: int = 4) -> None:
    """Run a few requests to completion, as a server does before it takes traffic: the
    first steps of a fresh process pay one-time costs (lazy initialisation, first
    allocations) that no later step pays and no cost model includes."""

    vocab = engine.config.vocab_size
    prompt = max(1, min(64, engine.max_model_len // 2, engine.b_max, engine.kv_capacity // 2))
    out = max(1, min(8, engine.max_model_len - prompt, engine.kv_capacity + 1 - prompt))
    for i in range(requests):
        engine.add_request(
            f"warmup-{i}",
            [(5 * i + j) % vocab for j in range(prompt)],
            SamplingParams(max_tokens=out, temperature=0, ignore_eos=True),
        )
    while engine.has_unfinished_requests():
        engine.step()
