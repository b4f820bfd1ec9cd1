"""Per-step limits of one server."""

from __future__ import annotations

from dataclasses import dataclass

from .checks import as_int, whole_as_int
from .errors import ConfigError, count_text

# The largest token budget per step: far past any GPU's (a step's shape and the theory's
# representative step grow with it), and small enough that every count of a step stays exact.
MAX_B_MAX = 1 << 20
# Requests per step (k_max) and running requests (max_running): at most a step's tokens.
MAX_REQUESTS_PER_STEP = 1 << 20
# KV-cache capacity in tokens (a trillion: far past any GPU's).
MAX_KV_TOKENS = 1 << 40
# Tokens per KV (prefix-cache) block: the one limit of simulate, serve, generate and the
# trace readers (workload.blocks.check_block_size).
MAX_BLOCK_SIZE = 1 << 20


def _positive_int(v: object, name: str, most: int | None = None, unit: str = "") -> int:
    """`v` as an int if it is a positive integer (int or numpy's, not a bool; a whole
    float such as 16.0 or np.float64(16) too, as `simulate(k_max=16.0)` takes it) of at
    most `most` (None: no limit); else a one-line ConfigError naming `name`."""
    n = as_int(whole_as_int(v))
    if n is None or n <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    if most is not None and n > most:
        raise ConfigError(f"{name} must be at most {most:,}{unit}, got {count_text(n)}")
    return n


def check_b_max(b: object) -> int:
    """The rule for a token budget per step: a positive integer of at most MAX_B_MAX."""
    return _positive_int(b, "b_max", MAX_B_MAX, " tokens per step")


def check_k_max(k: object) -> int:
    """The rule for a cap on requests per step: a positive integer of at most
    MAX_REQUESTS_PER_STEP. (None, no cap, is the caller's to allow.)"""
    return _positive_int(k, "k_max", MAX_REQUESTS_PER_STEP)


def k_max_binds(b_max, k_max) -> bool:
    """Whether a cap of `k_max` requests per step can bind under a budget of `b_max`
    tokens: a step of at most b_max tokens holds at most b_max requests, so only a cap
    below b_max can (None: no cap)."""
    return k_max is not None and b_max is not None and k_max < b_max


def check_prefix_block_size(b: object, what: str = "block_size") -> int:
    """The rule for a (prefix-cache) block size: a positive integer (`_positive_int`'s) of
    at most MAX_BLOCK_SIZE tokens; returns it as an int, or raises a ConfigError
    naming `what`."""
    return _positive_int(b, what, MAX_BLOCK_SIZE, " tokens")


@dataclass(frozen=True)
class Constraints:
    """`b_max`: token budget per step; `k_max`: cap on distinct requests per step (None:
    no cap); `kv_capacity`: KV-cache slots in tokens (None: unlimited);
    `prefix_block_size`: prefix caching with blocks of that many tokens (None: off)."""

    b_max: int = 512
    k_max: int | None = None
    kv_capacity: int | None = None
    prefix_block_size: int | None = None

    def __post_init__(self):
        # numpy integers become ints (frozen: set through object.__setattr__)
        object.__setattr__(self, "b_max", check_b_max(self.b_max))
        if self.k_max is not None:
            object.__setattr__(self, "k_max", check_k_max(self.k_max))
        if self.kv_capacity is not None:
            object.__setattr__(self, "kv_capacity", _positive_int(self.kv_capacity, "kv_capacity", MAX_KV_TOKENS))
        if self.prefix_block_size is not None:
            block = check_prefix_block_size(self.prefix_block_size, "the prefix-cache block size")
            object.__setattr__(self, "prefix_block_size", block)
