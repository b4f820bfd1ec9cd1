"""Prompt block ids for prefix caching, computed on whole traces with numpy.

A request's `blocks` hold one id per FULL block of its prompt at the cache's block size
(`DEFAULT_BLOCK_SIZE` tokens unless told), each id standing for the block's content and
everything before it (a prefix hash, `chain_ragged`), so two requests share a cached prefix exactly as
far as their leading ids agree. A trace keeps them ragged: a flat int64 array `ids` and
offsets `ptr` (n + 1 entries; request i owns ids[ptr[i]:ptr[i + 1]]).

Hashing is 64-bit splitmix64 mixing on uint64 arrays: not cryptographic, but two
different prefixes collide with probability about 2**-64 per pair, and every id is a
pure function of its inputs, so the same trace, seed and block size give the same ids.

Changing the block size (`reblock`): from source blocks of S tokens to cache blocks of b,
- b divides S: source block i becomes S/b ids chain(c_i, j), j = 0..S/b-1, where c_i is
  the chained source id (it already stands for everything up to the end of block i);
- S divides b: cache block m is source blocks m*b/S .. (m+1)*b/S - 1, and its id is the
  chained id of the last of them (which stands for the whole cache block and its prefix);
- anything else is refused (a cache block would straddle a source boundary, whose
  content the source ids do not describe).
Either way a request keeps at most prompt // b ids (a partial last block has none) and no
more than its source ids cover.
"""

from __future__ import annotations

import numpy as np

from ..core.constraints import check_prefix_block_size
from ..core.errors import ConfigError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "check_block_size",
    "mix",
    "seed_bits",
    "mix_int",
    "chain_int",
    "chain",
    "chain_ragged",
    "reblock",
    "reblock_ratio",
    "take_rows",
    "as_tuples",
    "as_views",
]

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROOT = np.uint64(0x2545F4914F6CDD1D)  # the "empty prefix" every chain starts from
# golden, root, m1, m2 as Python ints, for code that chains one id at a time
INT_CONSTANTS = (int(_GOLDEN), int(_ROOT), int(_M1), int(_M2))


def check_block_size(b, what: str = "block_size") -> int:
    """A block size as an int in 1..MAX_BLOCK_SIZE tokens, the rule and the messages of
    `core.constraints.check_prefix_block_size`; a whole number written as text ('32', a
    column name's) or as a float (32.0) is taken too. ConfigError otherwise."""
    v = b
    if not isinstance(b, bool):
        try:
            as_int = int(b)
            if as_int == float(b):
                v = as_int
        except (TypeError, ValueError, OverflowError):
            pass
    return check_prefix_block_size(v, what)


def mix(x) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


_MASK64 = (1 << 64) - 1
_WIDE_SEED_SALT = 0x57DE5EEDF01D0001  # starts the fold of a seed of 2**64 or more


def mix_int(x: int) -> int:
    """`mix` on one Python int in [0, 2**64)."""
    x = ((x ^ (x >> 30)) * int(_M1)) & _MASK64
    x = ((x ^ (x >> 27)) * int(_M2)) & _MASK64
    return x ^ (x >> 31)


def chain_int(prev: int, value: int) -> int:
    """`chain` on Python ints: the id of a block of content `value` after the prefix whose
    id is `prev`."""
    return mix_int((prev * int(_GOLDEN) + mix_int((value + int(_GOLDEN)) & _MASK64)) & _MASK64)


def seed_bits(seed: int) -> int:
    """A seed (a whole number >= 0, however large) as 64 bits for hashing block contents:
    a seed below 2**64 is itself (its ids unchanged); a larger one is folded, 64-bit word
    by word with its word count, through splitmix64, so that it lands on no particular
    smaller seed (2**64 is not seed 0, as masking would make it)."""
    seed = int(seed)
    if seed <= _MASK64:
        return seed
    words = []
    while seed:
        words.append(seed & _MASK64)
        seed >>= 64
    h = mix_int((_WIDE_SEED_SALT + len(words)) & _MASK64)
    for w in words:
        h = chain_int(h, w)
    return h


def chain(prev, value) -> np.ndarray:
    """The id of a block with content `value` after a prefix whose id is `prev` (uint64)."""
    prev = np.asarray(prev, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix(prev * _GOLDEN + mix(np.asarray(value).astype(np.uint64) + _GOLDEN))


def chain_ragged(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Prefix ids of ragged rows of per-block content values (int64 in, int64 out): id k
    of a row stands for the row's values 0..k, so two rows' ids agree exactly as far as
    their values do (up to 64-bit collisions).

    The prefix hash is polynomial, H_k = P * H_(k-1) + x_k (mod 2**64) with x = mix(value),
    which unrolls to P**k * sum_(i <= k) x_i * P**-i (P odd, so invertible): a cumulative
    sum instead of one step per block position. The id is mix(H_k) with the position
    folded in. Rows are hashed about 65,536 ids at a time, so the temporaries stay
    small (memory traffic, not arithmetic, is the cost)."""
    values = np.asarray(values, dtype=np.int64)
    ptr = np.asarray(ptr, dtype=np.int64)
    out = np.empty(values.shape[0], dtype=np.int64)
    if values.shape[0] == 0:
        return out
    counts = np.diff(ptr)
    pw, inv = _powers(int(counts.max()))
    for a, lo, hi, sub, row, k in _chunk_positions(ptr):
        with np.errstate(over="ignore"):
            x = values[lo:hi].astype(np.uint64)
            x += _GOLDEN
            _mix_inplace(x)
            x *= inv[k]
            np.cumsum(x, out=x)
            # the sum within the row: minus what the rows before added (wrapping arithmetic)
            first = sub[:-1][row]
            x -= np.where(first > 0, x[np.maximum(first - 1, 0)], np.uint64(0))
            x *= pw[k]
            x += k.astype(np.uint64) * _GOLDEN + _ROOT
            _mix_inplace(x)
        out[lo:hi] = x.view(np.int64)
    return out


_CHUNK = 1 << 16  # ids per chunk: small temporaries (and faster than 1 << 20 was: cache-sized)


def _mix_inplace(x: np.ndarray) -> None:
    """`mix` on a uint64 array, in place."""
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)


_POWERS: tuple[np.ndarray, np.ndarray] = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**k and P**-k mod 2**64 for k < n (cached, grown as needed)."""
    global _POWERS
    pw, inv = _POWERS
    if pw.shape[0] < n:
        m = max(n, 2 * pw.shape[0])
        p = int(_M1)  # odd, so invertible modulo 2**64
        p_inv = pow(p, -1, 1 << 64)
        with np.errstate(over="ignore"):
            pw = np.cumprod(np.full(m, p, dtype=np.uint64), dtype=np.uint64) * np.uint64(pow(p, -1, 1 << 64))
            inv = np.cumprod(np.full(m, p_inv, dtype=np.uint64), dtype=np.uint64) * np.uint64(p)
        _POWERS = (pw, inv)
    return pw, inv


def reblock_ratio(source, target) -> int:
    """How many blocks of one size make a block of the other (`source` and `target` token
    counts, checked): ConfigError unless one divides the other, as `reblock` needs."""
    source = check_block_size(source, "the trace's block size")
    target = check_block_size(target)
    big, small = max(source, target), min(source, target)
    if big % small:
        raise ConfigError(
            f"cannot map the trace's {source}-token blocks onto {target}-token cache blocks: "
            f"one size must divide the other"
        )
    return big // small


def reblock(
    ids: np.ndarray, ptr: np.ndarray, prompt: np.ndarray, source: int, target: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chained ids for `source`-token blocks -> ids for `target`-token blocks (see module
    doc), keeping at most prompt // target per request. Returns (ids, ptr). The output is
    written about 65,536 ids at a time (whole rows), so the temporaries stay small
    next to it."""
    source = check_block_size(source, "the trace's block size")
    target = check_block_size(target)
    r = reblock_ratio(source, target)
    ids = np.asarray(ids, dtype=np.int64)
    ptr = np.asarray(ptr, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    counts = np.diff(ptr)
    if target <= source:
        keep = np.minimum(counts * r, prompt // target)
    else:
        keep = np.minimum(counts // r, prompt // target)
        # a cache block stands for all of its source blocks and its prefix: chained again
        # (the readers chain every file's ids already; chaining chained ids keeps what they share)
        ids = chain_ragged(ids, ptr)
    new_ptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(keep, out=new_ptr[1:])
    total = int(new_ptr[-1])
    out = np.empty(total, dtype=np.int64)
    for a, b in _row_chunks(new_ptr):
        lo, hi = int(new_ptr[a]), int(new_ptr[b])
        sub = new_ptr[a : b + 1] - lo
        row = np.repeat(np.arange(b - a), np.diff(sub))
        j = np.arange(hi - lo, dtype=np.int64)  # position within its row
        j -= sub[:-1][row]
        start = ptr[a:b][row]  # the row's first source id
        if target <= source:
            # position j of a row comes from its source block j // r
            start += j // r
            src = ids[start]
            out[lo:hi] = src if r == 1 else chain(src, j % r).view(np.int64)
        else:
            # cache block m is the row's source blocks m*r .. (m+1)*r - 1: the last one's id
            start += (j + 1) * r - 1
            out[lo:hi] = ids[start]
    return out, new_ptr


def _row_chunks(ptr: np.ndarray):
    """(a, b) row ranges of a ragged array with offsets `ptr`, each starting on a row
    boundary and holding about `_CHUNK` entries (a longer row alone); empty ranges skipped."""
    total = int(ptr[-1])
    if total == 0:
        return
    cuts = np.unique(np.searchsorted(ptr, np.arange(0, total, _CHUNK), side="right") - 1)
    cuts = np.append(cuts, ptr.shape[0] - 1)
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        if ptr[b] > ptr[a]:
            yield a, b


def _chunk_positions(ptr: np.ndarray):
    """Per chunk of rows (`_row_chunks`): (first row a, first entry lo, end hi, the
    chunk's offsets `sub` from lo, each entry's row within the chunk, each entry's
    position within its row)."""
    for a, b in _row_chunks(ptr):
        lo, hi = int(ptr[a]), int(ptr[b])
        sub = ptr[a : b + 1] - lo
        row = np.repeat(np.arange(b - a), np.diff(sub))
        k = np.arange(hi - lo, dtype=np.int64)
        k -= sub[:-1][row]
        yield a, lo, hi, sub, row, k


def as_tuples(ids: np.ndarray, ptr: np.ndarray) -> list:
    """Per-request tuples of ids (None for a request with none), for `Request.blocks`."""
    flat = np.asarray(ids).tolist()
    bounds = np.asarray(ptr).tolist()
    return [tuple(flat[a:b]) if b > a else None for a, b in zip(bounds[:-1], bounds[1:])]


def as_views(ids: np.ndarray, ptr: np.ndarray, keep: np.ndarray | None = None) -> list:
    """Per-request read-only memoryviews (format 'q': indexing gives Python ints) onto
    `ids`, row i's first `keep[i]` ids (all of them without `keep`), None for a request
    with none: `Request.blocks` at 8 bytes per id, shared with the array, where a tuple
    costs about 40 (its slot and an int object per id). Nothing is copied: the views keep
    `ids` alive."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    whole = memoryview(ids).cast("B").cast("q").toreadonly()
    starts = np.asarray(ptr[:-1], dtype=np.int64)
    ends = np.asarray(ptr[1:], dtype=np.int64) if keep is None else starts + np.asarray(keep, dtype=np.int64)
    return [whole[a:b] if b > a else None for a, b in zip(starts.tolist(), ends.tolist())]


def prefix_rows(
    ids: np.ndarray, ptr: np.ndarray, rows: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """New row r = the first min(counts[r], len) ids of old row rows[r], as (ids, ptr).
    The output is written about 65,536 ids at a time (whole rows), so the index
    temporaries stay small next to it (multi-turn conversations: every turn copies its
    conversation's earlier ids, so the output can be many times the input)."""
    ptr = np.asarray(ptr, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    ids = np.asarray(ids)
    keep = np.minimum(np.diff(ptr)[rows], np.asarray(counts, dtype=np.int64))
    new_ptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(keep, out=new_ptr[1:])
    out = np.empty(int(new_ptr[-1]), dtype=ids.dtype)
    first = ptr[:-1][rows]  # each new row's first id in the old array
    for a, lo, hi, _, row, j in _chunk_positions(new_ptr):
        j += first[a:][row]
        out[lo:hi] = ids[j]
    return out, new_ptr


def take_rows(ids: np.ndarray, ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged rows `rows` (an index array, in that order) as new (ids, ptr)."""
    rows = np.asarray(rows, dtype=np.int64)
    return prefix_rows(ids, ptr, rows, np.diff(np.asarray(ptr))[rows])


def cap_rows(ids: np.ndarray, ptr: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first min(len, cap[row]) ids, as new (ids, ptr)."""
    ptr = np.asarray(ptr, dtype=np.int64)
    if np.array_equal(np.minimum(np.diff(ptr), cap), np.diff(ptr)):
        return np.asarray(ids), ptr
    return prefix_rows(ids, ptr, np.arange(ptr.shape[0] - 1), cap)
