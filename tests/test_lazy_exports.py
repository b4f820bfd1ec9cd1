"""Lazy package exports that share a name with their submodule (`llmsched.server.serve`,
`llmsched.engine.replay`) stay the exported function whichever is imported first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

ORDERS = {
    "attribute twice": "import {pkg} as P\nassert callable(P.{name}) and callable(P.{name})",
    "from-import twice": (
        "from {pkg} import {name} as a\nfrom {pkg} import {name} as b\nassert callable(a) and a is b"
    ),
    "submodule first": (
        "import {pkg}.{name}\nimport {pkg} as P\nfrom {pkg} import {name} as f\n"
        "assert callable(P.{name}) and f is P.{name}"
    ),
    "names from the submodule": (
        "from {pkg} import {name} as f\nfrom {pkg}.{name} import {name} as g\n"
        "import sys\nassert f is g and sys.modules['{pkg}.{name}'].{name} is f"
    ),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize(("pkg", "name"), [("llmsched.server", "serve"), ("llmsched.engine", "replay")])
def test_export_named_like_its_submodule_is_the_function(pkg, name, order):
    code = ORDERS[order].format(pkg=pkg, name=name) + "\nimport types\n"
    code += f"import {pkg} as P\nassert not isinstance(P.{name}, types.ModuleType)\n"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
