"""/metrics: the histograms a vLLM dashboard plots (queue, prefill, decode and inference
time, prompt and generation length, iteration tokens), process metrics, and the `vllm:`
prefix, over real HTTP on loopback (the sim backend: 5 ms steps)."""

from __future__ import annotations

import httpx
import pytest
from srv_helpers import post, running_server, wait_for

from llmsched.server.app import ServerConfig

MODEL = "llmsched-sim"


def _values(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def test_request_histograms_and_process_metrics():
    with running_server() as (base, srv):
        for _ in range(3):
            r = post(base, "/v1/completions", {"model": MODEL, "prompt": [1] * 8, "max_tokens": 5})
            assert r.status_code == 200
        eng = srv.config.app.state.engine
        assert wait_for(lambda: not eng.streams)
        v = _values(httpx.get(base + "/metrics").text)
        lab = '{model_name="llmsched-sim"}'
        h = "llmsched:request_"
        assert v[f"{h}prompt_tokens_count{lab}"] == 3 and v[f"{h}prompt_tokens_sum{lab}"] == 24
        assert v[f"{h}generation_tokens_count{lab}"] == 3 and v[f"{h}generation_tokens_sum{lab}"] == 15
        for phase in ("queue", "prefill", "decode", "inference"):
            assert v[f"{h}{phase}_time_seconds_count{lab}"] == 3, phase
        # one request at a time: a 5 ms prefill step, then 4 decode steps of 5 ms
        assert 3 * 0.004 <= v[f"{h}prefill_time_seconds_sum{lab}"] <= 3 * 0.2
        assert 3 * 0.016 <= v[f"{h}decode_time_seconds_sum{lab}"] <= 3 * 0.5
        assert v[f"{h}inference_time_seconds_sum{lab}"] == pytest.approx(
            v[f"{h}prefill_time_seconds_sum{lab}"] + v[f"{h}decode_time_seconds_sum{lab}"]
        )
        assert v[f"{h}time_per_output_token_seconds_count{lab}"] == 3
        # every step's tokens: 8 prompt tokens + 4 decode tokens per request
        assert v[f"llmsched:iteration_tokens_total_sum{lab}"] == 3 * (8 + 4)
        assert v[f"llmsched:iteration_tokens_total_count{lab}"] == 3 * 5
        b = [x for k, x in v.items() if k.startswith("llmsched:iteration_tokens_total_bucket")]
        assert b == sorted(b) and b[-1] == 15
        assert v["process_resident_memory_bytes"] > 10e6
        assert v["process_virtual_memory_bytes"] >= v["process_resident_memory_bytes"]
        assert v["process_cpu_seconds_total"] > 0 and v["process_open_fds"] > 3
        assert v["process_start_time_seconds"] > 1.6e9


def test_max_tokens_0_counts_no_generated_token():
    """`max_tokens: 0` with `echo` returns no token (usage: 0 completion tokens), but the
    engine samples one that the handler drops: /metrics counted it as generated."""
    with running_server() as (base, srv):
        body = {"model": MODEL, "prompt": "score me", "max_tokens": 0, "echo": True}
        r = post(base, "/v1/completions", {**body, "n": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0
        r = post(base, "/v1/completions", {**body, "stream": True})
        assert r.status_code == 200
        eng = srv.config.app.state.engine
        assert wait_for(lambda: not eng.streams)
        v = _values(httpx.get(base + "/metrics").text)
        lab = '{model_name="llmsched-sim"}'
        assert v[f"llmsched:request_generation_tokens_count{lab}"] == 3  # the requests are there
        assert v[f"llmsched:request_generation_tokens_sum{lab}"] == 0
        assert v[f"llmsched:generation_tokens_total{lab}"] == 0
        assert v[f"llmsched:prompt_tokens_total{lab}"] > 0


def test_aborted_requests_are_not_in_the_request_histograms():
    with running_server() as (base, srv):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 400, "stream": True}
        eng = srv.config.app.state.engine
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            for _ in r.iter_bytes():
                break
        assert wait_for(lambda: not eng.streams)
        v = _values(httpx.get(base + "/metrics").text)
        assert v['llmsched:request_generation_tokens_count{model_name="llmsched-sim"}'] == 0
        assert v['llmsched:request_success_total{model_name="llmsched-sim",finished_reason="abort"}'] == 1


def test_vllm_prefix():
    with running_server(cfg=ServerConfig(metrics_prefix="vllm")) as (base, _):
        post(base, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
        text = httpx.get(base + "/metrics").text
        assert "vllm:request_queue_time_seconds_count" in text and "vllm:num_requests_running" in text
        assert "llmsched:" not in text


def test_metrics_prefix_flag(capsys):
    from llmsched.cli import main
    from llmsched.core.errors import ConfigError

    with pytest.raises(ConfigError):
        ServerConfig(metrics_prefix="sglang")
    with pytest.raises(SystemExit) as e:  # argparse: one line, exit 2
        main(["serve", "--backend", "sim", "--metrics-prefix", "sglang"])
    assert e.value.code == 2 and "--metrics-prefix" in capsys.readouterr().err


def test_prefix_cache_counters():
    """Two requests with the same 40-token prompt, 16-token blocks: the second finds the
    first's two full blocks cached (32 tokens; the last prompt token is always computed)."""
    with running_server(prefix_caching=True, block_size=16) as (base, srv):
        eng = srv.config.app.state.engine
        for _ in range(2):
            r = post(base, "/v1/completions", {"model": MODEL, "prompt": list(range(1, 41)), "max_tokens": 2})
            assert r.status_code == 200
            assert wait_for(lambda: not eng.streams)
        v = _values(httpx.get(base + "/metrics").text)
        lab = '{model_name="llmsched-sim"}'
        assert v[f"llmsched:prefix_cache_queries_total{lab}"] == 80
        assert v[f"llmsched:prefix_cache_hits_total{lab}"] == 32
        assert v[f"llmsched:prefix_cache_queried_blocks_total{lab}"] == 4
        assert v[f"llmsched:prefix_cache_hit_blocks_total{lab}"] == 2
        assert v[f"llmsched:prefix_cache_evictions_total{lab}"] == 0
    with running_server() as (base, _):  # caching off: no prefix-cache metrics
        assert "prefix_cache" not in httpx.get(base + "/metrics").text


def test_text_prompts_hit_the_prefix_cache_by_their_content():
    """The byte rule gave every text of n tokens the ids 0..n-1: two unrelated texts of the
    same length shared every block (the virtual GPU skipped the second one's prefill). Now
    a token's id is its 4 bytes: an unrelated text hits nothing, one sharing the first 64
    bytes (16 tokens, one block) hits that block, and the same text hits its full blocks."""
    first = "The quick brown fox jumps over the lazy dog. " * 4  # 180 bytes: 45 tokens, 2 full blocks
    other = "Pack my box with five dozen liquor jugs, now!" * 4  # unrelated, as long
    shared = first[:64] + other[64:]
    hits = []
    with running_server(prefix_caching=True, block_size=16) as (base, srv):
        eng = srv.config.app.state.engine
        for prompt in (first, other, shared, first):
            r = post(base, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 45
            assert wait_for(lambda: not eng.streams)
            v = _values(httpx.get(base + "/metrics").text)
            hits.append(v['llmsched:prefix_cache_hits_total{model_name="llmsched-sim"}'])
    assert hits == [0, 0, 16, 48]


def test_cache_salt_keeps_requests_apart_in_the_prefix_cache():
    """vLLM's `cache_salt`: only requests with the same salt (or none) share cached blocks,
    so a tenant cannot time another's prompts. It was ignored: a request salted against
    every other hit the blocks of an unsalted one (and of one with another salt)."""
    prompt = [7] * 48  # 3 full blocks of 16
    hits = []
    with running_server(prefix_caching=True, block_size=16) as (base, srv):
        eng = srv.config.app.state.engine
        for salt in (None, "tenant-a", "tenant-b", "tenant-a", None):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
            if salt is not None:
                body["cache_salt"] = salt
            r = post(base, "/v1/completions", body)
            assert r.status_code == 200, r.text
            assert wait_for(lambda: not eng.streams)
            v = _values(httpx.get(base + "/metrics").text)
            hits.append(v['llmsched:prefix_cache_hits_total{model_name="llmsched-sim"}'])
        for bad in ("", 5):  # as vLLM: a non-empty string if given
            r = post(
                base,
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "cache_salt": bad},
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    # no hit across salts; tenant-a's second request hits its first's blocks, and the last
    # (unsalted) one the first request's: 2 blocks each (the last prompt token is computed)
    assert hits == [0, 0, 0, 32, 64]


def test_cache_salt_salts_the_block_ids():
    from llmsched.core.prefix_cache import token_block_ids

    ids = list(range(40))
    plain = token_block_ids(ids, 16)
    assert token_block_ids(ids, 16, None) == plain
    a, b = token_block_ids(ids, 16, "a"), token_block_ids(ids, 16, "b")
    assert len(a) == len(b) == len(plain) == 2
    assert not set(a) & set(plain) and not set(a) & set(b)
    assert token_block_ids(ids, 16, "a") == a


def test_byte_rule_ids_are_made_only_with_prefix_caching():
    """Without a prefix cache only a text's token count matters: its ids stay a range,
    made at no cost (a list of a 16 MiB text's ids took 186 ms on the event loop)."""
    from llmsched.server.backends import SchedulerOptions, make_sim_backend

    text = "abcd" * 1000 + "e"
    plain = make_sim_backend(SchedulerOptions(), "const:5").tokenizer.encode(text)
    cached = make_sim_backend(SchedulerOptions(prefix_caching=True), "const:5").tokenizer.encode(text)
    assert isinstance(plain, range) and len(plain) == len(cached) == 1001
    assert cached[0] == int.from_bytes(b"abcd", "little") and cached[-1] == ord("e")


def test_prefix_cache_counters_leave_out_readmissions_after_preemption():
    """12 concurrent requests with nothing in common, a KV cache too small for them: the
    preempted ones, re-admitted, looked their prompt + generated tokens up again and found
    their own blocks, counted in prefix_cache_queries/hits (1160 queried and 200 hit for
    480 prompt tokens). As vLLM's, those count first admissions only; the re-admissions
    have counters of their own."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [[1000 + 100 * i + j for j in range(40)] for i in range(12)]  # no block shared
    opts = {"prefix_caching": True, "block_size": 8, "kv_capacity": 320, "max_running": 6, "b_max": 64}
    with running_server(**opts) as (base, srv):
        eng = srv.config.app.state.engine

        def one(p):
            body = {"model": MODEL, "prompt": p, "max_tokens": 60, "ignore_eos": True}
            return post(base, "/v1/completions", body).status_code

        with ThreadPoolExecutor(12) as ex:
            assert list(ex.map(one, prompts)) == [200] * 12
        assert wait_for(lambda: not eng.streams)
        v = _values(httpx.get(base + "/metrics").text)
    lab = '{model_name="llmsched-sim"}'
    assert v[f"llmsched:num_preemptions_total{lab}"] > 0
    assert v[f"llmsched:prompt_tokens_total{lab}"] == 480
    assert v[f"llmsched:prefix_cache_queries_total{lab}"] == 480
    assert v[f"llmsched:prefix_cache_hits_total{lab}"] == 0
    assert v[f"llmsched:prefix_cache_queried_blocks_total{lab}"] == 12 * 5
    assert v[f"llmsched:prefix_cache_hit_blocks_total{lab}"] == 0
    # the re-admissions: at least their prompts looked up again, some of their own blocks found
    assert v[f"llmsched:prefix_cache_preempted_queries_total{lab}"] >= 40 * v[f"llmsched:num_preemptions_total{lab}"]
    assert v[f"llmsched:prefix_cache_preempted_hits_total{lab}"] > 0
