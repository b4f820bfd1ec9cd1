"""Attention over a paged KV cache for one packed step, in pure torch.

A step's tokens are flattened into one dimension `[T]`: first the decode tokens (one per
decoding sequence), then the prefill chunks back to back. Each layer
1. writes the new K/V of all T tokens into their cache slots (`slot_mapping`), one
   `index_copy_` per tensor. The cache of a layer is head-major,
   `[kv_heads, num_blocks, block_size, head_dim]`, so that a gather of blocks comes out
   with contiguous `[context, head_dim]` rows per (sequence, head), which SDPA reads
   without another copy;
2. decode tokens: one batched call. On the CPU in float32, a small compiled kernel
   (`cpu_kernel`) reads each decoder's K/V rows in place, only those inside its context.
   Otherwise each decoder's blocks are gathered (`k_cache[:, block_table]` viewed as
   `[B, kv_heads, blocks * block_size, head_dim]`), the gathered positions past its
   context are zeroed (a block keeps whatever its previous owner wrote, NaN included,
   and a masked NaN still poisons SDPA's output: NaN * 0 is NaN) and a boolean mask hides
   them. Grouped-query attention folds the `heads / kv_heads` query heads of a KV head
   into the query-length axis, so no K/V is repeated and any SDPA backend applies.
3. prefill chunks: one SDPA call per chunk. A chunk that starts a sequence attends to its
   own fresh K/V with `is_causal`; a later chunk (chunked prefill, recompute) gathers its
   sequence's blocks and uses a bottom-right causal mask.
The decode path only uses tensor ops on fixed-shape inputs, so it can be captured in a
CUDA graph (the runner does, for decode-only steps on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_kernel import run_decode


class PrefillChunk:
    __slots__ = ("start", "n", "ctx_start", "blocks")

    def __init__(self, start: int, n: int, ctx_start: int, blocks):
        self.start = start  # index of the chunk's first token in the packed batch
        self.n = n  # tokens in the chunk
        self.ctx_start = ctx_start  # cached tokens of the sequence before the chunk
        self.blocks = blocks  # LongTensor of the sequence's block ids (None if ctx_start == 0)


class AttnMeta:
    """Everything attention needs about one packed step, shared by all layers."""

    def __init__(
        self,
        slot_mapping,
        n_decode: int = 0,
        block_tables=None,
        context_lens=None,
        prefills: list[PrefillChunk] | None = None,
        block_size: int = 16,
        skip: bool = False,
        decode_groups: int = 1,
        threads: int = 1,
        fused=None,
    ):
        self.slot_mapping = slot_mapping  # [T] long
        self.n_decode = n_decode
        self.block_tables = block_tables  # [n_decode, max_blocks] long
        self.context_lens = context_lens  # [n_decode] long, tokens incl. the new one
        self.prefills = prefills or []
        self.block_size = block_size
        self.skip = skip  # profiling: no attention (the linear part alone)
        self.decode_groups = decode_groups  # split the decode batch to bound gather memory
        self.threads = threads  # the kernel's threads
        # cpu_kernel's compiled kernels (decode attention and the model's element-wise ops),
        # or None (torch)
        self.fused = fused
        self._masks: dict = {}

    def decode_mask(self, window: int | None):
        """[B, 1, 1, C] bool: which gathered positions each decoder attends to."""
        key = ("d", window)
        m = self._masks.get(key)
        if m is None:
            c = self.block_tables.shape[1] * self.block_size
            pos = torch.arange(c, device=self.context_lens.device)
            lens = self.context_lens[:, None]
            m = pos[None, :] < lens
            if window is not None:
                m = m & (pos[None, :] >= lens - window)
            m = self._masks[key] = m[:, None, None, :]
        return m

    def decode_stale(self, window: int | None):
        """[B, 1, C, 1] bool: the gathered positions a decoder must not see (to zero)."""
        key = ("s", window)
        m = self._masks.get(key)
        if m is None:
            m = self._masks[key] = ~self.decode_mask(window).transpose(-1, -2)
        return m

    def prefill_mask(self, i: int, window: int | None, device, groups: int):
        """[groups * n, ctx] bool bottom-right causal mask of prefill chunk i (repeated for
        the folded query heads), or None where plain `is_causal` applies."""
        ch = self.prefills[i]
        if ch.ctx_start == 0 and (window is None or ch.n <= window):
            return None
        key = ("p", i, window, groups)
        m = self._masks.get(key)
        if m is None:
            q = torch.arange(ch.ctx_start, ch.ctx_start + ch.n, device=device)[:, None]
            k = torch.arange(ch.ctx_start + ch.n, device=device)[None, :]
            m = k <= q
            if window is not None:
                m = m & (k > q - window)
            m = self._masks[key] = m.repeat(groups, 1)
        return m


def _fold(q, kv_heads: int):
    """[L, H, D] -> [kv_heads, (H / kv_heads) * L, D], query heads of a KV head side by side."""
    n, h, d = q.shape
    g = h // kv_heads
    return q.view(n, kv_heads, g, d).permute(1, 2, 0, 3).reshape(kv_heads, g * n, d), g


def _unfold(o, n: int, g: int):
    kvh, _, d = o.shape
    return o.view(kvh, g, n, d).permute(2, 0, 1, 3).reshape(n, kvh * g, d)


def paged_attention(q, k, v, k_cache, v_cache, meta: AttnMeta, scale: float, window: int | None):
    """q: [T, H, D]; k, v: [T, KVH, D]; caches: [KVH, blocks, block_size, D]. Returns [T, H, D]."""
    if meta.skip:
        return q
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(kvh, -1, d).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.view(kvh, -1, d).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous, even for a strided q
    b = meta.n_decode
    if b and meta.fused is not None:
        bt, lens = meta.block_tables, meta.context_lens
        run_decode(meta.fused, q, k_cache, v_cache, bt, lens, out, scale, window, meta.threads)
    elif b:
        h = q.shape[1]
        g = h // kvh
        mask = meta.decode_mask(window)
        stale = meta.decode_stale(window)
        step = -(-b // meta.decode_groups)
        for s in range(0, b, step):
            e = min(b, s + step)
            bt = meta.block_tables[s:e]
            kk = k_cache[:, bt].view(kvh, e - s, -1, d).transpose(0, 1)  # [B, KVH, C, D]
            vv = v_cache[:, bt].view(kvh, e - s, -1, d).transpose(0, 1)
            kk.masked_fill_(stale[s:e], 0)  # stale values: NaN/inf must not reach SDPA
            vv.masked_fill_(stale[s:e], 0)
            qq = q[s:e].view(e - s, kvh, g, d)  # [B, KVH, G, D]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask[s:e], scale=scale)
            out[s:e] = o.reshape(e - s, h, d)
    for i, ch in enumerate(meta.prefills):
        s, n = ch.start, ch.n
        mask = meta.prefill_mask(i, window, q.device, q.shape[1] // kvh)
        if mask is None:  # [1, heads, n, D] against the chunk's own K/V
            o = F.scaled_dot_product_attention(
                q[s : s + n].transpose(0, 1)[None],
                k[s : s + n].transpose(0, 1)[None],
                v[s : s + n].transpose(0, 1)[None],
                is_causal=True,
                scale=scale,
                enable_gqa=True,
            )
            out[s : s + n] = o[0].transpose(0, 1)
            continue
        ctx = ch.ctx_start + n
        kk = k_cache[:, ch.blocks].view(kvh, -1, d)[None, :, :ctx]  # [1, KVH, ctx, D]
        vv = v_cache[:, ch.blocks].view(kvh, -1, d)[None, :, :ctx]
        qq, g = _fold(q[s : s + n], kvh)
        o = F.scaled_dot_product_attention(qq[None], kk, vv, attn_mask=mask, scale=scale)
        out[s : s + n] = _unfold(o[0], n, g)
    return out
