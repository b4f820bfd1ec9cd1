"""A sweep whose grid does not vary the policy named its one group "all", drawn in black,
and no title named the policy."""

from __future__ import annotations

import pytest

from llmsched.analysis import figures
from llmsched.core.palette import POLICY_COLORS


def _rows(policy: str, admission: str = "fcfs") -> list[dict]:
    return [
        {
            "load": load,
            "policy": policy,
            "policy_name": policy,
            "admission": admission,
            "cost_model": "paper",
            "b_max": 512,
            "num_requests": 200,
            "offered_rate": 10 * load,
            "point_critical_rate": 10.0,
            "total_token_throughput": 1000 * load,
            "offered_token_rate": 1100 * load,
            "p99_ttft_ms": 50 * load,
            "p99_itl_ms": 20 * load,
            "stable": True,
        }
        for load in (0.5, 0.8)
    ]


@pytest.fixture
def figs(monkeypatch):
    seen = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and str(path))
    return seen


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgba[:3])


def test_a_one_group_sweep_is_named_and_coloured_by_its_policy(tmp_path, figs):
    figures.plot_sweep(_rows("vllm"), tmp_path, ["load"])
    thr = figs["throughput.png"].axes[0]
    line = next(ln for ln in thr.get_lines() if ln.get_label() == "vllm")
    assert line.get_color() == POLICY_COLORS["vllm"]
    assert "all" not in [ln.get_label() for ln in thr.get_lines()]
    assert thr.get_title().replace("\n", " ").startswith("Throughput vs offered load: vllm, paper, b_max 512")
    assert "vllm" in figs["latency.png"]._suptitle.get_text()
    bars = figs["max_stable_rate.png"].axes[0]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["vllm"]
    assert _hex(bars.patches[0].get_facecolor()) == POLICY_COLORS["vllm"]


def test_a_one_group_sweep_names_a_non_default_admission(tmp_path, figs):
    figures.plot_sweep(_rows("sarathi", "spf"), tmp_path, ["load"])
    labels = [ln.get_label() for ln in figs["throughput.png"].axes[0].get_lines()]
    assert "sarathi + spf" in labels
    assert "admission spf" in figs["throughput.png"].axes[0].get_title().replace("\n", " ")
    # a grid over the policy keeps it out of the title (each line names its own)
    figs.clear()
    figures.plot_sweep(_rows("sarathi") + _rows("orca"), tmp_path, ["policy", "load"])
    assert "sarathi" not in figs["throughput.png"].axes[0].get_title()


def test_a_one_group_search_bar_is_named_by_its_policy(tmp_path, figs):
    search = [{"policy_name": "orca", "max_stable_rate": 5.0, "critical_rate": 8.0, "max_stable_upper_bound": False}]
    figures.plot_sweep([], tmp_path, ["rate"], search=search)
    ax = figs["max_stable_rate.png"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["orca"]
    assert "orca" in ax.get_title()


def _plain_ticks(fig, ax) -> list[float]:
    """The y tick labels in view, as numbers (a label such as 4.6x10^2 is no number)."""
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    return [float(t.get_text()) for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]


def test_latency_axes_under_a_decade_have_plain_ticks(tmp_path, figs):
    figures.plot_sweep(_rows("vllm"), tmp_path, ["load"])  # p99 TTFT 25..40 ms: under a factor of 2
    fig = figs["latency.png"]
    for ax in fig.axes:
        assert len(_plain_ticks(fig, ax)) >= 3


def test_cluster_figures_have_plain_log_ticks(tmp_path, monkeypatch):
    from llmsched.analysis import reproduce_networks as rn

    seen = {}
    monkeypatch.setattr(rn, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and str(path))
    rn.reproduce_clusters(out_dir=tmp_path, quick=True)
    for name in ("clusters_p99.png", "clusters_ttft.png"):
        fig = seen[name]
        assert len(_plain_ticks(fig, fig.axes[0])) >= 2, name


def test_a_one_point_sweep_s_offered_line_is_marked(tmp_path, figs):
    figures.plot_sweep(_rows("vllm")[:1], tmp_path, ["load"])
    (offered,) = [ln for ln in figs["throughput.png"].axes[0].get_lines() if ln.get_label() == "offered tokens/s"]
    assert len(offered.get_xdata()) == 1 and offered.get_marker() not in (None, "None", "", " ")
    figs.clear()
    figures.plot_sweep(_rows("vllm"), tmp_path, ["load"])  # a line: no marker needed
    (offered,) = [ln for ln in figs["throughput.png"].axes[0].get_lines() if ln.get_label() == "offered tokens/s"]
    assert offered.get_marker() in (None, "None", "", " ")


def test_a_sweep_figure_path_blocked_by_a_folder_is_one_line(tmp_path):
    """`plot`'s figures turned a write error into one line; the sweep's and reproduce's
    (`save_figure`) raised IsADirectoryError."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmsched.analysis.figures import save_figure
    from llmsched.core.errors import ConfigError

    (tmp_path / "throughput.png").mkdir()
    fig = plt.figure()
    try:
        with pytest.raises(ConfigError, match="throughput.png cannot be written"):
            save_figure(fig, tmp_path / "throughput.png")
    finally:
        plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png"]  # no temp file left
