"""Prefix caching: KV blocks of computed prompt prefixes, shared by every request whose
prompt starts the same way.

A prompt is a chain of `block_size`-token blocks; `Request.blocks` gives one id per full
block, each id standing for the block's content and everything before it, so two prompts
share exactly as many leading blocks as they have leading ids in common.

`PrefixCache` keeps the cached block ids. A block enters the cache only once a request has
computed all its tokens (`insert`), so a request never reuses KV that is still being
written; two requests that compute the same new prefix at the same time each keep a
private copy, and the first to finish a block is the one that gets cached. A block is
*referenced* while running requests hold it (`ref` > 0) and *free* otherwise: a free
block keeps its KV (a later prompt may still hit it) but may be evicted at any time,
least recently released first. `ServerState` does the KV accounting on top of it
(referenced blocks count once against the capacity, free ones count as free space).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import islice, takewhile


class PrefixCache:
    """Cached blocks by id: how many running requests hold each, and an LRU list of the
    free ones (see the module doc). Blocks are plain ids (no object per block: a cache
    holds millions of them), and the per-request operations work on lists of ids."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._ref: dict[int, int] = {}  # cached id -> running requests holding it
        self._free: OrderedDict[int, None] = OrderedDict()  # ref 0, least recently released first
        self.on_evict: Callable[[int], None] | None = None  # the engine frees the block's memory
        self.version = 0  # changes whenever a match could: lets callers reuse one
        # counters since creation (admissions, not lookups: a plan may look twice)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.queried_blocks = 0
        self.hit_blocks = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._ref)

    def __contains__(self, key: int) -> bool:
        return key in self._ref

    @property
    def n_free(self) -> int:
        """Cached blocks no running request holds (evictable)."""
        return len(self._free)

    def refs(self, key: int) -> int:
        """Running requests holding a cached block (-1: not cached)."""
        return self._ref.get(key, -1)

    # The per-request operations below loop in C (map, dict.update, deque(..., 0)) rather
    # than in Python: with 16-token blocks a long prompt is hundreds of blocks, and this
    # bookkeeping is most of what prefix caching costs the simulator.
    def match(self, keys: Sequence[int], limit: int, freed: set | frozenset = frozenset()) -> tuple[int, int]:
        """How many leading `keys` (at most `limit`) are cached, and how many of those are
        held by a running request (not counting those in `freed`). Changes nothing."""
        ref = self._ref
        head = keys[:limit] if limit < len(keys) else keys
        n = sum(1 for _ in takewhile(ref.__contains__, head))
        if not n:
            return 0, 0
        counts = list(map(ref.__getitem__, head[:n]))
        if freed:
            return n, sum(1 for k, c in zip(head[:n], counts) if c and k not in freed)
        return n, n - counts.count(0)

    def acquire(self, keys: Sequence[int]) -> int:
        """Hold cached blocks (hits): they can no longer be evicted. Returns how many were
        free (they take KV slots again)."""
        ref = self._ref
        counts = list(map(ref.__getitem__, keys))
        was_free = [k for k, c in zip(keys, counts) if not c]
        if was_free:
            deque(map(self._free.__delitem__, was_free), 0)
        ref.update(zip(keys, map((1).__add__, counts)))
        self.version += 1
        return len(was_free)

    def insert(self, key: int) -> bool:
        """Cache a block a request has just computed, held by that request; False if the id
        is cached already (the request keeps its own copy)."""
        ref = self._ref
        if key in ref:
            return False
        ref[key] = 1
        self.version += 1
        return True

    def release(self, keys: Sequence[int]) -> int:
        """A request lets go of `keys`, in this order (the first released is the first
        evicted); returns how many no one holds any more (they are now free)."""
        ref = self._ref
        counts = list(map(ref.__getitem__, keys))
        self.version += 1
        if counts.count(1) == len(counts):  # the usual case: it was their only holder
            ref.update(dict.fromkeys(keys, 0))
            self._free.update(dict.fromkeys(keys))
            return len(counts)
        left = [c - 1 for c in counts]
        ref.update(zip(keys, left))
        now_free = [k for k, c in zip(keys, left) if not c]
        self._free.update(dict.fromkeys(now_free))
        return len(now_free)

    def evict(self, n: int) -> int:
        """Drop up to `n` free blocks, least recently released first; returns how many."""
        free = self._free
        n = min(n, len(free))
        if not n:
            return 0
        keys = list(islice(free, n))
        deque(map(free.__delitem__, keys), 0)
        deque(map(self._ref.__delitem__, keys), 0)
        if self.on_evict is not None:
            for k in keys:
                self.on_evict(k)
        self.evictions += n
        self.version += 1
        return n

    def stats(self) -> dict:
        """Hit rates, tokens saved and evictions, for summaries and /metrics."""
        qt, qb = self.queried_tokens, self.queried_blocks
        return {
            "block_size": self.block_size,
            "queried_tokens": qt,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.hit_tokens / qt if qt else 0.0,
            "queried_blocks": qb,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": self.hit_blocks / qb if qb else 0.0,
            "prefill_tokens_saved": self.hit_tokens,
            "evictions": self.evictions,
            "cached_blocks": len(self._ref),
            "free_cached_blocks": len(self._free),
        }


def token_block_ids(tokens: Sequence[int], block_size: int) -> tuple[int, ...] | None:
    """`Request.blocks` of a prompt given as token ids: one id per full block, a 64-bit
    BLAKE2b digest of the previous block's id and the block's tokens (so equal ids mean
    equal prefixes, up to a 2**-64 chance per pair). None if the prompt has no full block."""
    n = len(tokens) // block_size
    if not n:
        return None
    data = array("q", tokens[: n * block_size]).tobytes()
    step = 8 * block_size
    out = []
    prev = b""
    for i in range(n):
        prev = hashlib.blake2b(prev + data[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little", signed=True))
    return tuple(out)


__all__ = ["PrefixCache", "token_block_ids"]
