"""How long reading traces and building prefix-sharing workloads takes (docs/workloads.md).

Each case runs in a fresh process (no cache shared between them), `--repeat` times; the
median wall time is printed with the peak memory of the median run's process (the lower
of the two middle runs for an even `--repeat`; its VmHWM, which
starts afresh at exec; `ru_maxrss` would carry over the parent's peak). The generated
files (a 1M-row plain CSV, a 1M-row Mooncake-layout JSON lines file made of the shared
sample's rows repeated with shifted timestamps and ids) are written to `--dir` once, each
only when a chosen case reads it.

    python benchmarks/bench_traces.py                      # every case, 3 runs each
    python benchmarks/bench_traces.py --cases azure,mooncake-sample --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _cli import config_errors, fail, positive_int, run_child
from _memory import peak_rss_kb

from llmsched.core.errors import ConfigError
from llmsched.core.paths import atomic_write
from llmsched.workload import resolve_dataset, traces_dirs

N = 1_000_000


def shared_traces() -> tuple[Path, Path]:
    """(the Azure conversation trace, the Mooncake sample), found as `--trace azure-conv`
    finds the shared traces folder; ConfigError naming what is missing."""
    azure = resolve_dataset("azure-conv")
    rel = Path("mooncake_synthetic") / "synthetic_trace.jsonl"
    mooncake = next((p for d in traces_dirs() if (p := d / rel).is_file()), azure.parents[1] / rel)
    if not mooncake.is_file():
        raise ConfigError(f"the Mooncake sample {mooncake} does not exist")
    return azure, mooncake


def _make_files(folder: Path, mooncake: Path, names: list[str]) -> dict[str, Path]:
    """The generated files' paths; those the cases `names` read are written if missing."""
    from llmsched.workload import WorkloadSpec, make_trace  # noqa: PLC0415

    plain = folder / "plain_1m.csv"
    moon = folder / "mooncake_1m.jsonl"
    if "plain-1m" in names or "mooncake-1m-512" in names:
        folder.mkdir(parents=True, exist_ok=True)
    # written whole or not at all: a run stopped while writing left a partial file that
    # the next run, which only checks that the file exists, timed as the 1M-row case
    if "plain-1m" in names and not plain.is_file():
        spec = WorkloadSpec(arrival="poisson", rate=100, num_requests=N, prompt="geometric:500", output="geometric:200")
        atomic_write(plain, make_trace(spec).to_csv)
    if "mooncake-1m-512" in names and not moon.is_file():
        rows = [json.loads(line) for line in mooncake.read_text().splitlines() if line.strip()]
        atomic_write(moon, lambda tmp: _write_mooncake(tmp, rows))
    return {"plain": plain, "mooncake": moon}


def _write_mooncake(path: Path, rows: list[dict]) -> None:
    span = rows[-1]["timestamp"] + 1
    with open(path, "w") as fh:
        for i in range(N):
            r, c = rows[i % len(rows)], i // len(rows)
            ids = [h + c * 10_000_000 for h in r["hash_ids"]]
            fh.write(
                json.dumps(
                    {
                        "timestamp": r["timestamp"] + c * span,
                        "input_length": r["input_length"],
                        "output_length": r["output_length"],
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )


CASES = (
    "azure",
    "mooncake-sample",
    "mooncake-sample-512",
    "plain-1m",
    "mooncake-1m-512",
    "synthetic-1m",
    "system-prompt-100k",
    "turns-100k",
)


def _cases(files: dict[str, Path], azure: Path, mooncake: Path) -> dict[str, str]:
    """name -> Python statement run in a fresh process (its wall time is measured)."""
    synth = "arrival='poisson', rate=100, num_requests=1_000_000, prompt='geometric:500', output='geometric:200'"
    # with block ids (16 tokens): 100,000 requests hold about 9M ids already
    small = synth.replace("1_000_000", "100_000")
    return {
        "azure": f"read_trace({str(azure)!r})",
        "mooncake-sample": f"read_trace({str(mooncake)!r})",
        "mooncake-sample-512": f"read_trace({str(mooncake)!r}, block_size=None)",
        "plain-1m": f"read_trace({str(files['plain'])!r})",
        "mooncake-1m-512": f"read_trace({str(files['mooncake'])!r}, block_size=None)",
        "synthetic-1m": f"make_trace(WorkloadSpec({synth}))",
        "system-prompt-100k": f"make_trace(WorkloadSpec({small}, system_prompt=1000))",
        "turns-100k": f"make_trace(WorkloadSpec({small}, turns='geometric:4', think_time_s=30))",
    }


def _peak_gb() -> float:
    """This process's peak resident memory, GB (kB / 1e6; `_memory.peak_rss_kb`)."""
    return peak_rss_kb() / 1e6


def _child(stmt: str) -> None:
    from llmsched.workload import WorkloadSpec, make_trace, read_trace  # noqa: F401, PLC0415

    t0 = time.perf_counter()
    t = eval(stmt)  # noqa: S307 - our own statements
    dt = time.perf_counter() - t0
    ids = 0 if t.block_ids is None else int(t.block_ids.shape[0])
    peak = _peak_gb()
    print(json.dumps({"s": dt, "requests": len(t), "ids": ids, "block_size": t.block_size, "peak_gb": peak}))


def _median(runs: list[dict]) -> tuple[float, dict]:
    """(median wall time, the median run: the lower middle one for an even count), so that
    the peak memory printed is that run's, not the last run's."""
    return statistics.median(x["s"] for x in runs), sorted(runs, key=lambda x: x["s"])[(len(runs) - 1) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--repeat", type=positive_int, default=3)
    ap.add_argument("--dir", default="/tmp/llmsched-bench-traces", help="where the generated files go")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return
    names = args.cases.split(",") if args.cases else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:  # before the traces are looked up and 460 MB of files are written
        fail("bench_traces", f"unknown case {unknown[0]!r}; known: {', '.join(CASES)}")
    with config_errors("bench_traces"):
        azure, mooncake = shared_traces()
    cases = _cases(_make_files(Path(args.dir), mooncake, names), azure, mooncake)
    print(f"{'case':22s} {'requests':>10s} {'block ids':>12s} {'block':>5s} {'median s':>9s} {'peak GB':>8s}")
    for name in names:
        runs = []
        for _ in range(args.repeat):
            out = run_child([sys.executable, __file__, "--child", cases[name]], "bench_traces")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        med, r = _median(runs)
        print(f"{name:22s} {r['requests']:>10,} {r['ids']:>12,} {r['block_size']:>5} {med:>9.2f} {r['peak_gb']:>8.2f}")


if __name__ == "__main__":
    main()
