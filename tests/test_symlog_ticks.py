"""The agents backlog figure's symlog y axis: no major tick inside the linear part
(matplotlib's own locator put 10^2 there with linthresh 1000, printed over the 0 tick)."""

from llmsched.analysis.figures import new_figure
from llmsched.analysis.reproduce_networks import _backlog_panel


def test_backlog_panel_ticks_are_zero_and_decades_from_linthresh():
    fig, (ax,) = new_figure(1)
    t = [0.0, 1.0, 2.0, 3.0]
    r = {
        "series": {"time_s": t, "servers": {"s1": [0.0, 50.0, 3e3, 2e5]}, "network": [0.0, 80.0, 5e3, 3e5]},
        "servers": {"s1": {"verdict": "stable"}},
        "network": {"verdict": "stable"},
    }
    _backlog_panel(ax, r, "title", log=True)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = [v for v in ax.get_yticks() if lo <= v <= hi]
    assert 0 in ticks and 1e3 in ticks
    assert not [v for v in ticks if 0 < abs(v) < 1e3], ticks
