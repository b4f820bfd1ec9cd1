"""The Python API: simulate() from keywords, dicts, YAML; closed-loop feedback."""

import numpy as np
import pytest
from helpers import trace

import llmsched
from llmsched.core import ConfigError
from llmsched.policies import AdmissionPolicy, register_admission_policy


def test_simulate_from_keywords_returns_a_result(tmp_path):
    r = llmsched.simulate(
        policy="orca",
        b_max=256,
        cost_model="paper",
        rate=4,
        prompt="const:100",
        output="const:20",
        num_requests=200,
        out_dir=tmp_path / "r",
    )
    s = r.summary
    assert s["completed"] == 200 and s["total_output_tokens"] == 4000
    assert s["total_input_tokens"] == 20000
    assert np.all(r.ttft_s > 0) and np.all(r.e2e_s >= r.ttft_s)
    assert np.allclose(r.tpot_s, (r.e2e_s - r.ttft_s) / 19)
    assert (tmp_path / "r" / "summary.json").exists()
    assert r.config["scheduler"]["batch_policy"] == "orca"


def test_same_seed_same_result_and_seed_changes_it():
    kw = dict(cost_model="paper", b_max=256, rate=6, prompt="geometric:80", output="geometric:20", num_requests=300)
    a, b = llmsched.simulate(seed=3, **kw), llmsched.simulate(seed=3, **kw)
    c = llmsched.simulate(seed=4, **kw)
    assert np.array_equal(a.stats.e2e_ns, b.stats.e2e_ns)
    assert not np.array_equal(a.stats.e2e_ns, c.stats.e2e_ns)


def test_bad_options_raise_config_error():
    with pytest.raises(ConfigError, match="unknown option"):
        llmsched.simulate(polcy="sarathi")
    with pytest.raises(ConfigError, match="b_max"):
        llmsched.simulate(b_max=-5, num_requests=10)
    for workload in ("x", ["rate", 5]):
        with pytest.raises(ConfigError, match="workload must be a mapping"):
            llmsched.simulate(cost_model="paper", num_requests=10, workload=workload)


def test_max_time_leaves_requests_unfinished_but_not_lost():
    r = llmsched.simulate(
        cost_model="paper", b_max=128, rate=50, prompt="const:200", output="const:50", num_requests=500, max_time_s=5.0
    )
    s = r.summary
    assert s["unfinished"] > 0 and s["completed"] + s["unfinished"] == 500
    assert s["sim_end_s"] <= 5.0 + 0.2


class Recorder(AdmissionPolicy):
    """A closed-loop admission policy that records its feedback and admits one request per
    step while the last step was slower than a threshold."""

    name = "recorder"
    closed_loop = True

    def __init__(self, slow_s=0.05):
        self.slow_s = slow_s
        self.durations, self.emitted = [], []
        self.slow = False

    def may_admit(self, state, r, planner):
        return not (self.slow and planner.n_admitted >= 1)

    def observe(self, state, feedback):
        self.durations.append(feedback.duration)
        self.emitted.append(sum(n for _, n in feedback.emitted()))
        self.slow = feedback.duration > self.slow_s


def test_closed_loop_policy_gets_durations_and_emitted_tokens():
    made = []
    register_admission_policy("recorder", lambda **kw: made.append(Recorder(**kw)) or made[-1])
    tr = trace([(0.0, 10, 5), (0.0, 10, 3), (0.01, 300, 2)])
    r = llmsched.simulate(trace=tr, admission="recorder", b_max=512, cost_model="paper", record_steps=True)
    rec = made[-1]
    rows = r.steps_path.read_text().splitlines()[1:]
    assert len(rec.durations) == len(rows) == r.summary["steps"]
    assert rec.durations == pytest.approx([float(x.split(",")[2]) for x in rows])
    assert sum(rec.emitted) == int(tr.output.sum())  # every output token reported once
    # under preemption too: a recompute's token is reported
    tr = trace([(0.0, 50, 60)] * 4)
    r = llmsched.simulate(trace=tr, admission="recorder", b_max=64, kv_capacity=120, cost_model="paper")
    assert r.summary["preemptions"] > 0
    assert sum(made[-1].emitted) == int(tr.output.sum())


def test_bunched_arrivals_keep_the_time_series_bounded():
    r = llmsched.simulate(
        arrival="deterministic",
        rate=1e9,
        prompt="geometric:1000",
        output="geometric:300",
        num_requests=5000,
        cost_model="paper",
    )
    t = r.timeseries["time_s"]
    assert 1000 < len(t) <= 4096
    drain = t[t > t[0] + r.arrival_span_s]  # (the samples up to the last arrival are kept)
    gaps = np.diff(drain)
    assert len(drain) == len(t) - 1 and np.allclose(gaps, gaps[0])  # still a regular grid
    assert t[-1] >= r.summary["sim_end_s"] - 2 * gaps[0]


def test_equal_gaps_have_zero_itl_spread():
    r = llmsched.simulate(
        policy="fastertransformer",
        cost_model="paper",
        b_max=128,
        rate=2,
        prompt="const:100",
        output="const:50",
        num_requests=50,
    )
    assert r.summary["std_itl_ms"] == 0 and r.summary["itl_cv"] == 0


def test_provenance_reads_the_git_commit_without_git(tmp_path):
    import subprocess
    from pathlib import Path

    from llmsched.api import git_commit

    src = Path(llmsched.__file__).resolve().parent
    out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    want = out.stdout.strip() if out.returncode == 0 else None
    assert git_commit(src) == want
    assert git_commit(tmp_path) is None
    # a linked work tree and packed refs
    (tmp_path / "main" / ".git" / "worktrees" / "wt").mkdir(parents=True)
    common = tmp_path / "main" / ".git"
    (common / "packed-refs").write_text("# pack-refs\n" + "ab" * 20 + " refs/heads/side\n")
    wt = common / "worktrees" / "wt"
    (wt / "HEAD").write_text("ref: refs/heads/side\n")
    (wt / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {wt}\n")
    assert git_commit(tmp_path / "wt") == "ab" * 20


@pytest.mark.parametrize(
    "option,message",
    [
        ({"b_max": 10**30}, "b_max must be at most 1,048,576 tokens per step"),
        ({"k_max": 10**30}, "k_max must be at most 1,048,576"),
        ({"kv_capacity": 10**30}, "kv_capacity must be at most 1,099,511,627,776"),
    ],
)
def test_limits_past_any_server_are_one_line_errors(option, message):
    # the server's constraints hold the caps, whatever the entry point (a config file's
    # k_max of 1e30 once crashed the capacity region with an overflow)
    with pytest.raises(ConfigError, match=message) as e:
        llmsched.simulate(num_requests=5, rate=1, **option)
    assert "\n" not in str(e.value)


def test_recorded_steps_follow_the_result_and_leave_no_temporary_file(tmp_path, monkeypatch):
    import gc
    import tempfile

    import llmsched

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    kw = dict(cost_model="paper", rate=5, prompt="geometric:50", output="geometric:20", num_requests=30)
    r = llmsched.simulate(record_steps=True, **kw)
    rows = r.to_pandas()["steps"]
    assert len(rows) == r.summary["steps"]
    r.write(tmp_path / "a")
    assert (tmp_path / "a" / "steps.csv").is_file()
    assert list(scratch.iterdir()) == []  # moved, not copied
    r.write(tmp_path / "b")  # a second folder gets its own copy
    assert (tmp_path / "b" / "steps.csv").read_text() == (tmp_path / "a" / "steps.csv").read_text()
    assert len((tmp_path / "a" / "steps.csv").read_text().splitlines()) == len(rows) + 1
    # a result never written takes its temporary steps with it
    r2 = llmsched.simulate(record_steps=True, **kw)
    assert len(list(scratch.iterdir())) == 1
    del r2
    gc.collect()
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_simulate_trace_binds_the_cost_model_as_simulate_does(admission):
    """simulate_trace (the library function) binds its cost model to the scheduler, as
    simulate and the virtual GPU do: TWP and DynamicBatch read l_min from it instead of
    learning it from the steps, and both give the same run."""
    from llmsched.core import make_cost_model
    from llmsched.policies import make_scheduler
    from llmsched.policies.twp import decode_step_time
    from llmsched.sim.simulator import simulate_trace

    rng = np.random.default_rng(3)
    n = 300
    tr = trace(
        list(zip(np.cumsum(rng.exponential(0.02, n)), rng.integers(20, 400, n), rng.integers(5, 120, n), strict=True))
    )
    options = {"itl_target_ms": 60}
    run = llmsched.simulate(
        trace=tr, policy="sarathi", admission=admission, b_max=256, admission_options=options, cost_model="paper"
    )
    sched = make_scheduler("sarathi", admission=admission, b_max=256, admission_options=options)
    cost = make_cost_model("paper")
    stats = simulate_trace(tr, sched, cost)
    assert sched.admission.l_min_s == pytest.approx(decode_step_time(cost, 1, sched.admission.context))
    assert stats.steps == run.stats.steps and stats.end_ns == run.stats.end_ns
    for field in ("ttft_ns", "e2e_ns", "queue_ns", "preemptions"):
        assert np.array_equal(getattr(stats, field), getattr(run.stats, field)), field
