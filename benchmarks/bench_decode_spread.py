"""Decode attention of one layer with a batch's contexts spread over 0..2c against equal
contexts c (the same total), on the CPU paths of `engine.attention.paged_attention`: the
compiled kernel (each decoder reads its own context) and SDPA (the gather is padded to the
batch's longest context). Prints spread / equal CPU time per batch and mean context: why
`llmsched profile` times spread contexts by default (docs/engine.md).

    python benchmarks/bench_decode_spread.py                          # the tiny model's heads
    python benchmarks/bench_decode_spread.py --heads 32 --kv-heads 8 --head-dim 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _cli import comma_list, positive_int

BLOCK = 16


def contexts(batch: int, mean: int, spread: bool) -> list[int]:
    """As the profiler lays them out: evenly over 0..2 x mean, the total batch x mean."""
    if not spread or batch == 1:
        return [mean] * batch
    cs = [max(1, round(2 * mean * (i + 1) / (batch + 1))) for i in range(batch)]
    cs[-1] += mean * batch - sum(cs)
    return cs


def seconds(heads: int, kv_heads: int, dim: int, lens: list[int], kernel, reps: int) -> float:
    """Median CPU seconds of one paged_attention call over `lens` decoders."""
    import torch  # noqa: PLC0415 (slow to import: after the arguments are checked)

    from llmsched.engine.attention import AttnMeta, paged_attention  # noqa: PLC0415

    b, width = len(lens), -(-max(lens) // BLOCK)
    k_cache = torch.randn(kv_heads, b * width, BLOCK, dim)
    v_cache = torch.randn(kv_heads, b * width, BLOCK, dim)
    tables = torch.arange(b * width, dtype=torch.long).view(b, width)
    slots = torch.tensor([int(tables[i, (c - 1) // BLOCK]) * BLOCK + (c - 1) % BLOCK for i, c in enumerate(lens)])
    meta = AttnMeta(
        slots,
        n_decode=b,
        block_tables=tables,
        context_lens=torch.tensor(lens, dtype=torch.long),
        block_size=BLOCK,
        fused=kernel,
    )
    q, k, v = torch.randn(b, heads, dim), torch.randn(b, kv_heads, dim), torch.randn(b, kv_heads, dim)
    for _ in range(10):
        paged_attention(q, k, v, k_cache, v_cache, meta, dim**-0.5, None)
    runs = []
    for _ in range(reps):
        t0 = time.process_time()
        for _ in range(20):
            paged_attention(q, k, v, k_cache, v_cache, meta, dim**-0.5, None)
        runs.append((time.process_time() - t0) / 20)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--kv-heads", type=positive_int, default=2)
    ap.add_argument("--head-dim", type=positive_int, default=32)
    ap.add_argument("--batches", type=comma_list(positive_int), default=[2, 4, 8])
    ap.add_argument("--contexts", type=comma_list(positive_int), default=[128, 512, 2048], help="mean contexts")
    ap.add_argument("--reps", type=positive_int, default=15)
    args = ap.parse_args()
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    import torch  # noqa: PLC0415

    from llmsched.engine.cpu_kernel import decode_kernel  # noqa: PLC0415

    torch.set_num_threads(1)
    kernel = decode_kernel()
    paths = [("sdpa", None)] if kernel is None else [("kernel", kernel), ("sdpa", None)]
    if kernel is None:
        print("no compiled kernel here (no C compiler?): SDPA only", file=sys.stderr)
    for name, kern in paths:
        for b in args.batches:
            cells = []
            for c in args.contexts:
                t = [
                    seconds(args.heads, args.kv_heads, args.head_dim, contexts(b, c, s), kern, args.reps)
                    for s in (True, False)
                ]
                cells.append(f"c={c}: {t[0] / t[1]:.2f} ({t[1] * 1e3:.3f} ms equal)")
            print(f"{name:6s} batch {b}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
