"""A tagged trace replayed with `classes` keeps each request's own tag (and so its class);
only requests without a tag draw a class by share, and a tag no class names is refused."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.workload import load_trace, make_trace

CLASSES = [{"tag": "chat", "share": 1}, {"tag": "sum", "share": 1}]


def write_trace(path, tags):
    rows = [f"{0.1 * i:.1f},{10 + i},{5 + i % 3},{t}" for i, t in enumerate(tags)]
    path.write_text("arrival_s,prompt_tokens,output_tokens,tag\n" + "\n".join(rows) + "\n")
    return str(path)


def test_each_request_keeps_its_tag_and_lengths(tmp_path):
    tags = ["chat", "sum", "sum", "chat"] * 50
    f = write_trace(tmp_path / "t.csv", tags)
    t = make_trace({"trace": f, "classes": CLASSES})
    base = load_trace(f)
    assert t.tag.tolist() == tags
    assert np.array_equal(t.prompt, base.prompt) and np.array_equal(t.output, base.output)


def test_a_class_law_replaces_the_lengths_of_its_own_tag_only(tmp_path):
    tags = ["chat", "sum"] * 20
    f = write_trace(tmp_path / "t.csv", tags)
    t = make_trace({"trace": f, "classes": [{"tag": "chat"}, {"tag": "sum", "prompt": "const:999"}]})
    assert t.tag.tolist() == tags
    assert (t.prompt[t.tag == "sum"] == 999).all()
    assert np.array_equal(t.prompt[t.tag == "chat"], load_trace(f).prompt[t.tag == "chat"])


def test_requests_without_a_tag_draw_a_class(tmp_path):
    tags = ["chat", "", "sum", ""] * 25
    t = make_trace({"trace": write_trace(tmp_path / "t.csv", tags), "classes": CLASSES})
    kept = np.array(tags) != ""
    assert t.tag[kept].tolist() == np.array(tags)[kept].tolist()
    assert set(t.tag[~kept].tolist()) == {"chat", "sum"}


def test_a_tag_no_class_names_is_refused(tmp_path, capsys):
    f = write_trace(tmp_path / "t.csv", ["chat", "sum", "", "code"])
    with pytest.raises(ConfigError, match=r"request 4 \(in arrival order\) has tag 'code', which no class names"):
        make_trace({"trace": f, "classes": CLASSES})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cost_model: paper\nworkload:\n  trace: {f}\n  classes:\n    - {{tag: chat}}\n    - {{tag: sum}}\n")
    assert main(["simulate", "--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has tag 'code', which no class names (classes: chat, sum)" in err


def test_a_replayed_runs_requests_keep_their_tags(tmp_path):
    tags = ["chat", "chat", "sum"] * 30
    f = write_trace(tmp_path / "t.csv", tags)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cost_model: paper\nworkload:\n  trace: {f}\n  classes:\n    - {{tag: chat}}\n    - {{tag: sum}}\n")
    out = tmp_path / "o"
    assert main(["simulate", "--config", str(cfg), "--out", str(out), "--quiet"]) == 0
    with open(out / "requests.csv") as fh:
        got = {(r["arrival_s"][:3], r["tag"]) for r in csv.DictReader(fh)}
    assert got == {(f"{0.1 * i:.1f}", t) for i, t in enumerate(tags)}
