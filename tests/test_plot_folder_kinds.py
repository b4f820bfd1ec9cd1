"""`llmsched plot` on a folder of another kind of run says which (a sweep's or a `reproduce`
experiment's folder got "timeseries.csv is missing ...: is this a `llmsched simulate
--out` folder?")."""

import json

from llmsched.cli import main

CLI = ["--cost-model", "paper", "--b-max", "256", "--prompt", "geometric:50", "--output", "geometric:10"]
CLI += ["--num-requests", "60"]


def test_a_sweep_folder_and_its_points_are_named_as_such(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    assert main(["sweep", *CLI, "--grid", "rate=2,4", "--out", str(out), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds a sweep's results" in err and "timeseries.csv is missing" not in err
    assert "throughput.png" in err  # (the figures the sweep drew there)
    assert main(["plot", str(out / "points")]) == 2
    assert "a sweep's point records" in capsys.readouterr().err
    monkeypatch.chdir(out / "points")  # (named as ".", whose name is empty)
    assert main(["plot", "."]) == 2
    assert "a sweep's point records" in capsys.readouterr().err


def test_a_reproduce_folder_is_named_with_its_experiment(tmp_path, capsys):
    d = tmp_path / "twp"
    d.mkdir()
    (d / "table3.csv").write_text("policy,p99_ttft_ms\ntwp,1\n")
    (d / "result.json").write_text(json.dumps({"table3": []}))
    (d / "ttft.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err
    assert "holds a `llmsched reproduce twp` run's results" in err and "ttft.png" in err


def test_a_users_results_csv_alone_is_no_sweep(tmp_path, capsys):
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    assert main(["plot", str(tmp_path)]) == 2
    assert "timeseries.csv is missing" in capsys.readouterr().err


def test_a_network_runs_servers_folder_names_a_replica(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["simulate", *CLI, "--replicas", "2", "--out", str(out), "--quiet"]) == 0
    assert main(["plot", str(out / "servers")]) == 2
    err = capsys.readouterr().err
    assert "replica folders of a network's run" in err and str(out / "servers" / "cluster[0]") in err
