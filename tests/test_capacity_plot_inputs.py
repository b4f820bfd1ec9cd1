"""`capacity --plot` given a file the configuration reads (`--trace t.png --plot t.png`)
drew the figure over it and exited 0; `--samples` over the limit was reported as
"num_requests=... exceeds the limit", naming no flag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import one_line_error

from llmsched.workload.arrivals import MAX_REQUESTS

TRACE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "validate_small.csv"


@pytest.mark.parametrize("plot", ["t.png", "t", "link.png"])
def test_plot_refuses_the_trace_it_reads(tmp_path, monkeypatch, capsys, plot):
    monkeypatch.chdir(tmp_path)
    shutil.copy(TRACE, "t.png")
    Path("link.png").symlink_to("t.png")
    before = Path("t.png").read_bytes()
    one_line_error(capsys, ["capacity", "--trace", "t.png", "--plot", plot], "--plot", "a file this run reads")
    assert Path("t.png").read_bytes() == before


def test_plot_refuses_a_length_table_it_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(TRACE, "lens.png")  # (its prompt_tokens and output_tokens columns)
    before = Path("lens.png").read_bytes()
    one_line_error(capsys, ["capacity", "--lengths", "lens.png", "--plot", "lens.png"], "a file this run reads")
    assert Path("lens.png").read_bytes() == before


def test_plot_refuses_a_file_that_is_not_a_figure_and_replaces_its_own(tmp_path, monkeypatch, capsys):
    """`--plot notes.png` over a text file of the user's replaced it with the figure, exit 0."""
    monkeypatch.chdir(tmp_path)
    Path("notes.png").write_text("important notes\n")
    argv = ["capacity", "--cost-model", "paper", "--k-max", "8", "--mean-prompt", "100", "--mean-output", "10"]
    one_line_error(capsys, [*argv, "--plot", "notes.png"], "--plot 'notes.png' exists and is not a figure")
    assert Path("notes.png").read_text() == "important notes\n"
    from llmsched.cli import main

    for name in ("fig.png", "fig.svg"):  # an earlier run's figure is replaced, as before
        assert main([*argv, "--plot", name]) == 0 and main([*argv, "--plot", name]) == 0
    capsys.readouterr()


def test_plot_over_a_file_it_cannot_read_is_one_line(tmp_path, monkeypatch, capsys):
    """A file the figure check cannot open (root reads a mode-000 file, so the open fails
    here by hand) is refused as not a figure, not a PermissionError traceback."""
    import llmsched.cli.analysis as cli_analysis

    monkeypatch.chdir(tmp_path)
    Path("locked.png").write_text("x\n")

    def no_read(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli_analysis, "open", no_read, raising=False)
    argv = ["capacity", "--cost-model", "paper", "--k-max", "8", "--mean-prompt", "100", "--mean-output", "10"]
    one_line_error(capsys, [*argv, "--plot", "locked.png"], "exists and is not a figure")


def test_samples_over_the_limit_names_the_flag(capsys):
    line = one_line_error(capsys, ["capacity", "--samples", str(MAX_REQUESTS + 1)], "--samples", f"{MAX_REQUESTS:,}")
    assert "num_requests" not in line
