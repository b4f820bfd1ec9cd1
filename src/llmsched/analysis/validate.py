"""`llmsched validate` (sim vs real): the same requests through the real engine (in real time) and
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
`engine_preemptions` and `sim_preemptions` count the preemptions of each side's run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..core.cost import FORMULA_KINDS, make_cost_model
from ..core.engine_api import DefaultMaxModelLen
from ..core.errors import ConfigError
from ..core.profile import DEFAULT_PROFILE, check_profile_layers, spec_options
from ..engine.profiler import profile_engine, write_profile
from ..engine.replaying import check_trace, replay, step_ratios, warm_up
from ..policies import make_batch_policy, make_scheduler
from ..sim.result import SimResult
from ..sim.simulator import simulate_trace
from ..workload.trace import Trace, read_trace

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


def simulate(trace, engine, policy: str, cost):
    """The simulator's run of `trace` with `engine`'s limits; `cost`: a cost model or spec."""
    sched = make_scheduler(
        policy, b_max=engine.b_max, k_max=engine.k_max, kv_capacity=engine.kv_capacity, max_running=engine.max_num_seqs
    )
    # the exact step-by-step path: validation should not depend on the fast path's shortcuts
    stats = simulate_trace(trace, sched, make_cost_model(cost), fast=False)
    return SimResult(
        {"policy": policy}, stats, np.asarray(trace.arrival_s), np.asarray(trace.prompt), np.asarray(trace.output), None
    )


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


def profile_spec(profile: str, cuda: bool) -> str:
    """The cost-model spec `--profile P` stands for: a cost model other than a profile
    (`paper`, `paper:c=11`, `linear:...`, `const:...`) as given; a profile, as `PATH`,
    `profile:PATH` or `profile` (the shipped default), as `profile:PATH`, on CPU with
    overlap 0 unless P gives an overlap (nothing overlaps on CPU, docs/engine.md; appending
    ours to the user's would repeat the key). Both spellings of one file are one model
    (`llmsched profile` prints the `profile:PATH,overlap=0` form)."""
    profile = profile.strip()
    kind, colon, _ = profile.partition(",")[0].partition(":")
    kind = kind.strip().lower()
    if kind in FORMULA_KINDS:  # not a profile: as given
        return profile
    source = profile
    if kind == "profile":  # profile[:SOURCE][,OPTIONS]; no SOURCE: the shipped default
        rest = profile.split(":", 1)[1] if colon else profile[len("profile") :]
        head, sep, opts = rest.partition(",")
        source = (head.strip() or DEFAULT_PROFILE) + sep + opts
    cpu_default = not cuda and "overlap" not in spec_options(source)
    return f"profile:{source}" + (",overlap=0" if cpu_default else "")


def validate(
    model,
    trace,
    policies=("sarathi",),
    *,
    profile: str | None = None,
    device: str = "cpu",
    dtype=None,
    b_max: int = 512,
    k_max: int | None = None,
    max_num_seqs: int = 64,
    block_size: int = 16,
    kv_cache_gb: float | None = None,
    max_model_len: int | None = None,
    seed: int = 0,
    reps: int = 3,
    progress=None,
    engine=None,
    num_threads: int | None = None,
    tables_s: float | None = None,
    calibrate_s: float = 2.5,
) -> dict:
    """Real engine vs simulator per policy. `trace`: a path or a trace object (numpy
    arrays `arrival_s`, `prompt`, `output`). `profile`: a cost-model spec or CSV path;
    default: measure one now with this engine (`reps`, `tables_s` and `calibrate_s` as
    in `profile_engine`; `calibrate_s=0`: no calibration run)."""
    from ..engine.engine import LLMEngine  # noqa: PLC0415 (torch: only when it runs)

    say = progress or (lambda msg: None)
    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        trace = read_trace(trace, None)  # lengths and times only: no block ids
    trace = Trace(trace.arrival_s, trace.prompt, trace.output, None)
    policies = [p.strip() for p in (policies.split(",") if isinstance(policies, str) else policies) if p.strip()]
    if not policies:
        raise ConfigError("give at least one policy to validate")
    for p in policies:
        make_batch_policy(p)  # unknown names fail before any work
    if engine is None:
        if max_model_len is None and not str(device).startswith("cuda"):
            # a default, not the user's: the engine lowers it to the model's longest
            max_model_len = DefaultMaxModelLen(min(4096, max(2048, (trace.prompt + trace.output).max())))
        engine = LLMEngine(
            model,
            device=device,
            dtype=dtype,
            b_max=b_max,
            k_max=k_max,
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            kv_cache_gb=kv_cache_gb,
            max_model_len=max_model_len,
            seed=seed,
            num_threads=num_threads,
        )
    check_trace(trace, engine, default_limit=isinstance(max_model_len, DefaultMaxModelLen))
    if profile is None:
        say("measuring the engine's profile")
        rows = profile_engine(
            engine,
            reps=reps,
            warmup=1,
            min_s=tables_s,
            calibrate=calibrate_s > 0,
            calibrate_s=calibrate_s or 1.0,
            progress=say,
        )
        # read once, then removed: the run leaves nothing behind (`llmsched profile` keeps one)
        with tempfile.TemporaryDirectory(prefix="llmsched-validate-") as tmp:
            path = write_profile(rows, Path(tmp) / "profile.csv")
            cost = make_cost_model(f"profile:{path}" + ("" if engine.runner.cuda else ",overlap=0"))
        cost_spec = "profile measured by this run" + ("" if engine.runner.cuda else ",overlap=0")
    else:
        cost_spec = profile_spec(profile, engine.runner.cuda)
        cost = make_cost_model(cost_spec)
        check_profile_layers(cost, engine.config.num_layers, "--profile ", model)
    if engine.steps == 0:
        warm_up(engine)
    results = {}
    for policy in policies:
        engine.set_scheduler(policy, b_max=engine.b_max, k_max=engine.k_max)
        # the simulator binds `cost` to its scheduler (TWP, DynamicBatch and adaptive read
        # step times from it): the engine's must plan with the same one
        engine.bind_cost_model(cost)
        say(f"{policy}: real-time replay of {len(trace.arrival_s)} requests")
        steps: list = []
        preempted_before = engine.preemptions
        real = replay(engine, trace, seed=seed, steps=steps)
        sim = simulate(trace, engine, policy, cost)
        results[policy] = {
            "errors": compare(real, sim),
            "real_duration_s": real["duration_s"],
            "sim_duration_s": sim.summary["duration"],
            "engine_preemptions": engine.preemptions - preempted_before,
            "sim_preemptions": sim.summary["preemptions"],
            "steps": {"sim": int(sim.stats.steps), **step_ratios(steps, cost)},
        }
    return {
        "model": str(model),
        "trace_requests": int(len(trace.arrival_s)),
        "cost_model": cost_spec,
        "device": str(engine.runner.device),
        "b_max": engine.b_max,
        "k_max": engine.k_max,
        "max_num_seqs": engine.max_num_seqs,
        "kv_capacity_tokens": engine.kv_capacity,
        "policies": results,
    }
