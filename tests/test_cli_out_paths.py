"""An output path that cannot be written is one line and exit code 2 before the run starts,
not a traceback after it (the run's work lost)."""

import json
import os

import pytest
from helpers import one_line_error

import llmsched
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
        ["sweep", *RUN, "--grid", "seed=0,1", "--out", "{f}"],
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


def test_a_broken_link_as_the_output_folder_is_named_so(tmp_path, capsys):
    """A symbolic link to nothing passed the checks as --out: making the folder then failed
    with a bare 'File exists'."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"^output folder '[^']*out' is a broken symbolic link \(to '[^']*gone'\)"):
        check_out_dir(link)
    with pytest.raises(ConfigError, match=r"^output folder '[^']*out/sub': [^ ]*out is a broken symbolic link"):
        check_out_dir(link / "sub")
    with pytest.raises(ConfigError, match="is a broken symbolic link"):
        check_out_file(link / "x.json", make_parents=True)
    sweep = ["sweep", *RUN, "--grid", "seed=0", "--no-plots"]
    one_line_error(capsys, [*sweep, "--out", str(link)], "broken symbolic link")
    one_line_error(capsys, ["simulate", *RUN, "--out", str(link / "sub")], "broken symbolic link")
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_a_read_only_points_folder_is_refused_before_any_point_runs(tmp_path, monkeypatch, capsys):
    """A points/ that cannot be written, in a writable --out, was found only when the first
    point's record was written, after its run."""
    from llmsched.analysis import sweep

    out = tmp_path / "out"
    argv = ["sweep", *RUN, "--no-plots", "--workers", "1", "--out", str(out)]
    assert main([*argv, "--grid", "seed=0"]) == 0
    capsys.readouterr()
    if os.geteuid() == 0:  # root may write anywhere: the check's own answer stands in for the folder's mode
        access = os.access

        def no_points(p, mode, **kw):
            return os.path.basename(p) != "points" and access(p, mode, **kw)

        monkeypatch.setattr(os, "access", no_points)
    else:
        (out / "points").chmod(0o500)
    ran = []
    monkeypatch.setattr(sweep, "run_point", lambda cfg: ran.append(cfg) or {"wall_s": 0.0})
    try:
        one_line_error(capsys, [*argv, "--grid", "seed=0,1"], f"'{out / 'points'}'", "is not writable")
    finally:
        (out / "points").chmod(0o700)
    assert ran == []


def test_validate_refuses_what_it_would_ignore(tmp_path, capsys):
    # checked before the model loads: no model is needed to get the error
    base = ["validate", "--model", str(tmp_path / "none"), "--trace", str(tmp_path / "none.csv")]
    one_line_error(capsys, [*base, "--policy", "orca", "--policies", "sarathi"], "--policies")
    one_line_error(capsys, [*base, "--admission", "twp"], "--admission")
    one_line_error(capsys, [*base, "--prefix-caching"], "--prefix-caching")
    one_line_error(capsys, [*base, "--seed", "-1"], "--seed")
    one_line_error(capsys, [*base, "--policies", "orca,sarathi,ORCA"], "--policies: 'orca' is given twice")
    # an empty name (a trailing comma) was dropped silently; `reproduce --policies` refused it
    for empty in ("sarathi,", ",orca", "sarathi,,orca", ""):
        one_line_error(
            capsys, [*base, "--policies", empty], f"--policies: give comma-separated policy names, got {empty!r}"
        )
    one_line_error(
        capsys, ["reproduce", "stability", "--policies", "sarathi,", "--out", str(tmp_path / "r")], "got 'sarathi,'"
    )
    one_line_error(
        capsys,
        ["reproduce", "stability", "--policies", "orca,ORCA", "--out", str(tmp_path / "r")],
        "'orca' is given twice",
    )
    for twice in ("adaptive:cost=paper,adaptive:cost=PAPER", "adaptive:cost=paper,adaptive:cost=paper "):
        one_line_error(capsys, [*base, "--policies", twice], "--policies: 'adaptive:cost=paper' is given twice")
    one_line_error(capsys, [*base, "--json", str(tmp_path)], "is a folder, not a file")
    (tmp_path / "afile").write_text("")
    one_line_error(capsys, [*base, "--json", str(tmp_path / "afile" / "x.json")], "is a file, not a folder")
    # --json never replaces a file validate did not write (a model's config.json, notes)
    for text in ("precious\n", '{"model_type": "llama"}\n', "[1, 2]\n"):
        mine = tmp_path / "mine.json"
        mine.write_text(text)
        one_line_error(capsys, [*base, "--json", str(mine)], "mine.json", "is not a validate result")
        assert mine.read_text() == text


def test_validate_json_replaces_its_own_result(tmp_path, monkeypatch):
    from llmsched.analysis import validate as validation

    result = {"model": "m", "trace_requests": 3, "policies": {"orca": {}}, "b_max": 8}
    monkeypatch.setattr(validation, "validate", lambda *a, **k: result)
    monkeypatch.setattr("llmsched.cli.analysis.engine_setup", lambda args: {})
    monkeypatch.setattr("llmsched.cli.analysis.render_validation", lambda res: None)
    out = tmp_path / "v.json"
    out.write_text("")  # an empty file (mktemp's) is taken
    argv = ["validate", "--model", str(tmp_path), "--trace", str(tmp_path / "t.csv"), "--json", str(out)]
    assert main(argv) == 0
    result["b_max"] = 16
    assert main(argv) == 0  # a rerun replaces its own result
    assert json.loads(out.read_text())["b_max"] == 16


def test_a_file_name_too_long_is_one_line(tmp_path, capsys):
    """Python 3.11's Path.is_dir() raises on a component over 255 bytes (ENAMETOOLONG)
    instead of answering False: every command says so in one line, exit 2."""
    long = str(tmp_path / ("x" * 300))
    one_line_error(capsys, ["simulate", *RUN, "--out", long], "file name too long", "characters)")
    one_line_error(capsys, ["simulate", "--trace", long + ".csv", "--out", ""], "file name too long")
    one_line_error(capsys, ["sweep", *RUN, "--grid", "seed=0", "--out", long], "file name too long")
    one_line_error(capsys, ["capacity", "--cost-model", "paper", "--lengths", long], "file name too long")


def test_a_run_marker_beside_the_users_files_is_not_proof(tmp_path, capsys):
    """A folder holding results.csv or requests.csv + timeseries.csv (names a run writes)
    beside the user's notes was taken for an earlier run and overwritten."""
    u = tmp_path / "u"
    u.mkdir()
    (u / "results.csv").write_text("mine\n")
    (u / "notes.txt").write_text("mine\n")
    one_line_error(capsys, ["sweep", *RUN, "--grid", "seed=0", "--out", str(u)], "notes.txt", "would replace")
    (u / "notes.txt").unlink()  # a lone results.csv: a sweep keeps its points beside it
    one_line_error(
        capsys, ["sweep", *RUN, "--grid", "seed=0", "--out", str(u)], "but no 'points'", "a sweep writes first"
    )
    assert (u / "results.csv").read_text() == "mine\n"
    s = tmp_path / "s"
    s.mkdir()
    for name in ("requests.csv", "timeseries.csv", "notes.txt"):
        (s / name).write_text("mine\n")
    one_line_error(capsys, ["simulate", *RUN, "--out", str(s)], "notes.txt", "would replace")
    (s / "notes.txt").unlink()
    one_line_error(capsys, ["simulate", *RUN, "--out", str(s)], "but no 'summary.json'")
    assert all((s / n).read_text() == "mine\n" for n in ("requests.csv", "timeseries.csv"))


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
    capsys.readouterr()  # (the serverless example's 20 bursty arrivals warn that their rate is loose)
    # `plot` on a network's folder points at a replica's
    one_line_error(capsys, ["plot", str(tmp_path / "net")], "holds a network's run", str(tmp_path / "net" / "servers"))


def test_a_folder_of_another_tools_files_is_not_replaced(tmp_path, capsys):
    """A model folder's config.json (or any file no run writes) is never overwritten."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    (model / "model.safetensors").write_text("weights\n")
    one_line_error(capsys, ["simulate", *RUN, "--out", str(model)], "model.safetensors", "not an llmsched run")
    (model / "model.safetensors").unlink()  # a lone config.json that is not a run's
    one_line_error(capsys, ["simulate", *RUN, "--out", str(model)], "config.json", "not an llmsched run")
    one_line_error(capsys, ["sweep", *RUN, "--grid", "seed=0", "--out", str(model)], "not an llmsched run")
    assert (model / "config.json").read_text() == '{"model_type": "llama"}\n'
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    # the same kind of run: a rerun replaces its own files (README "Outputs")
    out = tmp_path / "out"
    assert main(["simulate", *RUN, "--out", str(out)]) == 0
    assert main(["simulate", *RUN, "--out", str(out)]) == 0
    # a shared folder (results/ beside a benchmark's JSON and a sweep's folder): nothing replaced
    shared = tmp_path / "results"
    (shared / "sweep").mkdir(parents=True)
    (shared / "engine_cpu.json").write_text("{}\n")
    assert main(["simulate", *RUN, "--out", str(shared)]) == 0
    assert (shared / "engine_cpu.json").read_text() == "{}\n"


def test_sweep_and_simulate_do_not_mix_in_one_folder(tmp_path, capsys):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    assert main(["simulate", *RUN, "--out", str(run)]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    one_line_error(capsys, ["sweep", *RUN, "--grid", "seed=0", "--out", str(run)], "single-server", "not of a sweep")
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    argv = ["sweep", *RUN, "--grid", "seed=0,1", "--workers", "1", "--out", str(sweep)]
    assert main(argv) == 0
    one_line_error(capsys, ["simulate", *RUN, "--out", str(sweep)], "a sweep", "results.csv")
    one_line_error(capsys, ["simulate", *RUN, "--replicas", "2", "--out", str(sweep)], "a sweep")
    assert not (sweep / "config.json").exists()
    # an interrupted sweep (points/ only) resumes
    (sweep / "results.csv").unlink()
    points = {p.name: p.stat().st_mtime_ns for p in (sweep / "points").iterdir()}
    assert main(argv) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (sweep / "points").iterdir()} == points  # not rerun
    assert (sweep / "results.csv").is_file()


@pytest.mark.parametrize("argv", [["sweep", *RUN, "--grid", "seed=0"], ["reproduce", "stability", "--quick"]])
def test_an_empty_out_names_no_folder(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, [*argv, "--out", ""], "--out must name a folder")
    assert list(tmp_path.iterdir()) == []


def test_a_config_that_is_a_folder(tmp_path, capsys):
    one_line_error(capsys, ["simulate", "--config", str(tmp_path)], str(tmp_path), "is a folder")


def test_run_kinds_of_sweeps_and_experiments(tmp_path):
    from llmsched.core.paths import check_run_dir, clear_stale, run_kind

    d = tmp_path / "rq"
    d.mkdir()
    for f in ("table.csv", "table3.csv", "ablation.csv"):
        (d / f).write_text("x\n")
    (d / "ttft.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # (a figure: a text one would be the user's)
    (d / "result.json").write_text('{"config": {}, "rows": []}\n')  # its proof
    assert run_kind(d) == "reproduce twp"
    with pytest.raises(ConfigError, match=r"reproduce twp.*table3\.csv.*not of `reproduce stability`"):
        check_run_dir(d, "reproduce stability")
    check_run_dir(d, "reproduce twp")
    clear_stale(d, "reproduce twp", [str(d / f) for f in ("table.csv", "table3.csv", "ttft.png", "result.json")])
    assert sorted(p.name for p in d.iterdir()) == ["result.json", "table.csv", "table3.csv", "ttft.png"]
    s = tmp_path / "st"
    (s / "search" / "points").mkdir(parents=True)
    for f in ("queue.png", "table.csv", "table.json"):
        (s / f).write_text("x\n")
    assert run_kind(s) == "reproduce stability" and run_kind(s / "search") == "sweep"
    with pytest.raises(ConfigError, match="reproduce stability"):
        check_run_dir(s, "reproduce prefix-caching")
    clear_stale(s, "reproduce stability", [str(s / f) for f in ("queue.png", "table.csv", "table.json")])
    assert not (s / "search").exists()  # a --no-search rerun leaves no earlier search
    (s / "notes.txt").write_text("mine\n")
    clear_stale(s, "reproduce stability", [])
    assert [p.name for p in s.iterdir()] == ["notes.txt"]  # only a run's own files go


def test_each_network_reproduction_checks_its_own_folder_kind(tmp_path):
    """reproduce_clusters checked the folder as clusters, agents and Rybko-Stolyar (so a
    rerun of clusters into its own folder was refused), and the other two checked nothing."""
    from llmsched.analysis.reproduce_networks import reproduce_agents, reproduce_rybko_stolyar
    from llmsched.core.errors import ConfigError

    (tmp_path / "clusters_p99.png").write_bytes(b"")
    for run in (reproduce_agents, reproduce_rybko_stolyar):
        with pytest.raises(ConfigError, match="holds the outputs of `reproduce clusters`"):
            run(out_dir=tmp_path, quick=True, workers=1)


def test_a_rerun_over_its_own_run_beside_hidden_files(tmp_path, capsys):
    """A desktop's .DS_Store (or any hidden file) beside a run blocked its rerun; a run's
    proof (summary.json, a sweep's points/) makes its folder a rerun's, notes or not."""
    out = tmp_path / "run"
    assert main(["simulate", *RUN, "--out", str(out)]) == 0
    (out / ".DS_Store").write_text("x")
    assert main(["simulate", *RUN, "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["simulate", *RUN, "--out", str(out)]) == 0 and (out / "notes.txt").read_text() == "mine"
    sweep = tmp_path / "sweep"
    argv = ["sweep", *RUN, "--grid", "seed=0", "--no-plots", "--out", str(sweep)]
    assert main(argv) == 0
    (sweep / ".DS_Store").write_text("x")
    (sweep / "notes.txt").write_text("mine")
    assert main(argv) == 0 and (sweep / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("text", ["hi\n", '{"accuracy": 0.9}\n', "[1, 2]\n", '{"duration": 1, "steps": 2}\n'])
@pytest.mark.parametrize(
    "run",
    [
        ["simulate", *RUN],
        ["simulate", *RUN, "--replicas", "2"],
        ["simulate", "--serverless", SERVERLESS, "--num-requests", "20", "--quiet"],
    ],
)
def test_a_summary_json_that_no_run_wrote_is_not_replaced(tmp_path, capsys, text, run):
    """A folder holding only the user's own summary.json (text, another tool's JSON) was
    taken for an earlier run's and the file overwritten."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_text(text)
    one_line_error(capsys, [*run, "--out", str(d)], "'summary.json'", "not an llmsched run's", "would replace")
    assert (d / "summary.json").read_text() == text
    assert [p.name for p in d.iterdir()] == ["summary.json"]


def test_each_simulate_kind_proves_its_folder_to_every_other(tmp_path):
    """A run's own summary.json is proof for a rerun of any simulate kind."""
    from llmsched.core.paths import SIMULATE_KINDS, check_run_dir

    runs = {
        "single-server": ["simulate", *RUN],
        "network": ["simulate", *RUN, "--replicas", "2"],
        "serverless": ["simulate", "--serverless", SERVERLESS, "--num-requests", "20", "--quiet"],
    }
    for kind, argv in runs.items():
        out = tmp_path / kind
        assert main([*argv, "--out", str(out)]) == 0
        for other in SIMULATE_KINDS:
            check_run_dir(out, other)
        assert main([*argv, "--out", str(out)]) == 0  # the rerun


def test_a_sweeps_points_and_an_experiments_table_json_must_be_theirs(tmp_path, capsys):
    from llmsched.core.paths import check_run_dir

    sweep = ["sweep", *RUN, "--grid", "seed=0", "--no-plots", "--workers", "1"]
    mine = tmp_path / "mine"
    (mine / "points").mkdir(parents=True)
    (mine / "points" / "notes.txt").write_text("mine\n")
    one_line_error(capsys, [*sweep, "--out", str(mine)], "'points'", "not a sweep's", "notes.txt")
    (mine / "points" / "notes.txt").unlink()
    (mine / "points" / "a.json").write_text('{"x": 1}\n')
    one_line_error(capsys, [*sweep, "--out", str(mine)], "'points'", "not a sweep's", "record")
    assert [p.name for p in mine.iterdir()] == ["points"]
    (mine / "points" / "a.json").unlink()  # an empty points/: a sweep stopped before its first point
    assert main([*sweep, "--out", str(mine)]) == 0
    assert main([*sweep, "--out", str(mine)]) == 0  # its points prove the folder

    table = tmp_path / "table"
    table.mkdir()
    (table / "table.json").write_text('{"rows": []}\n')
    with pytest.raises(ConfigError, match=r"'table\.json' that is not `reproduce stability`'s \(no 'meta' key\)"):
        check_run_dir(table, "reproduce stability")
    (table / "table.json").write_text('{"meta": {}, "rows": []}\n')
    check_run_dir(table, "reproduce stability")


@pytest.mark.parametrize(
    ("experiment", "name"),
    [
        ("rybko-stolyar", "loads.csv"),
        ("clusters", "table.csv"),
        ("agents", "table.csv"),
        ("stability", "table.csv"),
        ("twp", "table.csv"),
        ("twp", "slo.csv"),
    ],
)
def test_an_experiment_never_replaces_a_file_no_run_wrote(tmp_path, capsys, experiment, name):
    """A folder holding only the user's loads.csv or table.csv (names an experiment
    writes) was taken for an earlier run: the file was cleared away as stale, or replaced,
    silently (the proof, table.json, is written last, and its absence was let pass)."""
    d = tmp_path / "d"
    d.mkdir()
    (d / name).write_text("mine\n")
    argv = ["reproduce", experiment, "--quick", "--out", str(d)]
    one_line_error(capsys, argv, repr(name), "but no", "writes last", "not a finished run's output")
    assert [p.name for p in d.iterdir()] == [name] and (d / name).read_text() == "mine\n"


def test_prefix_caching_never_replaces_a_table_no_run_wrote(tmp_path):
    from llmsched.analysis.reproduce_prefix import reproduce_prefix_caching

    d = tmp_path / "d"
    d.mkdir()
    (d / "table.csv").write_text("mine\n")
    with pytest.raises(ConfigError, match="holds 'table.csv' but no 'result.json'"):
        reproduce_prefix_caching(str(tmp_path / "no-trace.jsonl"), out_dir=d, quick=True)
    (d / "result.json").write_text("[]\n")  # JSON, but not a run's result
    with pytest.raises(ConfigError, match="'result.json' that is not `reproduce prefix-caching`'s"):
        reproduce_prefix_caching(str(tmp_path / "no-trace.jsonl"), out_dir=d, quick=True)
    assert (d / "table.csv").read_text() == "mine\n"


def test_a_stability_search_folder_holding_the_users_files_is_not_cleared(tmp_path, capsys):
    """`--no-search` removed an earlier run's search/ with shutil.rmtree, the user's files
    inside it too (and a search/ of the user's own beside no run at all)."""
    mine = tmp_path / "mine"
    (mine / "search").mkdir(parents=True)
    (mine / "search" / "notes.txt").write_text("mine\n")
    argv = ["reproduce", "stability", "--quick", "--no-search", "--policies", "sarathi", "--out", str(mine)]
    one_line_error(capsys, argv, "search/ holds 'notes.txt'", "no llmsched run writes there")
    assert (mine / "search" / "notes.txt").read_text() == "mine\n"

    out = tmp_path / "out"
    run = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--out", str(out)]
    assert main(run) == 0
    capsys.readouterr()
    assert (out / "search" / "points").is_dir()
    (out / "search" / "points" / "notes.txt").write_text("mine\n")
    no_search = [*run, "--no-search"]
    one_line_error(capsys, no_search, "search/ holds 'points/notes.txt'")
    (out / "search" / "points" / "notes.txt").unlink()
    (out / "search" / "notes.txt").write_text("mine\n")
    one_line_error(capsys, no_search, "search/ holds 'notes.txt'")
    assert (out / "search" / "notes.txt").read_text() == "mine\n" and (out / "search" / "results.csv").is_file()
    (out / "search" / "notes.txt").unlink()
    (out / "search" / ".DS_Store").write_text("x")  # a hidden file stays, and its folder with it
    assert main(no_search) == 0
    assert [p.name for p in (out / "search").iterdir()] == [".DS_Store"]
    (out / "search" / ".DS_Store").unlink()
    assert main(run) == 0 and main(no_search) == 0
    assert not (out / "search").exists()  # a run's own search/ goes whole


def test_clearing_a_runs_folder_leaves_what_no_run_wrote(tmp_path):
    """clear_stale removed a run's folder with shutil.rmtree: whatever else it held went too."""
    from llmsched.core.paths import clear_stale

    s = tmp_path / "st"
    (s / "search" / "points").mkdir(parents=True)
    (s / "search" / "points" / "k.json").write_text('{"key": "k", "config": {}, "summary": {}}')  # a point's record
    (s / "search" / "points" / "j.json").write_text("{}")  # JSON, but no point's record: the user's
    (s / "search" / "points" / ".k.123.tmp").write_text("{}")  # a write's temporary file
    (s / "search" / "results.csv").write_text("x\n")
    (s / "search" / "mine.txt").write_text("mine\n")
    (s / "search" / "points" / "mine").mkdir()
    (s / "table.csv").mkdir()  # a folder under a file's name: no run made it
    (s / "table.csv" / "mine.txt").write_text("mine\n")
    clear_stale(s, "reproduce stability", [])
    left = sorted(str(p.relative_to(s)) for p in s.rglob("*"))
    assert left == [
        "search",
        "search/mine.txt",
        "search/points",
        "search/points/j.json",
        "search/points/mine",
        "table.csv",
        "table.csv/mine.txt",
    ]


def test_a_network_rerun_keeps_the_users_file_in_a_replica_folder(tmp_path):
    """A rerun removed each earlier replica's folder with shutil.rmtree, the user's files in it too."""
    out = tmp_path / "net"
    assert main(["simulate", *RUN, "--replicas", "3", "--out", str(out)]) == 0
    (out / "servers" / "cluster[2]" / "notes.txt").write_text("mine\n")
    assert main(["simulate", *RUN, "--replicas", "2", "--out", str(out)]) == 0
    assert [p.name for p in (out / "servers" / "cluster[2]").iterdir()] == ["notes.txt"]
    (out / "servers" / "cluster[0]" / "notes.txt").write_text("mine\n")
    assert main(["simulate", *RUN, "--out", str(out)]) == 0  # a single-server run clears the network's
    assert sorted(str(p.relative_to(out / "servers")) for p in (out / "servers").rglob("*")) == [
        "cluster[0]",
        "cluster[0]/notes.txt",
        "cluster[2]",
        "cluster[2]/notes.txt",
    ]


def test_a_json_file_in_a_search_is_a_runs_only_if_it_is_a_points_record(tmp_path, capsys):
    """Inside points/ any *.json counted as a run's: `--no-search` removed the user's
    search/points/mine.json, and the whole search/ with it, without a word."""
    out = tmp_path / "st"
    run = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--out", str(out)]
    assert main(run) == 0
    capsys.readouterr()
    mine = out / "search" / "points" / "mine.json"
    mine.write_text('{"my": "data"}')
    one_line_error(capsys, [*run, "--no-search"], "search/ holds 'points/mine.json'", "no llmsched run writes there")
    assert mine.read_text() == '{"my": "data"}' and (out / "search" / "results.csv").is_file()
    # a record of another key's name is no record either
    record = next(p for p in mine.parent.iterdir() if p != mine)
    mine.write_text(record.read_text())
    one_line_error(capsys, [*run, "--no-search"], "search/ holds 'points/mine.json'")
    mine.unlink()
    assert main([*run, "--no-search"]) == 0 and not (out / "search").exists()


def test_a_servers_folder_is_a_replicas_only_if_its_summary_proves_it(tmp_path, capsys):
    """Any servers/DIR holding a summary.json was taken for a replica's folder: a network
    rerun deleted the user's servers/my_notes/summary.json ({"note": "mine"}) and
    requests.csv beside it. Now refused, in one line, before the run."""
    out = tmp_path / "net"
    net = ["simulate", *RUN, "--replicas", "2", "--out", str(out)]
    assert main(net) == 0
    notes = out / "servers" / "my_notes"
    notes.mkdir()
    (notes / "summary.json").write_text('{"note": "mine"}')
    (notes / "requests.csv").write_text("mine\n")
    single = ["simulate", *RUN, "--out", str(out)]
    for argv in (net, single):  # a rerun, or a single-server run that clears the network's servers/
        one_line_error(capsys, argv, "servers/ holds 'my_notes/requests.csv'", "not a network replica's")
    with pytest.raises(ConfigError, match="servers/ holds 'my_notes/requests.csv'"):
        llmsched.simulate_network(str(tmp_path / "no-such-network.yaml"), out_dir=out)  # before the network is read
    with pytest.raises(ConfigError, match="servers/ holds 'my_notes/requests.csv'"):
        llmsched.simulate(cost_model="paper", num_requests=5, out_dir=out)
    assert (notes / "summary.json").read_text() == '{"note": "mine"}' and (notes / "requests.csv").is_file()
    # a folder of the user's other files is left as it is, by a rerun and by a clearing run
    (notes / "summary.json").unlink()
    (notes / "requests.csv").unlink()
    (notes / "notes.txt").write_text("mine\n")
    assert main(net) == 0 and main(single) == 0
    assert sorted(str(p.relative_to(out / "servers")) for p in (out / "servers").rglob("*")) == [
        "my_notes",
        "my_notes/notes.txt",
    ]
