"""The simulator, the virtual GPU and the engine take the same steps and emit the same
tokens and texts as before the one-runtime refactor (fingerprints in
tests/data/golden/steps.json, made by tests/golden_steps.py at commit ed59e4c; the runs with
KV pressure, `simulator/*/kv` and `virtual/*`, remade when a step that preempts stopped
admitting waiting requests: their steps changed on purpose, the others did not; the
`simulator/*` runs remade again on 2026-12-02 when requests.csv's `tpot_s` began to round
the mean gap up to the ns: their steps and every other column are byte-identical, tpot_s
moved by at most 1 ns)."""

import json
from pathlib import Path

import golden_steps as g
import pytest

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden" / "steps.json").read_text())


@pytest.mark.parametrize("policy", g.POLICIES)
@pytest.mark.parametrize("kv", [None, 900])
def test_simulator_steps_unchanged(policy, kv):
    key = f"simulator/{policy}" + ("/kv" if kv else "")
    assert g._digest(g.simulator_steps(policy, kv)) == GOLDEN[key]


@pytest.mark.parametrize("policy", g.POLICIES)
def test_virtual_gpu_steps_unchanged(policy):
    assert g._digest(g.virtual_steps(policy)) == GOLDEN[f"virtual/{policy}"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return g.make_model(str(tmp_path_factory.mktemp("golden-model")))


@pytest.mark.parametrize("policy", g.POLICIES)
def test_engine_steps_unchanged(policy, tiny_model):
    assert g._digest(g.engine_steps(policy, tiny_model)) == GOLDEN[f"engine/{policy}"]
