"""Prefix caching: KV blocks of computed prompt prefixes, shared by every request whose
prompt starts the same way.

A prompt is a chain of `block_size`-token blocks; `Request.blocks` gives one id per full
block, each id standing for the block's content and everything before it (a prefix id),
so two prompts share exactly as many leading blocks as they have leading ids in common,
and an id is always at the same position of every prompt that has it.

`PrefixCache` keeps the cached blocks. A block enters the cache only once a request has
computed all its tokens (`insert`), so a request never reuses KV that is still being
written; two requests that compute the same new prefix at the same time each keep a
private copy, and the first to finish a block is the one that gets cached. A block is
*referenced* while running requests hold it (`ref` > 0) and *free* otherwise: a free
block keeps its KV (a later prompt may still hit it) but may be evicted at any time,
least recently released first, and of the blocks a request releases together its
deepest first. `ServerState` does the KV accounting on top of it (referenced blocks
count once against the capacity, free ones count as free space).

Runs. The cache stores *runs*, not blocks: a run is the blocks at positions lo..hi-1 of
one chain (`keys[lo:hi]`, `keys` being the prompt of the request that inserted them),
all with the same holders. A request's new blocks extend its own run, a hit holds whole
runs (the last one split where the hit ends: the radix-tree idea), a release frees whole
runs and eviction trims the least recently released run from its deep end. So the cost
is per run, not per block: with 16-token blocks a prompt is hundreds of blocks but only
a few runs. The rules stay those of single blocks (which are evicted, in which order,
what a hit counts): a run is only a set of blocks that would move together.

A request's holding (`Request.cached`) is a flat list `[run, hi, run, hi, ...]`: the
request holds positions run.lo..hi-1 of each, through the run and, if the run was split
since, the pieces split off it (`tail` links), which cannot be evicted while held.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Sequence

from .errors import ConfigError


class _Run:
    """Blocks keys[lo:hi] of one chain, held by `ref` requests. Free runs (ref 0) form a
    doubly linked LRU list through prev/next. `tail`: the piece split off at `hi`."""

    __slots__ = ("keys", "lo", "hi", "ref", "tail", "prev", "next")

    def __init__(self, keys: Sequence[int], lo: int, hi: int, ref: int):
        self.keys = keys
        self.lo = lo
        self.hi = hi
        self.ref = ref
        self.tail: _Run | None = None
        self.prev: _Run | None = None
        self.next: _Run | None = None


def _unsplit(held: list) -> bool:
    """Whether each run of a holding still ends where the holding does (no piece split off)."""
    for i in range(0, len(held), 2):
        if held[i].hi != held[i + 1]:
            return False
    return True


def _common_end(a: Sequence[int], b: Sequence[int], lo: int, hi: int) -> int:
    """The first position in lo..hi-1 where two chains that agree at `lo` differ (`hi` if
    none). Prefix ids agree up to some position and differ from there on, so a binary
    search finds it."""
    if a is b or a[hi - 1] == b[hi - 1]:
        return hi
    lo += 1  # they agree at lo
    hi -= 1  # and differ at hi - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class PrefixCache:
    """Cached blocks as runs (see the module doc), found by the id of their first block,
    with an LRU list of the free ones."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._head: dict[int, _Run] = {}  # id of a run's first block -> run
        # positions where runs start: how many, and the distinct ones in order. Hashing a
        # request's new ids to look for runs that start among them costs more than the rest
        # of an insert; usually no run starts at those positions at all, on any chain
        self._start_count: dict[int, int] = {}
        self._start_positions: list[int] = []
        self._lru = _Run((), 0, 0, 0)  # sentinel: next = least recently released
        self._lru.prev = self._lru.next = self._lru
        self._n_cached = 0
        self.n_free = 0  # cached blocks no running request holds (evictable); read-only outside
        self.on_evict: Callable[[int], None] | None = None  # the engine frees the block's memory
        self.version = 0  # changes whenever a match could: lets callers reuse one
        self.layout = 0  # changes whenever the set of cached blocks does (a match's length could)
        # counters since creation (admissions, not lookups: a plan may look twice)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.first_hit_tokens = 0  # hits at a request's first admission (not re-admissions after preemption)
        self.queried_blocks = 0
        self.hit_blocks = 0
        # the part of the counters above from re-admissions after a preemption (the
        # prompt and the tokens generated before it, looked up again): vLLM counts these
        # apart (preempted_queries / preempted_hits), not in its prefix_cache_queries / hits;
        # their hit tokens are the hit blocks times the block size (`stats`)
        self.preempted_queried_tokens = 0
        self.preempted_queried_blocks = 0
        self.preempted_hit_blocks = 0
        self.evictions = 0

    def __len__(self) -> int:
        return self._n_cached

    # ---- the per-request operations ---------------------------------------------------
    def _run_at(self, keys: Sequence[int], pos: int) -> _Run | None:
        """The run that starts with block `pos` of chain `keys`, if any. A run covering
        that block but starting before it would hold block pos - 1 too."""
        run = self._head.get(keys[pos])
        if run is not None and run.lo != pos:
            # the trace readers chain every id (a file cannot get here); a Trace or Request
            # built by hand can
            raise ConfigError(
                f"block id {keys[pos]} is at position {pos} of one prompt and {run.lo} of another: "
                "block ids must be prefix ids, each standing for its block and all before it "
                "(workload.blocks.chain_ragged makes them from per-block ids)"
            )
        return run

    def match(self, keys: Sequence[int], limit: int, freed: set | frozenset = frozenset()) -> tuple[int, int]:
        """How many leading `keys` (at most `limit`) are cached, and how many of those are
        held by a running request (not counting those of the runs in `freed`: see
        `let_go`). Changes nothing."""
        head = self._head
        if limit <= 0 or keys[0] not in head:  # the usual miss, without a walk
            return 0, 0
        limit = min(limit, len(keys))
        pos = held = 0
        while pos < limit:
            run = head.get(keys[pos])
            if run is None:
                break
            if run.lo != pos:
                self._run_at(keys, pos)  # raises
            end = run.hi if run.hi < limit else limit
            rk = run.keys
            if rk is not keys and rk[end - 1] != keys[end - 1]:
                end = _common_end(rk, keys, pos, end)
            if run.ref and run not in freed:
                held += end - pos
            pos = end  # the run's end, or where the prompt branches off it (another run may start there)
        return pos, held

    def acquire(self, keys: Sequence[int], n: int) -> tuple[list, int]:
        """Hold the first `n` blocks of `keys` (a hit: `match` found them cached): they can
        no longer be evicted. Returns the holding and how many of them were free (they
        take KV slots again)."""
        head = self._head
        held: list = []
        was_free = pos = 0
        while pos < n:
            run = head[keys[pos]]
            end = run.hi if run.hi < n else n
            rk = run.keys
            if rk is not keys and rk[end - 1] != keys[end - 1]:
                end = _common_end(rk, keys, pos, end)
            if end < run.hi:
                self._split(run, end)
            if not run.ref:
                self._unlink(run)
                was_free += end - pos
            run.ref += 1
            held += (run, end)
            pos = end
        self.n_free -= was_free
        self.version += 1
        return held, was_free

    def insert(
        self, keys: Sequence[int], start: int, end: int, held: list, on_insert: Callable[[int], None] | None = None
    ) -> int:
        """Blocks start..end-1 of `keys` are computed by the request whose holding is
        `held`: cache those not cached yet, held by it (`held` grows), and call
        `on_insert(position)` for each; a block cached already stays the request's
        private copy. Returns how many were cached."""
        head = self._head
        if held and held[-1] == start and on_insert is None:
            last = held[-2]
            # the usual case: the request's own run goes on, and none of the blocks is cached
            if last.hi == start and last.keys is keys and last.ref == 1 and last.tail is None:
                positions = self._start_positions  # no run starts among them (usually at no such position)
                i = bisect_left(positions, start)
                if i == len(positions) or positions[i] >= end or self._next_run_start(keys, start, end) == end:
                    last.hi = held[-1] = end
                    self._n_cached += end - start
                    self.version += 1
                    self.layout += 1
                    return end - start
        pos = start
        held_to = held[-1] if held else 0
        if held_to < start:
            # the request holds none of held_to..start-1 (private copies): a run starting
            # there may cover `start` too; the last run start before `start` decides
            positions = self._start_positions
            lo = bisect_left(positions, held_to)
            for p in reversed(positions[lo : bisect_left(positions, start, lo)]):
                run = self._run_at(keys, p)
                if run is not None:
                    if run.hi > start:
                        pos = max(start, _common_end(run.keys, keys, p, min(run.hi, end)))
                    break
        added = 0
        while pos < end:
            run = self._run_at(keys, pos)
            if run is not None:  # cached already: a private copy as far as the run goes
                pos = _common_end(run.keys, keys, pos, min(run.hi, end))
                continue
            # not cached, nor (no run covers pos - 1 beyond it) any block up to the next run start
            stop = self._next_run_start(keys, pos + 1, end)
            last = held[-2] if held and held[-1] == pos else None
            while last is not None and last.hi < pos:  # the piece that ends at pos
                last = last.tail
            if last is not None and last.keys is keys and last.ref == 1 and last.tail is None:
                last.hi = stop  # the request's own run goes on
                held[-1] = stop
            else:
                run = _Run(keys, pos, stop, 1)
                head[keys[pos]] = run
                self._add_start(pos)
                held += (run, stop)
            if on_insert is not None:
                for p in range(pos, stop):
                    on_insert(p)
            added += stop - pos
            pos = stop
        if added:
            self._n_cached += added
            self.version += 1
            self.layout += 1
        return added

    def any_cached(self, keys: Sequence[int], lo: int, hi: int, since: int = 0) -> bool:
        """Whether any of blocks lo..hi-1 of chain `keys` is cached. `since`: no run of the
        chain that starts before it reaches `lo` (the end of a holding: the block before it
        is cached, so no other run covers it). Changes nothing."""
        if lo >= hi:
            return False
        if self._next_run_start(keys, lo, hi) < hi:
            return True
        # a run that starts before lo: the last run start on the chain decides
        positions = self._start_positions
        a = bisect_left(positions, since)
        head = self._head
        for p in reversed(positions[a : bisect_left(positions, lo, a)]):
            run = head.get(keys[p])
            if run is not None:
                return run.lo != p or (run.hi > lo and _common_end(run.keys, keys, p, min(run.hi, lo + 1)) > lo)
        return False

    def release(self, held: list) -> tuple[int, int]:
        """A request lets go of its holding; returns how many blocks it held and how many
        of them no one holds any more (they are now free: its deepest blocks the first to
        be evicted)."""
        n = freed = 0
        lru = self._lru
        if len(held) == 2 and held[0].hi == held[1]:  # a single run
            runs = held[:1]
        else:  # deepest first
            runs = held[-2::-2] if _unsplit(held) else reversed(list(self.pieces(held)))
        for run in runs:
            n += run.hi - run.lo
            run.ref -= 1
            if not run.ref:  # to the most recently released end
                last = lru.prev
                run.prev = last
                run.next = lru
                last.next = lru.prev = run
                freed += run.hi - run.lo
        self.n_free += freed
        self.version += 1
        return n, freed

    def evict(self, n: int) -> int:
        """Drop up to `n` free blocks, least recently released first (a run from its deep
        end); returns how many."""
        lru = self._lru
        on_evict = self.on_evict
        run = lru.next
        if on_evict is None and run.hi - run.lo > n > 0:  # the usual case: the oldest run's deep end
            run.hi -= n
            self.n_free -= n
            self._n_cached -= n
            self.evictions += n
            self.version += 1
            self.layout += 1
            return n
        done = 0
        while done < n:
            run = lru.next
            if run is lru:
                break
            k = min(n - done, run.hi - run.lo)
            if on_evict is not None:
                for p in range(run.hi - 1, run.hi - k - 1, -1):
                    on_evict(run.keys[p])
            run.hi -= k
            done += k
            if run.hi == run.lo:
                self._unlink(run)
                del self._head[run.keys[run.lo]]
                self._drop_start(run.lo)
                run.tail = None
        if done:
            self.n_free -= done
            self._n_cached -= done
            self.evictions += done
            self.version += 1
            self.layout += 1
        return done

    # ---- holdings ------------------------------------------------------------------------
    @staticmethod
    def pieces(held: list) -> Iterator[_Run]:
        """The runs a holding covers, in chain order."""
        for i in range(0, len(held), 2):
            run = held[i]
            hi = held[i + 1]
            yield run
            while run.hi < hi:
                run = run.tail
                yield run

    def shared_blocks(self, held: list) -> int:
        """Blocks of a holding that others hold too, or nobody (ref != 1: not the
        holder's alone)."""
        return sum(run.hi - run.lo for run in self.pieces(held) if run.ref != 1)

    def let_go(self, held: list, left: dict) -> list:
        """The runs of a holding that no one holds once its holder lets go, after the
        holders counted in `left` did (run -> holders it has left: updated; empty before
        the first): what a set of preemptions frees, for `match`'s `freed`, a run whose
        holders are all preempted included. Changes nothing in the cache."""
        out = []
        for run in self.pieces(held):
            ref = run.ref
            if ref == 1:
                out.append(run)
            else:
                n = left.get(run, ref) - 1
                left[run] = n
                if not n:
                    out.append(run)
        return out

    # ---- internals -----------------------------------------------------------------------
    def _split(self, run: _Run, at: int) -> None:
        """Cut `run` at position `at`: it keeps lo..at-1 (its holders reach the rest through
        `tail`); a free run's deeper piece takes its place in the LRU, just before it."""
        piece = _Run(run.keys, at, run.hi, run.ref)
        piece.tail = run.tail
        run.hi = at
        run.tail = piece
        self._head[run.keys[at]] = piece
        self._add_start(at)
        if not run.ref:
            before = run.prev
            piece.prev = before
            piece.next = run
            before.next = run.prev = piece

    def _add_start(self, pos: int) -> None:
        count = self._start_count
        if pos in count:
            count[pos] += 1
        else:
            count[pos] = 1
            insort(self._start_positions, pos)

    def _drop_start(self, pos: int) -> None:
        count = self._start_count
        if count[pos] > 1:
            count[pos] -= 1
        else:
            del count[pos]
            positions = self._start_positions
            del positions[bisect_left(positions, pos)]

    def _next_run_start(self, keys: Sequence[int], lo: int, hi: int) -> int:
        """The first position in lo..hi-1 where a run starts on chain `keys` (`hi` if none).
        Only positions where some run starts are looked up; when there are many, the ids
        are (in C)."""
        positions = self._start_positions
        i = bisect_left(positions, lo)
        j = bisect_left(positions, hi, i)
        head = self._head
        if j - i <= 8:
            for p in positions[i:j]:
                if keys[p] in head:
                    return p
            return hi
        if head.keys().isdisjoint(keys[lo:hi]):
            return hi
        return next(p for p in range(lo, hi) if keys[p] in head)

    @staticmethod
    def _unlink(run: _Run) -> None:
        run.prev.next = run.next
        run.next.prev = run.prev
        run.prev = run.next = None

    # ---- inspection (tests, debugging: a walk over every run) -------------------------
    def blocks(self) -> dict[int, int]:
        """Every cached block id -> how many running requests hold it."""
        return {run.keys[p]: run.ref for run in self._head.values() for p in range(run.lo, run.hi)}

    def free_order(self) -> list[int]:
        """The free block ids, in the order they would be evicted."""
        out = []
        run = self._lru.next
        while run is not self._lru:
            out.extend(run.keys[p] for p in range(run.hi - 1, run.lo - 1, -1))
            run = run.next
        return out

    def check(self) -> list[str]:
        """What is inconsistent in the runs, the LRU list and the counters (tests)."""
        problems = []
        runs = list(self._head.values())
        ids = [run.keys[p] for run in runs for p in range(run.lo, run.hi)]
        if any(run.hi <= run.lo or self._head.get(run.keys[run.lo]) is not run for run in runs):
            problems.append("a run is empty or not found by its first id")
        if len(set(ids)) != len(ids) or len(ids) != self._n_cached:
            problems.append(f"{len(ids)} ids in the runs ({len(set(ids))} distinct), {self._n_cached} counted")
        free = []
        run = self._lru.next
        while run is not self._lru and len(free) <= len(runs):
            free.append(run)
            run = run.next
        if {id(r) for r in free} != {id(r) for r in runs if not r.ref} or len(free) != sum(not r.ref for r in runs):
            problems.append("the LRU list is not the runs no one holds")
        if sum(r.hi - r.lo for r in free) != self.n_free:
            problems.append("n_free differs from the free runs")
        starts: dict[int, int] = {}
        for r in runs:
            starts[r.lo] = starts.get(r.lo, 0) + 1
        if starts != self._start_count or sorted(starts) != self._start_positions:
            problems.append("the index of start positions differs from the runs")
        return problems

    def __contains__(self, key: int) -> bool:
        return key in self.blocks()

    def refs(self, key: int) -> int:
        """Running requests holding a cached block (-1: not cached)."""
        return self.blocks().get(key, -1)

    def stats(self) -> dict:
        """Hit rates, tokens saved and evictions, for summaries and /metrics."""
        qt, qb = self.queried_tokens, self.queried_blocks
        return {
            "block_size": self.block_size,
            "queried_tokens": qt,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": hit_rate(self.hit_tokens, qt),
            "queried_blocks": qb,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": hit_rate(self.hit_blocks, qb),
            "prefill_tokens_saved": self.hit_tokens,
            "first_admission_hit_tokens": self.first_hit_tokens,
            "preempted_queried_tokens": self.preempted_queried_tokens,
            "preempted_hit_tokens": self.preempted_hit_blocks * self.block_size,
            "preempted_queried_blocks": self.preempted_queried_blocks,
            "preempted_hit_blocks": self.preempted_hit_blocks,
            "evictions": self.evictions,
            "cached_blocks": self._n_cached,
            "free_cached_blocks": self.n_free,
        }


def hit_rate(hits: int, queried: int) -> float:
    """The share of the queried tokens (or blocks) that were cached: `PrefixCache.stats()`'s
    and, from summed counts, a network's (0.0 when none were queried)."""
    return hits / queried if queried else 0.0


def held_ids(held: list) -> list[int]:
    """The block ids of a holding (`Request.cached`), in chain order."""
    return [run.keys[p] for run in PrefixCache.pieces(held) for p in range(run.lo, run.hi)]


def token_block_ids(tokens: Sequence[int], block_size: int, salt: str | None = None) -> tuple[int, ...] | None:
    """`Request.blocks` of a prompt given as token ids: one id per full block, a 64-bit
    BLAKE2b digest of the previous block's id and the block's tokens (so equal ids mean
    equal prefixes, up to a 2**-64 chance per pair). None if the prompt has no full block.
    `salt` (vLLM's `cache_salt`) goes into the first block's digest, so only prompts with
    the same salt (or none) share ids."""
    n = len(tokens) // block_size
    if not n:
        return None
    data = array("q", tokens[: n * block_size]).tobytes()
    step = 8 * block_size
    out = []
    prev = b"" if salt is None else hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    for i in range(n):
        prev = hashlib.blake2b(prev + data[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little", signed=True))
    return tuple(out)


__all__ = ["PrefixCache", "held_ids", "hit_rate", "token_block_ids"]
