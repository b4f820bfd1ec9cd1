"""llmsched: simulate, analyse and serve LLM inference under token-level batch schedulers.

>>> import llmsched
>>> r = llmsched.simulate(policy="sarathi", b_max=512, cost_model="paper",
...                       rate=10, num_requests=1000)
>>> r.summary["p99_ttft_ms"]
"""

from .api import SimConfig, cluster_network, simulate, simulate_network
from .core import ConfigError, Constraints, StepPlan, make_cost_model
from .core.version import __version__
from .policies import list_policies, make_scheduler
from .sim.result import SimResult
from .workload import Trace, WorkloadSpec, make_trace

__all__ = [
    "simulate",
    "simulate_network",
    "cluster_network",
    "SimConfig",
    "SimResult",
    "ConfigError",
    "Constraints",
    "StepPlan",
    "make_cost_model",
    "make_scheduler",
    "list_policies",
    "Trace",
    "WorkloadSpec",
    "make_trace",
    "__version__",
]


def __getattr__(name):
    if name == "LLM":  # the engine needs torch: import it only when asked for
        from .engine import LLM  # noqa: PLC0415

        return LLM
    raise AttributeError(name)
