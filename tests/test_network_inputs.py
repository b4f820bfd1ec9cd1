"""Network runs: the workload a network's calls draw, the inputs `simulate_network` refuses,
runs stopped by `max_time_s`, back-pressure with routers, and the files' consistency."""

from __future__ import annotations

import numpy as np
from helpers import TRACES

from llmsched.sim.network import run_network
from llmsched.workload import WorkloadSpec, make_trace
from llmsched.workload.network import NetworkSpec

ARXIV = TRACES / "arxiv_lengths" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"


def _a(col):
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)


def _cluster(prompt: str, output: str, num_jobs: int, **server) -> NetworkSpec:
    srv = {"policy": "sarathi", "b_max": 512, "cost_model": "paper", "replicas": 2, "router": "jsq", **server}
    return NetworkSpec.from_dict(
        {
            "servers": {"s": srv},
            "jobs": {
                "A": {
                    "arrival": {"process": "poisson", "rate": 0.5},
                    "route": [{"call": {"server": "s", "prompt": prompt, "output": output}}],
                }
            },
            "num_jobs": num_jobs,
        }
    )


def test_a_call_on_one_dataset_draws_prompt_and_output_from_the_same_row():
    # the README: prompt and output are "sampled jointly when prompt and output come from the
    # same file"; a network's calls drew them independently (22 of 2,000 pairs existed)
    rows = np.loadtxt(ARXIV, delimiter=",", skiprows=1, usecols=(0, 1))
    prompts, outputs = np.maximum(rows[:, 0], 1).astype(int), np.maximum(rows[:, 1], 1).astype(int)
    pairs = set(zip(prompts.tolist(), outputs.tolist()))
    st = run_network(_cluster("arxiv", "arxiv", 3000))
    p, o = _a(st.call_prompt), _a(st.call_output)
    assert len(p) == 3000
    assert all(pair in pairs for pair in zip(p.tolist(), o.tolist()))
    one = make_trace(WorkloadSpec(arrival="poisson", rate=1, num_requests=3000, prompt="arxiv", output="arxiv"))
    file_corr = np.corrcoef(prompts, outputs)[0, 1]  # about -0.46
    one_corr = np.corrcoef(one.prompt, one.output)[0, 1]
    net_corr = np.corrcoef(p, o)[0, 1]
    assert file_corr < -0.3 and one_corr < -0.3 and net_corr < -0.3
    assert abs(net_corr - file_corr) < 0.1
