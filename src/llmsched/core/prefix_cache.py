"""Prefix caching: KV blocks of computed prompt prefixes, shared by every request whose
prompt starts the same way.

A prompt is a chain of `block_size`-token blocks; `Request.blocks` gives one id per full
block, each id standing for the block's content and everything before it, so two prompts
share exactly as many leading blocks as they have leading ids in common.

`PrefixCache` maps ids to `Block`s. A block enters the cache only once a request has
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
from collections import OrderedDict
from collections.abc import Callable, Sequence


class Block:
    """One cached block: its id, how many running requests hold it, and the driver's data
    (the engine's physical block number)."""

    __slots__ = ("key", "ref", "data")

    def __init__(self, key: int, data=None):
        self.key = key
        self.ref = 0
        self.data = data

    def __repr__(self) -> str:
        return f"Block(key={self.key}, ref={self.ref}, data={self.data})"


class PrefixCache:
    """Cached blocks by id, with an LRU list of the free ones (see the module doc)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._blocks: dict[int, Block] = {}
        self._free: OrderedDict[int, Block] = OrderedDict()  # least recently released first
        self.on_evict: Callable[[Block], None] | None = None  # the engine frees the block's memory
        # counters since creation (admissions, not lookups: a plan may look twice)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.queried_blocks = 0
        self.hit_blocks = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    @property
    def n_free(self) -> int:
        """Cached blocks no running request holds (evictable)."""
        return len(self._free)

    def get(self, key: int) -> Block | None:
        return self._blocks.get(key)

    def match(self, keys: Sequence[int], limit: int, freed: set | frozenset = frozenset()) -> tuple[int, int]:
        """How many leading `keys` (at most `limit`) are cached, and how many of those are
        held by a running request (not counting those in `freed`). Changes nothing."""
        blocks = self._blocks
        n = held = 0
        for k in keys:
            if n >= limit:
                break
            b = blocks.get(k)
            if b is None:
                break
            n += 1
            if b.ref and k not in freed:
                held += 1
        return n, held

    def acquire(self, key: int) -> Block:
        """Hold a cached block (a hit); it can no longer be evicted."""
        b = self._blocks[key]
        if not b.ref:
            del self._free[key]
        b.ref += 1
        return b

    def insert(self, key: int, data=None) -> Block | None:
        """Cache a block that a request has just computed, held by that request; None if
        the id is cached already (the request keeps its own copy)."""
        if key in self._blocks:
            return None
        b = self._blocks[key] = Block(key, data)
        b.ref = 1
        return b

    def release(self, b: Block) -> bool:
        """A request lets go of `b`; True if no one holds it any more (it is now free)."""
        b.ref -= 1
        if b.ref:
            return False
        self._free[b.key] = b
        return True

    def evict(self, n: int) -> int:
        """Drop up to `n` free blocks, least recently released first; returns how many."""
        free = self._free
        n = min(n, len(free))
        for _ in range(n):
            key, b = free.popitem(last=False)
            del self._blocks[key]
            if self.on_evict is not None:
                self.on_evict(b)
        self.evictions += n
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
            "cached_blocks": len(self._blocks),
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


__all__ = ["Block", "PrefixCache", "token_block_ids"]
