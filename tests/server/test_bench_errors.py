"""`llmsched bench` on bad input and failed runs: one-line errors (exit 2) found before
the run, named timeouts, and a non-zero exit when every request failed."""

from __future__ import annotations

import asyncio
import json
import math
import socket

import pytest
from srv_helpers import running_server

from llmsched.cli import build_parser, main
from llmsched.core.errors import ConfigError, InputWarning
from llmsched.server.app import ServerConfig
from llmsched.server.bench import BenchConfig, HttpxClient, RawClient, run_bench, send_request

SMALL = ["--num-prompts", "2", "--input-len", "8", "--output-len", "2", "--quiet"]


def _one_line_error(capsys, argv, *words, rc=2):
    assert main(argv) == rc
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("llmsched bench: error:"), err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize(
    "url, words",
    [
        ("notaurl", ["--base-url", "http://"]),
        ("ftp://host/x", ["--base-url", "http://"]),
        ("http://", ["--base-url", "http://"]),
        ("http://127.0.0.1:99999", ["--base-url", "port"]),
        ("http://127.0.0.1:notaport", ["--base-url", "port"]),
        ("http://127.0.0.1:0", ["--base-url", "port"]),
        # urlsplit itself raises ValueError for these, before the port is looked at
        ("http://[::1", ["--base-url", "not a valid URL"]),
        ("http://[zz]:80", ["--base-url", "not a valid URL"]),
    ],
)
def test_bad_base_url_is_one_line(capsys, url, words):
    _one_line_error(capsys, ["bench", "--base-url", url, *SMALL], *words)


def test_bad_port_is_one_line(capsys):
    _one_line_error(capsys, ["bench", "--port", "99999", *SMALL], "--port", "99999")


def test_base_url_with_v1_is_taken_without_it():
    """The OpenAI clients' base URL ends in /v1; the bench's endpoints already start with it."""
    for url in ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"):
        with pytest.warns(InputWarning, match="/v1"):
            cfg = BenchConfig(base_url=url)
        assert cfg.base_url == "http://127.0.0.1:8000"
    assert BenchConfig(base_url="http://h:1/proxy/").base_url == "http://h:1/proxy"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_positive_and_finite(capsys, value):
    _one_line_error(capsys, ["bench", "--timeout", value, "--port", "1", *SMALL], "--timeout", value)


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--temperature", "nan", ["from 0 to 2", "nan"]),
        ("--temperature", "-1", ["from 0 to 2", "-1"]),
        ("--temperature", "2.5", ["from 0 to 2", "2.5"]),
        ("--top-p", "0", ["(0, 1]", "got 0"]),
        ("--top-p", "2", ["(0, 1]", "got 2"]),
        ("--top-p", "inf", ["(0, 1]", "inf"]),
        ("--top-k", "-5", ["-1 or 0 (off)", "-5"]),
        ("--top-k", str(2**63), ["64-bit", str(2**63)]),
    ],
)
def test_sampling_flags_out_of_the_servers_range_are_refused_before_the_run(capsys, flag, value, words):
    """`--temperature nan` was sent as a body that is no JSON ("request body is not valid
    JSON", no flag named); -1, `--top-p 0` or `--top-k -5` failed every request at the
    server. Port 1: nothing listens there, so the error comes before any request."""
    _one_line_error(capsys, ["bench", "--port", "1", flag, value, *SMALL], flag, *words)


def test_sampling_flags_at_the_ends_of_the_range_are_taken():
    cfg = BenchConfig(temperature=2, top_p=1, top_k=-1)
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (2.0, 1.0, -1)
    assert BenchConfig(temperature=None, top_k=0).top_k == 0


def test_extra_body_with_nan_is_refused(capsys):
    # json.loads takes NaN and Infinity, which are no JSON: the body sent was refused
    for text in ('{"temperature": NaN}', '{"top_p": Infinity}'):
        _one_line_error(capsys, ["bench", "--port", "1", "--extra-body", text, *SMALL], "--extra-body", "JSON object")


def test_unwritable_result_paths_are_refused_before_the_run(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    # port 1: nothing listens there, so an error about the server would mean the run began
    base = ["bench", "--port", "1", *SMALL]
    _one_line_error(capsys, [*base, "--result-file", str(afile / "r.json")], "--result-file", "not a folder")
    _one_line_error(capsys, [*base, "--result-file", str(tmp_path)], "--result-file", "is a folder")
    _one_line_error(capsys, [*base, "--save-result", "--result-dir", str(afile)], "--result-dir", "not a folder")
    _one_line_error(
        capsys,
        [*base, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "afile/r.json"],
        "--result-filename",
    )
    with pytest.raises(ConfigError, match="--result-file"):
        run_bench(BenchConfig(base_url="http://127.0.0.1:1", result_file=str(afile / "r.json"), num_prompts=1))
    assert afile.read_text() == "x"


def test_a_file_that_is_no_bench_result_is_not_replaced(tmp_path, capsys):
    """`--result-file notes.txt` replaced the file with the result JSON (exit 0); with
    `--append-result` a JSON line was added to it. Refused before the run, as `profile
    --out` and `validate --json` refuse a file they did not write."""
    doc = tmp_path / "notes.txt"
    doc.write_text("precious\n")
    base = ["bench", "--port", "1", *SMALL]  # nothing listens on port 1: the run never began
    _one_line_error(capsys, [*base, "--result-file", str(doc)], "--result-file", "not a bench result")
    _one_line_error(
        capsys, [*base, "--result-file", str(doc), "--append-result"], "--result-file", "does not hold bench results"
    )
    _one_line_error(
        capsys,
        [*base, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "notes.txt"],
        "--result-filename",
        "not a bench result",
    )
    # JSON, but not a bench result (another tool's)
    other = tmp_path / "config.json"
    other.write_text('{"model": "x"}')
    _one_line_error(capsys, [*base, "--result-file", str(other)], "--result-file", "not a bench result")
    assert doc.read_text() == "precious\n" and other.read_text() == '{"model": "x"}'


def test_a_bench_result_file_is_replaced_or_appended_to(tmp_path, capsys):
    """A file that holds bench results is still replaced (as vLLM's `--save-result` does),
    or with `--append-result` gets one more line; an empty file is taken too."""
    out, lines, empty = tmp_path / "r.json", tmp_path / "r.jsonl", tmp_path / "empty"
    empty.write_text("")
    with running_server(cost="const:1") as (base, _):
        argv = ["bench", "--base-url", base, *SMALL]
        assert main([*argv, "--result-file", str(out)]) == 0
        assert main([*argv, "--result-file", str(out), "--num-prompts", "3"]) == 0
        assert json.loads(out.read_text())["num_prompts"] == 3
        for _ in range(2):
            assert main([*argv, "--result-file", str(lines), "--append-result"]) == 0
        # a replaced (indented) result, then appended lines: still bench results only
        assert main([*argv, "--result-file", str(out), "--append-result"]) == 0
        assert main([*argv, "--result-file", str(out), "--append-result"]) == 0
        assert main([*argv, "--result-file", str(empty)]) == 0
    assert [json.loads(line)["completed"] for line in lines.read_text().splitlines()] == [2, 2]
    assert json.loads(empty.read_text())["completed"] == 2
    trailing = tmp_path / "t.json"
    trailing.write_text(lines.read_text().splitlines()[0] + "\nnotes")  # a result, then other text
    _one_line_error(capsys, ["bench", "--port", "1", *SMALL, "--result-file", str(trailing)], "not a bench result")


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("client_kind", ["raw", "httpx"])
def test_a_timed_out_request_names_the_timeout(silent_port, client_kind):
    base = f"http://127.0.0.1:{silent_port}"

    async def one():
        client = RawClient(base, 0.3) if client_kind == "raw" else HttpxClient(base, 0.3, 1)
        try:
            return await send_request(client, "/v1/completions", {}, b"{}", 1, False)
        finally:
            await client.aclose()

    r = asyncio.run(one())
    assert not r.success and r.error == "timed out after 0.3 s (--timeout)"


def test_listing_models_times_out_with_a_named_timeout(silent_port, capsys):
    _one_line_error(
        capsys,
        ["bench", "--port", str(silent_port), "--timeout", "0.3", *SMALL],
        "cannot reach",
        "timed out after 0.3 s (--timeout)",
    )


def test_a_rejected_api_key_is_not_a_missing_one(capsys):
    with running_server(cfg=ServerConfig(api_key="sekret"), cost="const:1") as (base, _):
        _one_line_error(capsys, ["bench", "--base-url", base, "--api-key", "wrong", *SMALL], "rejected the API key")
        err = _one_line_error(capsys, ["bench", "--base-url", base, *SMALL], "wants an API key")
        assert "rejected" not in err
        assert main(["bench", "--base-url", base, "--api-key", "sekret", *SMALL]) == 0
        # with --model, /v1/models is not asked: the 401 came from the warm-up ("the
        # warm-up request ... failed: HTTP 401"), or with --num-warmups 0 from every
        # request ("all 2 requests failed", exit 1); chat's /tokenize gave a wrong warning
        wrong = ["bench", "--base-url", base, "--model", "m", "--api-key", "wrong", *SMALL]
        _one_line_error(capsys, wrong, "rejected the API key (HTTP 401)")
        _one_line_error(capsys, [*wrong, "--num-warmups", "0"], "rejected the API key (HTTP 401)")
        _one_line_error(capsys, [*wrong, "--backend", "openai-chat"], "rejected the API key (HTTP 401)")
        _one_line_error(capsys, ["bench", "--base-url", base, "--model", "m", *SMALL], "wants an API key")


def test_every_request_failed_exits_1_and_keeps_the_result(tmp_path, capsys):
    """Prompts longer than the context: the run is a failure (exit 1, one line naming the
    first error), and the result file still records it."""
    out = tmp_path / "r.json"
    with running_server(cost="const:1", kv_capacity=1000) as (base, _):
        argv = ["bench", "--base-url", base, "--num-prompts", "3", "--input-len", "2000", "--output-len", "2"]
        assert main([*argv, "--quiet", "--result-file", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("llmsched bench: error: all 3 requests failed; the first: HTTP 400")
        assert "context" in err[-1]
        saved = json.loads(out.read_text())
        assert saved["completed"] == 0 and saved["failed"] == 3
        # one request that works: exit 0, as vllm bench serve
        assert main(["bench", "--base-url", base, *SMALL]) == 0
    assert math.isfinite(saved["duration"])


def test_top_k_0_is_sent_and_served(capsys, tmp_path):
    """`--top-k 0` is vLLM's "off": the server takes it, so the run succeeds."""
    out = tmp_path / "r.json"
    with running_server(cost="const:1") as (base, _):
        assert main(["bench", "--base-url", base, "--top-k", "0", "--result-file", str(out), *SMALL]) == 0
    saved = json.loads(out.read_text())
    assert saved["completed"] == 2 and saved["failed"] == 0


def test_result_file_in_a_missing_folder_makes_the_folder(capsys, tmp_path):
    """`--result-file` makes its missing folders, as every other output flag does."""
    out = tmp_path / "new" / "deeper" / "r.json"
    with running_server(cost="const:1") as (base, _):
        assert main(["bench", "--base-url", base, "--result-file", str(out), *SMALL]) == 0
    assert json.loads(out.read_text())["completed"] == 2


@pytest.mark.parametrize("key", ["n", "best_of", "stream", "stream_options", "model", "prompt", "max_tokens", "echo"])
def test_extra_body_cannot_override_what_bench_sets_and_measures(capsys, key):
    """`{"n": 4}` went out and the run reported one choice's tokens as the request's."""
    body = json.dumps({key: 4})
    _one_line_error(capsys, ["bench", "--port", "1", "--extra-body", body, *SMALL], "--extra-body", repr(key))


def test_extra_body_sampling_keys_are_checked_and_given_once(capsys):
    run = ["bench", "--port", "1", *SMALL, "--extra-body"]
    _one_line_error(capsys, [*run, '{"temperature": 3}'], "--extra-body", "'temperature'", "0 to 2")
    _one_line_error(capsys, [*run, '{"top_p": 0}'], "--extra-body", "'top_p'")
    _one_line_error(capsys, [*run, '{"ignore_eos": "yes"}'], "--extra-body", "ignore_eos")
    err = _one_line_error(capsys, [*run, '{"top_k": 5}', "--top-k", "7"], "--extra-body", "--top-k", "give it once")
    assert "5" in err and "7" in err
    _one_line_error(capsys, [*run, '{"ignore_eos": true}', "--no-ignore-eos"], "--ignore-eos", "give it once")
    p = build_parser()
    # a flag left at its default, or given the same value, is no conflict
    for extra, flags in (('{"temperature": 0.7}', []), ('{"top_k": 5}', ["--top-k", "5"])):
        cfg = BenchConfig.from_args(p.parse_args(["bench", "--extra-body", extra, *flags]))
        assert cfg.extra_body == json.loads(extra)


def test_token_id_range_with_text_prompts_is_refused(capsys):
    run = ["bench", "--port", "1", *SMALL, "--token-id-range", "5,50"]
    _one_line_error(capsys, [*run, "--backend", "openai-chat"], "--token-id-range does nothing", "chat")
    _one_line_error(capsys, [*run, "--prompt-format", "text"], "--token-id-range does nothing", "text")
    cfg = BenchConfig.from_args(build_parser().parse_args(["bench", "--token-id-range", "5,50"]))
    assert cfg.token_id_range == (5, 50)


def test_empty_percentile_metrics_are_refused(capsys):
    _one_line_error(capsys, ["bench", "--port", "1", *SMALL, "--percentile-metrics", ""], "--percentile-metrics")


def test_an_empty_api_key_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    _one_line_error(capsys, ["bench", "--port", "1", *SMALL, "--api-key", ""], "--api-key", "leave it out")


@pytest.mark.parametrize("indent", [None, 2])
def test_a_sharegpt_json_is_named_as_such(capsys, tmp_path, indent):
    """`vllm bench serve --dataset-name sharegpt --dataset-path` takes ShareGPT's JSON
    conversations; bench takes token lengths from a CSV file. The JSON was refused with the
    CSV reader's errors: its text shown as column names, or (pretty-printed) a hint at
    Mooncake traces and --trace, options bench does not have."""
    conv = [{"id": "a", "conversations": [{"from": "human", "value": "hi, you"}, {"from": "gpt", "value": "hello"}]}]
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(json.dumps(conv, indent=indent))
    argv = ["bench", "--port", "1", "--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "2"]
    err = _one_line_error(capsys, argv, f"--dataset-path: {path} is JSON", "vLLM's ShareGPT", "prompt_tokens")
    assert "Mooncake" not in err and 'conversations"' not in err
