"""Llama-family decoder (Llama 2/3, Qwen2, Mistral) over packed tokens and a paged KV cache.

The forward pass takes the flattened tokens of one step (`input_ids`, `positions`, both
`[T]`) and an `AttnMeta`; nothing is padded along T. Q/K/V and gate/up projections are
fused into one matmul each. The math follows the Hugging Face reference (float32
RMSNorm, rotate-half rotary embeddings) so that greedy outputs match token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttnMeta, paged_attention
from .loader import ModelConfig, rope_inv_freq


class Linear(nn.Module):
    """y = x W^T (+ b), parameters left uninitialised (the loader fills them)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(n_out, dtype=dtype, device=device), requires_grad=False) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float, dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(x.dtype)
        return out if residual is None else (out, residual)


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None, dtype, device):
        super().__init__()
        h = cfg.hidden_size
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.inter = cfg.intermediate_size
        self.window = window
        self.scale = cfg.head_dim**-0.5
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype, device)
        self.qkv_proj = Linear(h, cfg.q_size + 2 * cfg.kv_size, cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(cfg.q_size, h, cfg.o_bias, dtype, device)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype, device)
        self.gate_up_proj = Linear(h, 2 * cfg.intermediate_size, cfg.mlp_bias, dtype, device)
        self.down_proj = Linear(cfg.intermediate_size, h, cfg.mlp_bias, dtype, device)
        self.k_cache = self.v_cache = None  # set by the runner: [kv_heads, blocks, block_size, head_dim]

    def forward(self, x, residual, cos, sin, meta: AttnMeta):
        if meta.fused is not None:
            return self._forward_fused(x, residual, cos, sin, meta)
        cos, sin = cos[:, None, :], sin[:, None, :]
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        t = h.shape[0]
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _rotate(q.view(t, self.n_heads, self.head_dim), cos, sin)
        k = _rotate(k.view(t, self.n_kv, self.head_dim), cos, sin)
        v = v.view(t, self.n_kv, self.head_dim)
        o = paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.window)
        h = self.o_proj(o.reshape(t, self.q_size))
        h, residual = self.post_attention_layernorm(h, residual)
        gate, up = self.gate_up_proj(h).split([self.inter, self.inter], dim=-1)
        return self.down_proj(F.silu(gate) * up), residual

    def _forward_fused(self, x, residual, cos, sin, meta: AttnMeta):
        """The same layer with cpu_kernel's fused element-wise ops (CPU, float32)."""
        k = meta.fused
        norm = self.input_layernorm
        if residual is None:
            residual, h = x, k.rms_norm(x, None, norm.weight, norm.eps)
        else:
            h, residual = k.rms_norm(x, residual, norm.weight, norm.eps)
        t = h.shape[0]
        qkv = self.qkv_proj(h)
        k.rotary(qkv, self.n_heads + self.n_kv, self.head_dim, cos, sin)  # q and k, in place
        q = qkv[:, : self.q_size].view(t, self.n_heads, self.head_dim)
        kk = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.n_kv, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.n_kv, self.head_dim)
        o = paged_attention(q, kk, v, self.k_cache, self.v_cache, meta, self.scale, self.window)
        h = self.o_proj(o.reshape(t, self.q_size))
        norm = self.post_attention_layernorm
        h, residual = k.rms_norm(h, residual, norm.weight, norm.eps)
        return self.down_proj(k.silu_mul(self.gate_up_proj(h))), residual


class CausalLM(nn.Module):
    """Parameter names follow the HF checkpoint with q/k/v and gate/up fused (see loader)."""

    def __init__(self, cfg: ModelConfig, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=dtype,
            device=device,
            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device),
        )
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, cfg.sliding_windows[i] if cfg.sliding_windows else None, dtype, device)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        self.register_buffer("inv_freq", rope_inv_freq(cfg).to(device), persistent=False)

    @property
    def lm_head_weight(self):
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids, positions, meta: AttnMeta):
        """Final hidden states `[T, hidden]` of the packed tokens."""
        x = self.embed_tokens(input_ids)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(x.dtype)  # [T, head_dim]
        sin = emb.sin().to(x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, meta)
        if meta.fused is not None:
            x, _ = meta.fused.rms_norm(x, residual, self.norm.weight, self.norm.eps)
        else:
            x, _ = self.norm(x, residual)
        return x

    def logits(self, hidden):
        """float32 logits of the rows that sample."""
        return F.linear(hidden, self.lm_head_weight).float()

    @torch.no_grad()
    def init_random(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights in place (benchmarks and tiny models; no files needed)."""
        g = torch.Generator(device=self.embed_tokens.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=g)
