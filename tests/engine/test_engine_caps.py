"""Upper bounds of the engine's options: --threads (OpenMP crashed the process at 100,000),
--kv-cache-gb, --calibrate-s and --tables-s (OverflowError tracebacks at 1e308), and the
tiny model's sizes (allocation tracebacks, or minutes writing ~75 GB): one-line errors,
exit code 2, before anything is loaded or allocated."""

from __future__ import annotations

import pytest
import torch
from helpers import one_line_error

from llmsched.core.errors import ConfigError


@pytest.fixture
def no_set_num_threads(monkeypatch):
    """torch.set_num_threads(100000) crashes the process: fail instead if it is reached."""

    def refuse(n):
        raise AssertionError(f"torch.set_num_threads({n}) was called")

    monkeypatch.setattr(torch, "set_num_threads", refuse)


def _engine_argv(cmd: str, tmp_path, *flags: str) -> list[str]:
    """`cmd` (generate, profile or validate) on a model that does not exist, with the
    arguments it requires and `flags`: refused before the model is read."""
    extra = {
        "generate": ["--prompt", "hi"],
        "profile": ["--out", str(tmp_path / "p.csv")],
        "validate": ["--trace", str(tmp_path / "t.csv")],
        "serve": ["--port", "0"],
    }[cmd]
    return [cmd, "--model", "/no/such/model", *extra, *flags]


@pytest.mark.parametrize("cmd", ["generate", "profile", "validate", "serve"])
def test_threads_has_an_upper_bound(capsys, tmp_path, no_set_num_threads, cmd):
    argv = _engine_argv(cmd, tmp_path, "--threads", "100000")
    one_line_error(capsys, argv, "--threads", "at most 1,024")


def test_the_cli_and_the_engine_share_the_threads_cap():
    from llmsched.cli.engine import MAX_KV_CACHE_GB, MAX_MEASURE_S, MAX_THREADS
    from llmsched.engine import profiler, runner

    assert (MAX_THREADS, MAX_KV_CACHE_GB, MAX_MEASURE_S) == (
        runner.MAX_THREADS,
        runner.MAX_KV_CACHE_GB,
        profiler.MAX_MEASURE_S,
    )


@pytest.mark.parametrize("n", [100000, 1025, True, 0, 2.0])
def test_python_api_refuses_too_many_threads(tiny_model, no_set_num_threads, n):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match="num_threads"):
        LLM(tiny_model, num_threads=n)


@pytest.mark.parametrize("cmd", ["generate", "profile", "validate"])
def test_kv_cache_gb_has_an_upper_bound(capsys, tmp_path, cmd):
    """int(1e308 * 2**30): an OverflowError traceback."""
    argv = _engine_argv(cmd, tmp_path, "--kv-cache-gb", "1e308")
    one_line_error(capsys, argv, "--kv-cache-gb must be at most 1,048,576 GiB", "1e+308")


def test_serve_kv_cache_gb_has_an_upper_bound(capsys):
    argv = ["serve", "--model", "/no/such/model", "--port", "0", "--kv-cache-gb", "1e308"]
    one_line_error(capsys, argv, "--kv-cache-gb must be at most 1,048,576 GiB")


@pytest.mark.parametrize("gb", [1e308, 2.0**20 + 1])
def test_python_api_refuses_a_huge_kv_cache(tiny_model, gb):
    from llmsched.engine import LLM

    with pytest.raises(ConfigError, match="kv_cache_gb must be at most 1,048,576 GiB"):
        LLM(tiny_model, kv_cache_gb=gb, num_threads=1)


@pytest.mark.parametrize("option", ["--calibrate-s", "--tables-s"])
def test_measurement_seconds_have_an_upper_bound(tmp_path, capsys, option):
    """round(rate * 1e308): an OverflowError traceback (profile and validate)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    for argv in (
        ["profile", "--model", "/no/such/model", "--out", str(tmp_path / "p.csv")],
        ["validate", "--model", "/no/such/model", "--trace", str(trace)],
    ):
        one_line_error(capsys, [*argv, option, "1e308"], f"{option} must be at most 1e+06 s", "1e+308")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(calibrate_s=1e308), "calibrate_s must be"),
        (dict(calibrate_s=0), "calibrate_s must be"),
        (dict(calibrate_s=float("nan")), "calibrate_s must be"),
        (dict(min_s=1e308), "min_s (--tables-s) must be"),
        (dict(min_s=-1), "min_s (--tables-s) must be"),
        (dict(min_s="3"), "min_s (--tables-s) must be"),
    ],
)
def test_python_api_profile_refuses_huge_seconds(tmp_path, kwargs, words):
    """Refused before the model is loaded (the folder does not exist)."""
    from llmsched.engine.profiler import profile

    with pytest.raises(ConfigError) as e:
        profile(tmp_path / "no-model", tmp_path / "p.csv", **kwargs)
    assert words in str(e.value), e.value


@pytest.mark.parametrize(
    "flags",
    [["--hidden-size", "1000000000"], ["--intermediate-size", "10000000000"], ["--layers", "100000"]],
)
def test_make_tiny_model_refuses_a_model_that_is_not_tiny(capsys, tmp_path, flags):
    """allocation tracebacks, or minutes on the way to ~75 GB of weights."""
    out = tmp_path / "m"
    one_line_error(capsys, ["make-tiny-model", str(out), *flags], "more than a tiny model's 2 GiB", flags[0])
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--heads", "3"], "hidden_size (128) must split into num_heads (3)"),
        (["--hidden-size", "12", "--heads", "4"], "hidden_size (12) must split into num_heads (4) heads of an even"),
        (["--kv-heads", "3"], "num_heads (4) must be a multiple of num_kv_heads (3)"),
    ],
)
def test_make_tiny_model_names_the_head_sizes_that_do_not_fit(capsys, tmp_path, flags, words):
    """one message for both cases named no value."""
    out = tmp_path / "m"
    one_line_error(capsys, ["make-tiny-model", str(out), *flags], words)
    assert not out.exists()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tie", [False, True])
def test_tiny_param_count_is_the_written_count(tmp_path, arch, tie):
    from safetensors.torch import load_file

    from llmsched.engine.tiny import make_tiny_model, tiny_param_count

    kw = dict(
        vocab_size=300,
        hidden_size=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=24,
        tie_word_embeddings=tie,
    )
    out = make_tiny_model(tmp_path / "m", arch=arch, **kw)
    weights = load_file(out / "model.safetensors")
    assert sum(t.numel() for t in weights.values()) == tiny_param_count(arch=arch, **kw)
