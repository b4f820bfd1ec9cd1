"""Seconds on the project's clocks, which count whole nanoseconds (`NS`)."""

from __future__ import annotations

import numpy as np

from .request import NS


def to_clock_ns(seconds, dtype=np.int64) -> np.ndarray:
    """Times in seconds as a clock in whole ns takes them: float64 seconds times NS,
    rounded half to even. `dtype=np.float64` keeps NaN and inf as they are."""
    return np.round(np.asarray(seconds, dtype=np.float64) * NS).astype(dtype, copy=False)
