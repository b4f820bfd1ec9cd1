"""With a prefix cache, `offered_token_rate` counts the prompt tokens the cache serves, so it
is not the utilisation's numerator: `offered_work_rate` (net of the prompt tokens found
cached at first admission) is, and `work_throughput` is what was served of it. The sweep's
throughput figure plots the work against the token capacity, and titles name the system
prompt and the cache (a stable run at load 0.5 drew 1.3x over capacity)."""

import pytest

from llmsched.analysis import figures
from llmsched.analysis.sweep import run_sweep
from llmsched.api import simulate
from llmsched.plots import run_title

CACHED = dict(cost_model="paper", prompt="geometric:100", output="geometric:40", system_prompt=400, prefix_caching=True)


def test_offered_work_rate_over_token_capacity_is_the_utilisation():
    s = simulate(rate=12, num_requests=300, **CACHED).summary
    assert s["cached_prompt_tokens_per_request"] > 300  # the system prompt hits
    assert s["offered_work_rate"] / s["token_capacity"] == pytest.approx(s["utilisation"], rel=1e-9)
    # the tokens offered exceed the work by the cached prompt tokens per request
    cached = s["cached_prompt_tokens_per_request"] * s["offered_rate"]
    assert s["offered_token_rate"] - s["offered_work_rate"] == pytest.approx(cached, rel=1e-9)
    assert s["work_throughput"] < s["token_capacity"] < s["total_token_throughput"]


def test_without_a_cache_the_work_is_the_tokens_less_one_per_request():
    s = simulate(rate=2, num_requests=200, cost_model="paper", prompt="geometric:100", output="geometric:40").summary
    assert s["offered_work_rate"] == pytest.approx(s["offered_token_rate"], rel=1e-9)
    done = s["total_input_tokens"] + s["total_output_tokens"] - s["completed"]
    assert s["work_throughput"] == pytest.approx(done / s["duration"], rel=1e-12)


def test_sweep_figure_plots_the_work_and_titles_name_the_cache(tmp_path, saved_figures):
    saved = saved_figures
    res = run_sweep(grid={"load": [0.5, 1.5]}, out_dir=tmp_path / "s", progress=False, num_requests=150, **CACHED)
    (ax,) = saved["throughput.png"].axes
    # the served and offered lines, less the capacity (dashed) and the load-1 marker (y 0 to 1)
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2 and ln.get_linestyle() != "--"]
    lines = [ln for ln in drawn if list(ln.get_ydata()) != [0, 1]]
    ys = sorted(float(y) for ln in lines for y in ln.get_ydata())
    want = sorted(r[k] for r in res.rows for k in ("work_throughput", "offered_work_rate"))
    assert ys == pytest.approx(want, rel=1e-9)
    cap = res.rows[0]["token_capacity"]
    assert min(ys) < 0.6 * cap  # load 0.5 sits below the token capacity line
    assert "work" in ax.get_ylabel()
    title = ax.get_title().replace("\n", " ")
    assert "system prompt 400" in title and "prefix caching" in title


def test_run_title_names_the_system_prompt_and_the_cache(tmp_path):
    simulate(rate=2, num_requests=20, out_dir=tmp_path / "r", verdict=False, **CACHED)
    assert run_title(tmp_path / "r").endswith("paper, poisson 2 req/s, system prompt 400, prefix caching, 20 requests")


def test_a_replica_without_hits_per_call_reports_no_work_rate(tmp_path):
    """A cluster replica's summary keeps no cache hits per call: its work_throughput was all
    tokens less one a request, the cached prompt tokens counted as work (unknown: None)."""
    import json

    from llmsched.cli import main

    run = ["simulate", "--cost-model", "paper", "--policy", "vllm", "--rate", "5", "--num-requests", "120"]
    run += ["--replicas", "2", "--quiet"]
    assert main([*run, "--out", str(tmp_path / "c"), "--system-prompt", "100", "--prefix-caching"]) == 0
    replica = json.loads((tmp_path / "c" / "servers" / "cluster[0]" / "summary.json").read_text())
    assert replica["prefix_cache"]["hit_tokens"] > 0 and replica["work_throughput"] is None
    assert main([*run, "--out", str(tmp_path / "n")]) == 0  # without a cache the work is known
    replica = json.loads((tmp_path / "n" / "servers" / "cluster[0]" / "summary.json").read_text())
    done = replica["total_input_tokens"] + replica["total_output_tokens"] - replica["completed"]
    assert replica["work_throughput"] == pytest.approx(done / replica["duration"], rel=1e-12)


def test_a_resumed_sweeps_older_points_keep_the_figure_in_tokens(tmp_path, monkeypatch):
    """Points stored before the work fields (a resumed sweep) were dropped from the figure
    once one row had them: it plots tokens unless every row with hits has the work."""
    saved = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: saved.setdefault(path.name, fig))
    res = run_sweep(grid={"load": [0.5, 1.0]}, out_dir=tmp_path / "s", progress=False, num_requests=100, **CACHED)
    rows = [dict(r) for r in res.rows]
    for k in ("work_throughput", "offered_work_rate"):
        rows[0].pop(k)
    saved.clear()  # (the sweep's own figure)
    figures.plot_sweep(rows, tmp_path / "f", ["load"])
    (ax,) = saved["throughput.png"].axes
    assert "work" not in ax.get_ylabel()
    served = max((ln for ln in ax.get_lines() if ln.get_label() != "_nolegend_"), key=lambda ln: len(ln.get_xdata()))
    assert len(served.get_xdata()) == 2
