"""Figures (issue 12, item 10): one colour per policy everywhere, titles that name the run,
"none" for a missing bar, nothing clipped, CDFs that say what they cover; and tables that
keep whole headers and cells when piped."""

import subprocess
import sys

import numpy as np
import pytest

import llmsched
from llmsched.analysis import figures
from llmsched.analysis.sweep import run_sweep
from llmsched.core.palette import OTHER_COLORS, POLICY_COLORS, color_of, group_styles, policy_of
from llmsched.policies import list_policies


def test_every_policy_has_its_own_colour():
    from llmsched.policies import ADMISSION_POLICIES, BATCH_POLICIES

    shipped = [
        n
        for reg in (BATCH_POLICIES, ADMISSION_POLICIES)
        for n, f in reg.items()
        if f.__module__.startswith("llmsched.")
    ]
    assert {"sarathi", "adaptive", "twp"} <= set(shipped) <= {name for _, name, _ in list_policies()}
    assert set(shipped) <= set(POLICY_COLORS)  # every shipped batch and admission policy (tests register others)
    colours = list(POLICY_COLORS.values()) + list(OTHER_COLORS)
    assert len(set(c.lower() for c in colours)) == len(colours)  # no two names share a colour
    assert policy_of("sarathi") == policy_of("sarathi (stable)") == policy_of("sarathi, b_max=256") == "sarathi"
    assert policy_of("b_max=512, policy=vllm") == "vllm" and policy_of("adaptive:cost=paper") == "adaptive"
    assert policy_of("b_max=512") is None and color_of("b_max=512", 2) == OTHER_COLORS[2]
    st = group_styles(["sarathi, b_max=256", "sarathi, b_max=512", "orca, b_max=256"])
    assert st[0]["color"] == st[1]["color"] == POLICY_COLORS["sarathi"] and st[2]["color"] == POLICY_COLORS["orca"]
    assert st[0]["linestyle"] != st[1]["linestyle"]  # the same policy twice: told apart by the line


@pytest.fixture
def captured(monkeypatch):
    """Every figure a function saves, with the size of the PNG written."""
    saved = []
    real = figures.save_figure

    def save(fig, path):
        out = real(fig, path)
        from matplotlib.image import imread

        saved.append((path.name, fig, imread(out).shape))
        return out

    monkeypatch.setattr(figures, "save_figure", save)
    return saved


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgba[:3])


def test_max_stable_rate_figure(tmp_path, captured):
    run_sweep(
        None,
        ["policy=fastertransformer,sarathi,orca", "load=0.4,0.8"],
        out_dir=tmp_path,
        workers=1,
        progress=False,
        cost_model="paper",
        prompt="geometric:200",
        output="geometric:101",
        num_requests=600,
    )
    figs = {name: (fig, shape) for name, fig, shape in captured}
    assert set(figs) == {"throughput.png", "latency.png", "max_stable_rate.png"}
    fig, shape = figs["max_stable_rate.png"]
    ax = fig.axes[0]
    title = ax.get_title()
    assert "paper" in title and "b_max 512" in title and "600 requests" in title  # names the run
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "none" and all(float(t) > 0 for t in texts[1:])  # FT is unstable from 0.4 on
    bars = [p for p in ax.patches if p.get_width() > 0]
    order = ("fastertransformer", "sarathi", "orca")
    assert [_hex(p.get_facecolor()) for p in bars] == [POLICY_COLORS[p] for p in order]
    # nothing clipped: the PNG holds the title and the tick labels
    renderer = fig.canvas.get_renderer()
    need = max(ax.title.get_window_extent(renderer).width, ax.get_tightbbox(renderer).width)
    assert shape[1] >= need - 2
    # the same colours in the line figures
    lat, _ = figs["latency.png"]
    lines = [ln for ln in lat.axes[0].get_lines() if ln.get_label() in ("sarathi", "orca", "fastertransformer")]
    assert {ln.get_label(): ln.get_color() for ln in lines} == {
        p: POLICY_COLORS[p] for p in ("fastertransformer", "sarathi", "orca")
    }
    assert "finished requests" in lat.axes[0].get_title() and "every gap" in lat.axes[1].get_title()


def test_plot_dir_titles_name_the_run_and_the_cdfs_say_what_they_cover(tmp_path, monkeypatch):
    from llmsched import plots

    llmsched.simulate(
        policy="orca",
        cost_model="paper",
        rate=10,
        prompt="geometric:200",
        output="geometric:100",
        num_requests=800,
        max_time_s=50,
        out_dir=tmp_path,
    )
    seen = {}
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and real(fig, path))
    plots.plot_dir(tmp_path)
    assert set(seen) == {"queue.png", "ttft_cdf.png", "itl_cdf.png", "token_load.png"}
    rows = np.genfromtxt(tmp_path / "requests.csv", delimiter=",", names=True)
    arrived = int(np.sum(rows["arrived"]))  # the 800 requests' that came before the limit
    assert 0 < arrived < 800
    for fig in seen.values():
        assert f"orca, b_max 512, paper, poisson 10 req/s, {arrived:,} requests" in fig.axes[0].get_title()
    ttft = seen["ttft_cdf.png"].axes[0]
    done = int(np.sum(rows["finished"]))
    assert 0 < done < arrived
    assert f"the {done:,} finished requests (of {arrived:,})" in ttft.get_title()
    assert ttft.get_ylabel() == "fraction of finished requests"
    assert ttft.get_lines()[0].get_color() == POLICY_COLORS["orca"]
    assert "unfinished requests' tokens included" in seen["itl_cdf.png"].axes[0].get_title()

    # a run whose requests all finished says nothing of unfinished ones (it always did)
    whole = tmp_path / "whole"
    llmsched.simulate(policy="orca", cost_model="paper", rate=10, num_requests=50, out_dir=whole)
    seen.clear()
    plots.plot_dir(whole)
    title = seen["itl_cdf.png"].axes[0].get_title()
    assert "every gap" in title and "unfinished" not in title


def test_token_load_bars_are_one_token_wide(tmp_path, monkeypatch):
    """token_load.png drew each exact token load's count as a bar a 1/100 of the range wide
    (about 5 tokens at b_max 512): neighbours overlapped, loads no step had looked counted."""
    from llmsched import plots

    llmsched.simulate(policy="sarathi", cost_model="paper", rate=9, num_requests=400, out_dir=tmp_path)
    seen = {}
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and real(fig, path))
    plots.plot_dir(tmp_path)
    hist = np.genfromtxt(tmp_path / "load_histogram.csv", delimiter=",", names=True)
    assert np.ptp(hist["token_load"]) > 300  # the case: a range of hundreds of tokens
    # one step outline (a patch per bar took most of `plot` for thousands of loads)
    (outline,) = seen["token_load.png"].axes[0].patches
    heights, edges = outline.get_data().values, outline.get_data().edges
    width = np.diff(edges)
    bars = heights > 0  # (the rest: the loads no step had, between them)
    assert bars.sum() == len(hist) and np.all(width[bars] == 1.0)  # a one-token-wide bar per load,
    assert np.array_equal(edges[:-1][bars] + 0.5, hist["token_load"])  # centred on it,
    assert np.array_equal(heights[bars], hist["steps"])  # as tall as its count
    assert np.all(width > 0)


def test_run_title_states_the_effective_rate_and_the_real_count(tmp_path):
    from llmsched.plots import run_title

    small = dict(cost_model="paper", prompt="const:20", output="const:4", verdict=False)
    llmsched.simulate(rate=2, time_scale=2.5, duration_s=40, out_dir=tmp_path / "p", **small)
    # was 'poisson 2 req/s, 5,000 requests': the configured rate, the default count
    assert run_title(tmp_path / "p").endswith("paper, poisson 5 req/s, 200 requests")
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n2,10,2\n4,10,2\n")
    llmsched.simulate(trace=str(tmp_path / "t.csv"), time_scale=4, cost_model="paper", out_dir=tmp_path / "t")
    assert run_title(tmp_path / "t").endswith("paper, trace t.csv at 2 req/s, 3 requests")
    # under a time limit only the requests that arrived (requests.csv lists all, arrived 0/1)
    llmsched.simulate(trace=str(tmp_path / "t.csv"), max_time_s=3, cost_model="paper", out_dir=tmp_path / "tl")
    assert run_title(tmp_path / "tl").endswith("paper, trace t.csv at 0.5 req/s, 2 requests")
    llmsched.simulate(rate=1, turns="const:3", think_time_s=1, num_requests=9, out_dir=tmp_path / "c", **small)
    assert run_title(tmp_path / "c").endswith("paper, poisson 1 conversations/s, 9 requests")


def test_cdfs_are_steps_from_zero(tmp_path, monkeypatch):
    from llmsched import plots

    # the paper model's ITLs take four values here (46.75 ms for 75% of the gaps): lines
    # between them claimed gaps in between, and the curve began at 0.75, not at 0
    llmsched.simulate(cost_model="paper", rate=2, num_requests=100, out_dir=tmp_path, verdict=False)
    seen = {}
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and real(fig, path))
    plots.plot_dir(tmp_path)
    hist = np.genfromtxt(tmp_path / "itl_histogram.csv", delimiter=",", names=True)
    line = seen["itl_cdf.png"].axes[0].get_lines()[0]
    assert line.get_drawstyle() == "steps-post"
    assert list(line.get_xdata()) == [0.0, *hist["itl_ms"]]
    assert np.allclose(line.get_ydata(), [0.0, *np.cumsum(hist["count"]) / hist["count"].sum()])
    assert seen["ttft_cdf.png"].axes[0].get_lines()[0].get_drawstyle() == "steps-post"
    x, y = plots.cdf_steps(np.array([3.0, 1.0, 1.0, 2.0]))  # a repeated value is one step
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0] and y.tolist() == [0.0, 0.5, 0.75, 1.0]


def test_piped_tables_keep_whole_headers_and_cells(tmp_path):
    cmd = [sys.executable, "-m", "llmsched", "capacity", "--cost-model", "paper", "--b-max", "512", "--k-max", "16"]
    cmd += ["--mean-prompt", "200", "--mean-output", "101", "--rate", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout  # stdout is a pipe
    assert "work per request (prompt + output - 1)" in out  # one cell, not wrapped over two lines
    assert "(512,0), (497,15), (113,15), (0,16)" in out
    assert "…" not in out
    out = subprocess.run(
        [sys.executable, "-m", "llmsched", "schedulers"], capture_output=True, text=True, check=True
    ).stdout
    lines = [ln for ln in out.splitlines() if "│" in ln]
    names = {ln.split("│")[2].strip() for ln in lines}
    assert {"fastertransformer", "vllm", "orca", "sarathi", "kfcfs", "adaptive"} <= names  # one row per policy
    assert max(len(ln) for ln in out.splitlines()) > 80


def test_an_itl_cdf_without_gaps_says_so(tmp_path, monkeypatch):
    """Requests of one output token emit no gap: the ITL figure was an empty plot under
    'CDF of every gap', as if the gaps were lost."""
    from llmsched import plots

    llmsched.simulate(cost_model="paper", rate=1, prompt="const:10", output="const:1", num_requests=3, out_dir=tmp_path)
    seen = {}
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and real(fig, path))
    plots.plot_dir(tmp_path)
    ax = seen["itl_cdf.png"].axes[0]
    assert not ax.get_lines() and "CDF of every gap: none (no request emitted a second token)" in ax.get_title()
