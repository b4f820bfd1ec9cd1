"""`reproduce stability --quick` is smaller than the full run for every workload: its
queue runs were 10,000 requests whatever the workload, more than ShareGPT's and Azure's
full 8,000."""

from __future__ import annotations

import pytest

from llmsched.analysis.reproduce import SIZES, reproduce_stability


@pytest.mark.parametrize("workload", ["synthetic", "sharegpt", "azure"])
def test_quick_runs_are_smaller_than_full_ones(tmp_path, workload):
    full_queue, full_search, *_ = SIZES[workload]
    meta = reproduce_stability(
        workload, quick=True, search=False, policies=["sarathi"], num_requests=None, out_dir=tmp_path / "q", workers=1
    )["config"]
    assert meta["queue_requests"] == full_queue // 2
    assert meta["search_requests"] < full_search
