"""JSON-ready values: numpy scalars and arrays to Python, NaN and infinities to null.
No numpy import: numpy values are recognised by their `tolist()`."""

from __future__ import annotations

import math


def to_jsonable(obj):
    """`obj` with every dict key a string, numpy values as Python values, and non-finite
    floats as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    tolist = getattr(obj, "tolist", None)  # a numpy array or scalar
    if tolist is not None:
        return to_jsonable(tolist())
    return obj
