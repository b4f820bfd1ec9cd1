"""Workload laws and arrivals a bug hunt found drawn wrongly, unwarned or answered with a traceback."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from helpers import one_line_error

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.workload.lengths import Lognormal, parse_length_law


@pytest.mark.parametrize("cv", [1e-9, 1e-163, 1e-300])
def test_a_lognormal_law_of_a_tiny_cv_draws_its_mean(cv):
    """cv**2 underflowed to 0 below about 1e-162: a log-sd of 0, and `lognormal:mean=100,
    cv=1e-200` was a ZeroDivisionError (a traceback on the CLI)."""
    law = parse_length_law(f"lognormal:mean=100,cv={cv}")
    assert law.log_sigma == pytest.approx(cv, rel=1e-12)
    assert np.all(law.sample(np.random.default_rng(0), 1000) == 100)
    assert law.expected() == pytest.approx(100.0)
    assert Lognormal(100, cv=0.5).log_sigma == pytest.approx(np.sqrt(np.log1p(0.25)), rel=1e-15)


@pytest.mark.parametrize("mean", ["0.5", "1e-300"])
def test_a_lognormal_mean_below_one_token_is_refused(capsys, mean):
    """Every sample is at least 1 token: `lognormal:mean=0.5,sigma=1` drew a mean of about
    1.1 tokens, and mean=1e-300 one token each, silently (geometric refuses such a mean)."""
    argv = ["simulate", "--prompt", f"lognormal:mean={mean},sigma=1", "--num-requests", "5", "--out", ""]
    one_line_error(capsys, argv + ["--cost-model", "const:1"], "--prompt: lognormal mean must be >= 1 token", mean)


def test_a_lognormal_mean_of_one_token_still_draws():
    law = parse_length_law("lognormal:mean=1,sigma=0.5")
    x = law.sample(np.random.default_rng(0), 200_000)
    assert x.min() == 1 and abs(x.mean() - law.expected()) < 0.01


def test_gamma_arrivals_of_a_class_mix_warn_when_the_realised_rate_is_loose(capsys, tmp_path):
    """A mix's classes are drawn over one gamma stream: cv 30 over 5,000 requests spreads
    the realised rate by +-42% with classes as without them, but only a run without them
    said so."""
    classes = [{"tag": "a", "share": 1}, {"tag": "b", "share": 3}]
    run = {"arrival": "gamma", "rate": 5, "cv": 30, "prompt": "geometric:100", "output": "geometric:20"}
    for workload in (run, {**run, "classes": classes}):
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump({"cost_model": "const:1", "workload": workload}))
        assert main(["simulate", "--config", str(cfg), "--quiet", "--out", ""]) == 0
        err = capsys.readouterr().err
        assert "warning: gamma arrivals of cv 30: the realised rate of 5,000 requests varies by about +-42%" in err


@pytest.mark.parametrize(
    "law",
    [
        {"law": "uniform", "hi": "9,2"},  # was uniform:2,9
        {"law": "geometric", "mean": "100,max=5"},  # was geometric:mean=100,max=5
        {"law": "lognormal", "mean": "100,sigma=1"},
    ],
)
def test_a_length_law_mapping_value_holding_a_comma_is_refused(law):
    """A mapping's values were joined into the string form, where a comma starts another
    parameter: the mapping read as another law, silently."""
    with pytest.raises(ConfigError, match="must be one number, got '"):
        parse_length_law(law)
    assert parse_length_law({"law": "uniform", "lo": 2, "hi": 9}) == parse_length_law("uniform:2,9")
    # a number in quotes is text, refused as a config's numbers are (`lo: "2"` ran as 2)
    with pytest.raises(ConfigError, match=r"'lo' must be one number, got '2' \(a number in quotes"):
        parse_length_law({"law": "uniform", "lo": "2", "hi": 9})
    with pytest.raises(ConfigError, match=r"^empirical length law: 'path' must be a file's path .*, got \['x'\]$"):
        parse_length_law({"law": "empirical", "path": ["x"]})  # (was "file ['x'] does not exist")


def test_a_boolean_parquet_column_is_no_column_of_lengths(tmp_path):
    """pyarrow casts true/false to 1.0/0.0: `empirical:` read a boolean column as lengths
    of 1 and 0 (drawn as 1) tokens, and a trace's as times and lengths, silently (a CSV's
    `True` is refused as no number)."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis extra
    import pyarrow.parquet as pq  # noqa: PLC0415

    f = tmp_path / "flags.parquet"
    pq.write_table(pa.table({"prompt_tokens": pa.array([True, False, True])}), f)
    with pytest.raises(ConfigError, match=r"column 'prompt_tokens' \(bool\) cannot be read as numbers"):
        parse_length_law(f"empirical:{f}", "prompt").values()
    pq.write_table(pa.table({"prompt_tokens": pa.array([3, 1, 2])}), f)
    assert parse_length_law(f"empirical:{f}", "prompt").values().tolist() == [3, 1, 2]


def test_gamma_conversations_warn_when_their_realised_rate_is_loose(capsys):
    """With turns the gamma arrivals are the conversations' first turns: cv 30 over the
    1,6xx conversations of 5,000 requests spreads their realised rate by about +-73%, and
    the run said nothing (turns were left out of the warning)."""
    from llmsched.workload import WorkloadSpec, make_trace  # noqa: PLC0415
    from llmsched.workload.spec import arrivals_held  # noqa: PLC0415

    run = ["--arrival", "gamma", "--rate", "2", "--cv", "30", "--turns", "geometric:3", "--think-time", "10"]
    lengths = ["--prompt", "geometric:100", "--output", "geometric:20", "--cost-model", "const:1"]
    assert main(["simulate", *run, *lengths, "--quiet", "--out", ""]) == 0
    err = capsys.readouterr().err
    assert "warning: gamma arrivals of cv 30: the realised rate of 1," in err
    assert " conversations varies by about +-7" in err and "ask for at least 90,000 conversations for +-10%" in err
    # the count: the conversations with a request in the run, told apart by their first
    # block (a 16-token first prompt: each conversation's own text)
    spec = WorkloadSpec(
        arrival="gamma",
        rate=2,
        cv=3,
        turns="geometric:3",
        think_time_s=10,
        prompt="const:16",
        output="const:2",
        num_requests=5000,
    )
    trace = make_trace(spec)
    conversations = len({ids[0] for ids in trace.blocks()})
    assert 1500 < conversations < 2000
    assert arrivals_held(spec, trace) == conversations
    single = WorkloadSpec(arrival="gamma", rate=2, cv=3, prompt="const:16", output="const:2", num_requests=5000)
    assert arrivals_held(single, make_trace(single)) == 5000
