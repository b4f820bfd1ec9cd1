"""Where a command writes: checked before it runs, so that a run is never lost to an
output path that cannot be written (a folder that is a file, a file that is a folder, a
read-only place)."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def _first_existing(p: Path) -> Path:
    """`p` or its nearest ancestor that exists."""
    p = p.absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _check_folder(given, folder: Path, what: str) -> None:
    """`folder` (or the place it will be made in) can hold new files."""
    base = _first_existing(folder)
    if not base.is_dir():
        if base == Path(given).absolute():
            raise ConfigError(f"{what} {str(given)!r} is a file, not a folder")
        raise ConfigError(f"{what} {str(given)!r}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(given)!r}: {base} is not writable")
    # os.access says yes to root everywhere (/sys, /proc): make and drop a file to be sure
    # (not tempfile: it imports shutil, a start-up cost of every run)
    probe = base / f".llmsched-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise ConfigError(f"{what} {str(given)!r}: cannot write in {base} ({e.strerror})") from None
    probe.unlink(missing_ok=True)


# a file only one kind of run writes at the top of its folder
RUN_MARKERS = (("network", "calls.csv"), ("serverless", "instances.csv"), ("single-server", "timeseries.csv"))


def run_kind(folder) -> str | None:
    """The kind of run whose outputs `folder` holds (network, serverless, single-server),
    or None."""
    for kind, marker in RUN_MARKERS:
        if (Path(folder) / marker).is_file():
            return kind
    return None


def recorded_path(path: str) -> str:
    """`path` as a run's config.json records it: absolute when it names an existing file
    or folder (a relative path is read from where the command runs, so a rerun from
    another folder would not find it), as given otherwise (a dataset name, which the
    traces folders resolve wherever the run is)."""
    p = os.path.expanduser(path)
    return os.path.abspath(p) if os.path.exists(p) else path


def check_out_dir(path, what: str = "output folder") -> None:
    """Raise ConfigError unless `path` is a folder that can be written, or can be made."""
    _check_folder(path, Path(path), what)


def check_out_file(path, what: str = "output file", *, make_parents: bool = False) -> None:
    """Raise ConfigError unless a file can be written at `path`: not a folder, in a folder
    that exists (or, with `make_parents`, can be made) and can be written."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder, not a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{what} {str(path)!r} is not writable")
    parent = p.absolute().parent
    if not make_parents and not parent.exists():
        raise ConfigError(f"{what} {str(path)!r}: folder {str(parent)!r} does not exist")
    _check_folder(path, parent, what)


__all__ = ["RUN_MARKERS", "check_out_dir", "check_out_file", "recorded_path", "run_kind"]
