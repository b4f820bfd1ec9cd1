"""An output path that cannot be written is one line and exit code 2 before the run starts,
not a traceback after it (the run's work lost)."""

import os

import pytest
from helpers import one_line_error

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import check_out_dir, check_out_file

RUN = ["--cost-model", "paper", "--num-requests", "20", "--rate", "2", "--quiet"]
SERVERLESS = os.path.join(os.path.dirname(__file__), "..", "examples", "serverless", "small.yaml")


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", *RUN, "--out", "{f}"],
        ["simulate", *RUN, "--out", "{f}/sub"],
        ["simulate", *RUN, "--steps", "--out", "{f}/sub"],
        ["simulate", *RUN, "--replicas", "2", "--out", "{f}"],
        ["simulate", "--serverless", SERVERLESS, "--num-requests", "20", "--out", "{f}"],
        ["sweep", *RUN, "--grid", "rate=1,2", "--out", "{f}"],
        ["reproduce", "stability", "--quick", "--out", "{f}/x"],
    ],
)
def test_an_output_folder_that_is_a_file(tmp_path, capsys, argv):
    f = tmp_path / "afile"
    f.write_text("keep me\n")
    argv = [a.replace("{f}", str(f)) for a in argv]
    one_line_error(capsys, argv, "afile", "is a file, not a folder")
    assert f.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written beside it


def test_the_checks(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    f = tmp_path / "f"
    f.write_text("")
    check_out_dir(d)
    check_out_dir(d / "new" / "deeper")  # made by the writer
    check_out_file(d / "x.json")
    check_out_file(d / "new" / "x.csv", make_parents=True)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_out_dir(f)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_out_dir(f / "sub")
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        check_out_file(d)
    with pytest.raises(ConfigError, match="does not exist"):
        check_out_file(d / "new" / "x.json")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_out_file(f / "x.json", make_parents=True)
    if os.path.isdir("/proc"):  # not writable even by root (os.access says it is)
        with pytest.raises(ConfigError, match="cannot write in /proc"):
            check_out_dir("/proc/llmsched-out")
    assert not any(p.name.startswith(".llmsched-probe") for p in d.iterdir())  # the probe is gone
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ConfigError, match="not writable"):
            check_out_dir(ro / "out")


def test_validate_refuses_what_it_would_ignore(tmp_path, capsys):
    # checked before the model loads: no model is needed to get the error
    base = ["validate", "--model", str(tmp_path / "none"), "--trace", str(tmp_path / "none.csv")]
    one_line_error(capsys, [*base, "--policy", "orca", "--policies", "sarathi"], "--policies")
    one_line_error(capsys, [*base, "--admission", "twp"], "--admission")
    one_line_error(capsys, [*base, "--prefix-caching"], "--prefix-caching")
    one_line_error(capsys, [*base, "--seed", "-1"], "--seed")
    one_line_error(capsys, [*base, "--json", str(tmp_path)], "is a folder, not a file")
    one_line_error(capsys, [*base, "--json", str(tmp_path / "no" / "x.json")], "does not exist")


def test_a_folder_holding_another_kind_of_run(tmp_path, capsys):
    out = tmp_path / "out"
    serverless = ["simulate", "--serverless", SERVERLESS, "--num-requests", "20", "--quiet", "--out", str(out)]
    single = ["simulate", *RUN, "--out", str(out)]
    assert main(["simulate", *RUN, "--replicas", "2", "--out", str(tmp_path / "net")]) == 0
    net_files = {p.name for p in (tmp_path / "net").iterdir()}
    assert main(single) == 0
    single_files = {p.name for p in out.iterdir()}
    assert main(serverless) == 0
    serverless_files = {p.name for p in out.iterdir()}
    assert "timeseries.csv" not in serverless_files and "instances.csv" in serverless_files
    assert main(["simulate", *RUN, "--replicas", "2", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == net_files  # no serverless file left beside
    assert main(single) == 0
    assert {p.name for p in out.iterdir()} == single_files  # no calls.csv, jobs.csv or servers/ left
    # `plot` on a network's folder points at a replica's
    one_line_error(capsys, ["plot", str(tmp_path / "net")], "holds a network's run", str(tmp_path / "net" / "servers"))
