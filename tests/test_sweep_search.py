"""The rate search's reading of probes: failed probes decide nothing, the first unstable
rate is a rate judged unstable (never an inconclusive one), and each probed (point,
rate) is one row of results.csv. Runs are replaced by a fake with a known boundary."""

import csv
import json

import pytest
from helpers import fake_summary

from llmsched.analysis import sweep
from llmsched.analysis.points import critical_rate_of, resolve_point
from llmsched.analysis.search import FAILED, INCONCLUSIVE, STABLE, UNSTABLE, Bracket, probe_verdict
from llmsched.analysis.sweep import run_sweep
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec

FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=300)
CLI_FIXED = ["--cost-model", "paper", "--b-max", "128", "--prompt", "geometric:40", "--output", "geometric:21"]
CLI_FIXED += ["--num-requests", "300", "--workers", "1", "--no-plots"]
TOL = 0.05


@pytest.fixture(scope="module")
def lam():
    """lambda* of the search's group, as the search computes it."""
    return critical_rate_of(resolve_point(None, FIXED, {"policy": "sarathi"}))


def fake_runs(monkeypatch, verdict_at):
    """Replace the simulation: `verdict_at(rate)` is stable, unstable, inconclusive or
    failed; a stable run meets a p99 TTFT of 100 ms, an unstable one does not."""
    calls = []

    def run(cfg: dict) -> dict:
        rate = cfg["workload"]["rate"]
        calls.append(rate)
        v = verdict_at(rate)
        if v == FAILED:
            return {"error": "RuntimeError: boom", "wall_s": 0.0}
        stable = {STABLE: True, UNSTABLE: False, INCONCLUSIVE: None}[v]
        return fake_summary(stable=stable, verdict=v, p99_ttft_ms=100.0 if stable else 1e5)

    monkeypatch.setattr(sweep, "run_point", run)
    return calls


def search(tmp_path, **kw):
    grid = {"policy": ["sarathi"], "seed": [0, 1]}
    return run_sweep(
        None,
        grid,
        out_dir=tmp_path,
        workers=1,
        search="max-stable-rate",
        tol=TOL,
        progress=False,
        plots=False,
        **FIXED,
        **kw,
    )


def results(tmp_path) -> list[dict]:
    with open(tmp_path / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_failed_probe_is_not_unstable_and_stops_its_search(tmp_path, monkeypatch, lam):
    # stable below 0.5 lambda*, unstable above 0.7, and runs fail in between: the first
    # midpoint (0.625 lambda*) fails; read as unstable, the search went on below it
    def verdict_at(rate):
        return STABLE if rate <= 0.5 * lam else UNSTABLE if rate >= 0.7 * lam else FAILED

    fake_runs(monkeypatch, verdict_at)
    res = search(tmp_path)
    (row,) = res.search
    # nothing below the failed probe was tried on its account
    assert sorted({float(r["rate"]) for r in results(tmp_path)}) == pytest.approx([0.625 * lam, 1.25 * lam])
    assert row["failed_rate"] == pytest.approx(0.625 * lam)
    assert row["max_stable_rate"] is None and row["max_stable_load"] is None and row["unstable_rate"] is None
    assert row["probes"] == 2 and res.errors == 2  # both seeds of the failed probe
    assert json.loads((tmp_path / "search.json").read_text())[0]["failed_rate"] == pytest.approx(0.625 * lam)


def test_the_cli_shows_a_failed_probe_and_exits_1(tmp_path, monkeypatch, capsys, lam):
    fake_runs(monkeypatch, lambda rate: FAILED if rate > 0.9 * lam else STABLE)
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--out", str(tmp_path)]
    assert main([*argv, "--slo", "p99_ttft_ms=1000"]) == 1
    cap = capsys.readouterr()
    assert "failed probe" in cap.out and "stopped at a failed probe (rate " in cap.out
    assert len(cap.err.strip().splitlines()) == 1 and "1 of 1 points failed" in cap.err
    (row,) = json.loads((tmp_path / "search.json").read_text())
    assert row["max_stable_rate"] is None and row["max_slo_rate"] is None


def test_the_first_unstable_rate_is_judged_unstable_not_inconclusive(tmp_path, monkeypatch, lam):
    # stable up to 0.6 lambda*, inconclusive up to 0.9 (a queue too close to criticality
    # for the run's length), unstable above: the old search called 0.625 "first unstable"
    def verdict_at(rate):
        return STABLE if rate <= 0.6 * lam else INCONCLUSIVE if rate < 0.9 * lam else UNSTABLE

    fake_runs(monkeypatch, verdict_at)
    res = search(tmp_path)
    (row,) = res.search
    assert verdict_at(row["unstable_rate"]) == UNSTABLE
    assert row["failed_rate"] is None
    assert 0.6 * lam - TOL * lam <= row["max_stable_rate"] <= 0.6 * lam
    assert 0.9 * lam <= row["unstable_rate"] <= 0.9 * lam + TOL * lam
    # the inconclusive probes are reported as such, between the two edges
    assert row["max_stable_rate"] < row["inconclusive_low"] <= row["inconclusive_high"] < row["unstable_rate"]
    assert row["inconclusive_low"] - row["max_stable_rate"] <= TOL * lam + 1e-9
    assert row["unstable_rate"] - row["inconclusive_high"] <= TOL * lam + 1e-9
    by_rate = {}
    for r in results(tmp_path):
        by_rate.setdefault(float(r["rate"]), set()).add(r["verdict"])
    assert by_rate[row["unstable_rate"]] == {"unstable"}
    assert by_rate[row["inconclusive_low"]] == by_rate[row["inconclusive_high"]] == {"inconclusive"}
    assert row["inconclusive_probes"] == sum(v == {"inconclusive"} for v in by_rate.values())


def test_the_cli_labels_inconclusive_rates(tmp_path, monkeypatch, capsys, lam):
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else INCONCLUSIVE if rate < 0.9 * lam else UNSTABLE)
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--tol", str(TOL)]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads((tmp_path / "search.json").read_text())
    assert "inconclusive" in out and "first unstable" in out
    assert f"{row['inconclusive_low']:,.3f}-{row['inconclusive_high']:,.3f}" in out
    assert f"{row['unstable_rate']:,.3f}" in out


def non_monotone(lam):
    """Stable up to 0.5 lambda*, inconclusive to 0.6, unstable to 1.0, and inconclusive
    again above (a verdict that is not monotone in the rate): the upper end, 1.25, is
    inconclusive, then the midpoint 0.625 unstable."""
    return lambda rate: STABLE if rate <= 0.5 * lam else INCONCLUSIVE if rate <= 0.6 * lam or rate > lam else UNSTABLE


def test_inconclusive_rates_above_the_first_unstable_one_are_counted_apart(tmp_path, monkeypatch, lam):
    # the inconclusive range was every inconclusive rate: 0.51-1.25 lambda*, reaching past
    # the first unstable rate (0.625) instead of lying between the edges
    verdict_at = non_monotone(lam)
    fake_runs(monkeypatch, verdict_at)
    (row,) = search(tmp_path).search
    assert verdict_at(row["unstable_rate"]) == UNSTABLE and row["unstable_rate"] == pytest.approx(0.625 * lam)
    assert row["max_stable_rate"] < row["inconclusive_low"] <= row["inconclusive_high"] < row["unstable_rate"]
    assert row["unstable_rate"] - row["inconclusive_high"] <= TOL * lam + 1e-9
    inconclusive = sorted({float(r["rate"]) for r in results(tmp_path) if r["verdict"] == INCONCLUSIVE})
    below = [r for r in inconclusive if r < row["unstable_rate"]]
    assert (row["inconclusive_low"], row["inconclusive_high"]) == (below[0], below[-1])
    assert row["inconclusive_probes"] == len(below) == 3
    assert row["inconclusive_above_unstable"] == len(inconclusive) - len(below) == 1
    assert inconclusive[-1] == pytest.approx(1.25 * lam)


def test_the_cli_notes_inconclusive_rates_above_the_first_unstable_one(tmp_path, monkeypatch, capsys, lam):
    fake_runs(monkeypatch, non_monotone(lam))
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--tol", str(TOL)]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads((tmp_path / "search.json").read_text())
    assert f"{row['inconclusive_low']:,.3f}-{row['inconclusive_high']:,.3f}" in out
    assert f"1 probe above the first unstable rate ({row['unstable_rate']:.4g}) judged inconclusive" in out
    assert "inconclusive_above_unstable" not in out  # a count for search.csv, not a grid column


def test_monotone_verdicts_leave_nothing_above_the_first_unstable_rate(tmp_path, monkeypatch, lam):
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else INCONCLUSIVE if rate < 0.9 * lam else UNSTABLE)
    (row,) = search(tmp_path).search
    assert row["inconclusive_probes"] > 0 and row["inconclusive_above_unstable"] == 0


def test_no_unstable_probe_means_no_first_unstable_rate(tmp_path, monkeypatch, lam):
    # nothing is ever judged unstable: the search looks higher (the remaining widenings),
    # then reports no first unstable rate rather than an inconclusive one
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else INCONCLUSIVE)
    (row,) = search(tmp_path).search
    assert row["unstable_rate"] is None
    assert row["inconclusive_high"] == pytest.approx(1.25 * 1.5**4 * lam)
    assert 0.6 * lam - TOL * lam <= row["max_stable_rate"] <= 0.6 * lam


def test_an_slo_search_probe_run_again_is_one_row(tmp_path, monkeypatch, lam):
    calls = fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE)
    res = search(tmp_path, slo={"p99_ttft_ms": 1000})
    (row,) = res.search
    assert row["max_slo_rate"] == row["max_stable_rate"]  # the SLO search probed it again
    rows = results(tmp_path)
    points = [(r["policy"], r["seed"], r["rate"]) for r in rows]
    assert len(points) == len(set(points)) == len({r["key"] for r in rows}) == len(res.rows)
    assert res.ran == len(calls) == len(rows) and res.skipped == 0
    # a rerun finds every point finished, once each
    monkeypatch.setattr(sweep, "run_point", None)
    again = search(tmp_path, slo={"p99_ttft_ms": 1000})
    assert (again.ran, again.skipped) == (0, len(rows))
    assert results(tmp_path) == rows


def test_probe_verdict_over_seeds():
    def recs(*stable):
        return [{"summary": {"stable": s}} for s in stable]

    assert probe_verdict(recs(True, True)) == STABLE
    assert probe_verdict(recs(False, False)) == UNSTABLE
    assert probe_verdict(recs(True, False)) == INCONCLUSIVE  # seeds that disagree
    assert probe_verdict(recs(True, None)) == INCONCLUSIVE
    assert probe_verdict([*recs(False), {"summary": {"error": "x"}}]) == FAILED


def test_bracket_after_an_unstable_midpoint_keeps_one_edge():
    # 1.0 inconclusive, then the midpoint 0.5 unstable (verdicts not monotone): the
    # inconclusive 1.0 lies above the first unstable rate, so only one edge is left
    b = Bracket(0.0, 1.0, widenings=0)
    b.record(b.next_rate(0.1), INCONCLUSIVE)
    assert (b.hi, b.top, b.unstable) == (1.0, 1.0, None)
    b.record(b.next_rate(0.1), UNSTABLE)
    assert (b.hi, b.top, b.unstable) == (0.5, None, 0.5)
    while (r := b.next_rate(0.1)) is not None:
        b.record(r, STABLE)
    assert 0.4 <= b.lo < b.hi == b.unstable == 0.5


def test_a_search_with_the_verdict_off_is_refused(tmp_path, capsys):
    argv = ["sweep", *CLI_FIXED, "--grid", "verdict=false", "--search", "max-stable-rate", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verdict=false" in err[0]


def test_no_rate_meeting_the_slos_is_shown_as_below_the_first_miss(tmp_path, monkeypatch, capsys, lam):
    # stable up to 0.6 lambda*, but no stable run meets a p99 TTFT of 50 ms: the SLO search
    # finds no rate; its table says "below" the smallest rate probed that missed them
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE)
    res = search(tmp_path, slo={"p99_ttft_ms": 50})
    (row,) = res.search
    assert row["max_slo_rate"] == 0.0
    # the bisection narrowed it down from the max stable rate to within the tolerance of 0
    assert 0 < row["slo_miss_rate"] <= TOL * lam + 1e-9 < row["max_stable_rate"]
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--tol", str(TOL)]
    assert main([*argv, "--slo", "p99_ttft_ms=50", "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert f"< {row['slo_miss_rate']:,.3f}" in out and "0.000" not in out
    # a rate that meets them leaves no miss below it to report
    ok = search(tmp_path / "ok", slo={"p99_ttft_ms": 1000}).search[0]
    assert ok["max_slo_rate"] == pytest.approx(ok["max_stable_rate"]) and ok["slo_miss_rate"] is None


def test_no_stable_rate_is_an_upper_bound_and_misses_the_slos_there(tmp_path, monkeypatch, capsys, lam):
    # every probe unstable: the SLO search started from [0, 0], probed nothing, and the
    # table showed "max rate meeting SLOs = 0.000" (and / lambda* 0.000) as if found, with
    # slo_miss_rate empty; search.csv held max_stable_rate 0.0
    calls = fake_runs(monkeypatch, lambda rate: UNSTABLE)
    (row,) = search(tmp_path, slo={"p99_ttft_ms": 1000}).search
    probed = sorted(set(calls))
    assert row["max_slo_rate"] == 0.0 and row["max_slo_load"] == 0.0
    # the smallest rate judged not stable: it meets no SLO, and no rate is stable below it
    assert row["slo_miss_rate"] == probed[0] == row["unstable_rate"] <= TOL * lam + 1e-9
    # the max stable rate is that rate, an upper bound, flagged (as reproduce stability's table)
    assert row["max_stable_rate"] == probed[0] and row["max_stable_upper_bound"] is True
    assert row["max_stable_load"] == pytest.approx(probed[0] / lam)
    assert row["max_stable_lower_bound"] is False
    fake_runs(monkeypatch, lambda rate: UNSTABLE)
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--tol", str(TOL)]
    assert main([*argv, "--slo", "p99_ttft_ms=1000", "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    table = out.split("note:")[0]
    assert "0.000" not in table and table.count(f"< {probed[0]:,.3f}") == 2, out
    assert table.count(f"< {probed[0] / lam:.3f}") == 2
    assert "max_stable_upper_bound" not in out  # a column of search.csv, not a grid key
    with open(tmp_path / "cli" / "search.csv", newline="") as f:
        saved = next(csv.DictReader(f))
    assert float(saved["max_stable_rate"]) == pytest.approx(probed[0]) and saved["max_stable_upper_bound"] == "True"
    assert float(saved["slo_miss_rate"]) == pytest.approx(probed[0])
    # a boundary found is no upper bound
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE)
    assert search(tmp_path / "found").search[0]["max_stable_upper_bound"] is False


def test_an_arrival_that_names_its_rate_is_searched_as_the_same_law_without_it(tmp_path, monkeypatch, lam):
    # poisson:5 (and the mapping form) name a rate: each probe's rate replaces it, as it
    # replaces --rate; it was refused as "rate given twice" at the first probe
    verdict = lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE  # noqa: E731
    fake_runs(monkeypatch, verdict)
    plain = search(tmp_path / "plain").search[0]
    for arrival in ("poisson:5", {"process": "poisson", "rate": 5}):
        fake_runs(monkeypatch, verdict)
        (row,) = search(tmp_path / str(len(str(arrival))), arrival=arrival).search
        assert row["max_stable_rate"] == pytest.approx(plain["max_stable_rate"])
        assert row["unstable_rate"] == pytest.approx(plain["unstable_rate"])


def test_a_points_rate_replaces_the_arrivals_own_and_keeps_its_other_parameters():
    cfg = resolve_point(None, {**FIXED, "arrival": "gamma:rate=5,cv=2"}, {"policy": "sarathi", "rate": 7.0})
    assert cfg.workload["rate"] == 7.0 and cfg.workload["cv"] == 2 and cfg.workload["arrival"] == "gamma"
    lam = critical_rate_of(cfg)
    cfg = resolve_point(None, {**FIXED, "arrival": "poisson:5"}, {"policy": "sarathi", "load": 0.5})
    assert cfg.workload["rate"] == pytest.approx(0.5 * lam) and cfg.workload["arrival"] == "poisson"
    # without a point's rate the arrival's own stands, and a --rate that differs is refused
    own = resolve_point(None, {**FIXED, "arrival": "poisson:5"}, {"policy": "sarathi"})
    assert WorkloadSpec.from_dict(own.workload).rate == 5
    with pytest.raises(ConfigError, match="rate given twice"):
        WorkloadSpec.from_dict(resolve_point(None, {**FIXED, "arrival": "poisson:5", "rate": 7}, {}).workload)


def test_a_search_stable_at_every_probe_reports_a_lower_bound(tmp_path, monkeypatch, capsys, lam):
    # every probe stable up to the widest upper end (0.1 x 1.5^4 lambda*): that ceiling was
    # reported as the max stable rate, with no note, as if a boundary had been found
    fake_runs(monkeypatch, lambda rate: STABLE)
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--search-hi", "0.1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads((tmp_path / "search.json").read_text())
    top = 0.1 * 1.5**4 * lam
    assert row["max_stable_rate"] == pytest.approx(top) and row["max_stable_lower_bound"] is True
    assert row["unstable_rate"] is None
    assert f">= {top:,.3f}" in out
    assert "note: every probe of sarathi was judged stable" in out and "lower bound" in out and "--search-hi" in out
    assert "max_stable_lower_bound" not in out  # a column of search.csv, not a grid key
    with open(tmp_path / "search.csv", newline="") as f:
        assert next(csv.DictReader(f))["max_stable_lower_bound"] == "True"


def test_a_search_that_finds_a_boundary_is_no_lower_bound(tmp_path, monkeypatch, capsys, lam):
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE)
    (row,) = search(tmp_path).search
    assert row["max_stable_lower_bound"] is False
    # a failed search has no answer, so no lower bound either
    fake_runs(monkeypatch, lambda rate: FAILED)
    (row,) = search(tmp_path / "failed").search
    assert row["max_stable_lower_bound"] is False


def test_a_search_without_a_grid_of_seeds_writes_the_seed_it_used(tmp_path, monkeypatch, lam):
    # the seed column was blank: the probes ran the configuration's seed (0, or --seed)
    fake_runs(monkeypatch, lambda rate: STABLE if rate <= 0.6 * lam else UNSTABLE)
    for seed, out in ((None, tmp_path / "a"), (3, tmp_path / "b")):
        kw = {} if seed is None else {"seed": seed}
        run_sweep(
            None, {"policy": ["sarathi"]}, out_dir=out, workers=1, search="max-stable-rate", tol=TOL, **FIXED, **kw
        )
        rows = results(out)
        assert rows and {r["seed"] for r in rows} == {str(seed or 0)}


def test_every_probe_inconclusive_is_no_answer_not_an_upper_bound(tmp_path, monkeypatch, capsys, lam):
    # every probe inconclusive: the row said max_stable_rate = the smallest rate probed
    # (tol * lambda*), flagged an upper bound, though no verdict says the max stable rate
    # lies below it
    calls = fake_runs(monkeypatch, lambda rate: INCONCLUSIVE)
    (row,) = search(tmp_path, slo={"p99_ttft_ms": 1000}).search
    assert row["unstable_rate"] is None and row["failed_rate"] is None
    assert row["max_stable_rate"] is None and row["max_stable_load"] is None
    assert row["max_stable_upper_bound"] is False and row["max_stable_lower_bound"] is False
    assert row["inconclusive_low"] == min(calls) and row["inconclusive_high"] == max(calls)
    # an inconclusive rate meets no SLO: the SLO search's miss stands
    assert row["max_slo_rate"] == 0.0 and row["slo_miss_rate"] == min(calls)
    fake_runs(monkeypatch, lambda rate: INCONCLUSIVE)
    argv = ["sweep", *CLI_FIXED, "--grid", "policy=sarathi", "--search", "max-stable-rate", "--tol", str(TOL)]
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    table = out.split("note:")[0]
    assert f"< {min(calls):,.3f}" not in table
    assert "judged stable or unstable" in out and "no answer" in out
    with open(tmp_path / "cli" / "search.csv", newline="") as f:
        saved = next(csv.DictReader(f))
    assert saved["max_stable_rate"] == "" and saved["max_stable_upper_bound"] == "False"
    (saved_json,) = json.loads((tmp_path / "cli" / "search.json").read_text())
    assert saved_json["max_stable_rate"] is None and saved_json["max_stable_upper_bound"] is False


def test_no_stable_probe_is_bounded_by_the_first_unstable_one(tmp_path, monkeypatch, lam):
    # inconclusive up to 0.9 lambda*, unstable above: the bound was the smallest rate
    # probed (inconclusive), not the first rate judged unstable
    fake_runs(monkeypatch, lambda rate: INCONCLUSIVE if rate < 0.9 * lam else UNSTABLE)
    (row,) = search(tmp_path).search
    assert row["inconclusive_low"] <= TOL * lam + 1e-9
    assert 0.9 * lam <= row["unstable_rate"] <= 0.9 * lam + TOL * lam
    assert row["max_stable_rate"] == row["unstable_rate"] and row["max_stable_upper_bound"] is True
    assert row["max_stable_load"] == pytest.approx(row["unstable_rate"] / lam)


def test_a_max_stable_rate_above_lambda_star_is_not_called_theorem_2s(capsys):
    """Under k_max 50 (const:100, prompts 200, outputs 101) lambda* is the region's 4.950
    req/s, not theorem 2's 17.07; a short search's stable 5.028 was 'above theorem 2's bound'."""
    from llmsched.cli.analysis import _print_search  # noqa: PLC0415

    row = {"policy": "adaptive", "critical_rate": 4.9505, "policy_critical_rate": 4.9505, "max_stable_rate": 5.028}
    row |= {"max_stable_load": 1.0156, "inconclusive_low": 5.221, "inconclusive_high": 5.221, "unstable_rate": 5.415}
    row |= {"inconclusive_probes": 1, "inconclusive_above_unstable": 0, "failed_rate": None, "probes": 6}
    _print_search([{**row, "max_stable_lower_bound": False, "max_stable_upper_bound": False}])
    out = capsys.readouterr().out
    assert "note: adaptive's max stable rate is above lambda*, which no policy" in out and "theorem 2" not in out
