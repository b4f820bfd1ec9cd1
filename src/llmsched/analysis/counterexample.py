"""Search for workloads inside the stability region where a full-budget policy is unstable.

With a batch-size cap `k_max` the region is two-dimensional (docs/stability.md, "The
batch-size cap: a two-dimensional region"). Near a
boundary face that needs steps of a smaller load, Sarathi-Serve (always fill `b_max`:
decodes first, then prefill chunks up to the budget) runs slow full steps while decode
is capped at `k_max` tokens per step, and can be unstable although the workload lies
strictly inside the region. `find_counterexample` tries candidate workloads (long
prompts, decode-heavy outputs, scaled to b_max and k_max), and for each whose region
critical rate is set by the cap, simulates the policy at `load` times that rate (inside
the region by the factor `1 / load`): a candidate is confirmed when the policy is judged
unstable on every seed and the adaptive policy (`policies.adaptive`) stable on every seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..api import check_config
from ..core.constraints import check_b_max, check_k_max, k_max_binds
from ..core.cost import make_cost_model
from ..core.errors import ConfigError
from ..theory import capacity, workload_means, workload_mix
from ..theory.means import region_prefill_cap
from .points import resolve_point, run_point
from .runner import Backend, Progress, Runner, Store

__all__ = ["find_counterexample", "default_candidates"]


def default_candidates(b_max: int, k_max: int) -> list[tuple[str, str]]:
    """(prompt law, output law) pairs to try, most promising first: prompts of a few
    b_max, outputs of several k_max tokens."""
    out = []
    for m in (2, 4, 1, 8):
        for n in (8, 4, 16, 2):
            out.append((f"const:{max(1, int(m * b_max))}", f"const:{max(2, int(n * k_max))}"))
    return out


def _verdicts(recs) -> list[dict]:
    out = []
    for r in recs:
        s = r["summary"]
        out.append(
            {
                "seed": r["config"]["workload"].get("seed"),
                "stable": s.get("stable"),
                "verdict": s.get("verdict"),
                "verdict_reason": s.get("verdict_reason"),
                "backlog_growth_tokens_per_s": s.get("backlog_growth_tokens_per_s"),
                "backlog_growth_ci": s.get("backlog_growth_ci"),
                "error": s.get("error"),
            }
        )
    return out


def _not_all(entry: dict, who: str, verdicts: list[dict], stable: bool) -> None:
    """Record in `entry` why runs that should all be `stable` (True) or unstable (False)
    are not: the first seed that is the other way, or else one that is inconclusive
    (`entry["inconclusive"]`: a longer run may decide)."""
    for v in verdicts:
        if v["stable"] is (not stable):
            entry["outcome"] = f"{who} {'stable' if v['stable'] else 'unstable'} on seed {v['seed']}"
            return
    seed = next(v["seed"] for v in verdicts if v["stable"] is None)
    entry["outcome"] = f"{who} inconclusive on seed {seed} (a longer run may decide: --num-requests)"
    entry["inconclusive"] = True


def check_binding_cap(b_max, k_max) -> None:
    """A ConfigError unless the cap `k_max` can bind under `b_max` (`k_max_binds`): without
    one, theorem 2 makes every work-conserving K-FCFS policy stable inside the region, so
    no search is run."""
    if k_max is None:
        raise ConfigError(
            "a counterexample needs a batch-size cap --k-max: without one, theorem 2 "
            "makes every work-conserving K-FCFS policy stable inside the region"
        )
    # (the limits' own rules first: a b_max of 0 is not a cap that cannot bind)
    b_max, k_max = check_b_max(b_max), check_k_max(k_max)
    if not k_max_binds(b_max, k_max):
        raise ConfigError(
            f"a counterexample needs a batch-size cap --k-max below --b-max: k_max {k_max} >= b_max {b_max} "
            "cannot bind (a step of at most b_max tokens holds at most b_max requests), so theorem 2 "
            "makes every work-conserving K-FCFS policy stable inside the region"
        )


def find_counterexample(
    cost_model: str = "paper",
    b_max: int = 512,
    k_max: int | None = 16,
    *,
    load: float = 0.85,
    policy: str = "sarathi",
    candidates: Iterable[tuple[str, str]] | None = None,
    num_requests: int = 4000,
    seeds: Sequence[int] = (0, 1),
    first_only: bool = True,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    progress=None,
) -> dict:
    """Search (see the module docstring). Returns {"found", "workload", "rate",
    "critical_rate", "scale", "margin", "runs" (the policy's verdicts per seed),
    "adaptive", "tried": [...], "confirmed": [...]}. A run that fails is a ConfigError
    (its message), not a verdict."""
    check_binding_cap(b_max, k_max)
    if not (isinstance(load, (int, float)) and 0 < load < 1):
        raise ConfigError(f"load must be in (0, 1) (a point strictly inside the region), got {load!r}")
    if not seeds:
        raise ConfigError("give at least one seed")
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"seeds must differ (a seed given twice runs the same simulation twice), got {list(seeds)}")
    cost = make_cost_model(cost_model)
    cands = list(candidates) if candidates is not None else default_candidates(b_max, k_max)
    base = {
        "cost_model": cost_model,
        "b_max": b_max,
        "k_max": k_max,
        "num_requests": num_requests,
        "arrival": "poisson",
        "rate": 1.0,
    }
    if cands:  # the runs' options, before any run (an unknown policy, no requests)
        for pol in (policy, "adaptive"):
            check_config(resolve_point(None, {**base, "prompt": cands[0][0], "output": cands[0][1]}, {"policy": pol}))
    tried, confirmed = [], []
    bar = Progress(bool(progress), "counterexample search")
    try:
        with Backend(backend, workers, address) as be:
            runner = Runner(be, Store(None), bar, run_point)
            for prompt, output in cands:
                cfg = resolve_point(None, {**base, "prompt": prompt, "output": output}, {})
                mp, mo = workload_means(cfg.workload)
                rep = capacity(
                    cost,
                    b_max,
                    mp,
                    mo,
                    k_max=k_max,
                    mix=workload_mix(cfg.workload),
                    max_prefill_per_request=region_prefill_cap(cfg.workload, b_max, k_max),
                )
                entry = {
                    "prompt": prompt,
                    "output": output,
                    "mean_prompt": mp,
                    "mean_output": mo,
                    "critical_rate": rep.critical_rate,
                    "critical_rate_token_bound": rep.critical_rate_token_bound,
                    "binding": rep.binding,
                }
                tried.append(entry)
                if "batch-size cap" not in rep.binding:
                    entry["skipped"] = "the cap does not bind (theorem 2's bound does)"
                    continue
                rate = load * rep.critical_rate
                entry["rate"] = rate

                def run(pol):
                    cfgs = [
                        resolve_point(
                            None, {**base, "prompt": prompt, "output": output}, {"policy": pol, "rate": rate, "seed": s}
                        )
                        for s in seeds
                    ]
                    verdicts = _verdicts(runner.run(cfgs))
                    for v in verdicts:
                        if v["error"]:
                            raise ConfigError(f"{pol} at {rate:.4g} req/s, seed {v['seed']}: {v['error']}")
                    return verdicts

                entry["runs"] = run(policy)
                if not all(v["stable"] is False for v in entry["runs"]):
                    _not_all(entry, policy, entry["runs"], False)
                    continue
                entry["adaptive"] = run("adaptive")
                if not all(v["stable"] is True for v in entry["adaptive"]):
                    _not_all(entry, "adaptive", entry["adaptive"], True)
                    continue
                entry["outcome"] = "confirmed"
                confirmed.append(entry)
                if first_only:
                    break
    finally:
        bar.close()
    out = {
        "found": bool(confirmed),
        "cost_model": cost_model,
        "b_max": b_max,
        "k_max": k_max,
        "load": load,
        "policy": policy,
        "num_requests": num_requests,
        "seeds": list(seeds),
        "tried": tried,
        "confirmed": confirmed,
    }
    if confirmed:
        c = confirmed[0]
        scale = c["critical_rate"] / c["rate"]
        out.update(
            workload={
                "prompt": c["prompt"],
                "output": c["output"],
                "mean_prompt": c["mean_prompt"],
                "mean_output": c["mean_output"],
            },
            rate=c["rate"],
            critical_rate=c["critical_rate"],
            critical_rate_token_bound=c["critical_rate_token_bound"],
            scale=scale,
            margin=scale - 1.0 if math.isfinite(scale) else None,
            runs=c["runs"],
            adaptive=c["adaptive"],
        )
    return out
