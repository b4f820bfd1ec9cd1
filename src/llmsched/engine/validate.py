"""`llmsched validate`: the same requests through the real engine (in real time) and
through the simulator (timed by the engine's own profile), per policy; reports the
relative error of TTFT, ITL and E2E (mean, p50, p99).

Requests come from a trace (`arrival_s,prompt_tokens,output_tokens`); prompts are random
token ids and `ignore_eos` keeps the output lengths exact, so both sides see the same
work. The replay treats arrivals as the simulator does: at every step boundary it adds
the requests whose arrival time has passed; when idle it waits for the next arrival and
starts a step at once (sleeping until about 1 ms before it, then polling). A fresh engine
first runs a few warm-up requests, as a server does before it takes traffic.

Besides the latency errors, each policy's result holds `steps`: the step counts of both
sides and the median ratio of each real step's time (start to next start) to the cost
model's time for the same plan, separately for steps that followed another step at once
(`busy_ratio`) and for the first step after an idle wait (`after_idle_ratio`). These say
whether an error comes from the step times or from elsewhere (queueing, batching).
"""

from __future__ import annotations

import time

import numpy as np

from ..core.errors import ConfigError

METRICS = ("ttft", "itl", "e2e")
STATS = ("mean", "p50", "p99")
_SIM_KEYS = {"ttft": "ttft", "itl": "itl", "e2e": "e2el"}
_SIM_STATS = {"mean": "mean", "p50": "median", "p99": "p99"}


def _stats_ms(values) -> dict:
    v = np.asarray(values, dtype=np.float64) * 1e3
    v = v[~np.isnan(v)]
    if not len(v):
        return {s: None for s in STATS}
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def check_trace(trace, engine) -> None:
    need = trace.prompt + trace.output
    bad = np.nonzero(need > engine.max_model_len)[0]
    if len(bad):
        i = int(bad[0])
        raise ConfigError(f"trace request {i} needs {int(need[i])} tokens, more than the model's max "
                          f"length {engine.max_model_len}")
    bad = np.nonzero(need - 1 > engine.kv_capacity)[0]
    if len(bad):
        i = int(bad[0])
        raise ConfigError(f"trace request {i} needs {int(need[i]) - 1} KV tokens, more than the KV "
                          f"cache holds ({engine.kv_capacity})")


def replay(engine, trace, seed: int = 0, start_delay_s: float = 0.02, steps: list | None = None) -> dict:
    """Replay `trace` through `engine` in real time; per-request TTFT, E2E (s) and all
    inter-token gaps (s).

    The loop does what the simulator does at step boundaries: it adds every request
    whose arrival time has passed, then runs a step if there is work; when the engine is
    idle it waits for the next arrival (sleeping until shortly before it, then polling)
    and starts the step at once. `steps`: a list that receives one `StepRecord` per step
    (the plan as the cost model sees it, the measured times, whether it followed an idle
    wait)."""
    from ..core.engine_api import SamplingParams  # noqa: PLC0415

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
            engine.add_request(rid, prompts[i], params[i], arrival_time=engine._wall0 + t0 + arrival[i])
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
                last = StepRecord(t_call, idle, engine.last_step_args, engine.last_forward_s,
                                  engine.last_step_s)
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
    return {"ttft": ttft, "e2e": e2e, "itl": itl,
            "duration_s": float(max(s.token_times[-1] for s in seqs) - t0)}


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
    starts (the simulator starts it at the arrival)."""
    busy = [s.cycle_s / cost.step_time(*s.args) for s in steps if s.cycle_s is not None and not s.after_idle]
    cold = [s.cycle_s / cost.step_time(*s.args) for s in steps if s.cycle_s is not None and s.after_idle]
    lags = [s.lag_s for s in steps if s.lag_s is not None]
    return {"real": len(steps), "busy_steps": len(busy),
            "busy_ratio": float(np.median(busy)) if busy else None,
            "after_idle_steps": len(cold), "after_idle_ratio": float(np.median(cold)) if cold else None,
            "idle_start_lag_ms": float(np.median(lags) * 1e3) if lags else None}


def simulate(trace, engine, policy: str, cost_spec):
    from ..core.cost import make_cost_model  # noqa: PLC0415
    from ..policies import make_scheduler  # noqa: PLC0415
    from ..sim.result import SimResult  # noqa: PLC0415
    from ..sim.simulator import simulate_trace  # noqa: PLC0415

    sched = make_scheduler(policy, b_max=engine.b_max, k_max=engine.k_max, kv_capacity=engine.kv_capacity,
                           max_running=engine.max_num_seqs)
    # the exact step-by-step path: validation should not depend on the fast path's shortcuts
    stats = simulate_trace(trace, sched, make_cost_model(cost_spec), fast=False)
    return SimResult({"policy": policy}, stats, np.asarray(trace.arrival_s), np.asarray(trace.prompt),
                     np.asarray(trace.output), None)


def warm_up(engine, requests: int = 4) -> None:
    """Run a few requests to completion, as a server does before it takes traffic: the
    first steps of a fresh process pay one-time costs (lazy initialisation, first
    allocations) that no later step pays and no cost model includes."""
    from ..core.engine_api import SamplingParams  # noqa: PLC0415

    vocab = engine.config.vocab_size
    prompt = max(1, min(64, engine.max_model_len // 2, engine.b_max, engine.kv_capacity // 2))
    out = max(1, min(8, engine.max_model_len - prompt, engine.kv_capacity + 1 - prompt))
    for i in range(requests):
        engine.add_request(f"warmup-{i}", [(5 * i + j) % vocab for j in range(prompt)],
                           SamplingParams(max_tokens=out, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def compare(real: dict, sim) -> dict:
    s = sim.summary
    out = {}
    for m in METRICS:
        rs = _stats_ms(real[m])
        for st in STATS:
            sv = s.get(f"{_SIM_STATS[st]}_{_SIM_KEYS[m]}_ms")
            rv = rs[st]
            err = (sv - rv) / rv if (sv is not None and rv) else None
            out[f"{m}_{st}"] = {"real_ms": rv, "sim_ms": sv, "rel_error": err}
    return out


def validate(model, trace, policies=("sarathi",), *, profile: str | None = None, device: str = "cpu",
             dtype=None, b_max: int = 256, k_max: int | None = None, max_num_seqs: int = 64,
             block_size: int = 16, kv_cache_gb: float | None = None, max_model_len: int | None = None,
             seed: int = 0, reps: int = 3, progress=None, engine=None,
             num_threads: int | None = None, tables_s: float | None = None,
             calibrate_s: float = 2.5) -> dict:
    """Real engine vs simulator per policy. `trace`: a path or a trace object (numpy
    arrays `arrival_s`, `prompt`, `output`). `profile`: a cost-model spec or CSV path;
    default: measure one now with this engine (`reps`, `tables_s` and `calibrate_s` as
    in `profile_engine`; `calibrate_s=0`: no calibration run)."""
    from ..workload.trace import Trace, read_trace  # noqa: PLC0415
    from .engine import LLMEngine  # noqa: PLC0415
    from .profiler import profile_engine, write_profile  # noqa: PLC0415

    say = progress or (lambda msg: None)
    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        trace = read_trace(trace)
    trace = Trace(trace.arrival_s, trace.prompt, trace.output, None)
    policies = [p.strip() for p in (policies.split(",") if isinstance(policies, str) else policies) if p.strip()]
    if not policies:
        raise ConfigError("give at least one policy to validate")
    from ..policies import make_batch_policy  # noqa: PLC0415
    for p in policies:
        make_batch_policy(p)  # unknown names fail before any work
    if engine is None:
        if max_model_len is None and not str(device).startswith("cuda"):
            max_model_len = int(min(4096, max(2048, (trace.prompt + trace.output).max())))
        engine = LLMEngine(model, device=device, dtype=dtype, b_max=b_max, k_max=k_max,
                           max_num_seqs=max_num_seqs, block_size=block_size, kv_cache_gb=kv_cache_gb,
                           max_model_len=max_model_len, seed=seed, num_threads=num_threads)
    check_trace(trace, engine)
    if profile is None:
        say("measuring the engine's profile")
        import tempfile  # noqa: PLC0415
        rows = profile_engine(engine, reps=reps, warmup=1, min_s=tables_s, calibrate=calibrate_s > 0,
                              calibrate_s=calibrate_s or 1.0, progress=say)
        path = write_profile(rows, tempfile.mkdtemp(prefix="llmsched-validate-") + "/profile.csv")
        cost_spec = f"profile:{path}" + ("" if engine.runner.cuda else ",overlap=0")
    elif ":" in profile.split(",")[0] and not profile.startswith("/"):
        cost_spec = profile
    else:
        cost_spec = f"profile:{profile}" + ("" if engine.runner.cuda else ",overlap=0")
    from ..core.cost import make_cost_model  # noqa: PLC0415
    cost = make_cost_model(cost_spec)
    if engine.steps == 0:
        warm_up(engine)
    results = {}
    for policy in policies:
        engine.set_scheduler(policy, b_max=engine.b_max, k_max=engine.k_max)
        say(f"{policy}: real-time replay of {len(trace.arrival_s)} requests")
        steps: list = []
        real = replay(engine, trace, seed=seed, steps=steps)
        sim = simulate(trace, engine, policy, cost)
        results[policy] = {"errors": compare(real, sim), "real_duration_s": real["duration_s"],
                           "sim_duration_s": sim.summary["duration"],
                           "sim_preemptions": sim.summary["preemptions"],
                           "steps": {"sim": int(sim.stats.steps), **step_ratios(steps, cost)}}
    return {"model": str(model), "trace_requests": int(len(trace.arrival_s)), "cost_model": cost_spec,
            "device": str(engine.runner.device), "b_max": engine.b_max, "k_max": engine.k_max,
            "max_num_seqs": engine.max_num_seqs, "kv_capacity_tokens": engine.kv_capacity,
            "policies": results}
