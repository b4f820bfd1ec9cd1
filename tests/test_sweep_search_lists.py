"""`max_stable_rate`: the policies and seeds it searches, from its arguments or its grid."""

import json

import pytest

from llmsched.analysis.sweep import max_stable_rate
from llmsched.core.errors import ConfigError

# tiny, fast probes: paper model at b_max 128, short lengths, a coarse tolerance
FIXED = dict(cost_model="paper", b_max=128, prompt="geometric:40", output="geometric:21", num_requests=200)


def _stored(out_dir, key: str) -> set:
    recs = [json.loads(p.read_text()) for p in (out_dir / "points").glob("*.json")]
    return {r["config"][key] if key in r["config"] else r["config"]["workload"][key] for r in recs}


def test_the_grids_seeds_and_policies_are_searched(tmp_path):
    """grid={"seed": [1, 2]} searched seed 0 alone: the default seeds=(0,) replaced the
    grid's list (and a `policies` default would have replaced its policies)."""
    res = max_stable_rate(
        grid={"policy": ["orca", "sarathi"], "seed": [1, 2]}, out_dir=tmp_path, tol=0.4, workers=1, **FIXED
    )
    assert _stored(tmp_path, "seed") == {1, 2}
    assert _stored(tmp_path, "policy") == {"orca", "sarathi"}
    assert sorted(r["policy"] for r in res) == ["orca", "sarathi"]


def test_without_seeds_the_search_runs_seed_0(tmp_path):
    max_stable_rate(policies=["orca"], out_dir=tmp_path, tol=0.4, workers=1, **FIXED)
    assert _stored(tmp_path, "seed") == {0}


def test_without_seeds_the_search_runs_the_configurations_seed(tmp_path):
    """seeds=None put seed 0 in the grid, over a configuration's own seed 3, silently."""
    max_stable_rate(config={"workload": {"seed": 3}}, policies=["orca"], out_dir=tmp_path, tol=0.4, workers=1, **FIXED)
    assert _stored(tmp_path, "seed") == {3}


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(seeds=[0], grid={"seed": [1, 2]}), "seeds= and the grid's 'seed'"),
        (dict(policies=["vllm"], grid={"policy": ["orca"]}), "policies= and the grid's 'policy'"),
        (dict(seed=3), "give seeds=[...], not seed=3"),
    ],
)
def test_a_list_given_two_ways_or_a_single_seed_is_refused(tmp_path, kw, words):
    """`seed=3` was refused as clashing with "the grid's 'seed'" though no grid was given."""
    with pytest.raises(ConfigError, match=r"\A[^\n]*\Z") as e:
        max_stable_rate(out_dir=tmp_path / "s", tol=0.4, workers=1, **kw, **FIXED)
    assert words in str(e.value)
    assert not (tmp_path / "s").exists()
