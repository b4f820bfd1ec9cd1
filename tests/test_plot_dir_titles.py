"""`llmsched plot`'s titles, colours and refusals: a network's or cluster's server folder
named its run "?, b_max None, , N requests" in black; a figure path blocked by a folder
gave a traceback; a blank count or a finished request's blank TTFT bent a CDF."""

from __future__ import annotations

import json

import numpy as np
import pytest

import llmsched.plots as plots
from llmsched import simulate
from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.core.palette import color_of
from llmsched.plots import plot_dir, run_title

RUN = {"cost_model": "const:1", "num_requests": 40, "rate": 5}
SPEC = {"policy": "vllm", "admission": "fcfs", "b_max": 256, "k_max": None, "cost_model": "paper", "replicas": 2}


def _server_folder(tmp_path, root: dict | None):
    d = tmp_path / "servers" / "cluster[0]"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"replica": "cluster[0]", "server": "cluster"}))
    if root is not None:
        (tmp_path / "config.json").write_text(json.dumps(root))
    return d


def test_a_server_folder_is_titled_with_its_server_s_spec(tmp_path):
    d = _server_folder(tmp_path, {"servers": {"cluster": SPEC}, "jobs": [], "seed": 0})
    title = run_title(d, arrival_s=np.array([0.0, 1.0, 2.0]))
    assert title == "cluster[0]: vllm, b_max 256, paper, 3 requests"
    assert plots._server_config(d)["policy"] == "vllm"  # (the colour comes from it)


def test_a_server_folder_without_its_run_s_config_is_titled_with_its_name(tmp_path):
    d = _server_folder(tmp_path, None)
    assert run_title(d, arrival_s=np.array([0.0])) == "cluster[0]"
    assert plots._server_config(d) is None
    assert "?" not in run_title(d, {"replica": "cluster[0]"}, np.array([0.0]))


def _run(tmp_path):
    d = tmp_path / "run"
    simulate(**RUN, seed=1, out_dir=d)
    return d


def test_a_figure_path_blocked_by_a_folder_is_one_line(tmp_path, capsys):
    d = _run(tmp_path)
    (d / "ttft_cdf.png").mkdir()
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err
    assert "ttft_cdf.png" in err and "Traceback" not in err
    # nothing drawn, no temporary file left
    assert sorted(p.name for p in d.iterdir() if "png" in p.name) == ["ttft_cdf.png"]


def test_an_unwritable_figure_is_a_config_error_with_no_temporary_file(tmp_path, monkeypatch):
    d = _run(tmp_path)
    from matplotlib.figure import Figure

    def fail(self, path, **kw):
        open(path, "wb").close()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", fail)
    with pytest.raises(ConfigError, match="queue.png cannot be written"):
        plot_dir(d)
    assert [p.name for p in d.iterdir() if "png" in p.name or "tmp" in p.name] == []


def _blank(path, line: int, column: str):
    rows = path.read_text().splitlines()
    head = rows[0].split(",")
    fields = rows[line - 1].split(",")
    fields[head.index(column)] = ""
    rows[line - 1] = ",".join(fields)
    path.write_text("\n".join(rows) + "\n")


def test_a_blank_histogram_count_is_refused_naming_its_line(tmp_path):
    d = _run(tmp_path)
    _blank(d / "itl_histogram.csv", 2, "count")
    with pytest.raises(ConfigError, match=r"itl_histogram.csv line 2 column count is empty"):
        plot_dir(d)


def test_a_finished_request_s_blank_ttft_is_refused_naming_its_line(tmp_path):
    d = _run(tmp_path)
    _blank(d / "requests.csv", 4, "ttft_s")
    with pytest.raises(ConfigError, match=r"requests.csv line 4 column ttft_s is empty"):
        plot_dir(d)


def test_the_queue_ends_at_the_run_s_end_when_every_request_finished(tmp_path):
    d = _run(tmp_path)
    end = json.loads((d / "summary.json").read_text())["sim_end_s"]
    figs = _figures(d)
    waiting, running = figs["queue.png"].axes[0].lines
    assert waiting.get_drawstyle() == running.get_drawstyle() == "steps-post"
    assert running.get_xdata()[-1] == pytest.approx(end, abs=1e-8) and running.get_ydata()[-1] == 0
    ts = {
        "time_s": np.array([0.0, 1.0]),
        "waiting_requests": np.array([2.0, 0.0]),
        "running_requests": np.array([1.0, 1.0]),
    }
    t, w, r = plots.queue_series(ts, 3.5)
    assert list(t) == [0.0, 1.0, 3.5] and list(w) == [2.0, 0.0, 0.0] and list(r) == [1.0, 1.0, 0.0]
    t, _, _ = plots.queue_series(ts, None)
    assert list(t) == [0.0, 1.0]


def _figures(d) -> dict:
    """The figures plot_dir draws, by file name (drawn, not saved)."""
    figs = {}
    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "save_figure", lambda fig, path: figs.setdefault(path.name, fig) and path)
    try:
        plot_dir(d)
    finally:
        mp.undo()
    return figs


def test_a_cluster_replica_s_figures_have_its_policy_s_title_and_colour(tmp_path):
    out = tmp_path / "cl"
    args = ["simulate", "--policy", "vllm", "--replicas", "2", "--router", "jsq", "--cost-model", "const:1"]
    assert main([*args, "--num-requests", "40", "--out", str(out)]) == 0
    figs = _figures(out / "servers" / "cluster[0]")
    ax = figs["ttft_cdf.png"].axes[0]
    assert ax.get_title().splitlines()[1].startswith("cluster[0]: vllm, b_max ")
    assert ax.lines[0].get_color() == color_of("vllm")
    # its queue ends when its own last request finished, not at the cluster's end
    rows = np.genfromtxt(out / "servers" / "cluster[0]" / "requests.csv", delimiter=",", names=True)
    last = np.nanmax(rows["arrival_s"] + rows["e2e_s"])
    cluster_end = json.loads((out / "servers" / "cluster[0]" / "summary.json").read_text())["sim_end_s"]
    (_, running) = figs["queue.png"].axes[0].lines
    assert running.get_xdata()[-1] == pytest.approx(last) and running.get_ydata()[-1] == 0
    assert last < cluster_end  # (the case: the replica idles while the other works)
