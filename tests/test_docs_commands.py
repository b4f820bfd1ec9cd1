"""Every `llmsched ...` command shown in README.md and docs/*.md parses with today's command
line, and the simulate and capacity ones run (with small sizes), so the documentation
cannot silently drift from the code."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from llmsched.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands():
    """(file, command line) for every llmsched command in a fenced code block."""
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
                if code.startswith("llmsched ") and "..." not in code and "|" not in code and " [-" not in code:
                    out.append((doc.name, code))
    return out


def _shell_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks in shell (or no) language."""
    blocks, inside, lang, body = [], False, "", []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if inside:
                if lang in ("", "bash", "sh", "console", "shell"):
                    blocks.append("\n".join(body))
                inside, body = False, []
            else:
                inside, lang = True, line.strip()[3:].strip()
        elif inside:
            body.append(line)
    return blocks


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert any(c.startswith("llmsched simulate --network") for _, c in COMMANDS)


@pytest.mark.parametrize("doc,command", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_documented_command_parses(doc, command):
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:  # argparse's way of refusing a command
        pytest.fail(f"{doc}: `{command}` is refused by the command line (exit {e.code})")


RUNNABLE = [
    (d, c)
    for d, c in COMMANDS
    if c.split()[1] in ("simulate", "capacity")
    and "--find-counterexample" not in c
    and "/tmp/tiny" not in c
    and "profile:/" not in c
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
