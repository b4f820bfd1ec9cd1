"""A Ctrl-C after a command's last file was written (while it prints its summary) says
that its folder is complete, and still exits 130 (the command, and a shell loop running
it, were stopped; a --json summary may be cut short). It said `llmsched: interrupted`
alone, as a Ctrl-C in the run does, and users reran finished runs."""

from __future__ import annotations

import llmsched.analysis.sweep as sweep_module
import llmsched.cli.simulate as simulate_cli
from llmsched.cli import main

SIM = ["simulate", "--cost-model", "paper", "--num-requests", "50", "--rate", "2"]


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_a_ctrl_c_while_simulate_prints_says_its_files_are_complete(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setattr(simulate_cli, "print_summary", _interrupt)
    assert main([*SIM, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llmsched: interrupted after writing its files: {out} is complete"]
    assert (out / "summary.json").is_file()


def test_a_ctrl_c_before_the_last_file_says_interrupted_alone(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main([*SIM, "--out", str(out), "--quiet"]) == 0  # an earlier run's complete folder
    monkeypatch.setattr("llmsched.sim.result.SimResult._write_itl", _interrupt)
    assert main([*SIM, "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["llmsched: interrupted"]


def test_a_ctrl_c_after_a_sweeps_results_says_its_folder_is_complete(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    real = sweep_module.end_sweep_write

    def then_interrupt(folder):
        real(folder)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "end_sweep_write", then_interrupt)
    args = ["sweep", "--cost-model", "paper", "--num-requests", "50", "--grid", "load=0.5", "--no-plots", "--quiet"]
    assert main([*args, "--workers", "1", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"{out} is complete")
