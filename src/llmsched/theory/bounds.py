"""Capacity of one server: theorem 2's token bound and the critical arrival rate.

Theorem 2 is from paper 1 ("Throughput-optimal scheduling for LLM inference and AI
agents"); `docs/stability.md` derives the numbers below and checks them by simulation.

Accounting (README "The model"; docs/stability.md "Work and capacity"): a request with `o` output
tokens needs its prompt's
prefill tokens plus `o - 1` decode tokens of work (the step that computes the last
prompt token also emits output token 1), so the work per request is
`mean_prompt + mean_output - 1` tokens.

- Without a batch-size cap (theorem 2): capacity `C = b_max / t(b_max)` tokens/s and the
  critical arrival rate is `lambda* = C / work`; below it every work-conserving K-FCFS
  policy is stable, above it every policy is unstable.
- With `k_max` below `b_max`: the answer comes from the 2-D region (`llmsched.core.region`):
  `lambda*` is the largest scale of the per-request rate vector `(mean_prompt, mean_output - 1)`
  that stays in the region, and the effective capacity for this mix is `lambda* * work`
  (for a context-dependent model never above the uncapped `C / work`, below). It is an
  upper bound; `region_exact` says whether the workload's requests can build the steps it
  time-shares (`_region_exactness`: chunk integrality). A `k_max >= b_max` cannot bind (a
  step of at most b_max tokens holds at most b_max requests) and gives the uncapped answer.
- Theorem 2 assumes `t(b) / b` is least at `b_max`. Where a load-only model breaks it
  (the paper's `max` variant with `c < a * b0`), a policy running steps of the load `b`
  that maximises `b / t(b)` serves more: without a binding cap `lambda*` is then
  `max_b b / t(b) / work` (the uncapped region, which is the triangle
  `x + y <= max_b b / t(b)`), and `C / work` is only the rate below which a policy that
  fills every step to `b_max` (a work-conserving one) is stable.

For a context-dependent cost model (`cost.load_only` False, e.g. the H200 profile) the
step time needs contexts, and the step at `b_max` used for `C` holds prefill and decode
tokens in the workload's proportion `mean_prompt : mean_output - 1` (a time-share of the
two whole step shapes around it). `lambda*` is then what such full mixed steps serve, `C /
work`, with or without a cap, unless the cap's region is lower: the region's shapes, timed
one by one, can beat the one mixed step (prefill-only and decode-only steps, where a
profile times decode-only steps as CUDA graphs), and their LP's rate is reported apart as
`shape_bound_rate` on both sides of `k_max = b_max` (taking it as lambda* under a cap only
made lambda* fall as the cap was relaxed to b_max: 23.947 req/s at k_max 511, 23.664 at
512, H200 profile, means 1000/200). Given `mix`, a
`LengthMix` of the workload's lengths (what `llmsched capacity`, `simulate`'s verdict,
sweeps and the serverless reproduction pass), the step is timed with the contexts its
tokens see on average when lengths vary (`core.length_mix`); without it, as lengths
that do not vary at the means (`LengthMix.of_means`, with a cached prefix per prompt of
`cached_prompt` tokens): 3-8% optimistic for varying lengths (docs/stability.md). Until
2026-12-03 means were timed with representative contexts (whole prompts plus one
mid-prompt chunk, no cached prefix), up to 22% optimistic even for constant lengths.
Without mean lengths, `token_capacity` uses `cost.load_time(b_max)` (a prefill-only step
with no cached context).

Prefix caching: prompt tokens served from the cache are never computed, so with a mean
of `cached_prompt` cached tokens per request the work is `mean_prompt - cached_prompt +
mean_output - 1` (uncached prompt + output - 1) and `capacity(..., cached_prompt=...)`
scales lambda* up accordingly; steps keep the full prompt as attention context.

Cost models: `capacity` and `token_capacity` are entry points and take a `CostModel` or a
spec string (`make_cost_model` runs once there); the helpers they call
(`step_time_at_budget`, `peak_token_capacity`) take a `CostModel`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

from ..core.checks import as_real, check_bool, whole_as_int
from ..core.constraints import check_b_max, check_k_max, k_max_binds
from ..core.cost import CostModel, make_cost_model
from ..core.errors import ConfigError, unknown_name
from ..core.length_mix import LengthMix
from ..core.region import check_mean_lengths, representative_timer, require_cost_model, stability_region

__all__ = [
    "CapacityReport",
    "capacity",
    "token_capacity",
    "work_per_request",
    "step_time_at_budget",
    "peak_token_capacity",
]


def work_per_request(mean_prompt: float, mean_output: float, cached_prompt: float = 0.0) -> float:
    """Tokens of work per request: prompt + output - 1 (the step that computes the last
    prompt token also emits output token 1; docs/stability.md "Work and capacity"), less
    the prompt tokens a prefix cache serves (`cached_prompt`, a mean per request)."""
    mean_prompt, mean_output = check_mean_lengths(mean_prompt, mean_output)
    return _work(mean_prompt, mean_output, _check_cached(cached_prompt, mean_prompt))


def _work(mean_prompt: float, mean_output: float, cached_prompt: float) -> float:
    """`work_per_request` of checked inputs."""
    return mean_prompt - cached_prompt + mean_output - 1.0


def _check_cached(cached_prompt, mean_prompt: float) -> float:
    """`cached_prompt` as a float: a number >= 0 below the mean prompt (ConfigError)."""
    c = as_real(cached_prompt)
    if c is None or not 0 <= c < mean_prompt:
        raise ConfigError(
            f"cached prompt tokens per request (cached_prompt) must be a number >= 0 and below the mean prompt "
            f"({mean_prompt:g}), got {cached_prompt!r:.60}"
        )
    return float(c)


def _check_longest(longest, mean_prompt: float, cached_prompt: float = 0.0) -> int | None:
    """`max_prefill_per_request`, the longest prompt's uncached part (the whole prompt
    without a prefix cache): None, or a whole number of tokens >= 1 and at least the mean
    uncached prompt `mean_prompt - cached_prompt` (no law has its longest below its mean).
    With a mean prompt of 1 token every prompt is 1 token: 1 whatever was given."""
    if longest is not None:
        x = as_real(longest)
        if x is None or not 1 <= x < math.inf or x != int(x):
            raise ConfigError(
                f"max_prefill_per_request (the longest prompt) must be a whole number of tokens >= 1, "
                f"got {longest!r:.60}"
            )
        if x < mean_prompt - cached_prompt:
            what = "the mean uncached prompt" if cached_prompt else "the mean prompt"
            raise ConfigError(
                f"max_prefill_per_request (the longest prompt, {int(x):,}) must be at least {what} "
                f"({mean_prompt - cached_prompt:g}): no prompt law has its longest below its mean"
            )
        longest = int(x)
    return 1 if mean_prompt == 1.0 else longest


def _region_exactness(region, k_max: int, mean_prompt: float, mean_output: float, cached_prompt: float):
    """Whether the region's lambda* under a binding cap is reached by steps the workload's
    requests can build: `(region_exact, why not)`. The LP lets a step's prefill tokens come
    from `ceil(x / max_prefill_per_request)` requests as one fluid, but a prompt is cut into
    chunks, each taking one of the step's `k_max` slots, and a chunk that ends mid-prompt
    leaves the rest of that prompt for a later step (chunk integrality). It cannot bind when
    every prompt has the same length `P` (`max_prefill_per_request == mean_prompt`, no
    prefix-cache share) and each step on the face where the workload's ray leaves the
    region either holds whole prompts (every such step's prefill `x` a multiple of `P`,
    `x / P` slots) or has a slot to spare for any cut of the prompt stream: a window of `x`
    tokens of it touches at most `ceil((x - 1) / P) + 1` prompts. Anything else (varying
    prompts, a longest prompt unknown, too few slots, a grid-sampled region) is an upper
    bound only."""
    if not region.exact:
        return False, "the region is a grid-sampled inner approximation of step shapes"
    longest = region.max_prefill_per_request
    if longest is None:
        return False, "a request's prefill per step is not bounded by a known longest prompt"
    if float(longest) != mean_prompt or cached_prompt:
        return False, "prompts vary in length (or a prefix cache serves part of them): chunk integrality can bind"
    p = int(longest)
    face = [(int(x), int(y)) for x, y in region.exit_face(mean_prompt - cached_prompt, mean_output - 1.0) if x > 0]
    whole = all(x % p == 0 for x, _ in face)
    # the prompts a step's prefill of x tokens touches: x / P whole ones, or any cut of the stream
    short = [(x, y) for x, y in face if (x // p if whole else -(-(x - 1) // p) + 1) > k_max - y]
    if not short:
        return True, None
    # only the steps short of slots are named (a step with a slot to spare for its cut was listed too)
    shapes = ", ".join(f"({x}, {y})" for x, y in short)
    one = len(short) == 1
    return False, (
        f"the region's step{'' if one else 's'} {shapes} (prefill tokens, decodes) cut{'s' if one else ''} "
        f"{p}-token prompts into chunks that, with {'its' if one else 'their'} decodes, need more than the "
        f"{k_max} request{'s' if k_max != 1 else ''} a step holds (chunk integrality): lambda* is an upper bound"
    )


def _check_budget(b) -> int:
    """A step's token load `b`: a whole number >= 1 (ConfigError)."""
    x = as_real(b)
    if x is None or not 1 <= x < math.inf or x != int(x):
        raise ConfigError(f"b (a step's tokens) must be a whole number >= 1, got {b!r:.60}")
    return int(x)


def _check_means(cost: CostModel, mean_prompt, mean_output, cached_prompt, mix):
    """What a step's timing takes, checked: the mean lengths, both or neither (one alone
    was silently ignored); `cached_prompt` where the timing uses it; `mix` a LengthMix or
    None. Returns (mean_prompt, mean_output, cached_prompt)."""
    if (mean_prompt is None) != (mean_output is None):
        raise ConfigError(
            "give both mean_prompt and mean_output (the step mixes prefill and decode in their proportion), or neither"
        )
    _check_mix(mix)
    if mean_prompt is None:
        return None, None, cached_prompt
    mean_prompt, mean_output = check_mean_lengths(mean_prompt, mean_output)
    if not cost.load_only:
        cached_prompt = _check_cached(cached_prompt, mean_prompt)
    return mean_prompt, mean_output, cached_prompt


def _check_mix(mix) -> None:
    if mix is not None and not isinstance(mix, LengthMix):
        raise ConfigError(f"mix must be a LengthMix of the workload's lengths (theory.workload_mix), got {mix!r:.60}")


def step_time_at_budget(
    cost: CostModel,
    b: int,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
    cached_prompt: float = 0.0,
    mix: LengthMix | None = None,
) -> float:
    """t(b) in seconds: `cost.load_time(b)` for a load-only model (or when no mean
    lengths are given); for a context-dependent model with mean lengths, the time of a
    b-token step mixing prefill and decode in the workload's proportion, with the
    contexts of `mix` (a `LengthMix` of the workload's lengths) or, without it, of
    lengths that do not vary at the means (optimistic when lengths vary)."""
    require_cost_model(cost)
    b = _check_budget(b)
    return _budget_timer(cost, *_check_means(cost, mean_prompt, mean_output, cached_prompt, mix), mix)(b)


def _times_by_load(cost: CostModel, mean_prompt, mean_output) -> bool:
    """Whether t(b) is `cost.load_time(b)`: a load-only model, or no mean lengths given."""
    return cost.load_only or mean_prompt is None or mean_output is None


def _budget_timer(cost: CostModel, mean_prompt, mean_output, cached_prompt: float = 0.0, mix=None):
    """`step_time_at_budget` of checked inputs as a function of b, the workload's
    constants computed once: a b-token step holds prefill : decode tokens in the
    workload's proportion."""
    if _times_by_load(cost, mean_prompt, mean_output):
        return lambda b: float(cost.load_time(int(b)))
    w = _work(mean_prompt, mean_output, cached_prompt)
    uncached = mean_prompt - cached_prompt
    if mix is None and cached_prompt:  # means with a cache: each chunk after its cached prefix
        mix = LengthMix.of_means(mean_prompt, mean_output, cached_prompt)
    time_of = representative_timer(cost, mean_prompt, mean_output, mix)

    def t(b) -> float:
        # the workload's share of prefill is rarely a whole number of tokens: the step is a
        # time-share of the two whole shapes around it (a rounded shape could drop a
        # workload's only decoder, or add one, and move lambda* by that decoder's time)
        b = int(b)
        x = min(float(b), max(0.0, b * uncached / w))
        lo = int(x)
        share = x - lo
        t_lo = time_of(lo, b - lo)
        return t_lo if share == 0.0 else (1.0 - share) * t_lo + share * time_of(lo + 1, b - lo - 1)

    return t


def token_capacity(
    cost: CostModel | str, b_max: int, mean_prompt: float | None = None, mean_output: float | None = None
) -> float:
    """Theorem 2's bound b_max / t(b_max), tokens per second. `cost`: a CostModel or a
    spec string. `mean_prompt` and `mean_output` (both or neither): a context-dependent
    model times a step mixing prefill and decode in their proportion; without them, a
    prefill-only step (`cost.load_time`)."""
    cost = make_cost_model(cost)
    b_max = check_b_max(b_max)
    t = step_time_at_budget(cost, b_max, mean_prompt, mean_output)
    if not t > 0 or not math.isfinite(t):
        raise ConfigError(f"step time at b_max={b_max} must be positive and finite, got {t!r}")
    return b_max / t


def peak_token_capacity(
    cost: CostModel,
    b_max: int,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
    cached_prompt: float = 0.0,
    mix: LengthMix | None = None,
) -> tuple[float, int]:
    """max over loads b <= b_max of b / t(b), and the smallest b attaining it. Theorem 2
    assumes b / t(b) is largest at b_max, so that this equals `token_capacity` (for the
    paper's t(b) = c + a * ceil(b / b0), when b0 divides b_max: t(b) / b is not monotone,
    t(128) / 128 < t(129) / 129 with b0 = 128); for cost models where it is not (e.g. the
    paper's `max` variant with c < a * b0) a policy running smaller steps serves more,
    and this is the real bound."""
    require_cost_model(cost)
    b_max = check_b_max(b_max)
    return _peak(cost, b_max, *_check_means(cost, mean_prompt, mean_output, cached_prompt, mix), mix)


def _peak(cost: CostModel, b_max: int, mean_prompt, mean_output, cached_prompt: float = 0.0, mix=None):
    """`peak_token_capacity` of checked inputs."""
    if _times_by_load(cost, mean_prompt, mean_output):
        return _load_peak(cost, b_max)
    t = _budget_timer(cost, mean_prompt, mean_output, cached_prompt, mix)
    best, arg = -1.0, 0
    for b in range(1, b_max + 1):
        tb = t(b)
        if not tb > 0:  # (a user's cost model object; the built-in ones time every step)
            raise ConfigError(f"step time at load {b} must be positive and finite, got {tb!r}")
        r = b / tb
        if r > best * (1 + 1e-12):
            best, arg = r, b
    return best, arg


def _load_peak(cost: CostModel, b_max: int) -> tuple[float, int]:
    """`peak_token_capacity` of t(b) = `cost.load_time(b)`, vectorised (`cost.load_times`):
    the largest b / t(b) over b = 1..b_max, and the smallest b within a factor 1 + 1e-12
    of it (with its own rate)."""
    import numpy as np  # noqa: PLC0415

    b = np.arange(1, int(b_max) + 1, dtype=np.int64)
    times = np.asarray(cost.load_times(b), dtype=float)
    if not (times > 0).all():
        k = int(np.argmin(times > 0))
        raise ConfigError(f"step time at load {k + 1} must be positive and finite, got {times[k]!r}")
    r = b / times
    j = int(np.argmax(r * (1 + 1e-12) >= r.max()))
    return float(r[j]), int(b[j])


def uncapped_capacity(
    cost: CostModel, b_max: int, token_cap: float, peak: tuple[float, int] | None = None
) -> tuple[float, str, tuple[float | None, int | None]]:
    """The best policy's token rate without a binding k_max, given theorem 2's `token_cap`
    (b_max / t(b_max)): `(rate, binding, (peak_token_capacity, peak_load))`. The region is
    then the triangle x + y <= max_b b / t(b): for a load-only model whose b / t(b) peaks
    below b_max (theorem 2's assumption fails) smaller steps serve more than `token_cap`
    and the rate is the peak's. `peak`: the load-only model's `_load_peak(cost, b_max)`
    when the caller has it (scanned here otherwise); for a context-dependent model the
    rate is `token_cap` and the peak is returned as given, (None, None) when not."""
    binding = "token budget (theorem 2)"
    if not cost.load_only:
        return token_cap, binding, (peak if peak is not None else (None, None))
    top, top_b = peak if peak is not None else _load_peak(cost, b_max)
    if top > token_cap * (1 + 1e-9):
        return top, f"token budget at b = {top_b} < b_max (t(b)/b least there: theorem 2 does not apply)", (top, top_b)
    return token_cap, binding, (top, top_b)


@dataclass
class CapacityReport:
    """Capacity numbers for one server and one workload (rates in requests/s, token
    rates in tokens/s, times in seconds).

    `critical_rate`: lambda*, the largest arrival rate some policy keeps stable: with a
    k_max below b_max, from the 2-D region, an upper bound on it (reached only if the
    workload's requests can build the region's steps: with `max_prefill_per_request`
    None one request may supply any prefill, which short prompts cannot; pass the longest
    prompt, `theory.means.largest_prompt`; `region_exact` True only where they can, else
    `region_note` says why not), for a context-dependent model at most `token_capacity /
    work` (the region's LP is then `shape_bound_rate`); otherwise theorem 2's `token_capacity / work`,
    except for a load-only model whose b / t(b) peaks below b_max (theorem 2's assumption
    fails), where it is `max_b b / t(b) / work` (the uncapped region; steps of that load
    reach it). A k_max >= b_max cannot bind and changes nothing.
    `critical_rate_token_bound`: theorem 2's formula `token_capacity / work`, with
    `t(b_max)` the step time at b_max (for a context-dependent model, of one step mixing
    prefill and decode in the workload's proportion, `step_time_at_budget`). It is an
    upper bound on `critical_rate` only under theorem 2's assumptions: b / t(b) largest
    at b_max. Otherwise, for a load-only model whose b / t(b) peaks below b_max,
    `critical_rate` exceeds it (`binding` says why) and C / w is only the rate below which
    a policy filling every step to b_max is stable. (For a context-dependent model
    `critical_rate` is at most C / w; the region's step shapes, which can beat the one
    mixed step C / w times by 0.6-1.2% for the H200 profile, b_max 512, means 1000/200,
    k_max 256 to 511, are `shape_bound_rate`.)
    `effective_capacity`: `critical_rate * work`, the token rate this mix can be served
    at. `fill_capacity`: `min(effective_capacity, token_capacity)`, the capacity the
    stability verdicts of one server and of a network scale their threshold by. Without a
    binding k_max it is what a policy filling every step to b_max (a work-conserving one)
    serves, its own limit (`policies.policy_capacity`): below `effective_capacity` only
    where b / t(b) peaks below b_max, and then such a policy is not throughput-optimal
    (`policies.batch_holds_back` with the peak's load). With `k_max < b_max` no policy
    fills every step (one of k_max decoders holds fewer tokens) and no theorem says what a
    work-conserving one serves (paper 1: it can be unstable inside the region); it is then
    the best policy's rate, capped at C, not a work-conserving policy's.
    `utilisation`: `rate / critical_rate`. `predicted_growth_tokens_per_s`: fluid
    backlog growth `max(0, rate * work - effective_capacity)` of a policy serving the
    arrival mix at lambda*'s operating point (the best policy's; a work-conserving one's
    under theorem 2's assumptions, else it grows at `rate * work - fill_capacity`: what
    `llmsched capacity` reports as `policy_predicted_growth_tokens_per_s`).
    `region_exact` (a binding k_max only): whether lambda* is reached by steps the
    workload's requests can build (`_region_exactness`); False with `region_note` saying
    why (an unknown longest prompt, varying prompts, a grid-sampled region, or the exit
    face's steps cutting prompts into more chunks than a step's slots take): lambda* is
    then an upper bound.
    `peak_token_capacity`/`peak_load`: max_b b / t(b) and where; equals token_capacity
    when b / t(b) is largest at b_max (theorem 2's assumption)."""

    cost: dict
    b_max: int
    k_max: int | None
    mean_prompt: float
    mean_output: float
    work_per_request: float
    prefill_tokens_per_request: float
    decode_tokens_per_request: float
    step_time_at_b_max_s: float
    token_capacity: float
    peak_token_capacity: float | None  # None when not asked for (`capacity(..., peak=False)`)
    peak_load: int | None
    critical_rate_token_bound: float
    critical_rate: float
    effective_capacity: float
    fill_capacity: float
    binding: str
    rate: float | None = None
    utilisation: float | None = None
    offered_tokens_per_s: float | None = None
    predicted_growth_tokens_per_s: float | None = None
    region_exact: bool | None = None
    # why `region_exact` is False (None otherwise): lambda* is then an upper bound
    region_note: str | None = None
    cached_prompt_per_request: float = 0.0  # prompt tokens a prefix cache serves, mean
    # how steps were timed: "load" (a load-only model), "length mix" (the contexts of the
    # workload's lengths) or "mean lengths" (representative contexts of the means)
    contexts: str = "load"
    # a context-dependent model without a binding cap (and `peak`): the largest rate of
    # any time-share of step shapes (the region's LP, as with k_max). lambda* is what full
    # steps mixing prefill and decode serve; where prefill-only and decode-only steps are
    # cheaper together (a profile that times decode-only steps as CUDA graphs), a policy
    # that splits them, as Orca does, can pass lambda*, up to this
    shape_bound_rate: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, numbers.Real) and not isinstance(v, (bool, int, float)):  # a numpy number
                d[k] = v = int(v) if isinstance(v, numbers.Integral) else float(v)
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return d


_CAPACITY_ARGS = (
    "cost",
    "b_max",
    "mean_prompt",
    "mean_output",
    "k_max",
    "rate",
    "max_prefill_per_request",
    "cached_prompt",
    "peak",
    "mix",
)


def capacity(
    cost: CostModel | str,
    b_max: int,
    mean_prompt: float,
    mean_output: float,
    k_max: int | None = None,
    rate: float | None = None,
    *,
    max_prefill_per_request: int | None = None,
    cached_prompt: float = 0.0,
    peak: bool = True,
    mix: LengthMix | None = None,
    **unknown,
) -> CapacityReport:
    """Capacity report (see the module docstring). `cost`: a CostModel or a spec string
    (`"paper"`, `"profile:h200-llama-3-8b"`, ...). `rate` in requests/s is optional.
    `cached_prompt`: mean prompt tokens per request served by a prefix cache (not work).
    `max_prefill_per_request` (a binding k_max): the most prefill tokens one request
    supplies, the longest of what requests really prefill at their first admission (their
    prompts less the prefix the cache serves them then; any less and lambda* could fall
    below what a policy serves).
    `mix`: a `LengthMix` of the workload's lengths (`theory.workload_mix`): a
    context-dependent model then times steps with the contexts varying lengths give
    (without it, as lengths that do not vary at the means, `LengthMix.of_means`: 2-8%
    optimistic, the more the lengths vary; docs/stability.md "Contexts of a full step"). Load-only models ignore it.
    `peak=False` leaves `peak_token_capacity` and `peak_load` None: for a context-dependent
    model their scan times every load up to `b_max`, which a caller that needs only the
    rates need not wait for (a load-only model's lambda* needs the peak: its vectorised scan
    runs either way)."""
    if unknown:
        raise unknown_name("capacity argument", min(unknown), _CAPACITY_ARGS)
    cost = make_cost_model(cost)
    # whole floats as ints, as a run takes them (simulate(k_max=16.0))
    b_max = check_b_max(whole_as_int(b_max))
    k_max = None if k_max is None else check_k_max(whole_as_int(k_max))
    peak = check_bool(peak, "peak")
    if rate is not None:
        r = as_real(rate)
        if r is None or not math.isfinite(r) or r < 0:
            raise ConfigError(f"arrival rate (rate) must be a finite number >= 0, got {rate!r:.60}")
        rate = float(r)
    mean_prompt, mean_output = check_mean_lengths(mean_prompt, mean_output)
    _check_mix(mix)
    cached_prompt = _check_cached(cached_prompt, mean_prompt)
    max_prefill_per_request = _check_longest(max_prefill_per_request, mean_prompt, cached_prompt)
    work = _work(mean_prompt, mean_output, cached_prompt)
    contexts = "load" if cost.load_only else ("length mix" if mix is not None else "mean lengths")
    if cost.load_only:
        mix = None
    elif mix is None:
        # means given: timed as lengths that do not vary at them (with a cache, each prompt's
        # uncached tokens after its cached prefix), the constant-length mix
        mix = LengthMix.of_means(mean_prompt, mean_output, cached_prompt)
    means = (None, None, 0.0, None) if cost.load_only else (mean_prompt, mean_output, cached_prompt, mix)
    t_bmax = _budget_timer(cost, *means)(b_max)
    if not t_bmax > 0 or not math.isfinite(t_bmax):
        raise ConfigError(f"step time at b_max={b_max} must be positive and finite, got {t_bmax!r}")
    cap = b_max / t_bmax
    peak_rate, peak_b = _peak(cost, b_max, *means) if peak else (None, None)
    lam_bound = cap / work
    region_exact = region_note = None
    shape_bound = None

    def region_rate(cap_k):
        """The region's LP (with cap `cap_k`, or none) along the workload: (rate, region)."""
        region = stability_region(
            cost,
            b_max,
            cap_k,
            mean_prompt=mean_prompt,
            mean_output=mean_output,
            max_prefill_per_request=max_prefill_per_request,
            mix=mix,
        )
        return region.max_scale(mean_prompt - cached_prompt, mean_output - 1.0), region

    # without a binding cap the region is the triangle x + y <= max_b b / t(b): where
    # t(b) / b is not least at b_max smaller steps serve more than C, and lambda* is theirs
    # (a context-dependent model: C, full steps mixing prefill and decode)
    # a cap of b_max requests or more cannot bind: a step of at most b_max tokens holds at
    # most b_max requests, so lambda* is the uncapped one
    if not k_max_binds(b_max, k_max):
        known = (peak_rate, peak_b) if peak_rate is not None else None
        top, binding, _ = uncapped_capacity(cost, b_max, cap, known)
        lam = lam_bound if top == cap else top / work
        if k_max is not None:
            binding += f"; k_max {k_max} >= b_max cannot bind"
        if peak and not cost.load_only:
            shape_bound, _ = region_rate(None)
    else:
        lam, region = region_rate(k_max)
        region_exact, region_note = _region_exactness(region, k_max, mean_prompt, mean_output, cached_prompt)
        if not cost.load_only and lam > lam_bound * (1 + 1e-9):
            # the region's step shapes, timed one by one, beat the full mixed step C times
            # (a load-only region lies in the uncapped triangle: no such case); as without a
            # cap, lambda* is the full mixed steps' (`uncapped_capacity`: C for a
            # context-dependent model) and the LP's rate is reported apart
            # (`shape_bound_rate`), so that lambda* never falls as k_max grows
            shape_bound, lam = lam, lam_bound
            binding = "token budget (theorem 2); the region's step shapes reach more (shape_bound_rate)"
        elif lam > lam_bound * (1 + 1e-9):
            binding = "2-D region (steps below b_max serve faster than t(b_max) allows)"
        elif lam >= lam_bound * (1 - 1e-9):
            binding = "token budget (theorem 2)"
        else:
            binding = "batch-size cap (2-D region)"
    # (theorem 2's rate serves exactly C: lam * work could miss it by a rounding)
    eff = cap if lam == lam_bound else lam * work
    util = offered = growth = None
    if rate is not None:
        offered = rate * work
        util = rate / lam if lam > 0 else math.inf
        growth = max(0.0, offered - eff)
    return CapacityReport(
        cost=cost.describe(),
        b_max=b_max,
        k_max=k_max,
        mean_prompt=float(mean_prompt),
        mean_output=float(mean_output),
        work_per_request=work,
        prefill_tokens_per_request=float(mean_prompt) - float(cached_prompt),
        decode_tokens_per_request=float(mean_output) - 1.0,
        step_time_at_b_max_s=t_bmax,
        token_capacity=cap,
        peak_token_capacity=peak_rate,
        peak_load=peak_b,
        critical_rate_token_bound=lam_bound,
        critical_rate=lam,
        effective_capacity=eff,
        fill_capacity=min(eff, cap),
        binding=binding,
        rate=None if rate is None else float(rate),
        utilisation=util,
        offered_tokens_per_s=offered,
        predicted_growth_tokens_per_s=growth,
        region_exact=region_exact,
        region_note=region_note,
        cached_prompt_per_request=float(cached_prompt),
        contexts=contexts,
        shape_bound_rate=shape_bound,
    )
