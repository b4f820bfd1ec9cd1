"""Every ```python block of README.md and docs/*.md runs, as written, in a fresh Python in a
temporary folder of its own (side by side, one per core), so the documented Python API
cannot silently drift from the code (the commands are tests/test_docs_commands.py's).

What the test changes in a block, and only that:
- `/tmp/tiny` becomes a tiny model folder made here by llmsched's own builder (the docs
  make it with `llmsched make-tiny-model /tmp/tiny`); nothing is downloaded;
- a block too slow for a test runs its smaller variant, given in SMALLER below and stated
  in the doc itself beside the block;
- a block that lists signatures (`name(params) -> type`, not runnable) is compared with the
  signatures of the functions it names, found in the modules the prose names before it.
The temporary folder links the checkout's `examples/`, which the blocks read by relative
path, as a reader in the repository root does; what the blocks write stays there."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The smaller variants of blocks too slow for a test: (doc, text in a block, what replaces
# it, the arguments that make it smaller, which the doc must state).
TWP_SMALL = (
    'quick=True, workloads=["azure"], schedulers=["fcfs", "twp"], loads=[0.6], num_requests=100,'
    " stability_requests=200, stability_loads=[0.5], slo_targets_ms=[15]"
)
SMALLER = [
    ("networks.md", "workers=2)", "workers=2, quick=True, num_jobs=50)", "quick=True, num_jobs=50"),
    ("serverless.md", 'small.yaml", ', 'small.yaml", num_requests=100, ', "num_requests=100"),
    ("stability.md", "num_requests=20000)", "num_requests=300)", "num_requests=300"),
    ("stability.md", "num_requests=10000)", "num_requests=300)", "num_requests=300"),
    ("twp.md", "workers=1)", f"workers=1, {TWP_SMALL})", TWP_SMALL),
]


def _blocks():
    """(doc, line, code, the 15 lines of prose before it) of every ```python block."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        lines = text.splitlines()
        for start, code in _python_blocks(lines):
            out.append((doc.name, start, code, "\n".join(lines[max(0, start - 15) : start - 1])))
    return out


def _python_blocks(lines: list[str]) -> list[tuple[int, str]]:
    """(line number of the fence, contents) of every fenced block whose language is python;
    the fences of other languages are paired too, so their contents are never read."""
    blocks, lang, start, body = [], None, 0, []
    for i, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            if lang is None:
                lang, start, body = line.strip()[3:].strip(), i, []
            else:
                if lang == "python":
                    blocks.append((start, "\n".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


BLOCKS = _blocks()


SIGNATURE = re.compile(r"^(\w+)\((.*?)\)\s*->\s*([\w\[\], |]+)$", re.M | re.S)


def _signatures(code: str):
    """[(name, params, return)] when the block lists signatures `name(params) -> type`,
    else None (a block of code)."""
    try:
        ast.parse(code)
        return None
    except SyntaxError:
        pass
    found = SIGNATURE.findall(code)
    return found if found and not SIGNATURE.sub("", code).strip() else None


def _check_signatures(doc: str, sigs, prose: str) -> None:
    modules = []
    for name in re.findall(r"`(llmsched(?:\.\w+)+)`", prose):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    for name, params, _ in sigs:
        real = next((getattr(m, name) for m in modules if hasattr(m, name)), None)
        assert real is not None, f"{doc}: `{name}` is in no module the prose names before it"
        ns: dict = {}
        exec(f"def {name}({params}): pass", ns)  # the documented signature, as Python reads it
        shown, actual = inspect.signature(ns[name]), inspect.signature(real)
        assert [(p.name, p.kind, p.default) for p in shown.parameters.values()] == [
            (p.name, p.kind, p.default) for p in actual.parameters.values()
        ], f"{doc}: {name}{shown} is documented, the code has {name}{actual}"


def _runnable(doc: str, code: str, tiny: Path | None) -> str:
    """The block as the test runs it: its smaller variant, the tiny model's folder."""
    for d, old, new, _ in SMALLER:
        if d == doc:
            code = code.replace(old, new)
    return code.replace("/tmp/tiny", str(tiny)) if tiny else code


def _run(code: str, folder: Path) -> subprocess.CompletedProcess:
    (folder / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def block_runs(request, tmp_path_factory):
    """The selected blocks' runs, started together (one per core at a time, so that the
    whole stays fast): (doc, line) -> (the code run, a future of its finished process)."""
    chosen = [
        item.callspec.params
        for item in request.session.items
        if item.path == Path(__file__) and getattr(item, "originalname", "") == "test_documented_python_runs"
    ]
    chosen = [p for p in chosen if _signatures(p["code"]) is None]
    tiny = None
    if any("/tmp/tiny" in p["code"] for p in chosen):
        from llmsched.engine import make_tiny_model

        tiny = make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        runs = {}
        for p in chosen:
            code = _runnable(p["doc"], p["code"], tiny)
            folder = tmp_path_factory.mktemp(f"{p['doc']}-{p['line']}")
            runs[p["doc"], p["line"]] = code, pool.submit(_run, code, folder)
        yield runs
        for _, future in runs.values():
            future.cancel()


def test_the_docs_show_python():
    assert len(BLOCKS) >= 12
    assert {d for d, *_ in BLOCKS} >= {
        "README.md",
        "engine.md",
        "networks.md",
        "serverless.md",
        "stability.md",
        "twp.md",
    }
    assert sum(_signatures(code) is not None for *_, code, _ in BLOCKS) >= 1


def test_smaller_variants_are_documented():
    for doc, old, _, stated in SMALLER:
        path = ROOT / "README.md" if doc == "README.md" else ROOT / "docs" / doc
        assert any(old in code for d, _, code, _ in BLOCKS if d == doc), f"{doc}: no block has {old!r}"
        prose = re.sub(r"```python\n.*?```", "", path.read_text(), flags=re.S)
        assert stated in prose, f"{doc}: the smaller variant ({stated}) is not stated outside its block"


@pytest.mark.parametrize("doc,line,code,prose", BLOCKS, ids=[f"{d}:{n}" for d, n, *_ in BLOCKS])
def test_documented_python_runs(doc, line, code, prose, block_runs):
    sigs = _signatures(code)
    if sigs is not None:
        _check_signatures(f"{doc}:{line}", sigs, prose)
        return
    ran, future = block_runs[doc, line]
    done = future.result()
    assert done.returncode == 0, f"{doc}:{line}: the block fails:\n{ran}\n{done.stderr[-3000:]}"


def test_engine_doc_names_every_llm_option():
    """docs/engine.md's paragraph on `LLM(...)` names every keyword the engine takes."""
    from llmsched.engine.engine import LLMEngine

    text = (ROOT / "docs" / "engine.md").read_text()
    para = text[text.index("`LLM(model, scheduler=") : text.index("`generate(prompts, params)`")]
    options = [k for k in inspect.signature(LLMEngine).parameters if k != "model"]
    missing = [k for k in options if f"`{k}`" not in para and f"{k}=" not in para]
    assert not missing, f"docs/engine.md does not name the LLM option(s) {missing}"


def test_twp_doc_names_every_resolved_value():
    """docs/twp.md lists what TWP's `describe()` records under `resolved`, all of it."""
    import llmsched

    r = llmsched.simulate(admission="twp", cost_model="paper", num_requests=50, rate=2, out_dir=None)
    text = (ROOT / "docs" / "twp.md").read_text()
    para = text[text.index("records the values\nactually used:") :][:400]
    missing = [k for k in r.config["scheduler"]["admission"]["resolved"] if f"`{k}`" not in para]
    assert not missing, f"docs/twp.md does not name TWP's resolved value(s) {missing}"
