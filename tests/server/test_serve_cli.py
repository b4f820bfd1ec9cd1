"""`llmsched serve`'s command line: one-line errors (exit code 2) for what cannot be
served, found before a model is loaded, and the engine's documented defaults."""

from __future__ import annotations

import socket

import pytest

from llmsched.cli import build_parser, main
from llmsched.cli import server as server_cli
from llmsched.core.errors import ConfigError
from llmsched.server.app import ServerConfig


def _one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("llmsched serve: error:"), err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_drain_timeout_must_be_finite_and_not_negative(capsys, value):
    _one_line_error(capsys, ["serve", "--backend", "sim", "--drain-timeout", value], "drain timeout", value)
    with pytest.raises(ConfigError, match="drain timeout"):
        ServerConfig(drain_timeout=float(value))
    assert ServerConfig(drain_timeout=0).drain_timeout == 0


def test_an_address_that_cannot_be_bound_is_one_line(capsys):
    _one_line_error(capsys, ["serve", "--backend", "sim", "--host", "999.1.1.1", "--port", "0"], "--host", "999.1.1.1")


def test_a_port_in_use_is_one_line(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        _one_line_error(capsys, ["serve", "--backend", "sim", "--port", str(port)], f"--port {port}", "in use")
    finally:
        busy.close()


def test_two_servers_on_one_port_the_second_is_refused():
    """The first bind_socket listens at once (before a model loads): a second one on the
    same port is refused with the one-line error, not left bound with nobody listening."""
    from llmsched.server.serving import bind_socket

    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=f"--port {port}: .* already in use"):
            bind_socket("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the first one accepts connections (queued in its backlog)
    finally:
        first.close()


def test_engine_max_running_default_is_the_documented_one(tmp_path, capsys):
    """serve --model on CPU caps running requests at 64, as its help and `generate` say
    (it was the engine's own 256)."""
    from llmsched.core.engine_api import LLM_MAX_NUM_SEQS
    from llmsched.engine import LLMEngine, make_tiny_model

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    # the help told the commands' 64 on CPU as "the engine's": the Python LLM takes 256 there
    assert (
        f"the engine commands: 64 on CPU, 256 on CUDA; the Python LLM and LLMEngine: {LLM_MAX_NUM_SEQS})"
        in " ".join(capsys.readouterr().out.split())
    )
    model = make_tiny_model(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    argv = ["serve", "--model", str(model), "--num-blocks", "128", "--max-model-len", "256"]
    parser = build_parser("serve")
    backend = server_cli.build_backend(parser.parse_args(argv))
    assert backend.core.spec.max_running == 64
    backend = server_cli.build_backend(parser.parse_args([*argv, "--max-running", "8"]))
    assert backend.core.spec.max_running == 8
    engine = LLMEngine(str(model), num_blocks=512, max_model_len=256)
    assert engine.max_num_seqs == LLM_MAX_NUM_SEQS == 256  # (as docs/engine.md says, on CPU too)


@pytest.mark.parametrize("value", ["nan", "50", "0"])
def test_the_engine_backend_refuses_sim_max_debt_ms(capsys, value):
    """it paces the virtual GPU only: on the engine backend any value (nan too) was accepted."""
    argv = ["serve", "--model", "/no/such/model", "--port", "0", "--sim-max-debt-ms", value]
    _one_line_error(capsys, argv, "--sim-max-debt-ms", "engine backend does not use it")


def test_the_sim_backend_still_checks_sim_max_debt_ms(capsys):
    _one_line_error(capsys, ["serve", "--backend", "sim", "--port", "0", "--sim-max-debt-ms", "nan"], "must be >= 0")


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--kv-cache-gb", "-5", "--num-blocks", "8"], "--kv-cache-gb must be a positive finite number"),
        (["--kv-cache-gb", "nan"], "--kv-cache-gb must be a positive finite number"),
        (["--kv-cache-gb", "inf"], "--kv-cache-gb must be a positive finite number"),
        (["--kv-cache-gb", "1", "--num-blocks", "8"], "give the KV cache's size once"),
    ],
)
def test_kv_cache_gb_is_checked_and_not_overridden_silently(capsys, extra, words):
    _one_line_error(capsys, ["serve", "--model", "/no/such/model", "--port", "0", *extra], words)


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused(capsys, host):
    """'' bound every interface and printed http://:PORT/v1."""
    _one_line_error(capsys, ["serve", "--backend", "sim", "--port", "0", "--host", host], "--host must name an address")


@pytest.mark.parametrize("key", ["", "two words", "caf\u00e9", "tab\there"])
def test_an_api_key_that_no_header_can_carry_is_refused(capsys, monkeypatch, key):
    """'' served with no key at all (and with $LLMSCHED_API_KEY set, served that one); a
    space or an accent made a key no client's 'Bearer KEY' header matched."""
    monkeypatch.setenv("LLMSCHED_API_KEY", "from-env")
    err = _one_line_error(capsys, ["serve", "--backend", "sim", "--port", "0", "--api-key", key], "--api-key")
    assert "visible ASCII" in err
    monkeypatch.setenv("LLMSCHED_API_KEY", key)
    if key:  # an empty variable counts as unset
        _one_line_error(capsys, ["serve", "--backend", "sim", "--port", "0"], "$LLMSCHED_API_KEY")


def test_the_api_key_comes_from_the_flag_then_the_environment(monkeypatch):
    from llmsched.core.checks import check_api_key

    monkeypatch.delenv("LLMSCHED_API_KEY", raising=False)
    assert check_api_key(None, "LLMSCHED_API_KEY") is None
    monkeypatch.setenv("LLMSCHED_API_KEY", "")
    assert check_api_key(None, "LLMSCHED_API_KEY") is None
    monkeypatch.setenv("LLMSCHED_API_KEY", "env-key")
    assert check_api_key(None, "LLMSCHED_API_KEY") == "env-key"
    assert check_api_key("sk-flag_1.2~", "LLMSCHED_API_KEY") == "sk-flag_1.2~"


DEVICE_FLAGS = (["--gpu-memory-utilization", "0.5"], ["--enforce-eager"], ["--threads", "1"])


@pytest.mark.parametrize("flag", DEVICE_FLAGS)
def test_the_sim_backend_refuses_the_engines_device_flags(capsys, flag):
    _one_line_error(capsys, ["serve", "--backend", "sim", "--port", "0", *flag], flag[0], "is an engine option")


def test_the_engines_device_flags_reach_the_engine(tmp_path, monkeypatch):
    """serve had no --gpu-memory-utilization, --enforce-eager or --threads (generate's),
    while the engine's out-of-memory message on CUDA asks for --gpu-memory-utilization."""
    from llmsched.engine import make_tiny_model
    from llmsched.server import backends

    model = make_tiny_model(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    argv = ["serve", "--model", str(model), "--num-blocks", "128", "--max-model-len", "256"]
    argv += [a for flag in DEVICE_FLAGS for a in flag]
    parser = build_parser("serve")
    seen = {}
    real = backends.make_engine_backend
    monkeypatch.setattr(backends, "make_engine_backend", lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    assert server_cli.build_backend(parser.parse_args(argv)).kind == "engine"
    assert (seen["gpu_memory_utilization"], seen["enforce_eager"], seen["num_threads"]) == (0.5, True, 1)
    # not given: the engine's own defaults (None and False are not passed on as given)
    server_cli.build_backend(parser.parse_args(argv[:7]))
    assert (seen["gpu_memory_utilization"], seen["enforce_eager"], seen["num_threads"]) == (None, None, None)


def test_a_kv_cache_that_cuts_the_context_names_the_flag_that_sized_it(tmp_path):
    """the warning said 'give more --kv-cache-gb' whatever sized the cache: with --num-blocks
    (which refuses --kv-cache-gb beside it), and on CUDA (where --kv-cache-gb is not used)."""
    from llmsched.core.errors import InputWarning
    from llmsched.engine import make_tiny_model

    model = make_tiny_model(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    argv = ["serve", "--model", str(model), "--num-blocks", "20", "--max-running", "4"]
    with pytest.warns(InputWarning, match=r"may reach 257 .*: raise --num-blocks or lower --max-running"):
        server_cli.build_backend(build_parser("serve").parse_args(argv))


@pytest.mark.parametrize(
    "value, tokens",
    [("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("4.1k", 4_100), ("1m", 10**6), ("2048", 2048)],
)
def test_token_counts_take_vllms_suffixes(value, tokens):
    """vLLM's --max-model-len 32k (x1000; 32K: x1024) and --max-num-batched-tokens 8K were
    refused as not integers."""
    for cmd in ("serve", "generate"):
        args = build_parser(cmd).parse_args([cmd, "--model", "m", "--max-model-len", value])
        assert args.max_model_len == tokens
    args = build_parser("serve").parse_args(["serve", "--max-num-batched-tokens", value, "--b-max", value])
    assert args.b_max == tokens


@pytest.mark.parametrize(
    "value, says",
    [
        ("32x", "expected a positive integer, or one with a suffix (32k = 32,000, 32K = 32,768), got '32x'"),
        ("1.5K", "a decimal cannot take the binary suffix K (x1024), got '1.5K': did you mean 1.5k (x1000)?"),
        ("1.0001k", "expected a positive whole number of tokens, got '1.0001k' (1000.1)"),
        ("0k", "expected a positive whole number of tokens, got '0k'"),
    ],
)
def test_a_bad_suffix_is_one_line(capsys, value, says):
    for flag in ("--max-model-len", "--max-num-batched-tokens"):
        with pytest.raises(SystemExit) as e:
            main(["serve", "--backend", "sim", "--port", "0", flag, value])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and flag in err and says in err, err
