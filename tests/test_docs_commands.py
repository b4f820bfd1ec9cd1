"""Every `llmsched ...` command shown in README.md and docs/*.md parses with today's command
line, and the simulate and capacity ones run (with small sizes), so the documentation
cannot silently drift from the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llmsched.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(synopses: bool = False):
    """(file, command line) for every llmsched command in a code block; with `synopses`, the
    synopses instead (lines with optional `[--flag ...]` parts), those parts left out."""
    out = []
    for doc in DOCS:
        for block in _shell_blocks(doc.read_text()):
            lines, cur = [], ""
            for raw in block.splitlines():
                line = raw.strip()
                if line.startswith("$ "):
                    line = line[2:]
                cur = f"{cur} {line}" if cur else line
                if cur.endswith("\\"):
                    cur = cur[:-1].rstrip()
                    continue
                lines.append(cur)
                cur = ""
            for line in lines:
                code = line.split(" #", 1)[0].strip()
                if not code.startswith("llmsched ") or "..." in code or "|" in code:
                    continue
                if (" [-" in code) == synopses:
                    out.append((doc.name, re.sub(r"\s*\[[^\]]*\]", "", code) if synopses else code))
    return out


def _shell_blocks(text: str) -> list[str]:
    """The contents of the code blocks in shell (or no) language: fenced ones, and indented
    ones (four spaces or more after a blank line, outside any fence), Markdown's two kinds."""
    blocks, inside, lang, body = [], False, "", []
    indented, blank_before = [], True
    for line in text.splitlines():
        if inside:
            if line.lstrip().startswith("```"):
                if lang in ("", "bash", "sh", "console", "shell"):
                    blocks.append("\n".join(body))
                inside, body = False, []
            else:
                body.append(line)
            blank_before = False
            continue
        if indented and (not line.strip() or line.startswith("    ")):
            indented.append(line)
            continue
        if indented:
            blocks.append("\n".join(indented))
            indented = []
        if line.lstrip().startswith("```"):
            inside, lang = True, line.strip()[3:].strip()
        elif blank_before and line.startswith("    ") and line.strip():
            indented = [line]
        blank_before = not line.strip()
    if indented:
        blocks.append("\n".join(indented))
    return blocks


COMMANDS = _commands()
SYNOPSES = _commands(synopses=True)


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert any(c.startswith("llmsched simulate --network") for _, c in COMMANDS)
    # docs/networks.md shows its commands in indented blocks
    shown = {c for d, c in COMMANDS if d == "networks.md"}
    assert "llmsched capacity --network examples/networks/disaggregated.yaml" in shown
    assert any("rybko_stolyar.yaml --scale 1.1" in c for c in shown)
    assert ("networks.md", "llmsched reproduce rybko-stolyar") in SYNOPSES


def test_code_blocks_are_read_fenced_and_indented():
    text = "\n".join(
        [
            "Text.",
            "    not code: no blank line before",
            "",
            "    llmsched a \\",
            "        --b",
            "",
            "    llmsched c",
            "Text again.",
            "```python",
            "llmsched no",
            "```",
            "```bash",
            "    llmsched d",
            "```",
            "",
            "- a list",
            "",
            "      llmsched e",
        ]
    )
    assert _shell_blocks(text) == [
        "    llmsched a \\\n        --b\n\n    llmsched c",
        "    llmsched d",
        "      llmsched e",
    ]


@pytest.mark.parametrize("doc,command", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_documented_command_parses(doc, command):
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:  # argparse's way of refusing a command
        pytest.fail(f"{doc}: `{command}` is refused by the command line (exit {e.code})")


@pytest.mark.parametrize("doc,command", SYNOPSES, ids=[f"{d}:{c[:60]}" for d, c in SYNOPSES])
def test_documented_synopsis_parses(doc, command):
    test_documented_command_parses(doc, command)


RUNNABLE = [
    (d, c)
    for d, c in COMMANDS
    if c.split()[1] in ("simulate", "capacity")
    and "--find-counterexample" not in c
    and "/tmp/tiny" not in c
    and "profile:/" not in c
    and "tr1000000.csv" not in c  # a trace the doc has the reader make first
]


@pytest.mark.parametrize("doc,command", RUNNABLE, ids=[f"{d}:{c[:60]}" for d, c in RUNNABLE])
def test_documented_simulate_and_capacity_commands_run(doc, command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    for i, a in enumerate(argv):  # write into a temporary folder, not the checkout
        if a in ("--out", "--plot") and i + 1 < len(argv):
            argv[i + 1] = str(tmp_path / Path(argv[i + 1]).name)
    if argv[0] == "simulate":
        argv += ["--num-requests", "300", "--quiet"]
        if "--out" not in argv and "--json" not in argv:
            argv += ["--out", str(tmp_path / "results")]
    assert main(argv) == 0, f"{doc}: `{command}` failed"
