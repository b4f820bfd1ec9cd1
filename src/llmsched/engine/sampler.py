"""Token sampling for the rows of one step: greedy, temperature, top-k, top-p, with a
per-request `torch.Generator` so that a seeded request draws the same tokens whatever
else shares its batch."""

from __future__ import annotations

import torch


def sample(logits, params: list, generators: list) -> list[int]:
    """logits: float32 `[S, V]`; params: SamplingParams per row; generators: per row
    (None for greedy rows). Returns one token id per row."""
    n = logits.shape[0]
    if n == 0:
        return []
    greedy = [p.temperature == 0 for p in params]
    out = logits.argmax(dim=-1)
    if all(greedy):
        return out.tolist()
    rows = [i for i in range(n) if not greedy[i]]
    dev = logits.device
    sub = logits[rows] if len(rows) < n else logits
    temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32, device=dev)
    sub = sub / temps[:, None]
    v = sub.shape[1]
    ks = [params[i].top_k if params[i].top_k > 0 else v for i in rows]
    ps = [params[i].top_p for i in rows]
    srt, idx = sub.sort(dim=-1, descending=True)
    if any(k < v for k in ks):
        kt = torch.tensor(ks, device=dev)[:, None]
        srt = srt.masked_fill(torch.arange(v, device=dev)[None, :] >= kt, float("-inf"))
    if any(p < 1.0 for p in ps):
        probs = srt.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs          # mass of the better tokens
        pt = torch.tensor(ps, dtype=torch.float32, device=dev)[:, None]
        drop = before >= pt
        drop[:, 0] = False                              # always keep the best token
        srt = srt.masked_fill(drop, float("-inf"))
    probs = srt.softmax(dim=-1)
    picks = []
    for j, i in enumerate(rows):
        picks.append(torch.multinomial(probs[j], 1, generator=generators[i]))
    chosen = idx.gather(1, torch.stack(picks)).squeeze(1)
    out = out.clone()
    out[torch.tensor(rows, device=dev)] = chosen
    return out.tolist()
