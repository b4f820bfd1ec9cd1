"""The `llmsched` command line: one parser, one vocabulary (`cli.common`), and a module
per family of commands; each command is a thin wrapper over a Python function.

Every user error ends as one line on stderr and exit code 2. Commands that need an
optional extra (torch, FastAPI) import it only when they run.
"""

from __future__ import annotations

import errno
import gc
import os
import re
import sys
import warnings
from collections.abc import Sequence

from ..core.errors import ConfigError, InputWarning, Terminated
from ..core.paths import FINISHED_FOLDERS
from ..core.version import __version__
from . import analysis, engine, server, simulate
from .common import Parser

COMMAND_MODULES = (simulate, analysis, engine, server)


def build_parser(command: str | None = None) -> Parser:
    """The parser of every command; given a `command`, of only the commands its module
    defines. A run parses one command, and building the others' three hundred options
    costs start-up time. Any other `command` (none, a typo, --help) gets every command."""
    parser = Parser(
        prog="llmsched", description="Simulate, analyse and serve LLM inference under token-level batch schedulers."
    )
    # -V as well, as python's and most CLIs' (it was refused as a missing COMMAND)
    parser.add_argument("-V", "--version", action="version", version=f"llmsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for module in [m for m in COMMAND_MODULES if command in m.COMMANDS] or COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv`, or with none the process's own command line (the
    `llmsched` script, `python -m llmsched`), which then ends with the command."""
    if argv is None:
        try:
            return _main(sys.argv[1:])
        finally:
            # the process exits next: exempt its objects from the full collections that
            # interpreter shutdown runs (measured: 30 ms of a 1,000-request simulate)
            gc.freeze()
    return _main(list(argv))


def _main(argv: list[str]) -> int:
    # the top-level parser has no option that takes a value: a command comes first
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    FINISHED_FOLDERS.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", InputWarning)  # shown on every run, not once per process
            default_show = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                # what the library warns a user about (rows a trace reader dropped, an
                # implausible input: InputWarning): one line
                if issubclass(category, UserWarning):
                    print(f"llmsched {args.command}: warning: {message}", file=sys.stderr)
                else:
                    default_show(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"llmsched {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"llmsched: terminated{_files_complete(args)}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"llmsched: interrupted{_files_complete(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `llmsched simulate --json | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            # (Python 3.11's Path.exists() and is_dir() raise it instead of answering False)
            name = str(e.filename or "")
            shown = name if len(name) <= 80 else f"{name[:40]}...{name[-20:]} ({len(name)} characters)"
            print(f"llmsched {args.command}: error: file name too long: {shown!r}", file=sys.stderr)
            return 2
        if not _from_the_machine(e):
            raise  # (a file of our own package: an internal failure, as below)
        # a full disk, a file size limit, a folder where an output file goes: a traceback
        # (exit 1) told the user nothing more, often after a long run. A run's folder keeps
        # its incomplete-mark, so that it is never taken for a finished run
        print(f"llmsched {args.command}: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # an internal failure: still one line, and a non-zero code
        from ..sim.server import SimulationStuck  # noqa: PLC0415 - numpy only when needed

        if isinstance(e, SimulationStuck):
            print(f"llmsched {args.command}: error: {e}", file=sys.stderr)
            return 1
        raise


def _files_complete(args) -> str:
    """What an interruption says when it came after the command's last file was written
    (while it printed its summary): its folder is complete, no rerun needed. The exit
    code stays 130 (143): the command was stopped, and so are the shell's loops and
    scripts that ran it, and a --json summary on stdout may be cut short."""
    out = getattr(args, "out", None)
    if not out or os.path.realpath(out) not in FINISHED_FOLDERS:
        return ""
    return f" after writing its files: {out} is complete"


# errors only a write gets (a read of the same file may get EACCES or EISDIR, so those
# are shown without saying which it was)
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (llmsched/)


def _errno_of(e: OSError) -> int | None:
    """`e`'s errno, or the one its text names (pyarrow's OSError: "... [errno 27] File too large")."""
    if e.errno is not None:
        return e.errno
    m = re.search(r"\berrno (\d+)", str(e), re.IGNORECASE)
    return int(m.group(1)) if m else None


def _from_the_machine(e: OSError) -> bool:
    """Whether `e` is the machine's or the user's files' doing (a full disk, a size limit,
    permissions, a folder where a file goes or removed during the run, a closed stdout),
    shown as one line: any OSError but one about a file of llmsched's own package (a
    packaged table missing: an internal failure, which keeps its traceback)."""
    for name in (e.filename, e.filename2):
        if name is None or not isinstance(name, (str, bytes, os.PathLike)):
            continue
        path = os.path.abspath(os.fsdecode(name))
        if os.path.commonpath([path, _PACKAGE]) == _PACKAGE:
            return False
    return True


def os_error_line(e: OSError) -> str:
    """One line for an OSError that reached the command: the file it names (a rename's
    destination: written) and the reason."""
    reason = e.strerror or str(e) or type(e).__name__
    if e.filename2 is not None:  # (os.replace and os.rename: a file written in its place)
        return f"cannot write {os.fsdecode(e.filename2)}: {reason}"
    name = None if e.filename is None else os.fsdecode(e.filename) if isinstance(e.filename, bytes) else str(e.filename)
    if _errno_of(e) in _WRITE_ERRNOS:
        return f"cannot write {name}: {reason}" if name else f"cannot write: {reason}"
    return f"{name}: {reason}" if name else reason


__all__ = ["main", "build_parser", "os_error_line"]
