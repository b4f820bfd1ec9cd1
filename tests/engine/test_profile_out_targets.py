"""`profile --out` given a FIFO, a symbolic link or an empty path."""

from __future__ import annotations

import os
import threading

from llmsched.cli import main
from llmsched.engine.profiler import COLUMNS, write_profile

ROW = {"table": "linear", "model": "m", "mode": "", "tokens": 16}


def test_a_profile_is_written_into_a_fifo_not_over_it(tmp_path):
    """The profile was written to a temporary file renamed over the FIFO: the FIFO was
    gone, replaced by a plain file, and its reader got nothing."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    # a writer of our own keeps the reader's open from blocking, and ends its read when
    # closed, whether or not the profile reached the FIFO
    keep = os.open(fifo, os.O_RDWR)
    got, opened = [], threading.Event()

    def read():
        fd = os.open(fifo, os.O_RDONLY)
        opened.set()
        with os.fdopen(fd) as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(10)
    try:
        write_profile([ROW], fifo)
    finally:
        os.close(keep)
    reader.join(10)
    assert fifo.is_fifo()
    assert got and got[0].splitlines()[0] == ",".join(COLUMNS)


def test_a_profile_is_written_through_a_symbolic_link(tmp_path):
    """The link became a plain file holding the new profile; the profile it named was
    left as it was."""
    target = tmp_path / "target.csv"
    write_profile([], target)
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)
    write_profile([ROW], link)
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text().splitlines()[1].startswith("linear,m,")


def test_profile_out_empty_says_the_path_is_empty(capsys):
    """`--out ''` said "--out '' is a folder, not a file"."""
    rc = main(["profile", "--model", "m", "--out", ""])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "empty" in err and "is a folder" not in err
