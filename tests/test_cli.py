"""The command line: the main job, outputs, and one-line errors with exit code 2."""

import csv
import json
import os
import subprocess
import sys

import pytest

from llmsched.cli import main

SMALL = [
    "--num-requests",
    "300",
    "--cost-model",
    "paper",
    "--b-max",
    "256",
    "--rate",
    "5",
    "--prompt",
    "uniform:10,200",
    "--output",
    "geometric:20",
]


def test_simulate_writes_outputs_and_plots(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["simulate", *SMALL, "--out", str(out), "--steps", "--quiet"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "summary.json",
        "config.json",
        "requests.csv",
        "timeseries.csv",
        "steps.csv",
        "itl_histogram.csv",
        "load_histogram.csv",
        "batch_histogram.csv",
    } <= names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 300
    config = json.loads((out / "config.json").read_text())
    assert config["policy"] == "sarathi" and config["workload"]["num_requests"] == 300
    with open(out / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "step",
        "start_s",
        "duration_s",
        "prefill_tokens",
        "decode_tokens",
        "batch_size",
        "entries",
    ]
    assert len(rows) == summary["steps"]
    for row in rows[:50]:
        toks = 0
        for e in row["entries"].split():
            rid, work = e.split(":")
            toks += 1 if work == "d" else int(work[1:])
        assert toks == int(row["prefill_tokens"]) + int(row["decode_tokens"]) <= 256
    with open(out / "requests.csv") as f:
        reqs = list(csv.DictReader(f))
    assert len(reqs) == 300 and all(r["finished"] == "1" for r in reqs)
    assert main(["plot", str(out)]) == 0
    for png in ("queue.png", "ttft_cdf.png", "itl_cdf.png", "token_load.png"):
        assert (out / png).stat().st_size > 1000


def test_simulate_json_and_config_file(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "policy: orca\nb_max: 128\ncost_model: paper\nworkload:\n  arrival: poisson\n"
        "  rate: 3\n  prompt: const:50\n  output: const:10\n  num_requests: 100\n"
    )
    assert main(["simulate", "--config", str(cfg), "--out", "", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == 100 and summary["total_output_tokens"] == 1000
    # flags override the file
    assert main(["simulate", "--config", str(cfg), "--out", "", "--json", "--num-requests", "40"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 40


def test_a_flag_beside_a_config_replaces_the_options_whole_value(tmp_path):
    """README: `--slo`/`--admission-option` beside `--config` replace the file's map, keys
    and all (as a keyword of `llmsched.simulate` does)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "cost_model: paper\nadmission: twp\nadmission_options: {alpha: 0.3}\nslo: {ttft_ms: 500}\n"
        "workload: {rate: 3, prompt: 'const:50', output: 'const:10', num_requests: 20}\n"
    )
    out = tmp_path / "o"
    args = ["simulate", "--config", str(cfg), "--out", str(out), "--admission-option", "beta=0.4"]
    assert main([*args, "--slo", "tpot_ms=50"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert written["admission_options"] == {"beta": 0.4} and written["slo"] == {"tpot_ms": 50}
    assert main(["simulate", "--config", str(cfg), "--out", str(out)]) == 0  # without flags: the file's
    written = json.loads((out / "config.json").read_text())
    assert written["admission_options"] == {"alpha": 0.3} and written["slo"] == {"ttft_ms": 500}


BAD = [
    (["--policy", "nope"], "unknown batch policy 'nope'"),
    (["--admission", "nope"], "unknown admission policy"),
    (["--rate", "0"], "rate"),
    (["--rate", "-3"], "rate"),
    (["--b-max", "0"], "--b-max/--max-num-batched-tokens: expected a positive integer"),
    (["--k-max", "-1"], "--k-max: expected a positive integer"),
    (["--kv-capacity", "0"], "--kv-capacity: expected a positive integer"),
    (["--max-running", "0"], "--max-running/--max-num-seqs: expected a positive integer"),
    (["--b-max", "abc"], "expected a positive integer, or one with a suffix (32k = 32,000, 32K = 32,768), got 'abc'"),
    (["--b-max", "100000000000000000000"], "b_max must be at most 1,048,576 tokens per step"),
    (["--cost-model", "warp"], "unknown cost model"),
    (["--trace", "/no/such/trace.csv"], "does not exist"),
    (["--prompt", "zipf:3"], "unknown length law"),
    (["--kv-capacity", "50"], "can never complete"),
    (["--unknown-flag"], "unrecognized arguments"),
    (["--config", "/no/such.yaml"], "does not exist"),
    (["--sample-interval", "1e-10"], "at least 1 microsecond"),
    (["--cost-model", "paper:c=nan"], "finite"),
    (["--prompt", "const:1e30"], "at most"),
    (["--prompt", "0"], "must be >= 1"),
    (["--rate", "1e-12"], "arrival times must be"),
    (["--steps", "--out", ""], "give --out"),
    # values no clock holds: a crash, a silent run of no completed request, or a hang
    (["--arrival", "gamma", "--cv", "1e-300"], "cv (coefficient of variation) must be between 0.001 and 1000"),
    (["--arrival", "deterministic", "--rate", "1e-300"], "arrival times must be below 1e+09 s"),
    (["--rate", "1e-320"], "arrival times must be below 1e+09 s"),
    (["--cost-model", "const:1e300"], "const cost model times must be at most 1e+06 ms"),
    (["--cost-model", "paper:a=1e300"], "paper cost model times must be at most 1e+06 ms"),
    (["--cost-model", "linear:c=1e300,a=1"], "linear cost model times must be at most 1e+06 ms"),
    (["--cost-model", "paper:c=0,a=0"], "one-token step at 0 ms"),
    (["--cost-model", "const:1e-300"], "one-token step at 1e-300 ms"),
    (["--replicas", "1000000000000000000000000000000"], "replicas must be at most 4,096"),
    (["--turns", "geometric:3", "--think-time", "1e30"], "think_time_s must be at most 1e+09"),
    (["--duration", "1e9", "--num-requests", "1000000000000"], "requests, over the limit of 20,000,000"),
    (["--k-max", "1000000000000000000000000000000"], "--k-max: expected a positive integer of at most 1,048,576"),
    (["--max-running", "10000000000"], "--max-num-seqs: expected a positive integer of at most 1,048,576"),
    (["--kv-capacity", "1000000000000000000000000000000"], "--kv-capacity: expected a positive integer of at most"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_bad_input_is_one_line_exit_2(tmp_path, extra, message):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "llmsched.cli", "simulate", *SMALL, "--out", str(out), *extra]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(
    "line",
    [
        "b_max: true",
        "max_time_s: true",
        "fast: 'false'",
        "verdict: no_please",
        "record_steps: 'no'",
        "admission: 5",
        "policy_options: 5",
        "admission_options: [1]",
        "k_max: 2.5",
    ],
)
def test_config_values_of_the_wrong_type(tmp_path, line):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cost_model: paper\n{line}\nworkload:\n  rate: 5\n  prompt: const:10\n  output: const:5\n  num_requests: 20\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "llmsched.cli", "simulate", "--config", str(cfg), "--out", ""],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert line.split(":")[0] in proc.stderr


def test_malformed_trace_and_config(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,abc,5\n")
    yaml = tmp_path / "bad.yaml"
    yaml.write_text("policy: [unclosed\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("polcy: sarathi\n")
    # a run's config.json describes its scheduler in `scheduler`; a user's file has no such option
    nested = tmp_path / "nested.yaml"
    nested.write_text("scheduler:\n  policy: orca\n")
    for extra in (
        ["--trace", str(bad)],
        ["--config", str(yaml)],
        ["--config", str(unknown)],
        ["--config", str(nested)],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "llmsched.cli", "simulate", "--out", "", "--cost-model", "paper", *extra],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_schedulers_lists_every_policy(capsys):
    assert main(["schedulers"]) == 0
    out = capsys.readouterr().out
    for name in ("fastertransformer", "vllm", "orca", "sarathi", "kfcfs", "fcfs", "spf"):
        assert name in out
    # the title names the command that prints it (it said `llmsched policies`, no command)
    from llmsched.cli import build_parser

    title = out.strip().splitlines()[0].split()
    assert title == ["llmsched", "schedulers"] and title[1] in _commands(build_parser())


def test_help_everywhere():
    for cmd in ([], ["simulate"], ["schedulers"], ["plot"]):
        proc = subprocess.run([sys.executable, "-m", "llmsched.cli", *cmd, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "usage:" in proc.stdout


def _commands(parser) -> set[str]:
    return set(parser._subparsers._group_actions[0].choices)


def test_a_command_parser_holds_its_module_commands_only():
    from llmsched.cli import COMMAND_MODULES, build_parser

    every = _commands(build_parser())
    assert every == {c for m in COMMAND_MODULES for c in m.COMMANDS}
    for module in COMMAND_MODULES:
        for command in module.COMMANDS:
            assert _commands(build_parser(command)) == set(module.COMMANDS)
    for other in (None, "--help", "--version", "simulat"):
        assert _commands(build_parser(other)) == every


def test_a_command_parses_alike_alone_and_among_all():
    from llmsched.cli import build_parser

    argv = ["simulate", "--policy", "orca", "--b-max", "256", "--slo", "ttft_ms=500", "--no-progress"]
    alone, full = build_parser("simulate").parse_args(argv), build_parser().parse_args(argv)
    assert vars(alone) == vars(full) and alone.policy == "orca" and alone.request_slo == ["ttft_ms=500"]


def test_a_typo_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulat"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'simulat'" in err and "'serve'" in err and "'capacity'" in err


def test_simulate_loads_numpy_with_one_blas_thread():
    # OpenBLAS starts its threads as numpy loads; the process's threads show it (Linux)
    code = (
        "import os; from llmsched.cli.simulate import import_numpy_with_one_blas_thread as f; f(); "
        "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    from llmsched.cli.simulate import BLAS_THREAD_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}

    def run(**extra):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert run() == ["1", "None"]  # one thread, and the environment as it was
    assert run(OPENBLAS_NUM_THREADS="2") == ["2", "2"]  # the user's own count stands


def test_simulate_imports_with_the_collector_paused_then_on():
    code = (
        "import gc, sys; from llmsched.cli.simulate import import_simulator; import_simulator(); "
        "print(gc.isenabled(), gc.get_freeze_count() > 10_000, 'llmsched.api' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True"]


@pytest.mark.parametrize("columns", ["50", "100", "", "junk"])
def test_help_is_laid_out_as_argparse_does(monkeypatch, columns):
    import argparse

    from llmsched.cli import build_parser

    monkeypatch.setenv("COLUMNS", columns)
    ours = build_parser("simulate")._subparsers._group_actions[0].choices["simulate"]
    assert ours.formatter_class is not argparse.HelpFormatter
    text = ours.format_help()
    ours.formatter_class = argparse.HelpFormatter
    assert text == ours.format_help()


def test_a_simulate_run_imports_no_shutil(tmp_path):
    code = (
        "import sys; from llmsched.cli import main; "
        "main(['simulate', '--num-requests', '20', '--quiet', '--out', sys.argv[1]]); print('shutil' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


def test_plot_on_missing_folder_is_an_error(tmp_path):
    assert main(["plot", str(tmp_path / "nothing")]) == 2


def test_plot_on_a_damaged_folder_is_one_line_and_redraws_nothing(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    assert main(["simulate", *SMALL, "--quiet", "--out", str(run)]) == 0
    text = (run / "timeseries.csv").read_text()
    damages = {
        "requests.csv": (run / "requests.csv").read_text()[:700],  # cut mid-row
        "timeseries.csv": "\n".join(",".join(line.split(",")[:3]) for line in text.splitlines()),  # columns lost
        "itl_histogram.csv": "itl_ms,count\nfast,3\n",  # not numbers
    }
    for i, (name, content) in enumerate(damages.items()):
        bad = tmp_path / f"bad{i}"
        shutil.copytree(run, bad)
        (bad / name).write_text(content)
        capsys.readouterr()
        assert main(["plot", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and name in err
        assert not list(bad.glob("*.png"))  # checked before drawing: no figure half redrawn
    odd = tmp_path / "odd-config"
    shutil.copytree(run, odd)
    for config in ("[1, 2]", '{"workload": {"rate": "x", "num_requests": "many"}}'):
        (odd / "config.json").write_text(config)
        assert main(["plot", str(odd)]) == 0  # a title without the run's details, not a traceback
    platform = tmp_path / "platform"  # what `simulate --serverless --out` writes
    platform.mkdir()
    for name in ("summary.json", "config.json", "requests.csv", "instances.csv"):
        (platform / name).write_text("x\n")
    capsys.readouterr()
    assert main(["plot", str(platform)]) == 2
    assert "serverless platform's run" in capsys.readouterr().err


def test_flag_caps_are_the_network_caps():
    from llmsched.cli import common
    from llmsched.workload import network

    assert common.MAX_REQUESTS_PER_STEP == network.MAX_REQUESTS_PER_STEP
    assert common.MAX_KV_TOKENS == network.MAX_KV_TOKENS


@pytest.mark.parametrize(
    "extra, line",
    [
        (["--prompt", "geometric:0"], "--prompt: geometric mean must be > 0, got '0'"),
        (["--output", "geometric:-1"], "--output: geometric mean must be > 0, got '-1'"),
        (["--turns", "geometric:0", "--think-time", "1"], "--turns: geometric mean must be > 0, got '0'"),
        (["--prompt", "uniform:9,2"], "--prompt: uniform:9,2 needs lo <= hi"),
        (["--replicas", "2", "--output", "const:0"], "--output: const length must be >= 1, got '0'"),
    ],
)
def test_a_bad_length_law_names_its_flag(capsys, extra, line):
    """The law's error said only "geometric mean must be > 0", not which option held it."""
    from helpers import one_line_error

    err = one_line_error(capsys, ["simulate", "--cost-model", "paper", "--num-requests", "5", "--out", "", *extra])
    assert err.endswith(f"error: {line}"), err


@pytest.mark.parametrize(
    "workload, line",
    [
        ("  turns: geometric:0\n  think_time_s: 1\n", "turns: geometric mean must be > 0, got '0'"),
        ("  output: geometric:-1\n", "output: geometric mean must be > 0, got '-1'"),
        ("  classes:\n    - {tag: a, prompt: 'const:0'}\n", "prompt of class 'a': const length must be >= 1, got '0'"),
    ],
)
def test_a_bad_length_law_in_a_config_names_its_key(tmp_path, capsys, workload, line):
    from helpers import one_line_error

    cfg = tmp_path / "run.yaml"
    cfg.write_text("cost_model: paper\nworkload:\n  num_requests: 5\n" + workload)
    err = one_line_error(capsys, ["simulate", "--config", str(cfg), "--out", ""])
    assert err.endswith(f"error: {line}"), err
    # a flag that replaces the file's law is named as the flag
    if "turns" in line:
        err = one_line_error(capsys, ["simulate", "--config", str(cfg), "--turns", "const:0", "--out", ""])
        assert err.endswith("error: --turns: const length must be >= 1, got '0'"), err


def test_a_bad_length_law_from_python_names_its_key():
    import llmsched
    from llmsched.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^prompt: geometric mean must be > 0, got '0'$"):
        llmsched.simulate(cost_model="paper", prompt="geometric:0", num_requests=5)


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags_print_the_version(flag, capsys):
    from llmsched.core.version import __version__

    with pytest.raises(SystemExit) as e:
        main([flag])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"llmsched {__version__}"
