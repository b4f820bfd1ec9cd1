"""Number types an input may take: Python's and numpy's (`np.int64(512)` from an array),
never a bool (`True` is not a count of 1). Values come back as Python int or float, so that
results, messages and JSON do not depend on where the number came from."""

from __future__ import annotations

import numbers


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


def first_repeat(values):
    """The first value of `values` that an earlier one equals, or None (a list given
    twice runs its cells twice)."""
    return next((v for i, v in enumerate(values) if v in values[:i]), None)
