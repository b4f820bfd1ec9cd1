"""Per-step limits of one server."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

# The largest token budget per step: far past any GPU's (a step's shape and the theory's
# representative step grow with it), and small enough that every count of a step stays exact.
MAX_B_MAX = 1 << 20


def check_b_max(b: object) -> int:
    """The rule for a token budget per step: a positive int (not a bool) of at most
    MAX_B_MAX; returns it, or raises a one-line ConfigError."""
    if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
        raise ConfigError(f"b_max must be a positive integer, got {b!r}")
    if b > MAX_B_MAX:
        raise ConfigError(f"b_max must be at most {MAX_B_MAX:,} tokens per step, got {b:,}")
    return b


def check_prefix_block_size(b: object, what: str = "block_size") -> int:
    """The rule for a prefix-cache block size: a positive int (not a bool); returns it, or
    raises a ConfigError naming `what`."""
    if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
        raise ConfigError(f"{what} must be a positive integer, got {b!r}")
    return b


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
        check_b_max(self.b_max)
        if self.k_max is not None and (not isinstance(self.k_max, int) or self.k_max <= 0):
            raise ConfigError(f"k_max must be a positive integer, got {self.k_max!r}")
        if self.kv_capacity is not None and (not isinstance(self.kv_capacity, int) or self.kv_capacity <= 0):
            raise ConfigError(f"kv_capacity must be a positive integer, got {self.kv_capacity!r}")
        if self.prefix_block_size is not None:
            check_prefix_block_size(self.prefix_block_size, "the prefix-cache block size")
