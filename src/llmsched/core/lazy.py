"""Package attributes imported on first use, so that importing a package with optional
extras (torch, FastAPI) or heavy dependencies (scipy) costs nothing until it is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .errors import ConfigError


def lazy_getattr(
    package: str, exports: dict[str, str], extras: tuple[str, ...] = (), hint: str = ""
) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: `exports` maps a name to the submodule that
    defines it. A missing module named in `extras` becomes a ConfigError with `hint`.
    No name may be its submodule's: importing the submodule binds it as the package's
    attribute of that name, and the export would then be the module."""
    for name, module in exports.items():
        if name == module:
            raise ValueError(f"lazy export {name!r} is also the name of its submodule in {package}: rename one")

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


def lazy_dir(namespace: dict, exports: dict[str, str]) -> Callable[[], list[str]]:
    """A module `__dir__` for a package with `lazy_getattr`: its names (`namespace`, the
    package's live `globals()`) and the lazy exports not yet imported, for `dir` and
    completion."""

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __dir__
