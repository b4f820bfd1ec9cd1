"""Batch and admission policies, and a registry that builds a `Scheduler` by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.checks import keyword_names
from ..core.constraints import Constraints, k_max_binds
from ..core.cost import make_cost_model
from ..core.errors import ConfigError, unknown_name, unknown_option
from ..core.guarantee import CAP, COST, FILL, HELD, POLICY, REGION, HoldReason
from ..core.names import ADMISSION_ALIASES
from .adaptive import Adaptive
from .admission import FCFS, RunningCap, ShortestPromptFirst
from .base import AdmissionHooks, AdmissionPolicy, BatchPolicy, Planner, Scheduler, check_defines_build
from .dynamic_batch import DynamicBatch
from .fastertransformer import FasterTransformer
from .kfcfs import KFCFS
from .orca import Orca
from .sarathi import Sarathi
from .twp import TWP
from .vllm import VanillaVLLM

BATCH_POLICIES: dict[str, type[BatchPolicy]] = {
    "fastertransformer": FasterTransformer,
    "vllm": VanillaVLLM,
    "orca": Orca,
    "sarathi": Sarathi,
    "kfcfs": KFCFS,
    "adaptive": Adaptive,
}
BATCH_ALIASES = {"ft": "fastertransformer", "vanilla-vllm": "vllm", "sarathi-serve": "sarathi", "k-fcfs": "kfcfs"}

# name -> factory(**options) returning an AdmissionPolicy
ADMISSION_POLICIES: dict[str, Callable[..., AdmissionPolicy]] = {
    "fcfs": FCFS,
    "spf": ShortestPromptFirst,
    "twp": TWP,
    "dynamicbatch": DynamicBatch,
}
# names a registered policy may not take (it would replace a built-in, or never be found)
_BUILT_IN_BATCH = frozenset(BATCH_POLICIES) | frozenset(BATCH_ALIASES)
_BUILT_IN_ADMISSION = frozenset(ADMISSION_POLICIES) | frozenset(ADMISSION_ALIASES)


def _registrable(name, builtins: frozenset, what: str) -> str:
    """`name` as a policy is looked up (lower case); ConfigError for no name, capitals
    (never found: names are matched in lower case) or a built-in policy's name."""
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise ConfigError(f"a {what} needs a name without ':' to be registered under, got {name!r}")
    if name != name.strip().lower():
        raise ConfigError(f"{what} name {name!r}: use lower case ({name.strip().lower()!r}): names are matched so")
    if name in builtins:
        raise ConfigError(f"{what} name {name!r} is a built-in policy's: choose another")
    return name


def register_batch_policy(cls: type[BatchPolicy]) -> type[BatchPolicy]:
    """Make a `BatchPolicy` subclass available by its `name` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, BatchPolicy)):
        raise ConfigError(f"register_batch_policy takes a BatchPolicy subclass, got {cls!r}")
    check_defines_build(cls)
    BATCH_POLICIES[_registrable(cls.name, _BUILT_IN_BATCH, "batch policy")] = cls
    return cls


def register_admission_policy(name: str, factory: Callable[..., AdmissionPolicy]) -> None:
    """Make an admission policy available by `name`; `factory(**options)` builds it."""
    if not callable(factory):
        raise ConfigError(f"admission policy {name!r}: the factory must be callable, got {factory!r}")
    ADMISSION_POLICIES[_registrable(name, _BUILT_IN_ADMISSION, "admission policy")] = factory


_ALIASES = {"batch": BATCH_ALIASES, "admission": ADMISSION_ALIASES}


def canonical_policy_name(name: str, kind: str = "batch") -> str:
    """The name a `kind` ("batch" or "admission") policy is registered under: stripped,
    in lower case, an alias replaced (`FT` -> `fastertransformer`); inline options
    (`:key=value`) are kept as given. An unknown name is returned normalised all the same."""
    base, sep, options = name.partition(":")
    base = base.strip().lower()
    return _ALIASES[kind].get(base, base) + sep + options


def policy_base_name(name: str, kind: str = "batch") -> str:
    """The name a policy is registered under, its inline options (`:key=value`) dropped."""
    return canonical_policy_name(name, kind).partition(":")[0]


def is_throughput_optimal(
    name: str,
    b_max: int | None = None,
    k_max: int | None = None,
    peak_load: int | None = None,
    region_exact: bool | None = None,
    cost_model=None,
    options: dict | None = None,
) -> bool:
    """Whether the batch policy `name` (an alias or with inline options too) is stable
    wherever the workload lies inside the stability region (lambda*) of a server with
    these limits: `batch_holds_back` finds nothing (see there)."""
    return not batch_holds_back(name, b_max, k_max, peak_load, region_exact, cost_model, options)


def batch_holds_back(
    name: str,
    b_max: int | None = None,
    k_max: int | None = None,
    peak_load: int | None = None,
    region_exact: bool | None = None,
    cost_model=None,
    options: dict | None = None,
) -> list[HoldReason]:
    """Why the batch policy `name` on a server with these limits has no guarantee of
    stability inside the region, in a few words each; [] when it has one. A policy that is
    `region_stable` (adaptive) has one where the region is exact; with `region_exact` False
    (`StabilityRegion.region_exact`: chunk integrality can bind) lambda* is an upper bound
    that no policy may reach (kind REGION; measured: k_max 1, prompts of 200, adaptive
    unstable at 11.5 req/s under lambda* = 13.69); a work-conserving one (`BatchPolicy.work_conserving`:
    it fills the budget whenever work waits) has theorem 2's, which assumes no batch-size
    cap: with `k_max < b_max` (`k_max_binds`) a step of `k_max` decoders is not full
    however much work waits, and paper 1 shows such a policy unstable strictly inside the
    region (`k_max 16 < b_max 512`, kind CAP). Theorem 2 also assumes `b / t(b)` largest at
    b_max: `peak_load`, the load below b_max where it peaks when the caller found one
    (`CapacityReport.peak_load` where `fill_capacity` is below `effective_capacity`
    without a binding cap), means full steps serve less than lambda*'s steps, so a policy
    filling every step to b_max is unstable inside the region (`b / t(b) peaks at b = 512
    < b_max 600`, kind FILL). Any other policy, or an unknown name, has none (its name,
    kind POLICY). `cost_model`: the run's cost model (a spec or a CostModel); a
    `region_stable` policy given a `cost` option (inline in `name` or in `options`, the
    run's `policy_options`) that describes another model plans with another region's
    steps, so it has no guarantee either (kind COST; measured: adaptive:cost=const:10 on
    the paper model, b_max 600, prompts 200, outputs 101, unstable at 11 req/s, serving
    10.53, under a lambda* of 11.14)."""
    base = policy_base_name(name)
    cls = BATCH_POLICIES.get(base)
    if getattr(cls, "region_stable", False):
        why = _foreign_cost(cls, name, cost_model, options)
        if region_exact is False:
            why.append(HoldReason(REGION, "the region is an upper bound (region_exact false)"))
        return why
    if not getattr(cls, "work_conserving", False):
        return [HoldReason(POLICY, base)]
    if k_max_binds(b_max, k_max):
        return [HoldReason(CAP, f"k_max {k_max} < b_max {b_max}")]
    if peak_load is not None and b_max is not None and peak_load < b_max:
        return [HoldReason(FILL, f"b / t(b) peaks at b = {peak_load} < b_max {b_max}")]
    return []


def _foreign_cost(cls, name: str, cost_model, options: dict | None) -> list[HoldReason]:
    """[HoldReason(COST, ...)] when the policy's own `cost` option (inline in `name` or in
    `options`) describes a model other than the run's `cost_model` (`paper` and an
    explicit spec of the same model match); [] without either, or when they match."""
    if cost_model is None:
        return []
    _, _, rest = str(name).partition(":")
    opts = _policy_options(cls, rest, name) if rest.strip() else {}
    opts.update(options or {})
    own = opts.get("cost")
    if own is None:
        return []
    try:
        if make_cost_model(own).describe() == make_cost_model(cost_model).describe():
            return []
    except ConfigError:  # (a run refuses a cost it cannot build; here it is not the run's)
        pass
    spec = own if isinstance(own, str) else getattr(own, "name", type(own).__name__)
    return [HoldReason(COST, f"{cls.name} plans with cost {spec}, not the run's cost model")]


def policy_capacity(
    name: str,
    b_max: int | None,
    k_max: int | None,
    best: float,
    fill: float,
    held: bool = False,
    region_exact: bool | None = None,
    cost_model=None,
    options: dict | None = None,
) -> float | None:
    """The token rate (tokens/s) the batch policy `name` serves under a backlog, where
    theory (or, for adaptive, our runs) says it: `best` (`CapacityReport.effective_capacity`,
    lambda*'s steps) for a `region_stable` policy (adaptive); `fill`
    (`CapacityReport.fill_capacity`, full steps of b_max) for a work-conserving one without a
    binding k_max (theorem 2's argument: every step is full while work waits); None for any
    other: a policy that is not work-conserving, a work-conserving one under a binding cap,
    or any policy behind an admission or a running cap that holds work back (`held`: what
    `admission_holds_back` finds), whose stable rates lambda* only bounds from above. With
    `region_exact` False (`CapacityReport.region_exact`: under a binding cap the region's
    steps may cut prompts into chunks the workload cannot supply) lambda* is an upper bound
    that adaptive need not reach either (k_max 1, prompts of 200: it served 10.69 req/s of
    a lambda* of 13.69, docs/stability.md): None for it too."""
    if held or batch_holds_back(name, b_max, k_max, region_exact=region_exact, cost_model=cost_model, options=options):
        return None
    return best if getattr(BATCH_POLICIES.get(policy_base_name(name)), "region_stable", False) else fill


def scheduler_policy_capacity(
    sched, best: float, fill: float, region_exact: bool | None = None, admission=None
) -> float | None:
    """`policy_capacity` for a scheduler's configuration: `sched` has the fields of
    `SchedulerSpec` (`policy`, `admission`, `b_max`, `k_max`, `kv_capacity`, `max_running`,
    `admission_options`: one server's `SimConfig`, a network's `ServerSpec`). None (unknown:
    lambda* only bounds its stable rates) also behind an admission or a running cap that
    holds work back (`admission_holds_back`) and with a finite KV capacity: a backlog's
    requests then fill the KV cache, steps stay short of the budget and preemptions add
    recompute work, which no theorem here counts (Sarathi at b_max 512, prompts 200,
    outputs 101, kv_capacity 2000: unstable at 6 req/s, 54% of a full-step limit of 11.14).
    `admission`: the admission policy already built (its running cap included), judged as
    it is rather than made again from the names (a registered factory is called once per
    run)."""
    if admission is not None:
        held = admission_limits(admission)
    else:
        held = bool(admission_holds_back(sched.admission, sched.max_running, sched.admission_options))
    held = held or sched.kv_capacity is not None
    return policy_capacity(
        sched.policy,
        sched.b_max,
        sched.k_max,
        best,
        fill,
        held,
        region_exact,
        getattr(sched, "cost_model", None),
        getattr(sched, "policy_options", None),
    )


def admission_holds_back(
    admission: str = "fcfs", max_running: int | None = None, options: dict | None = None
) -> list[HoldReason]:
    """Why an admission can leave a step's budget idle while work waits, in a few words
    each (`twp admission`, `max_running 4`, kind HELD); [] when it only orders the queue (fcfs, spf).
    A policy that limits a step's tokens or requests or refuses a waiting request (its
    class overrides `token_limit`, `batch_limit` or `may_admit`: TWP's window,
    DynamicBatch's cap) can, and so can a running cap."""
    limits = admission_limits(make_admission_policy(admission, **(options or {})))
    why = [HoldReason(HELD, f"{policy_base_name(admission, 'admission')} admission")] if limits else []
    if max_running is not None:
        why.append(HoldReason(HELD, f"max_running {max_running}"))
    return why


def admission_limits(policy) -> bool:
    """Whether the admission policy object can leave budget idle while work waits: its
    class overrides `token_limit`, `batch_limit` or `may_admit` (a running cap wrapping it
    included)."""
    hooks = AdmissionHooks(policy)
    return bool(hooks.token_limit or hooks.batch_limit or hooks.may_admit)


def admission_takes(name: str, option: str) -> bool:
    """Whether the admission policy registered as `name` takes the keyword `option` (in its
    `OPTIONS`, or as a parameter of its factory): `simulate --slo itl_ms=...` sets
    `itl_target_ms` of every admission that takes one (TWP, DynamicBatch, yours). A
    factory's `**kwargs` alone does not count: it may pass them on to a policy that takes
    no such option (name it, or list it in `OPTIONS`)."""
    factory = _lookup(name, "admission")
    return option in getattr(factory, "OPTIONS", ()) or option in _parameters(factory)[0]


def paced_by_slo(admission: str, options: dict) -> bool:
    """Whether a run's SLO sets the ITL target of admission policy `admission` given
    `options`: it takes an `itl_target_ms` (`admission_takes`) and none is given."""
    return "itl_target_ms" not in options and admission_takes(policy_base_name(admission, "admission"), "itl_target_ms")


def _lookup(name: str, kind: str):
    table = BATCH_POLICIES if kind == "batch" else ADMISSION_POLICIES
    key = canonical_policy_name(name, kind)
    if key not in table:
        base, sep, rest = key.partition(":")
        if sep and kind == "admission" and base in table:
            # (the admission's name is read in many places: its options travel apart)
            raise ConfigError(
                f"admission policy {name!r}: options are not taken inline for admission policies; "
                "give each with --admission-option KEY=VALUE (admission_options={...} in the API)"
            )
        raise unknown_name(f"{kind} policy", name, table)
    return table[key]


def _check_option_names(what: str, name: str, factory, options: dict) -> None:
    """One clear line for an option `factory` does not take: calling it would raise a
    TypeError naming the class (`FCFS() takes no arguments`). A factory taking **options
    checks them itself (TWP, DynamicBatch)."""
    named, takes_any = _parameters(factory)
    unknown = set(options) - set(named)
    if unknown and not takes_any:
        raise unknown_option(what, name, unknown, list(named))


def takes_option(kind: str, name: str, option: str) -> bool:
    """Whether the `kind` ("batch" or "admission") policy `name` takes `option`: it lists
    it (a batch policy's `option_names`, an admission policy's `OPTIONS`), names it as a
    parameter, or takes **options and lists none (it checks them itself). A sweep gives a
    fixed option to the points of the grid's policies that take it."""
    base = str(name).partition(":")[0] if kind == "batch" else name  # (a batch policy's inline options)
    factory = _lookup(base, kind)
    listed = getattr(factory, "option_names" if kind == "batch" else "OPTIONS", None)
    named, takes_any = _parameters(factory)
    return option in (listed or ()) or option in named or (takes_any and listed is None)


def _parameters(factory) -> tuple[tuple[str, ...], bool]:
    """A policy factory's keyword parameter names, and whether it takes **options as well
    (none, and any, when it has no signature to read: its own TypeError will have to do)."""
    import inspect  # noqa: PLC0415

    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return (), True
    named = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def _option_names(cls) -> tuple[str, ...] | None:
    """The option names a batch policy takes: the tuple its class sets as `option_names`
    (which its spec may give inline), else its factory's keyword
    parameters (the names `policy_options` are checked against); None when it takes
    **options (any identifier is a name)."""
    names = getattr(cls, "option_names", None)
    if names is not None:
        return tuple(names)
    named, takes_any = _parameters(cls)
    return None if takes_any else named


def _policy_options(cls, text: str, spec: str) -> dict:
    """Inline options of a batch policy spec `name:key=value,key=value`. A part that does
    not start with one of the class's option names (`option_names`, else its `__init__`'s
    keyword parameters) continues the previous value (so
    `adaptive:cost=paper:c=11.28,a=35.47` keeps the cost spec whole)."""
    import json  # noqa: PLC0415

    names = _option_names(cls)
    out: dict[str, Any] = {}
    last = None
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if eq and (k.strip() in names if names is not None else k.strip().isidentifier()):
            last = k.strip()
            out[last] = v.strip()
        elif last is not None:
            out[last] += "," + part
        else:
            if names is None:
                keys = "a name"
            else:
                keys = "one of " + (", ".join(names) or "(none: this policy takes no options)")
            raise ConfigError(f"batch policy {spec!r}: expected key=value with key {keys}, got {part!r}")
    for k, v in out.items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            pass
    return out


def make_batch_policy(name: str, **options: Any) -> BatchPolicy:
    """A batch policy by name, e.g. `sarathi`; options inline (`adaptive:cost=paper`) or
    as keyword arguments."""
    base, _, rest = str(name).partition(":")
    cls = _lookup(base, "batch")
    if rest.strip():
        inline = _policy_options(cls, rest, name)
        clash = next((k for k in inline if k in options and options[k] != inline[k]), None)
        if clash is not None:  # (the keyword's value ran, while the run's policy name said the other)
            raise ConfigError(
                f"batch policy {name!r}: option {clash!r} is given twice, {inline[clash]!r} inline and "
                f"{options[clash]!r} in policy_options; give it once"
            )
        options = {**inline, **options}
    if not options:
        return cls()
    _check_option_names("batch policy", name, cls, options)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"batch policy {name!r}: {e}") from None


def make_admission_policy(name: str = "fcfs", max_running: int | None = None, **options: Any) -> AdmissionPolicy:
    factory = _lookup(name, "admission")
    if options:
        _check_option_names("admission policy", name, factory, options)
    try:
        policy = factory(**options)
    except TypeError as e:
        raise ConfigError(f"admission policy {name!r}: {e}") from None
    registered = policy_base_name(name, "admission")
    if isinstance(policy, AdmissionPolicy) and "name" not in vars(type(policy)) and "name" not in vars(policy):
        # a class registered without a `name` of its own inherits its base's (AdmissionPolicy's
        # "fcfs"): the run's config and label called it FCFS; it is known by its registered name
        policy.name = registered
    if max_running is not None:
        policy = RunningCap(policy, max_running)
    return policy


def make_scheduler(
    policy: str = "sarathi",
    admission: str = "fcfs",
    b_max: int = 512,
    k_max: int | None = None,
    kv_capacity: int | None = None,
    max_running: int | None = None,
    admission_options: dict | None = None,
    policy_options: dict | None = None,
    **unknown,
) -> Scheduler:
    """Build a scheduler from names, e.g. `make_scheduler("sarathi", b_max=512)`."""
    if unknown:
        raise unknown_name("make_scheduler argument", min(unknown), keyword_names(make_scheduler))
    for arg, value in (("policy", policy), ("admission", admission)):
        if not isinstance(value, str):
            raise ConfigError(f"{arg} must be a policy's name (a string), got {value!r:.60}")
    for arg, value in (("policy_options", policy_options), ("admission_options", admission_options)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{arg} must be a mapping of option names to values, got {value!r:.60}")
    constraints = Constraints(b_max=b_max, k_max=k_max, kv_capacity=kv_capacity)
    return Scheduler(
        make_batch_policy(policy, **(policy_options or {})),
        make_admission_policy(admission, max_running, **(admission_options or {})),
        constraints,
    )


def list_policies() -> list[tuple[str, str, str]]:
    """(kind, name, one-line summary) of every registered policy."""
    rows = [("batch", n, c.summary) for n, c in BATCH_POLICIES.items()]
    for n, f in ADMISSION_POLICIES.items():
        rows.append(("admission", n, getattr(f, "summary", "")))
    return rows


__all__ = [
    "admission_takes",
    "paced_by_slo",
    "takes_option",
    "AdmissionPolicy",
    "BatchPolicy",
    "Planner",
    "Scheduler",
    "BATCH_POLICIES",
    "ADMISSION_POLICIES",
    "canonical_policy_name",
    "admission_holds_back",
    "admission_limits",
    "batch_holds_back",
    "is_throughput_optimal",
    "policy_capacity",
    "scheduler_policy_capacity",
    "make_batch_policy",
    "make_admission_policy",
    "make_scheduler",
    "list_policies",
    "register_batch_policy",
    "register_admission_policy",
    "FasterTransformer",
    "VanillaVLLM",
    "Orca",
    "Sarathi",
    "KFCFS",
    "Adaptive",
    "FCFS",
    "ShortestPromptFirst",
    "RunningCap",
    "TWP",
    "DynamicBatch",
]
