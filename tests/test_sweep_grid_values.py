"""`llmsched sweep --grid`: values that are the same point however spelt, how values with
commas are written, and how grid values appear in the tables."""

import pytest

from llmsched.analysis.grid import parse_grid
from llmsched.cli import main
from llmsched.core.errors import ConfigError

ARGV = ["sweep", "--cost-model", "paper", "--num-requests", "50", "--no-plots", "--no-progress", "--workers", "1"]


@pytest.mark.parametrize(
    "spec, said",
    [
        ("prompt=geometric:200|geometric:mean=200", "'geometric:mean=200' is the same law as 'geometric:200'"),
        ("prompt=const:100|const:100.0", "'const:100.0' is the same law as 'const:100'"),
        ("output=100,const:100", "'const:100' is the same law as 100"),
        ("turns=geom:2|geometric:mean=2", "the same law as 'geom:2'"),
        ("system_prompt=0,none", "the value None is the same value as 0"),
    ],
)
def test_a_value_spelt_two_ways_is_refused(tmp_path, capsys, spec, said):
    """Each ran twice ("2 points: 2 simulated", identical rows): only policies, cost
    models and mappings were compared by what they run."""
    assert main([*ARGV, "--grid", spec, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "s").exists()


def test_different_laws_stay_apart_and_a_mapping_law_is_compared():
    g = parse_grid(["prompt=geometric:200|geometric:mean=200,max=4000|uniform:1,400", "system_prompt=0,1"])
    assert len(g["prompt"]) == 3 and g["system_prompt"] == [0, 1]
    with pytest.raises(ConfigError, match="same law"):
        parse_grid({"prompt": ["geometric:200", {"law": "geometric", "mean": 200}]})


FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=100)


def test_a_grid_mapping_is_json_in_the_tables(tmp_path):
    """A mapping grid value was written as Python's repr, `{'ttft_ms': 1000}`, in
    results.csv and results.parquet (and search.csv), which JSON cannot read, while the
    configuration's mapping columns are JSON."""
    import csv
    import json

    import pyarrow.parquet as pq

    from llmsched.analysis.sweep import max_stable_rate, run_sweep

    slos = [{"ttft_ms": 1000, "itl_ms": 80}, {"ttft_ms": 2000}]
    run_sweep(None, {"slo": slos, "load": [0.5]}, out_dir=tmp_path / "g", workers=1, plots=False, **FIXED)
    with open(tmp_path / "g" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [json.loads(r["slo"]) for r in rows] == slos
    assert rows[0]["slo"] == '{"itl_ms": 80, "ttft_ms": 1000}'  # (sorted keys)
    column = pq.read_table(tmp_path / "g" / "results.parquet").column("slo").to_pylist()
    assert [json.loads(v) for v in column] == slos
    res = max_stable_rate(
        policies=["orca"], grid={"slo": slos[1:]}, out_dir=tmp_path / "s", tol=0.4, workers=1, **FIXED
    )
    with open(tmp_path / "s" / "search.csv", newline="") as f:
        assert [json.loads(r["slo"]) for r in csv.DictReader(f)] == slos[1:]
    # search.json and the rows returned keep the mapping an object (they held its JSON text)
    assert [r["slo"] for r in json.loads((tmp_path / "s" / "search.json").read_text())] == slos[1:]
    assert [r["slo"] for r in res] == slos[1:]


@pytest.mark.parametrize(
    "spec, values",
    [
        ("prompt=uniform:10,100", ["uniform:10,100"]),
        ("output=lognormal:mean=100,sigma=1", ["lognormal:mean=100,sigma=1"]),
        ("prompt=geometric:200,max=400", ["geometric:200,max=400"]),
        ("prompt=geometric:200,300", ["geometric:200", 300]),  # (two laws: two values)
        ("prompt=uniform:10,100|geometric:200", ["uniform:10,100", "geometric:200"]),
    ],
)
def test_a_lone_length_law_with_commas_is_one_value(spec, values):
    """`prompt=uniform:10,100` was split at its comma (`uniform:10` is missing its hi), and
    a lone value with commas could not be written (a trailing `|` is an empty value)."""
    assert parse_grid([spec]) == {spec.partition("=")[0]: values}


def test_laws_split_at_commas_that_are_no_laws_say_how_to_write_them(tmp_path, capsys):
    assert main([*ARGV, "--grid", "prompt=uniform:10,100,geometric:200", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'uniform:10' is missing hi" in err and "values holding commas are separated by |" in err, err
    # a value wrong in itself, not cut by a comma, gets its own error alone
    for spec in ("prompt=const:-1,2", "prompt=geometric:nan,1"):
        with pytest.raises(ConfigError) as e:
            parse_grid([spec])
        assert "separated by |" not in str(e.value), str(e.value)


def test_a_metric_named_like_an_option_has_one_column_in_every_sweep():
    # a sweep by duration (no num_requests option) had the run's count under `num_requests`,
    # a sweep by count under `metric_num_requests`: a script read different things
    from llmsched.analysis.tables import point_row

    summary = {"num_requests": 10176, "verdict": "stable", "throughput_rps": 99.5}
    by_duration = {"policy": "sarathi", "verdict": True, "workload": {"rate": 100.0, "duration_s": 100.0}}
    by_count = {"policy": "sarathi", "verdict": True, "workload": {"rate": 100.0, "num_requests": 10000}}
    a = point_row({}, {"key": "a", "config": by_duration, "summary": summary}, [])
    b = point_row({}, {"key": "b", "config": by_count, "summary": summary}, [])
    assert a["metric_num_requests"] == b["metric_num_requests"] == 10176
    assert "num_requests" not in a and b["num_requests"] == 10000
    # the run's verdict keeps its name (the option's column is `verdict_enabled`)
    assert a["verdict"] == b["verdict"] == "stable" and a["verdict_enabled"] is True


def test_the_search_table_prints_a_grid_mapping_as_json(tmp_path, capsys):
    """The printed search table showed `{'mean_prompt': 100}` (Python's repr) where
    search.csv holds `{"mean_prompt": 100}`."""
    argv = [*ARGV, "--search", "max-stable-rate", "--grid", "policy=adaptive"]
    argv += ["--grid", "policy_options={mean_prompt: 100}", "--tol", "0.5"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert '{"mean_prompt": 100}' in out and "{'mean_prompt'" not in out
