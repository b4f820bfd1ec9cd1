"""Package attributes imported on first use, so that importing a package with optional
extras (torch, FastAPI) or heavy dependencies (scipy) costs nothing until it is used."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable

from .errors import ConfigError


class _ClashGuard(types.ModuleType):
    """A package whose export shares its name with the submodule defining it (`serve` in
    `llmsched.server.serve`). Importing a submodule makes Python bind it as a package
    attribute, which would hide the export; this class binds the export instead (the
    submodule stays importable by its full name through `sys.modules`)."""

    _lazy_clashes: frozenset[str] = frozenset()

    def __setattr__(self, name: str, value: object) -> None:
        if (
            name in self._lazy_clashes
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_getattr(
    package: str, exports: dict[str, str], extras: tuple[str, ...] = (), hint: str = ""
) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: `exports` maps a name to the submodule that
    defines it. A missing module named in `extras` becomes a ConfigError with `hint`.
    A name equal to its submodule's name keeps meaning the export, whichever is imported
    first."""
    clashes = frozenset(name for name, module in exports.items() if name == module)
    if clashes:
        pkg = sys.modules[package]
        pkg.__class__ = _ClashGuard
        pkg._lazy_clashes = clashes

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(f".{exports[name]}", package)
        except ModuleNotFoundError as e:
            if e.name in extras:
                raise ConfigError(f"the {hint} extra needs {e.name}: pip install 'llmsched[{hint}]'") from None
            raise
        return getattr(module, name)

    return __getattr__
