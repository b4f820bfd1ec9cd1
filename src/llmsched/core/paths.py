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


def _check_folder(given, folder: Path, what: str, given_is_folder: bool = True) -> None:
    """`folder` (or the place it will be made in) can hold new files. `given_is_folder`:
    `given` names `folder` itself (not a file in it), so "`given` is a file" is true."""
    base = _first_existing(folder)
    if not base.is_dir():
        if given_is_folder and base == folder.absolute():
            raise ConfigError(f"{what} {str(given)!r} is a file, not a folder")
        raise ConfigError(f"{what} {str(given)!r}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(given)!r}: {base} is not writable")


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
    _check_folder(path, parent, what, given_is_folder=False)


__all__ = ["check_out_dir", "check_out_file"]
