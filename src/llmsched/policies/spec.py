"""`SchedulerSpec`: the one description of a server's scheduler (policy, admission and
limits) that the simulator's configuration, the server, the engine and the command line
share; `build()` turns it into a `Scheduler`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..core.checks import as_int, whole_as_int
from ..core.constraints import Constraints, check_prefix_block_size
from ..core.errors import ConfigError
from .base import Scheduler

# the spec's integer limits: a whole float (64.0, np.float64(3)) or a numpy int among them is
# kept as the int `build` takes it as, so that `to_dict` (a recorded spec) shows that int
_INT_LIMITS = ("b_max", "k_max", "kv_capacity", "max_running", "block_size")


@dataclass
class SchedulerSpec:
    """`policy`: a batch policy name (`sarathi`, `orca`, ..., with inline options
    `adaptive:cost=paper`); `admission`: an admission policy name (`fcfs`, `spf`, `twp`,
    ...); `b_max`: token budget per step; `k_max`: requests per step (None: no cap);
    `kv_capacity`: KV-cache tokens (None: unlimited); `max_running`: running requests
    (vLLM's `max_num_seqs`; None: no cap); `prefix_caching`: reuse the KV of cached prompt
    prefixes (vLLM's `--enable-prefix-caching`), in blocks of `block_size` tokens."""

    policy: str = "sarathi"
    admission: str = "fcfs"
    b_max: int = 512
    k_max: int | None = None
    kv_capacity: int | None = None
    max_running: int | None = None
    policy_options: dict = field(default_factory=dict)
    admission_options: dict = field(default_factory=dict)
    prefix_caching: bool = False
    block_size: int = 16

    def __post_init__(self):
        for name in _INT_LIMITS:  # (other values are left to `build`, which refuses them)
            n = as_int(whole_as_int(getattr(self, name)))
            if n is not None:
                setattr(self, name, n)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, d: Any) -> SchedulerSpec:
        """The spec's fields found in `d` (a dict or an object with these attributes);
        other keys are ignored."""
        get = d.get if isinstance(d, dict) else (lambda k, default=None: getattr(d, k, default))
        return cls(**{name: get(name, None) for name in cls.names() if get(name, None) is not None})

    def replace(self, **changes) -> SchedulerSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    def build(self) -> Scheduler:
        from . import make_admission_policy, make_batch_policy  # the registry imports this module

        b = check_prefix_block_size(self.block_size)
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"prefix_caching must be true or false, got {self.prefix_caching!r}")
        constraints = Constraints(
            b_max=self.b_max,
            k_max=self.k_max,
            kv_capacity=self.kv_capacity,
            prefix_block_size=b if self.prefix_caching else None,
        )
        for name in ("policy_options", "admission_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a mapping of option names to values")
        return Scheduler(
            make_batch_policy(self.policy, **self.policy_options),
            make_admission_policy(self.admission, self.max_running, **self.admission_options),
            constraints,
        )


__all__ = ["SchedulerSpec"]
