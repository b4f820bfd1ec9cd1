"""Synthetic workloads whose requests share prompt prefixes, with their block ids.

Two options of `WorkloadSpec` (see its documentation) produce block ids:
- a shared system prompt of N tokens per class: every request of the class starts with the
  same N tokens, then its own content;
- multi-turn conversations: turn t of a conversation resends everything before it, so its
  prompt is the system prompt, turns 1..t-1's prompts and outputs, then its new text.

Both are modelled as one token stream per conversation (a single-turn request is a
conversation of one turn): the stream's blocks inside the system prompt have content
shared by the class, every later block content of its own; a request's prompt is a prefix
of its conversation's stream, and its ids are the chained ids of the stream's first
prompt // block_size blocks. So identical prefixes get identical ids and a prefix differs
from its first block that holds different content (a block straddling the end of the
system prompt already holds the request's own text).

The ids depend on the seed, the class, the conversation and the block size only, never
on the lengths of other requests.
"""

from __future__ import annotations

import numpy as np

from .blocks import chain_ragged, mix, prefix_rows, seed_bits

__all__ = ["stream_blocks", "conversation_turns"]

# separate hash domains for shared (class) and own (conversation) block contents
_SHARED_SALT = 0x5EED5EED00000001
_OWN_SALT = 0x0C0FFEE000000002


def _content(salt: int, seed: int, owner: np.ndarray, k: np.ndarray) -> np.ndarray:
    """A 64-bit stand-in for the tokens of block k of `owner` (a class or a conversation)."""
    with np.errstate(over="ignore"):
        base = mix(mix(np.uint64(salt) + np.uint64(seed_bits(seed))) + owner.astype(np.uint64))
        return mix(base + k.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def stream_blocks(
    conv: np.ndarray, prompt: np.ndarray, conv_class: np.ndarray, system: np.ndarray, seed: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Block ids (ids, ptr) of requests that are prefixes of conversation streams.

    conv[i]: request i's conversation (0..m-1); prompt[i]: its prompt tokens;
    conv_class[j]: conversation j's class; system[c]: class c's system-prompt tokens."""
    conv = np.asarray(conv, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    m = int(conv_class.shape[0])
    # each conversation's stream needs as many blocks as its longest request
    stream_len = np.zeros(m, dtype=np.int64)
    np.maximum.at(stream_len, conv, prompt // block_size)
    sptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(stream_len, out=sptr[1:])
    owner = np.repeat(np.arange(m, dtype=np.int64), stream_len)
    k = np.arange(int(sptr[-1]), dtype=np.int64) - sptr[:-1][owner]
    cls = np.asarray(conv_class, dtype=np.int64)[owner]
    shared = k < (np.asarray(system, dtype=np.int64) // block_size)[cls]
    values = np.empty(k.shape[0], dtype=np.int64)
    values[shared] = _content(_SHARED_SALT, seed, cls[shared], k[shared])
    own = ~shared
    values[own] = _content(_OWN_SALT, seed, owner[own], k[own])
    del owner, cls, k, shared, own
    chained = chain_ragged(values, sptr)
    if conv.shape[0] == m and np.array_equal(conv, np.arange(m)):
        return chained, sptr  # one request per conversation: its stream is its prompt
    return prefix_rows(chained, sptr, conv, prompt // block_size)


def conversation_turns(turns: np.ndarray, think: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request of conversations with `turns[j]` turns: (conversation, turn index,
    arrival offset from the conversation's first turn), where turn t > 0 arrives
    think[...] seconds after turn t - 1 (`think` holds sum(turns) - m gaps, in order)."""
    turns = np.asarray(turns, dtype=np.int64)
    m = turns.shape[0]
    conv = np.repeat(np.arange(m, dtype=np.int64), turns)
    start = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(turns, out=start[1:])
    t = np.arange(conv.shape[0], dtype=np.int64) - start[:-1][conv]
    gaps = np.zeros(conv.shape[0], dtype=np.float64)
    gaps[t > 0] = think
    cs = np.cumsum(gaps)
    return conv, t, cs - cs[start[:-1]][conv]
