"""What `llmsched capacity` reports for one server: theorem 2's numbers and, with a
batch-size cap, the two-dimensional stability region, from a configuration."""

from __future__ import annotations

import math
from pathlib import Path

from ..api import SimConfig, build_config, check_config, warn_profile_reach
from ..core.constraints import k_max_binds
from ..core.cost import make_cost_model, warn_fast_steps
from ..core.errors import ConfigError
from ..core.guarantee import reasons_text
from ..core.paths import check_out_file
from ..policies import batch_holds_back, canonical_policy_name, policy_capacity
from ..theory import (
    DEFAULT_SAMPLES,
    capacity,
    rate_unit,
    requests_per_rate,
    stability_region,
    workload_means,
    workload_mix,
)
from ..theory.means import cached_tokens, largest_prompt
from ..workload import WorkloadSpec, make_trace, replays_trace
from ..workload.arrivals import check_rate
from ..workload.trace import mean_rate
from .figures import plot_region

#: Options a run takes that theorem 2 and the region do not model: a capacity report refuses them.
CAPACITY_IGNORES = ("admission", "admission_options", "kv_capacity", "max_running", "prefix_caching")


def _clock_free(cfg: SimConfig) -> SimConfig:
    """`cfg` with its synthetic workload's request rate raised to 1 req/s where it is below
    (the rate checked first, as a run checks it): the one request drawn to check the
    workload's laws then arrives within the simulator's clock (1e9 s), which at 1e-9 req/s
    it did not (3.3e9 s: `capacity --rate 1e-9` was refused for a run it never makes)."""
    spec = WorkloadSpec.from_dict(cfg.workload)  # (a rate, a cv, a time scale: refused as a run refuses them)
    if spec.rate is None or spec.rate * spec.time_scale >= 1.0:
        return cfg
    check_rate(spec.rate)
    workload = {**cfg.given_workload(), "arrival": spec.arrival, "rate": 1.0, "time_scale": 1.0}
    if spec.cv is not None:
        workload["cv"] = spec.cv
    return build_config(cfg, workload=workload)


def _rate_given(cfg) -> bool:
    """Whether the workload's rate was given (`rate`, or inline as `poisson:5`), not
    simulate's default: capacity reports a utilisation only for a rate someone chose."""
    given = cfg.given_workload()
    return given.get("rate") is not None or ":" in str(given.get("arrival") or "")


def capacity_report(
    config=None,
    *,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
    rate: float | None = None,
    samples: int | None = None,
    plot: str | None = None,
    cached_fraction: float = 0.0,
    **overrides,
) -> dict:
    """What `llmsched capacity` prints, as a dict: theorem 2's numbers, and with `k_max`
    the 2-D region (LP), whether the workload point is inside and by what factor the
    rate could be scaled (`scale` = lambda* / the offered request rate; inside iff scale >
    1). `rate` is the workload's: with `turns` conversations/s, each offering its mean
    number of turns; with `time_scale` K on synthetic arrivals, run K times as fast (as
    `simulate` runs them): `request_rate` is the requests/s it offers.
    `cached_fraction`: the expected share of prompt tokens a prefix cache serves (not
    work: theorem 2 with the uncached prompt)."""
    plot_file = plot_path(plot) if plot is not None else None  # before the work, not after it
    cfg = build_config(config, **overrides)
    default = SimConfig()
    for key in CAPACITY_IGNORES:
        if getattr(cfg, key) != getattr(default, key):
            raise ConfigError(
                f"the configuration sets {key}: capacity's bounds do not model admission, a running cap "
                "or the KV cache (simulate with it)"
            )
    # what `simulate` refuses, `capacity` refuses too (an unknown policy or arrival, a cv
    # without gamma arrivals, a rate given twice): the workload with its rate, as a run
    check = {"rate": rate} if rate is not None else {}
    if rate is not None and "rate" not in overrides:
        # the rate with the other options, as simulate takes them: over the configuration
        # it replaces an arrival's own rate, beside an `arrival` given with it ("poisson:3")
        # it is refused as given twice
        WorkloadSpec.from_dict(build_config(config, **overrides, rate=rate).workload)
    if not replays_trace(cfg.workload):
        # capacity draws no run: its count of requests (simulate's default 5,000, or those
        # within duration_s) is not checked, or a tiny rate is refused for the arrival times
        # of requests nothing draws (`duration_s: 100` at 0.001 req/s: "the workload is
        # empty"), and a large duration for a count over the limit
        check["num_requests"] = 1
        probe = build_config(cfg, **check)
        if probe.workload.get("duration_s") is not None:
            WorkloadSpec.from_dict(probe.workload)  # (a duration that is no positive number: refused)
            probe = build_config(probe, workload={**probe.given_workload(), "duration_s": None})
        check_config(_clock_free(probe))
    else:
        # a replayed trace's requests are those its rate keeps: a duration cuts the clock
        # the rate rescales (without it, `--rate 10 --duration 400` judged the requests
        # of 400 s of the trace's own clock, not the ones `simulate` runs)
        cfg = check_config(cfg, **check)
    if mean_prompt is not None and mean_output is not None and cfg.workload.get("system_prompt"):
        raise ConfigError(
            "a system prompt adds to the workload's prompts, which --mean-prompt replaces: "
            "give the prompt law (--prompt) instead, or a mean prompt that includes it"
        )
    source = "given"
    prompts_from_workload = mean_prompt is None
    is_trace = replays_trace(cfg.workload)
    mix = None  # the contexts of the workload's lengths (not of means given instead)
    if not (isinstance(cached_fraction, (int, float)) and 0 <= cached_fraction < 1):
        raise ConfigError(f"the cached fraction must be a number in [0, 1), got {cached_fraction!r}")
    if mean_prompt is None or mean_output is None:
        n = DEFAULT_SAMPLES if samples is None else samples
        if mean_prompt is None and mean_output is None:
            # (the cached share of each prompt is its first tokens: the rest are timed after them)
            mix = workload_mix(cfg.workload, n, cached_fraction)
            mp, mo = mix.mean_prompt, mix.mean_output  # (one draw, not two with a cached fraction)
        else:
            mp, mo = workload_means(cfg.workload, n)
        source = "trace" if is_trace else f"sampled ({n:,} draws)"
        if is_trace:
            # a law given with a trace replaces its lengths (it said "trace" of drawn ones)
            spec = WorkloadSpec.from_dict(cfg.workload)
            classes = any(c.prompt is not None or c.output is not None for c in spec.classes or ())
            of = {
                role: "the classes' laws" if classes else f"the {role} law" if getattr(spec, role) else "the trace"
                for role in ("prompt", "output")
            }
            if of["prompt"] != "the trace" or of["output"] != "the trace":
                source = f"prompt from {of['prompt']}, output from {of['output']}"
        else:
            of = {"prompt": source, "output": source}
        if mean_prompt is not None:
            source = f"prompt given, output from {of['output']}" if is_trace else f"prompt given, output {source}"
        elif mean_output is not None:
            source = f"output given, prompt from {of['prompt']}" if is_trace else f"output given, prompt {source}"
        mean_prompt = mp if mean_prompt is None else mean_prompt
        mean_output = mo if mean_output is None else mean_output
    if rate is None and not is_trace and _rate_given(cfg):  # (a config's rate, as simulate runs it)
        rate = WorkloadSpec.from_dict(cfg.workload).rate
    if rate is None and is_trace:  # (its arrivals, whatever gives the lengths)
        r = mean_rate(make_trace(WorkloadSpec.from_dict(cfg.workload), blocks=False).arrival_s)
        rate = None if math.isnan(r) else r
    for what, v in (("mean prompt", mean_prompt), ("mean output", mean_output)):
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            raise ConfigError(f"{what} must be a number, got {v!r}")
    if rate is not None and not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate must be a positive number of requests/s, got {rate!r}")
    # with a binding cap, the region lets a request supply at most its prompt as prefill
    # in a step: the workload's longest prompt, where its prompt law bounds it (given
    # means have none: then any number, which can put lambda* above what any policy serves)
    capped = k_max_binds(cfg.b_max, cfg.k_max)
    longest = largest_prompt(cfg.workload) if capped and prompts_from_workload else None
    if longest is not None and cached_fraction:
        # what the longest prompt computes: its cached share is not prefill (the largest
        # uncached part of any prompt, which never shrinks as a prompt grows)
        longest -= cached_tokens(cached_fraction, longest)
    if capped and float(mean_prompt) == 1.0:
        longest = 1  # a mean of 1 token: every prompt is 1 token
    per = requests_per_rate(cfg.workload) if rate is not None else 1.0  # (1 for a trace: its rate is requests/s)
    request_rate = None if rate is None else rate * per
    cost = make_cost_model(cfg.cost_model)  # (once: a policy's own cost option is compared with it)
    # the warnings `simulate` gives for inputs valid but probably not meant: a one-token step
    # under 0.1 ms, a profile used far past its grid (the context: the sample's longest
    # request, or with means given the mean request's)
    warn_fast_steps(cost, cfg.cost_model)
    reach = mix.longest_context if mix is not None else math.ceil(float(mean_prompt) + float(mean_output) - 1)
    warn_profile_reach(cost, cfg, reach)
    rep = capacity(
        cost,
        cfg.b_max,
        float(mean_prompt),
        float(mean_output),
        k_max=cfg.k_max,
        rate=request_rate,
        max_prefill_per_request=longest,
        # (with a mix, the tokens it holds cached: each prompt's share, rounded, never its
        # last; with a given mean, the share of it, never its last token either)
        cached_prompt=mix.mean_cached if mix is not None else cached_share(cached_fraction, float(mean_prompt)),
        mix=mix,
    )
    # full steps of b_max serve less than lambda*'s steps (b / t(b) peaks below b_max): a
    # policy filling every step is stable only below fill_capacity / work
    fills_short = not capped and rep.fill_capacity < rep.effective_capacity * (1 - 1e-9)
    holds_back = batch_holds_back(
        cfg.policy,
        cfg.b_max,
        cfg.k_max,
        rep.peak_load if fills_short else None,
        rep.region_exact,
        cost_model=cost,
        options=cfg.policy_options,
    )
    limit = policy_capacity(
        cfg.policy,
        cfg.b_max,
        cfg.k_max,
        rep.effective_capacity,
        rep.fill_capacity,
        region_exact=rep.region_exact,
        cost_model=cost,
        options=cfg.policy_options,
    )
    out = {
        "cost_model": cfg.cost_model,
        "b_max": cfg.b_max,
        "k_max": cfg.k_max,
        "policy": canonical_policy_name(cfg.policy),
        # lambda* is the stable region of work-conserving policies without a binding
        # k_max, and of adaptive where the region is exact; of another it only bounds it
        # (`not_throughput_optimal`: why)
        "throughput_optimal": not holds_back,
        "not_throughput_optimal": reasons_text(holds_back) or None,
        # the kinds of those reasons (core.guarantee: FILL, CAP, REGION, POLICY)
        "not_throughput_optimal_kinds": sorted({r.kind for r in holds_back}),
        # the rate below which this policy is stable, where theory says it (None: lambda*
        # only bounds it): fill_capacity / work for a work-conserving policy without a
        # binding cap, lambda* for adaptive (unless region_exact is false: an upper bound)
        "policy_critical_rate": None if limit is None else limit / rep.work_per_request,
        "means_source": source,
        # with a binding k_max: the most prefill tokens one request supplies in a step, as
        # the region assumes it (None: any number, `largest_prompt` unknown): the longest
        # prompt, less its cached share with a cached fraction
        **({"largest_prompt": longest} if capped else {}),
        "capacity": rep.to_dict(),
    }
    region = None
    if cfg.k_max is not None or plot:
        region = stability_region(
            cost,
            cfg.b_max,
            cfg.k_max,
            mean_prompt=float(mean_prompt),
            mean_output=float(mean_output),
            max_prefill_per_request=longest,
            mix=mix,
        )
        if cfg.k_max is not None:
            out["region"] = region.to_dict()
    if rate is not None:
        scale = rep.critical_rate / request_rate if request_rate > 0 else math.inf
        out.update(rate=rate, utilisation=rep.utilisation, inside=bool(scale > 1.0), scale=scale, margin=scale - 1.0)
        out["request_rate"] = request_rate
        # the same for this policy, at its own limit: its utilisation, whether the rate is
        # below that limit, and the fluid growth of its backlog (None where unknown)
        offered = rep.offered_tokens_per_s
        out.update(
            policy_utilisation=None if limit is None else (offered / limit if limit > 0 else math.inf),
            policy_inside=None if limit is None else bool(offered < limit),
            policy_predicted_growth_tokens_per_s=None if limit is None else max(0.0, offered - limit),
        )
        if not is_trace and (cfg.workload.get("turns") is not None or per != 1.0):
            out.update(
                rate_unit=rate_unit(cfg.workload),
                requests_per_rate=per,
                time_scale=float(cfg.workload.get("time_scale") or 1.0),
            )
    if plot_file is not None:
        r = request_rate if rate is not None else rep.critical_rate
        point = (r * rep.prefill_tokens_per_request, r * rep.decode_tokens_per_request)
        label = "workload" if rate is not None else "workload at lambda*"
        plot_file.parent.mkdir(parents=True, exist_ok=True)  # missing folders are made, as for every --out
        out["plot"] = plot_region(region, point, str(plot_file), point_label=label)
    return out


def cached_share(cached_fraction: float, mean_prompt: float) -> float:
    """Cached prompt tokens per request for a given mean prompt: the fraction of it, never
    its last token (that token is always computed: it emits output token 1), as each
    prompt's share is capped in a workload's length mix (`theory.means`)."""
    return max(0.0, min(float(cached_fraction) * mean_prompt, mean_prompt - 1.0))


PLOT_FORMATS = (".png", ".pdf", ".svg")


def plot_path(plot) -> Path:
    """Where the region's plot goes: a PNG unless the name ends in .pdf or .svg (a name
    without a suffix gets .png, so that the path reported is the file written)."""
    if not str(plot).strip():
        raise ConfigError("--plot: give a file name (FILE.png), got ''")
    p = Path(plot)
    if p.is_dir():
        raise ConfigError(f"--plot {str(plot)!r} is a folder: give a file name, e.g. {str(p / 'region.png')!r}")
    if not p.suffix:
        p = p.with_name(p.name + ".png")
    if p.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"--plot {str(plot)!r}: the plot is written as {', '.join(PLOT_FORMATS)}, not {p.suffix}")
    check_out_file(p, "--plot", make_parents=True)
    return p


def rep_law(rep: dict, role: str) -> str:
    c = rep["capacity"]
    return f"const:{max(1, round(c['mean_prompt' if role == 'prompt' else 'mean_output']))}"
