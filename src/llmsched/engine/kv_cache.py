"""Paged KV cache bookkeeping (torch-free): a free list of fixed-size blocks and the
arithmetic that turns token positions into cache slots.

The cache tensors themselves live in the runner: per layer `[kv_heads, num_blocks + 1,
block_size, head_dim]` for K and for V. The extra last block is a scratch block that no
sequence owns; padded rows of a CUDA-graph batch write there.

Sizing against the scheduler: the policy's `ServerState` counts KV in tokens. With
`num_blocks` blocks and at most `max_num_seqs` running sequences, a token capacity of
`(num_blocks - max_num_seqs) * block_size` can never overflow the blocks, since a
running sequence wastes less than one block to rounding.

Prefix caching (`LLMEngine(..., prefix_caching=True)`): a full prompt block, once
computed, belongs to the scheduler's prefix cache (`core.prefix_cache`), which counts it
once in the token capacity however many sequences' tables hold it; the engine maps each
cached block id to its physical block, puts the physical blocks of a reused prefix at the
head of a new sequence's table (no copy), frees only a sequence's own blocks when it
leaves, and frees a cached block's memory when the cache evicts it. The bound above still
holds: cached blocks are whole, and a sequence's own blocks waste less than one.
"""

from __future__ import annotations

from ..core.errors import ConfigError


class BlockAllocator:
    """Blocks `0 .. num_blocks - 1`, handed out on demand and returned when a sequence
    finishes or is preempted. A sequence's block table is a plain list of block ids."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(
                f"the KV cache needs at least one block of at least one token, got {num_blocks} blocks of {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def ensure(self, table: list[int], tokens: int) -> None:
        """Grow `table` so that it covers `tokens` positions."""
        need = self.blocks_for(tokens) - len(table)
        if need <= 0:
            return
        if need > len(self._free):
            raise RuntimeError(
                f"KV cache out of blocks: need {need}, {len(self._free)} free "
                f"(the scheduler's KV capacity is inconsistent with the cache)"
            )
        for _ in range(need):
            table.append(self._free.pop())

    def free(self, table: list[int]) -> None:
        self._free.extend(reversed(table))
        table.clear()

    def free_block(self, block: int) -> None:
        """Return one block (a prefix-cache block the cache evicted)."""
        self._free.append(block)

    def slots(self, table: list[int], start: int, end: int) -> list[int]:
        """Cache slots (block * block_size + offset) of positions `start .. end - 1`."""
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]


def token_capacity(
    num_blocks: int, block_size: int, max_num_seqs: int, knob: tuple[str, str] = ("kv_cache_gb", "--kv-cache-gb")
) -> int:
    """Scheduler KV capacity (tokens) that the block pool can always honour. `knob`: what
    sized the cache, as (Python argument, flag), named in the message when it is too small
    (`ModelRunner.kv_size_knob`: only `serve` has --num-blocks)."""
    cap = (num_blocks - max_num_seqs) * block_size
    if cap <= 0:
        raise ConfigError(
            f"the KV cache holds {num_blocks} blocks of {block_size} tokens, not enough for "
            f"max_num_seqs={max_num_seqs} sequences (a block each); give it more memory ({knob[0]}, {knob[1]}) "
            "or lower max_num_seqs (--max-running on the command line)"
        )
    return cap
