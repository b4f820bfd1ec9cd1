"""Validate the `profile` cost model against whole steps measured end to end (step.csv).

For every row of a profile's step.csv (one prefill chunk plus `decodes` decode sequences,
measured in EAGER mode) the composed model predicts the step time; this prints measured
vs predicted ms and the relative error per row, then the mean absolute error (ms), the
mean absolute relative error and the max absolute relative error per profile, and the
same summary for the other composition variants (linear mode x attention overlap).

    python benchmarks/validate_profile.py                        # both shipped H200 profiles
    python benchmarks/validate_profile.py h200-llama-3.2-1b,mode=auto
    python benchmarks/validate_profile.py path/to/folder#model   # a profile of your own

A spec without `mode=` is validated in eager mode, the mode step.csv was measured in.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from llmsched.core.errors import ConfigError  # noqa: E402
from llmsched.core.profile import (  # noqa: E402
    load_profile,
    shipped_profiles,
    spec_options,
    spec_source,
    validate_steps,
)


def summary(rows: list[dict]) -> tuple[float, float, float, float]:
    n = len(rows)
    mae = sum(abs(r["predicted_ms"] - r["measured_ms"]) for r in rows) / n
    mre = sum(abs(r["rel_error"]) for r in rows) / n
    xre = max(abs(r["rel_error"]) for r in rows)
    bias = sum(r["rel_error"] for r in rows) / n
    return mae, mre, xre, bias


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", help="profile specs (default: every shipped profile)")
    ap.add_argument("--no-variants", action="store_true", help="skip the composition-variant summary")
    args = ap.parse_args(argv)
    specs = args.specs or shipped_profiles()
    totals = []
    for spec in specs:
        try:
            if "mode" not in spec_options(spec):
                spec += ",mode=eager"
            model = load_profile(spec)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rows = validate_steps(model)
        d = model.describe()
        print(
            f"\n## {spec}  (layers {d['layers']}, mode {d['mode']}, overlap {d['overlap']:g}, "
            f"monotone {int(d['monotone'])})\n"
        )
        if not rows:
            print("(no step.csv rows to validate against)")
            continue
        print("| prefill chunk | chunk context | decodes | decode context | measured ms | predicted ms | error |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['prefill_chunk']} | {r['prefill_context']} | {r['decodes']} | {r['decode_context']} | "
                f"{r['measured_ms']:.2f} | {r['predicted_ms']:.2f} | {r['rel_error']:+.1%} |"
            )
        mae, mre, xre, bias = summary(rows)
        totals.append((spec, mae, mre, xre, bias))
        print(
            f"\nmean abs error {mae:.2f} ms, mean abs rel error {mre:.1%}, max abs rel error {xre:.1%}, "
            f"mean rel error (bias) {bias:+.1%}"
        )
        if not args.no_variants:
            base = spec_source(spec)
            print("\n| variant | mean abs ms | mean abs rel | max abs rel | bias |")
            print("|---|---:|---:|---:|---:|")
            for mode in ("eager", "graph", "auto"):
                for overlap in (1.0, 0.5, 0.0):
                    v = validate_steps(load_profile(f"{base},mode={mode},overlap={overlap:g}"))
                    a, b, c, e = summary(v)
                    print(f"| mode={mode},overlap={overlap:g} | {a:.2f} | {b:.1%} | {c:.1%} | {e:+.1%} |")
    if len(totals) > 1:
        print("\n## summary\n\n| profile | mean abs ms | mean abs rel | max abs rel | bias |")
        print("|---|---:|---:|---:|---:|")
        for spec, mae, mre, xre, bias in totals:
            print(f"| {spec} | {mae:.2f} | {mre:.1%} | {xre:.1%} | {bias:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
