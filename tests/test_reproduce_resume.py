"""`reproduce stability`: an interrupted run resumes, one lambda* per row whatever the
seeds, and a refused option leaves no folder behind."""

import json
import shutil

import pytest

from llmsched.analysis import reproduce_networks, reproduce_twp, sweep
from llmsched.analysis.reproduce import reproduce_stability
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.paths import check_run_dir, mark_reproduce_search

QUICK = dict(quick=True, policies=["sarathi"], workers=1, progress=False)


def _records(folder):
    return sorted(p.name for p in (folder / "search" / "points").glob("*.json"))


def test_an_interrupted_stability_run_resumes_with_its_probes(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the search left search/points/ (and, before, queue.png) without the
    table.json written last: the rerun was refused ('not a finished run's output'),
    though the module and docs/stability.md say a rerun reuses the probes."""
    run, calls = sweep.run_point, []

    def stop_at_fourth(cfg):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(cfg)
        return run(cfg)

    d = tmp_path / "ki"
    monkeypatch.setattr(sweep, "run_point", stop_at_fourth)
    with pytest.raises(KeyboardInterrupt):
        reproduce_stability(out_dir=d, **QUICK)
    done = _records(d)
    assert len(done) == 3 and not (d / "table.json").exists()
    # the state an interrupted run of the earlier order left: queue.png before the search
    (d / "queue.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    check_run_dir(d, "reproduce stability")

    calls.clear()
    monkeypatch.setattr(sweep, "run_point", lambda cfg: calls.append(cfg) or run(cfg))
    res = reproduce_stability(out_dir=d, **QUICK)
    probes = res["rows"][0]["max_stable_rate"] is not None and _records(d)
    assert set(done) <= set(probes)
    assert len(calls) == len(probes) - 3  # the three finished probes are not run again
    assert (d / "table.json").is_file() and (d / "queue.png").stat().st_size > 100
    # and from the command line, the folder of a run interrupted before its first probe
    e = tmp_path / "early"
    (e / "search" / "points").mkdir(parents=True)
    calls.clear()
    argv = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--workers", "1", "--out", str(e)]
    assert main([*argv, "--no-progress"]) == 0
    assert len(calls) == len(_records(e)) > 0


@pytest.mark.parametrize(
    "mine",
    [
        {"queue.png": "mine"},
        {"queue.png": "mine", "search/notes.txt": "mine"},
        {"queue.png": "mine", "search/points/notes.txt": "mine"},
        {"queue.png": "mine", "search/points/a.json": '{"x": 1}'},
        {"table.csv": "mine", "search/points/a.json": '{"key": "b", "config": {}, "summary": {}}'},
    ],
)
def test_a_folder_of_the_users_files_is_still_refused(tmp_path, capsys, mine):
    d = tmp_path / "d"
    for name, text in mine.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    argv = ["reproduce", "stability", "--quick", "--policies", "sarathi", "--out", str(d)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) == sorted(mine)
    assert all((d / n).read_text() == t for n, t in mine.items())


def test_a_search_link_proves_nothing(tmp_path):
    real = tmp_path / "elsewhere"
    (real / "points").mkdir(parents=True)
    d = tmp_path / "d"
    d.mkdir()
    (d / "queue.png").write_text("mine")
    (d / "search").symlink_to(real)
    with pytest.raises(ConfigError):
        check_run_dir(d, "reproduce stability")


def test_seeds_not_starting_at_0_give_one_critical_rate_per_row(tmp_path):
    """--seeds 1: critical_rate was seed 1's lambda*, max_stable_load that of seed 0
    (which ran nowhere), so rate / critical_rate != load."""
    res = reproduce_stability(out_dir=tmp_path / "s1", seeds=[1], **QUICK)
    row = res["rows"][0]
    assert row["max_stable_rate"] / row["critical_rate"] == pytest.approx(row["max_stable_load"], rel=1e-12)
    r0 = reproduce_stability(out_dir=tmp_path / "s0", seeds=[0], **QUICK)["rows"][0]
    assert row["critical_rate"] != r0["critical_rate"]  # the seeds' samples differ


def test_a_sweep_search_takes_lambda_star_of_its_first_seed(tmp_path):
    from llmsched.analysis.points import critical_rate_of, resolve_point

    kw = dict(cost_model="paper", b_max=512, prompt="geometric:200", output="geometric:101", num_requests=300)
    res = sweep.max_stable_rate(policies=["sarathi"], seeds=[1, 2], tol=0.3, progress=False, **kw)
    lam1 = critical_rate_of(resolve_point(None, kw, {"seed": 1, "policy": "sarathi"}))
    lam0 = critical_rate_of(resolve_point(None, kw, {"seed": 0, "policy": "sarathi"}))
    assert lam1 != lam0
    assert res[0]["critical_rate"] == pytest.approx(lam1, rel=1e-12)


@pytest.mark.parametrize("policy", ["foo", "sarathi:foo=1", "adaptive:cost=nope"])
def test_a_refused_policy_leaves_no_folder(tmp_path, capsys, policy):
    d = tmp_path / "a" / "bf"
    argv = ["reproduce", "stability", "--quick", "--policies", policy, "--out", str(d)]
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda d: reproduce_networks.reproduce_clusters(out_dir=d, quick=True, cost_model="nope"),
        lambda d: reproduce_networks.reproduce_clusters(out_dir=d, quick=True, policy="foo"),
        lambda d: reproduce_networks.reproduce_agents(out_dir=d, quick=True, cost_model="nope"),
        lambda d: reproduce_networks.reproduce_rybko_stolyar(out_dir=d, quick=True, orders=["foo"]),
        lambda d: reproduce_networks.reproduce_rybko_stolyar(out_dir=d, quick=True, scan_loads=[-1]),
        lambda d: reproduce_twp.reproduce_twp(out_dir=d, quick=True, stability_loads=[-1]),
        lambda d: reproduce_twp.reproduce_twp(out_dir=d, quick=True, k_max=-1),
        lambda d: reproduce_twp.reproduce_twp(out_dir=d, quick=True, slo_targets_ms=[-1]),
    ],
)
def test_other_experiments_leave_no_folder_on_a_refusal(tmp_path, call):
    d = tmp_path / "a" / "out"
    with pytest.raises(ConfigError):
        call(d)
    assert not (tmp_path / "a").exists()


def test_the_interrupted_folder_is_kept_when_refused_for_a_stray(tmp_path):
    """A stray beside the probes: refused, and nothing is removed."""
    d = tmp_path / "d"
    reproduce_stability(out_dir=d, **QUICK)
    (d / "table.json").unlink()
    (d / "notes.txt").write_text("mine")
    shutil.copy(d / "table.csv", d / "search" / "mine.csv")
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    with pytest.raises(ConfigError, match="mine.csv"):
        reproduce_stability(out_dir=d, **QUICK)
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before
    json.loads((d / "search" / "search.json").read_text())


def test_a_users_own_sweep_in_search_is_not_taken_over(tmp_path, capsys):
    """`sweep --out X/search`, then `reproduce stability --out X`: X/search/points/ read as an
    interrupted stability run's probes, and the run replaced that sweep's results.csv (and
    removed its figures). A finished sweep in an unmarked folder is the user's: refused."""
    d = tmp_path / "x"
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "40", "--grid", "seed=0", "--quiet"]
    assert main([*argv, "--out", str(d / "search")]) == 0
    before = {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"search/ holds a finished sweep \(its results.csv\)"):
        reproduce_stability(out_dir=d, **QUICK)
    assert {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    # a stability run's own search, stopped before its tables (the sweep's files are there
    # too): its mark says whose it is, and the rerun resumes it
    e = tmp_path / "e"
    reproduce_stability(out_dir=e, **QUICK)
    (e / "table.json").unlink()
    mark_reproduce_search(e, "reproduce stability")
    assert (e / "search" / "results.csv").is_file()
    assert reproduce_stability(out_dir=e, **QUICK)["rows"][0]["max_stable_rate"] is not None
