"""throughput.png draws each group's offered tokens/s: one gray line when every group was
offered the same, else one per group in its colour (a grid over the workload or k_max
offers each group its own load; one line taken from the last group misstated the others)."""

import matplotlib.colors as mcolors
import pytest

from llmsched.analysis.sweep import run_sweep

FIXED = dict(cost_model="paper", b_max=128, output="geometric:21", num_requests=100)


def _offered_lines(fig):
    (ax,) = fig.axes
    # dotted lines with data, less the load-1 marker (axvline: y from 0 to 1 in axes units)
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and len(ln.get_xdata())]
    return ax, [ln for ln in dotted if list(ln.get_ydata()) != [0, 1]]


def test_each_group_has_its_offered_line(tmp_path, saved_figures):
    res = run_sweep(
        grid={"prompt": ["geometric:40", "geometric:160"], "rate": [1.0, 2.0]},
        out_dir=tmp_path / "s",
        progress=False,
        **FIXED,
    )
    ax, lines = _offered_lines(saved_figures["throughput.png"])
    by_group = {}
    for r in res.rows:
        by_group.setdefault(r["prompt"], {})[float(r["rate"])] = r["offered_token_rate"]
    assert len(lines) == 2  # one per group, not the last group's alone
    drawn = sorted(float(y) for ln in lines for y in ln.get_ydata())
    want = sorted(v for g in by_group.values() for v in g.values())
    assert drawn == pytest.approx(want, rel=1e-9)
    assert len({round(ln.get_ydata()[0], 6) for ln in lines}) == 2  # the groups' own values
    # each in its group's colour (the colour of the group's served line)
    served = {mcolors.to_hex(ln.get_color()) for ln in ax.get_lines() if ln.get_label().startswith("prompt=")}
    assert len(served) == 2 and {mcolors.to_hex(ln.get_color()) for ln in lines} == served
    assert any("offered tokens/s" in t for t in ax.get_legend_handles_labels()[1])


def test_one_gray_offered_line_when_groups_agree(tmp_path, saved_figures):
    run_sweep(
        grid={"policy": ["sarathi", "orca"], "rate": [1.0, 2.0]},
        out_dir=tmp_path / "s",
        progress=False,
        prompt="geometric:40",
        **FIXED,
    )
    ax, lines = _offered_lines(saved_figures["throughput.png"])
    offered = [ln for ln in lines if ln.get_label() == "offered tokens/s"]
    assert len(offered) == 1 and mcolors.to_hex(offered[0].get_color()) == mcolors.to_hex("gray")
