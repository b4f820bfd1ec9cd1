"""llmsched: simulate, analyse and serve LLM inference under token-level batch schedulers.

>>> import llmsched
>>> r = llmsched.simulate(policy="sarathi", b_max=512, cost_model="paper",
...                       rate=10, num_requests=1000)
>>> r.summary["p99_ttft_ms"]

Names are imported on first use, so that `import llmsched.cli` (every command's start)
does not pay for numpy and the simulator before a command needs them.
"""

from .core.lazy import lazy_dir, lazy_getattr
from .core.version import __version__

_EXPORTS = {
    "simulate": "api",
    "simulate_network": "api",
    "cluster_network": "api",
    "simulate_serverless": "sim.serverless_result",
    "SimConfig": "api",
    "SimResult": "sim.result",
    "ConfigError": "core",
    "Constraints": "core",
    "StepPlan": "core",
    "make_cost_model": "core",
    "make_scheduler": "policies",
    "list_policies": "policies",
    "Trace": "workload",
    "WorkloadSpec": "workload",
    "make_trace": "workload",
    "LLM": "engine",
}

__all__ = [*(name for name in _EXPORTS if name != "LLM"), "__version__"]
__getattr__ = lazy_getattr(__name__, _EXPORTS, ("torch", "safetensors", "tokenizers"), "engine")

__dir__ = lazy_dir(globals(), _EXPORTS)
