"""A SimResult's writes after `write`: `write_parquet` and `write_config` write only into a
folder of the result's own files (they replaced the user's requests.parquet, a model's
config.json, and put run B's tables beside run A's CSVs); `write(parquet=True)` claims
the Parquet tables in that folder's config.json only; a config.json of a run given a
Trace object is refused with the rerun that works; `==`, and a workload set to None."""

from __future__ import annotations

import json

import pytest

import llmsched
from llmsched.api import SimConfig
from llmsched.core.errors import ConfigError
from llmsched.workload import Trace

W = dict(cost_model="paper", rate=5, prompt="geometric:200", output="geometric:100")


def test_write_parquet_writes_only_into_the_results_own_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    mine = tmp_path / "mine"
    mine.mkdir()
    pq.write_table(pa.table({"my_data": [1, 2, 3]}), mine / "requests.parquet")
    r = llmsched.simulate(num_requests=40, **W)
    with pytest.raises(ConfigError):
        r.write_parquet(mine)
    assert pq.read_table(mine / "requests.parquet").column_names == ["my_data"]  # the user's table stays
    a = llmsched.simulate(num_requests=40, out_dir=str(tmp_path / "A"), **W)
    b = llmsched.simulate(num_requests=77, **W)
    with pytest.raises(ConfigError, match=r"holds another run .*write\(DIR, parquet=True\)"):
        b.write_parquet(tmp_path / "A")  # B's tables beside A's CSVs and summary.json
    assert not (tmp_path / "A" / "requests.parquet").exists()
    with pytest.raises(ConfigError, match="does not exist"):
        b.write_parquet(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    # the result's own folder: as before
    written = a.write_parquet(tmp_path / "A")
    assert [p.name for p in written] == ["requests.parquet", "timeseries.parquet"]
    assert pq.read_table(tmp_path / "A" / "requests.parquet").num_rows == 40
    b.write(tmp_path / "B")
    b.write_parquet(tmp_path / "B")
    # once another run replaced A's files, A's tables would mix with them
    b.write(tmp_path / "A")
    with pytest.raises(ConfigError, match="holds another run"):
        a.write_parquet(tmp_path / "A")
    assert not (tmp_path / "A" / "requests.parquet").exists()  # (B's write removed A's tables)


def test_write_config_writes_only_into_the_results_own_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "generation_config.json").write_text("{}")
    r = llmsched.simulate(num_requests=20, **W)
    with pytest.raises(ConfigError, match="not an llmsched run's"):
        r.write_config(model)
    assert json.loads((model / "config.json").read_text()) == {"model_type": "llama"}
    other = llmsched.simulate(num_requests=30, out_dir=str(tmp_path / "other"), **W)
    with pytest.raises(ConfigError, match="holds another run"):
        r.write_config(tmp_path / "other")
    assert json.loads((tmp_path / "other" / "config.json").read_text())["workload"]["num_requests"] == 30
    with pytest.raises(ConfigError, match="does not exist"):
        r.write_config(tmp_path / "new")
    # the result's own folder: the changed config is written
    r.write(tmp_path / "own", parquet=True)
    r.config["note"] = "relabelled"
    r.write_config(tmp_path / "own")
    written = json.loads((tmp_path / "own" / "config.json").read_text())
    assert written["note"] == "relabelled" and written["provenance"]["parquet"] is True
    assert other.config["workload"]["num_requests"] == 30


def test_parquet_flag_is_only_in_the_write_that_had_the_tables(tmp_path):
    pytest.importorskip("pyarrow")
    r = llmsched.simulate(num_requests=20, **W)
    r.write(tmp_path / "p1", parquet=True)
    r.write(tmp_path / "p2")
    assert json.loads((tmp_path / "p1" / "config.json").read_text())["provenance"]["parquet"] is True
    assert "parquet" not in json.loads((tmp_path / "p2" / "config.json").read_text())["provenance"]
    assert not list((tmp_path / "p2").glob("*.parquet"))
    assert "parquet" not in r.config["provenance"]


def test_write_parquet_marks_the_folders_config_json_as_write_with_parquet_does(tmp_path):
    pytest.importorskip("pyarrow")
    r = llmsched.simulate(num_requests=20, **W)
    r.write(tmp_path / "later")
    r.write(tmp_path / "at_once", parquet=True)
    r.write_parquet(tmp_path / "later")
    later = json.loads((tmp_path / "later" / "config.json").read_text())
    at_once = json.loads((tmp_path / "at_once" / "config.json").read_text())
    assert later["provenance"]["parquet"] is True
    assert {k: v for k, v in later.items() if k != "provenance"} == {
        k: v for k, v in at_once.items() if k != "provenance"
    }
    assert "parquet" not in r.config["provenance"]


def test_a_config_of_a_caller_trace_run_says_how_to_rerun_it(tmp_path, capsys):
    from helpers import one_line_error

    trace = Trace([0, 0.5, 1.0, 2.0], [100, 300, 100, 50], [10, 20, 10, 5])
    llmsched.simulate(trace=trace, cost_model="paper", policy="orca", out_dir=str(tmp_path / "t"))
    config = tmp_path / "t" / "config.json"
    with pytest.raises(ConfigError, match=r"trace came from the caller.*--trace .*t/requests.csv"):
        llmsched.simulate(config)
    one_line_error(capsys, ["simulate", "--config", str(config)], "came from the caller", "requests.csv")
    # the rerun it names: the same requests, the run's other options (orca), the same summary
    again = llmsched.simulate(config, trace=str(tmp_path / "t" / "requests.csv"), out_dir=str(tmp_path / "u"))
    assert again.config["policy"] == "orca"
    first = json.loads((tmp_path / "t" / "summary.json").read_text())
    second = json.loads((tmp_path / "u" / "summary.json").read_text())
    assert {k: v for k, v in first.items() if k != "wall_s"} == {k: v for k, v in second.items() if k != "wall_s"}
    # a Trace object given again brings its own workload
    assert len(llmsched.simulate(config, trace=Trace([0, 1], [10, 10], [2, 2])).prompt) == 2


def test_results_compare_by_identity():
    r1 = llmsched.simulate(num_requests=20, **W)
    r2 = llmsched.simulate(num_requests=20, **W)
    assert r1 == r1 and r1 != r2  # (a field-wise == over arrays raised numpy's ValueError)


def test_a_workload_set_to_none_is_the_default_workload():
    cfg = SimConfig(cost_model="paper", workload={"num_requests": 50})
    cfg.workload = None
    assert cfg.given_workload() == {}
    assert len(llmsched.simulate(cfg, num_requests=30).prompt) == 30
    cfg.workload = "rate=5"
    with pytest.raises(ConfigError, match="workload must be a mapping"):
        llmsched.simulate(cfg)
