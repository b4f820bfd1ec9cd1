"""`reproduce_twp` (paper 2's Table III, figures, ablation, goodput, stability sweep):
the quick mode end to end, goodput and the platform capacity on hand cases."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmsched.analysis.reproduce_twp import (
    BASE_PLATFORM,
    SCHEDULERS,
    goodput,
    platform_capacity,
    reproduce_twp,
    workload_section,
)
from llmsched.core.errors import ConfigError
from llmsched.theory import LengthMix, capacity
from llmsched.workload.serverless import ServerlessSpec, make_serverless_requests

ROOT = Path(__file__).resolve().parents[1]


FIGURES = {}  # figure file name -> per panel (y limits, bar heights), as quick saved them


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    import llmsched.analysis.reproduce_twp as module

    out = tmp_path_factory.mktemp("twp")
    save = module.save_figure

    def recorded(fig, path):
        FIGURES[Path(path).name] = [(ax.get_ylim(), [b.get_height() for b in ax.patches]) for ax in fig.axes]
        return save(fig, path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "save_figure", recorded)
        res = reproduce_twp(out_dir=out, quick=True, num_requests=200, stability_requests=600, workers=1)
    return out, res


def test_every_ttft_bar_rises_from_below_its_value(quick):
    """TTFT bars on a log axis: matplotlib put the axis's floor just under the smallest bar
    (ServerlessLLM's P50 at load 0.9 was a sliver), so a bar's height told nothing."""
    panels = [p for p in FIGURES["ttft.png"] if p[1]]
    assert panels
    for (bottom, _), heights in panels:
        smallest = min(h for h in heights if h > 1e-3)
        assert bottom <= smallest / 2.9


def test_the_command_line_prints_table_3_and_twp_against_the_baselines(quick, capsys):
    """`llmsched reproduce twp` prints every row of Table III and one comparison row per
    workload and load (it used to print an empty findings table)."""
    from llmsched.cli.analysis import _print_twp

    _, res = quick
    _print_twp(res)
    text = capsys.readouterr().out
    assert "Table III" in text and "TWP req/s vs ServerlessLLM" in text
    for r in res["table3"]:
        assert any(r["workload"] in line and r["scheduler"] in line for line in text.splitlines())
    twp = next(r for r in res["table3"] if r["scheduler"] == "TWP")
    assert f"{twp['throughput_rps']:.2f}" in text and f"{twp['itl_cv']:.3f}" in text
    c = res["claims"][0]
    assert f"{c['throughput_rps_vs_serverlessllm']:+.1%}" in text


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_quick_writes_its_files(quick):
    out, res = quick
    for name in (
        "table.csv",
        "table3.csv",
        "ablation.csv",
        "slo.csv",
        "stability.csv",
        "result.json",
        "ttft.png",
        "itl_cdf.png",
        "tpot_box.png",
        "throughput.png",
        "itl_cv.png",
        "ablation.png",
        "stability.png",
    ):
        p = out / name
        assert p.is_file() and p.stat().st_size > 0, name
        assert str(p) in res["files"]
    assert (out / "ttft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "result.json").read_text())
    assert len(saved["table3"]) == len(res["table3"])
    json.dumps(res)  # JSON-able


def test_quick_has_every_scheduler_row_with_finite_numbers(quick):
    out, res = quick
    loads = res["config"]["loads"]
    assert loads == [0.3, 0.9]
    table3 = res["table3"]
    assert len(table3) == 2 * len(loads) * len(SCHEDULERS)
    labels = {"FCFS", "Round-Robin", "Priority", "DynamicBatch", "ServerlessLLM", "TWP"}
    for w in ("azure", "sharegpt"):
        for x in loads:
            got = {r["scheduler"] for r in table3 if r["workload"] == w and r["load_fraction"] == x}
            assert got == labels, (w, x)
    for r in table3:
        for k in (
            "throughput_rps",
            "p99_latency_ms",
            "mean_ttft_ms",
            "p50_ttft_ms",
            "p99_ttft_ms",
            "mean_itl_ms",
            "p99_itl_ms",
            "itl_cv",
        ):
            assert _finite(r[k]) and r[k] >= 0, (r["scheduler"], k, r[k])
        assert r["throughput_rps"] > 0
        assert r["p99_ttft_ms"] >= r["p50_ttft_ms"]
    with open(out / "table3.csv") as f:
        assert len(list(csv.DictReader(f))) == len(table3)
    # the per-run rows: every request completes, goodput shares within [0, 1]
    for r in res["rows"]:
        assert r["completed"] == r["num_requests"] == 200
        shares = [v for k, v in r.items() if k.startswith("goodput_share@")]
        assert shares and all(0 <= v <= 1 for v in shares)
    # rates follow the loads of each workload's capacity
    for w in ("azure", "sharegpt"):
        lam = res["capacity"][w]["critical_rate"]
        assert res["config"]["rates"][f"{w}@0.9"] == pytest.approx(0.9 * lam)


def test_quick_claims_ablation_slo_and_stability(quick):
    _, res = quick
    assert len(res["claims"]) == 4
    for c in res["claims"]:
        assert _finite(c["throughput_rps_vs_serverlessllm"])
        assert _finite(c["itl_cv_vs_best_conventional"])
    variants = [r["variant"] for r in res["ablation"]]
    assert variants[0] == "defaults" and {"beta=0.3", "delta=2", "itl_target_ms=10", "h_min=64"} <= set(variants)
    assert all(_finite(r["itl_cv"]) for r in res["ablation"])
    slo = res["slo"]
    assert {r["scheduler"] for r in slo} == set(SCHEDULERS)
    assert any(r["variant"] == "itl_target_ms=15" for r in slo)
    assert all(0 <= r["goodput_share"] <= 1 and r["itl_slo_ms"] == 15 for r in slo)
    stab = res["stability"]
    assert {(r["k_max"], r["admission"]) for r in stab} == {
        (k, a) for k in (None, 64) for a in ("fcfs", "twp", "twp itl_target_ms=15")
    }
    for r in stab:
        assert r["verdict"] in ("stable", "unstable", "inconclusive")
        assert r["utilisation"] == pytest.approx(r["load"], rel=0.05)


def test_goodput_hand_case():
    # five requests: good; TTFT too late; gap too slow; unfinished; one output token (no gap)
    ttft = [0.5, 3.0, 0.2, np.nan, 0.1]
    tpot = [0.010, 0.010, 0.030, np.nan, np.nan]
    fin = [True, True, True, False, True]
    g = goodput(ttft, tpot, fin, 10.0, ttft_slo_ms=2000, itl_slo_ms=20)
    assert g == {"good": 2, "requests": 5, "share": 0.4, "rps": 0.2}
    # only the ITL SLO: the late request counts, the slow one does not
    assert goodput(ttft, tpot, fin, 10.0, itl_slo_ms=20)["good"] == 3
    # only the TTFT SLO
    assert goodput(ttft, tpot, fin, 10.0, ttft_slo_ms=2000)["good"] == 3
    # no SLO: every finished request; the limits are inclusive
    assert goodput(ttft, tpot, fin, 10.0)["good"] == 4
    assert goodput(ttft, tpot, fin, 10.0, ttft_slo_ms=500, itl_slo_ms=10)["good"] == 2
    with pytest.raises(ValueError):
        goodput([1.0], [1.0, 2.0], [True], 1.0)


def test_platform_capacity_by_hand():
    d = dict(BASE_PLATFORM)
    d["workload"] = workload_section("sharegpt", 1.0, 5000, 0)
    cap = platform_capacity(ServerlessSpec.from_dict(d), samples=5000)
    ms = cap["models"]
    assert sum(m["instances"] for m in ms.values()) == cap["gpus"] == 8
    assert sum(m["share"] for m in ms.values()) == pytest.approx(1.0)
    # each model's lambda* times its steps with the contexts of its own requests' lengths
    reqs = make_serverless_requests(ServerlessSpec.from_dict(d).replaced(num_requests=5000))
    for name, m in ms.items():
        cm = BASE_PLATFORM["models"][name]["cost_model"]
        sel = reqs.model == reqs.models.index(name)
        mix = LengthMix(reqs.prompt[sel], reqs.output[sel])
        assert (mix.mean_prompt, mix.mean_output) == (m["mean_prompt"], m["mean_output"])
        by_hand = capacity(cm, 512, m["mean_prompt"], m["mean_output"], mix=mix).critical_rate
        assert m["instance_rate"] == pytest.approx(by_hand)
        # (below the means' representative contexts: ShareGPT's lengths vary)
        assert by_hand < capacity(cm, 512, m["mean_prompt"], m["mean_output"]).critical_rate
        assert 1 <= m["instances"] <= 4
    lam = cap["critical_rate"]
    assert lam == pytest.approx(min(m["instances"] * m["instance_rate"] / m["share"] for m in ms.values()))
    # greedy is optimal: moving one GPU from any model to any other does not raise the capacity
    names = list(ms)
    for a in names:
        for b in names:
            if a == b or ms[a]["instances"] == 1 or ms[b]["instances"] == 4:
                continue
            n = {k: ms[k]["instances"] for k in names}
            n[a] -= 1
            n[b] += 1
            assert min(n[k] * ms[k]["instance_rate"] / ms[k]["share"] for k in names) <= lam + 1e-9


def test_base_platform_is_the_example_yaml():
    example = yaml.safe_load((ROOT / "examples" / "serverless" / "twp_repro.yaml").read_text())
    assert ServerlessSpec.from_dict(example).to_dict() == ServerlessSpec.from_dict(BASE_PLATFORM).to_dict()


def test_bad_arguments():
    with pytest.raises(ConfigError, match="unknown workload"):
        reproduce_twp(workloads=["nope"], quick=True)
    with pytest.raises(ConfigError, match="unknown platform scheduler"):
        reproduce_twp(schedulers=["fifo"], quick=True)
    with pytest.raises(ConfigError, match="loads"):
        reproduce_twp(loads=[-1], quick=True)
    # a repeat ran its cells twice and Table III counted them as two seeds
    with pytest.raises(ConfigError, match="schedulers: 'fcfs' is given twice"):
        reproduce_twp(schedulers=["fcfs", "twp", "fcfs"], quick=True)
    with pytest.raises(ConfigError, match="workloads: 'azure' is given twice"):
        reproduce_twp(workloads=["azure", "azure"], quick=True)
    with pytest.raises(ConfigError, match="loads: 0.3 is given twice"):
        reproduce_twp(loads=[0.3, 0.30], quick=True)
    with pytest.raises(ConfigError, match="at least one platform scheduler"):
        reproduce_twp(schedulers=[], quick=True)


def test_a_seed_given_twice_is_refused_before_any_run_or_folder(tmp_path, capsys):
    """`--seeds 0,0` ran every run of Table III twice and averaged both; the single-server
    and network reproductions already refused it."""
    from helpers import one_line_error

    out = tmp_path / "twp"
    argv = ["reproduce", "twp", "--quick", "--seeds", "0,0", "--out", str(out)]
    one_line_error(capsys, argv, "seed 0 is given twice")
    assert not out.exists()
    with pytest.raises(ConfigError, match="seed 1 is given twice"):
        reproduce_twp(out_dir=out, quick=True, seeds=[1, 0, 1])
    with pytest.raises(ConfigError, match="whole numbers >= 0"):
        reproduce_twp(out_dir=out, quick=True, seeds=[0.5])
    assert not out.exists()


def test_twp_observe_follows_the_rule_on_random_feedback():
    """TWP's per-step `observe` (ITL sample inlined for speed) gives exactly the windows
    of the rule written plainly: ItlMeter's sample, EWMA, AIMD with the queue term."""
    from llmsched.core import StepFeedback, StepPlan
    from llmsched.core.constraints import Constraints
    from llmsched.core.request import Request
    from llmsched.core.state import ServerState
    from llmsched.policies import TWP
    from llmsched.policies.twp import ItlMeter

    rng = np.random.default_rng(3)
    for opts in ({}, {"itl_target_ms": 60, "beta": 0.7, "alpha": 0.5}, {"h_min": 16, "h0": 300}):
        st = ServerState(Constraints(b_max=512))
        pol = TWP(cost="paper", **opts)
        pol.token_limit(st)
        meter, ewma, window = ItlMeter(), None, pol.window
        target = pol.itl_target()
        t, rid, queued = 0.0, 0, []
        for _ in range(400):
            for _ in range(int(rng.integers(0, 3))):
                r = Request(rid, 0, 10, 5)
                st.add(r)
                queued.append(r)
                rid += 1
            while queued and rng.random() < 0.6:  # the queue drains too (down to empty)
                st.waiting.remove(queued.pop(0))
            dur = float(rng.choice([0.03, 0.05, 0.08, 0.12, 0.2]))
            start = t + (float(rng.choice([0.0, 0.0, 0.01])))
            fb = StepFeedback(
                start,
                dur,
                StepPlan(int(rng.integers(0, 3)), []),
                [],
                [object()] if rng.random() < 0.2 else [],
                list,
                [],
            )
            t = start + dur
            pol.observe(st, fb)
            s = meter.sample(fb)
            if s is not None:
                ewma = s if ewma is None else pol.alpha * s + (1 - pol.alpha) * ewma
            if ewma is not None and ewma > target:
                window = max(float(pol.H_min), pol.beta * window)
            else:
                window = min(float(pol.H_max), window + pol.delta_tokens * (1 + math.log1p(len(st.waiting))))
            assert pol.window == window and pol.l_ewma == ewma


def test_serverless_requests_csv_in_blocks_is_the_same_file():
    """requests.csv is written a block of rows at a time (bounded memory at 1M requests);
    block boundaries change nothing."""
    import io

    from llmsched.sim.serverless_result import simulate_serverless

    r = simulate_serverless(ROOT / "examples" / "serverless" / "small.yaml", num_requests=120)
    whole, parts = io.StringIO(), io.StringIO()
    r._write_requests(whole, block=10**9)
    r._write_requests(parts, block=7)
    assert whole.getvalue() == parts.getvalue()
    lines = whole.getvalue().splitlines()
    assert len(lines) == 121 and lines[1].startswith("0,") and lines[-1].startswith("119,")


def test_the_command_line_chooses_workload_schedulers_and_load(tmp_path, capsys, monkeypatch):
    """`reproduce twp --workload W --policies A,B --load X` (refused as stability-only
    options before) reach `reproduce_twp`; a bad choice is one line."""
    from helpers import one_line_error

    import llmsched.analysis.reproduce_twp as mod
    from llmsched.cli import main

    seen = {}

    def fake(**kw):
        seen.update(kw)
        return {"files": [], "wall_s": 0.0}

    monkeypatch.setattr(mod, "reproduce_twp", fake)
    argv = ["reproduce", "twp", "--quick", "--json", "--out", str(tmp_path / "o")]
    assert main([*argv, "--workload", "sharegpt", "--policies", "twp, fcfs", "--load", "0.3"]) == 0
    assert (seen["workloads"], seen["schedulers"], seen["loads"]) == (["sharegpt"], ["twp", "fcfs"], [0.3])
    seen.clear()
    assert main(argv) == 0
    assert not {"workloads", "schedulers", "loads"} & set(seen)
    monkeypatch.undo()
    one_line_error(capsys, [*argv, "--workload", "synthetic"], "unknown workload 'synthetic'")
    one_line_error(capsys, [*argv, "--policies", "twp,fifo"], "unknown platform scheduler 'fifo'")


def test_the_stability_figure_tells_twp_and_twp_with_a_target_apart(tmp_path, monkeypatch):
    """ "twp" and "twp itl_target_ms=15" were drawn in one colour and one line style."""
    import llmsched.analysis.reproduce_twp as mod

    figs = []
    monkeypatch.setattr(mod, "save_figure", lambda fig, path: figs.append(fig) or str(path))
    rows = [
        {"k_max": k, "admission": a, "load": x, "request_throughput": x, "critical_rate": 1.0, "verdict": "stable"}
        for k in (None, 64)
        for a in ("fcfs", "twp", "twp itl_target_ms=15")
        for x in (0.5, 0.9)
    ]
    mod._plot_stability(rows, tmp_path / "stability.png")
    for ax in figs[0].axes:
        lines = {ln.get_label(): (ln.get_color(), ln.get_linestyle()) for ln in ax.get_lines()}
        assert lines["twp"][0] == lines["twp itl_target_ms=15"][0]  # TWP's colour
        assert lines["twp"] != lines["twp itl_target_ms=15"]  # but another line
        assert len({lines[a] for a in ("fcfs", "twp", "twp itl_target_ms=15", "offered")}) == 4


def test_panel_titles_and_the_itl_cdfs_tick_labels(tmp_path, monkeypatch):
    """Panels read "azure, load 0.3 load" (a load's name, then " load" again); the ITL
    CDF's log axis under a decade labelled its minor ticks 2x10^0, 3x10^0, ..., overlapping."""
    import llmsched.analysis.reproduce_twp as mod

    figs = {}
    real = mod.save_figure

    def save(fig, path):
        figs[path.name] = fig
        return real(fig, path)

    monkeypatch.setattr(mod, "save_figure", save)
    reproduce_twp(
        out_dir=tmp_path / "o",
        workloads=["azure"],
        schedulers=["fcfs", "twp"],
        loads=[0.3],
        num_requests=100,
        ablation=False,
        slo=False,
        stability=False,
        workers=1,
    )
    for name in ("ttft.png", "itl_cdf.png", "tpot_box.png"):
        assert [ax.get_title() for ax in figs[name].axes] == ["azure, load 0.3"], name
    assert mod._load_phrase("low") == "low load" and mod._load_phrase("load 0.3") == "load 0.3"
    fig = figs["itl_cdf.png"]
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert hi / lo < 100  # the case: a range of two decades or less
    renderer = fig.canvas.get_renderer()
    shown = [
        t
        for t in [*ax.xaxis.get_majorticklabels(), *ax.xaxis.get_minorticklabels()]
        if t.get_visible() and t.get_text() and lo <= t.get_position()[0] <= hi
    ]
    assert len(shown) >= 2
    for t in shown:
        float(t.get_text())  # plain numbers, not 2x10^0
    boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))  # none overlaps the next


def test_without_twp_no_empty_comparison_table_is_printed(capsys):
    """`reproduce twp --policies fcfs` printed "TWP against the baselines" as a header alone."""
    from llmsched.cli.analysis import _print_twp

    row = {
        "workload": "azure",
        "load": "load 0.3",
        "scheduler": "FCFS",
        "throughput_rps": 1.0,
        "p99_latency_ms": 1.0,
        "p99_ttft_ms": 1.0,
        "mean_itl_ms": 1.0,
        "p99_itl_ms": 1.0,
        "itl_cv": 0.1,
    }
    _print_twp({"table3": [row], "claims": [], "config": {"schedulers": ["fcfs"]}})
    text = capsys.readouterr().out
    assert "Table III" in text and "TWP against the baselines" not in text
    assert "note: TWP is not among the platform schedulers" in text
    _print_twp({"table3": [{**row, "scheduler": "TWP"}], "claims": [{}], "config": {"schedulers": ["twp"]}})
    text = capsys.readouterr().out
    assert "TWP against the baselines" not in text and "TWP is the only platform scheduler" in text
