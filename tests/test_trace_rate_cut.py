"""A replayed trace's rate rescales it before duration_s cuts it: `capacity --rate R
--duration D` judges the requests `simulate` runs, and a sweep's load (or a search),
which sets the rate from lambda*, is refused where the cut depends on that rate."""

import json

import pytest

import llmsched
from llmsched.analysis import sweep
from llmsched.analysis.points import critical_rate_of, resolve_point
from llmsched.cli import main
from llmsched.core.errors import ConfigError


def _trace(tmp_path):
    """200 requests at 1 req/s: the first 100 short, the last 100 ten times as long. At
    2 req/s, 100 s keeps all of them; 100 s of the trace's own clock, the short ones."""
    rows = [f"{t},100,10" for t in range(100)] + [f"{t},1000,100" for t in range(100, 200)]
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return str(path)


def _capacity(capsys, *argv):
    assert main(["capacity", "--json", "--cost-model", "paper", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_capacity_with_rate_and_duration_judges_the_requests_simulate_runs(capsys, tmp_path):
    trace = _trace(tmp_path)
    # (was lambda* of the 101 short requests of 100 s unscaled)
    r = _capacity(capsys, "--trace", trace, "--rate", "2", "--duration", "100")
    ran = llmsched.simulate(cost_model="paper", trace=trace, rate=2, duration_s=100)
    assert ran.summary["num_requests"] == 200
    assert r["capacity"]["critical_rate"] == pytest.approx(ran.summary["critical_rate"], rel=1e-9)
    assert r["rate"] == 2 and r["utilisation"] == pytest.approx(2 / ran.summary["critical_rate"])
    # the same numbers as the configuration file that sets them
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"workload:\n  trace: {trace}\n  rate: 2\n  duration_s: 100\n")
    assert _capacity(capsys, "--config", str(cfg))["capacity"]["critical_rate"] == pytest.approx(
        r["capacity"]["critical_rate"], rel=1e-9
    )


def test_capacity_with_replayed_arrivals_keeps_the_rescaled_cut(capsys, tmp_path):
    trace = _trace(tmp_path)
    laws = ["--prompt", "geometric:200", "--output", "geometric:101"]
    r = _capacity(capsys, "--arrival", f"trace:{trace}", *laws, "--rate", "2", "--duration", "100")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"workload:\n  arrival: trace:{trace}\n  prompt: geometric:200\n  output: geometric:101\n"
        "  rate: 2\n  duration_s: 100\n"
    )
    # (was the mix of the 101 requests of 100 s unscaled)
    assert r["capacity"]["critical_rate"] == pytest.approx(
        _capacity(capsys, "--config", str(cfg))["capacity"]["critical_rate"], rel=1e-12
    )


def test_a_load_on_a_trace_cut_by_a_duration_is_refused(tmp_path):
    fixed = dict(cost_model="paper", trace=_trace(tmp_path), duration_s=100)
    # (was mapped with lambda* of 100 s unscaled, then run on another set of requests)
    with pytest.raises(
        ConfigError, match=r"^load on a replayed trace cut by duration_s=100 \(--duration\): .* num_requests"
    ):
        resolve_point(None, fixed, {"load": 0.5})


def test_a_load_on_a_trace_with_a_count_offers_that_load(tmp_path):
    fixed = dict(cost_model="paper", trace=_trace(tmp_path), num_requests=150)
    cfg = resolve_point(None, fixed, {"load": 0.5})
    assert cfg.workload["rate"] == pytest.approx(0.5 * critical_rate_of(cfg), rel=1e-12)


def test_a_load_on_a_trace_with_a_time_scale_names_both(tmp_path):
    fixed = dict(cost_model="paper", trace=_trace(tmp_path), time_scale=2)
    # (said "give either rate ... or time_scale", though no rate was given)
    with pytest.raises(
        ConfigError, match=r"^load sets the replayed trace's rate, which time_scale=2 \(--time-scale\) also sets"
    ):
        resolve_point(None, fixed, {"load": 0.5})


@pytest.mark.parametrize(
    ("flags", "msg"),
    [
        (["--duration", "100"], "the search on a replayed trace cut by duration_s=100 (--duration)"),
        (
            ["--time-scale", "2"],
            "the search sets the replayed trace's rate, which time_scale=2 (--time-scale) also sets",
        ),
    ],
)
def test_a_search_on_a_trace_refuses_what_its_rates_would_change(tmp_path, monkeypatch, capsys, flags, msg):
    calls = []
    monkeypatch.setattr(sweep, "run_point", lambda cfg: calls.append(cfg) or {"wall_s": 0.0})
    argv = ["sweep", "--cost-model", "paper", "--trace", _trace(tmp_path), *flags, "--search", "max-stable-rate"]
    assert main([*argv, "--workers", "1", "--no-plots", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and msg in err and "Traceback" not in err
    assert calls == []
