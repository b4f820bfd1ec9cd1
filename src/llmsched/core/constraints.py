"""Per-step limits of one server."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError, count_text

# The largest token budget per step: far past any GPU's (a step's shape and the theory's
# representative step grow with it), and small enough that every count of a step stays exact.
MAX_B_MAX = 1 << 20
# Requests per step (k_max) and running requests (max_running): at most a step's tokens.
MAX_REQUESTS_PER_STEP = 1 << 20
# KV-cache capacity in tokens (a trillion: far past any GPU's).
MAX_KV_TOKENS = 1 << 40


def check_b_max(b: object) -> int:
    """The rule for a token budget per step: a positive int (not a bool) of at most
    MAX_B_MAX; returns it, or raises a one-line ConfigError."""
    if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
        raise ConfigError(f"b_max must be a positive integer, got {b!r}")
    if b > MAX_B_MAX:
        raise ConfigError(f"b_max must be at most {MAX_B_MAX:,} tokens per step, got {count_text(b)}")
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
        for name, cap in (("k_max", MAX_REQUESTS_PER_STEP), ("kv_capacity", MAX_KV_TOKENS)):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
            if v is not None and v > cap:
                raise ConfigError(f"{name} must be at most {cap:,}, got {count_text(v)}")
        if self.prefix_block_size is not None:
            check_prefix_block_size(self.prefix_block_size, "the prefix-cache block size")
