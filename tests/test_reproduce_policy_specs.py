"""`reproduce stability` named a policy with options by its base name alone: two lines
"adaptive" in queue.png (one colour, one style) and two table rows `adaptive`; and its
first four lines were all solid, so one policy's line hid another's that ran alike."""

from __future__ import annotations

import csv

from llmsched.analysis import figures
from llmsched.analysis import reproduce as rep
from llmsched.cli import main
from llmsched.core.palette import POLICY_COLORS

SPECS = ["sarathi", "adaptive", "adaptive:cost=paper"]


def test_each_spec_has_its_own_legend_entry_and_table_row(tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and str(path))
    monkeypatch.setattr(rep, "save_figure", lambda fig, path: seen.setdefault(path.name, fig) and str(path))
    args = ["reproduce", "stability", "--quick", "--no-search", "--workers", "1", "--num-requests", "300"]
    assert main([*args, "--policies", ",".join(SPECS), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    ax = seen["queue.png"].axes[0]
    labels = [t.get_text().rpartition(" (")[0] for t in ax.get_legend().get_texts()]
    assert labels == SPECS
    lines = ax.get_lines()
    assert [ln.get_color() for ln in lines] == [POLICY_COLORS[p] for p in ("sarathi", "adaptive", "adaptive")]
    assert len({ln.get_linestyle() for ln in lines}) == 3  # the first lines drawn each have a style
    with open(tmp_path / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # `policy` stays the policy's name (readers key on it), `policy_spec` tells the rows apart
    assert [r["policy"] for r in rows] == ["sarathi", "adaptive", "adaptive"]
    assert [r["policy_spec"] for r in rows] == SPECS
    assert "adaptive:cost=paper" in printed


def test_queue_styles_never_repeat_a_colour_s_style():
    pols = ["fastertransformer", "vllm", "orca", "sarathi", "kfcfs", "sarathi:x=1", "sarathi:x=2", "sarathi:x=3"]
    styles = rep.queue_styles(pols)
    assert [ls for _, ls in styles[:4]] == ["-", "--", ":", "-."]
    by_colour: dict[str, list[str]] = {}
    for c, ls in styles:
        by_colour.setdefault(c, []).append(ls)
    assert sorted(by_colour[POLICY_COLORS["sarathi"]]) == sorted(["-", "--", ":", "-."])
    # a colour's fifth to eighth lines get dash patterns of their own, which matplotlib draws
    many = rep.queue_styles(["sarathi"] + [f"sarathi:x={i}" for i in range(7)])
    assert len({str(ls) for _, ls in many}) == 8
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    for _, ls in many:
        ax.plot([0, 1], [0, 1], ls=ls)
    plt.close(fig)
