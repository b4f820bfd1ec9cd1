"""Number types an input may take: Python's and numpy's (`np.int64(512)` from an array),
never a bool (`True` is not a count of 1). Values come back as Python int or float, so that
results, messages and JSON do not depend on where the number came from."""

from __future__ import annotations

import math
import numbers

#: A seed written as a float is taken only below 2**53, where the float is the number
#: written (`seed: 1e308` in YAML would run as a 309-digit seed no one wrote).
FLOAT_SEED_LIMIT = 1 << 53


def as_int(v: object) -> int | None:
    """`v` as a Python int when it is an integer (int or numpy integer, not a bool); None
    otherwise (a float such as 4.0 included)."""
    if type(v) is int:  # the common case, without the abstract-class test (a bool is not)
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        return None
    return int(v)


def as_real(v: object) -> int | float | None:
    """`v` as a Python int or float when it is a real number (int, float or numpy's, not a
    bool); None otherwise. Integers stay ints, the rest become floats."""
    if type(v) is int or type(v) is float:  # the common cases (see `as_int`)
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return int(v) if isinstance(v, numbers.Integral) else float(v)


def whole_as_int(v: object) -> object:
    """A whole float (Python's or numpy's, below 2**53) as an int, as a run takes its
    integer options (`simulate(k_max=16.0)` runs k_max 16); anything else unchanged, for
    the option's own check to judge (16.5, a bool, a string)."""
    if isinstance(v, float) or (isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral))):
        f = float(v)
        if f.is_integer() and abs(f) < FLOAT_SEED_LIMIT:
            return int(f)
    return v


def whole_from_text(text: str) -> int | None:
    """The whole number `text` writes (`128`, `1e3`, `2.0`: as a length law reads its token
    counts), as an int; None when it writes none (`1.5`, `x`, `nan`, or a float past 2**53
    that is not the number written)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        n = whole_as_int(float(text))
    except ValueError:
        return None
    return n if isinstance(n, int) else None


def quoted_number(value: object) -> str:
    """A hint for a number written in quotes (YAML reads `"0.5"` as a string), to append to
    the message refusing it; '' for anything else."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (a number in quotes: write it without them)"
    return ""


def check_bool(v: object, name: str) -> bool:
    """A switch: True or False (not 0, 1 or a string: `"no"` is truthy); else a one-line
    ConfigError naming `name`."""
    from .errors import ConfigError  # noqa: PLC0415

    if not isinstance(v, bool):
        raise ConfigError(f"{name} must be true or false, got {v!r:.60}")
    return v


def check_text(text: str, what: str) -> str:
    """`text` when it is valid Unicode (it encodes as UTF-8); else a one-line ConfigError
    naming `what`. Python hands bytes that are not UTF-8 (on the command line, in file
    names) over as lone surrogates, which no tokenizer takes and no model output holds."""
    from .errors import ConfigError  # noqa: PLC0415

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        # surrogateescape: U+DC80..U+DCFF stands for the undecodable byte 0x80..0xFF
        if 0xDC80 <= ch <= 0xDCFF:
            detail = f"byte {ch - 0xDC00:#04x} that is not UTF-8"
        else:
            detail = f"lone surrogate U+{ch:04X}"
        raise ConfigError(f"{what} is not valid Unicode text: character {e.start} is a {detail}") from None
    return text


def check_api_key(given: str | None, env: str) -> str | None:
    """The API key of `--api-key`, else of `$env` (unset or empty: none), checked: a key
    goes in an HTTP header as `Bearer KEY`, so it is visible ASCII, without spaces
    (`--api-key ''` served without a key; one with a space or an accent matched no request)."""
    import os  # noqa: PLC0415

    from .errors import ConfigError  # noqa: PLC0415

    where = "--api-key"
    if given is None:
        given, where = os.environ.get(env) or None, f"${env}"
        if given is None:
            return None
    if not given or not all("!" <= c <= "~" for c in given):
        raise ConfigError(
            f"{where} must be visible ASCII characters without spaces (it is sent as 'Bearer KEY'), "
            f"got {given!r:.60}" + ("; leave it out for no key" if not given else "")
        )
    return given


def first_repeat(values):
    """The first value of `values` that an earlier one equals, or None (a list given
    twice runs its cells twice)."""
    return next((v for i, v in enumerate(values) if v in values[:i]), None)


def check_distinct(values: list, name: str) -> list:
    """`values` unchanged when no value repeats an earlier one; else a one-line ConfigError
    naming `name` and the value: an experiment's list given a value twice ran its cells
    twice (duplicate rows, and averages counting them twice)."""
    twice = first_repeat(values)
    if twice is not None:
        from .errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"{name}: {twice!r} is given twice: each runs every cell once, list it once")
    return values


def strict_keywords(what: str):
    """A class decorator for a dataclass: an unknown keyword argument to its constructor
    is a ConfigError naming it and the known ones (`unknown_name`), not a TypeError."""

    def wrap(cls):
        import dataclasses  # noqa: PLC0415
        import functools  # noqa: PLC0415

        from .errors import check_known  # noqa: PLC0415

        init = cls.__init__
        known = frozenset(f.name for f in dataclasses.fields(cls) if f.init)

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if not known.issuperset(kwargs):
                check_known(what, kwargs, known)
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        return cls

    return wrap


def strict_arguments(func):
    """A function decorator: an unknown keyword argument is a ConfigError naming it (with
    a close known name), as `simulate`'s are, not Python's TypeError; and a keyword whose
    parameter is annotated `bool` must be True, False or None (`check_bool`: quick="no" ran
    the quick experiment)."""
    import functools  # noqa: PLC0415
    import inspect  # noqa: PLC0415

    from .errors import check_known  # noqa: PLC0415

    known = frozenset(keyword_names(func))
    switches = frozenset(
        name for name, p in inspect.signature(func).parameters.items() if p.annotation in (bool, "bool")
    )

    @functools.wraps(func)
    def call(*args, **kwargs):
        if not known.issuperset(kwargs):
            check_known("option", kwargs, known)
        for name in switches.intersection(kwargs):
            if kwargs[name] is not None:  # (None: the default, as the CLI passes a flag not given)
                check_bool(kwargs[name], name)
        return func(*args, **kwargs)

    return call


def keyword_names(func) -> tuple[str, ...]:
    """The names `func` takes as keyword arguments, from its signature (not *args nor
    **kwargs): the known names an unknown keyword's error lists."""
    import inspect  # noqa: PLC0415

    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in inspect.signature(func).parameters.values() if p.kind in kinds)


def check_run_switches(fast, progress, unknown: dict | None = None, run=None) -> None:
    """A run function's `fast` (a bool), `progress` (None or a function) and keyword
    arguments it does not take (`unknown`, named with those `run`, the function, takes):
    ConfigErrors."""
    from .errors import ConfigError, unknown_name  # noqa: PLC0415

    if unknown:
        raise unknown_name("option", min(unknown), keyword_names(run) if run is not None else ())
    if not isinstance(fast, bool):
        raise ConfigError(f"fast must be true or false, got {fast!r:.60}")
    check_progress(progress)


def check_progress(progress) -> None:
    """A run function's `progress`: None or a function (done, total)."""
    from .errors import ConfigError  # noqa: PLC0415

    if progress is not None and not callable(progress):
        raise ConfigError(f"progress must be a function (done, total) or None, got {progress!r:.60}")


def check_policy_names(policies) -> list[str]:
    """Policy names as a list: one name (a string) or an iterable of them (a generator is
    read once); a ConfigError for anything else."""
    from collections.abc import Iterable  # noqa: PLC0415

    from .errors import ConfigError  # noqa: PLC0415

    if isinstance(policies, str):  # one policy's name
        return [policies]
    names = list(policies) if isinstance(policies, Iterable) else None
    if names is None or not all(isinstance(p, str) for p in names):
        raise ConfigError(f"policies must be a list of policy names, got {policies!r:.60}")
    return names


def check_seeds(seeds) -> tuple[int, ...]:
    """The seeds, each a whole number >= 0 and given once: a repeated seed would run every
    cell of the experiment again (duplicate rows in table.csv, averages counting it twice).
    A string (`"01"`, two seeds '0' and '1'?) or a single number is no list of seeds."""
    from collections.abc import Sequence  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from .errors import ConfigError  # noqa: PLC0415

    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (Sequence, set, frozenset, np.ndarray)):
        raise ConfigError(f"seeds must be a list of whole numbers >= 0, got {seeds!r:.60}")
    out: list[int] = []
    for s in seeds:
        x = as_real(s)  # (numpy's numbers too, not bools)
        if x is None or not (isinstance(x, int) or (x.is_integer() and x < FLOAT_SEED_LIMIT)) or x < 0:
            raise ConfigError(f"seeds must be whole numbers >= 0 (a float below 2**53), got {s!r:.60}")
        if int(s) in out:
            raise ConfigError(f"seed {int(s)} is given twice: each seed runs every cell once, list it once")
        out.append(int(s))
    if not out:
        raise ConfigError("give at least one seed")
    return tuple(out)


def check_list(values, name: str, what: str, empty: bool = False) -> list:
    """`values` as a list: a list, tuple, set, numpy array or generator of them; a
    ConfigError naming `name` for a string (`"0.9"` is no list of loads, and `"16"` would
    run pools of 1 and 6), a single value, a mapping or (unless `empty`) no value."""
    from collections.abc import Iterable, Mapping  # noqa: PLC0415

    from .errors import ConfigError  # noqa: PLC0415

    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise ConfigError(f"{name} must be a list of {what}, got {values!r:.60}")
    out = list(values)
    if not out and not empty:
        raise ConfigError(f"{name} must be a list of {what}, got none")
    return out


def check_reals(
    values, name: str, what: str = "positive numbers", top: float = math.inf, empty: bool = False
) -> list[float]:
    """`values` (see `check_list`) as floats, each finite, > 0 and < `top`; else a one-line
    ConfigError naming `name` and the first bad value."""
    from .errors import ConfigError  # noqa: PLC0415

    out = []
    for v in check_list(values, name, what, empty):
        x = as_real(v)
        if x is None or not (0 < x < top) or not math.isfinite(x):
            raise ConfigError(f"{name} must be {what}, got {v!r:.60}")
        out.append(float(x))
    return out


def check_count(v: object, name: str) -> int:
    """A count (jobs, replicas, a batch cap): a whole number >= 1 (a whole float such as
    3000.0 taken, as `whole_as_int`); 2.7, 0, a string or a bool is a ConfigError naming
    `name` (`int()` would run 2 of 2.7, and `num_jobs or default` the default of 0)."""
    from .errors import ConfigError  # noqa: PLC0415

    x = as_int(whole_as_int(v))
    if x is None or x < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {v!r:.60}")
    return x


def check_names(values, name: str, empty: bool = False) -> list[str]:
    """Names (routers, workflows, schedulers) as a list: one name (a string) is a list of
    one, as `check_policy_names` takes it (not its characters); else see `check_list`."""
    from .errors import ConfigError  # noqa: PLC0415

    names = [values] if isinstance(values, str) else check_list(values, name, "names", empty)
    for n in names:
        if not isinstance(n, str):
            raise ConfigError(f"{name} must be names (strings), got {n!r:.60}")
    return names
