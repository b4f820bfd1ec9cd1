"""The engine subcommands: argparse wiring, outputs, one-line errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from helpers import dump_half_then_interrupt, one_line_error

from llmsched.cli import build_parser as _parser
from llmsched.cli import main
from llmsched.core.errors import ConfigError


@pytest.mark.parametrize("cmd", ["generate", "make-tiny-model", "profile", "validate"])
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args([cmd, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_make_tiny_model_help_shows_every_default(capsys):
    """--hidden-size, --layers, --heads, --kv-heads, --intermediate-size,
    --max-position-embeddings and --arch had no help, so the help showed no default."""
    with pytest.raises(SystemExit):
        _parser().parse_args(["make-tiny-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [
        ("--arch", "llama"),
        ("--vocab-size", 512),
        ("--hidden-size", 128),
        ("--layers", 4),
        ("--heads", 4),
        ("--kv-heads", 2),
        ("--intermediate-size", 384),
        ("--max-position-embeddings", 4096),
        ("--seed", 0),
    ]:
        after = text.split(f" {flag} ", 1)[1].split(" --", 1)[0]  # its line of the options list
        assert f"(default: {default})" in after, (flag, after)
    assert "(default: False)" not in text


def test_make_tiny_model_and_generate(tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        main(
            [
                "make-tiny-model",
                str(out),
                "--layers",
                "1",
                "--hidden-size",
                "32",
                "--heads",
                "2",
                "--kv-heads",
                "1",
                "--intermediate-size",
                "64",
                "--arch",
                "qwen2",
            ]
        )
        == 0
    )
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "--model",
                str(out),
                "--prompt",
                "Hello",
                "--prompt-ids",
                "1,5,9",
                "--max-tokens",
                "4",
                "--json",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and all(1 <= len(x["token_ids"]) <= 4 for x in lines)
    assert lines[0]["finish_reason"] in ("length", "stop")
    # stop_reason too (Completion carries it): the stop token id that ended it
    first = lines[1]["token_ids"][0]
    argv = ["generate", "--model", str(out), "--prompt-ids", "1,5,9", "--max-tokens", "4", "--json"]
    assert main([*argv, "--temperature", "0", "--stop-token-id", str(first), "--threads", "1"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["finish_reason"] == "stop" and line["stop_reason"] == first and line["token_ids"] == [first]
    args = _parser().parse_args(
        ["generate", "--model", str(out), "--prompt", "Hi", "--max-tokens", "3", "--temperature", "0.7", "--seed", "3"]
    )
    assert args.func(args) == 0
    assert "finish_reason" in capsys.readouterr().out


def test_errors_exit_2(tmp_path, capsys, tiny_model):
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "error: model folder" in err and err.count("\n") == 1
    assert main(["generate", "--model", str(tiny_model), "--prompt", "x", "--top-p", "0"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["generate", "--model", str(tiny_model)]) == 2
    args = _parser().parse_args(["generate", "--model", str(tiny_model), "--prompt-ids", "1,x"])
    with pytest.raises(ConfigError):
        args.func(args)


def test_profile_and_validate_commands(tmp_path, tiny_model, capsys, monkeypatch):
    import llmsched.engine.profiler as prof

    monkeypatch.setattr(
        prof,
        "CPU_GRID",
        dict(tokens=[1, 16], batches=[1, 2], contexts=[16], chunks=[16], chunk_contexts=[0], lm_tokens=[1, 2]),
    )
    out = tmp_path / "p.csv"
    assert (
        main(
            [
                "profile",
                "--model",
                str(tiny_model),
                "--out",
                str(out),
                "--reps",
                "1",
                "--warmup",
                "0",
                "--quiet",
                "--max-num-seqs",
                "4",
                "--max-model-len",
                "128",
                "--tables-s",
                "0",
                "--calibrate-s",
                "0.5",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "profile:" in text and "calibrated on" in text and out.is_file()
    assert (
        main(
            [
                "profile",
                "--model",
                str(tiny_model),
                "--out",
                str(out),
                "--reps",
                "1",
                "--warmup",
                "0",
                "--quiet",
                "--max-num-seqs",
                "4",
                "--max-model-len",
                "128",
                "--tables-s",
                "0",
                "--calibrate-s",
                "0",
                "--equal-contexts",
            ]
        )
        == 0
    )
    assert "calibrated on" not in capsys.readouterr().out
    assert main(["profile", "--model", str(tiny_model), "--out", str(out), "--calibrate-s", "-1"]) == 2
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,12,4\n0.005,20,3\n")
    js = tmp_path / "v.json"
    assert (
        main(
            [
                "validate",
                "--model",
                str(tiny_model),
                "--trace",
                str(trace),
                "--profile",
                str(out),
                "--policies",
                "sarathi,vllm",
                "--json",
                str(js),
                "--quiet",
                "--max-num-seqs",
                "4",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "sarathi" in text and "ttft" in text
    res = json.loads(js.read_text())
    assert set(res["policies"]) == {"sarathi", "vllm"}


def test_validate_measures_a_profile_and_leaves_nothing_behind(tiny_model, tmp_path, capsys, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,12,4\n0.005,20,3\n")
    monkeypatch.chdir(tmp_path)
    argv = ["validate", "--model", str(tiny_model), "--trace", str(trace), "--policy", "orca", "--json", "-"]
    argv += ["--quiet", "--reps", "1", "--tables-s", "0", "--calibrate-s", "0", "--max-num-seqs", "4"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["policies"]) == {"orca"}  # --policy names the one to validate
    assert res["cost_model"].startswith("profile measured by this run")
    assert list(scratch.iterdir()) == []  # the measured profile is not left in the temp folder
    assert not (tmp_path / "-").exists()  # `--json -` prints, it writes no file named "-"


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["generate", "--model", "m", "--prompt", "x"], None),
        (["profile", "--model", "m", "--out", "p.csv"], 2048),
    ],
)
def test_max_model_len_default_is_what_help_says(argv, expect, capsys):
    """The CPU default of --max-model-len that --help states is the one the command uses."""
    from llmsched.cli.engine import engine_setup

    with pytest.raises(SystemExit):
        _parser().parse_args([argv[0], "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = text[text.index("--max-model-len MAX_MODEL_LEN longest") :].split(")")[0]
    opts = engine_setup(_parser().parse_args(argv))
    assert opts["max_model_len"] == expect
    if expect is None:  # the engine then takes the model's max_position_embeddings
        assert said.endswith("(default: the model's max_position_embeddings") and "CPU" not in said
    else:
        assert f"default: {expect} on CPU" in said
    cuda = engine_setup(_parser().parse_args([*argv, "--device", "cuda"]))
    assert cuda["max_model_len"] is None


@pytest.mark.parametrize("longest, expect", [(100, 2048), (3000, 3000), (9000, 4096)])
def test_validate_max_model_len_default_is_what_help_says(longest, expect, capsys, monkeypatch):
    """validate's CPU default comes from the trace (2048 to 4096): its help said 2048."""
    import numpy as np

    import llmsched.engine.engine as engine_module
    from llmsched.analysis.validate import validate

    with pytest.raises(SystemExit):
        _parser().parse_args(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = text[text.index("--max-model-len MAX_MODEL_LEN longest") :].split(")")[0]
    assert "default: the trace's longest prompt + output, at least 2048 and at most 4096 on CPU" in said
    assert said.endswith("the model's max_position_embeddings on CUDA")

    class Chosen(Exception):
        pass

    def engine(model, **kwargs):
        raise Chosen(kwargs["max_model_len"])

    monkeypatch.setattr(engine_module, "LLMEngine", engine)
    trace = SimpleNamespace(arrival_s=np.array([0.0, 1.0]), prompt=np.array([10, longest - 5]), output=np.array([5, 5]))
    with pytest.raises(Chosen) as e:
        validate("m", trace, ["sarathi"])
    assert e.value.args[0] == expect


def test_generate_seed_help_states_the_range_it_takes(capsys):
    """--seed said (>= 0); 2**63 and above were refused after the model had loaded."""
    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "--help"])
    assert "per-request sampling seed (0 to 2**63 - 1;" in " ".join(capsys.readouterr().out.split())
    assert _parser().parse_args(["generate", "--model", "m", "--seed", str(2**63 - 1)]).seed == 2**63 - 1
    with pytest.raises(SystemExit) as e:  # (argparse: before the model loads)
        _parser().parse_args(["generate", "--model", "m", "--seed", str(2**63)])
    assert e.value.code == 2
    assert "--seed: expected an integer from 0 to 2**63 - 1" in capsys.readouterr().err


TINY_ARGS = ["--layers", "1", "--hidden-size", "16", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "32"]


def test_make_tiny_model_refuses_a_folder_with_files(tmp_path, capsys):
    """A folder that holds files (a real model, say) is not overwritten without --force."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("mine")
    assert main(["make-tiny-model", str(folder), *TINY_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err and "--force" in err
    assert (folder / "config.json").read_text() == "mine"
    assert not (folder / "model.safetensors").exists()
    assert main(["make-tiny-model", str(folder), *TINY_ARGS, "--force"]) == 0
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 16
    # an empty folder (e.g. made by mktemp) is fine
    (tmp_path / "empty").mkdir()
    assert main(["make-tiny-model", str(tmp_path / "empty"), *TINY_ARGS]) == 0


def test_make_tiny_model_refuses_a_seed_above_64_bits(tmp_path, capsys):
    """torch's generator takes at most 2**64 - 1: a larger seed was a ValueError traceback."""
    assert main(["make-tiny-model", str(tmp_path / "m"), *TINY_ARGS, "--seed", str(2**64)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed must be an integer from 0 to 2**64 - 1" in err
    assert not (tmp_path / "m").exists()
    assert main(["make-tiny-model", str(tmp_path / "m"), *TINY_ARGS, "--seed", str(2**64 - 1)]) == 0


def test_make_tiny_model_files_get_the_umask_mode(tmp_path):
    """model.safetensors is as readable as the other files (safetensors writes 0600)."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert main(["make-tiny-model", str(tmp_path / "m"), *TINY_ARGS]) == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o644, modes


@pytest.mark.parametrize("stop, words", [("", "non-empty"), ("x" * 257, "256 characters")])
def test_generate_refuses_an_empty_or_overlong_stop_string(capsys, stop, words):
    """Refused before the model is loaded (the folder does not even exist)."""
    assert main(["generate", "--model", "/no/such/model", "--prompt", "x", "--stop", "a", "--stop", stop]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stop" in err and words in err, err


def test_max_model_len_beyond_the_models_positions_is_refused(tiny_model, capsys):
    """A --max-model-len the model's positions do not cover is one line naming both
    numbers (vLLM refuses it too), for generate and serve."""
    argv = ["generate", "--model", str(tiny_model), "--prompt", "x", "--max-tokens", "1", "--max-model-len", "8192"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "8192" in err and "4096" in err and "--max-model-len" in err, err
    argv = ["serve", "--model", str(tiny_model), "--max-model-len", "8192", "--port", "0", "--num-blocks", "64"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "8192" in err and "4096" in err, err


def test_a_default_max_model_len_is_lowered_to_the_models(tmp_path):
    """The CPU default of profile and validate (2048) on a model of 512 positions: the
    model's 512, not an error; the same number given by the user is refused."""
    from llmsched.core.engine_api import DefaultMaxModelLen
    from llmsched.engine import LLMEngine
    from llmsched.engine.tiny import make_tiny_model

    small = make_tiny_model(
        tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, max_position_embeddings=512
    )
    eng = LLMEngine(small, max_model_len=DefaultMaxModelLen(2048), max_num_seqs=2, num_blocks=16)
    assert eng.max_model_len == 512 and type(eng.max_model_len) is int
    assert LLMEngine(small, max_num_seqs=2, num_blocks=16).max_model_len == 512
    with pytest.raises(ConfigError, match="2048 is more than the model's longest sequence, 512"):
        LLMEngine(small, max_model_len=2048, max_num_seqs=2, num_blocks=16)
    from llmsched.cli.engine import engine_setup

    args = _parser().parse_args(["profile", "--model", str(small), "--out", str(tmp_path / "p.csv")])
    assert LLMEngine(small, **{**engine_setup(args), "kv_cache_gb": None, "num_threads": 1}).max_model_len == 512


def test_max_model_len_auto_is_the_longest_the_kv_cache_holds(tmp_path, capsys):
    """vLLM's --max-model-len auto (or -1): the longest sequence the KV cache holds (its
    tokens plus the last one, which takes no slot), at most the model's positions; it was
    refused as no positive integer."""
    from llmsched.engine import LLMEngine
    from llmsched.engine.tiny import make_tiny_model
    from llmsched.server.backends import SchedulerOptions, make_sim_backend

    small = make_tiny_model(
        tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, max_position_embeddings=512
    )
    for auto in ("auto", -1):
        # 10 blocks of 16 tokens, one held back per running sequence: 128 tokens
        eng = LLMEngine(small, max_model_len=auto, max_num_seqs=2, num_blocks=10)
        assert (eng.kv_capacity, eng.max_model_len, eng.runner.max_model_len) == (128, 129, 129)
        assert LLMEngine(small, max_model_len=auto, max_num_seqs=2, num_blocks=100).max_model_len == 512
    for text in ("auto", "-1", " AUTO "):
        args = _parser().parse_args(["serve", "--model", str(small), "--max-model-len", text])
        assert args.max_model_len == "auto"
    assert make_sim_backend(SchedulerOptions(kv_capacity=300), max_model_len="auto").max_model_len == 301
    argv = ["generate", "--model", str(small), "--prompt", "x", "--max-tokens", "1", "--max-model-len", "-2"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "or auto (-1)" in capsys.readouterr().err


@pytest.mark.parametrize("ids", ["1,,2", "1,2,", ",1", "1, ,2", "1,x"])
def test_generate_refuses_prompt_ids_with_an_empty_or_bad_element(capsys, ids):
    """'1,,2' is a typo, not the prompt [1, 2]; refused before the model is loaded."""
    assert main(["generate", "--model", "/no/such/model", "--prompt-ids", ids]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--prompt-ids" in err and repr(ids) in err, err


def test_parse_prompt_ids():
    from llmsched.cli.engine import parse_prompt_ids

    assert parse_prompt_ids("1,5,9") == parse_prompt_ids(" 1, 5 ,9 ") == parse_prompt_ids("1 5 9") == [1, 5, 9]


@pytest.mark.parametrize("option", ["--calibrate-s", "--tables-s"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_profile_and_validate_refuse_non_finite_seconds(tmp_path, capsys, option, value):
    """--calibrate-s nan ran with no calibration, silently; inf never ends."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    for argv in (
        ["profile", "--model", "/no/such/model", "--out", str(tmp_path / "p.csv")],
        ["validate", "--model", "/no/such/model", "--trace", str(trace)],
    ):
        assert main([*argv, f"{option}={value}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{option} must be a finite number >= 0" in err, err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--max-model-len", "8"], "over max_model_len 8: raise --max-model-len to at least 16"),
        (
            ["--kv-cache-gb", "0.000005", "--block-size", "4", "--max-running", "1", "--b-max", "8"],
            "needs 16 tokens of KV cache, over the 8 there are: raise --kv-cache-gb",
        ),
        # a decode_attn table of one batch size, which `--cost-model profile:PATH` refuses
        (["--max-running", "1"], "grid (1) fits this engine (max_num_seqs 1); a profile needs two: raise --max-r"),
        # a decode batch is a step of as many tokens: b_max 1 caps it at 1 too
        (["--b-max", "1"], "fits this engine (b_max 1); a profile needs two: raise --b-max"),
        (
            ["--kv-cache-gb", "0.00002", "--block-size", "4", "--max-running", "2"],
            "(its KV cache of 40 tokens: a batch of 2 needs 48); a profile needs two: raise --kv-cache-gb",
        ),
    ],
)
def test_profile_refuses_an_engine_too_small_for_its_grid(tiny_model, tmp_path, capsys, extra, message):
    # the grid's smallest decode context and chunk are 16: it wrote a profile of linear and
    # LM-head rows only, which `--cost-model profile:PATH` then refused
    out = tmp_path / "p.csv"
    argv = ["profile", "--model", str(tiny_model), "--out", str(out), "--tables-s", "0", "--calibrate-s", "0"]
    assert main([*argv, "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_profile_names_the_flag_that_sized_the_kv_cache_on_cuda():
    """a KV cache too small for the grid asked for --kv-cache-gb, which CUDA does not use."""
    from types import SimpleNamespace

    from llmsched.engine import profiler

    knob = ("gpu_memory_utilization", "--gpu-memory-utilization")  # ModelRunner's on CUDA
    r = SimpleNamespace(
        max_num_seqs=4, b_max=512, block_size=4, num_blocks=2, workspace_tokens=1 << 18, max_model_len=2048
    )
    r.kv_size_knob = knob
    g = {"batches": [1, 2], "contexts": [16], "chunks": [16], "chunk_contexts": [0]}
    with pytest.raises(ConfigError, match="over the 8 there are: raise --gpu-memory-utilization$"):
        profiler._check_grid_fits(r, g, [], [(16, 0)], 16)
    with pytest.raises(ConfigError, match="a batch of 2 needs 32\\); a profile needs two: raise --gpu-memory-util"):
        profiler._check_two_decode_batches(r, [(1, 16)], [1, 2], lambda b: (16, 16 * b))


def test_profile_names_a_negative_warmup_alone(tiny_model, tmp_path, capsys):
    """--warmup -1 was told 'reps must be >= 1 and warmup >= 0', --reps it had not given;
    then 'warmup must be >= 0', without the `--` other flags' errors have."""
    out = tmp_path / "p.csv"
    for bad in ("-1", "x"):
        argv = ["profile", "--model", str(tiny_model), "--out", str(out), "--quiet", "--warmup", bad]
        err = one_line_error(capsys, argv, "--warmup")
        assert err == f"llmsched profile: error: argument --warmup: expected an integer >= 0, got '{bad}'"
    assert not out.exists()


def test_profile_b_max_sets_the_measured_loads(tiny_model, tmp_path, capsys, monkeypatch):
    """`--b-max` did not change the grid: a profile for --b-max 64 stopped where the grid
    did (16 here), and a simulation at that budget extrapolated."""
    import csv

    import llmsched.engine.profiler as prof

    grid = dict(tokens=[1, 16], batches=[1, 2], contexts=[16], chunks=[16], chunk_contexts=[0], lm_tokens=[1, 2])
    monkeypatch.setattr(prof, "CPU_GRID", grid)
    out = tmp_path / "p.csv"
    argv = ["profile", "--model", str(tiny_model), "--out", str(out), "--quiet", "--reps", "1", "--warmup", "0"]
    argv += ["--tables-s", "0", "--calibrate-s", "0", "--max-num-seqs", "64", "--max-model-len", "128"]
    assert main([*argv, "--b-max", "64"]) == 0
    capsys.readouterr()
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    for table, column in (("linear", "tokens"), ("lm_head", "tokens"), ("prefill_attn", "chunk")):
        sizes = {int(r[column]) for r in rows if r["table"] == table}
        assert max(sizes) == 64 and {16, 32} <= sizes, (table, sorted(sizes))


def test_a_profile_out_path_ending_in_a_slash_is_a_folder(tmp_path):
    """`--out DIR/` for a folder not made yet wrote a file named DIR; it is a folder
    holding profile.csv, as an existing folder is."""
    from llmsched.engine.profiler import write_profile

    path = write_profile([], str(tmp_path / "new") + "/")
    assert path == tmp_path / "new" / "profile.csv" and path.is_file()
    assert write_profile([], tmp_path / "plain.csv") == tmp_path / "plain.csv"


def _one_line_error(capsys, argv, words):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--policy", "nonexist"], "--policy"),
        (["--policy", "sarathi"], "--policy"),
        (["--admission", "nonexist"], "--admission"),
        (["--admission-option", "a=1"], "--admission-option"),
        (["--k-max", "7"], "--k-max"),
        (["--prefix-caching"], "--prefix-caching"),
    ],
)
def test_profile_refuses_the_scheduler_options_it_does_not_use(tmp_path, capsys, extra, flag):
    """profile measured with any of these and exit 0: it never reads them."""
    argv = ["profile", "--model", "/no/such/model", "--out", str(tmp_path / "p.csv"), *extra]
    _one_line_error(capsys, argv, f"{flag} is a scheduler option")
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize(
    "cmd, absent, present",
    [
        (
            "profile",
            ["--policy", "--scheduler", "--admission", "--admission-opt", "--k-max", "--kv-capacity"]
            + ["--prefix-caching"],
            ["--b-max", "--max-running", "--kv-cache-gb"],
        ),
        ("generate", ["--kv-capacity"], ["--policy", "--k-max", "--b-max", "--kv-cache-gb"]),
        (
            "validate",
            ["--kv-capacity", "--admission", "--admission-option", "--admission-opt", "--prefix-caching"],
            ["--policy", "--k-max", "--b-max", "--kv-cache-gb"],
        ),
    ],
)
def test_help_lists_no_option_the_command_refuses(capsys, cmd, absent, present):
    """profile --help listed --policy, --admission(-option), --k-max, --kv-capacity and
    --prefix-caching, which it refuses; generate and validate listed --kv-capacity, which
    the engine refuses, and validate --admission(-option) and --prefix-caching, which it
    refuses. Still parsed: the refusal names them (tests above)."""
    with pytest.raises(SystemExit):
        _parser().parse_args([cmd, "--help"])
    words = set(capsys.readouterr().out.replace(",", " ").replace("[", " ").replace("]", " ").split())
    assert not words & set(absent) and set(present) <= words


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--admission", "spf"], "--admission does not apply"),
        (["--admission-option", "a=1"], "--admission-option does not apply"),
        (["--prefix-caching"], "--prefix-caching does not apply"),
    ],
)
def test_validate_names_the_refused_scheduler_option_given(tmp_path, capsys, extra, flag):
    """--admission-option alone was refused as '--admission does not apply'."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    argv = ["validate", "--model", "/no/such/model", "--trace", str(trace), "--profile", "const:1", *extra]
    _one_line_error(capsys, argv, flag)


@pytest.mark.parametrize("extra", [["--reps", "5"], ["--tables-s", "5"], ["--calibrate-s", "5"]])
def test_validate_refuses_measurement_options_with_a_profile(tmp_path, capsys, extra):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    argv = ["validate", "--model", "/no/such/model", "--trace", str(trace), "--profile", "paper", *extra]
    _one_line_error(capsys, argv, f"{extra[0]} sets the profile measurement; with --profile nothing is measured")


def test_validate_refuses_an_empty_json_path(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    _one_line_error(
        capsys, ["validate", "--model", "/no/such/model", "--trace", str(trace), "--json", ""], "--json needs a file"
    )


def test_validate_names_a_profile_path_that_does_not_exist(tmp_path, tiny_model, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    argv = ["validate", "--model", str(tiny_model), "--trace", str(trace), "--quiet"]
    _one_line_error(capsys, [*argv, "--profile", str(tmp_path / "nonexist")], "nor an existing file or folder")


@pytest.mark.parametrize("cmd", ["generate", "profile", "validate", "serve"])
@pytest.mark.parametrize("value", ["7", "nan", "-1", "0", "x"])
def test_gpu_memory_utilization_is_a_fraction_on_every_device(tmp_path, capsys, cmd, value):
    """it was checked on CUDA only: 7 ran on CPU."""
    argv = {
        "generate": ["generate", "--model", "/no/such/model", "--prompt", "x"],
        "profile": ["profile", "--model", "/no/such/model", "--out", str(tmp_path / "p.csv")],
        "validate": ["validate", "--model", "/no/such/model", "--trace", str(tmp_path / "t.csv")],
        "serve": ["serve", "--model", "/no/such/model", "--port", "0"],
    }[cmd]
    _one_line_error(capsys, [*argv, "--gpu-memory-utilization", value], "expected a fraction in (0, 1]")


def test_engine_refuses_a_gpu_memory_utilization_out_of_range_on_cpu(tiny_model):
    from llmsched.engine import LLM

    for u in (7.0, float("nan"), -1.0):
        with pytest.raises(ConfigError, match="gpu_memory_utilization"):
            LLM(str(tiny_model), gpu_memory_utilization=u)
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        LLM(str(tiny_model), kv_cache_gb=-5, num_blocks=8)


def test_generate_refuses_a_stop_token_id_outside_the_vocabulary(tiny_model, capsys):
    argv = ["generate", "--model", str(tiny_model), "--prompt", "x", "--max-tokens", "2"]
    _one_line_error(capsys, [*argv, "--stop-token-id", "999999"], "stop token id 999999 is outside the vocabulary")


def test_generate_one_token_shows_no_mean_itl_not_nan(tiny_model, capsys):
    """One output token has no inter-token gap: the line said 'mean itl=nan ms'."""
    assert main(["generate", "--model", str(tiny_model), "--prompt", "x", "--max-tokens", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "mean itl=-," in line and "nan" not in line, line


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_validate_names_its_seed_range(tmp_path, capsys, seed):
    """Above 2**64 - 1 the engine refused 'seed must be an integer from -2**63 ...': no flag,
    and a range validate does not take."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    argv = ["validate", "--model", "/no/such/model", "--trace", str(trace), "--profile", "const:1", "--seed", seed]
    _one_line_error(capsys, argv, f"--seed must be an integer from 0 to 2**64 - 1, got {seed}")


def test_serve_names_the_seed_flag_it_refuses(tiny_model, capsys):
    """serve --seed 2**64 said 'seed must be ...', naming no flag."""
    argv = ["serve", "--model", str(tiny_model), "--seed", str(2**64), "--port", "0", "--num-blocks", "64"]
    _one_line_error(capsys, argv, "seed (--seed) must be an integer from -2**63 to 2**64 - 1")


@pytest.mark.parametrize("cmd", ["generate", "make-tiny-model"])
def test_a_negative_seed_is_refused(tmp_path, capsys, cmd):
    argv = {
        "generate": ["generate", "--model", "/no/such/model", "--prompt", "x"],
        "make-tiny-model": ["make-tiny-model", str(tmp_path / "m")],
    }[cmd]
    _one_line_error(capsys, [*argv, "--seed", "-1"], "--seed: expected an integer >= 0")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("size", ["10", "257", "576", "100000000"])
def test_make_tiny_model_refuses_a_vocab_size_the_tokenizer_cannot_honour(tmp_path, capsys, size):
    """10 gave 258 tokens and 10**8 gave 575, silently."""
    _one_line_error(capsys, ["make-tiny-model", str(tmp_path / "m"), "--vocab-size", size], "from 258")
    assert not (tmp_path / "m").exists()


def test_the_tiny_vocab_bounds_are_the_tokenizers():
    from llmsched.engine.tiny import MAX_VOCAB, MIN_VOCAB, train_tokenizer

    assert train_tokenizer(1).get_vocab_size() == MIN_VOCAB
    assert train_tokenizer(10**8).get_vocab_size() == MAX_VOCAB
    for v in (MIN_VOCAB, 400, MAX_VOCAB):
        assert train_tokenizer(v).get_vocab_size() == v


def test_profile_out_does_not_replace_a_file_that_is_not_a_profile(tiny_model, tmp_path, capsys):
    """`--out MODEL/config.json` wrote the profile over the model's configuration."""
    from llmsched.engine.profiler import write_profile

    before = (tiny_model / "config.json").read_text()
    argv = ["profile", "--model", str(tiny_model), "--tables-s", "0", "--calibrate-s", "0", "--quiet"]
    _one_line_error(capsys, [*argv, "--out", str(tiny_model / "config.json")], "is not a step-time profile")
    assert (tiny_model / "config.json").read_text() == before
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "profile.csv").write_text("not a profile\n")
    _one_line_error(capsys, [*argv, "--out", str(folder)], "is not a step-time profile")
    write_profile([], folder / "profile.csv")  # a profile of ours may be replaced: the check passes
    from llmsched.cli.engine import _check_replaces_a_profile

    _check_replaces_a_profile(str(folder / "profile.csv"))
    (tmp_path / "empty.csv").write_text("")  # `mktemp --suffix .csv`'s: nothing to lose
    _check_replaces_a_profile(str(tmp_path / "empty.csv"))


@pytest.mark.parametrize("folder", ["", "FILE/sub", "/proc/llmsched-test"])
def test_make_tiny_model_says_why_it_cannot_make_the_folder(tmp_path, capsys, folder):
    (tmp_path / "FILE").write_text("x")
    folder = folder.replace("FILE", str(tmp_path / "FILE"))
    _one_line_error(capsys, ["make-tiny-model", folder], "folder")


def test_an_interrupted_validate_json_keeps_the_earlier_result(tmp_path, monkeypatch, capsys):
    # --json was written in place: Ctrl-C halfway through the dump left a truncated file
    # (the earlier result lost, and a rerun refused: no longer "a validate result")
    import llmsched.analysis.validate as validate_mod

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,4,2\n")
    out = tmp_path / "v.json"
    earlier = {"model": "m", "trace_requests": 1, "policies": {}, "pad": "x" * 1000}
    out.write_text(json.dumps(earlier, indent=2))
    monkeypatch.setattr(validate_mod, "validate", lambda *a, **kw: {**earlier, "pad": "y" * 1000})

    monkeypatch.setattr(json, "dump", dump_half_then_interrupt)
    argv = ["validate", "--model", str(tmp_path), "--trace", str(trace), "--json", str(out), "--quiet"]
    assert main(argv) == 130
    monkeypatch.undo()
    assert json.loads(out.read_text()) == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "v.json"]  # no temporary file left


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_a_kv_block_larger_than_the_kv_memory_names_block_size_and_kv_cache_gb(tiny_model, capsys, cmd):
    """One block alone larger than the KV memory used to say 'no memory is left for the KV
    cache; lower max_num_seqs or b_max', which neither helps nor names the cause."""
    extra = ["--prompt", "x", "--max-tokens", "1"] if cmd == "generate" else ["--port", "0"]
    argv = [cmd, "--model", str(tiny_model), "--block-size", "65536", "--kv-cache-gb", "0.001", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "65536 tokens" in err and "--block-size" in err and "--kv-cache-gb" in err, err
    assert "max_num_seqs" not in err, err


def test_generate_binds_cost_model_to_the_policy(tiny_model, capsys, monkeypatch):
    """generate had no way to give the engine's policy a cost model (adaptive used paper)."""
    import llmsched.engine as engine_pkg

    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "5,6", "--max-tokens", "2"]
    argv += ["--scheduler", "adaptive"]
    assert main([*argv, "--cost-model", "nosuch:1"]) == 2
    assert "nosuch" in capsys.readouterr().err
    made = []
    real = engine_pkg.LLM

    def spy(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(engine_pkg, "LLM", spy)
    assert main([*argv, "--cost-model", "linear:c=2,a=0.5", "--json"]) == 0
    eng = made[0].engine
    assert type(eng.cost_model).__name__ == "LinearCostModel" and eng.scheduler.batch.cost is eng.cost_model


def test_serve_engine_backend_binds_cost_model_to_the_policy(tiny_model):
    """serve --backend engine refused --cost-model: its adaptive always planned with paper."""
    from llmsched.cli import server as server_cli

    p = _parser()
    argv = ["serve", "--model", str(tiny_model), "--scheduler", "adaptive", "--b-max", "64", "--max-running", "2"]
    backend = server_cli.build_backend(p.parse_args([*argv, "--cost-model", "linear:c=2,a=0.5"]))
    core = next(v for v in vars(backend).values() if hasattr(v, "cost_model"))
    assert type(core.cost_model).__name__ == "LinearCostModel" and core.scheduler.batch.cost is core.cost_model
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args([*argv, "--cost-model", "nosuch:1"]))


def test_generate_keeps_the_command_line_order_of_prompts(tiny_model, capsys):
    """Text and id prompts mixed: the outputs follow the command line (text prompts came
    first, then the --prompt-ids ones, whatever the order given)."""
    argv = ["generate", "--model", str(tiny_model), "--max-tokens", "1", "--threads", "1"]
    argv += ["--prompt", "a", "--prompt-ids", "5,6", "--prompt", "b"]
    assert main([*argv, "--json"]) == 0
    prompts = [json.loads(x)["prompt"] for x in capsys.readouterr().out.splitlines()]
    assert prompts == ["a", [5, 6], "b"]
    assert main(argv) == 0
    shown = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("--- prompt: ")]
    assert shown == ["--- prompt: 'a'", "--- prompt: '<2 token ids>'", "--- prompt: 'b'"]


def test_generate_refuses_text_that_is_not_utf8(tiny_model, capsys):
    """Bytes that are not UTF-8 on the command line (Python passes them as lone
    surrogates): a TypeError traceback for --prompt, a stop string that never matched."""
    argv = ["generate", "--model", str(tiny_model), "--max-tokens", "1"]
    for extra, what in ((["--prompt", "ab\udcffcd"], "prompt"), (["--prompt", "x", "--stop", "\udcff"], "stop")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and what in err and "byte 0xff" in err, err


def _loading_commands(model, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    return [
        ["generate", "--model", str(model), "--prompt", "x"],
        ["validate", "--model", str(model), "--trace", str(trace), "--quiet"],
        ["profile", "--model", str(model), "--out", str(tmp_path / "p.csv"), "--quiet"],
        ["serve", "--backend", "engine", "--model", str(model), "--port", "0"],
    ]


def test_a_config_of_more_layers_than_the_checkpoint_is_one_line_before_any_model(
    tmp_path, tiny_model, capsys, monkeypatch
):
    """num_hidden_layers 20,000 over 2 layers of weights: a meta model of 20,000 layers
    (14 s here) was built before the refusal."""
    import shutil

    from helpers import one_line_error

    from llmsched.engine.model import CausalLM

    folder = tmp_path / "deep"
    shutil.copytree(tiny_model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 20_000}))

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the checkpoint was checked")

    monkeypatch.setattr(CausalLM, "__init__", no_model)
    for argv in _loading_commands(folder, tmp_path):
        one_line_error(capsys, argv, "weights of 2 layers", "num_hidden_layers 20,000")


def test_an_allocation_failure_while_loading_is_one_line(tmp_path, tiny_model, capsys, monkeypatch):
    """The memory check passed and the allocator then refused (memory in use elsewhere):
    a RuntimeError traceback."""
    from helpers import one_line_error

    import llmsched.engine.runner as runner

    def refuse(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes.")

    monkeypatch.setattr(runner, "load_weights", refuse)
    for argv in _loading_commands(tiny_model, tmp_path):
        one_line_error(capsys, argv, f"cannot allocate the weights of model folder {tiny_model}", "bytes")
