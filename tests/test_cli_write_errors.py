"""An OSError while a command saves its results (a full disk, a file size limit, a folder
where an output file goes) ended in a Python traceback and exit code 1, often after a
long run. It is one line naming the file and the reason, exit code 2, and the run's
folder keeps its incomplete-mark (it must not look like a finished run)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from helpers import one_line_error

from llmsched.cli import main
from llmsched.core.paths import INCOMPLETE_MARK

RUN = ["simulate", "--cost-model", "const:1", "--rate", "5", "--quiet"]


def test_a_folder_where_an_output_file_goes_is_one_line(tmp_path, capsys):
    out = tmp_path / "q"
    assert main([*RUN, "--num-requests", "30", "--out", str(out)]) == 0
    (out / "requests.csv").unlink()
    (out / "requests.csv" / "x").mkdir(parents=True)
    capsys.readouterr()
    line = one_line_error(capsys, [*RUN, "--num-requests", "30", "--out", str(out)], "Is a directory")
    assert f"cannot write {out / 'requests.csv'}:" in line
    assert (out / INCOMPLETE_MARK).exists() and not (out / "summary.json").exists()


def test_a_file_size_limit_is_one_line_and_the_folder_stays_marked(tmp_path):
    """As `(ulimit -f 200; llmsched simulate --num-requests 5000 --out fz)`: Python ignores
    SIGXFSZ, so the write past the limit raises EFBIG rather than killing the process."""
    out = tmp_path / "fz"
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "from llmsched.cli import main\n"
        f"sys.exit(main({[*RUN, '--num-requests', '2000', '--out', str(out)]!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "llmsched simulate: error: cannot write: File too large", p.stderr
    assert (out / INCOMPLETE_MARK).exists() and not (out / "summary.json").exists()


def test_os_error_line_says_write_only_for_writes():
    """A read that fails (EACCES, EISDIR, EIO) must not be reported as a write."""
    from llmsched.cli import os_error_line  # noqa: PLC0415

    assert os_error_line(OSError(errno.EACCES, "Permission denied", "t.csv")) == "t.csv: Permission denied"
    assert os_error_line(OSError(errno.EIO, "Input/output error")) == "Input/output error"
    assert os_error_line(OSError(errno.ENOSPC, "No space left on device")) == "cannot write: No space left on device"
    assert os_error_line(OSError(errno.EFBIG, "File too large", Path("a/b"))) == "cannot write a/b: File too large"
    renamed = OSError(errno.EISDIR, "Is a directory", "d/.x.tmp", None, "d/x.csv")
    assert os_error_line(renamed) == "cannot write d/x.csv: Is a directory"
    assert os_error_line(OSError("Error writing bytes to file")) == "Error writing bytes to file"


def test_an_internal_missing_file_keeps_its_traceback(monkeypatch):
    """What the machine or the user's files did is one line (exit 2); a file of llmsched's
    own package missing is an internal failure, and keeps its traceback, as any other."""
    import pytest

    import llmsched
    import llmsched.cli.simulate as sim_cli

    packaged = Path(llmsched.__file__).parent / "data" / "profiles" / "no-such-table.csv"

    def broken(args):
        open(packaged)  # noqa: SIM115

    monkeypatch.setattr(sim_cli, "cmd_schedulers", broken)  # (the parser is built by main)
    with pytest.raises(FileNotFoundError):
        main(["schedulers"])


def test_a_parquet_write_error_is_one_line():
    """pyarrow's OSError has no errno, only its text: "[errno 27] File too large"."""
    from llmsched.cli import _from_the_machine, os_error_line  # noqa: PLC0415

    e = OSError("Error writing bytes to file. Detail: [errno 27] File too large")
    assert _from_the_machine(e)
    assert os_error_line(e).startswith("cannot write: Error writing bytes")

    # a user's folder removed during a run, a closed stdout: one line; a packaged file: not
    assert _from_the_machine(OSError(errno.ENOENT, "No such file or directory", "sw/points/.x.tmp"))
    assert _from_the_machine(OSError(errno.EBADF, "Bad file descriptor"))
    import llmsched  # noqa: PLC0415

    ours = str(Path(llmsched.__file__).parent / "data" / "x.csv")
    assert not _from_the_machine(OSError(errno.ENOENT, "No such file or directory", ours))
