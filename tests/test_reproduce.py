"""`llmsched reproduce stability --quick` and the counterexample search."""

import json

import pytest

from llmsched.analysis.counterexample import find_counterexample
from llmsched.analysis.reproduce import reproduce_stability
from llmsched.cli import main
from llmsched.core.errors import ConfigError


def test_reproduce_stability_quick(tmp_path):
    res = reproduce_stability(quick=True, out_dir=tmp_path, workers=2, progress=False)
    rows = {r["policy"]: r for r in res["rows"]}
    assert set(rows) == {"fastertransformer", "vllm", "orca", "sarathi", "kfcfs"}
    # below the bound (load 0.9): the non-work-conserving queues grow, the others do not
    assert rows["fastertransformer"]["stable_at_load"] is False
    assert rows["vllm"]["stable_at_load"] is False
    for p in ("orca", "sarathi", "kfcfs"):
        assert rows[p]["stable_at_load"] is True, p
    lam = res["critical_rate"]
    assert rows["fastertransformer"]["max_stable_rate"] < 0.5 * lam
    assert rows["sarathi"]["max_stable_rate"] > rows["fastertransformer"]["max_stable_rate"]
    for f in ("queue.png", "table.csv", "table.json"):
        assert (tmp_path / f).is_file()
    saved = json.loads((tmp_path / "table.json").read_text())
    assert saved["meta"]["cost_model"] == "paper" and len(saved["rows"]) == 5


def test_reproduce_cli_no_search(tmp_path, capsys):
    assert (
        main(
            [
                "reproduce",
                "stability",
                "--quick",
                "--no-search",
                "--workers",
                "1",
                "--policies",
                "fastertransformer,sarathi",
                "--out",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [r["stable_at_load"] for r in out["rows"]] == [False, True]
    # requests in the system at the run's end: arrived - completed, whole numbers
    ft, sarathi = (r["in_system_at_end"] for r in out["rows"])
    assert isinstance(ft, int) and isinstance(sarathi, int) and ft > 10 * max(sarathi, 1)
    assert main(["reproduce", "stability", "--load", "-1", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("load", ["-1", "50"])
def test_stability_load_out_of_range_names_the_range(load, tmp_path, capsys):
    """--load 50 was refused as 'must be a positive fraction': it is positive; the bound is 10."""
    assert main(["reproduce", "stability", "--quick", "--load", load, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    want = "load must be a fraction of the critical rate above 0 and below 10"
    assert err == f"llmsched reproduce: error: {want}, got {float(load)}"


def test_counterexample_search_confirms_one():
    res = find_counterexample(
        "paper",
        512,
        16,
        load=0.85,
        candidates=[("const:200", "const:101"), ("const:1024", "const:128")],
        num_requests=2500,
        seeds=(0,),
        workers=1,
    )
    assert res["found"]
    assert res["workload"] == {
        "prompt": "const:1024",
        "output": "const:128",
        "mean_prompt": 1024.0,
        "mean_output": 128.0,
    }
    assert res["scale"] > 1.15 and res["margin"] > 0.15
    assert res["runs"][0]["stable"] is False and res["adaptive"][0]["stable"] is True
    first = res["tried"][0]
    assert first["outcome"] == "sarathi stable on seed 0"


def test_counterexample_search_refuses_runs_it_cannot_judge_and_says_inconclusive(capsys):
    """An unknown policy or no requests ran every candidate with an error and reported "no
    counterexample"; an inconclusive verdict read "stable on some seed"."""
    from helpers import one_line_error

    base = ["capacity", "--cost-model", "paper", "--k-max", "16", "--find-counterexample", "--workers", "1"]
    one_line_error(capsys, [*base, "--policy", "foo"], "unknown batch policy 'foo'")
    one_line_error(capsys, [*base, "--num-requests", "0"], "num_requests must be a whole number >= 1")
    one_line_error(capsys, [*base, "--seeds", "0,0"], "seeds must differ")
    res = find_counterexample(
        "paper", 512, 16, candidates=[("const:1024", "const:128")], num_requests=40, seeds=(0,), workers=1
    )
    assert not res["found"]
    assert res["tried"][0]["outcome"].startswith("sarathi inconclusive on seed 0")


def test_reproduce_no_search_refuses_the_search_settings(tmp_path, capsys):
    # --no-search with --search-requests/--tol exited 0 and recorded them in table.json
    # as if a search had run
    base = ["reproduce", "stability", "--quick", "--no-search", "--workers", "1", "--out", str(tmp_path / "r")]
    for extra, flag in ((["--search-requests", "5"], "--search-requests"), (["--tol", "0.5"], "--tol")):
        assert main([*base, *extra, "--seeds", "3"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag in err and "--no-search" in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="no effect with search=False"):
        reproduce_stability(quick=True, search=False, tol=0.5, out_dir=tmp_path / "api", workers=1)
    assert not (tmp_path / "api").exists()


def test_reproduce_stability_refuses_a_policy_given_twice(tmp_path):
    from llmsched.core.errors import ConfigError

    with pytest.raises(ConfigError, match="policy 'orca' is given twice"):
        reproduce_stability(quick=True, out_dir=tmp_path / "o", policies=["orca", "sarathi", "orca"])
    # in another case or by an alias it is the same policy (the CLI's --policies says so too)
    with pytest.raises(ConfigError, match="policy 'orca' is given twice"):
        reproduce_stability(quick=True, out_dir=tmp_path / "o", policies=["orca", "sarathi", "ORCA"])
    with pytest.raises(ConfigError, match="policy 'fastertransformer' is given twice"):
        reproduce_stability(quick=True, out_dir=tmp_path / "o", policies=["fastertransformer", "FT"])
    with pytest.raises(ConfigError, match="at least one policy"):
        reproduce_stability(quick=True, out_dir=tmp_path / "o", policies=[])
    assert not (tmp_path / "o").exists()


def test_a_search_with_no_stable_probe_shows_below_the_lowest_rate():
    """FasterTransformer's max stable rate printed as 0.000, as if found; the sweep's SLO
    column already said `< rate`. A search's row now holds the bound, flagged."""
    from llmsched.cli.analysis import _mark_bounds

    r = {"max_stable_rate": 0.871, "max_stable_load": 0.0781, "max_stable_upper_bound": True}
    _mark_bounds(r)
    assert r["max_stable_rate"] == "< 0.871" and r["max_stable_load"] == "< 0.078"
    r = {"max_stable_rate": 1.0, "max_stable_load": None, "max_stable_upper_bound": True}
    _mark_bounds(r)
    assert r["max_stable_rate"] == "< 1.000" and r["max_stable_load"] is None
    found = {"max_stable_rate": 7.8, "unstable_rate": 8.0, "max_stable_upper_bound": False}
    _mark_bounds(found)
    assert found["max_stable_rate"] == 7.8


def test_the_table_flags_a_max_stable_rate_that_is_a_bound(tmp_path):
    """With no probe stable, table.csv and table.json held max_stable_rate 0.0 while the
    terminal showed `< 0.871`: they hold the bound now, with `max_stable_upper_bound`
    true (sweep's search.csv flags the other bound, `max_stable_lower_bound`)."""
    import csv
    import json

    res = reproduce_stability(quick=True, policies=["fastertransformer", "sarathi"], out_dir=tmp_path, workers=1)
    rows = {r["policy"]: r for r in res["rows"]}
    ft, sarathi = rows["fastertransformer"], rows["sarathi"]
    assert ft["max_stable_upper_bound"] is True and ft["max_stable_lower_bound"] is False
    assert ft["max_stable_rate"] == ft["unstable_rate"] > 0  # FT's first probe: unstable
    assert ft["max_stable_load"] == pytest.approx(ft["max_stable_rate"] / ft["critical_rate"])
    assert sarathi["max_stable_upper_bound"] is False and 0 < sarathi["max_stable_rate"] < sarathi["unstable_rate"]
    with open(tmp_path / "table.csv") as f:
        saved = {r["policy"]: r for r in csv.DictReader(f)}
    assert saved["fastertransformer"]["max_stable_upper_bound"] == "True"
    assert float(saved["fastertransformer"]["max_stable_rate"]) == pytest.approx(ft["max_stable_rate"])
    assert json.loads((tmp_path / "table.json").read_text())["rows"][0]["max_stable_upper_bound"] is True
    res = reproduce_stability(quick=True, policies=["sarathi"], search=False, out_dir=tmp_path / "n", workers=1)
    (row,) = res["rows"]
    assert row["max_stable_rate"] is None and row["max_stable_upper_bound"] is None


def test_the_azure_table_divides_by_its_own_lambda(tmp_path):
    """On a trace lambda* depends on how many of its requests are drawn: the search's probes
    (1,500 requests in --quick) had 22.24 req/s, the table's queue runs (10,000) 20.75, and
    max_stable_load was the search's share (0.781) beside the table's lambda* (17.37 / 20.75
    is 0.837). The table's load is of its own lambda*; the search's is kept apart."""
    res = reproduce_stability(quick=True, workload="azure", policies=["sarathi"], out_dir=tmp_path, workers=1)
    (row,) = res["rows"]
    assert row["max_stable_load"] == pytest.approx(row["max_stable_rate"] / row["critical_rate"])
    assert row["search_critical_rate"] != pytest.approx(row["critical_rate"])  # (the case at issue)
