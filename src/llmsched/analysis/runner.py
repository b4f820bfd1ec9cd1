"""Running sweep points: backends, resumable storage, a progress bar, and the runner.

- `Backend("local", workers)`: a process pool of at most `workers` (forked on Linux; one
  worker runs inline), started at the first run with no more processes than it has jobs
  (and grown, up to `workers`, when a later run has more); `workers` is at most
  `MAX_WORKERS`; `Backend("ray", workers, address)`: Ray tasks on a local Ray started for
  the sweep (`num_cpus = workers`) or on a cluster. Both yield results as they finish.
  `quiet=True`: Ray's warnings and notices (its token-authentication line) stay off the
  terminal while the backend holds the Ray it started; its errors still show.
  A cluster's address is probed first (`probe_ray_address`): one that does not answer
  within `RAY_CONNECT_TIMEOUT_S` is an error, not a hang in Ray's retries.
  While open (in the main thread, where SIGTERM has its default action) SIGTERM raises
  `Terminated`, a KeyboardInterrupt: leaving on either stops the local workers at once
  (which ignore SIGINT: a terminal's Ctrl-C, sent to them too, printed their tracebacks).
  Either signal is also remembered and raised again at the next finished point: one that
  lands while the interpreter runs a finaliser is swallowed there, and the sweep would
  otherwise run on to its end.
- `Store(out_dir)`: each finished point's summary in `OUT/points/KEY.json`, so a rerun
  (or a bigger grid, or another sweep into the same folder) skips finished points.
- `Runner(backend, store, progress)`: runs a list of point configurations through both.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, Terminated
from ..core.jsonio import to_jsonable
from ..core.paths import atomic_write, read_point_record, remove_temporary_files
from .points import point_key, run_point

__all__ = [
    "Backend",
    "Store",
    "Progress",
    "Runner",
    "ray_endpoint",
    "probe_ray_address",
    "check_workers",
    "MAX_WORKERS",
]

#: The most parallel simulations a backend runs: a pool forks all its processes up front
#: (`--workers 100000` forked thousands); more than this is refused, not capped.
MAX_WORKERS = 1024

#: Seconds to wait for a Ray cluster's port to accept a connection. Ray itself retries an
#: unreachable address for minutes (a silent hang); a live head answers in milliseconds.
RAY_CONNECT_TIMEOUT_S = 5.0
#: The port of a `ray://` (Ray Client) address without one, as Ray's own default.
RAY_CLIENT_PORT = 10001


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray cluster address (`HOST:PORT`, `[IPv6]:PORT`,
    `ray://HOST[:PORT]`), or None for `auto` and `local`, which Ray resolves itself."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    rest = address[len("ray://") :] if client else address
    host, sep, port = rest.rpartition(":")
    if not sep or "]" in port:  # no port (an IPv6 host's colons are inside brackets)
        host, port = rest, str(RAY_CLIENT_PORT) if client else ""
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--address must be HOST:PORT (or ray://HOST[:PORT], auto), got {address!r}")
    return host, int(port)


def probe_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Fail in at most `timeout_s` when nothing accepts connections at the cluster's
    address, instead of letting `ray.init` retry it for minutes."""
    end = ray_endpoint(address)
    if end is None:
        return
    try:
        socket.create_connection(end, timeout=timeout_s).close()
    except TimeoutError:
        raise ConfigError(f"cannot reach the Ray cluster at {address}: no answer in {timeout_s:g} s") from None
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise ConfigError(f"cannot reach the Ray cluster at {address}: {why}") from None


def check_workers(workers, name: str = "workers") -> None:
    """ConfigError unless `workers` is None or a whole number from 1 to `MAX_WORKERS`
    (`name`: the option's name in the message, `--workers` on the command line)."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {workers!r}")
    if workers > MAX_WORKERS:
        raise ConfigError(f"{name} must be at most {MAX_WORKERS} (parallel simulations), got {workers}")


class WorkerDied(ConfigError):
    """A worker died while running a point (killed, e.g. by the out-of-memory killer, or
    crashed): the points it and the others still pending ran are lost."""

    def __init__(self):
        super().__init__(
            "a worker process died abruptly (killed, e.g. out of memory, or crashed) while running a point"
        )


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: The signals whose handlers the sweep sets (`Backend._take_signals`) and a worker replaces.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _init_worker(parent: int) -> None:
    """A pool worker ends on SIGTERM (a fork inherits the backend's handlers), ignores
    SIGINT, and on Linux ends with its parent: a sweep killed with SIGKILL (the OOM killer,
    a cluster scheduler) left its workers running forever, each waiting on the pipe of a
    parent that was gone.

    SIGINT is ignored because a terminal's Ctrl-C reaches the whole process group: a
    worker that raised KeyboardInterrupt (an idle one, in the call queue's get) had
    multiprocessing print its traceback before `llmsched: interrupted`. The sweep, which
    gets the Ctrl-C too, stops its workers (`Backend.__exit__`). The pool is forked with
    both signals blocked (`_stop_signals_blocked`), so that no child runs the sweep's
    handlers (which raise) before its own are set: they are unblocked only now."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # (no prctl in this libc: the worker outlives a kill -9)
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_blocked():
    """SIGINT and SIGTERM held back in this thread (and in processes forked or spawned
    meanwhile) until the block ends, when one that arrived is delivered: a pool's workers
    start so, and set their own handlers before they take one (`_init_worker`)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _recording_warnings(fn: Callable[[Any], Any], arg):
    """`fn(arg)` in a pool or Ray worker (or inline), with the warnings it gives (under the filters
    the worker has: a fork's are the sweep's) recorded, not printed: (result, [(text, category,
    filename, lineno)]). The sweep shows each once (`Backend._show_warnings`); printed by
    each worker, the same warning appeared once per worker."""
    with warnings.catch_warnings(record=True) as caught:
        result = fn(arg)
    return result, [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


class Backend:
    """Runs point configurations, yielding (key, summary) as each finishes."""

    def __init__(
        self, backend: str = "local", workers: int | None = None, address: str | None = None, quiet: bool = False
    ):
        if backend not in ("local", "ray"):
            raise ConfigError(f"unknown backend {backend!r} (known: local, ray)")
        check_workers(workers)
        if address is not None:
            ray_endpoint(address)  # a malformed address fails before any work
        self.kind = backend
        self.workers = workers or (os.cpu_count() or 1)
        self.address = address
        self.quiet = quiet
        self._ray_log_level = None  # the "ray" logger's level before a quiet start, restored at exit
        self._pool = None
        self._pool_size = 0
        self._ray_started = False
        self._remote = None
        self._sigterm = None  # SIGTERM's handler before the backend took it, restored at exit
        self._sigint = None  # SIGINT's, likewise
        self._signalled: type[KeyboardInterrupt] | None = None  # the signal that arrived, as its exception
        self._handlers: dict = {}  # the handlers the backend installed, by signal
        self._warned: set = set()  # (text, category) of the points' warnings shown (each once)

    def __enter__(self):
        self._take_signals()
        try:
            self._start()
        except BaseException:
            self._restore_signals()  # no __exit__ follows a failed __enter__
            raise
        return self

    def _start(self) -> None:
        if self.kind == "ray":
            try:
                import ray  # noqa: PLC0415 (heavy, and an optional extra)
            except ImportError:
                raise ConfigError("the ray backend needs Ray: pip install 'llmsched[sweep]'") from None
            if not ray.is_initialized():
                if self.address:
                    probe_ray_address(self.address)
                if self.quiet:
                    self._quiet_ray()
                try:
                    self._start_ray(ray)
                except BaseException:
                    self._restore_ray_logging()
                    raise
                finally:
                    self._retake_signals()  # ray.init installs its own SIGTERM handler (exit 15)
                self._ray_started = True
            self._remote = None  # made again in this Ray session at the first run

    def _start_ray(self, ray) -> None:
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        with warnings.catch_warnings():
            if self.quiet:
                warnings.simplefilter("ignore")
            if not self.address:
                ray.init(num_cpus=self.workers, **kw)
                return
            try:
                ray.init(address=self.address, **kw)
            except ConnectionError as e:  # the port answers but is no Ray head (or no "auto" one)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"cannot connect to the Ray cluster at {self.address} (Ray: {first})") from None

    def _quiet_ray(self) -> None:
        """Ray's own loggers (all under "ray", which `import ray` gives a stderr handler)
        pass errors only."""
        ray_logger = logging.getLogger("ray")
        self._ray_log_level = ray_logger.level
        ray_logger.setLevel(logging.ERROR)

    def _restore_ray_logging(self) -> None:
        if self._ray_log_level is not None:
            logging.getLogger("ray").setLevel(self._ray_log_level)
            self._ray_log_level = None

    def _take_signals(self) -> None:
        """SIGTERM raises `Terminated` while the backend is open, so that `__exit__` stops
        its workers as after Ctrl-C: the default action ended this process alone and left
        the pool's workers waiting for work forever. (Only the main thread can.)"""
        if threading.current_thread() is not threading.main_thread():
            return
        self._signalled = None
        self._handlers = {}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._sigint = signal.default_int_handler

            def interrupted(signum, frame):
                self._signalled = KeyboardInterrupt
                raise KeyboardInterrupt

            signal.signal(signal.SIGINT, interrupted)
            self._handlers[signal.SIGINT] = interrupted
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return  # a handler the program chose (a server's shutdown, one set outside Python) stays
        self._sigterm = signal.SIG_DFL

        def terminated(signum, frame):
            self._signalled = Terminated
            raise Terminated("terminated")

        signal.signal(signal.SIGTERM, terminated)
        self._handlers[signal.SIGTERM] = terminated

    def _retake_signals(self) -> None:
        """Put back the handlers `_take_signals` installed where a library replaced them
        (`ray.init` sets SIGTERM to its own, which exits 15 with a stack dump: a sweep
        ends with `llmsched: terminated` and 143, its workers stopped)."""
        for signum, handler in self._handlers.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)

    def _raise_if_signalled(self) -> None:
        if self._signalled is Terminated:
            raise Terminated("terminated")
        if self._signalled is not None:
            raise KeyboardInterrupt

    def _restore_signals(self) -> None:
        self._handlers = {}
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)
            self._sigint = None

    def _show_warnings(self, caught: list[tuple]) -> None:
        """The points' warnings, given here under this process's filters, each text once
        per backend (a warnings registry would not do: every `catch_warnings` clears it)."""
        for text, category, filename, lineno in caught:
            if (text, category) not in self._warned:
                self._warned.add((text, category))
                warnings.warn_explicit(text, category, filename, lineno)

    def _local_pool(self, jobs: int):
        """The process pool for a run of `jobs` jobs, None to run them inline: no more
        processes than jobs (a fork pool starts every worker at once), at most `workers`."""
        n = min(self.workers, jobs)
        if n <= 1 and self._pool is None:
            return None
        if self._pool is None or self._pool_size < n:
            if self._pool is not None:
                self._pool.shutdown()
            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),))
            self._pool_size = n
        return self._pool

    def _stop_workers(self) -> None:
        """Interrupted: the points still running are lost either way (a rerun resumes from
        the finished ones), so stop the pool's workers now, not when their points end."""
        workers = list((self._pool._processes or {}).values())
        manager = self._pool._executor_manager_thread  # (shutdown forgets it)
        # drop the cancelled points first: the pool's manager thread, seeing its
        # workers die, sets an exception on every pending item, and a cancelled
        # future raised InvalidStateError there (a traceback on Ctrl-C)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
        # a worker that outlives SIGTERM would wait forever on the call queue's lock,
        # which a terminated worker may have held, and the shutdown after this with it
        # (seen once under load, when a fork could run the sweep's handler): SIGKILL
        for worker in workers:
            worker.join(timeout=2)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=2)
        # the pool's manager thread closes its wake-up pipe once it sees the workers gone;
        # an exit while it had not yet printed `Exception ignored in: <module 'threading'>
        # ... OSError: [Errno 9] Bad file descriptor` (concurrent.futures' exit hook wrote
        # to the pipe as it closed)
        if manager is not None:
            manager.join(timeout=5)

    def __exit__(self, exc_type, exc, tb):
        try:
            if self._pool is not None:
                if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                    self._stop_workers()
                try:
                    self._pool.shutdown(cancel_futures=True)
                except KeyboardInterrupt:
                    # a Ctrl-C while waiting for the running points (after another error):
                    # the workers ignore SIGINT, and the exit would wait for them
                    self._stop_workers()
                    raise
                finally:
                    self._pool = None
                    self._pool_size = 0
            if self._ray_started:
                import ray  # noqa: PLC0415

                ray.shutdown()
                self._ray_started = False
            self._restore_ray_logging()
        finally:
            self._restore_signals()

    def run(self, jobs: list[tuple[str, Any]], fn: Callable[[Any], Any]):
        """Yield (key, fn(arg)) for every (key, arg) job, in the order they finish.
        `fn` must be importable by name (a module-level function such as `run_point`)."""
        if not jobs:
            return
        if self.kind == "ray":
            import ray  # noqa: PLC0415

            # the points' warnings come back with their results: a Ray worker's stderr
            # does not reach the driver (log_to_driver=False), so printed there they were lost
            if self._remote is None:
                self._remote = ray.remote(num_cpus=1)(_recording_warnings)
            refs = {self._remote.remote(fn, arg): key for key, arg in jobs}
            pending = list(refs)
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    for ref in done:
                        self._raise_if_signalled()
                        try:
                            result, caught = ray.get(ref)
                        except (
                            ray.exceptions.WorkerCrashedError,
                            ray.exceptions.OutOfMemoryError,
                            ray.exceptions.NodeDiedError,
                        ):
                            raise WorkerDied() from None  # (after Ray's own retries)
                        except ray.exceptions.RayTaskError as e:
                            # the point's own exception, as the local pool raises it: Ray's
                            # wrapper is also a ConfigError for one, whose text held the
                            # worker's traceback (a many-line "error" on the command line)
                            if isinstance(e.cause, Exception):
                                raise e.cause from None
                            raise
                        self._show_warnings(caught)
                        yield refs[ref], result
            except KeyboardInterrupt:
                # Ray's wait and get raise a plain KeyboardInterrupt for the Terminated that
                # the SIGTERM handler raised inside them (exit 130, "interrupted")
                self._raise_if_signalled()
                raise
        elif (pool := self._local_pool(len(jobs))) is not None:
            gc.freeze()  # forked workers then share the parent's heap without copying it
            try:
                with _stop_signals_blocked():  # (a fork pool starts its workers at the first submit)
                    futs = {pool.submit(_recording_warnings, fn, arg): key for key, arg in jobs}
            finally:
                gc.unfreeze()
            try:
                for f in as_completed(futs):
                    self._raise_if_signalled()
                    try:
                        result, caught = f.result()
                    except BrokenProcessPool:
                        # a worker killed (the OOM killer, kill -9) or crashed: every point
                        # still pending fails with it; a traceback told the user nothing
                        raise WorkerDied() from None
                    self._show_warnings(caught)
                    yield futs[f], result
            finally:
                for f in futs:
                    f.cancel()
        else:
            for key, arg in jobs:
                self._raise_if_signalled()
                result, caught = _recording_warnings(fn, arg)
                self._show_warnings(caught)
                yield key, result


#: What every summary of a finished run holds (`SimResult.summary`, a failed point's
#: `error` aside): a stored summary without them is damaged, not a run's result.
SUMMARY_KEYS = ("num_requests", "completed", "duration", "wall_s")


def _finished(record: dict) -> bool:
    """Whether a point's stored record holds a finished run's result, to be reused:
    its configuration and a summary of `SUMMARY_KEYS`, no error."""
    summary = record["summary"]
    return (
        isinstance(record["config"], dict)
        and isinstance(summary, dict)
        and "error" not in summary
        and all(k in summary for k in SUMMARY_KEYS)
    )


class Store:
    """Finished points: `OUT/points/KEY.json` (written whole, the moment a point
    finishes), or in memory only when there is no output folder."""

    def __init__(self, out_dir):
        self.dir = None if out_dir is None else Path(out_dir)
        self.mem: dict[str, dict] = {}
        if self.dir is not None:
            (self.dir / "points").mkdir(parents=True, exist_ok=True)
            remove_temporary_files(self.dir / "points")  # (a run killed while writing a record)

    def get(self, key: str) -> dict | None:
        """The point's record, None to simulate it: not run, failed, or its stored record
        damaged (unreadable, not this key's, no finished run's summary), which the run
        then writes again."""
        if key in self.mem:
            return self.mem[key]
        if self.dir is None:
            return None
        p = self.dir / "points" / f"{key}.json"
        if not p.is_file():
            return None
        rec = read_point_record(p)
        if rec is None or not _finished(rec):
            return None
        self.mem[key] = rec
        return rec

    def put(self, key: str, cfg: dict, summary: dict) -> dict:
        rec = {"key": key, "config": to_jsonable(cfg), "summary": summary}
        self.mem[key] = rec
        if self.dir is not None:
            text = json.dumps(rec, indent=1)
            # (whole or not at all; a link or hard link there is replaced, not written through)
            atomic_write(self.dir / "points" / f"{key}.json", lambda tmp: tmp.write_text(text), replace_entry=True)
        return rec


class Progress:
    """A rich progress bar on stderr, or nothing (`show` False)."""

    def __init__(self, show: bool, description: str):
        self.bar = None
        if not show:
            return
        from rich.console import Console  # noqa: PLC0415
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: PLC0415
        from rich.progress import Progress as Bar  # noqa: PLC0415

        self.bar = Bar(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task(description, total=0)
        self.bar.start()

    def add(self, total: int, done: int = 0) -> None:
        if self.bar is not None:
            t = self.bar.tasks[0]
            self.bar.update(self.task, total=(t.total or 0) + total, completed=t.completed + done)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=n, **({"description": description} if description else {}))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class Runner:
    """Shared by grid sweeps, searches and the counterexample search: skip finished
    points, run the others on the backend with `point_fn` (default `run_point`), store
    them. `run(cfgs)` returns one record {"key", "config", "summary"} per config."""

    def __init__(
        self, backend: Backend, store: Store, progress: Progress, point_fn: Callable[[dict], dict] = run_point
    ):
        self.backend, self.store, self.progress = backend, store, progress
        self.point_fn = point_fn
        self.ran = 0
        self.skipped = 0
        self.errors = 0
        self._returned: set[str] = set()  # keys already run or found by this runner

    def run(self, cfgs: list) -> list[dict]:
        keys = [point_key(c) for c in cfgs]
        todo: dict[str, dict] = {}
        cached = 0
        for k, c in zip(keys, cfgs):
            if self.store.get(k) is not None:
                cached += 1
                # a point found finished counts once: a search probing a rate again
                # (the SLO search's first probe) reuses its own run, not an earlier sweep's
                if k not in self._returned:
                    self.skipped += 1
            elif k not in todo:
                todo[k] = c.to_dict()
            self._returned.add(k)
        self.progress.add(len(cfgs), cached)
        dup = len(cfgs) - cached - len(todo)
        if dup:
            self.progress.advance(dup)
        try:
            self._run(todo)
        except WorkerDied as e:
            if self.store.dir is None:
                raise
            kept = self.store.dir / "points"
            raise ConfigError(f"{e}; the finished points are kept in {kept}: rerun to resume") from None
        return [self.store.get(k) or self.store.mem.get(k) for k in keys]

    def _run(self, todo: dict[str, dict]) -> None:
        for key, summary in self.backend.run(list(todo.items()), self.point_fn):
            self.store.put(key, todo[key], summary)
            self.ran += 1
            if "error" in summary:
                self.errors += 1
            self.progress.advance()
