"""JSON-ready values: numpy scalars and arrays to Python, NaN and infinities to null."""

from __future__ import annotations

import math

import numpy as np


def to_jsonable(obj):
    """`obj` with every dict key a string, numpy values as Python values, and non-finite
    floats as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return None if math.isnan(obj) or math.isinf(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    return obj
