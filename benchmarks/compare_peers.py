"""llmsched against peer simulators on one workload: speed, memory, and a sanity check.

One command runs the same scenario on llmsched and on each installed peer (`sched-sim`,
`pyserq`), every run in a fresh subprocess, and prints a side-by-side table plus JSON:

    .venv/bin/python benchmarks/compare_peers.py                       # 10k and 100k requests
    .venv/bin/python benchmarks/compare_peers.py --sizes 100000 --scenarios const
    .venv/bin/python benchmarks/compare_peers.py --sizes 10000 --scenarios paper
    .venv/bin/python benchmarks/compare_peers.py --peer-python /tmp/peers-venv/bin/python

Peers live in their own virtual environment (default: $LLMSCHED_PEER_PYTHON, else
/tmp/peers-venv/bin/python, else this interpreter); a peer that is not installed there is
reported as "not installed". Set one up with

    python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install pyserq==0.1.6 sched-sim==0.2.1

(or install both into this project's venv: then this interpreter is the peer python).

The workload is generated once per scenario with `llmsched.workload` (the scenario's
lengths, Poisson arrivals at the scenario's load times the capacity of its cost model,
seed 1), written to CSV, and every simulator replays that file: the same arrival times
and the same lengths (first N rows for size N).

Every simulator also writes its outputs, timed on their own (`out_s`), because a user
gets them: llmsched the files of `llmsched simulate --out DIR` (summary.json, config.json,
requests.csv, timeseries.csv and the three histograms), sched-sim its metrics JSON (what
its CLI's `--output run.json` writes), pyserq its JSON report (what `serq run --json`
prints). `sim+out` = sim_s + out_s is the figure to compare.

Scenarios
- `const` (pyserq's own workload): every request 1000 prompt and 201 output tokens,
  Poisson arrivals at 85% of capacity (2.368 req/s), the paper's step time, Sarathi with a
  512-token budget. Like `paper` otherwise.
- `paper` (like-for-like): the paper's step time t(b) = c + a * ceil(b / b0), c = 11.28 ms,
  a = 35.47 ms, b0 = 128, for all three simulators; Sarathi (decodes first, then chunked
  prefill FCFS) with a 512-token budget; no KV or running-request limit in effect.
- `h200`: each simulator's own H200 model: llmsched's measured H200 Llama-3-8B profile;
  sched-sim's roofline model with an H200 + Llama-3-8B hardware profile; pyserq has no
  table-driven model and is not run.

How each peer is driven (and what differs) is written next to its child function below
and in docs/performance.md.

Measured in the child: `sim_s` (wall time of the simulation call, including the
simulator's own metrics), `sim_cpu_s` (process CPU time of that call: steadier than wall
time on a shared machine), `out_s` and `out_cpu_s` (writing the outputs), `load_s`
(turning the CSV into the simulator's input), `cpu_s` (user + system CPU of the whole
child), and peak RSS (VmHWM of the child, whole process; not `ru_maxrss`, which on Linux
keeps the parent's size across fork + exec); `process_s` is the child's wall time as
seen by the parent (interpreter start and imports included). `req/s` = N / (sim_s +
out_s); `req/cpu-s` = N / (sim_cpu_s + out_cpu_s); the table's `run cpu s` is
`run_cpu_s` = sim_cpu_s + out_cpu_s (not the whole child's `cpu_s`).
"""

from __future__ import annotations

# Only the standard library at module level: the peer children run this file under the
# peers' interpreter, where llmsched and numpy are not installed.
import argparse
import csv
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _memory import peak_rss_kb

PEERS = ("sched-sim", "pyserq")
PYSERQ_VARIANTS = ("decode-first:trace", "admission:trace", "admission:native")
DEFAULT_PEER_PYTHON = "/tmp/peers-venv/bin/python"
H200_SPEC = "profile:h200-llama-3-8b"
# scenario -> (cost model, prompt law, output law, default load)
SCENARIOS = {
    "const": ("paper", "const:1000", "const:201", 0.85),
    "paper": ("paper", "sharegpt", "sharegpt", 0.9),
    "h200": (H200_SPEC, "sharegpt", "sharegpt", 0.9),
}


def _rss_mb() -> float:
    """Peak RSS of this process so far, MB (`_memory.peak_rss_kb`)."""
    return peak_rss_kb() / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _read_rows(path: str) -> list[tuple[float, int, int]]:
    with open(path, newline="") as fh:
        return [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r["output_tokens"])) for r in csv.DictReader(fh)]


# ----------------------------------------------------------------------------- children


def child_llmsched(a) -> dict:
    import llmsched
    from llmsched.workload import read_trace

    base = _rss_mb()
    t0 = time.perf_counter()
    trace = read_trace(a.trace)
    t1 = time.perf_counter()
    c1 = time.process_time()
    # what `llmsched simulate --trace FILE --out DIR` runs: the simulation, its summary and
    # stability verdict, then the output files
    r = llmsched.simulate(trace=trace, policy="sarathi", b_max=a.b_max, cost_model=a.cost)
    s = r.summary
    t2, c2 = time.perf_counter(), time.process_time()
    out = Path(a.workdir) / f"llmsched_out_{Path(a.trace).stem}"
    r.write(out)
    t3, c3 = time.perf_counter(), time.process_time()
    return {
        "version": llmsched.__version__,
        "load_s": t1 - t0,
        "sim_s": t2 - t1,
        "sim_cpu_s": c2 - c1,
        "out_s": t3 - t2,
        "out_cpu_s": c3 - c2,
        "loop_s": r.wall_s,
        "base_rss_mb": base,
        "completed": s["completed"],
        "steps": s["steps"],
        "mean_ttft_ms": s["mean_ttft_ms"],
        "mean_e2e_ms": s["mean_e2el_ms"],
        "preemptions": int(r.stats.preemptions.sum()),
        "notes": f"cost_model={a.cost}; outputs in {out}",
    }


def _sched_sim_h200():
    from sched_sim.hardware.profile import HardwareProfile

    # H200 SXM (141 GB HBM3e, 4.8 TB/s, 989 dense FP16 TFLOPS) running Llama-3-8B; the
    # efficiency and launch overhead are those of sched-sim's own H100 preset, the model
    # geometry that of its A100 Llama-3-8B preset. sched-sim ships no H200 preset.
    return HardwareProfile(
        name="H200 SXM (141GB) - Llama-3-8B",
        vram_gb=141.0,
        memory_bandwidth_gb_s=4800.0,
        fp16_tflops=989.0,
        tensor_core_efficiency=0.55,
        kernel_launch_overhead_ms=0.03,
        pcie_bandwidth_gb_s=128.0,
        network_bandwidth_gbps=400.0,
        model_name="Meta-Llama-3-8B-Instruct",
        parameter_count_billions=8.03,
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
    )


class _PaperLatency:
    """The paper's t(b) = c + a * ceil(b / b0) behind sched-sim's latency-model interface
    (the three step-time methods its event engine calls)."""

    def __init__(self, c_s: float, a_s: float, b0: int):
        self.c, self.a, self.b0 = c_s, a_s, b0
        self.launch_overhead_s = 0.0

    def _t(self, b: int) -> float:
        return self.c + self.a * math.ceil(b / self.b0)

    def compute_prefill_step_time(self, num_prefill_tokens):
        return self._t(num_prefill_tokens)

    def compute_decode_step_time(self, batch_size, total_context_tokens):
        return self._t(batch_size)

    def compute_mixed_step_time(self, num_prefill_tokens, num_decode_requests, total_decode_context_tokens):
        return self._t(num_prefill_tokens + num_decode_requests)


def child_sched_sim(a) -> dict:
    # sched-sim's public pieces, as its CLI wires them: create_scheduler("chunked") is its
    # Sarathi-Serve/vLLM token-budget scheduler (decodes first, then prefill chunks, FCFS),
    # Simulator is its event engine. Requests are built directly (its JSON trace loader
    # rounds arrival times to 0.1 ms). Its `output_tokens` counts decode iterations AFTER
    # the prefill iteration that emits the first token, so a request asking for o tokens
    # is given o - 1 (the same work, P + o - 1 token computations, as llmsched).
    from importlib.metadata import version

    from sched_sim.core.event_engine import Simulator
    from sched_sim.core.request import Request
    from sched_sim.schedulers.factory import create_scheduler

    base = _rss_mb()
    hw = _sched_sim_h200()
    sched = create_scheduler("chunked", hw, token_budget=a.b_max)
    if a.cost == "paper":
        sched.latency_model = _PaperLatency(a.paper_c_ms / 1e3, a.paper_a_ms / 1e3, a.paper_b0)
    t0 = time.perf_counter()
    reqs = [
        Request(request_id=str(i), arrived_at=t, prompt_tokens=p, output_tokens=max(0, o - 1))
        for i, (t, p, o) in enumerate(_read_rows(a.trace))
    ]
    sim = Simulator(hw, sched)
    sim.submit_workload(reqs)
    t1, c1 = time.perf_counter(), time.process_time()
    m = sim.run()
    t2, c2 = time.perf_counter(), time.process_time()
    from sched_sim.visualizer.exporter import export_metrics_json  # what its CLI's --output run.json calls

    out = Path(a.workdir) / f"sched_sim_{Path(a.trace).stem}.json"
    export_metrics_json(m, out)
    t3, c3 = time.perf_counter(), time.process_time()
    model = "paper t(b) via latency-model adapter" if a.cost == "paper" else "its roofline model, H200 profile"
    return {
        "version": version("sched-sim"),
        "load_s": t1 - t0,
        "sim_s": t2 - t1,
        "sim_cpu_s": c2 - c1,
        "out_s": t3 - t2,
        "out_cpu_s": c3 - c2,
        "base_rss_mb": base,
        "completed": m.completed_requests,
        "steps": m.total_iterations,
        "mean_ttft_ms": m.ttft_ms.mean,
        "mean_e2e_ms": m.e2e_ms.mean,
        "preemptions": m.preempted_requests_count,
        "notes": f"{model}; KV {sched.block_manager.total_gpu_blocks} x 16-token blocks",
    }


_SERQ_PROGRAM = """\
// Sarathi on one GPU: a {b_max}-token budget, {order} ({order_note}),
// then the waiting requests FCFS, each prefill chunked to what the budget leaves.
// Step time: t(b) = c + a * ceil(b / b0), in seconds. No KV pool: memory never binds.
let bmax = {b_max};
let c = {c_s!r};
let a = {a_s!r};
let b0 = {b0};

fn main() {{
{gate_decl}  device gpu {{ compute (t) = a * ceil(t / b0); }}
  engine sarathi on gpu {{
    tokens cap bmax;
    scheduler {{
      advance running {order};
      admit waiting while (running.preempted == 0);
    }}
    worker {{ forward (c + compute(batch.tokens)); }}
  }}
  server ({params}) {{
{server_body}  }}
}}
"""

_SERQ_TRACE_SERVER = """\
    run gate (cost(gate, think));   // hold the request until its arrival time
    set t0 = now;
    sarathi (new, out);
    observe e2e = now - t0;
"""


def child_pyserq(a) -> dict:
    # pyserq (serQ 0.1.x): a deployment is a program, the workload a file of its own.
    # Lengths come from a trace CSV (`session,turn,new,out,think`, one single-turn session
    # per request, replayed `ordered`). serQ draws arrival times itself, so to replay ours:
    #  - `trace` arrivals: all sessions start at 0 (`arrive batch(N)`) and the server first
    #    holds each request in a delay stage for its arrival time (carried in `think`), so
    #    the engine sees exactly our arrival times. The client's TTFT then counts from 0:
    #    mean TTFT = mean(client TTFT) - mean(arrival); E2E is observed after the delay.
    #    Cost: N sessions live from time 0 (more memory than a streamed arrival process).
    #  - `native` arrivals: serQ's own `arrive poisson(rate)` at the same rate with the same
    #    length sequence: same law, not the same realisation.
    # Orders: `decode first` is Sarathi exactly (it reproduces llmsched's step count and
    # means); `admission` (admission order among running requests) is serQ's default
    # order, faster in serQ, and a different policy (it gives other numbers).
    import pyserq

    order_name, arrivals = a.variant.split(":")
    order = {"decode-first": "decode first", "admission": "admission"}[order_name]
    rows = _read_rows(a.trace)
    n = len(rows)
    work = Path(a.workdir)
    tag = f"{Path(a.trace).stem}_{order_name}_{arrivals}"
    corpus = work / f"{Path(a.trace).stem}_serq.csv"
    if not corpus.exists():
        with open(corpus, "w") as fh:
            fh.write("session,turn,new,out,think\n")
            fh.writelines(f"{i},0,{p},{o},{t!r}\n" for i, (t, p, o) in enumerate(rows))
    program = _SERQ_PROGRAM.format(
        b_max=a.b_max,
        c_s=a.paper_c_ms / 1e3,
        a_s=a.paper_a_ms / 1e3,
        b0=a.paper_b0,
        order=order,
        order_note="Sarathi: decodes first" if order_name == "decode-first" else "serQ's default order",
        gate_decl="  stage gate : delay;\n" if arrivals == "trace" else "",
        params="new, out, think" if arrivals == "trace" else "new, out",
        server_body=_SERQ_TRACE_SERVER if arrivals == "trace" else "    sarathi (new, out);\n",
    )
    if arrivals == "trace":
        workload = f'workload {{\n  arrive batch({n});\n  trace "{corpus}" ordered;\n  send (new, out, think);\n}}\n'
    else:
        workload = f'workload {{\n  arrive poisson({a.rate!r});\n  trace "{corpus}" ordered;\n  send (new, out);\n}}\n'
    (work / f"{tag}.sq").write_text(program)
    (work / f"{tag}.workload.sq").write_text(workload)
    span = max(t for t, _, _ in rows)
    horizon = float(max(1e6, 20 * span))
    base = _rss_mb()
    t0 = time.perf_counter()
    kw = {"arrivals": n} if arrivals == "native" else {}
    prog = pyserq.compile(
        str(work / f"{tag}.sq"), workload=str(work / f"{tag}.workload.sq"), horizon=horizon, seed=1, **kw
    )
    t1, c1 = time.perf_counter(), time.process_time()
    r = pyserq.run(prog)
    t2, c2 = time.perf_counter(), time.process_time()
    (work / f"{tag}.report.json").write_text(r.json())  # what `serq run --json` prints
    t3, c3 = time.perf_counter(), time.process_time()
    client = r.client
    ttft, resp = client["ttft"], client["response"]
    if arrivals == "trace":
        mean_arrival = sum(t for t, _, _ in rows) / n
        mean_ttft = ttft.mean - mean_arrival
        mean_e2e = r.observe("e2e").mean
    else:
        mean_ttft, mean_e2e = ttft.mean, resp.mean
    eng = r.stage("sarathi")
    return {
        "version": pyserq.__version__,
        "load_s": t1 - t0,
        "sim_s": t2 - t1,
        "sim_cpu_s": c2 - c1,
        "out_s": t3 - t2,
        "out_cpu_s": c3 - c2,
        "base_rss_mb": base,
        "completed": resp.count,
        "steps": eng.iterations,
        "mean_ttft_ms": mean_ttft * 1e3,
        "mean_e2e_ms": mean_e2e * 1e3,
        "preemptions": 0,
        "notes": f"order={order_name}, arrivals={arrivals}; program {tag}.sq",
    }


CHILDREN = {"llmsched": child_llmsched, "sched-sim": child_sched_sim, "pyserq": child_pyserq}


def run_child(a) -> None:
    out = CHILDREN[a.child](a)
    out["peak_rss_mb"] = _rss_mb()
    out["cpu_s"] = _cpu_s()
    print(json.dumps(out))


# ----------------------------------------------------------------------------- parent


def peer_version(python: str, peer: str) -> str | None:
    """The peer's installed version under `python`, or None when it is not installed."""
    if not python or not Path(python).exists():
        return None
    mod = {"sched-sim": "sched_sim", "pyserq": "pyserq"}[peer]
    code = f"import importlib.metadata as m, {mod}\nprint(m.version({peer!r}))"
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def _capacity():
    try:
        from llmsched.theory import capacity
    except ImportError:  # before the theory package
        from llmsched.analysis.capacity import capacity
    return capacity


def make_traces(scenarios, sizes, load, b_max, seed, workdir: Path) -> dict:
    """One trace per scenario (Poisson at the scenario's load x capacity of its cost model;
    `load` overrides it), written as CSV once per size (the first N requests)."""
    import numpy as np

    from llmsched.workload import WorkloadSpec, make_trace

    capacity = _capacity()
    out = {}
    for sc in scenarios:
        cost, prompt, output, sc_load = SCENARIOS[sc]
        sc_load = load if load is not None else sc_load
        probe = make_trace(
            WorkloadSpec(arrival="poisson", rate=1.0, prompt=prompt, output=output, num_requests=200_000, seed=seed)
        )
        try:  # the contexts of the lengths' mix, as `llmsched capacity` times them (since 2026-12-01)
            from llmsched.theory import LengthMix

            mix = {"mix": LengthMix(probe.prompt, probe.output)}
        except ImportError:  # an older llmsched: the mean lengths' contexts
            mix = {}
        rep = capacity(cost, b_max, float(np.mean(probe.prompt)), float(np.mean(probe.output)), **mix)
        rate = sc_load * rep.critical_rate
        full = make_trace(
            WorkloadSpec(arrival="poisson", rate=rate, prompt=prompt, output=output, num_requests=max(sizes), seed=seed)
        )
        files = {}
        for n in sizes:
            path = workdir / f"{sc}_{n}.csv"
            full.head(n).to_csv(path)
            files[n] = str(path)
        out[sc] = {
            "cost": cost,
            "prompt": prompt,
            "output": output,
            "load": sc_load,
            "rate": rate,
            "critical_rate": rep.critical_rate,
            "files": files,
            "mean_prompt": float(np.mean(full.prompt)),
            "mean_output": float(np.mean(full.output)),
        }
    return out


def _child_cmd(python, sim, trace, sc, args, workdir, variant=None):
    from llmsched.core.cost import PaperCostModel

    paper = PaperCostModel()
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--child",
        sim,
        "--trace",
        trace,
        "--cost",
        sc["cost"],
        "--b-max",
        str(args.b_max),
        "--rate",
        repr(sc["rate"]),
        "--workdir",
        str(workdir),
        "--paper-c-ms",
        repr(paper.c * 1e3),
        "--paper-a-ms",
        repr(paper.a * 1e3),
        "--paper-b0",
        str(paper.b0),
    ]
    if variant:
        cmd += ["--variant", variant]
    return cmd


def run_one(cmd, timeout) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout} s"}
    total = time.perf_counter() - t0
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
        return {"status": "error: " + (lines[-1] if lines else f"exit code {p.returncode}")}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["process_s"] = total
    res["status"] = "ok"
    return res


def _fmt(v, spec):
    if v is None:
        width = "".join(ch for ch in spec.split(".")[0].split(",")[0] if ch.isdigit())
        return "-".rjust(int(width or 1))
    return format(v, spec)


def print_table(rows) -> None:
    head = (
        f"{'scenario':<8} {'simulator':<30} {'N':>7} {'sim s':>8} {'out s':>7} {'sim+out':>8} "
        f"{'run cpu s':>9} {'req/s':>8} {'req/cpu-s':>9} {'RSS MB':>7} {'steps':>9} {'TTFT ms':>9} "
        f"{'E2E ms':>9}  status"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = r.get("status") == "ok"

        def v(key):
            return r.get(key) if ok else None

        print(
            f"{r['scenario']:<8} {r['label']:<30} {r['n']:>7} "
            f"{_fmt(v('sim_s'), '8.2f')} {_fmt(v('out_s'), '7.2f')} {_fmt(v('run_s'), '8.2f')} "
            f"{_fmt(v('run_cpu_s'), '9.2f')} "
            f"{_fmt(v('req_per_s'), '8,.0f')} {_fmt(v('req_per_cpu_s'), '9,.0f')} "
            f"{_fmt(v('peak_rss_mb'), '7.0f')} "
            f"{_fmt(v('steps'), '9,d')} {_fmt(v('mean_ttft_ms'), '9.1f')} "
            f"{_fmt(v('mean_e2e_ms'), '9.1f')}  {r['status']}"
        )


def print_ratios(rows) -> None:
    """How much faster llmsched is than each peer run, simulation plus outputs."""
    ours = {(r["scenario"], r["n"]): r for r in rows if r["simulator"] == "llmsched" and r.get("status") == "ok"}
    lines = []
    for r in rows:
        me = ours.get((r["scenario"], r["n"]))
        if r["simulator"] == "llmsched" or me is None or r.get("status") != "ok":
            continue
        lines.append(
            f"  {r['scenario']:<8} N={r['n']:<7} llmsched vs {r['label']:<30} "
            f"{r['run_s'] / me['run_s']:6.1f}x faster (sim+out wall), "
            f"{r['run_cpu_s'] / me['run_cpu_s']:6.1f}x (CPU)"
        )
    if lines:
        print("\nllmsched's speed-up, simulation plus outputs:")
        print("\n".join(lines))


def main() -> None:
    if "--child" in sys.argv[1:]:
        child_main(sys.argv[1:])
        return
    from _cli import config_errors  # llmsched's: in the parent only

    with config_errors("compare_peers"):
        _main()


def child_main(argv) -> None:
    """One run under a peer's interpreter, which has no llmsched: the standard library's
    parser and types only."""
    ap = argparse.ArgumentParser(prog="compare_peers.py --child")
    ap.add_argument("--child", choices=sorted(CHILDREN), required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--cost", required=True)
    ap.add_argument("--b-max", type=int, required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--variant")
    ap.add_argument("--paper-c-ms", type=float, required=True)
    ap.add_argument("--paper-a-ms", type=float, required=True)
    ap.add_argument("--paper-b0", type=int, required=True)
    run_child(ap.parse_args(argv))


def _main() -> None:
    from _cli import out_dir, out_file_in_new_folder, positive_float, positive_int, seed_int, write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS))
    ap.add_argument(
        "--peer-python",
        default=os.environ.get("LLMSCHED_PEER_PYTHON")
        or (DEFAULT_PEER_PYTHON if Path(DEFAULT_PEER_PYTHON).exists() else sys.executable),
        help="interpreter whose site-packages hold the peers (default: %(default)s)",
    )
    ap.add_argument(
        "--pyserq-variants",
        nargs="+",
        default=list(PYSERQ_VARIANTS),
        choices=PYSERQ_VARIANTS,
        help="ORDER:ARRIVALS runs of pyserq (see the module doc)",
    )
    ap.add_argument(
        "--load",
        type=positive_float,
        help="offered load as a share of capacity, for every scenario (default: 0.85 for const, 0.9 for the others)",
    )
    ap.add_argument("--b-max", type=positive_int, default=512)
    ap.add_argument("--seed", type=seed_int, default=1)
    ap.add_argument(
        "--workdir", type=out_dir, help="where traces, serQ programs and the JSON go (default: a new temp dir)"
    )
    ap.add_argument(
        "--json", type=out_file_in_new_folder, help="write the results here (default: WORKDIR/compare_peers.json)"
    )
    ap.add_argument("--timeout", type=positive_float, default=1800, help="seconds per child run")
    args = ap.parse_args()

    from llmsched.core.paths import check_out_file

    if args.workdir and not args.json:  # the default JSON's place, before any work
        check_out_file(Path(args.workdir) / "compare_peers.json", make_parents=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="compare-peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    versions = {"llmsched": None}
    import llmsched

    versions["llmsched"] = llmsched.__version__
    for peer in args.peers:
        versions[peer] = peer_version(args.peer_python, peer)
    print(f"peer python: {args.peer_python}")
    print("versions: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items()))
    traces = make_traces(args.scenarios, sorted(set(args.sizes)), args.load, args.b_max, args.seed, workdir)
    for sc, t in traces.items():
        print(
            f"scenario {sc}: cost {t['cost']}, rate {t['rate']:.4f} req/s "
            f"({t['load']:.0%} of {t['critical_rate']:.4f}), mean prompt {t['mean_prompt']:.1f}, "
            f"mean output {t['mean_output']:.1f}; traces in {workdir}"
        )
    print(flush=True)

    plan = []  # (scenario, simulator, label, variant)
    for sc in args.scenarios:
        plan.append((sc, "llmsched", "llmsched", None))
        if "sched-sim" in args.peers:
            plan.append((sc, "sched-sim", "sched-sim", None))
        if "pyserq" in args.peers:
            if SCENARIOS[sc][0] == "paper":
                for v in args.pyserq_variants:
                    plan.append((sc, "pyserq", f"pyserq [{v}]", v))
            else:
                plan.append((sc, "pyserq", "pyserq", None))
    rows = []
    for sc, sim, label, variant in plan:
        for n in sorted(set(args.sizes)):
            row = {"scenario": sc, "simulator": sim, "label": label, "variant": variant, "n": n}
            if sim != "llmsched" and versions.get(sim) is None:
                row["status"] = "not installed"
            elif sim == "pyserq" and SCENARIOS[sc][0] != "paper":
                row["status"] = "n/a: pyserq has no table/profile cost model"
            else:
                python = sys.executable if sim == "llmsched" else args.peer_python
                cmd = _child_cmd(python, sim, traces[sc]["files"][n], traces[sc], args, workdir, variant)
                row.update(run_one(cmd, args.timeout))
                if row.get("status") == "ok":
                    row["run_s"] = row["sim_s"] + row["out_s"]
                    row["run_cpu_s"] = row["sim_cpu_s"] + row["out_cpu_s"]
                    row["req_per_s"] = n / row["run_s"]
                    row["req_per_cpu_s"] = n / row["run_cpu_s"] if row["run_cpu_s"] > 0 else None
                    if row["completed"] != n:
                        row["status"] = f"ok, only {row['completed']} of {n} finished"
            rows.append(row)
            print(
                f"  done: {label} {sc} N={n}: {row['status']}"
                + (
                    f", {row['sim_s']:.2f} s + {row['out_s']:.2f} s outputs, {row['peak_rss_mb']:.0f} MB"
                    if row.get("run_s")
                    else ""
                ),
                flush=True,
            )
    print()
    print_table(rows)
    print_ratios(rows)
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "versions": versions,
        "peer_python": args.peer_python,
        "load": args.load,
        "b_max": args.b_max,
        "seed": args.seed,
        "scenarios": traces,
        "rows": rows,
    }
    jpath = Path(args.json) if args.json else workdir / "compare_peers.json"
    write_json(jpath, result, indent=2)  # (its folder made: e.g. under a --workdir made by this run)
    print(f"\nJSON: {jpath}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
