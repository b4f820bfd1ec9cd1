"""Reading a YAML file the user wrote (a configuration, a network, a serverless platform):
one-line errors for a folder, a missing or unreadable file, invalid YAML, and a key given
twice in one mapping (PyYAML keeps the last silently: a second `platform:` section
replaced the first). A plain number with an exponent (`1e6`, `2.5e-3`: numbers in YAML 1.2
and JSON) is read as a number: PyYAML's YAML 1.1 rule reads it as a string unless it has a
dot and a signed exponent (`1.0e+6`), and a file that refuses quoted numbers (a network's)
would refuse it. A file with no data (empty, or only comments) is refused: a user who gave
a file meant it to set something, and running all defaults would hide a wrong file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["read_yaml"]

_LOADER = None


# YAML 1.2's floats with an exponent that YAML 1.1's rule misses (it needs a dot and a signed
# exponent); those without an exponent it already reads
_EXPONENT_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"


def _unique_key_loader():
    """A SafeLoader that refuses a key given twice in one mapping and reads `1e6` as a number
    (built once, on first use: yaml is imported only by commands that read a file)."""
    global _LOADER
    if _LOADER is None:
        import yaml  # noqa: PLC0415

        class UniqueKeyLoader(yaml.SafeLoader):
            pass

        def mapping(loader, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                    continue
                key = loader.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the SafeLoader says so
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _Duplicate(f"{key!r} is given twice in one mapping (lines {first} and {line})")
                seen[key] = line
            return yaml.SafeLoader.construct_mapping(loader, node, deep)

        UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
        UniqueKeyLoader.add_implicit_resolver(
            "tag:yaml.org,2002:float", re.compile(_EXPONENT_FLOAT), list("-+.0123456789")
        )
        _LOADER = UniqueKeyLoader
    return _LOADER


class _Duplicate(Exception):
    pass


def read_yaml(path, what: str) -> Any:
    """The data of the YAML file at `path`; `what` names the file in errors ("config",
    "network", "serverless")."""
    import yaml  # noqa: PLC0415

    p = Path(path)
    name = f"{what} file {str(path)!r}"
    if p.is_dir():  # "does not exist" would send the user looking for a missing path
        hint = "give the YAML file's path"
        if (p / "config.json").is_file():  # a results folder: its config.json reruns it
            hint += f" ({str(p / 'config.json')!r} is the config of the run in it)"
        raise ConfigError(f"{name} is a folder, not a file: {hint}")
    if not p.exists():
        raise ConfigError(f"{name} does not exist")
    if not (p.is_file() or p.is_fifo()):  # (a pipe: `--config <(...)` in a shell)
        raise ConfigError(f"{name} is not a file (a device or socket): give the YAML file's path")
    try:
        data = yaml.load(p.read_text(), Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader)
    except _Duplicate as e:
        raise ConfigError(f"{name}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{name} is not valid YAML: {' '.join(str(e).split())}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{name} cannot be read: {e}") from None
    except RecursionError:  # PyYAML composes nested lists and mappings recursively
        raise ConfigError(
            f"{name} nests too deeply: it has more lists and mappings inside one another than the YAML "
            "reader can follow"
        ) from None
    if data is None:
        raise ConfigError(f"{name} holds no settings (it is empty or has only comments)")
    return data
