"""The benchmark scripts (benchmarks/): bad input gives one line and exit code 2, a failing
child its own message; generated files appear whole; bench_prefix warms up untimed; the
numbers printed belong together."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=ENV, timeout=timeout
    )


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


# each refused at argument checking, before any simulation (these used to give a
# traceback, a CalledProcessError hiding the child's reason, or a silent 100-request run)
BAD = [
    ("bench_simulator.py", "--sizes", "0"),
    ("bench_simulator.py", "--load", "-1"),
    ("bench_simulator.py", "--b-max", "0"),
    ("bench_serverless.py", "--scale", "0"),
    ("bench_serverless.py", "--scale", "-1"),
    ("bench_serverless.py", "--overhead-requests", "0"),
    ("bench_network.py", "--scale", "-1"),
    ("bench_network.py", "--load", "0"),
    ("compare_peers.py", "--sizes", "0"),
    ("compare_peers.py", "--load", "0"),
    ("bench_sweep.py", "--rates", "1"),
    ("bench_sweep.py", "--backends", "bogus"),
    ("bench_prefix.py", "--repeat", "0"),
    ("bench_prefix.py", "--block-size", "0"),
    ("bench_traces.py", "--repeat", "0"),
    # (these gave a traceback, ran a 17-minute search for a rate, or printed only a header)
    ("bench_server.py", "--num-prompts", "0"),
    ("bench_server.py", "--input-len", "500,100"),
    ("bench_server.py", "--output-len", "64"),
    ("bench_server.py", "--streams", "0"),
    ("bench_adaptive.py", "--cases", "foo"),
    ("bench_adaptive.py", "--loads", "0.95,"),
    ("bench_adaptive.py", "--seeds", "-1"),
    ("capacity_accuracy.py", "--num-requests", "0"),
    ("verdict_rates_network.py", "--networks", "nosuch"),
    ("verdict_rates_network.py", "--seeds", "0"),
    ("verdict_rates_sim.py", "--loads", "-1"),
    ("verdict_rates_sim.py", "--requests", "0"),
    ("engine_cpu_throughput.py", "--num-prompts", "0"),
    ("engine_cpu_throughput.py", "--repeats", "0"),
    ("bench_decode_spread.py", "--batches", "0"),
    ("bench_decode_spread.py", "--contexts", "x"),
    ("bench_vs_sim_kv.py", "--seeds", "0"),
    ("bench_vs_sim_kv.py", "--kv-capacity", "0"),
    ("gpu_engine.py", "--requests", "0"),
    ("gpu_engine.py", "--rate", "-2"),
    # (a ValueError traceback, or an OSError from sched_setaffinity after the model was written)
    ("engine_cpu_throughput.py", "--cpus", "abc"),
    ("engine_cpu_throughput.py", "--cpus", "-1"),
    ("engine_cpu_throughput.py", "--cpus", "3-1"),
    ("engine_cpu_throughput.py", "--cpus", "0,,1"),
    ("engine_cpu_throughput.py", "--cpus", "4096"),
    # (a negative seed: numpy's traceback, some after minutes of work; now seed_int, as llmsched's)
    ("bench_server.py", "--seed", "-1"),
    ("bench_serverless.py", "--seed", "-1"),
    ("bench_network.py", "--seed", "-1"),
    ("compare_peers.py", "--seed", "-1"),
    ("verdict_rates.py", "--seed", "-1"),
    ("verdict_rates.py", "--runs", "0"),  # (ZeroDivisionError after the runs)
    # (was a ConfigError traceback after the workload search, the simulation and the server start)
    ("bench_server.py", "--endpoint", "/nosuch"),
]


@pytest.mark.parametrize(("script", "flag", "value"), BAD, ids=[f"{s} {f} {v}" for s, f, v in BAD])
def test_bad_argument_is_one_line_and_exit_2(script, flag, value):
    r = _run_script(script, flag, value)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ": error: " in ln]
    assert errors == [r.stderr.strip().splitlines()[-1]], r.stderr  # argparse's usage, then one error line
    assert f"argument {flag}" in errors[0]


# the files each script writes when its runs end: a path there that cannot be written is
# refused before the runs (verdict_rates_sim wrote --json after minutes of runs, then a
# FileNotFoundError traceback, the results lost)
OUT_FILES = [
    ("bench_adaptive.py", "--json"),
    ("bench_network.py", "--json"),
    ("bench_server.py", "--json"),
    ("bench_serverless.py", "--json"),
    ("bench_sweep.py", "--json"),
    ("capacity_accuracy.py", "--json"),
    ("compare_peers.py", "--json"),
    ("engine_cpu_throughput.py", "--out"),
    ("gpu_engine.py", "--out"),
    ("verdict_rates.py", "--json"),
    ("verdict_rates_network.py", "--json"),
    ("verdict_rates_sim.py", "--json"),
]


@pytest.mark.parametrize(("script", "flag"), OUT_FILES, ids=[f"{s} {f}" for s, f in OUT_FILES])
def test_an_unwritable_output_file_is_refused_before_the_runs(script, flag, tmp_path):
    # a folder where the file should be: refused by every script, also one that makes
    # the file's missing folders
    r = _run_script(script, flag, str(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.endswith(f"error: argument {flag}: output file {str(tmp_path)!r} is a folder, not a file"), r.stderr
    assert "Traceback" not in r.stderr


def test_out_file_checks_the_folder(tmp_path):
    cli = _bench_module("_cli")
    assert cli.out_file(str(tmp_path / "x.json")) == str(tmp_path / "x.json")
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        cli.out_file(str(tmp_path / "no" / "x.json"))
    # (a script that makes the folder: the nearest existing one must be writable; none made)
    assert cli.out_file_in_new_folder(str(tmp_path / "no" / "x.json"))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="is a file, not a folder"):
        cli.out_file_in_new_folder(str(tmp_path / "file" / "x.json"))


# each refused after argument checking but before any work: llmsched's own message (a
# ConfigError), or the missing program named; one line, exit 2 (these gave a traceback)
REFUSED = [
    ("bench_server.py", ["--cost-model", "nosuch"], "bench_server: unknown cost model 'nosuch'"),
    ("bench_server.py", ["--scheduler", "nosuch"], "bench_server: unknown batch policy 'nosuch'"),
    # (before the tokenizer is trained and the server started: was FileNotFoundError after them)
    ("bench_server.py", ["--vllm", "/nonexistent/vllm"], "bench_server: no vLLM executable at /nonexistent/vllm"),
    ("bench_vs_sim_kv.py", ["--kv-capacity", "10"], "bench_vs_sim_kv: request 0 needs "),
    ("engine_cpu_throughput.py", ["--no-vllm", "--scheduler", "nosuch"], "engine_cpu_throughput: unknown"),
    # (was found missing only after our engine's runs, the result an error entry, exit 0)
    (
        "engine_cpu_throughput.py",
        ["--vllm-python", "/nonexistent/python"],
        "engine_cpu_throughput: no vLLM interpreter at /nonexistent/python",
    ),
    ("verdict_rates_sim.py", ["--policies", "sarathi", "nosuch"], "verdict_rates_sim: unknown batch policy 'nosuch'"),
]


@pytest.mark.parametrize(("script", "args", "start"), REFUSED, ids=[f"{s} {' '.join(a)}" for s, a, _ in REFUSED])
def test_a_refused_setting_is_one_line_and_exit_2(script, args, start):
    r = _run_script(script, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(start), r.stderr


def test_a_failing_child_reports_its_reason_not_a_traceback():
    """bench_simulator's child refuses an unknown cost model: its message, exit 2 (was
    CalledProcessError from `check=True`, the child's stderr discarded)."""
    r = _run_script("bench_simulator.py", "--cost-model", "nope", "--sizes", "100", "--no-cli")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("bench_simulator: unknown cost model 'nope'"), r.stderr


def test_run_child_keeps_the_last_stderr_line(capsys):
    cli = _bench_module("_cli")
    code = "import sys; print('noise', file=sys.stderr); raise ValueError('the reason')"
    with pytest.raises(SystemExit) as exc:
        cli.run_child([sys.executable, "-c", code], "bench_x")
    assert exc.value.code == 2
    assert capsys.readouterr().err == "bench_x: ValueError: the reason\n"


def test_interrupted_generation_leaves_no_partial_file(tmp_path, monkeypatch):
    """A run stopped while writing the 1M-row Mooncake file left a partial file, which the
    next run (regenerating only missing files) timed as the 1M case."""
    bench_traces = _bench_module("bench_traces")
    monkeypatch.setattr(bench_traces, "N", 50)
    sample = tmp_path / "sample.jsonl"
    sample.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n')
    real_dumps, calls = json.dumps, []

    def stop_midway(obj, *a, **k):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return real_dumps(obj, *a, **k)

    monkeypatch.setattr(bench_traces.json, "dumps", stop_midway)
    with pytest.raises(KeyboardInterrupt):
        bench_traces._make_files(tmp_path / "f", sample, ["mooncake-1m-512"])
    assert list((tmp_path / "f").iterdir()) == []
    monkeypatch.setattr(bench_traces.json, "dumps", real_dumps)
    files = bench_traces._make_files(tmp_path / "f", sample, ["mooncake-1m-512"])
    assert len(files["mooncake"].read_text().splitlines()) == 50


def test_bench_traces_prints_the_median_runs_peak():
    bench_traces = _bench_module("bench_traces")
    runs = [{"s": 3.0, "peak_gb": 0.3}, {"s": 1.0, "peak_gb": 0.1}, {"s": 2.0, "peak_gb": 0.2}]
    assert bench_traces._median(runs) == (2.0, runs[2])
    med, r = bench_traces._median(runs[:2])
    assert (med, r) == (2.0, runs[1])


def test_bench_prefix_warms_up_each_mode_untimed(monkeypatch, capsys):
    """Without a warm-up the first (off) run paid one-time costs: ratio 0.631 with
    --repeat 1 where the loop's was 1.564."""
    bench_prefix = _bench_module("bench_prefix")
    calls = []

    def fake_run(tr, on, block, kv):
        calls.append(on)
        cold = len(calls) <= 2
        stats = SimpleNamespace(steps=10, prefix={"token_hit_rate": 0.5, "evictions": 0})
        return (9.0 if cold else 1.0), 1.0, SimpleNamespace(wall_s=1.0, stats=stats)

    monkeypatch.setattr(bench_prefix, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["bench_prefix.py", "--requests", "50", "--repeat", "1"])
    bench_prefix.main()
    assert calls == [False, True, False, True]
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["wall_off_s"] == out["wall_on_s"] == 1.0


def test_bench_sweep_lambda_star_is_what_capacity_reports():
    bench_sweep = _bench_module("bench_sweep")
    r = subprocess.run(
        [sys.executable, "-m", "llmsched", "capacity", "--cost-model", "paper", "--b-max", "512"]
        + ["--prompt", "geometric:200", "--output", "geometric:101", "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lam = json.loads(r.stdout)["capacity"]["critical_rate"]
    assert bench_sweep.LAMBDA_STAR == pytest.approx(lam, abs=5e-4)


def test_bench_serverless_overhead_replays_twps_schedule():
    """The overhead case's `twp-schedule` replays TWP's recorded decisions: once admission
    policies written outside llmsched stopped inheriting `repeatable`, the replay asked for
    more decisions than TWP made (StopIteration, and the case printed nothing)."""
    bench_serverless = _bench_module("bench_serverless")
    out = bench_serverless.child_overhead(300, 0.5, 0, 1)
    runs = {r["run"]: r for r in out["runs"]}
    assert set(runs) == {f"{a}{'' if fast else ' step by step'}" for a, fast in bench_serverless.OVERHEAD_RUNS}
    assert runs["twp-schedule"]["steps"] == runs["twp"]["steps"] == runs["twp step by step"]["steps"]
    assert runs["twp-schedule"]["batches"] == runs["twp"]["batches"]


def test_gpu_engine_without_cuda_refuses_the_full_shape_before_any_work(tmp_path, monkeypatch, capsys):
    """Without CUDA it fell back to the CPU and built the Llama-3-8B shape in float32 (32 GB
    of weights: more than the memory of a machine without a GPU)."""
    gpu_engine = _bench_module("gpu_engine")
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False)))
    out = tmp_path / "results" / "g.json"
    with pytest.raises(SystemExit) as exc:
        gpu_engine.main(["--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_engine: no CUDA device"), err
    assert "--device cpu" in err and "--small" in err
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("device", "small", "cuda", "chosen"),
    [(None, False, True, "cuda"), (None, True, True, "cpu"), (None, True, False, "cpu"), ("cpu", False, False, "cpu")],
)
def test_gpu_engine_device(device, small, cuda, chosen):
    assert _bench_module("gpu_engine").pick_device(device, small, cuda) == chosen


@pytest.mark.parametrize(("device", "small"), [(None, False), ("cuda", True), ("cuda:1", False)])
def test_gpu_engine_refuses_a_missing_gpu(device, small, capsys):
    with pytest.raises(SystemExit) as exc:
        _bench_module("gpu_engine").pick_device(device, small, False)
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def _run_profile_step(tmp_path, **env) -> subprocess.CompletedProcess:
    """benchmarks/calibration/profile_step.py OUT with a stand-in torch that has no CUDA (and
    no tensors: a run that gets past the device check stops at its first tensor)."""
    fake = tmp_path / "fake"
    (fake / "torch" / "nn").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "__version__ = 'fake'\nfloat32 = bfloat16 = None\n\n\nclass cuda:\n"
        "    @staticmethod\n    def is_available():\n        return False\n"
    )
    (fake / "torch" / "nn" / "__init__.py").write_text("")
    (fake / "torch" / "nn" / "functional.py").write_text("")
    base = {k: v for k, v in ENV.items() if not k.startswith("PROFILE_")}
    return subprocess.run(
        [sys.executable, str(BENCH / "calibration" / "profile_step.py"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(fake), **env},
        timeout=60,
    )


def test_profile_step_without_cuda_stops_before_any_work(tmp_path):
    """It fell back to the CPU and built all 32 layers of Llama-3-8B in float32."""
    r = _run_profile_step(tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("profile_step: no CUDA device"), r.stderr
    assert "PROFILE_SMALL=1" in r.stderr and "PROFILE_DEVICE=cpu" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("opt_in", [{"PROFILE_SMALL": "1"}, {"PROFILE_DEVICE": "cpu"}])
def test_profile_step_runs_on_the_cpu_when_asked(tmp_path, opt_in):
    r = _run_profile_step(tmp_path, **opt_in)
    assert (tmp_path / "out" / "env.txt").read_text().startswith("device=cpu\n"), r.stderr


def test_bench_adaptive_prints_a_run_too_short_to_measure_its_growth():
    """10 requests of 1:1 give too few backlog samples for a growth: the summary has no
    growth keys (was KeyError in run(), a traceback); the row says n/a, the verdict is
    inconclusive with llmsched's reason."""
    bench_adaptive = _bench_module("bench_adaptive")
    row = bench_adaptive.run((1, 1), 0.5, 0, 10)
    assert row["verdict"] == "inconclusive"
    assert row["verdict_reason"].startswith("too short: ")
    assert row["growth_tokens_per_s"] is None and row["growth_ci"] is None
    assert " n/a " in bench_adaptive.format_row(row)
    # a run long enough keeps its measured growth in the row
    row = bench_adaptive.run((1, 1), 0.5, 0, 200)
    assert isinstance(row["growth_tokens_per_s"], float) and len(row["growth_ci"]) == 2
    assert " n/a " not in bench_adaptive.format_row(row)


def test_bench_serverless_json_under_a_new_keep_folder(tmp_path):
    """`--keep K --json K/x.json` with K new: the script makes K, so the JSON's folder need
    not exist when the arguments are read (it was refused up front for a while)."""
    keep = tmp_path / "k"
    r = _run_script(
        "bench_serverless.py",
        *("--cases", "overhead", "--overhead-requests", "60", "--repeat", "1"),
        *("--keep", str(keep), "--json", str(keep / "sub" / "x.json")),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert {row["run"] for row in json.loads((keep / "sub" / "x.json").read_text())} >= {"fcfs", "twp"}


# a folder argument that cannot be used: refused at argument checking (these gave a
# traceback: FileExistsError, NotADirectoryError, or a ConfigError after a backend's runs)
FOLDER_ARGS = [("bench_sweep.py", "--out"), ("compare_peers.py", "--workdir")]
FAST_RUNS = {
    "bench_sweep.py": ["--backends", "local1", "--requests", "20", "--rates", "2"],
    "compare_peers.py": ["--sizes", "20", "--scenarios", "const", "--peers"],
}


@pytest.mark.parametrize(("script", "flag"), FOLDER_ARGS, ids=[f"{s} {f}" for s, f in FOLDER_ARGS])
@pytest.mark.parametrize("where", ["file", "file/sub", "/proc/nosuch/sub"])
def test_an_unusable_folder_is_refused_before_any_work(script, flag, where, tmp_path):
    (tmp_path / "file").write_text("mine")
    folder = where if where.startswith("/") else str(tmp_path / where)
    r = _run_script(script, *FAST_RUNS[script], flag, folder)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"error: argument {flag}: output folder {folder!r}" in last, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_bench_sweep_checks_every_backends_folder_before_the_first_runs(tmp_path):
    """OUT/local a file: refused when local1 had run (a ConfigError traceback, its
    results lost); now before any run."""
    (tmp_path / "local").write_text("mine")
    r = _run_script(
        "bench_sweep.py", *("--backends", "local1", "local", "--requests", "20", "--rates", "2", "--out", str(tmp_path))
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("bench_sweep: output folder "), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local"]


def test_compare_peers_checks_its_default_json_before_any_work(tmp_path):
    """WORKDIR/compare_peers.json a folder: a traceback once every run was done."""
    (tmp_path / "compare_peers.json").mkdir()
    r = _run_script("compare_peers.py", *FAST_RUNS["compare_peers.py"], "--workdir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("compare_peers: output file "), r.stderr
    assert "is a folder, not a file" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare_peers.json"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PROFILE_SECONDS", "abc"),
        ("PROFILE_SECONDS", "-5"),
        ("PROFILE_SECONDS", "0"),
        ("PROFILE_SECONDS", "nan"),
        ("PROFILE_SECONDS", "inf"),
        ("PROFILE_SMALL", "yes"),
        ("PROFILE_DEVICE", "gpu"),
    ],
)
def test_profile_step_refuses_a_bad_setting_before_any_work(tmp_path, name, value):
    """PROFILE_SECONDS=abc gave a ValueError traceback; PROFILE_SMALL=yes or
    PROFILE_DEVICE=gpu were read as not set (a full-size run, or none: 'no CUDA device')."""
    r = _run_profile_step(tmp_path, **{name: value})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"profile_step: {name}="), r.stderr
    assert not (tmp_path / "out").exists()


def test_write_json_keeps_the_old_file_when_stopped(tmp_path):
    """A result file written with a plain open and stopped midway was left truncated."""
    cli = _bench_module("_cli")
    path = tmp_path / "r.json"
    path.write_text("old")

    def stop(obj):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cli.write_json(path, {"a": 1, "b": object()}, default=stop)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # (no temporary file left)
    cli.write_json(tmp_path / "new" / "r.json", {"a": [1, 2]}, indent=1)  # (its folder made)
    assert json.loads((tmp_path / "new" / "r.json").read_text()) == {"a": [1, 2]}


@pytest.mark.parametrize("script", sorted({s for s, _ in OUT_FILES} | {"bench_server.py"}))
def test_every_script_writes_its_json_whole(script):
    """Through `_cli.write_json` (whole or not at all), not a plain `open` + `json.dump`."""
    source = (BENCH / script).read_text()
    assert "write_json(" in source
    assert "json.dump(" not in source and "write_text(json.dumps" not in source


def test_profile_step_writes_its_files_whole(tmp_path):
    r = _run_profile_step(tmp_path, PROFILE_SMALL="1")
    assert (tmp_path / "out" / "env.txt").read_text().startswith("device=cpu\n"), r.stderr
    assert "open(os.path.join(OUT" not in (BENCH / "calibration" / "profile_step.py").read_text()


def _server_args(**kw):
    base = dict(seed=0, num_prompts=40, input_len=(128, 256), output_len=(16, 32), scheduler="sarathi", b_max=512)
    return SimpleNamespace(**{**base, "kv_capacity": None, "cost_model": "paper", **kw})


def test_bench_server_finds_the_rate_of_a_single_stream():
    """The search's floor was 1 req/s: one stream of 200-256 output tokens on the paper
    model (a request alone takes ~9 s) got 1 req/s, 7.5 requests in flight, not 1."""
    bench_server = _bench_module("bench_server")
    args = _server_args(streams=1, output_len=(200, 256))
    wl, rate = bench_server.make_workload(args)
    assert rate < 0.2
    assert bench_server.simulate(wl, args)["mean_concurrency"] == pytest.approx(1, rel=0.05)


def test_bench_server_refuses_streams_no_rate_can_keep():
    bench_server = _bench_module("bench_server")
    with pytest.raises(bench_server.ConfigError, match="--streams 1000"):
        bench_server.make_workload(_server_args(streams=1000))


def test_bench_sweep_reruns_over_its_own_outputs_only(tmp_path):
    """Each backend's folder was removed whole before its runs (shutil.rmtree): a file of
    the user's in it went too. Now only an earlier sweep's outputs are cleared."""
    run = [sys.executable, str(BENCH / "bench_sweep.py"), "--backends", "local1", "--requests", "20", "--rates", "2"]
    (tmp_path / "local1").mkdir()
    (tmp_path / "local1" / "notes.txt").write_text("mine")
    for _ in range(2):  # (the second over the first's outputs)
        r = subprocess.run([*run, "--out", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "local1" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "local1" / "results.csv").is_file()


def test_compare_peers_child_runs_under_an_interpreter_without_llmsched():
    """The peers' interpreter has no llmsched: the module-level import of _cli (llmsched's
    checks) failed every peer's run with ModuleNotFoundError. `-S` leaves out the
    site-packages that hold llmsched here; the child gets as far as its own arguments."""
    run = subprocess.run(
        [sys.executable, "-S", str(BENCH / "compare_peers.py"), "--child", "sched-sim"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "the following arguments are required: --trace" in run.stderr
    assert "ModuleNotFoundError" not in run.stderr


def test_bench_serverless_platform_runs_its_seed(tmp_path):
    """`--seed` draws the platform case's models: the platform ran seed 0 whatever was
    given (and the overhead runs replay the trace, which draws nothing), so the option did
    nothing."""
    runs = {}
    for seed in (0, 3):
        keep = tmp_path / f"k{seed}"
        r = _run_script(
            "bench_serverless.py",
            *("--cases", "platform", "--scale", "0.0002", "--seed", str(seed), "--keep", str(keep)),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads((keep / "platform" / "config.json").read_text())["workload"]["seed"] == seed
        assert json.loads(r.stdout.strip().splitlines()[-1])[0]["seed"] == seed
        runs[seed] = (keep / "platform" / "requests.csv").read_text()
    assert runs[0] != runs[3]  # other models drawn


def test_bench_serverless_refuses_an_unknown_scheduler_before_writing_the_trace(tmp_path):
    """A platform scheduler's name was checked only in the child, after the tiled trace
    (1M rows at full size) had been written: it is checked first now, aliases taken."""
    keep = tmp_path / "keep"
    r = _run_script("bench_serverless.py", "--cases", "platform", "--scheduler", "nope", "--keep", str(keep))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "bench_serverless: --scheduler: unknown scheduler 'nope'; "
        "known: fcfs, round-robin, priority, dynamicbatch, twp, serverlessllm"
    )
    assert not (keep / "azure_tiled.csv").exists()


def test_bench_prefix_ids_share_exactly_the_system_prompt():
    """Positions took 20 bits: past 2**20 blocks (a 1M-token system prompt at 1-token
    blocks) they spilled into the owner's, and two requests of a family shared blocks of
    their own text."""
    import numpy as np

    from llmsched.core import make_cost_model

    bench_prefix = _bench_module("bench_prefix")
    system = 2**20 + 5
    tr = bench_prefix.workload(4, 2, system, 3, 1, 0.5, make_cost_model("paper"))
    rows = [tr.block_ids[tr.block_ptr[i] : tr.block_ptr[i + 1]] for i in range(4)]
    for i in range(4):
        for j in range(i + 1, 4):
            a, b = rows[i], rows[j]
            m = min(len(a), len(b))
            shared = m if (a[:m] == b[:m]).all() else int(np.argmin(a[:m] == b[:m]))
            assert shared in (0, system), (i, j, shared)
