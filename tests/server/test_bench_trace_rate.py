"""A trace replayed on its own timestamps recorded `"request_rate": "inf"` and a file named
`...-infqps-...`, which in vLLM's result files (and our docs) means every request sent at
once: the requests were paced by the trace. Its replayed mean rate is recorded instead."""

from __future__ import annotations

import json

import pytest
from srv_helpers import running_server

from llmsched.server.bench import BenchConfig, make_workload, run_bench


def _trace(path, times):
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{t},16,2\n" for t in times))
    return str(path)


def test_a_trace_on_its_own_times_records_its_mean_rate(tmp_path):
    trace = _trace(tmp_path / "t.csv", [0.0, 0.05, 0.1, 0.15, 0.2])  # (5 - 1) / 0.2 s = 20 req/s
    with running_server() as (base, _):
        cfg = BenchConfig(
            base_url=base,
            dataset_name="trace",
            dataset_path=trace,
            num_warmups=0,
            quiet=True,
            save_result=True,
            result_dir=str(tmp_path / "out"),
        )
        res = run_bench(cfg)
    assert res["completed"] == 5
    assert res["request_rate"] == pytest.approx(20.0, rel=1e-9)
    (written,) = (tmp_path / "out").iterdir()
    assert "-20.0qps-" in written.name
    assert json.loads(written.read_text())["request_rate"] == pytest.approx(20.0, rel=1e-9)


def test_a_trace_of_one_timestamp_and_the_other_datasets_keep_the_configured_rate(tmp_path):
    from llmsched.server.bench import sent_rate

    one = BenchConfig(dataset_name="trace", dataset_path=_trace(tmp_path / "one.csv", [1.0, 1.0, 1.0]))
    assert sent_rate(one, make_workload(one)) == float("inf")  # all at once: inf is what happened
    scaled = BenchConfig(dataset_name="trace", dataset_path=_trace(tmp_path / "s.csv", [0, 1, 3]), time_scale=2.0)
    assert sent_rate(scaled, make_workload(scaled)) == pytest.approx(2 / 1.5)  # replayed twice as fast
    rnd = BenchConfig(num_prompts=4, input_len=4, output_len=2)
    assert sent_rate(rnd, make_workload(rnd)) == float("inf")
    assert sent_rate(BenchConfig(request_rate=3.0), make_workload(rnd)) == 3.0
