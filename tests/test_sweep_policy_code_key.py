"""A resumed sweep keys a custom policy by its code: the key hashed the source of the
registered object alone, so editing the class a factory builds, or a base class of the
registered one, reused the old results ("0 simulated, 1 already done")."""

from __future__ import annotations

import importlib
import sys

import pytest

from llmsched.analysis import run_sweep
from llmsched.policies import ADMISSION_POLICIES, BATCH_POLICIES

RUN = dict(cost_model="paper", prompt="const:100", output="const:400", num_requests=60, rate=4)

FACTORY = """
from llmsched.policies import AdmissionPolicy, register_admission_policy

class OutCap(AdmissionPolicy):
    name = "outcap-edited"

    def __init__(self, limit=3000):
        self.limit = int(limit)

    def may_admit(self, state, r, planner):
        return state.outstanding_tokens + planner.admitted_tokens < FACTOR * self.limit

def make_outcap(limit=3000):
    return OutCap(limit)

register_admission_policy("outcap-edited", make_outcap)
"""

BASE_CLASS = """
from llmsched.policies import BatchPolicy, register_batch_policy

class Base(BatchPolicy):
    def build(self, p):
        p.take_decodes()
        p.take_running_prefills(whole=WHOLE)
        p.admit_waiting(whole=WHOLE)
        return p.plan()

@register_batch_policy
class Derived(Base):
    name = "derived-edited"
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a policy module into tmp_path and import it; call again to rewrite and reload
    it, as a user edits their file between two runs."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # (a reload reads the new text)
    batch, admission = dict(BATCH_POLICIES), dict(ADMISSION_POLICIES)
    name = f"user_policy_{tmp_path.name.replace('-', '_')}"

    def write(text):
        (tmp_path / f"{name}.py").write_text(text)
        importlib.invalidate_caches()
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        return importlib.import_module(name)

    yield write
    sys.modules.pop(name, None)
    for table, saved in ((BATCH_POLICIES, batch), (ADMISSION_POLICIES, admission)):
        table.clear()
        table.update(saved)


def _sweep(out, **kw):
    return run_sweep(None, {"seed": [0]}, workers=1, progress=False, plots=False, out_dir=out, **RUN, **kw)


def _metrics(res):
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in res.rows]


def test_editing_the_class_a_factory_builds_reruns_the_point(user_module, tmp_path):
    kw = dict(policy="sarathi", admission="outcap-edited")
    user_module(FACTORY.replace("FACTOR", "100"))
    first = _sweep(tmp_path / "sw", **kw)
    assert (first.ran, first.skipped) == (1, 0)
    assert _sweep(tmp_path / "sw", **kw).skipped == 1  # the same code: resumed
    user_module(FACTORY.replace("FACTOR", "1"))  # only OutCap.may_admit changes
    again = _sweep(tmp_path / "sw", **kw)
    assert (again.ran, again.skipped) == (1, 0)
    assert _metrics(again) != _metrics(first)


def test_editing_a_user_base_class_reruns_the_point(user_module, tmp_path):
    user_module(BASE_CLASS.replace("WHOLE", "True"))
    first = _sweep(tmp_path / "sw", policy="derived-edited")
    assert (first.ran, first.skipped) == (1, 0)
    user_module(BASE_CLASS.replace("WHOLE", "False"))  # Derived's own text is unchanged
    again = _sweep(tmp_path / "sw", policy="derived-edited")
    assert (again.ran, again.skipped) == (1, 0)
    assert _metrics(again) != _metrics(first)


def test_built_in_policies_keep_their_keys():
    """No code enters a built-in policy's key: a resumed sweep of built-ins reuses the
    points stored before the code was keyed."""
    from llmsched.analysis.points import policy_code

    assert policy_code({"policy": "sarathi", "admission": "fcfs"}) == {}
    assert policy_code({"policy": "SARATHI:chunk=256", "admission": "fcfs"}) == {}


SCRIPT = """
import sys
from llmsched.analysis import run_sweep
from llmsched.policies import AdmissionPolicy, register_admission_policy

class Capped(AdmissionPolicy):
    name = "capped-in-script"

    def may_admit(self, state, r, planner):
        return state.outstanding_tokens + planner.admitted_tokens < 3000

register_admission_policy("capped-in-script", Capped)
SEEDS = {seeds}
res = run_sweep(None, {{"seed": SEEDS}}, out_dir=sys.argv[1], workers=1, progress=False, plots=False,
                admission="capped-in-script", cost_model="paper", prompt="const:100", output="const:40",
                num_requests=30, rate=4)
print(res.ran, res.skipped)
"""


def test_a_policy_in_the_sweep_script_keeps_its_points_when_the_grid_grows(tmp_path):
    """Keyed by its module's whole file, a policy written in the script that runs the
    sweep changed key with the script's grid: a grid grown by one seed reran every
    finished point (3 simulated, not 1). The script's own objects are keyed by their source."""
    import os
    import subprocess

    script = tmp_path / "sweep_script.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def run(seeds, body=SCRIPT):
        script.write_text(body.format(seeds=seeds))
        p = subprocess.run([sys.executable, str(script), str(tmp_path / "sw")], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        return tuple(int(x) for x in p.stdout.split())

    assert run([0, 1]) == (2, 0)
    assert run([0, 1, 2]) == (1, 2)  # (the grown grid: only its new point)
    # an edit of the policy itself still reruns its points
    assert run([0, 1, 2], SCRIPT.replace("< 3000", "< 6000")) == (3, 0)
