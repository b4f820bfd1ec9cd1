"""`llmsched plot` never replaces a file of the user's under a figure's name (notes in
queue.png were overwritten, exit 0); its own earlier figures it redraws."""

from llmsched.cli import main

CLI = ["--cost-model", "paper", "--b-max", "256", "--prompt", "geometric:50", "--output", "geometric:10"]
CLI += ["--num-requests", "60"]


def test_a_file_of_the_users_under_a_figures_name_is_kept(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", *CLI, "--out", str(out), "--quiet"]) == 0
    (out / "itl_cdf.png").write_text("my notes\n")
    assert main(["plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "itl_cdf.png exists and is not a figure" in err
    assert (out / "itl_cdf.png").read_text() == "my notes\n"
    assert not (out / "queue.png").exists()  # (refused before any figure is drawn)
    (out / "itl_cdf.png").write_text("")  # an empty file has nothing to lose
    assert main(["plot", str(out)]) == 0
    assert main(["plot", str(out)]) == 0  # its own figures are redrawn
    assert (out / "itl_cdf.png").read_bytes().startswith(b"\x89PNG")


def test_a_rerun_keeps_a_file_of_the_users_under_a_figures_name(tmp_path, capsys):
    # a rerun removes the earlier run's figures: a non-figure there is the user's, refused
    out = tmp_path / "run"
    assert main(["simulate", *CLI, "--out", str(out), "--quiet"]) == 0
    assert main(["plot", str(out)]) == 0
    assert main(["simulate", *CLI, "--out", str(out), "--quiet"]) == 0  # (its figures go)
    assert not (out / "queue.png").exists()
    (out / "queue.png").write_text("my notes\n")
    assert main(["simulate", *CLI, "--out", str(out), "--quiet"]) == 2
    assert "holds 'queue.png', which is not a figure" in capsys.readouterr().err
    assert (out / "queue.png").read_text() == "my notes\n"
    sweep = tmp_path / "sweep"
    argv = ["sweep", *CLI, "--grid", "rate=2", "--out", str(sweep), "--workers", "1", "--quiet"]
    assert main(argv) == 0
    (sweep / "latency.png").write_text("my notes\n")
    assert main(argv) == 2
    assert "holds 'latency.png', which is not a figure" in capsys.readouterr().err
    assert (sweep / "latency.png").read_text() == "my notes\n"
