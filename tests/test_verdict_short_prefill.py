"""The short-window guard of a single server's verdict on prefill-heavy, tiny-output
workloads (prompts of 200 tokens, outputs of 1-5), and two `capacity` refusals.

The guard counted a judged window in request *decode* times, mean step x (mean output - 1):
0 for outputs of 1 token, a step or a few for 2-5, so short runs of stable queues at
15-80% load were called unstable. It now counts them in `api.guard_time_s`: a request's
whole service time (its prefill steps too), and no less than the time in which 25 requests
arrive (a judged window of 20 holds 500 arrivals).
"""

import json
import time

import pytest
from helpers import one_line_error

from llmsched.api import simulate
from llmsched.cli import main

PREFILL = dict(cost_model="paper", prompt="const:200")
LAM1 = 3342.90937581614 / 200  # lambda* for prompts of 200 tokens and outputs of 1


@pytest.mark.parametrize(
    "output, rate, n, seed",
    [
        ("const:1", 15.0431, 30, 4),  # 79% load: growth 933 tokens/s, interval [465, 1400], h = 67
        ("const:1", 3, 12, 12),  # 21% load
        ("const:1", 3, 8, 16),  # 15% load
        ("const:2", 15.0431, 30, 4),
        ("const:5", 15.0431, 30, 4),
    ],
)
def test_a_short_run_of_a_stable_prefill_heavy_queue_is_not_called_unstable(output, rate, n, seed):
    s = simulate(output=output, rate=rate, num_requests=n, seed=seed, **PREFILL).summary
    assert s["utilisation"] < 0.85
    assert s["verdict"] == "inconclusive" and s["stable"] is None and s["verdict_conclusive"] is False
    assert s["verdict_reason"].startswith("too short to call unstable")
    assert "request service (at least 25 arrival gaps) times" in s["verdict_reason"]


def test_the_first_repro_grows_past_the_threshold_with_an_interval_above_it():
    """What the guard decides: the interval alone would call it unstable."""
    s = simulate(output="const:1", rate=15.0431, num_requests=30, seed=4, **PREFILL).summary
    lo, _ = s["backlog_growth_ci"]
    assert lo > s["verdict_threshold_tokens_per_s"]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_long_overloaded_prefill_heavy_run_is_still_unstable(seed):
    """3,000 requests at 110% load: a judged window of about 1,500 arrivals, past the guard."""
    s = simulate(output="const:1", rate=1.1 * LAM1, num_requests=3000, seed=seed, **PREFILL).summary
    assert s["verdict"] == "unstable" and s["stable"] is False


def test_a_long_stable_prefill_heavy_run_is_stable():
    s = simulate(output="const:1", rate=0.6 * LAM1, num_requests=3000, seed=0, **PREFILL).summary
    assert s["verdict"] == "stable"


def test_the_guard_time_is_a_requests_service_time_with_an_arrival_floor():
    from llmsched.api import MIN_JUDGED_ARRIVALS, guard_time_s
    from llmsched.theory.verdict import MIN_DECODE_TIMES

    r = simulate(prompt="const:200", output="const:101", cost_model="paper", rate=8, num_requests=300, seed=0)
    step = r.stats.busy_ns / 1e9 / r.stats.steps
    t, floored = guard_time_s(r, 512)
    # one prefill step (the first token) and 100 decode steps: more than 25 arrival gaps
    assert t == pytest.approx(101 * step) and not floored
    r = simulate(output="const:1", rate=10, num_requests=300, seed=0, **PREFILL)
    t, floored = guard_time_s(r, 512)
    assert floored and t == pytest.approx(MIN_JUDGED_ARRIVALS / MIN_DECODE_TIMES / r.offered_rate)
    # a prompt over a budget of 128 tokens: two prefill steps (arrivals so fast the floor is lower)
    r = simulate(output="const:1", rate=2000, num_requests=50, seed=0, **PREFILL)
    step = r.stats.busy_ns / 1e9 / r.stats.steps
    assert guard_time_s(r, 512) == (pytest.approx(step), False)
    assert guard_time_s(r, 128) == (pytest.approx(2 * step), False)


def test_capacity_draws_no_run_so_a_tiny_rate_is_not_refused_for_arrival_times(capsys):
    """It exited 2: 'arrival 5,000 comes at 4.97e+09 s', of simulate's default 5,000
    requests, which capacity never draws."""
    argv = ["capacity", "--cost-model", "paper", "--mean-prompt", "200", "--mean-output", "101", "--rate", "1e-6"]
    assert main(argv) == 0
    assert "arrival" not in capsys.readouterr().err
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["utilisation"] < 1e-6


@pytest.mark.parametrize("k_max", ["512", "600"])
def test_a_counterexample_search_with_a_cap_that_cannot_bind_is_refused_at_once(capsys, monkeypatch, k_max):
    """A cap at or above b_max (512) cannot bind: the search ran 16 simulations and said
    'no counterexample confirmed'."""
    import llmsched.analysis.capacity_report as cr

    def no_report(*a, **k):
        raise AssertionError("refused before the capacity report")

    monkeypatch.setattr(cr, "capacity_report", no_report)
    start = time.perf_counter()
    one_line_error(
        capsys, ["capacity", "--k-max", k_max, "--find-counterexample"], f"k_max {k_max} >= b_max 512", "cannot bind"
    )
    assert time.perf_counter() - start < 5


def test_the_api_search_refuses_a_cap_that_cannot_bind():
    from llmsched.analysis.counterexample import find_counterexample
    from llmsched.core.errors import ConfigError

    with pytest.raises(ConfigError, match="k_max 1024 >= b_max 512 cannot bind"):
        find_counterexample("paper", 512, 1024)


@pytest.mark.parametrize("b_max", [0, -5])
def test_a_counterexample_search_with_a_bad_b_max_names_b_max(tmp_path, capsys, b_max):
    """A config's b_max of 0 or -5 was blamed on k_max ("k_max 3 >= b_max -5 cannot bind");
    it is b_max's own rule that it breaks, as capacity without the search says."""
    from llmsched.analysis.counterexample import find_counterexample
    from llmsched.cli import main
    from llmsched.core.errors import ConfigError

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"b_max: {b_max}\nk_max: 3\n")
    assert main(["capacity", "--config", str(cfg), "--find-counterexample"]) == 2
    assert f"b_max must be a positive integer, got {b_max}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="b_max must be a positive integer"):
        find_counterexample("paper", b_max, 3)
