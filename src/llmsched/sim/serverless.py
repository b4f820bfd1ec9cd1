"""The serverless runtime: several models share a pool of GPUs; model instances start cold,
serve, scale out under load and scale to zero.

Every instance is a `ServerSim` (the simulator's one batch loop, fast path included) placed
on one GPU. One event queue orders request arrivals, checkpoint loads, instance starts,
migrations, the batch ends of every instance, keep-alive expiries and plans; between two
events that concern it an instance advances a whole batch of identical steps, and a
request routed to it during a batch shortens the batch to the steps that start before the
request (it joins at the next step boundary), as in the network simulator. Every decision
reads the state at the event's instant (work left counts the steps of a batch done by
then), and events at one instant run in a canonical order, so the fast path equals the
step-by-step path (a property test holds them equal).

At one instant: GPUs freed by migrations, finished checkpoint loads, instances becoming
ready, migration rounds ending, hand-overs falling due, arrivals, batch ends, keep-alive
expiries, then plans.

The platform (docs/serverless.md):
- A request of model m goes to one of m's instances (the router: least-loaded, or
  round-robin in creation order; ready instances first, loading ones only when none is
  ready). With no instance it waits for a cold start, counted in its TTFT.
- Cold start: the instance takes a GPU, then its node loads the checkpoint from the
  fastest tier holding it (host DRAM cache, local SSD, remote store) at that tier's
  bandwidth (one load at a time per node: later loads queue), then `init_s` passes. A load
  from the remote store fills the node's SSD and DRAM, one from the SSD fills DRAM, by kind
  whatever their bandwidths (LRU eviction); a load from a tier refreshes it.
- Scale out: after an arrival, if m's queued work (tokens left of its requests) per
  instance exceeds `scale_out_tokens`, m has fewer than its `max_instances` and a GPU is
  free, one more instance starts. Only free GPUs: scale-out never takes a GPU.
- The run ends at the last completion (or a time limit). After the last completion the
  loads under way, instance starts and keep-alive expiries still run (they bill): an
  instance with a keep-alive stops at its expiry, one kept alive (`never`) at the run's
  end, or at its ready time when it was still starting then ("ready after end").
- Scale to zero: an instance idle for `keep_alive_s` stops and frees its GPU. A model with
  requests and no instance that finds no free GPU takes the GPU of the instance idle for
  longest, or waits for a GPU to free (oldest request first across models).
- ServerlessLLM: placement by least estimated startup (load-queue wait + load time at the
  node's fastest tier, bandwidths times `load_speedup`), and, when no GPU is free or idle,
  live migration: an instance of a model with another ready instance hands its requests
  over and its GPU goes to the model that needs it (a model that found none tries again
  when an instance becomes ready beside another of its model's). Waiting requests move at once; a
  running request with n0 tokens so far keeps decoding at the source while the
  destination recomputes them (`alpha * n0 + beta` s), then the d tokens emitted meanwhile
  (`alpha * d` s); it then leaves the source at a step boundary and decodes on at the
  destination with its KV cache in place (or, without KV room there, recomputes it).
  A model waiting for a victim's GPU takes a GPU that frees or an instance that goes idle
  meanwhile, and calls the migration off: the victim serves on, what it handed over stays
  where it went. An instance with a hand-over in flight to it does not expire and is no
  migration's victim.
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.clock import PAST_CLOCK, to_clock_ns
from ..core.cost import make_cost_model
from ..core.errors import ConfigError
from ..core.request import DECODE, NS, PREFILL, WAITING, Request, check_seconds, clock_ns
from ..core.state import UNLIMITED, ServerState
from ..policies.spec import SchedulerSpec
from ..workload.serverless import ServerlessSpec, make_serverless_requests
from .histogram import GapHistogram
from .server import ServerSim, SimulationStuck
from .simulator import _np

# event kinds, in the order they run at one instant (plans last)
_FREE, _LOADED, _READY, _ROUND, _HAND, _ARRIVE, _END, _EXPIRE, _PLAN = range(9)
LOADING, READY, DRAINING, STOPPED = "loading", "ready", "draining", "stopped"
FIRST_STEPS = 16  # steps of a batch an instance times at first (then twice as many each time)


# ---- hooks on the single-server classes ---------------------------------------------------
class _State(ServerState):
    """A ServerState with the changes a migration makes. Hooks to add to core/state.py:
    `ServerState.remove(r, now)` (a request leaves with its tokens, with or without its
    KV cache) and `ServerState.add(r, recompute=True)` / `add(r, decoding=True)` (it joins
    to recompute its KV cache, or as a decoder with it in place)."""

    def add(self, r: Request) -> None:
        """A request joins the waiting queue in arrival order: one a migration moved here
        goes before the younger requests waiting (arrivals come in order and append)."""
        super().add(r)
        fifo = self.waiting._fifo  # (a keyed queue, such as spf's heap, orders it already)
        if fifo is not None and len(fifo) > 1 and fifo[-2].key > r.key:
            fifo.pop()
            i = len(fifo)
            while i and fifo[i - 1].key > r.key:
                i -= 1
            fifo.insert(i, r)

    def take(self, r: Request, now: int) -> None:
        """Remove `r` (running or waiting), keeping the tokens it emitted; a running request
        loses its KV cache (`prefill_target` becomes prompt + emitted, as after a preemption,
        which this is not: its preemption count is kept)."""
        if r.phase != WAITING:
            pre = r.preemptions
            self._preempt(r, now)
            r.preemptions = pre
        self._forget_completion(r)
        self.waiting.remove(r)
        w = self.work(r)
        self.waiting_tokens -= w
        self.backlog_tokens -= w
        self.pending_prefill -= r.prefill_target

    def take_running(self, r: Request, now: int) -> None:
        """Remove a decoder with its KV cache (a live migration's hand-over, at a step
        boundary): its slots free here, `r.kv` says how many it takes at the destination."""
        self._remove_decoder(r, now)  # (pauses it: `emitted` and `kv` are up to date)
        self._forget_completion(r)
        self.kv_used -= r.kv
        if r.cached is not None:
            self._release_blocks(r)
        del self.running[r.id]
        self.backlog_tokens -= r.output - r.emitted

    def _forget_completion(self, r: Request) -> None:
        """Drop `r`'s completion entries: it runs on at another instance (a migration keeps
        this one decoding), whose activation numbers may repeat the ones here."""
        if any(e[2] is r for e in self._heap):
            self._heap = [e for e in self._heap if e[2] is not r]
            heapq.heapify(self._heap)

    @staticmethod
    def drop_kv(r: Request) -> None:
        """A decoder taken with `take_running` that will recompute its KV cache instead (as
        after a preemption, which this is not: its preemption count is kept)."""
        r.phase = WAITING
        r.prefill_target = r.prompt + r.emitted
        r.prefilled = 0
        r.kv = 0

    def has_room(self, r: Request) -> bool:
        """Room for the KV cache of a decoder taken with `take_running`, and its next token."""
        return self.kv_free > r.kv

    def add_decoder(self, r: Request, now: int) -> None:
        """At a step boundary: a decoder taken with `take_running` joins with its KV cache in
        place, in decode order (arrival, then id). The active decoders after it pause (and
        resume with the next plan, as `begin_step` resumes any), so that the active ones stay
        a prefix of the decode order; it resumes like them, its gap since its last token
        (at the source) counted."""
        pos = bisect_left(self._dec_keys, r.key)
        m = self._m
        while m > pos:
            m -= 1
            self._pause(self._dec[m], now)
        self._m = m
        r.phase = DECODE
        r.active = False
        self._dec.insert(pos, r)
        self._dec_keys.insert(pos, r.key)
        self.running[r.id] = r
        self.kv_used += r.kv
        self.backlog_tokens += r.output - r.emitted

    def queued(self) -> list[tuple[Request, bool]]:
        """The waiting requests in admission order, each with whether it joined with
        `add_recompute`."""
        waiting = self.waiting
        return [(r, waiting.is_preempted(r)) for r in waiting]

    def add_recompute(self, r: Request) -> None:
        """`r` joins at the head of the queue (with preempted requests) to recompute its KV
        cache from its prompt and the tokens it emitted, then decodes on."""
        self.waiting.push_preempted(r)
        w = self.work(r)
        self.backlog_tokens += w
        self.waiting_tokens += w
        self.pending_prefill += r.prefill_target


class _InstanceGaps:
    """An instance's inter-token gaps: they go to its model's histogram (the platform's is
    their merge, at the end), and the instance keeps only their count and sum (its mean
    ITL), read off the histogram's exact integer sums."""

    __slots__ = ("count", "total", "model")

    def __init__(self, model: GapHistogram):
        self.count = 0
        self.total = 0
        self.model = model

    def add_arrays(self, values, weights) -> None:
        model = self.model
        count, total = model.count, model.total
        model.add_arrays(values, weights)
        self.count += model.count - count
        self.total += model.total - total


class _InstanceSim(ServerSim):
    """A ServerSim whose inter-token gaps go to its model's histogram (the platform's is
    their merge, at the end), keeping only their count and sum of its own. Hook to add to
    sim/server.py: an `itl=` argument (any object with `add_arrays`) instead of replacing
    `_itl` here."""

    def __init__(self, scheduler, cost, *, fast: bool, state: ServerState, model_itl: GapHistogram):
        super().__init__(scheduler, cost, fast=fast, state=state)
        # an arrival cuts most batches within a few steps: time them a few at a time
        self.first_steps = FIRST_STEPS
        self.own_itl = self._itl = _InstanceGaps(model_itl)


# ---- the platform's parts -------------------------------------------------------------------
def _instance_id(inst) -> int:
    return inst.id


def _oldest_queued(inst) -> tuple[int, int]:
    """(arrival, id) of the oldest request queued at `inst`."""
    return min(((r.arrival, r.id) for r in inst.sim.state.waiting), default=(inst.created, -1))


def _receives_only_from(inst, victim) -> bool:
    """Every hand-over in flight to `inst` comes from `victim`."""
    if victim is None or not victim.moving:
        return False
    return sum(1 for e in victim.moving.values() if e[1] is inst) == inst.receiving


class _Node:
    __slots__ = ("busy_until", "current", "gpus", "group", "index", "name", "queue", "tiers")

    def __init__(self, index: int, group, name: str):
        self.index = index
        self.group = group
        self.name = name
        self.gpus: list[_Gpu] = []
        # checkpoint caches: name -> size (GB), least recently used first
        self.tiers = {
            "dram": OrderedDict((m, 0.0) for m in group.dram),
            "ssd": OrderedDict((m, 0.0) for m in group.ssd),
        }
        self.queue: deque = deque()  # instances waiting for this node's loader
        self.current = None  # the instance whose checkpoint is being loaded
        self.busy_until = 0  # end of the current load


class _Gpu:
    __slots__ = ("holder", "index", "node", "order", "reserved")

    def __init__(self, order: int, node: _Node, index: int):
        self.order = order
        self.node = node
        self.index = index
        self.holder = None  # the instance on it
        self.reserved = None  # the instance it goes to when a migration frees it

    @property
    def name(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class _Model:
    def __init__(self, index: int, name: str, spec: ServerlessSpec, cost):
        self.index = index
        self.name = name
        self.spec = spec.models[name]
        self.cost = cost
        self.admission = spec.admission(name)
        self.max_instances = spec.max_instances(name)
        ka = spec.keep_alive_s(name)
        self.keep_alive = None if math.isinf(ka) else round(ka * NS)
        self.live: list[_Instance] = []  # loading and ready instances, in creation order
        self.ready: list[_Instance] = []  # of those, the ready ones (in creation order too)
        self.instances: list[_Instance] = []
        self.pending: deque = deque()  # (request, recompute) waiting for an instance
        self.rr = -1  # id of the instance the round-robin router served last
        self.itl = GapHistogram()
        self.waiting_for_gpu = False

    def scheduler_spec(self, kv: int | None) -> SchedulerSpec:
        return _scheduler_spec(self.spec, self.admission, kv)

    def build_scheduler(self, kv: int | None):
        """A fresh scheduler for one of its instances, timed by the model's cost model."""
        sched = self.scheduler_spec(kv).build()
        sched.bind_cost_model(self.cost)
        return sched

    def describe_scheduler(self, kv: int | None) -> dict:
        """Its instances' scheduler as a single-server run's config.json records it
        (`Scheduler.describe`), the admission policy's derived constants included (TWP's
        window bounds, DynamicBatch's cap bounds: they follow from the model's b_max, k_max
        and cost model, so every instance has the same); without the KV capacity, which
        is each node group's."""
        sched = self.build_scheduler(kv)
        # a policy derives its constants at its first step's limits: ask them of an idle state
        state = ServerState(sched.constraints, sched.admission.waiting_key())
        sched.admission.token_limit(state)
        sched.admission.batch_limit(state)
        d = sched.describe()
        d.pop("kv_capacity_tokens", None)
        return d


def _scheduler_spec(m, admission: str, kv: int | None) -> SchedulerSpec:
    """The scheduler of an instance of model `m` (a ModelSpec) with `kv` KV tokens."""
    return SchedulerSpec(
        policy=m.policy,
        admission=admission,
        b_max=m.b_max,
        k_max=m.k_max,
        kv_capacity=kv,
        policy_options=dict(m.policy_options),
        admission_options=m.options_for(admission),
    )


def check_schedulers(spec: ServerlessSpec) -> None:
    """Every model's scheduler builds, on every node group that fits it (its KV capacity
    differs): one ConfigError naming the model. The spec's own validation cannot build
    them (policies are a layer it does not import), so the runtime and
    `simulate_serverless` check here, before any request is made."""
    for name, m in spec.models.items():
        using = spec.admission(name)
        # the options given for another policy too: a file that switches policy (with
        # --platform-scheduler) must not find them broken only then
        others = [a for a in m.keyed_admissions() if a != using]
        for g in spec.nodes:
            if spec.fits(name, g):
                kv = spec.kv_capacity(name, g)
                for admission in (using, *others):
                    try:
                        _scheduler_spec(m, admission, kv).build()
                    except ConfigError as e:
                        where = (
                            f"models.{name}" if admission == using else f"models.{name}.admission_options.{admission}"
                        )
                        raise ConfigError(f"{where}: {e}") from None


class _Instance:
    __slots__ = (
        "completed",
        "created",
        "gpu",
        "gpu_from",
        "id",
        "idle_since",
        "idle_ver",
        "incoming",
        "joined",
        "load_start",
        "loaded_at",
        "migrated_out",
        "model",
        "moving",
        "planned",
        "ready_at",
        "receiving",
        "routed",
        "sim",
        "state",
        "stop_at",
        "stop_reason",
        "tier",
        "version",
    )

    def __init__(self, id: int, model: _Model, gpu: _Gpu, sim: ServerSim, t: int):
        self.id = id
        self.model = model
        self.gpu = gpu
        self.sim = sim
        self.state = LOADING
        self.version = 0
        self.planned = False
        self.idle_ver = 0
        self.idle_since = -1  # >= 0 while idle and ready
        self.created = t
        self.gpu_from = -1  # holds its GPU from here (GPU-seconds)
        self.load_start = self.loaded_at = self.ready_at = self.stop_at = -1
        self.tier = ""
        self.stop_reason = ""
        self.routed = 0
        self.completed = 0
        self.migrated_out = 0
        # a migration's victim: None until its first step boundary (then it hands over), and
        # then request id -> [request, destination, n0, d, due] of each running request
        self.moving: dict | None = None
        self.receiving = 0  # hand-overs in flight to this instance (it does not expire meanwhile)
        # decoders handed over to this instance during a batch: they join at its end
        self.incoming: list[Request] = []
        # requests added to its queue during the batch in progress (at once, where one server
        # adds them at the batch's end): left out of the queue its policy's feedback sees
        self.joined: list[Request] = []


@dataclass
class ServerlessStats:
    """Everything the serverless runtime measures (per request, per instance, per model)."""

    spec: ServerlessSpec
    models: list[str]
    req_model: np.ndarray
    arrival_ns: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    instance: np.ndarray  # instance that finished it (last one it was on), -1: none
    queue_ns: np.ndarray
    ttft_ns: np.ndarray
    e2e_ns: np.ndarray
    tokens: np.ndarray  # output tokens it received (at its finish)
    preemptions: np.ndarray
    migrations: np.ndarray
    cold: np.ndarray  # 1: it waited for a cold start
    arrived: np.ndarray  # True: it arrived before the run stopped (a max_time_s stop)
    instances: list[dict] = field(default_factory=list)
    model_itl: dict = field(default_factory=dict)
    schedulers: dict = field(default_factory=dict)  # model -> its instances' scheduler (`describe_scheduler`)
    itl: GapHistogram | None = None
    end_ns: int = 0
    steps: int = 0
    migrated_tokens: int = 0
    peak_gpus: int = 0


# ---- the runtime --------------------------------------------------------------------------------
class _Runtime:
    def __init__(self, spec: ServerlessSpec, fast: bool, max_time: int):
        self.spec = spec
        self.fast = fast
        self.max_time = max_time
        p = spec.platform
        self.sllm = p.scheduler == "serverlessllm"
        self.speedup = p.load_speedup if self.sllm else 1.0
        self.migration = self.sllm and p.migration
        self.alpha = p.migration_alpha_s
        self.beta = p.migration_beta_s
        self.init_ns = round(p.init_s * NS)
        self.threshold = p.scale_out_tokens
        self.round_robin = p.routing == "round-robin"
        self.nodes: list[_Node] = []
        self.gpus: list[_Gpu] = []
        for g in spec.nodes:
            for name in g.node_names():
                node = _Node(len(self.nodes), g, name)
                for j in range(g.gpus):
                    gpu = _Gpu(len(self.gpus), node, j)
                    node.gpus.append(gpu)
                    self.gpus.append(gpu)
                self.nodes.append(node)
        self.models = [
            _Model(i, name, spec, make_cost_model(spec.models[name].cost_model)) for i, name in enumerate(spec.models)
        ]
        self.weights = {m.name: m.spec.weights_gb for m in self.models}
        for node in self.nodes:
            for tier in node.tiers.values():
                for name in tier:
                    tier[name] = self.weights[name]
        # (before the run: a cost model a policy cannot derive its constants from fails here)
        self.schedulers = {m.name: m.describe_scheduler(self._any_kv(m.name)) for m in self.models}
        self.n_gpus = len(self.gpus)
        self.instances: list[_Instance] = []
        self.events: list[tuple] = []
        self.seq = itertools.count(1)  # queue order of events at one instant of one kind and tie
        self.waiting_models: list[_Model] = []
        self.awaiting: list[_Instance] = []  # new instances waiting for a migration's victim's GPU
        # the instance whose batch end or plan is being handled (-1: another event), which a
        # migration decided then needs to act as the step-by-step path does
        self.acting = -1
        self.gpus_in_use = 0
        self.peak_gpus = 0
        self.migrated_tokens = 0

    def _any_kv(self, name: str) -> int | None:
        """The KV capacity of the model on the first node group that fits it."""
        spec = self.spec
        return next(spec.kv_capacity(name, g) for g in spec.nodes if spec.fits(name, g))

    # ---- events ------------------------------------------------------------------------------
    def push(self, t: int, kind: int, tie: int, a, b=None) -> None:
        """Events at one instant run by kind, then by `tie` (an instance's or a request's
        number, so the order does not depend on when they were queued), then in queue order."""
        if t >= UNLIMITED:
            # the loop's clock ends there (it marks "no more arrivals"): a later event would
            # never run and the loop would spin on the end marker
            raise ConfigError(
                f"serverless: an event falls at {t / NS:.4g} s of simulated time, {PAST_CLOCK}; "
                "shorten the platform's times (keep_alive_s, init_s, bandwidths)"
            )
        heapq.heappush(self.events, (t, kind, tie, next(self.seq), a, b))

    # ---- work and routing --------------------------------------------------------------------
    def route(self, model: _Model, t: int) -> _Instance | None:
        cands = model.ready or model.live
        if self.round_robin and cands:
            # the next instance in creation order (both lists are in id order) after the
            # one served last (an index into `cands`, whose length changes, repeated
            # instances when one became ready)
            i = bisect_right(cands, model.rr, key=_instance_id)
            inst = cands[i] if i < len(cands) else cands[0]
            model.rr = inst.id
            return inst
        if len(cands) <= 1:
            return cands[0] if cands else None
        # the least unfinished work, then the oldest
        best = None
        least = 0
        for i in cands:
            sim = i.sim
            # what is left once the batch ends bounds its work now from below: an instance
            # that cannot beat the best so far needs no count of finished steps
            if best is not None and sim.work_after_batch() >= least:
                continue
            work = sim.unfinished(t)
            if best is None or work < least:
                best, least = i, work
        return best

    def deliver(self, r: Request, model: _Model, t: int, recompute: bool) -> None:
        inst = self.route(model, t)
        if inst is None:
            self.cold[r.id] = 1
            model.pending.append((r, recompute))
            if not model.waiting_for_gpu:
                self.start_from_zero(model, t)
            return
        self.add_to(inst, r, t, recompute)

    def add_to(self, inst: _Instance, r: Request, t: int, recompute: bool) -> None:
        sim = inst.sim
        inst.idle_ver += 1  # cancels a keep-alive expiry
        inst.idle_since = -1
        inst.routed += 1
        if inst.state == LOADING:
            self.cold[r.id] = 1
        if sim.busy_until < 0 and sim.now < t:
            sim.idle_until(t)
        if recompute:
            sim.state.add_recompute(r)
        else:
            sim.state.add(r)
        self.where[r.id] = inst.id
        if inst.state != READY:
            return
        busy_until = sim.busy_until
        if busy_until >= t:  # during a batch
            inst.joined.append(r)
            if sim.batch[0].ignores_waiting:
                return  # the batch's plan never read the queue: it goes on unchanged
        if not self.end_batch_at(inst, t) and busy_until < 0:
            self.plan_soon(inst, t)

    def end_batch_at(self, inst: _Instance, t: int) -> bool:
        """The batch in progress ends at its first step boundary at or after `t` (a batch
        ending at `t` goes no further); False when none goes on past `t`."""
        sim = inst.sim
        if sim.busy_until > t:
            end = sim.truncate(t)
            inst.version += 1
            self.push(end, _END, inst.id, inst, inst.version)
        elif sim.busy_until == t:
            sim.truncate(t)
        else:
            return False
        return True

    def plan_soon(self, inst: _Instance, t: int) -> None:
        """Plan `inst` at `t`, after what else happens then (once)."""
        if not inst.planned:
            inst.planned = True
            self.push(t, _PLAN, inst.id, inst)

    # ---- scaling -----------------------------------------------------------------------------
    def scale_out(self, model: _Model, t: int) -> None:
        live = model.live
        if not live or len(live) >= model.max_instances or self.gpus_in_use >= self.n_gpus:
            return  # (with every GPU held, `place` finds none free)
        bound = self.threshold * len(live)
        work = 0
        for i in live:
            work += i.sim.state.backlog_tokens
        if work <= bound:
            return  # unfinished work is at most the backlog: no need to count finished steps
        work = 0
        for i in live:
            work += i.sim.unfinished(t)
        if work > bound:
            choice = self.place(model, t, from_zero=False)
            if choice is not None:
                self.start(model, choice, t)

    def start_from_zero(self, model: _Model, t: int) -> None:
        choice = self.place(model, t, from_zero=True)
        if choice is None:
            model.waiting_for_gpu = True
            self.waiting_models.append(model)
            return
        self.start(model, choice, t)

    def serve_waiting_models(self, t: int) -> None:
        """Models with requests and no instance, and new instances waiting for a migration's
        victim, oldest request first, take what GPUs they can. A waiting instance takes a
        free GPU or an idle instance's: its migration is called off, and the victim, ready
        again, may be another model's victim (they try again)."""
        while self.waiting_models or self.awaiting:
            waiting = [((m.pending[0][0].arrival, m.pending[0][0].id), m, None) for m in self.waiting_models]
            waiting += [(_oldest_queued(i), i.model, i) for i in self.awaiting]
            waiting.sort(key=lambda w: w[0])
            self.waiting_models = []
            called_off = False
            for _, m, inst in waiting:
                if inst is not None:
                    victim = inst.gpu.holder
                    choice = self.place(m, t, from_zero=True, victim=victim)
                    if choice is not None:
                        self.relocate(inst, victim, choice, t)
                        called_off = True
                    continue
                choice = self.place(m, t, from_zero=True)
                if choice is None:
                    self.waiting_models.append(m)
                    continue
                m.waiting_for_gpu = False
                self.start(m, choice, t)
            if not (called_off and self.waiting_models):
                return

    def fits(self, model: _Model, gpu: _Gpu) -> bool:
        return self.spec.fits(model.name, gpu.node.group)

    def load_time_ns(self, model: _Model, node: _Node) -> int:
        _, bw = self.source(model, node)
        return round(model.spec.weights_gb / (bw * self.speedup) * NS)

    def source(self, model: _Model, node: _Node) -> tuple[str, float]:
        """The fastest tier of `node` holding the model's checkpoint, and its bandwidth (by
        bandwidth, not by kind: a file may give an SSD slower than the remote store)."""
        g = node.group
        best = ("remote", self.spec.remote_bandwidth_gbps)
        for tier, bw in (("dram", g.dram_bandwidth_gbps), ("ssd", g.ssd_bandwidth_gbps)):
            if model.name in node.tiers[tier] and bw > best[1]:
                best = (tier, bw)
        return best

    def startup_estimate(self, model: _Model, node: _Node, t: int, gpu_free_at: int) -> int:
        """ServerlessLLM's estimate: the wait for the node's loader (loads queued before)
        plus this load, from when the GPU is free."""
        free = node.busy_until if node.current is not None else t
        for inst in node.queue:
            free += self.load_time_ns(inst.model, node)
        return max(free, gpu_free_at) - t + self.load_time_ns(model, node)

    def place(self, model: _Model, t: int, from_zero: bool, victim: _Instance | None = None):
        """Where a new instance of `model` goes: ("free", gpu), ("reclaim", idle instance)
        or ("migrate", instance), or None. `victim`: the instance is waiting for that
        migration's victim's GPU; it takes only a free GPU or an idle instance (one with
        hand-overs in flight to it only from that victim counts: they are called off)."""
        free = [g for g in self.gpus if g.holder is None and g.reserved is None and self.fits(model, g)]
        if free:
            if not self.sllm:
                return "free", free[0]
            return "free", min(free, key=lambda g: (self.startup_estimate(model, g.node, t, t), g.order))
        if not from_zero:
            return None
        idle = [
            i
            for m in self.models
            for i in m.ready
            if i.idle_since >= 0 and self.fits(model, i.gpu) and (not i.receiving or _receives_only_from(i, victim))
        ]
        if idle:
            if not self.sllm:
                return "reclaim", min(idle, key=lambda i: (i.idle_since, i.id))
            return "reclaim", min(idle, key=lambda i: (self.startup_estimate(model, i.gpu.node, t, t), i.id))
        if not self.migration or victim is not None:
            return None
        best = None
        for m in self.models:
            ready = m.ready
            if len(ready) < 2:
                continue
            for i in ready:
                if i.receiving or not self.fits(model, i.gpu):
                    continue  # (a hand-over's destination is busy: its stop would send the request to recompute)
                est = self.startup_estimate(model, i.gpu.node, t, t + self.migration_estimate(i, t))
                if best is None or (est, i.id) < best[0]:
                    best = ((est, i.id), i)
        return None if best is None else ("migrate", best[1])

    def migration_estimate(self, inst: _Instance, t: int) -> int:
        """Time to migrate the instance's running requests at `t` (they move in parallel):
        max of alpha * tokens + beta, tokens = prompt + emitted so far."""
        st = inst.sim.state
        batch = inst.sim.batch
        served: set[int] = set()
        completing: set[int] = set()
        done = 0
        if batch is not None and t > batch[1]:
            plan, count = batch[0], batch[2]
            done = inst.sim.steps_done(t)
            if done:
                served = {r.id for r in st.decoders[: plan.decode]}
                if done == count:
                    completing = {r.id for r, c in plan.prefill if r.prefilled + c * count == r.prefill_target}
        longest = 0
        for r in st.running.values():
            n = r.prompt + st.emitted(r) + (done if r.id in served else 0) + (1 if r.id in completing else 0)
            longest = max(longest, n)
        return self.migration_ns(longest) if st.running else 0

    def migration_ns(self, tokens: int) -> int:
        return round((self.alpha * tokens + self.beta) * NS)

    def start(self, model: _Model, choice, t: int) -> _Instance:
        kind, what = choice
        if kind == "free":
            gpu = what
        elif kind == "reclaim":
            self.stop(what, t, "reclaimed")
            gpu = what.gpu
        else:
            gpu = what.gpu
        inst = _Instance(len(self.instances), model, gpu, self.new_sim(model, gpu, t), t)
        self.instances.append(inst)
        model.instances.append(inst)
        model.live.append(inst)
        if kind == "migrate":
            gpu.reserved = inst
            self.awaiting.append(inst)
            self.begin_migration(what, t)
        else:
            self.take_gpu(inst, gpu, t)
        pending = model.pending
        model.pending = deque()
        if pending:
            model.rr = inst.id  # the rotation goes on after the instance that took them
        for r, recompute in pending:
            self.add_to(inst, r, t, recompute)
        return inst

    def new_sim(self, model: _Model, gpu: _Gpu, t: int) -> _InstanceSim:
        """The batch loop of a new instance of `model` on `gpu` (its KV capacity is the
        node group's)."""
        kv = self.spec.kv_capacity(model.name, gpu.node.group)
        sched = model.build_scheduler(kv)
        state = _State(sched.constraints, sched.admission.waiting_key())
        sim = _InstanceSim(sched, model.cost, fast=self.fast, state=state, model_itl=model.itl)
        sim.now = t
        return sim

    def relocate(self, inst: _Instance, victim: _Instance, choice, t: int) -> None:
        """`inst`, waiting for `victim`'s GPU, takes a free GPU or an idle instance's
        instead, and the migration is called off."""
        kind, what = choice
        self.awaiting.remove(inst)
        self.call_off(victim, t)
        if kind == "reclaim":
            self.stop(what, t, "reclaimed")
            gpu = what.gpu
        else:
            gpu = what
        model = inst.model
        if self.spec.kv_capacity(model.name, gpu.node.group) != inst.sim.state.constraints.kv_capacity:
            # another node group: the instance, which has not run, gets that group's KV capacity
            old = inst.sim
            inst.sim = self.new_sim(model, gpu, old.now)
            for r, recompute in old.state.queued():
                if recompute:
                    inst.sim.state.add_recompute(r)
                else:
                    inst.sim.state.add(r)
        inst.gpu = gpu
        self.take_gpu(inst, gpu, t)

    def take_gpu(self, inst: _Instance, gpu: _Gpu, t: int) -> None:
        gpu.holder = inst
        inst.gpu_from = t
        self.gpus_in_use += 1
        self.peak_gpus = max(self.peak_gpus, self.gpus_in_use)
        node = gpu.node
        node.queue.append(inst)
        if node.current is None:
            self.next_load(node, t)

    def next_load(self, node: _Node, t: int) -> None:
        if not node.queue:
            node.current = None
            return
        inst = node.queue.popleft()
        tier, bw = self.source(inst.model, node)
        if tier != "remote":
            node.tiers[tier].move_to_end(inst.model.name)
        d = round(inst.model.spec.weights_gb / (bw * self.speedup) * NS)
        inst.tier = tier
        inst.load_start = t
        node.current = inst
        node.busy_until = t + d
        self.push(t + d, _LOADED, inst.id, inst)

    def fill(self, node: _Node, name: str, source: str) -> None:
        """A load from `source` keeps the checkpoint in the node's local tiers after it, by
        kind whatever their bandwidths (remote: SSD and DRAM; SSD: DRAM; DRAM: none), with
        LRU eviction, as ServerlessLLM caches a loaded checkpoint in host DRAM and SSD."""
        size = self.weights[name]
        for tier in ("ssd", "dram"):
            if tier == source or (tier == "ssd" and source == "dram"):
                continue
            cap = getattr(node.group, f"{tier}_gb")
            held = node.tiers[tier]
            if size > cap + 1e-9:
                continue
            if name in held:
                held.move_to_end(name)
                continue
            while held and sum(held.values()) + size > cap + 1e-9:
                held.popitem(last=False)
            held[name] = size

    def stop(self, inst: _Instance, t: int, reason: str) -> None:
        _ = inst.sim.itl  # flushes its last gaps to the histograms
        inst.state = STOPPED
        inst.stop_at = t
        inst.stop_reason = reason
        inst.idle_ver += 1
        if inst in inst.model.live:
            inst.model.live.remove(inst)
        if inst in inst.model.ready:
            inst.model.ready.remove(inst)
        gpu = inst.gpu
        if gpu.holder is inst:
            gpu.holder = None
            self.gpus_in_use -= 1

    # ---- migration (ServerlessLLM) -----------------------------------------------------------
    def begin_migration(self, victim: _Instance, t: int) -> None:
        """`victim` takes no more requests; its hand-over starts at its next step boundary."""
        victim.state = DRAINING
        victim.model.live.remove(victim)
        victim.model.ready.remove(victim)
        victim.idle_ver += 1
        sim = victim.sim
        if self.acting > victim.id and sim.busy_until > t and sim.steps_done(t - 1) != sim.steps_done(t):
            # a step of the victim's batch ends at t, and the decision comes from a later
            # instance's batch end or plan at t: step by step, the victim's plan at t (its
            # number first) has begun its next step already, which the hand-over waits for
            t += 1
        self.cut(victim, t)

    def call_off(self, victim: _Instance, t: int) -> None:
        """The model waiting for `victim`'s GPU found another: `victim` takes requests again.
        What it handed over stays where it went (waiting requests moved at once included);
        the requests whose hand-over is in flight stay here (their destination drops its
        recompute)."""
        gpu = victim.gpu
        gpu.reserved = None
        victim.state = READY
        model = victim.model
        insort(model.live, victim, key=_instance_id)
        insort(model.ready, victim, key=_instance_id)
        if victim.moving:
            for entry in victim.moving.values():
                self.release(entry, t)
        victim.moving = None
        victim.idle_since = -1
        self.plan_soon(victim, t)  # (its batch, cut for the hand-over, ends at a boundary)

    def release(self, entry: list, t: int) -> None:
        """A hand-over to `entry`'s destination is no longer in flight (done, dropped or
        called off): an idle destination with none left goes idle from now (its keep-alive
        starts then)."""
        dest = entry[1]
        if dest is None:
            return
        dest.receiving -= 1
        if not dest.receiving and dest.state == READY and dest.idle_since >= 0:
            dest.idle_since = -1
            self.plan_soon(dest, t)  # (its plan finds it idle: `go_idle`)

    def cut(self, victim: _Instance, t: int) -> None:
        """The victim's batch ends at its first step boundary at or after `t` (its end
        drains it); without a batch, it drains now."""
        if not self.end_batch_at(victim, t) and self.drain(victim, t):
            self.plan_soon(victim, t)

    def drain(self, victim: _Instance, t: int) -> bool:
        """A migration's victim at a step boundary. The first one starts the hand-over of
        each running request: its destination is chosen now, and it keeps decoding here
        while the destination recomputes its n0 tokens so far (`alpha * n0 + beta`, a
        `_ROUND` event), then the d it emitted meanwhile (`alpha * d`, a `_HAND` event:
        the hand-over falls due and the victim's batch is cut there). At this and every
        later boundary the hand-overs due happen, and waiting requests (preempted ones
        included) move at once. Returns True while requests are left to run here; the GPU
        frees when none is."""
        st = victim.sim.state
        model = victim.model
        moving = victim.moving
        if moving is None:
            moving = victim.moving = {}
            for r in list(st.running.values()):
                n0 = r.prompt + st.emitted(r)
                t1 = t + self.migration_ns(n0)
                if t1 >= UNLIMITED:
                    raise ConfigError(
                        f"platform.serverlessllm: migrating a request of {n0:,} tokens takes "
                        f"{(t1 - t) / NS:.4g} s (alpha_s_per_token * tokens + beta_s), {PAST_CLOCK}; "
                        "lower alpha_s_per_token or beta_s"
                    )
                dest = self.route(model, t)
                if dest is not None:
                    # (a request on its way: the destination does not expire meanwhile)
                    dest.receiving += 1
                    dest.idle_ver += 1
                moving[r.id] = entry = [r, dest, n0, 0, False]
                self.push(t1, _ROUND, r.id, victim, entry)
        else:
            for entry in list(moving.values()):
                r = entry[0]
                if r.id not in st.running:  # finished here (or preempted: it moves below)
                    del moving[r.id]
                    self.release(entry, t)
                elif entry[4]:
                    del moving[r.id]
                    self.hand_over(victim, entry, t)
                    self.release(entry, t)
        for r in list(st.waiting):
            entry = moving.pop(r.id, None)
            if entry is not None:
                self.release(entry, t)
            st.take(r, t)
            victim.migrated_out += 1
            self.deliver(r, model, t, r.emitted > 0)
        if st.is_idle():
            self.push(t, _FREE, victim.id, victim, victim.gpu.reserved)
            return False
        return True

    @staticmethod
    def in_flight(victim: _Instance, entry: list) -> bool:
        """`entry`'s hand-over goes on: its migration was not called off, its request still
        runs at the victim."""
        r = entry[0]
        return victim.moving is not None and victim.moving.get(r.id) is entry and r.id in victim.sim.state.running

    def tokens_at(self, inst: _Instance, r: Request, t: int) -> int:
        """Prompt + tokens `r` emitted at `inst` by `t` (the steps of the batch in progress
        that ended by then counted)."""
        sim = inst.sim
        st = sim.state
        n = r.prompt + st.emitted(r)
        batch = sim.batch
        if batch is not None and t > batch[1]:
            done = sim.steps_done(t)
            if done:
                plan, count = batch[0], batch[2]
                if r.phase == DECODE:
                    if st.decoders_before(r.key) < plan.decode:
                        n += done
                elif r.phase == PREFILL and done == count:
                    for q, c in plan.prefill:
                        if q is r and r.prefilled + c * count == r.prefill_target:
                            n += 1
        return n

    def hand_over(self, victim: _Instance, entry: list, t: int) -> None:
        """At a step boundary of the victim: `r` leaves it for its destination, as a decoder
        with its KV cache computed there (or, still prefilling, or the destination gone, to
        recompute it)."""
        r, dest, n0, d, _ = entry
        st = victim.sim.state
        self.migrations[r.id] += 1
        self.migrated_tokens += n0 + d
        victim.migrated_out += 1
        if r.phase == DECODE:
            st.take_running(r, t)
            if dest is not None and dest.state == READY:
                self.join(dest, r, t)
                return
            st.drop_kv(r)
        else:  # (a prefill in chunks the victim had not finished)
            st.take(r, t)
            if dest is not None and dest.state == READY:
                self.add_to(dest, r, t, True)
                return
        self.deliver(r, victim.model, t, True)

    def join(self, inst: _Instance, r: Request, t: int) -> None:
        """A handed-over decoder joins `inst` at its next step boundary (now, between
        batches; the batch in progress is cut there otherwise)."""
        sim = inst.sim
        inst.idle_ver += 1  # cancels a keep-alive expiry
        inst.idle_since = -1
        inst.routed += 1
        self.where[r.id] = inst.id
        busy_until = sim.busy_until
        if busy_until < 0:
            if sim.now < t:
                sim.idle_until(t)
            if not sim.state.running:
                # nothing decoded here meanwhile: a closed-loop policy's ITL sample must
                # not span the idle time (as after idle time on one server, where a
                # request's prefill comes first)
                sim.scheduler.went_idle()
            self.settle(inst, r, t)
            self.plan_soon(inst, t)
            return
        inst.incoming.append(r)
        if not self.end_batch_at(inst, t):
            sim.truncate(t)

    def end_batch(self, inst: _Instance) -> list[Request]:
        """`inst`'s batch ends (`ServerSim.end`: its feedback to the policy, its finished
        requests). The requests that joined its queue during the batch and wait there still
        are left out of the queue the feedback sees (`ServerState.joining`), as one server,
        the virtual GPU and the engine, which add them at the batch's end, leave them out."""
        state = inst.sim.state
        if inst.joined:
            where, i = self.where, inst.id
            state.joining = sum(1 for r in inst.joined if r.phase == WAITING and where[r.id] == i)
            inst.joined.clear()
        try:
            return inst.sim.end()
        finally:
            state.joining = 0

    def settle(self, inst: _Instance, r: Request, t: int) -> None:
        """At a step boundary of `inst`: a handed-over decoder joins its running requests with
        its KV cache, or, without room for it, the head of its queue to recompute it."""
        st = inst.sim.state
        if st.has_room(r):
            st.add_decoder(r, t)
        else:
            st.drop_kv(r)
            st.add_recompute(r)

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, reqs, progress: Callable[[int, int], None] | None) -> ServerlessStats:
        n = len(reqs)
        arr = to_clock_ns(reqs.arrival_s).tolist()
        prompts = reqs.prompt.tolist()
        outputs = reqs.output.tolist()
        mids = reqs.model.tolist()
        self.where = array("q", [-1]) * n
        self.cold = array("b", [0]) * n
        self.migrations = array("i", [0]) * n
        self.ttft = ttft = array("q", [-1]) * n
        self.e2e = e2e = array("q", [-1]) * n
        self.queue = queue = array("q", [-1]) * n
        self.pre = pre = array("i", [0]) * n
        self.tokens = tokens = array("q", [0]) * n
        models = self.models
        events = self.events
        pop = heapq.heappop
        heappush = heapq.heappush
        seq = self.seq
        max_time = self.max_time
        done = 0
        progress_every = max(1, n // 200)
        # the progress test also notes the last completion (done == n), the run's end, at no
        # cost per event; the keep-alive expiries after it are still simulated (they bill)
        next_progress = min(progress_every, n) if progress is not None else n
        last_done = -1
        now = min(arr[0], max_time) if n else 0  # (a stop before the first arrival ends the clock there)
        ai = 0
        arr.append(UNLIMITED)  # after the last arrival: none
        next_arrival = arr[0]
        deliver = self.deliver
        scale_out = self.scale_out
        while True:
            # the next arrival goes before the queue's head unless that is earlier, or at the
            # same instant of a kind that runs first (no arrival is ever queued)
            if events:
                head = events[0]
                arrives = next_arrival < head[0] or (next_arrival == head[0] and head[1] > _ARRIVE)
            elif next_arrival < UNLIMITED:
                arrives = True
            else:
                break
            if arrives:
                t = next_arrival
                if t >= max_time:
                    ai = n
                    next_arrival = UNLIMITED
                    continue
                now = t
                m = models[mids[ai]]
                r = Request(ai, t, prompts[ai], outputs[ai], m.name)
                ai += 1
                next_arrival = arr[ai]
                deliver(r, m, t, False)
                scale_out(m, t)
                continue
            if head[0] > max_time and done < n:
                # (once every request finished only keep-alive expiries are left: a limit
                # after the run's end changes no bill)
                # a time limit: what happens later is not simulated (a hand-over after it
                # never happens: the request is still at its source)
                now = max_time
                break
            t, kind, _, _, a, b = pop(events)
            now = t
            if kind == _END:
                inst = a
                if b != inst.version:
                    continue
                sim = inst.sim
                if sim.extendable:  # nothing joined: the batch goes on, timed further
                    heappush(events, (sim.extend(), _END, inst.id, next(seq), inst, b))
                    continue
                finished = self.end_batch(inst)
                if finished:
                    self.record_finished(inst, finished)
                    done += len(finished)
                    if done >= next_progress:
                        if done == n:
                            last_done = t  # the run's end: every request has finished
                            next_progress = UNLIMITED
                        else:
                            progress(done, n)
                            next_progress = min(done + progress_every, n)
                if inst.incoming:  # decoders handed over during the batch join now
                    for r in inst.incoming:
                        self.settle(inst, r, t)
                    inst.incoming = []
                if inst.state != READY and (inst.state != DRAINING or not self.drain(inst, t)):
                    continue
                if (events and events[0][0] <= t) or next_arrival <= t:
                    inst.planned = True  # plan after what else happens at t
                    heappush(events, (t, _PLAN, inst.id, next(seq), inst, None))
                    continue
                self.plan_acting(inst, t)  # nothing else happens at t: plan now
            elif kind == _PLAN:
                a.planned = False
                self.plan_acting(a, t)
            elif kind == _LOADED:
                inst = a
                node = inst.gpu.node
                inst.loaded_at = t
                self.fill(node, inst.model.name, inst.tier)
                self.push(t + self.init_ns, _READY, inst.id, inst)
                self.next_load(node, t)
            elif kind == _READY:
                inst = a
                inst.state = READY
                inst.ready_at = t
                insort(inst.model.ready, inst, key=_instance_id)
                if inst.sim.is_idle():
                    self.go_idle(inst, t)
                else:
                    inst.planned = True
                    self.push(t, _PLAN, inst.id, inst)
                    if self.migration and self.waiting_models and len(inst.model.ready) > 1:
                        # a new migration victim for the models waiting for a GPU (their
                        # last try found none; no other event would try again)
                        self.serve_waiting_models(t)
            elif kind == _ROUND:  # the destination has recomputed n0 tokens: d more to go
                victim, entry = a, b
                r = entry[0]
                if self.in_flight(victim, entry):
                    d = entry[3] = self.tokens_at(victim, r, t) - entry[2]
                    self.push(t + round(self.alpha * d * NS), _HAND, r.id, victim, entry)
            elif kind == _HAND:  # the destination has caught up: hand over at the next boundary
                victim, entry = a, b
                if self.in_flight(victim, entry):
                    entry[4] = True
                    self.cut(victim, t)
            elif kind == _EXPIRE:
                inst = a
                if b == inst.idle_ver and inst.state == READY and inst.sim.is_idle() and not inst.receiving:
                    self.stop(inst, t, "keep-alive")
                    self.serve_waiting_models(t)
            else:  # _FREE: a migration's victim has handed over or finished every request
                victim, new = a, b
                gpu = victim.gpu
                if victim.state != DRAINING or gpu.reserved is not new:
                    continue  # called off (`relocate`)
                self.stop(victim, t, "migrated")
                gpu.reserved = None
                self.awaiting.remove(new)
                self.take_gpu(new, gpu, t)

        del arr[n:]
        # every request finished (before any limit): the run ends at the last completion.
        # The instances with a keep-alive were stopped by its expiry, run to the end (a
        # platform pays for that tail, whichever model finishes last); the ones kept alive
        # for `never` stop at the run's end, not at another model's later expiry, or at
        # their ready time if they were still starting then (their load and init ran on)
        ended = done == n
        if ended:
            now = max(last_done, 0)
        end_ns = now
        unfinished = [inst for inst in self.instances if inst.state != STOPPED and not inst.sim.is_idle()]
        if max_time == UNLIMITED:
            if unfinished:
                inst = unfinished[0]
                raise SimulationStuck(
                    f"the batch policy {inst.sim.scheduler.batch.name!r} of instance {inst.id} of model "
                    f"{inst.model.name} planned no work with requests waiting and no more arrivals"
                )
            left = [m.name for m in models if m.pending]
            if left:
                raise SimulationStuck(f"model {left[0]} has requests but never got a GPU")
        elif not ended:
            if n and arr[n - 1] >= max_time:
                now = max(now, max_time)  # requests were still to arrive: the clock ran to the limit
            end_ns, finished = self.finish_batches_at_limit(now)
            done += finished
        for inst in self.instances:
            if inst.state != STOPPED:
                stop_at = max(now, inst.gpu_from)
                if ended and inst.ready_at > stop_at:
                    # still starting at the run's end (kept alive, `never`): the platform
                    # started its load and pays for it, through its init, to its ready time
                    self.stop(inst, inst.ready_at, "ready after end")
                else:
                    self.stop(inst, stop_at, "end" if ended else "time limit")
        # requests still in the system (a time limit) report what they reached
        for r in self.requests_in_system():
            if r.first_token >= 0:
                ttft[r.id] = r.first_token - r.arrival
            if r.first_scheduled >= 0:
                queue[r.id] = r.first_scheduled - r.arrival
            pre[r.id] = r.preemptions
        if progress is not None:
            progress(done, n)
        rows = []
        for inst in self.instances:
            sim = inst.sim
            h = sim.own_itl
            rows.append(
                {
                    "instance": inst.id,
                    "model": inst.model.name,
                    "node": inst.gpu.node.name,
                    "gpu": inst.gpu.name,
                    "created_ns": inst.created,
                    "gpu_from_ns": inst.gpu_from,
                    "load_start_ns": inst.load_start,
                    "loaded_ns": inst.loaded_at,
                    "ready_ns": inst.ready_at,
                    "stop_ns": inst.stop_at,
                    "tier": inst.tier,
                    "stop_reason": inst.stop_reason,
                    "routed": inst.routed,
                    "completed": inst.completed,
                    "migrated_out": inst.migrated_out,
                    "steps": sim.steps,
                    "busy_ns": sim.busy,
                    "itl_count": h.count,
                    "max_token_load": max(sim.load_hist, default=0),
                    "max_batch_size": max(sim.batch_hist, default=0),
                    "itl_mean_ns": h.total / h.count if h.count else None,
                    "admission": sim.scheduler.admission.name,
                    "kv_capacity": sim.state.constraints.kv_capacity,
                }
            )
        platform_itl = GapHistogram()
        for m in models:
            platform_itl.merge(m.itl)
        arrival_ns = np.asarray(arr, dtype=np.int64)
        return ServerlessStats(
            spec=self.spec,
            models=[m.name for m in models],
            req_model=reqs.model.astype(np.int64),
            arrival_ns=arrival_ns,
            prompt=reqs.prompt.astype(np.int64),
            output=reqs.output.astype(np.int64),
            instance=_np(self.where, np.int64),
            queue_ns=_np(queue, np.int64),
            ttft_ns=_np(ttft, np.int64),
            e2e_ns=_np(e2e, np.int64),
            tokens=_np(tokens, np.int64),
            preemptions=_np(pre, np.int64),
            migrations=_np(self.migrations, np.int64),
            cold=_np(self.cold, np.int64),
            # the loop's own test: an arrival at or after the limit never happens
            arrived=arrival_ns < max_time,
            instances=rows,
            model_itl={m.name: m.itl for m in models},
            schedulers=self.schedulers,
            itl=platform_itl,
            end_ns=end_ns,
            steps=sum(i.sim.steps for i in self.instances),
            migrated_tokens=self.migrated_tokens,
            peak_gpus=self.peak_gpus,
        )

    def record_finished(self, inst: _Instance, finished: list[Request]) -> None:
        """Store what the requests that `inst` finished reached."""
        ttft, e2e, queue, pre, tokens = self.ttft, self.e2e, self.queue, self.pre, self.tokens
        for r in finished:
            x = r.id
            if r.first_token >= 0:
                ttft[x] = r.first_token - r.arrival
            e2e[x] = r.finish - r.arrival
            queue[x] = r.first_scheduled - r.arrival
            pre[x] = r.preemptions
            tokens[x] = r.emitted
        inst.completed += len(finished)

    def finish_batches_at_limit(self, now: int) -> tuple[int, int]:
        """A time limit: the batches under way complete. Every step of a batch starts before
        the limit, so its last one is the step that crosses it, which one server keeps too;
        the step-by-step path stops on the same steps as the fast path (which would lose all
        the steps of its last batches otherwise). An instance holds its GPU until its step
        ends; the others stop at the limit. Returns the run's end and the requests finished."""
        end = now
        done = 0
        for inst in self.instances:
            sim = inst.sim
            if sim.batch is None:
                continue
            batch_end = sim.busy_until
            finished = sim.end()
            if finished:
                self.record_finished(inst, finished)
                done += len(finished)
            if inst.state != STOPPED:
                self.stop(inst, max(batch_end, inst.gpu_from), "time limit")
            end = max(end, batch_end)
        return end, done

    def requests_in_system(self) -> list[Request]:
        """Every request that arrived and did not finish: at an instance (running or queued;
        a request being migrated is at its source until its hand-over), handed over to one
        and joining at its batch's end, or waiting for one to start (a model without
        instances)."""
        out: list[Request] = []
        for inst in self.instances:
            st = inst.sim.state
            out += st.running.values()
            out += st.waiting
            out += inst.incoming
        for m in self.models:
            out += [r for r, _ in m.pending]
        return out

    def plan(self, inst: _Instance, t: int) -> None:
        sim = inst.sim
        if (inst.state != READY and inst.state != DRAINING) or sim.busy_until >= 0:
            return
        if sim.is_idle():
            if inst.idle_since < 0 and inst.state == READY:
                self.go_idle(inst, t)
            return
        if t >= self.max_time:
            return
        end = sim.begin(t, self.max_time)
        if end is None:
            return  # nothing the policy runs now: wait for a request
        inst.version += 1
        self.push(end, _END, inst.id, inst, inst.version)

    def plan_acting(self, inst: _Instance, t: int) -> None:
        """`plan`, a migration it decides seeing `inst` as the instance acting (`acting`)."""
        self.acting = inst.id
        self.plan(inst, t)
        self.acting = -1

    def go_idle(self, inst: _Instance, t: int) -> None:
        inst.idle_since = t
        inst.idle_ver += 1
        ka = inst.model.keep_alive
        if ka is not None and not inst.receiving:  # (else it goes idle again when none is in flight)
            self.push(t + ka, _EXPIRE, inst.id, inst, inst.idle_ver)
        self.serve_waiting_models(t)


def check_requests(spec: ServerlessSpec, reqs) -> None:
    """Every request fits the KV cache of any instance of its model (ConfigError otherwise):
    a request may be routed to any of them, on any node group the model fits."""
    need = reqs.prompt + reqs.output - 1
    for i, name in enumerate(reqs.models):
        caps = [(spec.kv_capacity(name, g), g.name) for g in spec.nodes if spec.fits(name, g)]
        if any(c is None for c, _ in caps):
            continue
        cap, group = min(caps)
        bad = np.flatnonzero((reqs.model == i) & (need > cap))
        if len(bad):
            j = int(bad[0])
            where = f"an instance on node group {group} holds {cap}" if len(caps) > 1 else f"an instance holds {cap}"
            raise ConfigError(
                f"request {j} of model {name} needs {int(need[j])} KV tokens ({int(reqs.prompt[j])} "
                f"prompt + {int(reqs.output[j])} output - 1) but {where}, and requests may go to any instance: "
                "it could never complete (raise kv_capacity, lower kv_bytes_per_token or cap the lengths)"
            )


def run_serverless(
    spec: ServerlessSpec,
    *,
    fast: bool | None = None,
    max_time_s: float | None = None,
    requests=None,
    progress: Callable[[int, int], None] | None = None,
    check: bool = True,
) -> ServerlessStats:
    """Run the workload of `spec` (or `requests`, a `ServerlessRequests`) through its
    platform. `check=False`: the caller has run `check_schedulers(spec)` (each model's
    schedulers are built to be checked: once is enough) and `check_requests` on `requests`.
    `fast` and `max_time_s` left out (None) are the spec's (`spec.run`)."""
    if fast is None:
        fast = spec.run.fast
    if max_time_s is None:
        max_time_s = spec.run.max_time_s
    check_seconds("max_time_s", max_time_s)
    if check:
        check_schedulers(spec)  # before any request is made
    reqs = make_serverless_requests(spec) if requests is None else requests
    if check or requests is None:
        check_requests(spec, reqs)
    max_time = UNLIMITED if max_time_s is None else clock_ns(max_time_s)
    return _Runtime(spec, fast, max_time).run(reqs, progress)


__all__ = [
    "DRAINING",
    "LOADING",
    "READY",
    "STOPPED",
    "ServerlessStats",
    "check_requests",
    "check_schedulers",
    "run_serverless",
]
