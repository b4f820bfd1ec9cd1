"""The bench client's metric definitions (those of vllm bench serve), datasets and CLI."""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import pytest
from helpers import dump_half_then_interrupt

from llmsched.cli import server as server_cli
from llmsched.core.errors import ConfigError
from llmsched.server.bench import (
    BenchConfig,
    RequestResult,
    Workload,
    build_payloads,
    calculate_metrics,
    make_workload,
    parse_goodput,
    parse_percentiles,
    write_result,
)


def _r(ttft, itl, out, start=0.0, prompt=10, ok=True):
    return RequestResult(
        success=ok,
        prompt_len=prompt,
        output_tokens=out,
        ttft=ttft,
        itl=list(itl),
        latency=ttft + sum(itl),
        start_time=start,
    )


def test_metrics_by_hand():
    rs = [
        _r(0.1, [0.02, 0.04], 3, start=0.0),  # tpot (0.16 - 0.1) / 2 = 0.03
        _r(0.3, [], 1, start=0.5, prompt=20),  # one token: no tpot, tpot 0 for goodput
        _r(0.2, [0.05], 2, start=1.0),  # tpot 0.05
        _r(0, [], 0, ok=False),
    ]
    m = calculate_metrics(rs, 2.0, [50, 99.9], {"ttft": 250, "tpot": 40})
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 40 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == 1.5
    assert m["output_throughput"] == 3.0 and m["total_token_throughput"] == 23.0
    # good: request 1 (ttft 100 <= 250, tpot 30 <= 40); request 2 fails ttft; request 3 fails tpot
    assert m["request_goodput"] == 0.5
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(np.std([100, 300, 200]))
    assert m["mean_tpot_ms"] == pytest.approx(40.0)  # over requests with > 1 token
    assert m["mean_itl_ms"] == pytest.approx((20 + 40 + 50) / 3)
    assert m["mean_e2el_ms"] == pytest.approx((160 + 300 + 250) / 3)
    assert m["p50_itl_ms"] == pytest.approx(40.0)
    assert m["p99.9_e2el_ms"] == pytest.approx(np.percentile([160, 300, 250], 99.9))
    # vLLM's peak concurrency counts the requests active at some time of each second:
    # [0, 0.16] and [0.5, 0.8] share second 0; at no instant are two in flight
    assert m["max_concurrent_requests"] == 2 and m["max_concurrent_requests_instant"] == 1
    assert m["max_output_tokens_per_s"] == 4.0  # tokens at 0.1, 0.12, 0.16, 0.8 s; then 1.2, 1.25


def test_peak_buckets_start_at_the_first_successful_request():
    """As vllm bench serve's calculate_metrics (vllm/benchmarks/serve.py: min_start_time over
    the successful outputs), a request that failed before them moves no bucket: from its
    start at 0 s the tokens at 0.6 and 1.4 s would fall in two buckets, 1 token each."""
    ok = _r(0.1, [0.8], 2, start=0.5)  # tokens at 0.6 and 1.4 s, in flight 0.5 .. 1.4 s
    failed = RequestResult(success=False, prompt_len=10, start_time=0.0, latency=0.05)
    m = calculate_metrics([failed, ok], 2.0, [99])
    assert m["max_output_tokens_per_s"] == 2.0 and m["max_concurrent_requests"] == 1
    assert calculate_metrics([ok], 2.0, [99])["max_output_tokens_per_s"] == 2.0


def test_metrics_without_goodput_and_all_failed():
    m = calculate_metrics([_r(0, [], 0, ok=False)], 1.0, [99])
    assert m["completed"] == 0 and m["request_goodput"] is None
    assert m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0  # vLLM reports 0 then


def test_overlap_concurrency():
    rs = [_r(0.1, [0.1] * 5, 6, start=0.0), _r(0.1, [0.1] * 5, 6, start=0.2), _r(0.1, [0.1] * 5, 6, start=0.3)]
    m = calculate_metrics(rs, 1.0, [99])
    assert m["max_concurrent_requests"] == 3 and m["max_concurrent_requests_instant"] == 3
    # back to back: one at a time, but five in the same second
    rs = [_r(0.05, [0.05], 2, start=0.15 * i) for i in range(5)]
    m = calculate_metrics(rs, 1.0, [99])
    assert m["max_concurrent_requests_instant"] == 1 and m["max_concurrent_requests"] == 5


def test_goodput_and_percentile_parsing():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(["e2el:1e4"]) == {"e2el": 10000.0}
    for bad in (["itl:5"], ["ttft=5"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ConfigError):
            parse_goodput(bad)
    assert parse_percentiles("50, 90,99.9") == [50.0, 90.0, 99.9]
    for bad in ("", "0", "101", "x"):
        with pytest.raises(ConfigError):
            parse_percentiles(bad)


def test_random_workload_and_arrivals():
    cfg = BenchConfig(
        num_prompts=2000, input_len=100, output_len=10, random_range_ratio=0.5, request_rate=50, burstiness=4.0, seed=3
    )
    wl = make_workload(cfg)
    assert len(wl) == 2000
    assert wl.prompt.min() >= 50 and wl.prompt.max() <= 150
    assert wl.output.min() >= 5 and wl.output.max() <= 15
    gaps = np.diff(wl.arrival_s)
    assert wl.arrival_s[0] == 0 and gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5, rel=0.1)  # gamma shape 4: cv 1/2
    fixed = make_workload(BenchConfig(num_prompts=5, input_len=7, output_len=3))
    assert fixed.prompt.tolist() == [7] * 5 and fixed.output.tolist() == [3] * 5
    assert fixed.arrival_s.tolist() == [0.0] * 5  # rate inf: all at once


def test_random_range_ratio_keeps_the_top_of_the_range():
    # int(L(1+r)) cut the top: L=10, r=0.25 drew 7..12 (mean 9.5), not vLLM's 7..13 (mean 10)
    wl = make_workload(BenchConfig(num_prompts=4000, input_len=10, output_len=10, random_range_ratio=0.25, seed=1))
    assert set(wl.prompt.tolist()) == set(range(7, 14)) == set(wl.output.tolist())
    assert wl.prompt.mean() == pytest.approx(10, abs=0.15)
    from llmsched.server.bench import random_length_range

    assert random_length_range(10, 0.25) == (7, 13)
    assert random_length_range(100, 0.1) == (90, 110)  # exact: float arithmetic's ceiling is 111
    assert random_length_range(10, 0.0) == (10, 10)
    assert random_length_range(1, 0.5) == (1, 2)  # floor(0.5) is 0: at least 1 (a mean of 1.5, not L)
    from llmsched.server import bench

    # its docs said "so their mean is L" whatever the range: only where it is not raised to 1
    for doc in (random_length_range.__doc__, bench.__doc__):
        assert "unless the lower end is raised to 1" in " ".join(doc.split())
    wl = make_workload(BenchConfig(num_prompts=4000, input_len=1, output_len=1, random_range_ratio=0.5, seed=1))
    assert set(wl.prompt.tolist()) == {1, 2} and wl.prompt.mean() == pytest.approx(1.5, abs=0.05)


def test_length_datasets_and_trace():
    sg = make_workload(BenchConfig(dataset_name="sharegpt", num_prompts=500, seed=1))
    # vLLM's ShareGPT limits: prompts of 4-1,024 tokens, outputs of 4 or more, 2,048 together
    assert len(sg) == 500 and sg.prompt.min() >= 4 and sg.prompt.max() <= 1024 and sg.output.min() >= 4
    assert (sg.prompt + sg.output).max() <= 2048
    tr = make_workload(BenchConfig(dataset_name="trace", dataset_path="azure-conv", num_prompts=30, time_scale=2.0))
    assert len(tr) == 30 and tr.arrival_s[0] == 0.0 and (np.diff(tr.arrival_s) >= 0).all()
    with pytest.raises(ConfigError):
        make_workload(BenchConfig(dataset_name="trace"))


def test_a_request_rate_rescales_a_traces_own_times():
    """`--request-rate` replaced a trace's timestamps by Poisson gaps (simulate --rate
    rescales them, keeping their shape): the gaps are the trace's own, scaled to the rate."""
    own = make_workload(BenchConfig(dataset_name="trace", dataset_path="azure-conv", num_prompts=2000))
    fast = make_workload(
        BenchConfig(dataset_name="trace", dataset_path="azure-conv", num_prompts=2000, request_rate=50.0)
    )
    assert (len(fast) - 1) / fast.arrival_s[-1] == pytest.approx(50.0)
    scale = own.arrival_s[-1] / fast.arrival_s[-1]
    np.testing.assert_allclose(fast.arrival_s * scale, own.arrival_s, rtol=1e-9, atol=1e-6)
    assert fast.prompt.tolist() == own.prompt.tolist()


def test_sharegpt_lengths_past_vllms_limits_are_refused(tmp_path):
    """bench sent ShareGPT prompts of 7,504 tokens that a server's context refused."""
    long = tmp_path / "long.csv"
    long.write_text("prompt_tokens,output_tokens\n" + "3000,100\n" * 5 + "1000,1100\n")
    with pytest.raises(ConfigError, match="fit vLLM's ShareGPT limits"):
        make_workload(BenchConfig(dataset_name="sharegpt", dataset_path=str(long), num_prompts=5, seed=1))
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("prompt_tokens,output_tokens\n" + "3000,100\n" * 5 + "100,50\n")
    few = make_workload(BenchConfig(dataset_name="sharegpt", dataset_path=str(mixed), num_prompts=30, seed=1))
    assert few.prompt.tolist() == [100] * 30 and few.output.tolist() == [50] * 30


def test_a_bad_length_file_is_named_by_the_flag_that_gave_it(tmp_path):
    """Errors about --dataset-path's file said `prompt: ...` (the length law bench built
    from it) and hinted at `empirical:PATH:COLUMN`, which bench does not take."""

    def error(**kw) -> str:
        with pytest.raises(ConfigError) as e:
            make_workload(BenchConfig(num_prompts=5, seed=1, **kw))
        return str(e.value)

    missing = str(tmp_path / "none.csv")
    for name in ("sharegpt", "arxiv"):
        assert error(dataset_name=name, dataset_path=missing) == f"--dataset-path: file {missing} does not exist"
    other = tmp_path / "other.csv"
    other.write_text("a,b\n10,20\n")
    msg = error(dataset_name="sharegpt", dataset_path=str(other))
    assert msg.startswith(f"--dataset-path: {other} has no prompt length column (one of num_prefill_tokens")
    assert "its columns: a,b" in msg and "empirical:" not in msg
    half = tmp_path / "half.csv"
    half.write_text("prompt_tokens,b\n10,20\n")
    assert "has no output length column" in error(dataset_name="arxiv", dataset_path=str(half))
    # with the outputs fixed, the prompt column is all it needs
    fixed = make_workload(
        BenchConfig(dataset_name="arxiv", dataset_path=str(half), num_prompts=5, sharegpt_output_len=3)
    )
    assert fixed.prompt.tolist() == [10] * 5 and fixed.output.tolist() == [3] * 5
    negative = tmp_path / "neg.csv"
    negative.write_text("prompt_tokens,output_tokens\n-1,2\n")
    msg = error(dataset_name="arxiv", dataset_path=str(negative))
    assert msg.startswith(f"--dataset-path: file {negative} line 2") and "prompt:" not in msg


def test_payloads_give_the_intended_token_counts():
    from llmsched.server.tokenizer import ByteRuleTokenizer

    wl = Workload(np.zeros(2), np.array([5, 17]), np.array([3, 4]))
    ids = [json.loads(p) for p in build_payloads(BenchConfig(), wl, "m")]
    assert [len(p["prompt"]) for p in ids] == [5, 17] and [p["max_tokens"] for p in ids] == [3, 4]
    assert all(p["ignore_eos"] and p["stream"] and p["stream_options"]["include_usage"] for p in ids)
    tok = ByteRuleTokenizer()
    chat = [json.loads(p) for p in build_payloads(BenchConfig(endpoint="/v1/chat/completions"), wl, "m")]
    assert [len(tok.encode_chat(p["messages"])) for p in chat] == [5, 17]
    assert [p["max_completion_tokens"] for p in chat] == [3, 4]
    text = [json.loads(p) for p in build_payloads(BenchConfig(prompt_format="text"), wl, "m")]
    assert [len(tok.encode(p["prompt"])) for p in text] == [5, 17]


def test_config_errors():
    for kw in (
        {"endpoint": "/v1/embeddings"},
        {"request_rate": 0},
        {"burstiness": 0},
        {"random_range_ratio": 1.0},
        {"token_id_range": (5, 5)},
        {"endpoint": "/v1/chat/completions", "prompt_format": "ids"},
        {"backend": "tgi"},
        {"backend": "openai-chat", "endpoint": "/v1/completions"},
    ):
        with pytest.raises(ConfigError):
            BenchConfig(**kw)


def _parser():
    p = argparse.ArgumentParser(prog="llmsched")
    sub = p.add_subparsers(dest="command", required=True)
    server_cli.register(sub)
    return p


@pytest.mark.parametrize("cmd", ["serve", "bench"])
def test_cli_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--help" in out and ("--cost-model" in out if cmd == "serve" else "--goodput" in out)


def test_cli_bad_input_is_config_error():
    p = _parser()
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args(["serve", "--scheduler", "nope"]))
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args(["serve", "--cost-model", "bogus"]))
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args(["serve", "--backend", "engine"]))
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args(["serve", "--backend", "engine", "--model", "/no/such/dir"]))
    with pytest.raises(ConfigError):
        server_cli.build_backend(p.parse_args(["serve", "--admission-opt", "novalue"]))
    with pytest.raises(ConfigError):
        BenchConfig.from_args(p.parse_args(["bench", "--goodput", "ttft"]))
    with pytest.raises(ConfigError):
        BenchConfig.from_args(p.parse_args(["bench", "--percentile-metrics", "ttft,foo"]))
    with pytest.raises(ConfigError):
        BenchConfig.from_args(p.parse_args(["bench", "--token-id-range", "abc"]))
    with pytest.raises(ConfigError):
        BenchConfig.from_args(p.parse_args(["bench", "--metadata", "novalue"]))
    with pytest.raises(ConfigError):
        BenchConfig.from_args(p.parse_args(["bench", "--extra-body", "[1]"]))
    ok = BenchConfig.from_args(p.parse_args(["bench", "--request-rate", "inf", "--port", "1234"]))
    assert math.isinf(ok.request_rate) and ok.base_url == "http://127.0.0.1:1234"
    assert ok.endpoint == "/v1/completions" and ok.ignore_eos and ok.temperature == 0.0
    # what `vllm bench serve` users type
    v = BenchConfig.from_args(
        p.parse_args(
            ["bench", "--backend", "openai-chat", "--ignore-eos", "--save-result", "--result-dir", "out"]
            + ["--max-concurrency", "8", "--request-rate", "20", "--label", "run", "--metadata", "tp=1"]
            + ["--disable-tqdm", "--extra-body", '{"top_p": 0.9}']
        )
    )
    assert v.endpoint == "/v1/chat/completions" and v.chat and v.ignore_eos and v.quiet
    assert v.metadata == {"tp": "1"} and v.extra_body == {"top_p": 0.9}
    assert v.result_path("org/llama", "20260101-000000") == "out/run-20.0qps-concurrency8-llama-20260101-000000.json"
    v.label = None
    v.result_filename = "r.json"
    assert v.result_path("m", "d") == "out/r.json"
    assert BenchConfig().result_path("m", "d") is None  # nothing asked: no file
    d = BenchConfig(save_result=True).result_path("m", "20260101-000000")
    assert d == "openai-inf-qps-m-20260101-000000.json".replace("-inf-qps", "-infqps")
    # a trace's replayed mean rate (`sent_rate`) is measured: 4 significant digits
    d = BenchConfig(save_result=True).result_path("m", "20260101-000000", 8 / 7)
    assert d == "openai-1.143qps-m-20260101-000000.json"
    b = server_cli.build_backend(
        p.parse_args(
            ["serve", "--scheduler", "orca", "--b-max", "128", "--kv-capacity", "1000", "--cost-model", "const:5"]
        )
    )
    assert b.kind == "sim" and b.max_model_len == 1001 and b.kv_capacity == 1000


def test_bench_main_reports_unreachable_server():
    p = _parser()
    args = p.parse_args(["bench", "--port", "1", "--num-prompts", "1", "--quiet", "--model", "m"])
    with pytest.raises(Exception) as e:  # ConfigError from the warm-up: cannot connect
        server_cli.bench_main(args)
    assert isinstance(e.value, ConfigError)


def test_cli_contradicting_backend_is_one_line_exit_2(capsys):
    from llmsched.cli import main

    rc = main(["bench", "--backend", "openai-chat", "--endpoint", "/v1/completions", "--port", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "openai-chat" in err
    rc = main(["bench", "--metadata", "novalue", "--port", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "KEY=VALUE" in err


def test_append_result_adds_a_line_also_to_a_result_file(tmp_path):
    # --result-file F --append-result replaced F (the earlier results lost)
    path = str(tmp_path / "r.json")
    write_result(path, {"run": 1}, append=True)
    write_result(path, {"run": 2}, append=True)
    assert [json.loads(line)["run"] for line in open(path).read().splitlines()] == [1, 2]
    write_result(path, {"run": 3}, append=False)
    assert json.loads(open(path).read()) == {"run": 3}


def test_an_interrupted_result_write_keeps_the_earlier_result(tmp_path, monkeypatch):
    # the result file was written in place: Ctrl-C halfway through the dump left a
    # truncated file and the earlier result destroyed
    path = tmp_path / "r.json"
    write_result(str(path), {"run": 1, "pad": "x" * 1000}, append=False)
    before = path.read_bytes()
    real_dump = json.dump
    monkeypatch.setattr(json, "dump", dump_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_result(str(path), {"run": 2, "pad": "y" * 1000}, append=False)
    monkeypatch.setattr(json, "dump", real_dump)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_appended_results_keep_the_files_mode_links_and_every_writers_line(tmp_path):
    """Appending by rewriting the file through a rename (one version of the atomic write)
    made a 0600 file 0644, parted it from its hard links, and 16 writers at once kept 3 to
    5 of their 16 lines."""
    import multiprocessing

    path = tmp_path / "r.jsonl"
    write_result(str(path), {"run": 0}, append=True)
    os.chmod(path, 0o600)
    os.link(path, tmp_path / "hard.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=write_result, args=(str(path), {"run": i + 1}, True)) for i in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lines = path.read_text().split("\n")
    assert sorted(json.loads(line)["run"] for line in lines) == list(range(17))
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path).st_nlink == 2
    assert (tmp_path / "hard.jsonl").read_bytes() == path.read_bytes()


def test_a_result_file_name_at_the_file_systems_limit_is_written(tmp_path):
    """The temporary file was named after the result file plus 12 characters: a legal name
    of 245 characters failed after the whole run ("file name too long")."""
    path = tmp_path / ("r" * 250 + ".json")
    write_result(str(path), {"run": 1}, append=False)
    write_result(str(path), {"run": 2}, append=False)
    assert json.loads(path.read_text()) == {"run": 2}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"goodput": {"ttft_ms": 500}}, "--goodput metric must be ttft, tpot or e2el, got 'ttft_ms'"),
        ({"goodput": {"ttft": -1}}, "--goodput ttft must be >= 0 ms"),
        ({"goodput": {"ttft": "fast"}}, "--goodput ttft must be a number of milliseconds"),
        ({"goodput": {"ttft": True}}, "--goodput ttft must be a number of milliseconds"),
        ({"goodput": [("ttft", 5)]}, "goodput must be a mapping"),
        ({"metric_percentiles": [150]}, "percentiles must be in (0, 100], got 150"),
        ({"metric_percentiles": [0]}, "percentiles must be in (0, 100], got 0"),
        ({"metric_percentiles": []}, "--metric-percentiles is empty"),
        ({"metric_percentiles": ["high"]}, "--metric-percentiles must be numbers, got 'high'"),
        ({"metric_percentiles": 99}, "--metric-percentiles must be a list of numbers"),
        ({"percentile_metrics": ["foo"]}, "--percentile-metrics: unknown metric 'foo'"),
        ({"num_prompts": 0}, "--num-prompts must be a positive integer, got 0"),
        ({"num_prompts": 2.5}, "--num-prompts must be a positive integer, got 2.5"),
    ],
)
def test_bench_config_refuses_what_the_cli_refuses(kwargs, message):
    with pytest.raises(ConfigError) as e:
        BenchConfig(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bench_config_normalises_metric_options():
    cfg = BenchConfig(
        goodput={"TTFT": np.int64(500), "e2el": 2000.0},
        metric_percentiles=(np.float32(50), 99),
        percentile_metrics=["TTFT", " itl"],
        num_prompts=np.int64(3),
    )
    assert cfg.goodput == {"ttft": 500.0, "e2el": 2000.0}
    assert cfg.metric_percentiles == [50.0, 99.0]
    assert cfg.percentile_metrics == ["ttft", "itl"]
    assert cfg.num_prompts == 3 and type(cfg.num_prompts) is int
    same = BenchConfig(goodput="ttft:500 e2el:2000", metric_percentiles="50,99", percentile_metrics="ttft,itl")
    assert (same.goodput, same.metric_percentiles, same.percentile_metrics) == (
        cfg.goodput,
        cfg.metric_percentiles,
        cfg.percentile_metrics,
    )


@pytest.mark.parametrize(
    ("percentiles", "goodput", "message"),
    [
        ([150], None, "percentiles must be in (0, 100], got 150"),
        ([99], {"ttft_ms": 500}, "--goodput metric must be ttft, tpot or e2el"),
        ([99], {"ttft": float("nan")}, "--goodput ttft must be >= 0 ms"),
    ],
)
def test_calculate_metrics_refuses_bad_percentiles_and_goodput(percentiles, goodput, message):
    rs = [_r(0.1, [0.02, 0.02], 3)]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        calculate_metrics(rs, 1.0, percentiles, goodput)


def test_calculate_metrics_reads_goodput_keys_as_the_cli_does():
    rs = [_r(0.1, [0.02, 0.02], 3), _r(0.9, [0.02, 0.02], 3)]
    assert calculate_metrics(rs, 1.0, [99], {"TTFT": 500})["request_goodput"] == 1.0


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--dataset-path", "/nonexist"], "--dataset-path"),
        (["--result-filename", "r.json"], "--result-filename"),
        (["--result-dir", "out"], "--result-dir"),
        (["--metadata", "a=1"], "--metadata"),
        (["--save-detailed"], "--save-detailed"),
        (["--result-file", "r.json", "--result-dir", "out"], "--result-dir"),
        (["--base-url", "http://127.0.0.1:1", "--port", "9"], "--port"),
        (["--time-scale", "2"], "--time-scale"),
        (["--sharegpt-output-len", "5"], "--sharegpt-output-len"),
        # --output-len outside random was taken and ignored (its twin --input-len was refused)
        (["--dataset-name", "sharegpt", "--output-len", "5"], "--output-len"),
        (["--dataset-name", "arxiv", "--random-output-len", "5"], "--output-len"),
        # --label without a result file did nothing, as --metadata and --save-detailed
        (["--label", "mine"], "--label"),
        (["--dataset-name", "sharegpt", "--input-len", "5"], "--input-len"),
        (["--dataset-name", "sharegpt", "--random-range-ratio", "0.5"], "--random-range-ratio"),
        (["--burstiness", "0.5"], "--burstiness"),
        (["--dataset-name", "trace", "--dataset-path", "t.csv", "--burstiness", "0.5"], "--burstiness"),
        (
            ["--dataset-name", "trace", "--dataset-path", "t.csv", "--time-scale", "2", "--request-rate", "5"],
            "--time-scale",
        ),
    ],
)
def test_cli_refuses_an_option_the_run_would_ignore(capsys, extra, flag):
    """each of these ran to exit 0 while doing nothing (the flag audit)."""
    from llmsched.cli import main

    rc = main(["bench", "--port", "1", *extra] if "--base-url" not in extra else ["bench", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"{flag} does nothing in this run" in err, err


@pytest.mark.parametrize(
    "extra, message",
    [
        # a bad value is named as such, before whether the run uses it: --burstiness 0
        # without --request-rate was "--burstiness does nothing in this run"
        (["--burstiness", "0"], "--burstiness must be > 0, got 0.0"),
        (["--burstiness", "0", "--request-rate", "5"], "--burstiness must be > 0, got 0.0"),
        (["--time-scale", "nan"], "--time-scale must be a positive, finite number"),
        # inf reached the trace reader: "time_scale must be a positive number", not the flag
        (["--dataset-name", "trace", "--dataset-path", "azure-conv", "--time-scale", "inf"], "--time-scale must be"),
        (["--dataset-name", "sharegpt", "--random-range-ratio", "1"], "--random-range-ratio must be in [0, 1)"),
    ],
)
def test_cli_names_a_bad_value_before_a_moot_option(capsys, extra, message):
    from llmsched.cli import main

    rc = main(["bench", "--port", "1", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err


def test_the_options_that_do_something_are_still_taken():
    from llmsched.cli import build_parser
    from llmsched.server.bench import BenchConfig

    for extra in (
        ["--save-result", "--result-dir", "out", "--result-filename", "r.json", "--metadata", "a=1", "--save-detailed"],
        ["--result-file", "r.json", "--metadata", "a=1", "--save-detailed", "--label", "mine"],
        ["--save-result", "--label", "mine"],
        ["--output-len", "5"],
        ["--dataset-name", "sharegpt", "--sharegpt-output-len", "5"],
        ["--dataset-name", "trace", "--dataset-path", "t.csv", "--time-scale", "2"],
        ["--request-rate", "4", "--burstiness", "0.5", "--input-len", "8", "--random-range-ratio", "0.5"],
        ["--base-url", "http://127.0.0.1:1"],
    ):
        BenchConfig.from_args(build_parser().parse_args(["bench", *extra]))


def test_an_input_len_beyond_any_context_is_refused_before_a_prompt_is_built(capsys):
    """`--num-prompts 2 --input-len 1000000000` built two prompts of 10^9 ids in memory
    before anything was checked."""
    from llmsched.cli import main
    from llmsched.server.bench import MAX_BENCH_LEN

    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--num-prompts", "2", "--input-len", "1000000000"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--input-len 1000000000" in err and f"{MAX_BENCH_LEN:,}" in err, err
    with pytest.raises(ConfigError, match="--output-len"):
        BenchConfig(output_len=MAX_BENCH_LEN + 1)
    with pytest.raises(ConfigError, match="--random-range-ratio 0.5"):
        BenchConfig(input_len=MAX_BENCH_LEN, random_range_ratio=0.5)
    BenchConfig(input_len=MAX_BENCH_LEN)  # the limit itself is taken


def test_output_len_moot_message_points_to_sharegpt_output_len(capsys):
    from llmsched.cli import main

    argv = ["bench", "--port", "1", "--dataset-name", "trace", "--dataset-path", "t.csv", "--output-len", "9"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sharegpt-output-len" in err, err


def test_a_token_id_range_past_64_bits_is_refused_before_the_run(capsys):
    """`--token-id-range 0,99999999999999999999` reached numpy after the server was
    contacted: a traceback ("high is out of bounds for int64"), exit 1."""
    from llmsched.cli import main

    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--token-id-range", "0,99999999999999999999"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--token-id-range" in err and "99999999999999999999" in err, err
    with pytest.raises(ConfigError, match="--token-id-range"):
        BenchConfig(token_id_range=(0, (1 << 63) + 1))
    cfg = BenchConfig(token_id_range=((1 << 63) - 3, 1 << 63))  # the int64 limit itself is taken
    wl = make_workload(BenchConfig(num_prompts=1, input_len=4, output_len=1))
    ids = json.loads(build_payloads(cfg, wl, "m")[0])["prompt"]
    assert len(ids) == 4 and all((1 << 63) - 3 <= i < 1 << 63 for i in ids)


def test_repeated_goodput_and_metadata_add_up():
    """`--goodput ttft:500 --goodput tpot:50` kept only tpot (argparse's nargs replaced the
    earlier list); --metadata likewise."""
    from llmsched.cli import build_parser

    a = build_parser().parse_args(
        ["bench", "--goodput", "ttft:500", "--goodput", "tpot:50", "e2el:9000", "--result-file", "r.json"]
        + ["--metadata", "a=1", "--metadata", "b=2", "c=3"]
    )
    cfg = BenchConfig.from_args(a)
    assert cfg.goodput == {"ttft": 500.0, "tpot": 50.0, "e2el": 9000.0}
    assert cfg.metadata == {"a": "1", "b": "2", "c": "3"}


def test_backend_vllm_is_the_completions_api():
    """`vllm bench serve`'s default --backend, vllm, is its name for the completions API:
    it was refused as an invalid choice. It sends to /v1/completions and names the result
    (backend, endpoint_type, default label) as vLLM does."""
    p = _parser()
    v = BenchConfig.from_args(p.parse_args(["bench", "--backend", "vllm", "--save-result", "--request-rate", "5"]))
    assert v.endpoint == "/v1/completions" and not v.chat and v.backend_name == "vllm"
    assert v.result_path("org/m", "20260101-000000") == "vllm-5.0qps-m-20260101-000000.json"
    with pytest.raises(ConfigError, match="--backend vllm sends to /v1/completions"):
        BenchConfig.from_args(p.parse_args(["bench", "--backend", "vllm", "--endpoint", "/v1/chat/completions"]))
    # without --backend, the names stay openai / openai-chat
    assert BenchConfig().backend_name == "openai"
    assert BenchConfig(endpoint="/v1/chat/completions").backend_name == "openai-chat"


def test_ready_check_waits_for_a_starting_server(capsys):
    """vLLM's --ready-check-timeout-sec (scripts pass it, often as 0, and it was refused as
    unknown): wait for a server that refuses connections or answers 503 while it starts."""
    import asyncio
    import time

    from llmsched.cli import main
    from llmsched.server.bench import wait_until_ready

    class Starting:
        def __init__(self, answers):
            self.answers, self.asked = list(answers), 0

        async def get_json(self, path, headers):
            self.asked += 1
            a = self.answers.pop(0)
            if isinstance(a, Exception):
                raise a
            return a, {}

    c = Starting([ConnectionRefusedError(111, "refused"), (503), (200)])
    asyncio.run(wait_until_ready(c, BenchConfig(ready_check_timeout=30), {}))
    assert c.asked == 3 and not c.answers
    never = Starting([ConnectionRefusedError(111, "refused")] * 100)
    t = time.monotonic()
    asyncio.run(wait_until_ready(never, BenchConfig(ready_check_timeout=1.2), {}))
    assert 1.1 < time.monotonic() - t < 5 and 2 <= never.asked <= 5  # gives up after the time, polling
    # the flag: 0 (vLLM's "skip") is taken; a bad value is one line; a dead server is named after the wait
    base = ["bench", "--port", "1", "--num-prompts", "1", "--quiet"]
    assert main([*base, "--ready-check-timeout-sec", "-1"]) == 2
    assert "--ready-check-timeout-sec must be from 0" in capsys.readouterr().err
    t = time.monotonic()
    assert main([*base, "--ready-check-timeout-sec", "1"]) == 2
    assert time.monotonic() - t >= 1 and "cannot reach http://127.0.0.1:1" in capsys.readouterr().err
    assert main([*base, "--ready-check-timeout-sec", "0"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_served_model_name_and_trust_remote_code(tmp_path, capsys):
    """vllm bench serve's --served-model-name (the name requests carry when the server's
    differs from --model, the result's model_id) and --trust-remote-code (for its
    tokenizer) were refused as unknown flags."""
    import json

    from srv_helpers import running_server

    from llmsched.cli import main

    with running_server(b_max=64) as (base, _):
        argv = ["bench", "--base-url", base, "--input-len", "8", "--output-len", "2", "--num-prompts", "3"]
        argv += ["--quiet", "--model", "org/llama", "--trust-remote-code", "--save-result"]
        argv += ["--result-dir", str(tmp_path)]
        assert main([*argv, "--served-model-name", "llmsched-sim"]) == 0
        err = capsys.readouterr().err
        assert "note: --trust-remote-code is not used" in err
        (f,) = tmp_path.glob("openai-infqps-llama-*.json")
        data = json.loads(f.read_text())
        assert data["model_id"] == "org/llama" and data["completed"] == 3
        # without it the server's 404 for the unknown model fails the warm-up
        assert main(argv) == 2
        assert "does not exist" in capsys.readouterr().err


def test_request_id_prefix_names_every_request(monkeypatch, capsys):
    """vLLM's --request-id-prefix (refused as unknown): request i carries X-Request-Id
    PREFIXi, which the server echoes in its response id."""
    from srv_helpers import running_server

    import llmsched.server.bench as bench
    from llmsched.cli import main

    sent, real = [], bench.send_request

    async def spy(client, path, headers, *a, **k):
        r = await real(client, path, headers, *a, **k)
        sent.append(headers.get("x-request-id"))
        return r

    monkeypatch.setattr(bench, "send_request", spy)
    with running_server(b_max=64) as (base, _):
        argv = ["bench", "--base-url", base, "--input-len", "8", "--output-len", "2", "--num-prompts", "3", "--quiet"]
        assert main([*argv, "--request-id-prefix", "run7-"]) == 0
        assert sorted(sent[1:]) == ["run7-0", "run7-1", "run7-2"] and sent[0] is None  # (the warm-up: none)
        sent.clear()
        assert main(argv) == 0 and set(sent) == {None}
    assert main([*argv, "--request-id-prefix", "a\nb"]) == 2
    assert "--request-id-prefix must be printable ASCII" in capsys.readouterr().err
