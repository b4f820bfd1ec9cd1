"""Batch and admission policies, and a registry that builds a `Scheduler` by name."""

from __future__ import annotations

from typing import Any, Callable

from ..core.constraints import Constraints
from ..core.errors import ConfigError
from .admission import FCFS, RunningCap, ShortestPromptFirst
from .base import AdmissionPolicy, BatchPolicy, Planner, Scheduler
from .fastertransformer import FasterTransformer
from .kfcfs import KFCFS
from .orca import Orca
from .sarathi import Sarathi
from .vllm import VanillaVLLM

BATCH_POLICIES: dict[str, type[BatchPolicy]] = {
    "fastertransformer": FasterTransformer,
    "vllm": VanillaVLLM,
    "orca": Orca,
    "sarathi": Sarathi,
    "kfcfs": KFCFS,
}
BATCH_ALIASES = {"ft": "fastertransformer", "vanilla-vllm": "vllm", "sarathi-serve": "sarathi",
                 "k-fcfs": "kfcfs"}

# name -> factory(**options) returning an AdmissionPolicy
ADMISSION_POLICIES: dict[str, Callable[..., AdmissionPolicy]] = {
    "fcfs": FCFS,
    "spf": ShortestPromptFirst,
}
ADMISSION_ALIASES = {"shortest-prompt-first": "spf", "priority": "spf"}


def register_batch_policy(cls: type[BatchPolicy]) -> type[BatchPolicy]:
    BATCH_POLICIES[cls.name] = cls
    return cls


def register_admission_policy(name: str, factory: Callable[..., AdmissionPolicy]) -> None:
    ADMISSION_POLICIES[name] = factory


def _lookup(name: str, table: dict, aliases: dict, what: str):
    key = aliases.get(name.lower(), name.lower())
    if key not in table:
        raise ConfigError(f"unknown {what} {name!r} (known: {', '.join(sorted(table))})")
    return table[key]


def make_batch_policy(name: str) -> BatchPolicy:
    return _lookup(name, BATCH_POLICIES, BATCH_ALIASES, "batch policy")()


def make_admission_policy(name: str = "fcfs", max_running: int | None = None,
                          **options: Any) -> AdmissionPolicy:
    factory = _lookup(name, ADMISSION_POLICIES, ADMISSION_ALIASES, "admission policy")
    try:
        policy = factory(**options)
    except TypeError as e:
        raise ConfigError(f"admission policy {name!r}: {e}") from None
    if max_running is not None:
        policy = RunningCap(policy, max_running)
    return policy


def make_scheduler(policy: str = "sarathi", admission: str = "fcfs", b_max: int = 512,
                   k_max: int | None = None, kv_capacity: int | None = None,
                   max_running: int | None = None, admission_options: dict | None = None) -> Scheduler:
    """Build a scheduler from names, e.g. `make_scheduler("sarathi", b_max=512)`."""
    constraints = Constraints(b_max=b_max, k_max=k_max, kv_capacity=kv_capacity)
    return Scheduler(make_batch_policy(policy),
                     make_admission_policy(admission, max_running, **(admission_options or {})),
                     constraints)


def list_policies() -> list[tuple[str, str, str]]:
    """(kind, name, one-line summary) of every registered policy."""
    rows = [("batch", n, c.summary) for n, c in BATCH_POLICIES.items()]
    for n, f in ADMISSION_POLICIES.items():
        rows.append(("admission", n, getattr(f, "summary", "")))
    return rows


__all__ = [
    "AdmissionPolicy", "BatchPolicy", "Planner", "Scheduler", "BATCH_POLICIES",
    "ADMISSION_POLICIES", "make_batch_policy", "make_admission_policy", "make_scheduler",
    "list_policies", "register_batch_policy", "register_admission_policy",
    "FasterTransformer", "VanillaVLLM", "Orca", "Sarathi", "KFCFS", "FCFS",
    "ShortestPromptFirst", "RunningCap",
]
