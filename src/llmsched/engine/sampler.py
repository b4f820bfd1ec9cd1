"""Token sampling for the rows of one step: greedy, temperature, top-k, top-p, with a
per-request random generator so that a seeded request draws the same tokens whatever
else shares its batch.

A row's generator is a `random.Random` (what the engine gives each request: seeded with
all 64 bits of the request's seed; torch's CPU generator keeps only the low 32 bits of a
seed, so seeds 1 and 2**32 + 1 drew the same tokens) or a `torch.Generator`. With a
`random.Random` the row draws one uniform number and takes the token where it falls in the
cumulative distribution (float64) of the kept tokens in id order, the same choice on any
device; top-k and top-p choose which tokens are kept by rank, the draw does not walk the
ranks (last-bit noise would swap near-equal tokens: see `_sample`).

A row's sampling trouble stays in its row: a row whose probabilities are not a usable
distribution (NaN or inf logits, everything masked) takes its best token instead of
making `torch.multinomial` raise for the whole batch.

Before any of that, the logits of a row are adjusted as its request asks (OpenAI / vLLM
semantics, in vLLM V1's order): `logit_bias` is added first; then a `repetition_penalty` r divides the positive and
multiplies the negative logits of every token of the prompt and the output by r;
`frequency_penalty` is subtracted once per occurrence of a token in the output and
`presence_penalty` once for any occurrence. Logprobs (`SamplingParams.logprobs`) are those
of the model's raw distribution (log-softmax of its logits before any of these
adjustments, temperature, top-k or top-p), as vLLM returns by default."""

from __future__ import annotations

import torch


def adjust(logits, params: list, history: list | None):
    """The logits with each row's logit bias, then its penalties, applied (the input itself if no
    row has any). history: per row, (token ids of prompt + output, prompt length) or None."""
    rows = [
        i
        for i, p in enumerate(params)
        if getattr(p, "logit_bias", None) or (history is not None and history[i] is not None and p.penalized)
    ]
    if not rows:
        return logits
    logits = logits.clone()
    dev = logits.device
    v = logits.shape[1]
    for i in rows:
        p = params[i]
        row = logits[i]
        # logit_bias first, then the penalties on the biased logits (vLLM V1's order)
        bias = getattr(p, "logit_bias", None)
        if bias:
            ids = [t for t in bias if 0 <= t < v]
            if ids:
                row[torch.tensor(ids, dtype=torch.long, device=dev)] += torch.tensor(
                    [float(bias[t]) for t in ids], dtype=row.dtype, device=dev
                )
        if history is not None and history[i] is not None and p.penalized:
            ids, prompt_len = history[i]
            if p.repetition_penalty != 1.0 and ids:
                seen = torch.zeros(v, dtype=torch.bool, device=dev)
                seen[torch.tensor([t for t in ids if 0 <= t < v], dtype=torch.long, device=dev)] = True
                r = p.repetition_penalty
                row[seen] = torch.where(row[seen] > 0, row[seen] / r, row[seen] * r)
            out = [t for t in ids[prompt_len:] if 0 <= t < v]
            if out and (p.frequency_penalty or p.presence_penalty):
                counts = torch.bincount(torch.tensor(out, dtype=torch.long, device=dev), minlength=v).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def logprob_entries(logits, targets, ks: list[int]) -> list[tuple[float, list]]:
    """Per row of `logits`: (the log-probability of `targets[row]`, [(id, logprob)] of the
    `ks[row]` most likely tokens, best first) under the raw distribution."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    picked = lp.gather(1, targets[:, None]).squeeze(1).tolist()
    k = min(max(ks), lp.shape[1])
    if k <= 0:
        return [(p, []) for p in picked]
    top_v, top_i = lp.topk(k, dim=-1)
    tv, ti = top_v.tolist(), top_i.tolist()
    out = []
    for j, p in enumerate(picked):
        kk = min(ks[j], k)
        out.append((p, list(zip(ti[j][:kk], tv[j][:kk])) if kk else []))
    return out


def top_logprobs(logits, params: list, tokens: list[int]) -> list:
    """Per row: None, or (the logprob of its sampled token, [(id, logprob)] of the
    `params.logprobs` most likely tokens, best first) under the raw distribution."""
    want = [i for i, p in enumerate(params) if getattr(p, "logprobs", None) is not None]
    res: list = [None] * len(params)
    if want:
        targets = torch.tensor([tokens[i] for i in want], device=logits.device)
        for i, e in zip(want, logprob_entries(logits[want], targets, [params[i].logprobs for i in want])):
            res[i] = e
    return res


def sample(
    logits,
    params: list,
    generators: list,
    banned: list | None = None,
    history: list | None = None,
    logprobs_out: list | None = None,
) -> list[int]:
    """logits: float32 `[S, V]`; params: SamplingParams per row; generators: per row, a
    `random.Random` or a `torch.Generator` (None for greedy rows); banned: per row, token
    ids that may not be drawn (None or empty: none), e.g. EOS and stop token ids before
    `min_tokens`; history: per row, (prompt + output token ids, prompt length) for the
    penalties, or None. `logprobs_out`, if a list, is extended with one entry per row (see
    `top_logprobs`). Returns one token id per row."""
    n = logits.shape[0]
    if n == 0:
        return []
    raw = logits
    tokens = _sample(adjust(logits, params, history), params, generators, banned)
    if logprobs_out is not None:
        logprobs_out.extend(top_logprobs(raw, params, tokens))
    return tokens


def _sample(logits, params: list, generators: list, banned: list | None) -> list[int]:
    n = logits.shape[0]
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
    if any(k < v for k in ks) or any(p < 1.0 for p in ps):
        # top-k and top-p choose their tokens by rank (the sort); the draw below does not.
        # Stable: an exact tie at the cut keeps the lower id on every device (the default
        # sort's order of equal values depends on its algorithm: CPU and CUDA differed)
        srt, idx = sub.sort(dim=-1, descending=True, stable=True)
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
        sub = torch.empty_like(srt).scatter_(1, idx, srt)  # back in id order, the dropped at -inf
    probs = sub.softmax(dim=-1)
    # a row that is not a distribution (NaN/inf logits, all masked) takes its best token
    ok = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
    if not bool(ok.all()):
        best = torch.zeros_like(probs).scatter_(1, out[rows][:, None], 1.0)
        probs = torch.where(ok[:, None], probs, best)
    chosen = torch.empty(len(rows), dtype=torch.long, device=dev)
    uniform = []  # rows drawing from a random.Random
    for j, i in enumerate(rows):
        g = generators[i]
        if g is None or isinstance(g, torch.Generator):
            chosen[j] = torch.multinomial(probs[j], 1, generator=g)[0]
        else:
            uniform.append(j)
    if uniform:
        # The draw walks the tokens in id order, not in order of probability: the logits of
        # a request differ in their last bits with the step's shape (matmul rounding), and
        # two near-equal tokens swapping places in a sort would move the whole of their
        # probability under the same uniform number; in id order a tiny change of the
        # probabilities moves the boundaries only as much, so the seeded draw stays put.
        u = torch.tensor([generators[rows[j]].random() for j in uniform], dtype=torch.float64, device=dev)
        p = (probs if len(uniform) == len(rows) else probs[uniform]).double()
        cdf = p.cumsum(dim=-1)
        pos = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        # u * total may round up to the total: take the last drawable token, never a masked one
        last = torch.where(p > 0, torch.arange(v, device=dev), -1).amax(dim=-1)
        chosen[torch.tensor(uniform, device=dev)] = torch.minimum(pos, last)
    out = out.clone()
    out[torch.tensor(rows, device=dev)] = chosen
    return out.tolist()
