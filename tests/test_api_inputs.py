"""The Python API's inputs: a cached trace, a replaced config, a Trace object with workload
options, a trace of the wrong type."""

from __future__ import annotations

import numpy as np

import llmsched
from llmsched.workload import load_trace, make_trace


def _csv(tmp_path, n=6):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.5},10,5\n" for i in range(n)))
    return p


def test_load_trace_gives_its_own_object_not_the_cache(tmp_path):
    p = _csv(tmp_path)
    t = load_trace(p)
    t.prompt = t.prompt * 100
    t.arrival_s = np.zeros(1)
    again = load_trace(p)
    assert again is not t and again.prompt.tolist() == [10] * 6
    assert make_trace({"trace": str(p)}).prompt.tolist() == [10] * 6
    r = llmsched.simulate(cost_model="paper", trace=str(p), verdict=False)
    assert r.prompt.tolist() == [10] * 6
