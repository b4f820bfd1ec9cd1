"""Seconds on the project's clocks, which count whole nanoseconds (`NS`)."""

from __future__ import annotations

import math
import time

import numpy as np

from .checks import as_real
from .errors import ConfigError
from .request import NS
from .state import UNLIMITED

# The end of the simulators' clocks: UNLIMITED stands for "never" (no stop time, no next
# arrival), so a run without a stop whose events reach it would end there silently short.
# Their refusals name it in these words.
PAST_CLOCK = f"past the simulator's clock ({UNLIMITED / NS:.4g} s)"


def past_clock_error(unfinished: str, stop: str, shorten: str, where: str = "") -> ConfigError:
    """A run without a stop time whose events would reach the clock's end: its loop would
    end there as at a stop, leaving `unfinished` (requests, jobs) silently short, or store
    a time past int64. The first event past it depends on how far batches run ahead, so
    the line names no time: the fast and step-by-step paths say the same."""
    return ConfigError(
        f"{where}the run would go on {PAST_CLOCK} with {unfinished} unfinished; set a stop time ({stop}) "
        f"or shorten {shorten}"
    )


def to_clock_ns(seconds, dtype=np.int64) -> np.ndarray:
    """Times in seconds as a clock in whole ns takes them: float64 seconds times NS,
    rounded half to even. `dtype=np.float64` keeps NaN and inf as they are."""
    return np.round(np.asarray(seconds, dtype=np.float64) * NS).astype(dtype, copy=False)


def wall_stamp_ns(stamp, now_ns: int) -> int:
    """A `time.time()` stamp (seconds) on a clock that reads `now_ns` now, by the stamp's
    age with both clocks read together: an offset fixed at start went wrong once the wall
    clock was stepped or slewed (arrivals then missed the step boundary they reached, and
    queue times were false). A stamp in the future is now."""
    w = as_real(stamp)
    if w is None or not math.isfinite(w):
        raise ConfigError(f"arrival_time must be a finite time.time() value in seconds, got {stamp!r}")
    age = time.time() - w
    return now_ns - int(age * NS) if age > 0 else now_ns
