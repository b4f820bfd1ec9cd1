"""Argument checks and child runs shared by the benchmark scripts: bad input gives one line
on stderr and exit code 2, as `llmsched` itself does, never a traceback."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from llmsched.cli.common import positive_int  # noqa: F401 (the scripts' counts, as llmsched's)
from llmsched.cli.engine import seed_int  # noqa: F401 (the scripts' seeds, as llmsched's)
from llmsched.core.errors import ConfigError
from llmsched.core.paths import atomic_write, check_out_dir, check_out_file


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):  # `not >` also refuses nan
        raise argparse.ArgumentTypeError(f"{text} must be a positive finite number")
    return v


def out_file(text: str) -> str:
    """An argparse type: a file the script writes when its runs end (--json, --out), checked
    before them (llmsched's own check) so that a path that cannot be written is refused
    up front, not after the runs with their results lost."""
    return _writable(text, make_parents=False)


def out_file_in_new_folder(text: str) -> str:
    """`out_file` for a script that makes the file's missing folders."""
    return _writable(text, make_parents=True)


def _writable(text: str, *, make_parents: bool) -> str:
    try:
        check_out_file(text, make_parents=make_parents)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def out_dir(text: str) -> str:
    """An argparse type: a folder the script writes into (made if missing), checked up
    front (llmsched's own check): a file in its place or above it, or a folder that cannot
    be made, is refused before the runs, not by a traceback during or after them."""
    try:
        check_out_dir(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def write_json(path, obj, **dumps_kw) -> None:
    """`obj` as JSON (`json.dumps(obj, **dumps_kw)`) at `path`, its folder made if missing;
    whole or not at all (`atomic_write`): a script stopped while writing leaves the earlier
    file as it was, never a truncated one."""
    text = json.dumps(obj, **dumps_kw) + "\n"
    Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(text))


def comma_list(item):
    """An argparse type: comma-separated values, each read by the argparse type `item`
    (`2,4,8` -> [2, 4, 8]); an empty one (`2,,8`) is refused."""

    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if "" in parts:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        return [item(p) for p in parts]

    return parse


def fail(prog: str, message: str, code: int = 2):
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(code)


@contextmanager
def config_errors(prog: str):
    """Runs the block; llmsched refusing an input there (a ConfigError, also one raised in a
    worker process and passed back) ends the script with its message and exit 2."""
    try:
        yield
    except ConfigError as e:
        fail(prog, str(e))


def run_child(cmd: list[str], prog: str, **kw) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True)`; when the child fails, its last
    stderr line (the exception's own message) and exit 2, not CalledProcessError, which
    would hide why."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        last = lines[-1] if lines else f"child exited with code {proc.returncode}"
        # a ConfigError's message is meant for the user as it is (what `llmsched` prints)
        for prefix in (f"{prog}: ", "llmsched.core.errors.ConfigError: "):
            last = last.removeprefix(prefix)
        fail(prog, last)
    return proc
