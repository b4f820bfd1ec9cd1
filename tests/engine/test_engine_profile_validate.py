"""Profile round trip (profile -> cost model -> simulation) and the sim-vs-real check."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest

SMALL_GRID = dict(
    tokens=[1, 8, 32, 64], batches=[1, 4], contexts=[16, 64], chunks=[16, 32], chunk_contexts=[0, 32], lm_tokens=[1, 8]
)


def test_profile_round_trip(tiny_model, tmp_path):
    from llmsched.core import make_cost_model
    from llmsched.core.profile import validate_steps
    from llmsched.engine.profiler import profile
    from llmsched.policies import make_scheduler
    from llmsched.sim.result import SimResult
    from llmsched.sim.simulator import simulate_trace

    s = profile(
        tiny_model,
        tmp_path / "prof.csv",
        max_num_seqs=8,
        max_model_len=256,
        b_max=64,
        grid=SMALL_GRID,
        reps=1,
        warmup=0,
        min_s=0,
        calibrate_s=0.6,
    )
    assert s["layers"] == 2 and s["cost_model"].endswith(",overlap=0")
    # the calibration run: a real-time replay of a synthetic workload, fitted sanely
    cal = s["calibration"]
    assert cal["steps"] >= 10 and cal["busy_steps"] >= 5
    assert 0.3 < cal["scale"] < 3
    assert 0 <= cal["fixed_s"] < 5e-3 and 0 <= cal["per_row_s"] < 1e-3
    model = make_cost_model(s["cost_model"])
    assert model.layers == 2
    assert model.step_time(32, 4, 4 * 50, [(32, 0)], 5) > model.step_time(0, 1, 10, [], 1) > 0
    assert len(validate_steps(model)) >= 3
    tr = SimpleNamespace(
        arrival_s=np.array([0.0, 0.01, 0.02]), prompt=np.array([20, 40, 9]), output=np.array([5, 3, 8]), tag=None
    )
    stats = simulate_trace(tr, make_scheduler("sarathi", b_max=32), model)
    res = SimResult({}, stats, tr.arrival_s, tr.prompt, tr.output, None)
    assert res.summary["completed"] == 3 and res.summary["mean_ttft_ms"] > 0


def test_profile_reports_a_short_first_step_after_idle_as_a_ratio(tiny_model, tmp_path, monkeypatch):
    """A ratio of 0.88 read "takes 0.88 x longer"."""
    import llmsched.engine.profiler as prof

    fitted = prof.fit_calibration
    monkeypatch.setattr(prof, "fit_calibration", lambda *a: {**fitted(*a), "after_idle_ratio": 0.88})
    said: list[str] = []
    kw = dict(max_num_seqs=8, max_model_len=256, b_max=64, grid=SMALL_GRID, reps=1, warmup=0, min_s=0)
    prof.profile(tiny_model, tmp_path / "prof.csv", calibrate_s=0.3, progress=said.append, **kw)
    (line,) = [m for m in said if m.startswith("calibration:")]
    assert "the first step after an idle wait takes 0.88 x the calibrated table time" in line
    assert "longer" not in line


def test_profile_warns_when_it_clamps_attention_entries(tiny_model, tmp_path, monkeypatch):
    """A decode step timed no slower than its linear part (a loaded machine) was written as a
    0.0001 ms attention entry without a word: one warning line per table now says so."""
    import warnings

    import llmsched.engine.profiler as prof
    from llmsched.core.errors import InputWarning

    medians = prof.Bench.medians
    # every decode step as fast as nothing: each decode_attn difference comes out negative
    monkeypatch.setattr(
        prof.Bench, "medians", lambda self: {k: 0.0 if k[0] == "decode" else v for k, v in medians(self).items()}
    )
    kw = dict(max_num_seqs=8, max_model_len=256, b_max=64, grid=SMALL_GRID, reps=1, warmup=0, min_s=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof.profile(tiny_model, tmp_path / "prof.csv", calibrate=False, **kw)
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    with open(tmp_path / "prof.csv") as f:
        n = sum(1 for row in csv.DictReader(f) if row["table"] == "decode_attn")
    (line,) = [m for m in said if "decode_attn" in m]
    assert n > 0 and line.startswith(f"{n} of {n} decode_attn entries") and "0.0001 ms" in line
    assert "--tables-s" in line and "quieter machine" in line
    assert len(said) == len({m.split(" entries")[0].split(" ", 3)[-1] for m in said})  # one line per table


def test_clamped_attention_entries_are_written_as_the_floor_after_calibration(tiny_model, tmp_path, monkeypatch):
    # the floor was applied before the calibration's scale: at scale 0.9 the file held
    # 0.00009 ms where the warning and docs/engine.md say 0.0001 ms
    import warnings

    import llmsched.engine.profiler as prof

    medians = prof.Bench.medians
    monkeypatch.setattr(
        prof.Bench, "medians", lambda self: {k: 0.0 if k[0] == "decode" else v for k, v in medians(self).items()}
    )
    fitted = prof.fit_calibration
    monkeypatch.setattr(prof, "fit_calibration", lambda *a: {**fitted(*a), "scale": 0.9})
    kw = dict(max_num_seqs=8, max_model_len=256, b_max=64, grid=SMALL_GRID, reps=1, warmup=0, min_s=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof.profile(tiny_model, tmp_path / "prof.csv", calibrate_s=0.3, **kw)
    with open(tmp_path / "prof.csv") as f:
        dec = [row["ms"] for row in csv.DictReader(f) if row["table"] == "decode_attn"]
    assert dec and set(dec) == {"0.00010"}


def test_validate_reports_errors(tiny_model, tmp_path):
    from llmsched.analysis.validate import METRICS, STATS, validate

    trace = tmp_path / "trace.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens"]
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(8):
        t += float(rng.exponential(0.01))
        rows.append(f"{t:.4f},{int(rng.integers(4, 40))},{int(rng.integers(2, 10))}")
    trace.write_text("\n".join(rows) + "\n")
    res = validate(tiny_model, trace, "sarathi,orca", b_max=32, max_num_seqs=8, reps=1, tables_s=0, calibrate_s=0.5)
    assert set(res["policies"]) == {"sarathi", "orca"}
    for pol in res["policies"].values():
        st = pol["steps"]
        assert st["real"] > 0 and st["sim"] > 0 and st["busy_ratio"] > 0
        for m in METRICS:
            for st in STATS:
                e = pol["errors"][f"{m}_{st}"]
                assert e["real_ms"] > 0 and e["sim_ms"] > 0 and np.isfinite(e["rel_error"])


def test_validate_reports_the_engines_preemptions_per_policy(tiny_model, tmp_path, capsys):
    """validate reported the simulator's preemptions but not the engine's. With every
    request at time 0 the engine plans exactly as the simulator does, so the counts agree;
    each policy's count is its own run's, not the engine's running total."""
    from llmsched.analysis.validate import validate
    from llmsched.cli.analysis import render_validation
    from llmsched.engine import LLMEngine
    from llmsched.engine.replaying import warm_up

    # 4 + 8 blocks of 16: a 128-token cache for 4 x (12 + 40) tokens of work
    eng = LLMEngine(tiny_model, b_max=128, max_num_seqs=4, num_blocks=12, block_size=16, max_model_len=512)
    warm_up(eng)
    before = eng.preemptions
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "0,12,40\n" * 4)
    res = validate(tiny_model, trace, "vllm,sarathi", engine=eng, profile="const:1")
    counts = {p: (r["engine_preemptions"], r["sim_preemptions"]) for p, r in res["policies"].items()}
    assert all(real == sim > 0 for real, sim in counts.values()), counts
    assert sum(real for real, _ in counts.values()) == eng.preemptions - before
    render_validation(res)
    out = capsys.readouterr().out
    n = counts["vllm"][0]
    assert f"preemptions: {n} real, {n} simulated" in out


def test_validate_rejects_bad_input(tiny_model, tmp_path):
    from llmsched.analysis.validate import validate
    from llmsched.core.errors import ConfigError

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    with pytest.raises(ConfigError, match="unknown batch policy"):
        validate(tiny_model, trace, "nosuch")
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,5\n")
    with pytest.raises(ConfigError, match="max length"):
        validate(tiny_model, trace, "sarathi", max_model_len=256, profile="const:1")


class _Cost:
    """A stand-in cost model: 1 ms + 10 us per prefill token + 50 us per decoder."""

    def step_time(self, pf, m, dctx, chunks, sampled):
        return 1e-3 + 1e-5 * pf + 5e-5 * m


def test_fit_calibration_recovers_scale_and_host_time():
    from llmsched.engine.profiler import fit_calibration, fit_host
    from llmsched.engine.replaying import StepRecord

    rng = np.random.default_rng(0)
    cost = _Cost()
    steps = []
    t = 0.0
    for k in range(300):
        m = int(rng.integers(1, 9))
        pf = int(rng.choice([0, 0, 0, 32, 100]))
        args = (pf, m, 100 * m, [(pf, 0)] if pf else [], m + (1 if pf else 0))
        cold = k % 20 == 0
        fwd = cost.step_time(*args) * 1.2 * (1.5 if cold else 1.0) * (1 + 0.02 * rng.standard_normal())
        s = StepRecord(t, cold, args, fwd, fwd + 10e-6)
        s.cycle_s = fwd + 30e-6 + 10e-6 * args[4] + 2e-6 * rng.standard_normal()
        steps.append(s)
        t += s.cycle_s
    cal = fit_calibration(steps, cost)
    assert cal["scale"] == pytest.approx(1.2, rel=0.02)
    assert cal["fixed_s"] == pytest.approx(30e-6, abs=3e-6)
    assert cal["per_row_s"] == pytest.approx(10e-6, abs=1e-6)
    assert cal["after_idle_ratio"] == pytest.approx(1.5, rel=0.05)
    assert cal["after_idle_steps"] == 15 and cal["busy_steps"] == 285
    # a host time that falls with the row count is no line: the median, no slope
    assert fit_host([1, 2, 3, 4], [4e-5, 3e-5, 2e-5, 1e-5]) == (pytest.approx(2.5e-5), 0.0)
    assert fit_host([], []) == (0.0, 0.0)


def test_replay_starts_steps_at_arrivals(tiny_model):
    """Like the simulator, the replay starts a step as soon as a request arrives at an
    idle engine, and marks which steps followed an idle wait."""
    from llmsched.engine.engine import LLMEngine
    from llmsched.engine.replaying import replay, step_ratios

    eng = LLMEngine(tiny_model, b_max=64, max_num_seqs=4, max_model_len=256)
    tr = SimpleNamespace(
        arrival_s=np.array([0.0, 0.08, 0.16, 0.16]),
        prompt=np.array([12, 20, 9, 9]),
        output=np.array([3, 2, 4, 4]),
        tag=None,
    )
    steps = []
    real = replay(eng, tr, steps=steps)
    assert len(real["ttft"]) == 4 and np.all(real["ttft"] > 0)
    cold = [s for s in steps if s.after_idle]
    assert len(cold) == 3  # one per burst: the engine finishes each before the next arrives
    assert all(s.lag_s is not None and 0 <= s.lag_s < 0.01 for s in cold)
    assert cold[0].idle_s is None and all(s.idle_s > 0.02 for s in cold[1:])
    # the two requests of the last burst arrive together and share the first step
    assert cold[-1].args[0] == 18
    busy = [s for s in steps if not s.after_idle]
    assert busy and all(s.cycle_s is None or s.cycle_s >= s.forward_s for s in busy)
    st = step_ratios(steps, _Cost())
    assert st["after_idle_steps"] <= 3 and st["idle_start_lag_ms"] < 10


def test_validate_counts_every_step_after_idle_not_only_the_timed_ones(capsys):
    """Two one-token requests arriving apart run one step each, both after an idle wait,
    and neither is followed by another step, so neither has a start-to-next-start time.
    The line said '2 real steps' but 'first after idle (0 steps ...)'."""
    from llmsched.cli.analysis import render_validation
    from llmsched.engine.replaying import StepRecord, step_ratios

    args = (10, 0, 0, [(10, 0)], 1)
    lone = [StepRecord(0.0, True, args, 1e-3, 1e-3), StepRecord(0.05, True, args, 1e-3, 1e-3)]
    for s in lone:
        s.lag_s = 1e-4
    st = step_ratios(lone, _Cost())
    assert (st["after_idle_steps"], st["after_idle_timed"], st["busy_steps"], st["busy_timed"]) == (2, 0, 0, 0)
    # one request of 3 tokens, then a lone one: 2 of 4 steps after idle, 1 timed; 1 of the
    # 2 back-to-back steps timed (the last before the wait is not)
    steps = [StepRecord(0.0, True, args, 1e-3, 1e-3)]
    steps += [StepRecord(0.002 * k, False, (0, 1, 11, [], 1), 1e-3, 1e-3) for k in (1, 2)]
    steps[0].cycle_s = steps[1].cycle_s = 2e-3
    steps.append(StepRecord(0.05, True, args, 1e-3, 1e-3))
    st = step_ratios(steps, _Cost())
    assert (st["after_idle_steps"], st["after_idle_timed"], st["busy_steps"], st["busy_timed"]) == (2, 1, 2, 1)
    res = {
        "trace_requests": 2,
        "device": "cpu",
        "policies": {"sarathi": {"errors": {}, "steps": {**step_ratios(lone, _Cost()), "sim": 2}}},
    }
    from llmsched.analysis.validate import METRICS, STATS

    res["policies"]["sarathi"]["errors"] = {
        f"{m}_{s}": {"real_ms": None, "sim_ms": None, "rel_error": None} for m in METRICS for s in STATS
    }
    render_validation(res)
    out = " ".join(capsys.readouterr().out.split())
    assert "2 real steps" in out and "first after idle (0 of 2 timed;" in out and "(0 of 0 timed)" in out


def test_reach_budget_fits_a_load_grid_to_b_max():
    from llmsched.engine.profiler import CPU_GRID, reach_budget

    tokens = CPU_GRID["tokens"]  # 1 .. 512
    assert reach_budget(tokens, 512) == tokens
    assert reach_budget(tokens, 1024) == [*tokens, 1024]
    assert reach_budget(tokens, 3000) == [*tokens, 1024, 2048, 3000]
    assert reach_budget(tokens, 300) == [t for t in tokens if t < 300] + [300]
    assert reach_budget([16, 32], 8) == [8]


def _profile_rows(path):
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    linear = sorted(int(r["tokens"]) for r in rows if r["table"] == "linear" and r["mode"] == "eager")
    lm = sorted(int(r["tokens"]) for r in rows if r["table"] == "lm_head")
    chunks = sorted({int(r["chunk"]) for r in rows if r["table"] == "prefill_attn"})
    batches = sorted({int(r["batch"]) for r in rows if r["table"] == "decode_attn"})
    return linear, lm, chunks, batches


@pytest.mark.parametrize(
    "b_max, max_num_seqs, linear, lm, chunks, batches",
    [
        # above the grids' tops: doublings up to b_max, and b_max; a 48-token load is two
        # sequences' chunks (max_model_len 32), a 48-token chunk no sequence holds; decode
        # batches up to the 48 sequences a step can decode (they stopped at 8)
        (48, 48, [1, 8, 16, 32, 48], [1, 2, 8, 16, 32, 48], [16, 32], [1, 4, 8, 16, 32, 48]),
        # below them: nothing past b_max (nor a decode batch over it), b_max itself added, and
        # half of it as a second chunk size (a prefill table of one chunk is refused: with
        # --b-max 16 `profile` wrote a profile that `simulate` could not read)
        (6, 16, [1, 6], [1, 2, 6], [3, 6], [1, 4, 6]),
        # a step samples one row per running sequence: the LM head and the decode batches
        # stop at max_num_seqs
        (48, 4, [1, 8, 16, 32, 48], [1, 2, 4], [16, 32], [1, 4]),
        (48, 3, [1, 8, 16, 32, 48], [1, 2, 3], [16, 32], [1, 3]),
    ],
)
def test_profile_grid_reaches_b_max_and_no_further(
    tiny_model, tmp_path, b_max, max_num_seqs, linear, lm, chunks, batches
):
    from llmsched.core import make_cost_model
    from llmsched.engine.profiler import profile

    grid = dict(tokens=[1, 8], batches=[1, 4, 8], contexts=[8], chunks=[16], chunk_contexts=[0], lm_tokens=[1, 2, 8])
    s = profile(
        tiny_model,
        tmp_path / "prof.csv",
        max_num_seqs=max_num_seqs,
        max_model_len=32,
        b_max=b_max,
        grid=grid,
        reps=1,
        warmup=0,
        min_s=0,
        calibrate=False,
    )
    assert _profile_rows(s["path"]) == (linear, lm, chunks, batches)
    # simulate at this b_max and running cap reads measured loads, not an extrapolation
    cost = make_cost_model(s["cost_model"])
    assert cost.extrapolation(b_max, min(b_max, max_num_seqs), 0) == []


def test_profile_contexts_fit_a_small_max_model_len(tiny_model, tmp_path):
    """The spread decode contexts (up to 2x the mean) dropped every context over
    max_model_len / 2 at batches of 2 and more, and chunk contexts past max_model_len -
    chunk left prefill rows at context 0 only: both come down to what a sequence holds."""
    import csv

    from llmsched.engine.profiler import profile

    grid = dict(tokens=[1, 8], batches=[1, 2, 4], contexts=[16, 48, 128], chunks=[16, 32], chunk_contexts=[0, 32, 128])
    kw = dict(max_num_seqs=4, max_model_len=64, b_max=64, reps=1, warmup=0, min_s=0, calibrate=False)
    s = profile(tiny_model, tmp_path / "prof.csv", grid=grid, **kw)
    with open(s["path"], newline="") as f:
        rows = list(csv.DictReader(f))
    dec = {(int(r["batch"]), int(r["context"])) for r in rows if r["table"] == "decode_attn"}
    pre = {(int(r["chunk"]), int(r["context"])) for r in rows if r["table"] == "prefill_attn"}
    assert dec == {(b, c) for b in (1, 2, 4) for c in (16, 48, 64)}
    assert pre == {(16, 0), (16, 32), (16, 48), (32, 0), (32, 32), (64, 0)}


def test_profile_refuses_a_grid_whose_decode_batches_exceed_b_max(tiny_model, tmp_path):
    from llmsched.core.errors import ConfigError
    from llmsched.engine.profiler import profile

    with pytest.raises(ConfigError, match=r"smallest decode batch \(4\) exceeds b_max 2.*raise --b-max"):
        profile(tiny_model, tmp_path / "p.csv", max_num_seqs=8, max_model_len=64, b_max=2, grid=dict(batches=[4, 8]))
    assert not (tmp_path / "p.csv").exists()


def test_validate_binds_its_cost_model_to_the_engines_scheduler(tiny_model, tmp_path, monkeypatch):
    """validate bound its cost model to the simulator's scheduler only: the engine's
    adaptive planned with `paper`, so the two sides ran different schedulers."""
    from llmsched.analysis import validate as v
    from llmsched.engine import LLMEngine
    from llmsched.engine.replaying import warm_up

    eng = LLMEngine(tiny_model, scheduler="adaptive", b_max=64, k_max=4, max_num_seqs=4, max_model_len=256)
    warm_up(eng)
    seen = {}
    replay, simulate = v.replay, v.simulate

    def spy_replay(engine, *a, **kw):
        seen["engine"] = engine.scheduler.batch.cost
        seen["engine_cands"] = list(engine.scheduler.batch._cands)
        return replay(engine, *a, **kw)

    def spy_simulate(trace, engine, policy, cost):
        seen["sim"] = cost
        sched = v.make_scheduler(
            policy, b_max=engine.b_max, k_max=engine.k_max, kv_capacity=engine.kv_capacity, max_running=4
        )
        sched.bind_cost_model(cost)
        seen["sim_cands"] = list(sched.batch._cands)
        return simulate(trace, engine, policy, cost)

    monkeypatch.setattr(v, "replay", spy_replay)
    monkeypatch.setattr(v, "simulate", spy_simulate)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,3\n")
    v.validate(tiny_model, trace, "adaptive", engine=eng, profile="linear:c=2,a=0.5")
    assert seen["engine"] is seen["sim"]
    assert type(seen["engine"]).__name__ == "LinearCostModel"
    assert seen["engine_cands"] == seen["sim_cands"]


def test_a_model_too_short_to_profile_is_not_told_to_raise_max_model_len(tmp_path):
    """A model whose max_position_embeddings is shorter than the grid's smallest chunk
    was told to raise --max-model-len, which the model's positions do not allow."""
    from llmsched.core.errors import ConfigError
    from llmsched.engine.profiler import profile
    from llmsched.engine.tiny import make_tiny_model

    short = make_tiny_model(
        tmp_path / "short", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64,
        max_position_embeddings=1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="the model's own limit is 1 token") as e:
        profile(short, tmp_path / "p.csv", max_num_seqs=2, reps=1, warmup=0, min_s=0, calibrate=False)
    assert "raise --max-model-len" not in str(e.value)


def test_validate_names_max_model_len_apart_from_the_models_limit(tiny_model, tmp_path):
    """A --max-model-len of 256 was called 'the model's max length'."""
    from llmsched.analysis.validate import validate
    from llmsched.core.errors import ConfigError

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,500,5\n")
    with pytest.raises(ConfigError, match=r"505 tokens, more than max_model_len 256 \(--max-model-len; the model's "):
        validate(tiny_model, trace, "sarathi", max_model_len=256, profile="const:1")


def test_validate_names_a_too_long_request_by_its_arrival_and_lengths(tiny_model, tmp_path):
    """The trace is sorted by arrival: the file's second row was named 'trace request 0'."""
    from llmsched.analysis.validate import validate
    from llmsched.core.errors import ConfigError

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.1,500,5\n")
    with pytest.raises(ConfigError, match=r"request 0 \(arriving at 0.1 s: 500 prompt \+ 5 output tokens\) needs 505"):
        validate(tiny_model, trace, "sarathi", max_model_len=256, profile="const:1")


def test_validate_names_its_cpu_default_max_model_len(tiny_model, tmp_path):
    """Without --max-model-len, validate on the CPU caps it at 4096: the message called
    that cap --max-model-len, as if the user had given it."""
    import json
    import shutil

    from llmsched.analysis.validate import validate
    from llmsched.core.errors import ConfigError

    model = tmp_path / "long"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["max_position_embeddings"] = 8192
    (model / "config.json").write_text(json.dumps(cfg))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,5\n")
    with pytest.raises(ConfigError, match=r"max_model_len 4096 \(the default on the CPU; --max-model-len raises it"):
        validate(model, trace, "sarathi", profile="const:1")


def test_validate_refuses_a_profile_of_a_model_with_other_layers(tiny_model, tmp_path):
    """A profile measured on a 2-layer model, given to validate a 1-layer one, ran without
    a word: every simulated step was the other model's. The shipped profiles and a spec
    that sets the layer count (`,layers=N`) are used as given."""
    from llmsched.analysis.validate import validate
    from llmsched.core.errors import ConfigError
    from llmsched.engine.profiler import profile
    from llmsched.engine.tiny import make_tiny_model

    prof = profile(
        tiny_model, tmp_path / "p.csv", max_num_seqs=4, max_model_len=64, b_max=32, grid=SMALL_GRID,
        reps=1, warmup=0, min_s=0, calibrate=False,
    )["path"]  # fmt: skip
    one = make_tiny_model(tmp_path / "one", num_layers=1, hidden_size=64, intermediate_size=128)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n")
    opts = dict(b_max=32, max_num_seqs=4, max_model_len=64)
    with pytest.raises(ConfigError, match=r"measured on a model of 2 layers, but --model .* has 1: profile this"):
        validate(one, trace, "sarathi", profile=str(prof), **opts)
    assert validate(tiny_model, trace, "sarathi", profile=f"profile:{prof}", **opts)["policies"]
    assert validate(one, trace, "sarathi", profile=f"profile:{prof},layers=1", **opts)["policies"]
    assert validate(one, trace, "sarathi", profile="profile", **opts)["policies"]


def test_generate_and_serve_refuse_a_profile_of_a_model_with_other_layers(tiny_model, tmp_path, capsys):
    """`validate --profile` refused a profile of a 2-layer model for a 1-layer one; generate
    and serve bound it to the policies that plan with step times, silently."""
    from llmsched.cli import build_parser, main
    from llmsched.cli import server as server_cli
    from llmsched.core.errors import ConfigError
    from llmsched.engine import LLMEngine
    from llmsched.engine.profiler import profile
    from llmsched.engine.tiny import make_tiny_model

    prof = profile(
        tiny_model, tmp_path / "p.csv", max_num_seqs=4, max_model_len=64, b_max=32, grid=SMALL_GRID,
        reps=1, warmup=0, min_s=0, calibrate=False,
    )["path"]  # fmt: skip
    one = make_tiny_model(tmp_path / "one", num_layers=1, hidden_size=64, intermediate_size=128)
    said = (
        f"--cost-model profile:{prof} was measured on a model of 2 layers, but --model {one} has 1: "
        f"profile this model (llmsched profile --model {one} --out PATH)"
    )
    common = ["--policy", "adaptive", "--max-model-len", "64", "--cost-model"]
    argv = ["generate", "--model", str(one), "--prompt-ids", "1,2", "--max-tokens", "2", *common, f"profile:{prof}"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"llmsched generate: error: {said}"
    serve = build_parser("serve").parse_args(["serve", "--model", str(one), *common, f"profile:{prof}"])
    with pytest.raises(ConfigError) as e:
        server_cli.build_backend(serve)
    assert str(e.value) == said
    # the model it was measured on, a layer count set by hand and a shipped profile: as given
    assert main([*argv[:2], str(tiny_model), *argv[3:]]) == 0
    assert main([*argv[:-1], f"profile:{prof},layers=1"]) == 0
    engine = LLMEngine(one, max_model_len=64, cost_model="profile")
    with pytest.raises(ConfigError, match="was measured on a model of 2 layers"):
        engine.bind_cost_model(f"profile:{prof}")  # a later binding too
