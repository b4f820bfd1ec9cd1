"""The layering the README states, enforced: every import of a llmsched module (at the top
of a file or inside a function) points to a lower layer or stays inside its own package,
and packages form no import cycle."""

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "llmsched"

# lowest first; a package may import only packages of lower layers
LAYERS = [
    {"core"},
    {"policies", "workload"},
    {"theory"},
    {"runtime"},
    {"sim", "engine"},
    {"api"},
    {"analysis", "plots"},
    {"server"},
    {"cli"},
    {"__main__", "__init__"},  # the package's front door: `import llmsched`, `python -m llmsched`
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def _unit(module: str) -> str:
    """llmsched.sim.virtual -> sim; llmsched -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports():
    """(importing unit, imported unit, file, line) for every llmsched import."""
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module[: -len(".__init__")] if module.endswith(".__init__") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if node.module:
                    targets = [target]
                else:  # `from .. import x`: x is a module or a name of the package
                    targets = [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target == "llmsched" or target.startswith("llmsched."):
                    unit = _unit(target)
                    if unit.startswith("__") and unit != "__main__":
                        unit = "__init__"  # llmsched.__version__ and the like
                    yield _unit(module), unit, path.relative_to(SRC.parent), node.lineno


def test_every_package_has_a_layer():
    units = {_unit(".".join(p.relative_to(SRC.parent).with_suffix("").parts)) for p in SRC.rglob("*.py")}
    assert units <= set(LEVEL), f"packages without a layer: {sorted(units - set(LEVEL))}"


def test_imports_point_down():
    upward = [
        f"{path}:{line}: {src} imports {dst}"
        for src, dst, path, line in _imports()
        if src != dst and LEVEL[dst] >= LEVEL[src]
    ]
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_no_package_cycles():
    graph = defaultdict(set)
    for src, dst, _, _ in _imports():
        if src != dst:
            graph[src].add(dst)
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [])


def test_the_admission_names_other_layers_use_are_the_registrys():
    from llmsched.core.names import ADMISSION_ALIASES, ADMISSION_NAMES
    from llmsched.policies import ADMISSION_POLICIES

    # the built-in ones (a test may register more after them)
    assert tuple(ADMISSION_POLICIES)[: len(ADMISSION_NAMES)] == ADMISSION_NAMES
    assert set(ADMISSION_ALIASES.values()) <= set(ADMISSION_NAMES)
