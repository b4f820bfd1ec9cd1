"""A value given twice in a network or TWP experiment's list ran its cells twice (duplicate
rows, counted twice in the summaries); `sweep --grid` and the other experiments' lists
refuse a repeat. Now one ConfigError naming the list and the value, before any run or
folder. (The runs are tiny, so that the old code, which ran them, fails fast.)"""

import pytest

from llmsched.analysis import reproduce_networks as nets
from llmsched.analysis.reproduce_twp import reproduce_twp
from llmsched.core.errors import ConfigError

CLUSTER = dict(quick=True, replicas=[2], routers=["random"], loads=[0.5], num_jobs=30, workers=1)
AGENTS = dict(quick=True, workflows=["dag"], loads=[0.9], ft_loads=[0.9], num_jobs=30, workers=1)
RS = dict(quick=True, orders=["exit"], num_jobs=30, scan_loads=[], workers=1)
TWP = dict(
    quick=True,
    workloads=["azure"],
    schedulers=["twp"],
    loads=[0.3],
    num_requests=30,
    ablation=False,
    slo=False,
    stability=False,
    workers=1,
)
TWP_SLO = {**TWP, "slo": True, "slo_targets_ms": [15.0]}
TWP_STAB = {**TWP, "stability": True, "stability_requests": 30, "stability_loads": [0.5]}


@pytest.mark.parametrize(
    "fn, base, key, twice, said",
    [
        (nets.reproduce_clusters, CLUSTER, "replicas", [2, 2.0], "replicas: 2 is given twice"),
        (nets.reproduce_clusters, CLUSTER, "routers", ["random", "random"], "routers: 'random' is given twice"),
        (nets.reproduce_clusters, CLUSTER, "loads", [0.5, 0.5], "loads: 0.5 is given twice"),
        (nets.reproduce_agents, AGENTS, "workflows", ["dag", "dag"], "workflows: 'dag' is given twice"),
        (nets.reproduce_rybko_stolyar, RS, "orders", ["exit", "exit"], "orders: 'exit' is given twice"),
        (nets.reproduce_rybko_stolyar, RS, "scan_loads", [0.5, 0.5], "scan_loads: 0.5 is given twice"),
        (reproduce_twp, TWP_SLO, "slo_targets_ms", [15, 15.0], "slo_targets_ms: 15.0 is given twice"),
        (reproduce_twp, TWP_STAB, "stability_loads", [0.5, 0.5], "stability_loads: 0.5 is given twice"),
    ],
)
def test_a_repeated_value_is_refused(tmp_path, fn, base, key, twice, said):
    out = tmp_path / "r"
    with pytest.raises(ConfigError) as e:
        fn(out_dir=out, **{**base, key: twice})
    assert said in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


def test_agents_load_lists_refuse_a_repeat(tmp_path):
    """(The agents' lists were made sets, so a repeat ran once there: refused all the same,
    as everywhere else, not read one way here and another there.)"""
    for key in ("loads", "ft_loads"):
        with pytest.raises(ConfigError, match=f"{key}: 0.3 is given twice"):
            nets.reproduce_agents(out_dir=tmp_path / "r", **{**AGENTS, key: [0.3, 0.3]})
