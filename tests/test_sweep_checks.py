"""A sweep's point keys stamp the named datasets they read, and what `simulate` refuses
stops a sweep before any run (exit 2, one line, no results folder)."""

import json

import pytest

from llmsched.analysis import sweep
from llmsched.analysis.points import point_key, resolve_point
from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError

BASE = dict(cost_model="paper", prompt="geometric:200", output="geometric:101", num_requests=600)
CLI = ["--cost-model", "paper", "--prompt", "geometric:200", "--output", "geometric:101"]


# -- 3. named datasets are stamped in the key ------------------------------------------


def test_a_named_dataset_is_part_of_the_key(tmp_path, monkeypatch):
    folders = []
    for i, n in enumerate((20, 30)):
        d = tmp_path / f"traces{i}" / "sharegpt_lengths"
        d.mkdir(parents=True)
        rows = ["num_prefill_tokens,num_decode_tokens", *(f"{10 + j + i},{5 + j}" for j in range(n))]
        (d / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv").write_text("\n".join(rows) + "\n")
        folders.append(str(tmp_path / f"traces{i}"))
    keys = []
    for f in folders:
        monkeypatch.setenv("LLMSCHED_TRACES", f)
        cfg = resolve_point(None, {**BASE, "prompt": "sharegpt", "output": "sharegpt"}, {"rate": 1.0})
        keys.append(point_key(cfg))
    assert keys[0] != keys[1]
    # and a resumed sweep reruns the point against the other folder's file
    out = tmp_path / "out"
    for f, ran in ((folders[0], 1), (folders[1], 1), (folders[1], 0)):
        monkeypatch.setenv("LLMSCHED_TRACES", f)
        fixed = {**BASE, "prompt": "sharegpt", "output": "sharegpt", "num_requests": 50}
        res = run_sweep(None, {"rate": [1.0]}, out_dir=out, workers=1, progress=False, plots=False, **fixed)
        assert res.ran == ran


# -- 5. what simulate refuses stops a sweep before any run ------------------------------


@pytest.mark.parametrize(
    "files, args, msg",
    [
        ({"bad.csv": "a,b\n1,2\n"}, ["--trace", "bad.csv"], "not a trace in a known format"),
        (
            {"neg.csv": "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-3,5\n"},
            ["--trace", "neg.csv"],
            "-3 tokens is below the minimum",
        ),
        (
            {"lens.csv": "prompt_tokens,output_tokens\nx,y\n"},
            [*CLI[:2], "--prompt", "empirical:lens.csv", "--output", "geometric:11"],
            "malformed",
        ),
        ({}, [*CLI[:6], "--sample-interval", "1e-9"], "at least 1 microsecond"),
        ({}, [*CLI[:6], "--grid", "slo=ttft_ms=100"], "slo must be a mapping"),
    ],
)
def test_bad_inputs_stop_a_sweep_before_any_run(tmp_path, monkeypatch, capsys, files, args, msg):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    calls = []
    monkeypatch.setattr(sweep, "run_point", lambda cfg: calls.append(cfg) or {"wall_s": 0.0})
    grid = [] if "--grid" in args else ["--grid", "policy=sarathi,orca"]
    argv = ["sweep", *args, *grid, "--num-requests", "50", "--workers", "1", "--no-plots", "--out", "out"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and msg in err and "Traceback" not in err
    assert calls == [] and not (tmp_path / "out").exists()


# -- a profile folder's tables are stamped in the key --------------------------------------


def test_a_changed_table_in_a_profile_folder_changes_the_key(tmp_path):
    """`profile:FOLDER` read its tables for lambda* but the key stamped single files only:
    a resumed sweep kept the point measured with the old tables."""
    import os
    import shutil
    from pathlib import Path

    import llmsched
    from llmsched.workload.datasets import file_stamps

    src = Path(llmsched.__file__).parent / "data" / "profiles" / "h200"
    prof = tmp_path / "prof"
    shutil.copytree(src, prof)
    cfg = resolve_point(None, {**BASE, "cost_model": f"profile:{prof}"}, {"rate": 1.0})
    before = point_key(cfg)
    table = prof / "step.csv"
    st = table.stat()
    os.utime(table, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert point_key(cfg) != before
    # a #MODEL suffix names the same folder
    stamped = {p for p, *_ in file_stamps({"cost_model": f"profile:{prof}#some-model,tp=1"})}
    assert str(table.resolve()) in stamped


def test_one_file_by_another_path_is_one_point(tmp_path, monkeypatch):
    """A point's key held its files' paths as given: the same trace as `t.csv` and as
    `./t.csv` (or from another folder) was two points, and a resumed sweep ran it again."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,5\n1,30,5\n")
    (tmp_path / "d" / "p.csv").write_text("prompt_tokens\n10\n20\n")
    monkeypatch.chdir(tmp_path / "d")
    paths = ["t.csv", "./t.csv", str(tmp_path / "d" / "t.csv"), "../d/t.csv"]
    keys = {point_key(resolve_point(None, {"cost_model": "paper", "trace": p}, {})) for p in paths}
    laws = ["empirical:p.csv", "empirical:./p.csv:prompt_tokens", "empirical:p.csv:prompt_tokens"]
    law_keys = [point_key(resolve_point(None, {**BASE, "prompt": law}, {"rate": 1.0})) for law in laws]
    assert len(keys) == 1 and law_keys[1] == law_keys[2] != law_keys[0]
    out = tmp_path / "out"
    fixed = {"cost_model": "paper"}
    for trace, ran in (("t.csv", 1), ("./t.csv", 0)):
        res = run_sweep(
            None, {"policy": ["sarathi"]}, out_dir=out, workers=1, progress=False, plots=False, trace=trace, **fixed
        )
        assert res.ran == ran
    monkeypatch.chdir(tmp_path)
    res = run_sweep(
        None, {"policy": ["sarathi"]}, out_dir=out, workers=1, progress=False, plots=False, trace="d/t.csv", **fixed
    )
    assert res.ran == 0
    # the point's record keeps the path as it was given
    (record,) = (out / "points").glob("*.json")
    assert json.loads(record.read_text())["config"]["workload"]["trace"] == "t.csv"


def test_a_seed_given_as_a_whole_float_is_the_same_point(tmp_path):
    out = tmp_path / "out"
    for seed, ran in ((1, 1), (1.0, 0)):
        fixed = {**BASE, "num_requests": 100}
        res = run_sweep(None, {"seed": [seed]}, out_dir=out, workers=1, progress=False, plots=False, **fixed)
        assert res.ran == ran


# -- a fixed policy option over a grid of policies ------------------------------------------


def test_a_fixed_admission_option_goes_to_the_grids_policies_that_take_it(tmp_path, capsys):
    """`--grid admission=fcfs,twp --admission-option alpha=0.3` stopped at the FCFS point
    (`fcfs: unknown option 'alpha'`): the option is TWP's; each point records its own."""
    out = tmp_path / "sw"
    argv = ["sweep", *CLI, "--num-requests", "20", "--grid", "admission=fcfs,twp", "--admission-option", "alpha=0.3"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plots"]) == 0
    ran = {}
    for f in (out / "points").glob("*.json"):
        c = json.loads(f.read_text())["config"]
        ran[c["admission"]] = c["admission_options"]
    assert ran == {"fcfs": {}, "twp": {"alpha": 0.3}}
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and '"{""alpha"": 0.3}"' in rows[2]
    # the FCFS point is the one a sweep without the option runs: it resumes from it
    res = run_sweep(None, {"admission": ["fcfs"]}, out_dir=out, workers=1, plots=False, **{**BASE, "num_requests": 20})
    assert (res.ran, res.skipped) == (0, 1)
    # an option no policy of the grid takes: one line before any point runs
    bad = tmp_path / "bad"
    assert main([*argv[:-4], "--grid", "admission=fcfs,spf", "--admission-option", "alpha=0.3", "--out", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "llmsched sweep: error: admission_options 'alpha': no admission policy of the grid takes it (fcfs, spf)"
    ]
    assert not bad.exists()


def test_a_fixed_policy_option_goes_to_the_grids_policies_that_take_it():
    cfgs = {
        p: resolve_point(None, {**BASE, "policy_options": {"cost": "paper"}}, {"policy": p})
        for p in ("sarathi", "adaptive")
    }
    assert cfgs["sarathi"].policy_options == {} and cfgs["adaptive"].policy_options == {"cost": "paper"}
    with pytest.raises(ConfigError, match="policy_options 'cost': no batch policy of the grid takes it"):
        run_sweep(None, {"policy": ["sarathi", "orca"]}, plots=False, policy_options={"cost": "paper"}, **BASE)


def test_a_fixed_option_reaches_a_policy_that_takes_it_as_a_parameter_beside_its_options_list():
    """A factory listing `OPTIONS` and taking another keyword: simulate took the keyword,
    the sweep read only the list (refused it, or dropped it from the points)."""
    from llmsched.policies import ADMISSION_POLICIES, FCFS, register_admission_policy, takes_option

    def mine(itl_target_ms=None, y=1):
        return FCFS()

    mine.OPTIONS = ("itl_target_ms",)
    register_admission_policy("listed-test", mine)
    try:
        assert takes_option("admission", "listed-test", "y") and takes_option(
            "admission", "listed-test", "itl_target_ms"
        )
        assert not takes_option("admission", "listed-test", "z")
        assert not takes_option("admission", "twp", "y")  # lists its options, takes **options: the list decides
        cfg = resolve_point(None, {**BASE, "admission_options": {"y": 2}}, {"admission": "listed-test"})
        assert cfg.admission_options == {"y": 2}
        assert (
            resolve_point(None, {**BASE, "admission_options": {"y": 2}}, {"admission": "fcfs"}).admission_options == {}
        )
    finally:
        ADMISSION_POLICIES.pop("listed-test", None)
