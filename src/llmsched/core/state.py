"""The state of one server at step boundaries: waiting queue, running requests, KV cache.

Both the simulator and the real engine keep their requests here and hand it, read-only,
to a policy's `plan()`. Then `begin_step(plan)` applies the plan's preemptions and
admissions, and `end_step(plan, end)` applies the tokens it computed.

Decoders are kept in decode order (arrival, then id). A plan serves a prefix of them, and
the served prefix is tracked lazily: a decoder served every step advances with a shared
round counter, so a step costs O(1) in the number of decoders, not O(decoders).

KV cache (token granularity, vLLM V0 style): admission reserves the whole prefill of a
request; each decode token then takes one more slot. When the decoders of a step do not
fit, the policy preempts the most recently admitted running request, which frees its slots
and returns to the head of the waiting queue (preempted requests oldest first, by
arrival) to be recomputed (prefill of prompt + tokens emitted so far).

Prefix caching (`Constraints.prefix_block_size`; off by default, and then nothing below
applies): full prompt blocks a request has computed go into a `PrefixCache`. On
admission a request reuses the longest cached prefix of its `blocks` (at most
prefill_target - 1 tokens: the last prompt token is always computed, as it samples the
first output token): `prefilled` starts there, and those tokens are neither computed nor
charged in a step's token load. `kv_used` then counts each request's private slots
(its context `r.kv` less the cached blocks it holds) plus every cached block some running
request holds, once however many hold it;
cached blocks no one holds count as free space and are evicted (least recently released
first) as soon as the slots are needed. A waiting request's `prefilled` stays 0 until it
is admitted: the planner asks `admission_need` what admitting it would take.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from .constraints import Constraints
from .plan import StepPlan
from .prefix_cache import PrefixCache
from .request import DECODE, DONE, PREFILL, WAITING, Request

UNLIMITED = 1 << 62


class WaitingQueue:
    """Waiting requests in admission order: preempted requests first (oldest first), then
    the others in arrival order, or in the order of an admission key (shortest prompt...)."""

    def __init__(self, key: Callable[[Request], tuple] | None = None):
        self._key = key
        self._preempted: list[Request] = []
        self._fifo: deque[Request] | None = deque() if key is None else None
        self._heap: list[tuple] = []
        self._seq = 0

    def push(self, r: Request) -> None:
        if self._fifo is not None:
            self._fifo.append(r)
        else:
            heapq.heappush(self._heap, (self._key(r), self._seq, r))
            self._seq += 1

    def push_preempted(self, r: Request) -> None:
        insort(self._preempted, r, key=lambda q: q.key)

    def is_preempted(self, r: Request) -> bool:
        """Whether `r` waits with the preempted requests, at the head of the queue."""
        return any(q is r for q in self._preempted)

    def __len__(self) -> int:
        return len(self._preempted) + (len(self._fifo) if self._fifo is not None else len(self._heap))

    def __bool__(self) -> bool:
        return bool(self._preempted) or bool(self._fifo if self._fifo is not None else self._heap)

    def first(self) -> Request | None:
        if self._preempted:
            return self._preempted[0]
        if self._fifo is not None:
            return self._fifo[0] if self._fifo else None
        return self._heap[0][2] if self._heap else None

    def __iter__(self) -> Iterator[Request]:
        """In admission order, lazily (a heap is walked in O(k log k) for k items)."""
        if not self._preempted and self._fifo is not None:
            return iter(self._fifo)  # the common case, without a generator
        return self._walk()

    def _walk(self) -> Iterator[Request]:
        yield from self._preempted
        if self._fifo is not None:
            yield from self._fifo
            return
        heap = self._heap
        if not heap:
            return
        frontier = [(heap[0], 0)]
        while frontier:
            entry, i = heapq.heappop(frontier)
            yield entry[2]
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))

    def remove(self, r: Request) -> None:
        if self._preempted and r in self._preempted:
            self._preempted.remove(r)
        elif self._fifo is not None:
            if self._fifo[0] is r:
                self._fifo.popleft()
            else:
                self._fifo.remove(r)
        elif self._heap[0][2] is r:
            heapq.heappop(self._heap)
        else:
            self._heap = [e for e in self._heap if e[2] is not r]
            heapq.heapify(self._heap)


def _key(r: Request) -> tuple:
    return r.key


class ServerState:
    """Requests of one server and their progress. Policies read it; only the driver
    (simulator or engine) changes it, through `add`, `begin_step`, `end_step`, `finish`."""

    def __init__(self, constraints: Constraints, waiting_key: Callable[[Request], tuple] | None = None):
        self.constraints = constraints
        self.b_max = constraints.b_max
        self.k_max = constraints.k_max if constraints.k_max else UNLIMITED
        self.kv_capacity = constraints.kv_capacity if constraints.kv_capacity else UNLIMITED
        self.now = 0  # ns, the current step boundary
        self.waiting = WaitingQueue(waiting_key)
        # of the waiting requests, those a driver added during the step whose feedback is
        # being taken (the serverless runtime adds an arrival at once; the simulator, the
        # virtual GPU and the engine at the next step boundary): set by that driver around
        # the feedback call, so that `waiting_after_step` is the same in every driver
        self.joining = 0
        self.prefilling: list[Request] = []  # running, in prefill; admission order
        # with class priorities (a network server's `priority`), running prefills are kept in
        # key order too, so a higher class's chunks go first even after a lower one was admitted
        self.prefill_by_key = False
        self.running: dict[int, Request] = {}  # all running; admission order, newest last
        self._dec: list[Request] = []  # decoders in decode order
        self._dec_keys: list[tuple] = []
        self._m = 0  # decoders [0, _m) are active
        self._round = 0  # steps taken by active decoders
        self._heap: list[tuple[int, int, Request]] = []  # (finish round, act_seq, decoder)
        self._act = 0
        self._kv_off = 0  # sum(kv - round0) over active decoders
        self.kv_used = 0
        self.backlog_tokens = 0  # work left of every request in the system
        self.waiting_tokens = 0  # of that, work of waiting requests
        self.pending_prefill = 0  # prefill tokens not computed yet
        self.newly_active: Sequence[Request] = ()  # decoders resumed by the last begin_step
        self.finished: list[Request] = []  # requests done in the last end_step
        self.first_tokens: list[Request] = []  # prefills completed in the last end_step
        self.resumed: list[tuple[Request, int]] = []  # recomputes completed: (request, gap ns)
        bs = constraints.prefix_block_size
        self.prefix: PrefixCache | None = PrefixCache(bs) if bs else None
        # the engine's hook: block `j` of request `r`'s prompt is computed and now cached
        self.on_cached: Callable[[Request, int], None] | None = None
        # the last lookup: (request, its limit, cache layout, blocks cached, cache version, of
        # those held by others); the length holds while the layout does, the count while nothing changes
        self._match_memo: tuple = (None, -1, -1, 0, -1, 0)

    # ---- read-only view for policies -------------------------------------------------
    @property
    def waiting_after_step(self) -> int:
        """Waiting requests when a step's feedback is taken, without those that arrived
        during the step (they join at the next step boundary: `joining`)."""
        return len(self.waiting) - self.joining

    @property
    def n_decoding(self) -> int:
        return len(self._dec)

    @property
    def decoders(self) -> list[Request]:
        """Decoders in decode order. Do not modify."""
        return self._dec

    @property
    def n_running(self) -> int:
        return len(self.running)

    @property
    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used

    @property
    def outstanding_tokens(self) -> int:
        """Work left of the running requests (K_t of Token Window Pacing)."""
        return self.backlog_tokens - self.waiting_tokens

    def decoders_before(self, key: tuple) -> int:
        """How many decoders come before `key` in decode order."""
        return bisect_left(self._dec_keys, key)

    def footprint(self, r: Request) -> int:
        """KV slots a running request holds: what preempting it frees (with prefix caching,
        its private slots and the cached blocks no one else holds, which become free)."""
        kv = r.kv + self._round - r.round0 if r.active else r.kv
        if r.cached:
            kv -= self.prefix.block_size * self.prefix.shared_blocks(r.cached)
        return kv

    def preemption_frees(self, r: Request, left: dict) -> tuple[int, list]:
        """Preempting running request `r` after the victims counted in `left` (the prefix
        cache's runs -> holders left, `PrefixCache.let_go`; updated): the KV slots it frees
        (its `footprint`, and the cached blocks it shared with earlier victims only, which
        no one holds now) and the runs no one holds (for `match`'s `freed`)."""
        kv = self.footprint(r)
        if not r.cached:
            return kv, []
        pc = self.prefix
        runs = pc.let_go(r.cached, left)
        for run in runs:
            if run.ref > 1:  # (a run it alone held is in its footprint)
                kv += (run.hi - run.lo) * pc.block_size
        return kv, runs

    def emitted(self, r: Request) -> int:
        return r.emitted + self._round - r.round0 if r.active else r.emitted

    def is_idle(self) -> bool:
        return not self.running and not self.waiting

    def admission_need(self, r: Request, freed: set | frozenset = frozenset()) -> tuple[int, int]:
        """(prefill tokens already done, KV slots admission takes) of a waiting request.
        With prefix caching: its longest cached prefix, of which the blocks that running
        requests hold already take no new slots, except those in `freed` (the cached runs
        whose holders the plan all preempts, `PrefixCache.let_go`: counted as freed). Changes
        nothing."""
        pc = self.prefix
        if pc is None or r.blocks is None or r.prefilled or not r.reuse_prefix:
            return r.prefilled, r.prefill_target
        bs = pc.block_size
        memo = self._match_memo
        if memo[0] is r and memo[4] == pc.version and memo[1] == r.prefill_target and not freed:
            n, held = memo[3], memo[5]  # a refused head, asked again
        else:
            n, held = pc.match(r.blocks, (r.prefill_target - 1) // bs, freed)
            if not freed:
                self._match_memo = (r, r.prefill_target, pc.layout, n, pc.version, held)
        return n * bs, r.prefill_target - held * bs

    def prefix_stats(self) -> dict | None:
        """Prefix-cache hit rates, prefill tokens saved, evictions (None when off)."""
        return None if self.prefix is None else self.prefix.stats()

    @staticmethod
    def work(r: Request) -> int:
        """Token processings a not-yet-running request still needs."""
        return r.prefill_target - r.prefilled + r.output - r.emitted - 1

    # ---- changes, by the driver ----------------------------------------------------
    def add(self, r: Request) -> None:
        """A new arrival joins the waiting queue."""
        fifo = self.waiting._fifo
        if fifo is not None:
            fifo.append(r)  # WaitingQueue.push, inline
        else:
            self.waiting.push(r)
        w = r.prefill_target - r.prefilled + r.output - r.emitted - 1  # work(r)
        self.backlog_tokens += w
        self.waiting_tokens += w
        # a request may arrive with part of its prompt's KV computed elsewhere (`prefilled`)
        self.pending_prefill += r.prefill_target - r.prefilled

    def begin_step(self, plan: StepPlan, now: int) -> tuple[int, int, list[tuple[int, int]], int]:
        """Apply preemptions, admissions and the served decode prefix.

        Returns (prefill tokens, decode context tokens, [(chunk, context)], sampled):
        what a cost model needs to time the step. `newly_active` lists the decoders that
        resume after a pause (their inter-token gap is longer than the step)."""
        self.now = now
        if plan.preempt:
            for r in plan.preempt:
                self._preempt(r, now)
        m = plan.decode
        cur = self._m
        if cur == m:
            self.newly_active = ()  # most batches serve the decoders the last one did
        else:
            new = self.newly_active = []
            dec = self._dec
            while cur < m:
                r = dec[cur]
                self._activate(r)
                new.append(r)
                cur += 1
            while cur > m:
                cur -= 1
                self._pause(dec[cur], now)
            self._m = cur
        prefill = 0
        sampled = m
        chunks = []
        add_chunk = chunks.append
        for r, n in plan.prefill:
            if r.phase == WAITING:
                self._admit(r, now)
            p = r.prefilled
            add_chunk((n, p))
            prefill += n
            if p + n == r.prefill_target:
                sampled += 1
        pc = self.prefix
        if pc is not None and pc.n_free:  # free cached blocks give way to this step's decode tokens
            k = self.blocks_to_evict(m)
            if k:
                pc.evict(k)
        return prefill, self._kv_off + m * self._round, chunks, sampled

    def end_step(self, plan: StepPlan, end: int, steps: int = 1) -> None:
        """Apply `steps` repetitions of `plan`, the last ending at `end`.

        Fills `finished` and `first_tokens`. Only the last repetition may complete a
        prefill or a request (the simulator's fast path guarantees it)."""
        m = plan.decode
        rnd = self._round = self._round + steps
        self.kv_used += steps * m
        pc = self.prefix
        last = steps  # the steps whose prefill chunks the loop below applies
        if pc is not None and steps > 1 and pc.n_free:
            # the decode tokens of repeated steps evict what each step's start would have,
            # before anything this batch frees (as the step-by-step path does)
            k = self.blocks_to_evict(0)
            if k:
                if plan.prefill:
                    # blocks the prefills complete before the last step go into the cache
                    # between evictions, as step by step (`_interleave`)
                    last -= self._interleave(plan, steps)
                if pc.n_free:
                    k = self.blocks_to_evict(0)
                    if k:
                        pc.evict(k)
        self.finished = finished = []
        self.first_tokens = firsts = []
        self.resumed = resumed = []
        prefill = 0
        completed = None
        for r, n in plan.prefill:
            r.prefilled += last * n
            prefill += n
            if pc is not None and r.blocks is not None and r.next_block < r.prefilled // pc.block_size:
                self._cache_blocks(r)  # it completed blocks: cache them
            if r.prefilled == r.prefill_target:
                if completed is None:
                    completed = [r]
                else:
                    completed.append(r)
        work = steps * (m + prefill)
        self.backlog_tokens -= work
        self.pending_prefill -= work - steps * m
        heap = self._heap
        while heap and heap[0][0] <= rnd:
            fr, seq, r = heapq.heappop(heap)
            if r.active and r.act_seq == seq:  # an active decoder has all its tokens
                # _remove_decoder(r, end) and _retire(r, end), inline
                done = rnd - r.round0
                self._kv_off -= r.kv - r.round0
                r.emitted += done
                kv = r.kv = r.kv + done
                r.active = False
                if done:
                    r.last_emit = end
                dec = self._dec
                pos = 0 if dec[0] is r else bisect_left(self._dec_keys, r.key)
                del dec[pos]
                del self._dec_keys[pos]
                if pos < self._m:
                    self._m -= 1
                self.kv_used -= kv
                if r.cached is not None:
                    self._release_blocks(r)
                del self.running[r.id]
                r.phase = DONE
                r.finish = end
                finished.append(r)
        if completed is not None:
            for r in completed:
                self.prefilling.remove(r)
                r.emitted += 1
                if r.first_token < 0:
                    r.first_token = end
                    firsts.append(r)
                else:  # a recompute after preemption emits the next token
                    resumed.append((r, end - r.last_emit))
                r.last_emit = end
                if r.emitted >= r.output:
                    self._retire(r, end)
                    finished.append(r)
                else:
                    self._start_decode(r)
        self.now = end

    def _interleave(self, plan: StepPlan, steps: int) -> int:
        """Of a batch of `steps` repetitions of a plan with prefill chunks whose decode
        tokens evict cached blocks: apply its first steps one at a time, up to the last one
        before the final step in which a chunk completes a prompt block that is cached
        already, each caching the blocks its chunks complete, then the next step's start
        evicting for its decode tokens. Returns how many steps it applied (0: no chunk completes a block cached
        already before the final step, so the evictions may all come first, as in one go).
        In one go, a request completing a block whose cached copy (held by no one) an
        eviction inside the batch drops would cache its own copy; step by step it completes
        the block while the cached copy is still there, keeps its own private, and the
        block leaves the cache."""
        pc = self.prefix
        bs = pc.block_size
        upto = 0  # the last step before the final one in which such a block completes
        for r, n in plan.prefill:
            blocks = r.blocks
            if blocks is not None:
                b = (r.prefilled + (steps - 1) * n) // bs
                if b > len(blocks):
                    b = len(blocks)
                j = r.next_block
                # only a block cached already (a copy an eviction may drop) can end up
                # elsewhere: a new one is the request's own run either way
                if b > j and pc.any_cached(blocks, j, b, r.cached[-1] if r.cached else 0):
                    # the step that caches block b - 1 (the first: blocks the request
                    # arrived with, computed elsewhere, enter the cache at its end)
                    i = max(1, -(-(b * bs - r.prefilled) // n))
                    if i > upto:
                        upto = i
        if not upto:
            return 0
        m = plan.decode
        used = self.kv_used
        self.kv_used = used - (steps - 1) * m  # at the end of the first step
        for i in range(upto):
            for r, n in plan.prefill:
                r.prefilled += n
                if r.blocks is not None and r.next_block < r.prefilled // bs:
                    self._cache_blocks(r)
            if i + 1 < upto:
                self.kv_used += m  # the next step's start evicts for its decode tokens
                if pc.n_free:
                    k = self.blocks_to_evict(0)
                    if k:
                        pc.evict(k)
        self.kv_used = used  # (the caller evicts for the steps after `upto`)
        return upto

    def next_completion_round(self) -> int:
        """Steps until the first active decoder finishes (UNLIMITED if none)."""
        heap = self._heap
        while heap:
            fr, seq, r = heap[0]
            if r.active and r.act_seq == seq:
                return fr - self._round
            heapq.heappop(heap)
        return UNLIMITED

    def finish(self, r: Request, end: int) -> None:
        """End a request before it has all its tokens (a stop string, EOS, an abort)."""
        if r.phase == WAITING:
            self.waiting.remove(r)
            w = self.work(r)
            self.waiting_tokens -= w
            self.backlog_tokens -= w
            self.pending_prefill -= r.prefill_target - r.prefilled
            r.phase = DONE
            r.finish = end
            return
        if r.phase == PREFILL:
            self.prefilling.remove(r)
            self.pending_prefill -= r.prefill_target - r.prefilled
            self.backlog_tokens -= r.prefill_target - r.prefilled + r.output - r.emitted - 1
        elif r.phase == DECODE:
            self._remove_decoder(r, end)
            self.backlog_tokens -= r.output - r.emitted
        else:
            return
        self._retire(r, end)

    # ---- internals ------------------------------------------------------------------
    def _admit(self, r: Request, now: int) -> None:
        w = self.waiting
        fifo = w._fifo
        if fifo and fifo[0] is r and not w._preempted:
            fifo.popleft()  # WaitingQueue.remove of its head, inline
        else:
            w.remove(r)
        self.waiting_tokens -= r.prefill_target - r.prefilled + r.output - r.emitted - 1  # work(r)
        r.phase = PREFILL  # `prefilled` is 0, or the tokens whose KV arrived with the request
        r.kv = r.prefill_target  # with prefix caching too: `kv` is its context, shared or not
        self.kv_used += r.kv if self.prefix is None else self._reuse(r)
        self.running[r.id] = r
        if self.prefill_by_key:
            insort(self.prefilling, r, key=_key)
        else:
            self.prefilling.append(r)
        if r.first_scheduled < 0:
            r.first_scheduled = now

    def _preempt(self, r: Request, now: int) -> None:
        if r.phase == DECODE:
            self._remove_decoder(r, now)
            processed = r.kv
        else:
            self.prefilling.remove(r)
            processed = r.prefilled
            self.pending_prefill -= r.prefill_target - r.prefilled
        self.kv_used -= r.kv
        if r.cached is not None:
            self._release_blocks(r)
        del self.running[r.id]
        self.backlog_tokens += processed
        r.phase = WAITING
        r.prefill_target = r.prompt + r.emitted
        r.prefilled = 0
        r.kv = 0
        r.preemptions += 1
        self.waiting.push_preempted(r)
        self.waiting_tokens += self.work(r)
        self.pending_prefill += r.prefill_target

    def _start_decode(self, r: Request) -> None:
        r.phase = DECODE
        keys = self._dec_keys
        key = r.key
        if not keys or keys[-1] < key:  # the newest decoder: at the end
            pos = len(keys)
            self._dec.append(r)
            keys.append(key)
        else:
            pos = bisect_left(keys, key)
            self._dec.insert(pos, r)
            keys.insert(pos, key)
        if pos < self._m:
            self._activate(r)
            self._m += 1

    def _remove_decoder(self, r: Request, now: int) -> None:
        if r.active:
            self._pause(r, now)
        pos = bisect_left(self._dec_keys, r.key)
        del self._dec[pos]
        del self._dec_keys[pos]
        if pos < self._m:
            self._m -= 1

    def _retire(self, r: Request, end: int) -> None:
        self.kv_used -= r.kv
        if r.cached is not None:
            self._release_blocks(r)
        del self.running[r.id]
        r.phase = DONE
        r.finish = end

    def _activate(self, r: Request) -> None:
        rnd = self._round
        r.active = True
        r.round0 = rnd
        self._act += 1
        r.act_seq = self._act
        self._kv_off += r.kv - rnd
        heapq.heappush(self._heap, (rnd + r.output - r.emitted, self._act, r))

    def _pause(self, r: Request, now: int) -> None:
        done = self._round - r.round0
        self._kv_off -= r.kv - r.round0
        r.emitted += done
        r.kv += done
        r.active = False
        if done:
            r.last_emit = now

    # ---- prefix caching ---------------------------------------------------------------
    def _reuse(self, r: Request) -> int:
        """Admission with prefix caching: hold the longest cached prefix (as
        `admission_need` found it); returns the slots admission takes: the rest of the
        prompt, private, and the reused blocks that were free."""
        pc = self.prefix
        bs = pc.block_size
        n = 0
        if r.blocks is not None:
            pc.queried_blocks += len(r.blocks)
            if r.preemptions:  # a re-admission: counted apart as well (vLLM's preempted_queries)
                pc.preempted_queried_blocks += len(r.blocks)
            if not r.prefilled and r.reuse_prefix:  # KV that arrived with the request is its own
                memo = self._match_memo
                if memo[0] is r and memo[2] == pc.layout and memo[1] == r.prefill_target:
                    n = memo[3]  # as the plan found it (holders may have changed since, not the blocks)
                else:
                    n, _ = pc.match(r.blocks, (r.prefill_target - 1) // bs)
        pc.queried_tokens += r.prefill_target
        if r.preemptions:
            pc.preempted_queried_tokens += r.prefill_target
        r.next_block = n
        if not n:
            r.cached = []
            return r.kv
        r.cached, was_free = pc.acquire(r.blocks, n)
        hit = n * bs
        pc.hit_blocks += n
        pc.hit_tokens += hit
        if r.preemptions:
            pc.preempted_hit_blocks += n
        else:
            pc.first_hit_tokens += hit
            r.first_hit = hit
        r.prefilled = hit
        self.backlog_tokens -= hit
        self.pending_prefill -= hit
        return r.kv - hit + bs * was_free

    def _cache_blocks(self, r: Request) -> None:
        """Cache the prompt blocks `r` has finished computing. A block already cached (by
        a request that computed the same prefix alongside) stays `r`'s private copy;
        moving the others to the cache leaves kv_used unchanged (their slots were r's)."""
        blocks = r.blocks
        j = r.next_block
        upto = r.prefilled // self.prefix.block_size
        if upto > len(blocks):
            upto = len(blocks)
        if j < upto:
            hook = self.on_cached
            self.prefix.insert(blocks, j, upto, r.cached, None if hook is None else partial(hook, r))
            r.next_block = upto

    def _release_blocks(self, r: Request) -> None:
        """After `kv_used -= r.kv`: its cached blocks were not private, and those no one
        holds any more become free."""
        held, freed = self.prefix.release(r.cached)
        self.kv_used += self.prefix.block_size * (held - freed)
        r.cached = None
        r.next_block = 0

    def blocks_to_evict(self, extra: int) -> int:
        """Free cached blocks that must go so that they, the used slots and `extra` more fit."""
        pc = self.prefix
        over = self.kv_used + extra + pc.n_free * pc.block_size - self.kv_capacity
        return min(pc.n_free, -(-over // pc.block_size)) if over > 0 else 0
