"""Token sampling for the rows of one step: greedy, temperature, top-k, top-p, with a
per-request random generator so that a seeded request draws the same tokens whatever
else shares its batch.

A row's generator is a `random.Random` (what the engine gives each request: seeded with
all 64 bits of the request's seed; torch's CPU generator keeps only the low 32 bits of a
seed, so seeds 1 and 2**32 + 1 drew the same tokens) or a `torch.Generator`. With a
`random.Random` the row draws one uniform number and takes the token where it falls in the
cumulative distribution (float64), the same choice on any device.

A row's sampling trouble stays in its row: a row whose probabilities are not a usable
distribution (NaN or inf logits, everything masked) takes its best token instead of
making `torch.multinomial` raise for the whole batch."""

from __future__ import annotations

import torch


def sample(logits, params: list, generators: list, banned: list | None = None) -> list[int]:
    """logits: float32 `[S, V]`; params: SamplingParams per row; generators: per row, a
    `random.Random` or a `torch.Generator` (None for greedy rows); banned: per row, token
    ids that may not be drawn (None or empty: none), e.g. EOS and stop token ids before
    `min_tokens`. Returns one token id per row."""
    n = logits.shape[0]
    if n == 0:
        return []
    dev = logits.device
    v = logits.shape[1]
    if banned is not None and any(banned):
        rows_b, cols_b = [], []
        for i, ids in enumerate(banned):
            if ids:
                for t in ids:
                    if 0 <= t < v:
                        rows_b.append(i)
                        cols_b.append(t)
        if rows_b:
            logits = logits.clone()
            logits[torch.tensor(rows_b, device=dev), torch.tensor(cols_b, device=dev)] = float("-inf")
    greedy = [p.greedy for p in params]
    out = logits.argmax(dim=-1)
    if all(greedy):
        return out.tolist()
    rows = [i for i in range(n) if not greedy[i]]
    sub = logits[rows] if len(rows) < n else logits
    temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32, device=dev)
    sub = sub / temps[:, None]
    ks = [params[i].top_k if params[i].top_k > 0 else v for i in rows]
    ps = [params[i].top_p for i in rows]
    srt, idx = sub.sort(dim=-1, descending=True)
    if any(k < v for k in ks):
        kt = torch.tensor(ks, device=dev)[:, None]
        srt = srt.masked_fill(torch.arange(v, device=dev)[None, :] >= kt, float("-inf"))
    if any(p < 1.0 for p in ps):
        probs = srt.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens
        pt = torch.tensor(ps, dtype=torch.float32, device=dev)[:, None]
        drop = before >= pt
        drop[:, 0] = False  # always keep the best token
        srt = srt.masked_fill(drop, float("-inf"))
    probs = srt.softmax(dim=-1)
    # a row that is not a distribution (NaN/inf logits, all masked) takes its best token
    ok = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
    if not bool(ok.all()):
        onehot = torch.zeros_like(probs)
        onehot[:, 0] = 1.0
        probs = torch.where(ok[:, None], probs, onehot)
        idx = torch.where(ok[:, None], idx, out[rows][:, None].expand_as(idx))
    picks: list = [None] * len(rows)
    uniform = []  # rows drawing from a random.Random
    for j, i in enumerate(rows):
        g = generators[i]
        if g is None or isinstance(g, torch.Generator):
            picks[j] = torch.multinomial(probs[j], 1, generator=g)
        else:
            uniform.append(j)
    if uniform:
        u = torch.tensor([generators[rows[j]].random() for j in uniform], dtype=torch.float64, device=dev)
        p = (probs if len(uniform) == len(rows) else probs[uniform]).double()
        cdf = p.cumsum(dim=-1)
        pos = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        # the drawable tokens are a prefix (probabilities sorted, masked ones 0): stay in it
        pos = torch.minimum(pos, (p > 0).sum(dim=-1, keepdim=True).clamp(min=1) - 1)
        for n_, j in enumerate(uniform):
            picks[j] = pos[n_]
    chosen = idx.gather(1, torch.stack(picks)).squeeze(1)
    out = out.clone()
    out[torch.tensor(rows, device=dev)] = chosen
    return out.tolist()
