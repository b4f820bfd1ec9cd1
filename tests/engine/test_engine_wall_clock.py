"""The engine converts a request's `time.time()` stamp by its age when it is added, not by
an offset fixed when the engine was built: a wall clock stepped since then shifted every
arrival (queue times, TTFTs and the server's histograms came out wrong by the step)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import tiny_llama_config

from llmsched.core import ConfigError
from llmsched.core.engine_api import SamplingParams
from llmsched.engine.engine import LLMEngine
from llmsched.engine.replaying import replay

CFG = tiny_llama_config()


def _engine():
    return LLMEngine(CFG, scheduler="sarathi", b_max=64, max_num_seqs=8, num_blocks=64, block_size=16, num_threads=1)


@pytest.mark.parametrize("wall_step_s", [0.05, -0.05])
def test_a_stamp_30_ms_old_queues_30_ms_after_the_wall_clock_steps(monkeypatch, wall_step_s):
    eng = _engine()
    real_time, real_perf = time.time, time.perf_counter_ns
    # both clocks stand still while the request is added: its age is exactly 30 ms
    wall, perf = real_time() + wall_step_s, real_perf()
    monkeypatch.setattr(time, "time", lambda: wall)
    monkeypatch.setattr(time, "perf_counter_ns", lambda: perf)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), arrival_time=wall - 0.030)
    assert eng.now() - eng.sequence("a").arrival == pytest.approx(0.030, abs=1e-6)
    # the clocks run again (the wall clock still stepped): the queue time the server's
    # request_queue_time_seconds observes holds those 30 ms
    monkeypatch.setattr(time, "time", lambda: real_time() + wall_step_s)
    monkeypatch.setattr(time, "perf_counter_ns", real_perf)
    done = [o for _ in range(4) for o in eng.step() if o.finished]
    arrival, scheduled, first, end = done[0].timings
    assert scheduled - arrival >= 0.030 - 1e-6
    assert first - arrival >= 0.030 - 1e-6


def test_arrival_time_must_be_finite():
    eng = _engine()
    for bad in (float("nan"), float("-inf"), "1.0"):
        with pytest.raises(ConfigError, match="arrival_time"):
            eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=bad)


def test_replay_stamps_arrivals_on_the_engine_clock(monkeypatch):
    """replay passes engine-clock arrivals (it went through the wall clock's start value):
    its TTFTs are measured from the trace's arrivals whatever the wall clock does."""
    eng = _engine()
    monkeypatch.setattr(time, "time", lambda: 0.0)  # a wall clock far off
    trace = type("T", (), {})()
    trace.arrival_s = np.array([0.0, 0.001, 0.002])
    trace.prompt = np.array([4, 5, 6])
    trace.output = np.array([2, 2, 2])
    arrivals = []
    add = eng.add_request

    def recording_add(rid, *args, **kw):
        add(rid, *args, **kw)
        arrivals.append(eng.sequence(rid).arrival)

    monkeypatch.setattr(eng, "add_request", recording_add)
    res = replay(eng, trace, start_delay_s=0.01)
    assert (res["ttft"] > 0).all()
    # each is stamped with its own arrival in the trace, however late the loop added it
    assert np.allclose(np.diff(arrivals), np.diff(trace.arrival_s), atol=1e-6, rtol=0)
