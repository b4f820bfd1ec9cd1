"""Serving (optional extra `llmsched[server]`): an OpenAI-compatible HTTP server over the
real engine or a virtual GPU, and a load-testing client (`llmsched bench`).

Importing this package imports neither FastAPI nor httpx; the names below load on use.
"""

from __future__ import annotations

from ..core.lazy import lazy_dir, lazy_getattr

_LAZY = {
    "build_app": "app",
    "ServerConfig": "app",
    "serve": "serving",
    "make_server": "serving",
    "GracefulServer": "serving",
    "Backend": "backends",
    "SchedulerOptions": "backends",
    "make_sim_backend": "backends",
    "make_engine_backend": "backends",
    "AsyncEngine": "async_engine",
    "BenchConfig": "bench",
    "run_bench": "bench",
    "calculate_metrics": "bench",
}

__all__ = list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY, ("fastapi", "uvicorn", "httpx", "starlette"), "server")
__dir__ = lazy_dir(globals(), _LAZY)
