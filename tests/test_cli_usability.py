"""What a new user walking through the README tripped over: SLO names that differ between
`simulate` and `sweep`, help that hid how a trace replays, a dataset-not-found message
naming unset variables and one folder twice, a mislabelled lambda*, unknown flags refused
without the command's name or a suggestion, a `written:` line that left files out, and
numpy scalars in the network report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

import llmsched
from llmsched.analysis.grid import parse_slo
from llmsched.analysis.sweep import max_stable_rate
from llmsched.cli import build_parser, main
from llmsched.core.errors import ConfigError
from llmsched.core.slo import REQUEST_SLO_ALIASES, REQUEST_SLO_KEYS, check_request_slo, check_run_slo_name
from llmsched.workload import datasets

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--cost-model", "paper", "--rate", "2", "--num-requests", "60", "--out", "", "--json"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------- 1. SLO names
def test_simulate_points_a_run_statistic_to_the_per_request_slo(capsys):
    """`p99_itl_ms` (sweep's: the p99 over every gap of the run) is not `itl_ms` (each
    request's mean gap): simulate refuses it, says whose name it is and which of its own
    names limits the request's ITL (it used to suggest `itl_ms` as a mere typo fix)."""
    assert main(["simulate", *SMALL, "--slo", "p99_itl_ms=80"]) == 2
    err = one_error_line(capsys)
    assert err.startswith("llmsched simulate: error: SLO 'p99_itl_ms' is a run's p99 over every inter-token gap")
    assert "llmsched sweep --search" in err and "itl_ms limits each request's mean inter-token gap" in err
    assert main(["simulate", *SMALL, "--slo", "p99_ttft_ms=3000"]) == 2
    assert "ttft_ms limits each request's TTFT" in one_error_line(capsys)
    assert main(["simulate", *SMALL, "--slo", "ttft_p99_ms=3000"]) == 2  # the other order: still a p99
    assert "is a run's p99 over the requests' TTFTs" in one_error_line(capsys)


def test_sweep_points_simulates_names_to_a_run_statistic(tmp_path, capsys):
    base = ["sweep", "--cost-model", "paper", "--grid", "policy=sarathi", "--search", "max-stable-rate"]
    assert main([*base, "--out", str(tmp_path / "s"), "--slo", "itl_p99_ms=100"]) == 2
    err = one_error_line(capsys)
    assert err.startswith("llmsched sweep: error: unknown SLO metric 'itl_p99_ms': that is simulate's per-request")
    assert "not a p99" in err and "p99_itl_ms (the p99 over every inter-token gap)" in err
    assert main([*base, "--out", str(tmp_path / "s"), "--slo", "ttft_ms=2000"]) == 2
    assert "p99_ttft_ms, or max_ttft_ms (every request within the limit)" in one_error_line(capsys)
    assert main([*base, "--out", str(tmp_path / "s"), "--slo", "ttft_p99_ms=2000"]) == 2
    assert "did you mean 'p99_ttft_ms'?" in one_error_line(capsys)
    assert not (tmp_path / "s").exists()


def test_python_api_and_yaml_take_the_same_names_as_the_commands(tmp_path, capsys):
    with pytest.raises(ConfigError, match="itl_ms limits each request's mean inter-token gap"):
        llmsched.simulate(cost_model="paper", rate=2, num_requests=20, slo={"p99_itl_ms": 80})
    with pytest.raises(ConfigError, match="p99_itl_ms"):
        max_stable_rate(policies=["sarathi"], slo={"itl_p99_ms": 100}, cost_model="paper", num_requests=50)
    with pytest.raises(ConfigError, match="p99_e2el_ms"):
        parse_slo({"e2el_ms": 100})
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cost_model: paper\nslo: {p99_itl_ms: 100}\n")
    assert main(["simulate", "--config", str(cfg), "--num-requests", "20", "--out", ""]) == 2
    assert "itl_ms limits each request's mean inter-token gap" in one_error_line(capsys)


def test_each_kind_accepts_all_its_names():
    for name in (*REQUEST_SLO_KEYS, *REQUEST_SLO_ALIASES):
        (key,) = check_request_slo({name: 50})
        assert key in REQUEST_SLO_KEYS
    assert check_request_slo({"itl_p99_ms": 50}) == {"itl_ms": 50.0}
    for stat in ("mean", "median", "std", "p90", "p95", "p99", "max"):
        for metric in ("ttft", "tpot", "itl", "e2el", "queue"):
            assert parse_slo([f"{stat}_{metric}_ms=5"]) == {f"{stat}_{metric}_ms": 5.0}
    assert parse_slo(["itl_cv=0.5"]) == {"itl_cv": 0.5}


def test_run_statistic_names_in_the_other_order_and_the_form_text_list_every_name():
    form = "STAT mean|median|std|p90|p95|p99|max and METRIC ttft|tpot|itl|e2el|queue, or itl_cv"
    with pytest.raises(ConfigError, match=re.escape(form)):
        check_run_slo_name("bogus")
    for stat in ("mean", "median", "std", "p90", "p95", "p99", "max"):
        for metric in ("ttft", "tpot", "itl", "e2el", "queue"):
            # itl_p99_ms is also simulate's old per-request name, refused with its own line
            with pytest.raises(ConfigError, match=re.escape(f"{stat}_{metric}_ms")):
                check_run_slo_name(f"{metric}_{stat}_ms")


def test_request_itl_is_the_request_tpot(capsys):
    """The per-request aliases mean exactly the same limit: `itl_ms`, its old name
    `itl_p99_ms` and `tpot_ms` (a request's mean gap is its TPOT) give the same goodput."""
    out = []
    for name in ("itl_ms", "itl_p99_ms", "tpot_ms"):
        assert main(["simulate", *SMALL, "--rate", "8", "--slo", f"{name}=140"]) == 0
        s = json.loads(capsys.readouterr().out)
        out.append((s["goodput"], s["goodput_share"]))
    assert out[0] == out[1] == out[2] and 0 < out[0][1] < 1


# ---------------------------------------------------------------------- 2. trace help
def _simulate_help(command: str = "simulate") -> dict[str, str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {o: a.help for a in sub._actions for o in a.option_strings}


def test_help_says_a_trace_ignores_the_rate_and_count_defaults():
    h = _simulate_help()
    assert "a trace keeps its own rate unless --rate is given" in h["--rate"]
    assert "a trace: all its requests unless given" in h["--num-requests"]
    assert "replays whole, at its own times and lengths" in h["--trace"]


def test_capacity_help_says_what_rate_and_num_requests_do_there():
    h = _simulate_help("capacity")
    assert "default: none" in h["--rate"] and "default 16" not in h["--rate"]
    assert "--find-counterexample (default 4000)" in h["--num-requests"]


def test_a_trace_replays_whole_at_its_own_times(tmp_path):
    """What that help says: 7 requests, 0.5 s apart, none of the defaults' 5000 at 16 req/s."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.5},10,5\n" for i in range(7)))
    r = llmsched.simulate(cost_model="paper", trace=str(trace), verdict=False)
    assert r.summary["num_requests"] == 7 and r.arrival_s.tolist() == [i * 0.5 for i in range(7)]
    r = llmsched.simulate(cost_model="paper", trace=str(trace), rate=4, num_requests=3, verdict=False)
    assert r.summary["num_requests"] == 3 and r.arrival_s[-1] - r.arrival_s[0] == pytest.approx(0.5)


# ---------------------------------------------------------------------- 3. dataset not found
def test_dataset_not_found_names_real_places_once(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.delenv("LLMSCHED_TRACES", raising=False)
    monkeypatch.chdir(repo)  # run from the repository root: ../shared/traces twice, once looked at
    monkeypatch.setattr(datasets, "_repo_root", lambda: repo)
    assert main(["simulate", "--prompt", "sharegpt", "--out", ""]) == 2
    err = one_error_line(capsys)
    shared = str(tmp_path / "shared" / "traces")
    assert "$LLMSCHED_TRACES" not in err and ".." not in err and err.count(shared) == 1, err
    assert err.endswith("set LLMSCHED_TRACES=DIR to the folder that holds sharegpt_lengths/")


def test_a_wrong_traces_variable_is_an_error_not_a_fallback(tmp_path, monkeypatch, capsys):
    """$LLMSCHED_TRACES naming a missing folder, or one without the dataset, fell back to
    ../shared/traces without a word."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shared = tmp_path / "shared" / "traces" / "sharegpt_lengths"
    shared.mkdir(parents=True)
    rows = "".join(f"{20 + i},{5 + i}\n" for i in range(30))
    (shared / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv").write_text(
        "num_prefill_tokens,num_decode_tokens\n" + rows
    )
    monkeypatch.chdir(repo)
    monkeypatch.setattr(datasets, "_repo_root", lambda: repo)
    argv = ["simulate", "--cost-model", "paper", "--prompt", "sharegpt", "--num-requests", "5", "--quiet", "--out", ""]
    monkeypatch.delenv("LLMSCHED_TRACES", raising=False)
    assert main(argv) == 0  # unset: ../shared/traces is searched
    capsys.readouterr()
    mine = tmp_path / "mine"
    monkeypatch.setenv("LLMSCHED_TRACES", str(mine))
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert f"$LLMSCHED_TRACES names {mine}, which does not exist;" in err and "shared" not in err, err
    mine.write_text("")
    assert main(argv) == 2
    assert f"$LLMSCHED_TRACES names {mine}, which is not a folder;" in one_error_line(capsys)
    mine.unlink()
    mine.mkdir()
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert f"sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv under {mine} ($LLMSCHED_TRACES);" in err
    assert "shared" not in err, err
    with pytest.raises(ConfigError, match=r"\$LLMSCHED_TRACES"):  # the Python API too
        llmsched.simulate(cost_model="paper", prompt="sharegpt", num_requests=5)


# ---------------------------------------------------------------------- 4. lambda* label
def test_summary_labels_lambda_star_by_its_source(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    run = ["simulate", "--cost-model", "paper", "--rate", "2", "--num-requests", "100", "--out", ""]
    assert main([*run, "--k-max", "16"]) == 0
    out = capsys.readouterr().out
    assert "critical rate lambda* (2-D region, k_max 16)" in out and "theorem 2" not in out
    assert main(run) == 0
    assert "critical rate lambda* (theorem 2)" in capsys.readouterr().out
    # steps of 128 tokens serve 300 times full steps' tokens: lambda* is not theorem 2's
    assert main([*run, "--cost-model", "paper:variant=max", "--prompt", "const:200", "--output", "const:50"]) == 0
    assert "critical rate lambda* (b / t(b) peaks below b_max, not theorem 2)" in capsys.readouterr().out


# ---------------------------------------------------------------------- 5. unknown flags
def _commands() -> dict[str, list[str]]:
    """Every command, with a value for each of its required arguments."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    out = {}
    for name, sub in subs.items():
        args = []
        for a in sub._actions:
            if a.option_strings and a.required:
                args += [a.option_strings[0], "x"]
            elif not a.option_strings and a.nargs not in ("?", "*"):
                args.append(a.choices[0] if a.choices else "x")
        out[name] = args
    return out


@pytest.mark.parametrize("command, positionals", sorted(_commands().items()))
def test_unknown_flag_is_refused_by_its_command(command, positionals, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser(command).parse_args([command, *positionals, "--zzz-no-such-flag"])
    assert e.value.code == 2
    assert one_error_line(capsys) == f"llmsched {command}: error: unrecognized arguments: --zzz-no-such-flag"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["simulate", "--polcy", "x"],
            "llmsched simulate: error: unrecognized arguments: --polcy x (did you mean --policy?)",
        ),
        (
            ["sweep", "--grd=policy=orca"],
            "llmsched sweep: error: unrecognized arguments: --grd=policy=orca (did you mean --grid?)",
        ),
        (
            ["capacity", "--bmax", "5", "--mean-promt", "3"],
            "llmsched capacity: error: unrecognized arguments: --bmax 5 --mean-promt 3 "
            "(--bmax: did you mean --b-max?; --mean-promt: did you mean --mean-prompt?)",
        ),
        (
            ["simulate", "--b-mx", "3", "--kmax", "2", "--trce", "t.csv"],
            "llmsched simulate: error: unrecognized arguments: --b-mx 3 --kmax 2 --trce t.csv "
            "(--b-mx: did you mean --b-max?; --kmax: did you mean --k-max?; --trce: did you mean --trace?)",
        ),
    ],
)
def test_misspelt_flag_gets_a_suggestion(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert one_error_line(capsys) == message


@pytest.mark.parametrize(
    "flag",
    # --bogus and --bar were 67% like --out and --b-max with the "--" counted; after it,
    # --plot and --out-dir were 60% like --prompt and --router (--out-dir now names --out), --force like --trace
    ["--bogus", "--bar", "--foo", "--test", "--input", "--plot", "--force", "--log", "--save", "--model"],
)
def test_an_unrelated_flag_gets_no_suggestion(flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", flag, "x"])
    assert e.value.code == 2
    assert one_error_line(capsys) == f"llmsched simulate: error: unrecognized arguments: {flag} x"


@pytest.mark.parametrize(
    "argv, flag",
    [
        # --time ran as --time-scale (100 times the rate), capacity's --out as --output
        (["simulate", "--cost-model", "paper", "--num-requests", "5", "--time", "100", "--out", ""], "--time"),
        (["capacity", "--cost-model", "paper", "--out", "cap"], "--out"),
        (["sweep", "--grid", "seed=0", "--no-plot"], "--no-plot"),
    ],
)
def test_an_abbreviated_flag_is_refused_not_expanded(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = one_error_line(capsys)
    assert line.startswith(f"llmsched {argv[0]}: error: unrecognized arguments: {flag}"), line


# ---------------------------------------------------------------------- 6. reproduce's files
@pytest.mark.parametrize(
    "argv", [["stability", "--quick", "--no-search", "--workers", "2"], ["rybko-stolyar", "--quick", "--workers", "2"]]
)
def test_reproduce_lists_every_file_it_writes(argv, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    out = tmp_path / "r"
    assert main(["reproduce", *argv, "--out", str(out)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "written: " in x][-1]
    listed = {Path(p).name for p in line.split("written: ", 1)[1].split(", ")}
    on_disk = {p.name for p in out.iterdir() if p.is_file()}
    assert "table.parquet" in on_disk and listed == on_disk


# ---------------------------------------------------------------------- 7. plain floats
def _numpy_values(o, path="report"):
    if dataclasses.is_dataclass(o):
        for f in dataclasses.fields(o):
            yield from _numpy_values(getattr(o, f.name), f"{path}.{f.name}")
    elif isinstance(o, dict):
        for k, v in o.items():
            yield from _numpy_values(v, f"{path}[{k!r}]")
    elif isinstance(o, (list, tuple)):
        for i, v in enumerate(o):
            yield from _numpy_values(v, f"{path}[{i}]")
    elif type(o).__module__ == "numpy":
        yield path


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples" / "networks").glob("*.yaml")))
def test_traffic_report_holds_plain_floats(name):
    from llmsched.theory.network import traffic

    rep = traffic(ROOT / "examples" / "networks" / name)
    assert list(_numpy_values(rep)) == []
    assert "np." not in repr(rep.critical_rates) and all(type(v) is float for v in rep.critical_rates.values())


def test_traffic_report_with_a_batch_cap_holds_plain_floats():
    from llmsched.theory.network import traffic

    spec = {
        "servers": {"s": {"cost_model": "paper", "k_max": 16}, "p": {"cost_model": "profile"}},
        "jobs": {
            "A": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {"call": {"server": "s", "prompt": 200, "output": 101}},
                    {"call": {"server": "p", "prompt": 300, "output": 50}},
                ],
            }
        },
    }
    rep = traffic(spec)
    assert rep.server("s").binding == "batch-size cap (2-D region)"
    assert list(_numpy_values(rep)) == []


def test_an_objective_met_exactly_is_met_on_one_server():
    """Goodput compares objectives on integer nanoseconds: constant 10 ms steps give every
    request a TPOT of exactly 10 ms (in float seconds a fifth of them missed it)."""
    import llmsched

    kw = dict(cost_model="const:10", prompt="const:10", output="const:3", arrival="poisson", rate=50)
    res = llmsched.simulate(**kw, num_requests=300, seed=1, slo={"tpot_ms": 10})
    assert res.summary["arrived"] == 300 and res.summary["goodput_share"] == 1.0
    assert llmsched.simulate(**kw, num_requests=300, seed=1, slo={"tpot_ms": 9.9999}).summary["goodput_share"] == 0.0


def test_an_objective_a_fraction_of_a_nanosecond_under_a_time_is_missed():
    """A time of 10,000,000 ns misses an objective of 9,999,999.6 ns: the limit was rounded
    to the nearest ns (10,000,000, met), so requests up to half a ns over it counted."""
    import llmsched

    kw = dict(cost_model="const:10", prompt="const:10", output="const:3", rate=1, num_requests=20, seed=1)
    for key in ("tpot_ms", "ttft_ms", "e2el_ms"):
        exact = 30.0 if key == "e2el_ms" else 10.0
        assert llmsched.simulate(**kw, slo={key: exact}).summary["goodput_share"] == 1.0
        under = exact - 4e-7  # 0.4 ns under
        assert llmsched.simulate(**kw, slo={key: under}).summary["goodput_share"] == 0.0, key


def test_an_objective_beyond_any_run_is_met_without_overflow():
    """`limit * gaps` overflowed int64: tpot_ms=1e10 with 1,000 gaps wrapped negative
    (goodput 0), 1e13 raised OverflowError."""
    import llmsched

    kw = dict(cost_model="const:10", prompt="const:10", output="const:1001", rate=1, num_requests=3)
    for limit in (1e10, 1e13, 1e300):
        assert llmsched.simulate(**kw, slo={"tpot_ms": limit, "ttft_ms": limit}).summary["goodput_share"] == 1.0


# ---------------------------------------------------------------------- 8. slow runs' figures
def test_simulate_table_prints_a_slow_runs_throughput_not_zero(capsys):
    """5 requests over 1,231 s printed 'request throughput 0.00 req/s', '0 tok/s' and a
    goodput of '0.00 req/s (100.0%)': each is now given to 3 significant digits."""
    argv = ["simulate", "--cost-model", "paper", "--rate", "0.002", "--num-requests", "5", "--out", ""]
    argv += ["--prompt", "const:10", "--output", "const:3", "--slo", "ttft_ms=1000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0.00 req/s" not in out and " 0 tok/s" not in out
    assert "0.00406 req/s (100.0%)" in out and "0.0122 tok/s" in out and "0.0528 tok/s" in out


def test_simulate_table_prints_a_slow_models_lambda_star_not_zero(capsys, monkeypatch):
    """A 100 s step printed 'critical rate lambda* (theorem 2) 0.00 req/s' (summary.json:
    0.00158): C = 16 / 100 s, w = 100 + 2 - 1 tokens."""
    monkeypatch.setenv("COLUMNS", "250")
    argv = ["simulate", "--cost-model", "const:100000", "--b-max", "16", "--rate", "0.001", "--out", ""]
    assert main([*argv, "--num-requests", "30", "--prompt", "const:100", "--output", "const:2"]) == 0
    out = capsys.readouterr().out
    assert f"{0.16 / 101:.3g} req/s" in out and "0.00 req/s" not in out


def test_simulate_table_prints_sub_millisecond_latencies_not_zero(capsys):
    """A 0.02 ms step printed 'TTFT mean / p50 / p99 0.0 ms / 0.0 ms / 0.0 ms'."""
    argv = ["simulate", "--cost-model", "const:0.02", "--num-requests", "5", "--out", ""]
    assert main([*argv, "--prompt", "const:10", "--output", "const:3"]) == 0
    out = capsys.readouterr().out
    assert "0.0 ms" not in out and "0.02 ms / 0.02 ms / 0.02 ms" in out
