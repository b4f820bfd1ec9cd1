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
