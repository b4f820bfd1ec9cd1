"""Lazy package exports stay the exported function whichever is imported first: `serve`
lives in `llmsched.server.serving` and `replay` in `llmsched.engine.replaying` (when the
submodules shared the names, importing one rebound the package attribute to the module:
`from llmsched.server import serve` gave a module)."""

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
        "import {pkg}.{mod}\nimport {pkg} as P\nfrom {pkg} import {name} as f\n"
        "assert callable(P.{name}) and f is P.{name}"
    ),
    "names from the submodule": "from {pkg} import {name} as f\nfrom {pkg}.{mod} import {name} as g\nassert f is g",
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize(
    ("pkg", "name", "mod"), [("llmsched.server", "serve", "serving"), ("llmsched.engine", "replay", "replaying")]
)
def test_an_export_is_the_function_whatever_is_imported_first(pkg, name, mod, order):
    code = ORDERS[order].format(pkg=pkg, name=name, mod=mod) + "\nimport types\n"
    code += f"import {pkg} as P\nassert not isinstance(P.{name}, types.ModuleType)\n"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_an_export_named_like_its_submodule_is_refused():
    from llmsched.core.lazy import lazy_getattr

    with pytest.raises(ValueError, match="'serve' is also the name of its submodule"):
        lazy_getattr("llmsched.server", {"serve": "serve"})
