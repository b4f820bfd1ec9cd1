"""The network simulator: servers (pools of replicas behind a router) and jobs whose routes
are graphs of LLM calls (sequences, forks joined by waiting for every branch, loops, think
delays).

One event queue orders job arrivals, call deliveries, delays and the batch ends of every
replica. Each replica is a `ServerSim` (the single-server simulator's batch logic, fast
path included): between two events that concern it, a replica advances a whole batch of
identical steps at once; a call delivered during a batch shortens the batch to the steps
that started before it (unless the batch's plan never read the waiting queue,
`StepPlan.ignores_waiting`: it is the same whoever arrives, and runs on) and is held by the
replica (`_Replica.held`) until the batch ends:
it joins the state at the next step boundary, as an arrival does in the single-server
simulator, and the time series counts it from there (`ServerSim.end(late=...)`), on both
paths alike. Routers count a held call at once (`_Replica.calls`, `unfinished_tokens`).
Servers interact only at call boundaries, so the fast path stays exact: a property test
holds it equal to the step-by-step path, time series included.

Events at the same instant: every delivery, delay end and batch end first, then the
replicas plan their next steps, so a call that arrives at a boundary joins that step.

Prefix caching (a server's `prefix_caching`): each replica's own `ServerState` keeps its
cache; the calls carry block ids (`Request.blocks`) built from the job's token stream
(`_Stream`): the job type's system prompt, then every call's new prompt and output in
route order. A call that resends the context has the stream so far plus its new prompt
as its prompt, so its leading blocks are those of the earlier calls' prompts and outputs;
a call that does not resend it is the system prompt and its own new tokens.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.clock import past_clock_error, to_clock_ns
from ..core.cost import make_cost_model
from ..core.errors import ConfigError
from ..core.request import NS, Request, check_sample_interval, check_seconds, clock_ns
from ..core.state import UNLIMITED, ServerState
from ..policies.spec import SchedulerSpec
from ..workload.arrivals import refuse_short_merge, times_for_merge
from ..workload.blocks import INT_CONSTANTS, seed_bits
from ..workload.blocks import mix_int as _mix
from ..workload.lengths import sample_pair
from ..workload.network import Call, Delay, Fork, JobType, Loop, NetworkSpec, ServerSpec
from .server import ServerSim, SimulationStuck, TimeSeries, check_sample_count, record_unfinished

# event kinds, in the order they run at one instant (plans last)
_JOB, _DELIVER, _RESUME, _END, _PLAN = 0, 1, 2, 3, 4
ROUTERS = ("random", "round-robin", "jsq", "least-tokens", "power-of-two")
_BLOCK = 4096  # jobs whose draws at one node and visit come from one stream (`_Draws`)
# blocks of draws kept at once, all nodes together (at most 32 MB); each (node, visit) also
# drops its block two behind the one it draws, as jobs that far behind are rare
_CACHED_BLOCKS = 512


class CallOverCapacity(ConfigError):
    """A call whose prompt + output - 1 exceeds its server's KV capacity: it could never
    complete. Found when the call is made (its prompt holds the context its route resent),
    so the run is under way: `message(key)` lets the caller name what sets the capacity
    (the network file's key, a cluster's command-line flag); `key` and `call`, given, are
    those its own text names (`named`)."""

    def __init__(
        self,
        server: str,
        cls: str,
        job: int,
        context: bool,
        prompt: int,
        output: int,
        capacity: int,
        key: str | None = None,
        call: str | None = None,
    ):
        # the arguments are its args: a run in a worker process pickles it, and its copy is made from them
        super().__init__(server, cls, job, context, prompt, output, capacity, key, call)
        self.server, self.cls, self.job, self.context = server, cls, job, context
        self.prompt, self.output, self.capacity = prompt, output, capacity
        self.key, self.call = key, call

    def __str__(self) -> str:
        return self.message(self.key or f"servers.{self.server}.kv_capacity", self.call)

    def named(self, key: str, call: str | None = None) -> CallOverCapacity:
        """This error, its text naming `key` (what set the capacity) and `call`."""
        fields = (self.server, self.cls, self.job, self.context, self.prompt, self.output, self.capacity)
        return CallOverCapacity(*fields, key, call)

    def message(self, key: str, call: str | None = None) -> str:
        """The error in the one-server simulator's words: `key` names what sets the
        capacity, `call` the call (default: its class and job)."""
        bound = ", or bound the context its route resends" if self.context else ""
        call = call or f"a call of class {self.cls!r} (job {self.job})"
        return (
            f"{call} needs {self.prompt + self.output - 1} KV tokens "
            f"(prompt {self.prompt} + output {self.output} - 1) but the KV capacity ({key}) is "
            f"{self.capacity}: it can never complete (raise it{bound})"
        )


class _Replica:
    __slots__ = (
        "sim",
        "pool",
        "index",
        "version",
        "planned",
        "name",
        "order",
        "calls",
        "held",
        "held_work",
        "buffers",
        "buffered_work",
    )

    def __init__(self, sim: ServerSim, pool: _Pool, index: int):
        self.sim = sim
        self.pool = pool
        self.index = index
        self.version = 0
        self.planned = False  # a plan event is queued
        self.calls = 0  # calls given to it and not finished (held ones included)
        self.name = f"{pool.name}[{index}]" if pool.spec.replicas > 1 else pool.name
        # calls delivered during the batch in progress, in delivery order: they join the
        # state when it ends (`_END`), as arrivals during a batch do in the single-server
        # simulator, so that no sample of the batch's time series counts them too early
        self.held: list[Request] = []
        self.held_work = 0  # their work (`ServerState.work`), for `unfinished_tokens`
        # back-pressure: the calls the router gave this replica, by class, until it takes them
        # at a step boundary (max-pressure picks the class); their work, for least-tokens
        self.buffers: dict[str, deque] = {}
        self.buffered_work = 0

    def unfinished(self) -> int:
        """Calls at the replica, waiting or running (kept as a count: JSQ asks every replica
        on every delivery)."""
        return self.calls

    def unfinished_tokens(self, t: int) -> int:
        """Work left of its requests at `t` (steps of the current batch done by `t` count;
        held and back-pressure-buffered calls count in full)."""
        return self.sim.unfinished(t) + self.held_work + self.buffered_work

    def late(self) -> list[tuple[int, int, int]] | None:
        """The held calls as `ServerSim.end`'s `late` tuples (arrival, prefill tokens, work,
        as the state would count them once added), or None when none arrived by the start
        of the batch's last step: then no sample of the batch counts any of them (a
        delivery cuts the batch to the steps that start before it)."""
        held = self.held
        sim = self.sim
        durs = sim.batch[3]
        last = sim.busy_until - (durs if isinstance(durs, int) else durs[-1])
        if held[0].arrival > last:
            return None
        work = ServerState.work
        return [(r.arrival, r.prefill_target - r.prefilled, work(r)) for r in held]


class _Pool:
    """A server: `replicas` identical replicas behind a router."""

    def __init__(self, spec: ServerSpec, rng: np.random.Generator):
        if spec.router not in ROUTERS:
            raise ConfigError(f"servers.{spec.name}: unknown router {spec.router!r} (known: {', '.join(ROUTERS)})")
        self.spec = spec
        self.name = spec.name
        self.replicas: list[_Replica] = []
        self.rng = rng
        self.rr = 0
        opts = spec.router_options or {}
        self.d = int(opts.get("d", 2))
        w = opts.get("weights")
        self.weights = None if w is None else np.asarray(w, dtype=float) / float(np.sum(w))

    def route(self, t: int) -> _Replica:
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        kind = self.spec.router
        if kind == "round-robin":
            r = reps[self.rr]
            self.rr = (self.rr + 1) % len(reps)
            return r
        if kind == "random":
            return reps[int(self.rng.choice(len(reps), p=self.weights))]
        if kind == "jsq":
            return min(reps, key=_Replica.unfinished)
        if kind == "least-tokens":
            return min(reps, key=lambda r: r.unfinished_tokens(t))
        picks = self.rng.choice(len(reps), size=min(self.d, len(reps)), replace=False)
        return min((reps[int(i)] for i in sorted(picks)), key=_Replica.unfinished)


# ------------------------------------------------------------------ prefix-cache block ids
_MASK = (1 << 64) - 1
_GOLDEN, _ROOT, _M1, _M2 = INT_CONSTANTS  # `workload.blocks`' (_ROOT: the id before a stream's first block)
# separate hash domains for a job type's shared system prompt and a job's own tokens
_SHARED_SALT = 0x5EED5EED00000011
_OWN_SALT = 0x0C0FFEE000000012


def _extend_ids(ids: list, starts: list, writers: list, block_size: int, full: int) -> None:
    """Append to `ids` the chained ids of blocks len(ids) .. full - 1 of a stream of
    segments (`starts[i]`: first token written by `writers[i]`). Block k's content is
    `writer + k * golden`, its writer that of its last token; the id is
    `workload.blocks.chain_int(previous id, content)`, inlined (a long prompt has hundreds of blocks)."""
    k = len(ids)
    prev = ids[-1] if ids else _ROOT
    seg = bisect_right(starts, (k + 1) * block_size - 1) - 1
    last_seg = len(starts) - 1
    m, g, m1, m2 = _MASK, _GOLDEN, _M1, _M2
    while k < full:
        last = (k + 1) * block_size - 1
        while seg < last_seg and starts[seg + 1] <= last:
            seg += 1
        x = (writers[seg] + k * g + g) & m
        x ^= x >> 30
        x = (x * m1) & m
        x ^= x >> 27
        x = (x * m2) & m
        x ^= x >> 31
        x = (prev * g + x) & m
        x ^= x >> 30
        x = (x * m1) & m
        x ^= x >> 27
        x = (x * m2) & m
        prev = x ^ (x >> 31)
        ids.append(prev)
        k += 1


class _SystemPrompt:
    """A job type's system prompt: `tokens` written by `writer`, the same for every job of
    the type; its full blocks' ids are computed once per block size."""

    __slots__ = ("writer", "tokens", "_ids")

    def __init__(self, writer: int, tokens: int):
        self.writer = writer
        self.tokens = tokens
        self._ids: dict[int, list[int]] = {}

    def ids(self, block_size: int) -> list[int]:
        ids = self._ids.get(block_size)
        if ids is None:
            ids = self._ids[block_size] = []
            _extend_ids(ids, [0], [self.writer], block_size, self.tokens // block_size)
        return ids


class _Stream:
    """The tokens one path of a job has built, for block ids: the job type's system prompt,
    then segments of tokens, each written by one *writer* (a 64-bit key for one path of
    one job). A block's content is (its last token's writer, its index): a block that
    straddles two writers holds the later one's tokens, so it differs from every other
    path's block, and ids chain the contents, so an id stands for its block and everything
    before it (`_extend_ids`). Ids of full blocks are computed once per block size."""

    __slots__ = ("system", "starts", "writers", "length", "writer", "ids")

    def __init__(self, system: _SystemPrompt, writer: int):
        self.system = system
        self.starts = [0]
        self.writers = [system.writer]
        self.length = system.tokens  # tokens so far
        self.writer = writer  # who writes what `append` adds
        self.ids: dict[int, list[int]] = {}  # block size -> ids of the full blocks so far

    def fork(self, writer: int) -> _Stream:
        """A copy that `writer` continues (a fork's branch)."""
        s = _Stream.__new__(_Stream)
        s.system = self.system
        s.starts = self.starts[:]
        s.writers = self.writers[:]
        s.length = self.length
        s.writer = writer
        s.ids = {b: ids[:] for b, ids in self.ids.items()}
        return s

    def append(self, n: int) -> None:
        if n <= 0:
            return
        if self.writers[-1] != self.writer:
            if self.starts[-1] == self.length:  # an empty segment (a system prompt of 0 tokens)
                self.writers[-1] = self.writer
            else:
                self.starts.append(self.length)
                self.writers.append(self.writer)
        self.length += n

    def blocks(self, block_size: int, tokens: int) -> tuple[int, ...] | None:
        """Ids of the full blocks of the stream's first `tokens` tokens (None: no full block)."""
        full = tokens // block_size
        if not full:
            return None
        ids = self.ids.get(block_size)
        if ids is None:  # blocks inside the system prompt: the job type's ids
            ids = self.ids[block_size] = self.system.ids(block_size)[:full]
        if len(ids) < full:
            _extend_ids(ids, self.starts, self.writers, block_size, full)
        return tuple(ids[:full])


class _Job:
    __slots__ = ("id", "type", "arrival", "finish", "writers", "own", "visits")

    def __init__(self, id: int, type: int, arrival: int, own: int = 0):
        self.id = id
        self.type = type
        self.arrival = arrival
        self.finish = -1
        self.own = own  # the key its writers derive from (prefix caching)
        self.writers = 0
        self.visits: dict[int, int] | None = None  # node id -> visits so far (nodes in loops)

    def new_writer(self) -> int:
        """A key for tokens only this job writes (one per path, join and lone prompt)."""
        self.writers += 1
        return _mix((self.own + self.writers * _GOLDEN) & _MASK)


class _Thread:
    """One path of a job's route: a stack of (nodes, position, loop node, pass) frames, the
    context its calls resend, and the fork it joins when done. With prefix caching, its
    token stream (`_Stream`) and, while it waits at a fork, its branches' streams."""

    __slots__ = ("job", "frames", "context", "parent", "waiting", "added", "stream", "branch", "joined")

    def __init__(self, job: _Job, nodes: list, context: int, parent: _Thread | None, stream=None, branch: int = 0):
        self.job = job
        self.frames = [[nodes, 0, None, 1]]
        self.context = context  # tokens of the job's context on this path
        self.parent = parent
        self.waiting = 0  # branches of a fork not yet joined
        self.added = 0  # context this path added (returned to the fork's parent)
        self.stream = stream
        self.branch = branch  # its index among its fork's branches
        self.joined: list | None = None  # the branches' finished threads, in branch order


@dataclass
class NetworkStats:
    """Everything the network simulator measures."""

    spec: NetworkSpec
    # per call (index = call id)
    call_job: array
    call_class: list[str]
    call_server: list[str]
    call_replica: array
    call_arrival: array
    call_prompt: array
    call_output: array
    call_queue: array
    call_ttft: array
    call_e2e: array
    call_preempt: array
    # prompt tokens whose KV cache arrived computed (`cached: true`: the system prompt and the
    # resent context), never prefilled at the server; 0 for other calls
    call_cached: array
    # per job
    job_type: array
    job_arrival: array
    job_finish: array
    job_calls: array  # calls each job has made (delivered) so far, finished or not
    job_type_names: list[str]
    # per replica
    replicas: list[dict] = field(default_factory=list)
    end_ns: int = 0
    steps: int = 0
    # the max_time_s stop (ns), None without one: the jobs due at or after it are listed but
    # never arrived (as one server's requests)
    stop_ns: int | None = None
    # per call: the prompt tokens its server's prefix cache served it at its first admission
    # (0 without a cache, or never admitted): the verdicts' capacity counts them as no work,
    # as one server's does (`RunStats.prefix_hits`)
    call_hit: array = field(default_factory=lambda: array("q"))


class _Draws:
    """The random draws of one route node (a call's lengths, a delay's times, a loop's
    repeat decisions), keyed by job and visit: visit `v` (0: the first) of job `j` reads
    row `j % _BLOCK` of block `(v, j // _BLOCK)`, and each block is a stream of its own
    (`stream_entropy(seed, kind, node, v, block)`). A job's draws depend on the seed, the
    node, the job and the visit only, not on when the run reaches the node: two runs of one
    seed that differ only in a server (policy, cost model, replicas) give every job the same
    lengths, think times and loop passes (common random numbers). Blocks are kept in a
    cache shared by the run's nodes (`_CACHED_BLOCKS`, oldest dropped first, and a block
    two behind the one a (node, visit) draws); a dropped block drawn again is the same."""

    __slots__ = ("seed", "kind", "index", "draw", "cache")

    def __init__(self, seed: int, kind: str, index: int, draw: Callable, cache: dict):
        self.seed = seed
        self.kind = kind
        self.index = index
        self.draw = draw  # draw(rng, visit, block) -> the block's values, one row per job
        self.cache = cache

    def block(self, job: int, visit: int) -> tuple[array, int]:
        """The block holding the draws of `visit` of `job`, and the job's row in it."""
        block, row = divmod(job, _BLOCK)
        key = (self.kind, self.index, visit, block)
        cache = self.cache
        values = cache.get(key)
        if values is None:
            cache.pop((self.kind, self.index, visit, block - 2), None)
            if len(cache) >= _CACHED_BLOCKS:
                del cache[next(iter(cache))]
            rng = np.random.default_rng(stream_entropy(self.seed, self.kind, self.index, visit, block))
            values = cache[key] = self.draw(rng, visit, block)
        return values, row


def _length_draws(call: Call, n_jobs: int) -> Callable:
    """A call node's block of (prompt, output) rows. `sample_pair`, as one server's workload
    does: a prompt and an output law on the same file (sharegpt, arxiv) read the same rows,
    which keeps each row's pair and the file's correlation; other laws are drawn one after
    the other. A `replay:` law reads row `v * n_jobs + j` of the file (wrapping) for visit
    `v` of job `j`: a route without loops replays the file in job order."""

    def draw(rng: np.random.Generator, visit: int, block: int) -> array:
        """Prompt and output of row i at 2i and 2i + 1."""
        start = visit * n_jobs + block * _BLOCK
        prompts, outputs = sample_pair(call.prompt, call.output, rng, rng, _BLOCK, start)
        pairs = np.empty(2 * _BLOCK, dtype=np.int64)
        pairs[0::2], pairs[1::2] = prompts, outputs
        return array("q", pairs.tobytes())

    return draw


def _delay_draws(node: Delay) -> Callable:
    """A delay node's block of think/tool times, in ns."""

    def draw(rng: np.random.Generator, visit: int, block: int) -> array:
        vals = np.asarray(node.law.sample(rng, _BLOCK), dtype=np.float64)
        return array("q", np.maximum(0, np.round(vals * NS)).astype(np.int64).tobytes())

    return draw


def _loop_draws(rng: np.random.Generator, visit: int, block: int) -> array:
    """A loop node's block of uniforms on [0, 1): a pass repeats when its draw is below
    `repeat_prob`."""
    return array("d", rng.random(_BLOCK).tobytes())


def _route_draws(spec: NetworkSpec, n_jobs: int) -> tuple[dict[int, _Draws], set[int]]:
    """The draws of every call, delay and loop node, by node id (a `per_token` delay and a
    `times` loop never draw from theirs), each node indexed among the nodes of its kind in
    the spec's order (job types in order, each route depth first); and the ids of the
    nodes a job can visit more than once (inside a loop, the loop nodes themselves: one
    draw per pass, and a node object placed twice in routes, which keeps its first index)."""
    cache: dict[tuple, array] = {}
    draws: dict[int, _Draws] = {}
    counts = {"lengths": 0, "delays": 0, "loop": 0}
    repeated: set[int] = set()

    def add(node, kind: str, draw: Callable) -> None:
        if id(node) in draws:  # the same object twice (`[call] * 3` in Python): visits tell them apart
            repeated.add(id(node))
            return
        draws[id(node)] = _Draws(spec.seed, kind, counts[kind], draw, cache)
        counts[kind] += 1

    def walk(nodes, in_loop: bool) -> None:
        for node in nodes:
            if in_loop:
                repeated.add(id(node))
            if isinstance(node, Call):
                add(node, "lengths", _length_draws(node, n_jobs))
            elif isinstance(node, Delay):
                add(node, "delays", _delay_draws(node))
            elif isinstance(node, Fork):
                for branch in node.branches:
                    walk(branch, in_loop)
            elif isinstance(node, Loop):
                add(node, "loop", _loop_draws)
                repeated.add(id(node))
                walk(node.body, True)

    for job in spec.jobs:
        walk(job.route, False)
    return draws, repeated


def check_flag(name: str, value) -> None:
    """A true/false option must be a bool: `fast="no"` is a truthy string, and was taken as
    true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def successors(spec: NetworkSpec) -> dict[str, set]:
    """For each call class, the classes whose calls can come right after one of its calls
    (empty: the job leaves the network after it). Linear in the size of the routes: each
    node is walked once, and a loop body's first classes are computed once (`head`)."""
    succ: dict[str, set] = {c: set() for c in spec.call_classes()}
    heads: dict[int, tuple[frozenset, bool]] = {}  # id(node list) -> head(nodes)

    def head(nodes) -> tuple[frozenset, bool]:
        """The classes that can run first in `nodes` on their own, and whether a pass
        through them can make no call (then what follows them can run first too)."""
        key = id(nodes)
        if key not in heads:
            first: set = set()
            through = True
            for node in nodes:
                if isinstance(node, Call):
                    f, through = {node.cls}, False
                elif isinstance(node, Fork):
                    parts = [head(b) for b in node.branches]
                    # the join waits for every branch: it is passed without a call only
                    # when no branch makes one
                    f, through = set().union(*(p[0] for p in parts)), all(p[1] for p in parts)
                elif isinstance(node, Loop):  # at least one pass
                    f, through = head(node.body)
                else:  # a delay
                    continue
                first |= f
                if not through:
                    break
            heads[key] = (frozenset(first), through)
        return heads[key]

    def walk(nodes, after: set) -> set:
        """The classes that can run first in `nodes`, followed by `after`."""
        first = after
        for node in reversed(nodes):
            if isinstance(node, Call):
                succ[node.cls] |= first
                first = {node.cls}
            elif isinstance(node, Fork):
                # a branch without calls (delays only) moves nothing on: what follows the
                # join comes after the other branches' calls, not after the fork's caller
                calling = [b for b in node.branches if not head(b)[1]]
                if calling:
                    first = set().union(*(walk(b, first) for b in calling))
            elif isinstance(node, Loop):
                f, through = head(node.body)
                once = (f | first) if through else set(f)  # first of one pass, then `after`
                first = walk(node.body, first | once)  # a pass may follow a pass
        return first

    for job in spec.jobs:
        walk(job.route, set())
    return succ


# the word after the seed in each kind of stream's entropy (arrivals: the job type's index)
_STREAM_TAGS = {"loop": 7, "lengths": 11, "delays": 13, "pool": 1_000_003}


def stream_entropy(seed: int, kind: str, index: int = 0, visit: int = 0, block: int = 0) -> list[int]:
    """numpy's seed of one random stream of a run: "arrivals" of job type `index`, "pool"
    (server `index`'s router), and, for jobs `block * _BLOCK` to `(block + 1) * _BLOCK - 1`
    at their visit `visit` (0: the first) of a node, "lengths" of call node `index`,
    "delays" of delay node `index`, "loop" (the repeat decisions of loop node `index`).
    Nodes are indexed by kind in the spec's order (`_route_draws`). No two (seed, kind,
    index, visit, block) share one."""
    if seed >= _WORD:
        return _wide_seed_entropy(seed, kind, index, visit, block)
    if kind == "arrivals":
        # SeedSequence pads entropy with zeros to 4 words: [seed, 7] was the loop's stream and
        # [seed, 11] a length stream's [seed, 11, 0]; from type 7 on a final 1 no other tag has
        return [seed, index] if index < _STREAM_TAGS["loop"] else [seed, index, 0, 1]
    tag = _STREAM_TAGS[kind]
    if kind == "pool":
        return [seed, tag, index]
    # five words: SeedSequence mixes a fifth word in even when it is 0, so these differ from
    # every stream of at most four words above
    return [seed, tag, index, visit, block]


_WORD = 1 << 32


def _wide_seed_entropy(seed: int, kind: str, index: int, visit: int, block: int) -> list[int]:
    """The entropy of a seed of 2**32 or more. numpy splits such a seed into 32-bit words, so
    `[seed, tag, index]` would read as `[low word, high word, tag, index]`: the loop stream
    of seed 11 * 2**32 + s would be the length stream 7 of seed s. Here the seed's words
    are written out and padded to at least four, then four words follow, always: the kind,
    the index, the visit and the block. That is eight words or more, where every seed below
    2**32 gives at most five, and the seed is read back from the words before the last four."""
    words = []
    while seed:
        words.append(seed & (_WORD - 1))
        seed >>= 32
    words += [0] * (4 - len(words))
    tag = 3 if kind == "arrivals" else _STREAM_TAGS[kind]
    return [*words, tag, index, visit, block]


def _priority_state(spec: ServerSpec, scheduler, classes: dict[str, int]) -> ServerState | None:
    """A state whose decode and admission orders put the server's priority classes first."""
    if not spec.priority:
        return None
    inner = scheduler.admission.waiting_key()
    if inner is None:
        key = lambda r: r.key  # noqa: E731 - (rank, arrival, id)
    else:
        key = lambda r: (r.key[0], *inner(r))  # noqa: E731
    state = ServerState(scheduler.constraints, key)
    state.prefill_by_key = True
    return state


def _job_type_arrivals(job: JobType, entropy: list[int], n: int | None, duration_s: float | None):
    """A job type's arrival times (seconds), and whether they stop at the simulator's time
    limit before `n` (`times_for_merge`: every type draws `n`, and the merge keeps the
    first `n` of all types, so a rare type's last draws, past the limit, are often unused)."""
    try:
        return times_for_merge(job.arrival, lambda: np.random.default_rng(entropy), n, duration_s)
    except ConfigError as e:
        raise ConfigError(f"job type {job.name!r}: {e}") from None


def run_network(
    spec: NetworkSpec,
    *,
    fast: bool | None = None,
    max_time_s: float | None = None,
    sample_interval_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> NetworkStats:
    """Run the jobs of `spec` through its servers; returns per-call, per-job and per-replica
    measurements. `fast`, `max_time_s` and `sample_interval_s` left out (None) are the
    spec's (`spec.run`; default: fast, no limit, the automatic interval)."""
    run = spec.run
    fast = run.get("fast", True) if fast is None else fast
    max_time_s = run.get("max_time_s") if max_time_s is None else max_time_s
    sample_interval_s = run.get("sample_interval_s") if sample_interval_s is None else sample_interval_s
    check_flag("fast", fast)
    check_seconds("max_time_s", max_time_s)
    check_sample_interval(sample_interval_s)
    max_time = UNLIMITED if max_time_s is None else clock_ns(max_time_s)
    # job arrivals: every job type's own process, merged
    arrivals = []
    n_jobs = spec.num_jobs
    cut_at_limit = []  # job types whose arrivals stop short of n_jobs at the time limit
    for ti, jt in enumerate(spec.jobs):
        t, cut = _job_type_arrivals(jt, stream_entropy(spec.seed, "arrivals", ti), n_jobs, spec.duration_s)
        if cut:
            cut_at_limit.append(jt.name)
        arrivals.append(np.column_stack([to_clock_ns(t), np.full(len(t), ti, dtype=np.int64)]))
    merged = np.concatenate(arrivals) if arrivals else np.zeros((0, 2), dtype=np.int64)
    merged = merged[np.lexsort((merged[:, 1], merged[:, 0]))]
    if n_jobs is not None:
        if cut_at_limit:
            types = ("job types " if len(cut_at_limit) > 1 else "job type ") + ", ".join(map(repr, cut_at_limit))
            refuse_short_merge(types, len(merged), n_jobs, "jobs")
        merged = merged[:n_jobs]
    if len(merged) == 0:
        raise ConfigError("the network's workload has no jobs (check num_jobs / duration and the rates)")
    job_times = merged[:, 0].tolist()
    job_types = merged[:, 1].tolist()
    n = len(job_times)

    # servers
    classes = {c: i for i, c in enumerate(spec.call_classes())}
    pools: dict[str, _Pool] = {}
    replicas: list[_Replica] = []
    span = job_times[-1] - job_times[0]
    interval = max(span // 1000, NS // 100) if not sample_interval_s else clock_ns(sample_interval_s)
    n_replicas = sum(s.replicas for s in spec.servers.values())
    # the last job that arrives, where the verdicts' window ends
    arriving = bisect_left(job_times, max_time)
    last_job = job_times[arriving - 1] if arriving else None
    check_sample_count(sample_interval_s, job_times[0] / NS, job_times[-1] / NS, max_time_s, n_replicas)
    for name, sspec in spec.servers.items():
        pool = _Pool(sspec, np.random.default_rng(stream_entropy(spec.seed, "pool", len(pools))))
        cost = make_cost_model(sspec.cost_model)
        for k in range(sspec.replicas):
            sched = SchedulerSpec(**sspec.scheduler_fields()).build()
            sched.bind_cost_model(cost)
            series = TimeSeries(
                job_times[0],
                interval,
                not sample_interval_s,
                prefix=sspec.prefix_caching,
                replicas=n_replicas,
                keep_until=last_job,
            )
            sim = ServerSim(sched, cost, fast=fast, series=series, state=_priority_state(sspec, sched, classes))
            rep = _Replica(sim, pool, k)
            rep.order = len(replicas)
            pool.replicas.append(rep)
            replicas.append(rep)
        pools[name] = pool
    rank = {name: {c: i for i, c in enumerate(s.priority)} for name, s in spec.servers.items()}
    kv_limit = {name: s.kv_capacity for name, s in spec.servers.items()}
    # prefix caching: the block size of each server that caches (0: it does not)
    cache_block = {name: s.block_size if s.prefix_caching else 0 for name, s in spec.servers.items()}
    track_streams = any(cache_block.values())
    system = [jt.system_prompt for jt in spec.jobs]
    seed64 = seed_bits(spec.seed)  # (a seed of 2**64 or more folded, not masked to seed mod 2**64)
    own_base = _mix((_OWN_SALT + seed64) & _MASK)
    shared_base = _mix((_SHARED_SALT + seed64) & _MASK)
    system_prompts = [
        _SystemPrompt(_mix((shared_base + ti * _GOLDEN) & _MASK), jt.system_prompt) for ti, jt in enumerate(spec.jobs)
    ]

    draws, repeated = _route_draws(spec, n)

    def visit(job: _Job, node) -> int:
        """The job's visits of `node` before this one (0 outside loops)."""
        key = id(node)
        if key not in repeated:
            return 0
        visits = job.visits
        if visits is None:
            visits = job.visits = {}
        v = visits.get(key, 0)
        visits[key] = v + 1
        return v

    def lengths(call: Call, job: _Job) -> tuple[int, int]:
        values, row = draws[id(call)].block(job.id, visit(job, call))
        return values[2 * row], values[2 * row + 1]

    def delay_ns(node: Delay, job: _Job) -> int:
        values, row = draws[id(node)].block(job.id, visit(job, node))
        return values[row]

    def repeats(loop: Loop, job: _Job) -> bool:
        """Whether a `repeat_prob` loop's pass that just ended is followed by another."""
        values, row = draws[id(loop)].block(job.id, visit(job, loop))
        return values[row] < loop.repeat_prob

    # per-call and per-job records
    c_job, c_rep, c_arr, c_prompt, c_out = array("q"), array("q"), array("q"), array("q"), array("q")
    c_queue, c_ttft, c_e2e, c_pre, c_cached = array("q"), array("q"), array("q"), array("q"), array("q")
    c_hit = array("q")
    c_class: list[str] = []
    c_server: list[str] = []
    threads: dict[int, tuple[_Thread, int]] = {}  # call id -> (waiting thread, context in its prompt)
    rep_index = {id(r): i for i, r in enumerate(replicas)}
    j_type, j_arr, j_fin, j_calls = array("q"), array("q"), array("q"), array("q")

    events: list[tuple] = []
    seq = 0
    done_jobs = 0

    def push(t: int, kind: int, a, b=None, tie: int = -1) -> None:
        """Events at one instant run by kind, then by `tie` (a replica's index for batch
        ends and plans, so their order does not depend on when they were queued: the fast
        and the step-by-step paths queue them at different times), then in queue order."""
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, tie, seq, a, b))

    def deliver(t: int, thread: _Thread, call: Call) -> None:
        if t >= max_time:
            # a call ending in the step across the stop moves its job on after the stop: no
            # call arrives then (as no delay ends and no job arrives), so none is made
            return
        job = thread.job
        new, o = lengths(call, job)
        head = system[job.type] + (thread.context if call.context else 0)  # before the new tokens
        p = head + new
        cid = len(c_arr)
        server = call.server
        kv = kv_limit[server]
        if kv is not None and p + o - 1 > kv:
            raise CallOverCapacity(server, call.cls, job.id, call.context, p, o, kv)
        r = Request(cid, t, p, o, call.cls)
        if call.cached:  # the resent context's KV arrives computed: only the rest is prefilled
            r.prefilled = min(head, p - 1)
        stream = thread.stream
        if stream is not None:
            bs = cache_block[server]
            if call.context or not thread.context:  # the prompt is the stream so far + its new tokens
                stream.append(new)
                if bs:
                    r.blocks = stream.blocks(bs, p)
            else:  # the system prompt, then tokens of its own
                if bs:
                    alone = _Stream(system_prompts[job.type], job.new_writer())
                    alone.append(new)
                    r.blocks = alone.blocks(bs, p)
                stream.append(new)
        r.index = thread.job.id
        ranks = rank[server]
        if ranks:
            r.key = (ranks.get(call.cls, len(ranks)), t, cid)
        c_job.append(thread.job.id)
        c_arr.append(t)
        c_prompt.append(p)
        c_out.append(o)
        c_rep.append(-1)
        for col in (c_queue, c_ttft, c_e2e):
            col.append(-1)
        c_pre.append(0)
        c_hit.append(0)
        c_cached.append(r.prefilled)
        c_class.append(call.cls)
        c_server.append(server)
        # counted at delivery, not when the job finishes: a job still in the network when
        # max_time_s stops the run has made these calls too (calls.csv lists them)
        j_calls[job.id] += 1
        threads[cid] = (thread, new)
        push(t, _DELIVER, pools[server], r)

    def advance(thread: _Thread, t: int) -> None:
        """Run the thread's route from its position until it waits (a call, a delay, a
        fork) or ends."""
        while True:
            frame = thread.frames[-1]
            nodes, pos, loop, npass = frame
            if pos >= len(nodes):
                if loop is not None and (npass < loop.times if loop.times is not None else repeats(loop, thread.job)):
                    frame[1] = 0
                    frame[3] = npass + 1
                    continue
                thread.frames.pop()
                if thread.frames:
                    continue
                finish_thread(thread, t)
                return
            node = nodes[pos]
            frame[1] = pos + 1
            if isinstance(node, Call):
                deliver(t, thread, node)
                return
            if isinstance(node, Delay):
                if node.law.kind == "per_token":  # a KV transfer: the system prompt's and the context's
                    kv = system[thread.job.type] + thread.context
                    push(t + round(node.law.mean * kv * NS), _RESUME, thread)
                else:
                    push(t + delay_ns(node, thread.job), _RESUME, thread)
                return
            if isinstance(node, Loop):
                thread.frames.append([node.body, 0, node, 1])
                continue
            if isinstance(node, Fork):
                thread.waiting = len(node.branches)
                stream = thread.stream
                if stream is not None:
                    thread.joined = [None] * len(node.branches)
                for i, branch in enumerate(node.branches):
                    fork = None if stream is None else stream.fork(thread.job.new_writer())
                    advance(_Thread(thread.job, branch, thread.context, thread, fork, i), t)
                return
            raise TypeError(f"unknown route node {node!r}")  # pragma: no cover

    def finish_thread(thread: _Thread, t: int) -> None:
        nonlocal done_jobs
        parent = thread.parent
        if parent is None:
            done_jobs += 1
            job = thread.job
            job.finish = t
            j_fin[job.id] = t
            return
        parent.context += thread.added
        parent.added += thread.added
        parent.waiting -= 1
        if parent.joined is not None:
            parent.joined[thread.branch] = thread
        if parent.waiting == 0:
            if parent.joined is not None:
                # the context after the join: the first branch's stream, then what the
                # others added, in branch order
                first, *rest = parent.joined
                stream = first.stream
                stream.writer = parent.job.new_writer()
                for other in rest:
                    stream.append(other.added)
                parent.stream = stream
                parent.joined = None
            advance(parent, t)

    def call_done(r: Request, t: int) -> None:
        cid = r.id
        c_ttft[cid] = r.first_token - r.arrival if r.first_token >= 0 else -1
        c_e2e[cid] = r.finish - r.arrival
        c_queue[cid] = r.first_scheduled - r.arrival
        c_pre[cid] = r.preemptions
        c_hit[cid] = r.first_hit
        thread, new = threads.pop(cid)
        grown = new + r.output  # new prompt tokens and the output join the context
        thread.context += grown
        thread.added += grown
        if thread.stream is not None:
            thread.stream.append(r.output)
        advance(thread, t)

    backpressure = spec.control == "backpressure"
    succ = successors(spec) if backpressure else {}  # only back-pressure's weights read it
    queued: dict[tuple[int, str], int] = {}  # (replica's order, class) -> calls in its buffer
    class_work: dict[str, list[int]] = {}  # class -> [work of its calls so far, calls]
    # the replicas a class's calls can be routed to (a server of one replica: the server)
    class_replicas = {
        cls: [r.order for name in sorted(servers) for r in pools[name].replicas]
        for cls, servers in spec.class_servers().items()
    }

    def weight(rep: _Replica, cls: str) -> float:
        """Max-pressure's weight: this class's queued calls at this replica minus the largest
        queue (at any replica) of calls it feeds next, times the class's service rate (calls
        per token of work), so a short call that feeds another server counts as much as the
        work it unblocks."""
        down = 0
        for nxt in succ[cls]:
            for other in class_replicas[nxt]:
                q = queued.get((other, nxt), 0)
                if q > down:
                    down = q
        total, calls = class_work[cls]
        return (queued.get((rep.order, cls), 0) - down) * calls / total

    def release(rep: _Replica, t: int) -> None:
        """Hand the replica the calls of its buffer's class of largest weight, about one
        step's budget of prefill tokens, when it has nothing waiting."""
        sim = rep.sim
        if sim.state.waiting:
            return
        cls = max(sorted(rep.buffers), key=lambda c: weight(rep, c))
        buf = rep.buffers[cls]
        budget = sim.state.b_max
        while buf and budget > 0:
            r = buf.popleft()
            budget -= r.remaining_prefill  # a cached: true context is not prefilled here
            rep.buffered_work -= ServerState.work(r)
            sim.add(r)
        if not buf:
            del rep.buffers[cls]
        queued[(rep.order, cls)] = len(buf)

    # job arrivals enter the queue one at a time (the next one when this one is taken), so the
    # queue holds what is in flight, not the whole workload
    push(job_times[0], _JOB, job_types[0], 0)

    next_progress = progress_every = max(1, n // 200)
    steps_total = 0
    now = min(job_times[0], max_time)
    cut = False  # whether the time limit held back a job or a step: the clock then runs to it
    while events:
        t, kind, _, _, a, b = heapq.heappop(events)
        if kind == _END and b != a.version:
            # a batch end a truncation superseded: not an instant of the run (the fast path
            # leaves such ends past the last step, the step-by-step path does not)
            continue
        if t >= max_time:
            if max_time == UNLIMITED:  # no stop: the clock's end, not a stop, was reached
                raise past_clock_error(
                    "jobs", "--max-time, run.max_time_s", "the routes' delays and the calls' steps", "network: "
                )
            if kind != _END:
                # past the limit only the steps under way end (the step across it counts, as on
                # one server): no job arrives, no call is delivered, no delay ends, nothing is planned
                cut = True
                continue
        now = t
        if kind == _END:
            rep = a
            sim = rep.sim
            held = rep.held
            if held:  # calls delivered during the batch join at its end
                finished = sim.end(rep.late())
                for r in held:
                    sim.add(r)
                rep.held = []
                rep.held_work = 0
            else:
                finished = sim.end()
            rep.calls -= len(finished)
            for r in finished:
                c_rep[r.id] = rep_index[id(rep)]
                call_done(r, t)
            rep.planned = True
            push(t, _PLAN, rep, None, rep.order)
        elif kind == _PLAN:
            rep = a
            rep.planned = False
            sim = rep.sim
            if sim.busy_until >= 0:
                continue
            limit = max_time
            if backpressure and rep.buffers:
                release(rep, t)
                if rep.buffers:
                    limit = t + 1  # decide again at the next step boundary
            if sim.is_idle():
                continue
            end = sim.begin(t, limit)
            if end is None:
                continue  # nothing the policy runs now: wait for a delivery
            rep.version += 1
            push(end, _END, rep, rep.version, rep.order)
        elif kind == _DELIVER and backpressure:
            # the server's router picks the replica, as without control; the call waits in
            # that replica's buffer until max-pressure has the replica take its class
            rep = a.route(t)
            c_rep[b.id] = rep_index[id(rep)]
            rep.calls += 1
            rep.buffered_work += ServerState.work(b)
            cls = b.tag
            buf = rep.buffers.setdefault(cls, deque())
            buf.append(b)
            queued[(rep.order, cls)] = len(buf)
            seen = class_work.setdefault(cls, [0, 0])
            seen[0] += ServerState.work(b)
            seen[1] += 1
            sim = rep.sim  # a step boundary decides what runs next
            if sim.busy_until > t:
                rep.version += 1
                push(sim.truncate(t), _END, rep, rep.version, rep.order)
            elif sim.busy_until < 0 and not rep.planned:
                if sim.now < t:
                    sim.idle_until(t)
                rep.planned = True
                push(t, _PLAN, rep, None, rep.order)
        elif kind == _DELIVER:
            rep = a.route(t)
            sim = rep.sim
            c_rep[b.id] = rep_index[id(rep)]
            rep.calls += 1
            if sim.busy_until >= t:  # a batch in progress (its end may be now): b joins at its end
                rep.held.append(b)
                rep.held_work += ServerState.work(b)
                # a plan that never read the waiting queue is the same whoever arrives: its
                # batch goes on (the time series counts b from the boundary after t)
                if sim.busy_until > t and not sim.batch[0].ignores_waiting:
                    end = sim.truncate(t)
                    rep.version += 1
                    push(end, _END, rep, rep.version, rep.order)
            else:
                if sim.busy_until < 0 and sim.now < t:
                    sim.idle_until(t)
                sim.add(b)
                if not rep.planned:
                    rep.planned = True
                    push(t, _PLAN, rep, None, rep.order)
        elif kind == _RESUME:
            advance(a, t)
        else:  # _JOB
            if b + 1 < n:
                push(job_times[b + 1], _JOB, job_types[b + 1], b + 1)
            job = _Job(b, a, t, _mix((own_base + b * _GOLDEN) & _MASK) if track_streams else 0)
            j_type.append(a)
            j_arr.append(t)
            j_fin.append(-1)
            j_calls.append(0)
            stream = _Stream(system_prompts[a], job.new_writer()) if track_streams else None
            advance(_Thread(job, spec.jobs[a].route, 0, None, stream), t)
        if progress is not None and done_jobs >= next_progress:
            progress(done_jobs, n)
            next_progress = done_jobs + progress_every

    if cut and now < max_time:
        now = max_time
    # calls still in flight at the stop: what they reached (admission, a first token,
    # preemptions) is recorded, as one server records its unfinished requests
    for rep in replicas:
        record_unfinished(rep.sim.state, c_ttft, c_queue, c_pre, c_hit)
    # the jobs due at or after the stop never arrived; they are listed all the same, as one
    # server lists the requests of its trace (the arrived jobs are the first, in order)
    late = len(j_arr)
    j_type.extend(job_types[late:])
    j_arr.extend(job_times[late:])
    j_fin.extend([-1] * (n - late))
    j_calls.extend([0] * (n - late))
    stuck = [rep for rep in replicas if not rep.sim.is_idle()]
    if stuck and max_time == UNLIMITED:
        raise SimulationStuck(
            f"the batch policy {stuck[0].sim.scheduler.batch.name!r} of {stuck[0].name} planned no work with "
            "requests waiting and no more arrivals"
        )
    for rep in replicas:
        steps_total += rep.sim.steps
    if progress is not None:
        progress(done_jobs, n)
    return NetworkStats(
        spec=spec,
        call_job=c_job,
        call_class=c_class,
        call_server=c_server,
        call_replica=c_rep,
        call_arrival=c_arr,
        call_prompt=c_prompt,
        call_output=c_out,
        call_queue=c_queue,
        call_ttft=c_ttft,
        call_e2e=c_e2e,
        call_preempt=c_pre,
        call_cached=c_cached,
        job_type=j_type,
        job_arrival=j_arr,
        job_finish=j_fin,
        job_calls=j_calls,
        job_type_names=[jt.name for jt in spec.jobs],
        replicas=[{"name": rep.name, "server": rep.pool.name, "index": rep.index, "sim": rep.sim} for rep in replicas],
        end_ns=now,
        steps=steps_total,
        stop_ns=None if max_time == UNLIMITED else max_time,
        call_hit=c_hit,
    )


__all__ = ["run_network", "NetworkStats", "ROUTERS", "CallOverCapacity"]
