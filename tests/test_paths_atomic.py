"""`atomic_write` writes through a symbolic link and into a FIFO (a device such as
/dev/stdout likewise) instead of replacing them with a regular file (but with
`replace_entry`, for a file whose name is llmsched's alone)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from llmsched.cli import os_error_line
from llmsched.core.paths import atomic_write
from llmsched.server.bench import write_result


def _text(payload: str):
    def write(tmp) -> None:
        with open(tmp, "w") as f:
            f.write(payload)

    return write


def test_write_through_symlink_keeps_link(tmp_path):
    target = tmp_path / "target.json"
    target.write_text('{"old": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_result(str(link), {"new": 2}, append=False)
    assert link.is_symlink()
    assert json.loads(target.read_text()) == {"new": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_append_through_symlink(tmp_path):
    target = tmp_path / "sub" / "target.json"
    target.parent.mkdir()
    target.write_text('{"a": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_result(str(link), {"b": 2}, append=True)
    assert link.is_symlink()
    assert [json.loads(x) for x in target.read_text().splitlines()] == [{"a": 1}, {"b": 2}]
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_link_to_nothing_makes_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    atomic_write(link, _text("x"))
    assert link.is_symlink() and (tmp_path / "new.json").read_text() == "x"


def test_stopped_write_through_link_keeps_target(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)

    def fail(tmp) -> None:
        with open(tmp, "w") as f:
            f.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(link, fail)
    assert link.is_symlink() and target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_write_into_fifo(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    write_result(str(fifo), {"x": 1}, append=False)
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert json.loads(got[0]) == {"x": 1}
    assert not fifo.is_file() and fifo.exists()  # still a FIFO
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo"]


def test_replace_entry_replaces_what_is_at_the_name_itself(tmp_path):
    """For a file whose name is llmsched's alone (a sweep's points/KEY.json): a link, a hard
    link or a FIFO there is replaced by the new file, the file it shared untouched."""
    other = tmp_path / "other.json"
    other.write_text("other's")
    link, hard = tmp_path / "link.json", tmp_path / "hard.json"
    link.symlink_to(other)
    os.link(other, hard)
    for path in (link, hard):
        atomic_write(path, _text("new"), replace_entry=True)
        assert not path.is_symlink() and path.read_text() == "new"
    assert other.read_text() == "other's" and os.stat(other).st_nlink == 1
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)
        atomic_write(fifo, _text("new"), replace_entry=True)  # (written into, it waited for a reader)
        assert fifo.is_file() and fifo.read_text() == "new"
    names = {"hard.json", "link.json", "other.json"} | ({"fifo.json"} if hasattr(os, "mkfifo") else set())
    assert {p.name for p in tmp_path.iterdir()} == names  # (no temporary file left)


def test_a_failed_write_names_the_file_asked_for(tmp_path):
    """The error named the temporary file, which the failure had already removed."""
    import errno

    def full_disk(tmp):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    target = tmp_path / "summary.json"
    with pytest.raises(OSError) as e:
        atomic_write(target, full_disk)
    assert e.value.filename == str(target)
    assert os_error_line(e.value) == f"cannot write {target}: No space left on device"
    assert list(tmp_path.iterdir()) == []
