"""Serving (optional extra `llmsched[server]`): an OpenAI-compatible HTTP server over the
real engine or a virtual GPU, and a load-testing client (`llmsched bench`).

Importing this package imports neither FastAPI nor httpx; the names below load on use.
"""

from __future__ import annotations

_LAZY = {
    "build_app": "app", "ServerConfig": "app",
    "serve": "serve", "make_server": "serve", "GracefulServer": "serve",
    "Backend": "backends", "SchedulerOptions": "backends",
    "make_sim_backend": "backends", "make_engine_backend": "backends",
    "AsyncEngine": "async_engine",
    "BenchConfig": "bench", "run_bench": "bench", "calculate_metrics": "bench",
    "register": "cli",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib  # noqa: PLC0415
        try:
            mod = importlib.import_module(f".{_LAZY[name]}", __name__)
        except ModuleNotFoundError as e:
            if e.name in ("fastapi", "uvicorn", "httpx", "starlette"):
                from ..core.errors import ConfigError  # noqa: PLC0415
                raise ConfigError(f"serving needs {e.name}: pip install 'llmsched[server]'") from None
            raise
        return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
