"""Workloads: the requests a simulation or a load-test client replays.

- `Trace`: requests as numpy arrays (arrival_s, prompt, output, tag); CSV in and out.
- Arrival processes: `Poisson`, `Gamma` (burstiness cv), `Deterministic`; trace replay of
  plain, Azure or BurstGPT CSV files and Mooncake JSON lines (`read_trace`, `load_trace`).
- Prefix-cache block ids (`Request.blocks`): from a trace's own ids, or from synthetic
  shared system prompts and multi-turn conversations (`blocks`, `conversations`).
- Length laws: `Constant`, `Uniform`, `Geometric`, `Lognormal`, `Empirical`
  (`parse_length_law` reads the command-line forms).
- `WorkloadSpec` + `make_trace(spec)`: the spec layer used by the CLI and Python API.
Bad input raises `llmsched.core.errors.ConfigError` with one sentence.
"""

from ..core.errors import ConfigError
from .arrivals import ArrivalProcess, Deterministic, Gamma, Poisson, make_arrival_process
from .datasets import DATASETS, resolve_dataset, traces_dirs
from .lengths import Constant, Empirical, Geometric, LengthLaw, Lognormal, Uniform, parse_length_law, sample_pair
from .spec import WorkloadClass, WorkloadSpec, load_trace, make_trace, replays_trace
from .trace import (
    FORMATS,
    Trace,
    TraceWarning,
    read_azure_csv,
    read_burstgpt_csv,
    read_mooncake_jsonl,
    read_plain_csv,
    read_trace,
)

__all__ = [
    "ConfigError",
    "Trace",
    "TraceWarning",
    "FORMATS",
    "read_trace",
    "read_plain_csv",
    "read_azure_csv",
    "read_burstgpt_csv",
    "read_mooncake_jsonl",
    "load_trace",
    "ArrivalProcess",
    "Poisson",
    "Gamma",
    "Deterministic",
    "make_arrival_process",
    "LengthLaw",
    "Constant",
    "Uniform",
    "Geometric",
    "Lognormal",
    "Empirical",
    "parse_length_law",
    "sample_pair",
    "DATASETS",
    "resolve_dataset",
    "traces_dirs",
    "WorkloadSpec",
    "WorkloadClass",
    "make_trace",
    "replays_trace",
]
