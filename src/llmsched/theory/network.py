"""Traffic equations and capacity of a network of LLM servers (no simulation).

`traffic(spec)` solves the traffic equations of a `NetworkSpec`
(`llmsched.workload.network`; `docs/networks.md` explains the model and the output):

Visits. For a job type with arrival rate `lambda`, the expected number of visits of each
call class per job is: a call 1; a sequence the sum over its nodes; a fork the sum over
its branches (every branch runs); a loop with `times: n` n times its body; a loop with
`repeat_prob: p` `E[N] = 1/(1-p)` times its body (N, the number of passes, is geometric
on {1, 2, ...}). The visit rate of (server, class) is `lambda` times its visits.

Work. A call with prompt P (new tokens) and output O needs `P + O - 1` tokens of work
(README "The model"); with `context: true` its prompt also holds the context C the job
has accumulated on its execution path (the new prompts and outputs of the earlier calls
on that path), recomputed in full, so its work is `C + P + O - 1`; a job type's
`system_prompt: S` adds S to every call's prompt and work (not to the context). With
`cached: true` the context (and S) arrives with its KV computed: in the prompt the server
holds, not in its work. Prefix caching is not counted: a cache hit saves prefill that
these equations still count, so with `prefix_caching` on a server's utilisation here is
an upper bound (the simulator measures the hits; the report says so in `notes`). Its
`least_utilisation` is the lower bound: the server's mix with every token a cache could
serve (S and the resent context of each call prefilling them) moved from work to the
cached prompt, its capacity recomputed.

Context, exactly. Every route fragment F is summarised, for an entering context of 0, by
- per (server, class): expected visits `v`, visits of context calls `vc`, the expected
  sum of the context over those visits `sc`, expected new prompt tokens `p` and output
  tokens `o` summed over the visits; `vk`, `sk` as `vc`, `sc` for `cached: true` calls;
- `d`: the expected context F adds (new prompts + outputs of its calls).
Lengths, delays and loop counts are independent of the context, so entering F with
context c (random, independent of F) adds `vc * E[c]` to `sc`, `vk * E[c]` to `sk` and
nothing else. Then (`sk` follows `sc`'s rules):
- call: `v = 1`, `vc = [context, not cached]`, `vk = [cached]`, `sc = sk = 0`,
  `p = E[P]`, `o = E[O]`, `d = E[P] + E[O]`;
- sequence F1, F2, ...: Fj enters with the expected context `d1 + ... + d(j-1)`;
- fork: every branch enters with the fork's context; `d` is the sum of the branches'
  (after the join the context is the fork's plus every branch's additions);
- loop with N passes (independent of the body): pass i (0-based) enters with the sum of
  i independent copies of the body's addition, so `v, vc, p, o, d` scale by `E[N]` and
  `sc -> E[N] sc + E[N(N-1)/2] vc d_body`, with `E[N(N-1)/2] = n(n-1)/2` for `times: n`
  and `p/(1-p)^2` for `repeat_prob: p`.
The recursion is exact for any nesting of sequences, forks and loops (it only needs first
moments, because every product it meets is of independent factors).

Length-law means: `LengthLaw.expected()`, exact for const, uniform, geometric (with or
without `max`) and empirical laws, and for lognormal laws the mean of the rounded law
clipped to >= 1 and to `max` (a sum over integers and a closed-form tail).

Capacity per server (theorem 2, paper 1, per replica): one replica serves at most
`b_max / t(b_max)` tokens/s (`theory.bounds.token_capacity`). A replica's capacity for
the server's mix is one server's (`theory.bounds.capacity` with the server's per-call
means): a `k_max >= b_max` cannot bind; for a load-only cost model whose b / t(b) peaks
below b_max the best policy's capacity is the peak's (smaller steps), and
`b_max / t(b_max)` is only what a policy filling every step to b_max (`fill_capacity`)
serves. A router that balances
its replicas (round-robin, jsq, least-tokens, power-of-two, random with equal weights)
gives the pool `replicas` times that; `random` with weights w sends replica j the share
`w_j / sum(w)`, so the pool's capacity is a replica's divided by the largest share (the
busiest replica saturates first). With a `k_max` below `b_max`, the busiest replica's offered (prefill,
decode) token rates are placed in the 2-D region (`core.region.stability_region`) and
the largest scale factor keeping them inside gives the utilisation `1 / scale` and the
effective capacity `offered * scale` for this mix. Context-dependent cost models (the
H200 profile) need representative prompt and output lengths: the server's mean prompt
per call (the whole prompt, a `cached: true` call's handed-over context included: the
steps attend to it) and mean output are used, the cached part counting as no work (as
one server's capacity with prefix-cache hits, `theory.bounds.capacity(cached_prompt=)`).

Utilisation is offered / capacity per server; the bottleneck is the server with the
highest; scaling every arrival rate by `1 / max utilisation` puts the bottleneck exactly
at capacity (`critical_scale`, `critical_rates`).

Stability: some server at or over the best policy's capacity (with prefix caching, even
at its `least_utilisation`): every policy is unstable; a caching server over capacity
only counting every prompt token: `stable` None (and `critical_scale` is the lower end of
the network's limit, `max_critical_scale` the upper, `critical_scale_exact` False);
below it but at or over `fill_capacity`: a policy filling every step to b_max is
unstable there, smaller steps could serve it (`stable` None). With every server below
`fill_capacity`, work-conserving policies are stable when the routes are feed-forward
(the directed graph of server-to-server moves has no cycle through two or more servers;
paper 1, docs/networks.md); a server with calls whose batch policy is not
work-conserving (`BatchPolicy.work_conserving`: FasterTransformer, vanilla vLLM; adaptive
is stable inside the region all the same, `region_stable`) is outside that guarantee
(`stable` None, the verdict names it), and so is a work-conserving one under a `k_max`
below `b_max`: theorem 2 assumes no cap, and with one a policy filling every step can be
unstable strictly inside the region (paper 1; `policies.batch_holds_back`), and so is a
server with a finite `kv_capacity` (a backlog fills its cache and its steps stay short of
the budget). With such a
cycle (Rybko-Stolyar: two job types crossing two servers in opposite orders) every server
below capacity is necessary but not sufficient; priorities can make the network unstable. The report says which case
holds.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..core.constraints import k_max_binds
from ..core.cost import make_cost_model
from ..core.errors import ConfigError
from ..core.guarantee import CAP, COST, FILL, HELD, POLICY, REGION, HoldReason, reasons_text
from ..core.jsonio import to_jsonable
from ..core.length_mix import LengthMix
from ..workload.lengths import LengthLaw, Lognormal, sample_pair
from ..workload.network import Call, Delay, Fork, Loop, NetworkSpec, load_network
from .bounds import capacity, step_time_at_budget, uncapped_capacity

__all__ = [
    "ClassLoad",
    "JobLoad",
    "ServerLoad",
    "TrafficReport",
    "law_mean",
    "network_capacity_report",
    "network_capacity_rows",
    "network_server_rows",
    "route_delay_s",
    "route_moments",
    "traffic",
]


# -------------------------------------------------------------------------- length means
def law_mean(law: LengthLaw) -> float:
    """The exact mean of a length law's samples (see the module docstring)."""
    return float(law.expected())


# -------------------------------------------------------------------------- the recursion
class _Frag:
    """Moments of a route fragment entered with context 0 (module docstring)."""

    __slots__ = ("d", "stats")

    def __init__(self):
        self.stats: dict[tuple[str, str], np.ndarray] = {}  # key -> [v, vc, sc, p, o, vk, sk]
        self.d = 0.0

    def add(self, other: _Frag, shift: float = 0.0, scale: float = 1.0, pairs: float = 0.0) -> None:
        """Add `other` entered with expected context `shift`, repeated `scale` times in
        expectation with `pairs` = E[N(N-1)/2]."""
        for key, st in other.stats.items():
            v, vc, sc, p, o, vk, sk = st
            new = np.array(
                [
                    scale * v,
                    scale * vc,
                    scale * sc + pairs * vc * other.d + scale * vc * shift,
                    scale * p,
                    scale * o,
                    scale * vk,
                    scale * sk + pairs * vk * other.d + scale * vk * shift,
                ]
            )
            cur = self.stats.get(key)
            self.stats[key] = new if cur is None else cur + new
        self.d += scale * other.d


def _fragment(route, system: int = 0) -> _Frag:
    """`system`: the job type's system-prompt tokens, at the head of every call's prompt."""
    out = _Frag()
    for node in route:
        f = _node(node, system)
        out.add(f, shift=out.d)
    return out


def _node(node, system: int = 0) -> _Frag:
    f = _Frag()
    if isinstance(node, Call):
        p, o = law_mean(node.prompt), law_mean(node.output)
        # a cached context is in the KV cache already: it is not work here, but the
        # server's steps still attend to it (vk, sk: the capacity's step times need it)
        resent = node.context and not node.cached
        # the system prompt is prefilled with every call (a handed-over KV cache holds it
        # too), but it is not part of the context the call adds
        own = p + (0 if node.cached else system)
        f.stats[(node.server, node.cls)] = np.array(
            [1.0, 1.0 if resent else 0.0, 0.0, own, o, 1.0 if node.cached else 0.0, 0.0]
        )
        f.d = p + o
    elif isinstance(node, Delay):
        pass
    elif isinstance(node, Fork):
        for branch in node.branches:
            f.add(_fragment(branch, system))
    elif isinstance(node, Loop):
        passes, pairs = _passes(node)
        f.add(_fragment(node.body, system), scale=passes, pairs=pairs)
    else:  # pragma: no cover - NetworkSpec validation rejects other nodes
        raise ConfigError(f"unknown route node {node!r}")
    return f


def _passes(loop: Loop) -> tuple[float, float]:
    """(E[N], E[N(N-1)/2]) of a loop's number of passes N."""
    if loop.times is not None:
        n = float(loop.times)
        return n, n * (n - 1.0) / 2.0
    q = float(loop.repeat_prob)
    return 1.0 / (1.0 - q), q / (1.0 - q) ** 2


def _call_visits(route):
    """(call, its expected visits per job) for every call of a route: each loop around it
    multiplies by its expected passes (the factors `_Frag.add` applies, in its order)."""
    for node in route:
        if isinstance(node, Call):
            yield node, 1.0
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from _call_visits(branch)
        elif isinstance(node, Loop):
            passes = _passes(node)[0]
            for call, v in _call_visits(node.body):
                yield call, passes * v


def route_moments(route, system_prompt: int = 0) -> dict:
    """Per-job expected moments of a route: `{"context_added": d, "classes": {(server,
    class): {"visits", "context_visits", "context_sum", "prompt_new", "output",
    "cached_context_visits", "cached_context_sum"}}}` (sums over the visits of one job;
    context_sum over the visits of context calls that resend it, cached_context_sum over
    those of `cached: true` calls; prompt_new includes the job type's `system_prompt`
    where it is prefilled)."""
    f = _fragment(route, system_prompt)
    names = (
        "visits",
        "context_visits",
        "context_sum",
        "prompt_new",
        "output",
        "cached_context_visits",
        "cached_context_sum",
    )
    return {"context_added": f.d, "classes": {k: dict(zip(names, (float(x) for x in st))) for k, st in f.stats.items()}}


def route_delay_s(route, system_prompt: int = 0) -> float:
    """A job's expected time in the route's delays (think, tool and KV-transfer time, which
    occupy no server), its branches' added up as `route_moments` adds their visits (an
    upper bound for a fork's, whose branches wait in parallel): a delay its law's mean, a
    `per_token` one its seconds per token times the job's expected context there (with its
    system prompt), a loop its body's times its expected passes (a later pass enters with
    the earlier passes' context: `E[N(N-1)/2]`, as in the module docstring's recursion)."""
    return _delays(route, system_prompt)[0]


def _delays(route, system: int) -> tuple[float, float, float]:
    """(expected delay entering with context 0, its growth per token of entering context,
    the context the fragment adds) of a route fragment."""
    t = k = d = 0.0
    for node in route:
        nt, nk, nd = _delay_node(node, system)
        t, k, d = t + nt + nk * d, k + nk, d + nd
    return t, k, d


def _delay_node(node, system: int) -> tuple[float, float, float]:
    if isinstance(node, Call):
        return 0.0, 0.0, law_mean(node.prompt) + law_mean(node.output)
    if isinstance(node, Delay):
        law = node.law
        return (law.mean * system, law.mean, 0.0) if law.kind == "per_token" else (law.expected(), 0.0, 0.0)
    if isinstance(node, Fork):
        parts = [_delays(branch, system) for branch in node.branches]
        return tuple(float(sum(x)) for x in zip(*parts)) if parts else (0.0, 0.0, 0.0)
    if isinstance(node, Loop):
        passes, pairs = _passes(node)
        t, k, d = _delays(node.body, system)
        return passes * t + pairs * k * d, passes * k, passes * d
    raise ConfigError(f"unknown route node {node!r}")  # pragma: no cover - NetworkSpec validation rejects others


# -------------------------------------------------------------------------- report types
@dataclass
class ClassLoad:
    """One call class at one server. Per-visit means are over all of the class's visits
    (`mean_prompt` is the whole prompt, as `calls.csv` counts it: system prompt, context
    and new tokens; `mean_context` is the context per visit, 0 for calls without context;
    `mean_cached_prompt` the prompt tokens whose KV arrives computed with `cached: true`, the
    context and the system prompt, held in the KV cache but not work)."""

    server: str
    cls: str
    jobs: list
    visits_per_job: dict
    visit_rate: float
    mean_context: float
    mean_prompt: float
    mean_cached_prompt: float
    mean_output: float
    work_per_visit: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    offered_tokens_per_s: float


@dataclass
class ServerLoad:
    """One server (a pool of replicas). Token rates in tokens/s.

    `replica_token_capacity`: theorem 2's `b_max / t(b_max)` of one replica;
    `token_capacity`: the pool's theorem-2 capacity (`replica_token_capacity /
    busiest_replica_share`); `capacity`: the best policy's effective capacity for this
    server's mix, by one server's rules (`theory.bounds.capacity`): `token_capacity`
    without a binding `k_max` (a `k_max >= b_max` cannot bind), from the 2-D region with
    one; for a load-only cost model whose b / t(b) peaks below b_max (`peak_token_capacity`
    at `peak_load`; theorem 2's assumption fails) the peak's, which smaller steps reach;
    `utilisation`: offered / capacity; `max_scale`: 1 / utilisation (how far every
    arrival rate could be scaled before this server saturates; inf when idle).
    `fill_capacity`: `min(capacity, token_capacity)` (one server's
    `CapacityReport.fill_capacity`, scaled like `capacity`): without a binding k_max, what
    a policy filling every step to b_max (a work-conserving one) serves; with one, no
    policy fills every step and no theorem says what a work-conserving one serves (see
    `CapacityReport.fill_capacity`); `fill_utilisation`: offered / fill_capacity. The two
    differ only where smaller steps (b / t(b) peaking below b_max, a load-only model, cap
    or no cap) serve more than steps at b_max (a context-dependent model's capacity is at
    most C: `CapacityReport.shape_bound_rate`).
    `mean_prompt`: the whole prompt per call, `mean_cached_prompt` the part of it whose
    KV arrives computed (not work). A context-dependent cost model times the steps with
    the contexts of lengths drawn from the server's calls (`contexts` "length mix") unless
    a call resends its job's context ("mean lengths": the means' representative contexts,
    2-8% optimistic when lengths vary; docs/stability.md "Contexts of a full step")."""

    name: str
    replicas: int
    router: str
    busiest_replica_share: float
    b_max: int
    k_max: int | None
    cost_model: str
    visit_rate: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    offered_tokens_per_s: float
    mean_prompt: float | None
    mean_output: float | None
    mean_cached_prompt: float | None
    step_time_at_b_max_s: float
    replica_token_capacity: float
    token_capacity: float
    capacity: float
    utilisation: float
    max_scale: float
    binding: str
    region_exact: bool | None = None
    peak_token_capacity: float | None = None
    peak_load: int | None = None
    fill_capacity: float = math.nan
    fill_utilisation: float = math.nan
    # how the steps were timed: "load" (a load-only model), "length mix" (the contexts of
    # lengths drawn from the server's calls) or "mean lengths" (the means' contexts: a call
    # resends its job's context, or no traffic)
    contexts: str = "load"
    # with prefix caching, the utilisation if every resent context and system-prompt token
    # hit (the most hits can save; a lower bound); `utilisation` without caching
    least_utilisation: float = math.nan


@dataclass
class JobLoad:
    """One job type: per-job expected calls, visits per class and tokens of work."""

    name: str
    rate: float
    calls_per_job: float
    visits: dict
    prefill_tokens_per_job: float
    decode_tokens_per_job: float
    work_per_job: float
    context_added_per_job: float
    critical_rate: float = math.nan


@dataclass
class TrafficReport:
    """What `traffic(spec)` returns. `bottleneck`: the server with the highest
    utilisation; `critical_scale`: 1 / max utilisation; `critical_rates`: every job
    type's rate times it (every prompt token counted: with a caching bottleneck
    `critical_scale_exact` is False and `max_critical_scale`, 1 / the highest
    `least_utilisation`, the most hits could raise it to); `stable`: True (every server below its `fill_capacity`,
    feed-forward routes, every server with calls running adaptive or a work-conserving
    policy without a k_max below b_max, with an admission that only orders its queue, and
    no back-pressure control),
    False (some server at or over its `capacity`, the best policy's; a caching one even at
    its `least_utilisation`) or None (a caching server over capacity counting every
    prompt token only; or below
    capacity but the routes have a cycle through servers: `cycle`; or some server at or
    over its `fill_capacity` but below its `capacity`: a policy filling every step to
    b_max is unstable there, smaller steps could serve it; or feed-forward and below
    capacity but some server may leave budget idle while work waits (a batch policy that
    is not work-conserving nor adaptive, a pacing or capping admission, `max_running`,
    a `kv_capacity`, back-pressure) or runs a work-conserving policy under a binding k_max, which the
    guarantee does not cover: `not_throughput_optimal`, server
    name -> what does it (`_holds_back`), lists every such server with calls whatever the
    verdict);
    `verdict`: that in words."""

    servers: list
    classes: list
    jobs: list
    bottleneck: str
    max_utilisation: float
    critical_scale: float
    critical_rates: dict
    offered_tokens_per_s: float
    feedforward: bool
    cycle: list | None
    stable: bool | None
    verdict: str
    notes: list = field(default_factory=list)
    not_throughput_optimal: dict = field(default_factory=dict)
    max_critical_scale: float = math.nan
    critical_scale_exact: bool = True

    def server(self, name: str) -> ServerLoad:
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    def job(self, name: str) -> JobLoad:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)

    def class_load(self, server: str, cls: str) -> ClassLoad:
        for c in self.classes:
            if c.server == server and c.cls == cls:
                return c
        raise KeyError((server, cls))

    def to_dict(self) -> dict:
        """JSON-ready (infinities and NaN become null)."""
        return to_jsonable(asdict(self))

    def rows(self) -> list[tuple[str, ...]]:
        """A table, header first: one row per server (`network_server_rows`)."""
        return network_server_rows(self.to_dict())

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows of the network's verdict (`network_capacity_rows`)."""
        return network_capacity_rows(self.to_dict())


# -------------------------------------------------------------------------- the solver
def traffic(spec) -> TrafficReport:
    """Traffic equations, per-server load against capacity, bottleneck and the critical
    scaling of a network (`spec`: a NetworkSpec, a mapping of the YAML form or a path)."""
    spec = load_network(spec)
    per_class: dict[tuple[str, str], dict] = {}
    jobs: list[JobLoad] = []
    for job in spec.jobs:
        frag = _fragment(job.route, job.system_prompt)
        rate = float(job.arrival.rate)
        visits: dict[str, float] = {}
        pre = dec = calls = 0.0
        for (server, cls), st in frag.stats.items():
            v, vc, sc, p, o, vk, sk = (float(x) for x in st)  # plain floats: the report prints them
            visits[cls] = visits.get(cls, 0.0) + v
            calls += v
            pre += p + sc
            dec += o - v
            acc = per_class.setdefault(
                (server, cls),
                {
                    "jobs": [],
                    "visits_per_job": {},
                    "rate": 0.0,
                    "ctx": 0.0,
                    "prefill": 0.0,
                    "output": 0.0,
                    "cached": 0.0,
                    "hittable": 0.0,
                },
            )
            acc["jobs"].append(job.name)
            acc["visits_per_job"][job.name] = float(v)
            acc["rate"] += rate * v
            acc["ctx"] += rate * (sc + sk)
            acc["prefill"] += rate * (p + sc)
            acc["output"] += rate * o
            # a handed-over KV cache holds the system prompt too (_node leaves it out of p)
            acc["cached"] += rate * (sk + job.system_prompt * vk)
            # what a prefix cache could at most save: the resent context and the system
            # prompt prefilled with every visit (a call's new prompt and output are its own)
            acc["hittable"] += rate * (sc + job.system_prompt * (v - vk))
        jobs.append(
            JobLoad(
                name=job.name,
                rate=rate,
                calls_per_job=float(calls),
                visits=visits,
                prefill_tokens_per_job=float(pre),
                decode_tokens_per_job=float(dec),
                work_per_job=float(pre + dec),
                context_added_per_job=float(frag.d),
            )
        )
    classes = []
    for (server, cls), a in per_class.items():
        r = a["rate"]
        decode = a["output"] - r
        classes.append(
            ClassLoad(
                server=server,
                cls=cls,
                jobs=a["jobs"],
                visits_per_job=a["visits_per_job"],
                visit_rate=r,
                mean_context=a["ctx"] / r,
                mean_prompt=(a["prefill"] + a["cached"]) / r,
                mean_cached_prompt=a["cached"] / r,
                mean_output=a["output"] / r,
                work_per_visit=(a["prefill"] + decode) / r,
                prefill_tokens_per_s=a["prefill"],
                decode_tokens_per_s=decode,
                offered_tokens_per_s=a["prefill"] + decode,
            )
        )
    order = {c: i for i, c in enumerate(spec.call_classes())}
    servers_order = {s: i for i, s in enumerate(spec.servers)}
    classes.sort(key=lambda c: (servers_order[c.server], order.get(c.cls, 0)))
    servers = []
    for name, s in spec.servers.items():
        mix = functools.cache(lambda name=name: _server_mix(spec, name))
        largest = _server_largest_prompt(spec, name) if k_max_binds(s.b_max, s.k_max) else None
        own = [c for c in classes if c.server == name]
        load = _server_load(s, own, mix, largest)
        hittable = {c.cls: per_class[(name, c.cls)]["hittable"] for c in own}
        if s.prefix_caching and sum(hittable.values()) > 0:
            load.least_utilisation = _server_load(s, _net_of_every_hit(own, hittable), mix, largest).utilisation
        else:
            load.least_utilisation = load.utilisation
        servers.append(load)
    worst = max(servers, key=lambda s: s.utilisation)
    max_util = worst.utilisation
    scale = 1.0 / max_util if max_util > 0 else math.inf
    surest = max(servers, key=lambda s: s.least_utilisation)
    least_util = surest.least_utilisation
    max_scale = 1.0 / least_util if least_util > 0 else math.inf
    for j in jobs:
        j.critical_rate = j.rate * scale
    cycle = _server_cycle(spec)
    # a server without calls needs no guarantee
    busy = {s.name for s in servers if s.visit_rate > 0}
    held_back = {n: why for n, s in spec.servers.items() if n in busy and (why := _holds_back(s, spec.control))}
    notes = []
    # a load-only cost model whose b / t(b) peaks below b_max: `capacity` is the best
    # policy's (smaller steps), `fill_capacity` what a policy filling every step to b_max
    # (a work-conserving one) serves; "every policy" is said only against the first,
    # "stable under work-conserving policies" only against the second, and never for a
    # server with a binding k_max (`not_conserving` names it)
    filler = max(servers, key=lambda s: s.fill_utilisation)
    if least_util >= 1.0:
        net = (
            f", {least_util:.1%} even if every resent context and system-prompt token hit its prefix cache"
            if least_util < surest.utilisation
            else ""
        )
        stable, verdict = (
            False,
            (
                f"unstable: server {surest.name} is offered {surest.utilisation:.1%} of its "
                f"capacity{net} (every policy's backlog grows there)"
            ),
        )
    elif max_util >= 1.0:
        # only caching servers can be here: their hits may bring the load under capacity
        stable, verdict = (
            None,
            (
                f"server {worst.name} is offered {max_util:.1%} of its capacity counting every prompt token, "
                f"{worst.least_utilisation:.1%} if every resent context and system-prompt token hit its prefix "
                "cache: stable only if the hits save enough; check by simulation"
            ),
        )
    elif filler.fill_utilisation >= 1.0:
        stable, verdict = (
            None,
            (
                f"server {filler.name} is offered {filler.fill_utilisation:.1%} of what a policy filling every "
                f"step to b_max serves ({filler.fill_capacity:,.1f} tokens/s): such a policy (a work-conserving "
                f"one, e.g. sarathi) is unstable there, but {_other_steps(filler)} serve up to "
                f"{filler.capacity:,.1f} tokens/s ({filler.utilisation:.1%} offered): a policy running them could be "
                "stable; check by simulation"
            ),
        )
    elif cycle is None and held_back:
        stable, verdict = (
            None,
            (
                "every server is below capacity and the routes are feed-forward, which makes work-conserving "
                f"policies stable, but {_named_policies(held_back)}: the guarantee does not apply; "
                "check by simulation"
            ),
        )
    elif cycle is None:
        stable, verdict = (
            True,
            ("stable under work-conserving policies: every server is below capacity and the routes are feed-forward"),
        )
    else:
        stable, verdict = (
            None,
            (
                f"every server is below capacity, but routes cycle through servers "
                f"({' -> '.join(cycle)}): stability depends on the policies and "
                "priorities (Rybko-Stolyar); check by simulation"
            ),
        )
    for s in servers:
        if s.peak_token_capacity is not None and s.peak_token_capacity > s.replica_token_capacity * (1 + 1e-9):
            notes.append(
                f"server {s.name}: b/t(b) peaks below b_max (peak b/t(b) "
                f"{s.peak_token_capacity:,.1f} tokens/s at b = {s.peak_load} > b_max/t(b_max)); theorem 2's "
                "capacity is not the largest a policy can reach: a policy filling every step to b_max "
                f"serves {s.fill_capacity:,.1f} tokens/s here ({s.fill_utilisation:.1%} offered), "
                f"the best policy {s.capacity:,.1f}"
            )
    for name, s in spec.servers.items():
        if s.kv_capacity is not None:
            notes.append(
                f"server {name}: kv_capacity is not part of the capacity (calls longer than it "
                "never complete; preemptions add recompute work)"
            )
    for load in servers:
        if spec.servers[load.name].prefix_caching:
            notes.append(
                f"server {load.name}: prefix caching is on; every prompt token counts as work here (hits "
                "save prefill), so its utilisation is an upper bound (the simulator measures the hits); "
                f"{load.least_utilisation:.1%} if every resent context and system-prompt token hit (a lower bound)"
            )
    scale_exact = not max_scale > scale * (1 + 1e-9)
    if not scale_exact:
        notes.append(
            f"critical scale {scale:.4g} puts the bottleneck at capacity counting every prompt token: prefix-cache "
            f"hits can raise it, up to {max_scale:.4g} if every resent context and system-prompt token hit"
        )
    if any(isinstance(c.prompt, Lognormal) or isinstance(c.output, Lognormal) for j in spec.jobs for c in j.calls()):
        notes.append("lognormal lengths: means of the rounded, clipped laws (exact up to 1e-6 tokens)")
    return TrafficReport(
        servers=servers,
        classes=classes,
        jobs=jobs,
        bottleneck=worst.name,
        max_utilisation=max_util,
        critical_scale=scale,
        critical_rates={j.name: j.critical_rate for j in jobs},
        max_critical_scale=max_scale,
        critical_scale_exact=scale_exact,
        offered_tokens_per_s=float(sum(s.offered_tokens_per_s for s in servers)),
        feedforward=cycle is None,
        cycle=cycle,
        stable=stable,
        verdict=verdict,
        notes=notes,
        not_throughput_optimal={n: reasons_text(why) for n, why in held_back.items()},
    )


#: lengths sampled per server for its `LengthMix`
MIX_SAMPLES = 20_000


def _holds_back(server, control: str) -> list[HoldReason]:
    """What may leave the server's budget idle while work waits, for `not_throughput_optimal`:
    its batch policy's name when that is neither work-conserving nor adaptive, a binding
    k_max (`batch_holds_back`), an admission that paces or caps (`twp admission`,
    `max_running 4`: `admission_holds_back`), a finite KV capacity (`kv_capacity 8000`: a
    backlog's calls fill the cache, steps stay short of the budget; Sarathi, b_max 512,
    prompts geometric:1000, outputs geometric:500, kv_capacity 8000, 1.1 jobs/s at 48% of
    its capacity served 0.187 jobs/s), back-pressure control (a replica takes buffered
    calls one class at a time); [] when nothing does.

    No `peak_load` is given to `batch_holds_back`, so no reason of kind FILL: the verdict
    already judges a server against its full steps' capacity (`fill_utilisation`, what a
    policy filling every step to b_max serves), and a FILL reason would withdraw its
    'stable' where the load lies below that capacity, which the guarantee covers."""
    from ..policies import admission_holds_back, batch_holds_back  # noqa: PLC0415 - the registry imports every policy

    why = batch_holds_back(
        server.policy, server.b_max, server.k_max, cost_model=server.cost_model, options=server.policy_options
    )
    why += admission_holds_back(server.admission, server.max_running, server.admission_options)
    if server.kv_capacity is not None:
        # a backlog fills the KV cache: steps stay short of the budget while work waits
        # (and preemptions add recompute work), as one server's policy limit treats it
        why.append(HoldReason(HELD, f"kv_capacity {server.kv_capacity}"))
    if control == "backpressure":
        why.append(HoldReason(HELD, "backpressure control"))
    return why


def _named_policies(held_back: dict[str, list[HoldReason]]) -> str:
    """Why the feed-forward guarantee does not apply, each server named with its reasons
    under the kind they are: a batch policy that is not work-conserving (`server x
    (fastertransformer) runs a policy that is not work-conserving ...`), an admission, a
    running cap, a KV capacity or back-pressure that can hold work back (`server x (twp admission) holds
    work back ...`), a binding k_max (`k_max 16 < b_max 512`: a policy filling every step
    can be unstable inside the region, paper 1), full steps that serve less than smaller
    ones (kind FILL: `_holds_back` gives none, but every kind of `HoldReason` is named). A
    server with reasons of several kinds is named under each."""
    kinds: dict[str, dict[str, list[str]]] = {POLICY: {}, HELD: {}, CAP: {}, FILL: {}, REGION: {}, COST: {}}
    for server, why in held_back.items():
        for reason in why:
            kinds[reason.kind].setdefault(server, []).append(reason.text)

    def named(group: dict) -> str:
        return ", ".join(f"{n} ({', '.join(rs)})" for n, rs in group.items())

    def subject(group: dict, one: str, many: str) -> str:
        return f"server {named(group)} {one}" if len(group) == 1 else f"servers {named(group)} {many}"

    parts = []
    if kinds[POLICY]:
        parts.append(
            subject(kinds[POLICY], "runs a policy", "run policies")
            + " that "
            + ("is" if len(kinds[POLICY]) == 1 else "are")
            + " not work-conserving (steps may leave budget idle while work waits)"
        )
    if kinds[HELD]:
        parts.append(
            subject(kinds[HELD], "holds", "hold")
            + " work back (an admission, a running cap, a full KV cache or back-pressure may leave budget idle "
            "while work waits)"
        )
    if kinds[CAP]:
        parts.append(
            subject(kinds[CAP], "caps", "cap")
            + " the requests per step below the token budget, where a policy filling every step can be "
            "unstable inside the region (paper 1)"
        )
    if kinds[FILL]:
        parts.append(
            subject(kinds[FILL], "fills", "fill")
            + " every step to b_max, which serves less than smaller steps: a policy doing so is stable only "
            "below its full steps' capacity"
        )
    if kinds[REGION]:
        parts.append(subject(kinds[REGION], "runs", "run") + " adaptive on a region that is only an upper bound")
    if kinds[COST]:
        parts.append(subject(kinds[COST], "runs", "run") + " adaptive planning with a cost model other than its own")
    return "; ".join(parts)


def _other_steps(s: ServerLoad) -> str:
    """Which steps serve a server more than filling b_max does, for its verdict: smaller
    ones (a load-only model's b / t(b) peaks below b_max) or the region's shapes."""
    if s.peak_load is not None and s.peak_load < s.b_max:
        return f"smaller steps (t(b)/b is least at b = {s.peak_load} < b_max)"
    return f"other step shapes ({s.binding})"


def _server_mix(spec, name: str) -> LengthMix | None:
    """The `LengthMix` of a server's calls, for a context-dependent cost model to time its
    steps with (`theory.bounds.capacity`): each call's prompts (its job type's system
    prompt included) and outputs drawn from its laws (as the simulator draws them: two
    laws on one dataset keep its rows' pairs) in proportion to its visits per job times its
    job type's rate, in a fixed random order. None when a call at the server resends the
    job's context (its prompt depends on the route so far: the means' contexts time it)
    or the server has no traffic."""
    weights = []
    for job in spec.jobs:
        calls = [(c, v) for c, v in _call_visits(job.route) if c.server == name]
        if any(c.context for c, _ in calls):
            return None
        rate = float(job.arrival.rate)
        weights += [(rate * v, c, 0 if c.cached else job.system_prompt) for c, v in calls]
    total = sum(w for w, _, _ in weights)
    if not total > 0:
        return None
    rng = np.random.default_rng(0)
    prompts, outputs = [], []
    for w, call, system in weights:
        n = max(1, round(MIX_SAMPLES * w / total))
        p, o = sample_pair(call.prompt, call.output, rng, rng, n)
        prompts.append(np.asarray(p, dtype=np.int64) + system)
        outputs.append(np.asarray(o, dtype=np.int64))
    order = rng.permutation(sum(len(p) for p in prompts))
    return LengthMix(np.concatenate(prompts)[order], np.concatenate(outputs)[order])


def _server_largest_prompt(spec, name: str) -> int | None:
    """The longest prompt a call at server `name` sends (its job type's system prompt
    included), for the region's cap on a request's prefill per step; None when a law has
    no bound of its own or a call resends the job's context (its prompt grows with the
    route)."""
    longest = 0
    for job in spec.jobs:
        for call, _ in _call_visits(job.route):
            if call.server != name:
                continue
            largest = call.prompt.largest()
            if call.context or largest is None:
                return None
            longest = max(longest, largest + (0 if call.cached else job.system_prompt))
    return longest or None


def _net_of_every_hit(classes: list[ClassLoad], hittable: dict[str, float]) -> list[ClassLoad]:
    """The classes with every token a prefix cache could serve (`hittable`, tokens/s per
    class) moved from prefill work to the cached prompt: the least load hits can leave."""
    out = []
    for c in classes:
        saved = hittable[c.cls]
        out.append(
            replace(
                c,
                mean_cached_prompt=c.mean_cached_prompt + saved / c.visit_rate,
                prefill_tokens_per_s=c.prefill_tokens_per_s - saved,
                offered_tokens_per_s=c.offered_tokens_per_s - saved,
                work_per_visit=c.work_per_visit - saved / c.visit_rate,
            )
        )
    return out


def _server_load(s, classes: list[ClassLoad], mix, largest_prompt: int | None = None) -> ServerLoad:
    """`mix`: a callable giving the server's `LengthMix` or None (called only for a
    context-dependent cost model with traffic); `largest_prompt`: the region's cap on a
    request's prefill per step (`max_prefill_per_request`), under a binding k_max."""
    cost = make_cost_model(s.cost_model)
    rate = sum(c.visit_rate for c in classes)
    pre = sum(c.prefill_tokens_per_s for c in classes)
    dec = sum(c.decode_tokens_per_s for c in classes)
    offered = pre + dec
    # a cached context is not work (pre leaves it out) but the steps attend to it: the
    # step times take the whole prompt, less the cached part as work, as one server's
    # capacity does with prefix-cache hits
    cached = sum(c.mean_cached_prompt * c.visit_rate for c in classes)
    mp = (pre + cached) / rate if rate > 0 else None
    mo = dec / rate + 1.0 if rate > 0 else None
    mc = cached / rate if rate > 0 else None
    share = max(s.routing_weights())
    region_exact = None
    contexts = "load" if cost.load_only else "mean lengths"
    if rate > 0:
        # one replica's capacity for this server's mix, by one server's rules
        # (`theory.bounds.capacity`): the per-call means give the mix (prefill mp - mc,
        # decode mo - 1 tokens per call), so its lambda* scaled by the calls a replica
        # gets is the region's scale of the offered rates; a k_max >= b_max cannot bind;
        # a load-only model whose b / t(b) peaks below b_max is served fastest there (the
        # peak is scanned once, for a load-only model only)
        lengths = None if cost.load_only else mix()
        rep = capacity(
            cost,
            s.b_max,
            mp,
            mo,
            k_max=s.k_max,
            max_prefill_per_request=largest_prompt,
            cached_prompt=mc,
            peak=cost.load_only,
            mix=lengths,
        )
        contexts = rep.contexts
        t_bmax, replica_cap = rep.step_time_at_b_max_s, rep.token_capacity
        pool_cap = replica_cap / share
        region_exact = rep.region_exact
        binding = rep.binding
        peak, peak_b = rep.peak_token_capacity, rep.peak_load
        cap = rep.effective_capacity / share
        # what a policy filling every step to b_max serves: one server's rule
        fill_cap = rep.fill_capacity / share
        util = offered / cap if cap > 0 else math.inf
    else:
        # no traffic: nothing to place in the region (nor means to time a mixed step:
        # t(b_max) is the load's); the best policy's rate is the uncapped one
        # (`capacity`'s rule)
        t_bmax = step_time_at_budget(cost, s.b_max)
        replica_cap = s.b_max / t_bmax
        pool_cap = replica_cap / share
        best, binding, (peak, peak_b) = uncapped_capacity(cost, s.b_max, replica_cap)
        cap = best / share
        fill_cap = min(cap, pool_cap)
        if s.k_max is not None:
            binding += "; no traffic to place in the k_max region"
        util = 0.0
    fill_util = offered / fill_cap if fill_cap > 0 else (0.0 if offered <= 0 else math.inf)
    return ServerLoad(
        name=s.name,
        replicas=s.replicas,
        router=s.router,
        busiest_replica_share=share,
        b_max=s.b_max,
        k_max=s.k_max,
        cost_model=s.cost_model,
        visit_rate=rate,
        prefill_tokens_per_s=pre,
        decode_tokens_per_s=dec,
        offered_tokens_per_s=offered,
        mean_prompt=mp,
        mean_output=mo,
        mean_cached_prompt=mc,
        step_time_at_b_max_s=t_bmax,
        replica_token_capacity=replica_cap,
        token_capacity=pool_cap,
        capacity=cap,
        utilisation=util,
        max_scale=(1.0 / util if util > 0 else math.inf),
        binding=binding,
        region_exact=region_exact,
        peak_token_capacity=peak,
        peak_load=peak_b,
        fill_capacity=fill_cap,
        fill_utilisation=fill_util,
        contexts=contexts,
    )


# -------------------------------------------------------------------------- cycles
def _moves(route, edges: set) -> tuple[set, set, bool]:
    """(servers that can start the fragment, servers that can end it, whether a path
    through it makes no call); adds server-to-server moves to `edges`."""
    first: set = set()
    last: set = set()
    through = True
    for node in route:
        f, l_, t = _node_moves(node, edges)
        for a in last:
            for b in f:
                edges.add((a, b))
        if through:
            first |= f
        last = (last | l_) if t else set(l_)
        through = through and t
    return first, last, through


def _node_moves(node, edges: set) -> tuple[set, set, bool]:
    if isinstance(node, Call):
        return {node.server}, {node.server}, False
    if isinstance(node, Delay):
        return set(), set(), True
    if isinstance(node, Fork):
        # the join waits for every branch: a path through the fork makes no call only
        # when no branch makes one (a delay-only branch leaves no move from the fork's caller)
        first, last, through = set(), set(), True
        for b in node.branches:
            f, l_, t = _moves(b, edges)
            first |= f
            last |= l_
            through = through and t
        return first, last, through
    f, l_, t = _moves(node.body, edges)
    repeats = node.times > 1 if node.times is not None else node.repeat_prob > 0
    if repeats:
        for a in l_:
            for b in f:
                edges.add((a, b))
    return f, l_, t


def _server_cycle(spec: NetworkSpec) -> list | None:
    """A cycle through two or more servers in the graph of moves (as a list of server
    names, first repeated at the end), or None when the routes are feed-forward."""
    edges: set = set()
    for job in spec.jobs:
        _moves(job.route, edges)
    graph: dict[str, list] = {s: [] for s in spec.servers}
    for a, b in sorted(edges):
        if a != b:
            graph[a].append(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for w in graph[u]:
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for s in graph:
        if s not in state:
            found = visit(s)
            if found:
                return found
    return None


# -------------------------------------------------------------------------- CLI helpers
def check_schedulers(spec: NetworkSpec, source=None) -> None:
    """Every server's scheduler builds (its policy and admission names and options): one
    ConfigError naming the server, and the file when `source` is its path. The network's
    own validation cannot build them (policies are a layer it does not import)."""
    from ..policies.spec import SchedulerSpec  # noqa: PLC0415

    for name, s in spec.servers.items():
        try:
            SchedulerSpec(**s.scheduler_fields()).build()
        except ConfigError as e:
            where = f"{os.path.basename(os.fspath(source))}: " if isinstance(source, (str, os.PathLike)) else ""
            raise ConfigError(f"{where}servers.{name}: {e}") from None


def network_capacity_report(spec_or_path) -> dict:
    """What `llmsched capacity --network FILE` prints, as a JSON-ready dict: the traffic
    report (`TrafficReport.to_dict()`) and `source` (the file, when given a path)."""
    source = str(spec_or_path) if isinstance(spec_or_path, (str, os.PathLike)) else None
    spec = load_network(spec_or_path)
    check_schedulers(spec, spec_or_path)  # as a run of it would: an unknown policy is no report
    rep = traffic(spec).to_dict()
    rep["source"] = source
    return rep


def _num(v, fmt: str = ",.1f") -> str:
    return "-" if v is None else format(v, fmt)


def network_server_rows(rep: dict) -> list[tuple[str, ...]]:
    """A print-ready table of a report dict (`TrafficReport.to_dict()` or
    `network_capacity_report`): a header row, then one row per server."""
    rows = [
        (
            "server",
            "replicas",
            "router",
            "calls/s",
            "offered tok/s",
            "capacity tok/s",
            "utilisation",
            "max scale",
            "binding",
        )
    ]
    for s in rep["servers"]:
        rows.append(
            (
                s["name"] + ("  <- bottleneck" if s["name"] == rep["bottleneck"] else ""),
                str(s["replicas"]),
                s["router"],
                _num(s["visit_rate"], ",.3f"),
                _num(s["offered_tokens_per_s"]),
                _num(s["capacity"]),
                _utilisation_cell(s),
                _num(s["max_scale"], ".4g"),
                s["binding"],
            )
        )
    return rows


def _utilisation_cell(s: dict) -> str:
    """A server's utilisation, and with prefix caching the least its hits can leave."""
    util, least = s["utilisation"], s.get("least_utilisation")
    if util is None or least is None or not least < util:
        return _num(util, ".1%")
    return f"{util:.1%} (>= {least:.1%} net of hits)"


def _critical_scale_cell(rep: dict) -> str:
    scale, most = rep["critical_scale"], rep.get("max_critical_scale")
    if rep.get("critical_scale_exact", True) or most is None:
        return _num(scale, ".4g")
    return f"{scale:.4g} counting every prompt token (up to {most:.4g} with prefix-cache hits)"


def network_capacity_rows(rep: dict) -> list[tuple[str, str]]:
    """Print-ready (label, value) rows of a report dict: the verdict, the bottleneck, the
    critical rates and per-job expected work."""
    rows = [
        ("source", rep.get("source") or "-"),
        ("verdict", rep["verdict"]),
        ("bottleneck", f"{rep['bottleneck']} ({_num(rep['max_utilisation'], '.1%')} of capacity)"),
        ("critical scale of all arrival rates", _critical_scale_cell(rep)),
        ("routes", "feed-forward" if rep["feedforward"] else f"cyclic ({' -> '.join(rep['cycle'])})"),
    ]
    for j in rep["jobs"]:
        rows.append(
            (
                f"job {j['name']}: rate / critical rate",
                f"{_num(j['rate'], ',.4g')} / {_num(j['critical_rate'], ',.4g')} jobs/s",
            )
        )
        rows.append(
            (
                f"job {j['name']}: calls, work per job",
                (
                    f"{_num(j['calls_per_job'], ',.3g')} calls, {_num(j['work_per_job'])} tokens "
                    f"({_num(j['prefill_tokens_per_job'])} prefill + {_num(j['decode_tokens_per_job'])} decode)"
                ),
            )
        )
    for n in rep.get("notes", []):
        rows.append(("note", n))
    return rows
