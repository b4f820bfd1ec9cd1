"""What a new user (a serving engineer who knows vLLM) met reading only README.md and the
commands' --help: options whose help hid their default or unit."""

from __future__ import annotations

import argparse
import inspect
import json

import pytest

from llmsched.cli import build_parser, main
from llmsched.cli.common import DEFAULTS


def _options(command: str) -> dict[str, argparse.Action]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {a.option_strings[0]: a for a in sub._actions if a.option_strings}


def test_serve_engine_and_overload_options_state_their_defaults():
    """serve's --dtype, --kv-cache-gb, --num-blocks, --block-size, --seed and
    --max-queued-* said nothing of what an unset one means (generate's --dtype did)."""
    from llmsched.engine.engine import LLMEngine  # noqa: PLC0415 - torch

    serve, generate = _options("serve"), _options("generate")
    flags = ("--dtype", "--kv-cache-gb", "--num-blocks", "--block-size", "--seed")
    for flag in (*flags, "--max-queued-requests", "--max-queued-tokens"):
        assert "default" in serve[flag].help, flag
    assert serve["--dtype"].help == generate["--dtype"].help
    assert f"(default: {DEFAULTS.block_size};" in serve["--block-size"].help
    assert f"(default: {inspect.signature(LLMEngine).parameters['seed'].default})" in serve["--seed"].help
    assert "default: 1," in serve["--kv-cache-gb"].help and "default: 1," in generate["--kv-cache-gb"].help


@pytest.mark.parametrize("name", ["missing.csv", "folder"])
def test_capacity_lengths_names_its_flag_when_the_file_is_not_there(tmp_path, monkeypatch, capsys, name):
    """`capacity --lengths missing.csv` said "prompt: file missing.csv does not exist":
    the user gave no --prompt."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    assert main(["capacity", "--cost-model", "paper", "--lengths", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmsched capacity: error: --lengths: "), err
    assert name in err[0]


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["simulate", "--output-dir", "x"], "(did you mean --out?)"),
        (["sweep", "--output-dir", "x"], "(did you mean --out?)"),
        (["reproduce", "stability", "--outdir", "x"], "(did you mean --out?)"),
        (["simulate", "--num-prompts", "10"], "(did you mean --num-requests?)"),
        (["simulate", "--request-rate", "8"], "(did you mean --rate?)"),
        (["bench", "--num-requests", "10"], "(did you mean --num-prompts?)"),
        (["bench", "--rate", "8"], "(did you mean --request-rate?)"),
        (["bench", "--output-dir", "x"], "(did you mean --result-dir?)"),
        (["capacity", "--output-dir", "x"], ""),  # it writes no folder: not its --output length law
    ],
)
def test_another_tools_spelling_points_to_ours_not_to_a_lookalike(argv, hint, capsys):
    """vllm bench serve's and habit's names got the flag spelt closest: `simulate
    --output-dir` "did you mean --output?" (the output length law), `--num-prompts`
    "--prompt?" (the prompt length law)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"unrecognized arguments: {' '.join(argv[-2:])}{' ' + hint if hint else ''}"), err


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_output_given_a_folder_says_the_folder_is_out(command, tmp_path, capsys):
    """`--output results` (other tools' output folder) is the output length law here: the
    error listed the laws and left the user guessing where results go."""
    argv = [command, "--cost-model", "paper", "--output", str(tmp_path / "results")]
    assert main([*argv, *(["--grid", "load=0.5"] if command == "sweep" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--output: unknown length law" in err[0], err
    assert err[0].endswith("; the output folder is --out DIR")
    assert not (tmp_path / "results").exists()


def test_capacity_writes_no_folder_so_its_output_error_names_none(capsys):
    assert main(["capacity", "--cost-model", "paper", "--output", "results"]) == 2
    assert "--out DIR" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, flags",
    [
        ("validate", ["--seed"]),
        ("sweep", ["--max-time", "--sample-interval"]),
        ("bench", ["--max-concurrency", "--prompt-format"]),
        ("simulate", ["--replicas", "--scale", "--think-time"]),
        ("generate", ["--seed"]),
    ],
)
def test_options_with_a_default_say_it(command, flags):
    """These said nothing of what an unset one does (simulate's --max-time and
    --sample-interval did, sweep's of the same runs did not)."""
    options = _options(command)
    for flag in flags:
        assert "default" in options[flag].help, (command, flag)
    if command == "validate":
        assert "default: 0" in options["--seed"].help and options["--seed"].default == 0


def test_a_pretty_printed_json_given_as_trace_says_json_traces_are_lines(tmp_path, capsys):
    """`--trace results/summary.json` (indented JSON) said only "line 1 is not a JSON
    object: Expecting property name ...", which the file, a JSON object, seemed to deny."""
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"num_requests": 5}, indent=2))
    assert main(["simulate", "--cost-model", "paper", "--trace", str(f), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 1 is not a JSON object" in err[0], err
    assert err[0].endswith("(a JSON trace is Mooncake JSON lines: one object a line)")


def test_reproduce_search_options_state_the_defaults_they_run():
    """--search-requests, --seeds and --tol said nothing of the values a stability run
    takes when they are not given (sweep's --tol did)."""
    from llmsched.analysis.reproduce import SIZES  # noqa: PLC0415

    h = {flag: " ".join(a.help.split()) for flag, a in _options("reproduce").items() if a.help}
    (_, n_syn, seeds_syn, tol_syn), (_, n_sg, seeds_sg, tol_sg) = SIZES["synthetic"], SIZES["sharegpt"]
    assert SIZES["azure"] == SIZES["sharegpt"]
    assert f"(default: {n_syn:,} synthetic, {n_sg:,} sharegpt and azure)" in h["--search-requests"]
    assert f"(default {','.join(map(str, seeds_syn))} synthetic, {seeds_sg[0]} sharegpt and azure)" in h["--seeds"]
    assert f"default {tol_syn:g} synthetic, {tol_sg:g} sharegpt and azure)" in h["--tol"]


@pytest.mark.parametrize(
    "command, extra, hint",
    [
        ("simulate", ["--out", "o"], ": to run several, llmsched sweep --grid policy=sarathi,orca"),
        ("sweep", ["--grid", "load=0.5", "--out", "o"], ": to run several, --grid policy=sarathi,orca"),
        ("capacity", [], ""),
    ],
)
def test_a_list_of_policies_is_refused_as_a_list(command, extra, hint, tmp_path, monkeypatch, capsys):
    """`--policy sarathi,orca` said "unknown batch policy 'sarathi,orca'; did you mean
    'sarathi'?", as if the list were a typo for its first name."""
    monkeypatch.chdir(tmp_path)
    assert main([command, "--cost-model", "paper", "--policy", "sarathi,orca", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llmsched {command}: error: --policy takes one batch policy, got 'sarathi,orca'{hint}"]
    assert not (tmp_path / "o").exists()
    # options after the name keep their commas
    assert main(["simulate", "--cost-model", "paper", "--policy", "sarathi:x=1,y=2", "--out", ""]) == 2
    assert "expected key=value" in capsys.readouterr().err
