"""Messages of `sweep`, `simulate` and `plot`: an empty folder named as such, `--out DIR/`
shown with one slash, a model folder refused for what it is, a warning of a sweep's pool
workers shown once."""

import subprocess
import sys

from llmsched.cli import main

CLI = ["--cost-model", "paper", "--b-max", "256", "--prompt", "geometric:100", "--output", "geometric:20"]
CLI += ["--num-requests", "200"]


def test_plot_of_an_empty_path_says_so(capsys):
    assert main(["plot", ""]) == 2
    err = capsys.readouterr().err
    assert "''" in err and "empty path" in err
    assert "timeseries.csv is missing" not in err


def test_plot_names_the_folder_a_file_is_missing_from(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert f"timeseries.csv is missing from {str(tmp_path)!r}" in capsys.readouterr().err


def test_out_with_a_trailing_slash_is_shown_with_one(tmp_path, capsys):
    out = str(tmp_path / "tsl") + "/"
    assert main(["sweep", *CLI, "--grid", "rate=2", "--out", out, "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert f"written to {tmp_path / 'tsl'}/: " in text and "//" not in text
    assert main(["simulate", *CLI, "--out", str(tmp_path / "sim") + "//"]) == 0
    text = capsys.readouterr().out
    assert f"results written to {tmp_path / 'sim'}/\n" in text


def test_a_model_folder_is_refused_for_what_it_is(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert main(["sweep", *CLI, "--grid", "rate=2", "--out", str(model), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "another tool's folder" in err
    assert "would replace" not in err  # a sweep writes no config.json
    assert main(["simulate", *CLI, "--out", str(model)]) == 2  # a simulate run writes one
    assert "which the run would replace" in capsys.readouterr().err
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_a_warning_of_the_pool_workers_is_shown_once(tmp_path):
    argv = [sys.executable, "-m", "llmsched.cli", "sweep", *CLI, "--prefix-caching", "--grid", "rate=2,4,6"]
    argv += ["--out", str(tmp_path / "s"), "--no-plots", "--workers", "2"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if "prefix caching has nothing to hit" in ln]
    assert len(lines) == 1, run.stderr
