"""SIGTERM to a `--backend ray` sweep ends it as one on the local backend: exit 143 and
`llmsched: terminated` (docs/stability.md), not Ray's exit 15 and its stack dump: ray.init
replaced the SIGTERM handler the backend had installed before it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from llmsched.analysis.runner import Backend
from llmsched.core.errors import Terminated


class _RayThatTakesSigterm:
    """A stand-in for the ray module whose init installs a SIGTERM handler as Ray 2.60's
    does (`sigterm_handler`: sys.exit(signum))."""

    def __init__(self):
        self.started = False

    def is_initialized(self):
        return self.started

    def init(self, **kw):
        def sigterm_handler(signum, frame):
            sys.exit(signum)

        signal.signal(signal.SIGTERM, sigterm_handler)
        self.started = True

    def shutdown(self):
        self.started = False


@pytest.fixture
def shell_signals():
    """The handlers a command line starts with; the test's own put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_the_backend_keeps_its_sigterm_handler_after_ray_init(monkeypatch, shell_signals):
    monkeypatch.setitem(sys.modules, "ray", _RayThatTakesSigterm())
    with pytest.raises((KeyboardInterrupt, SystemExit)) as e, Backend("ray", 1):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the handler runs here
    assert e.type is Terminated  # (Ray's handler: SystemExit(15))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back at exit


class _RayWaitInterrupted(_RayThatTakesSigterm):
    """...whose wait, as Ray's, turns the exception a signal handler raised inside it into
    a plain KeyboardInterrupt (`check_status`: an interrupted status)."""

    def remote(self, **kw):
        class Fn:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                return args

        return Fn

    def wait(self, pending, num_returns=1):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)  # the handler runs here
        except BaseException:
            raise KeyboardInterrupt from None
        raise AssertionError("no signal")


def test_sigterm_inside_ray_wait_stays_terminated(monkeypatch, shell_signals):
    monkeypatch.setitem(sys.modules, "ray", _RayWaitInterrupted())
    with pytest.raises(KeyboardInterrupt) as e, Backend("ray", 1) as backend:
        list(backend.run([("a", 1.0)], abs))
    assert e.type is Terminated  # (the CLI exits 143, not 130 "interrupted")


def _signals_as_a_shell_gives() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_sigterm_to_a_ray_sweep_exits_143(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "s"
    argv = [sys.executable, "-m", "llmsched.cli", "sweep", "--cost-model", "paper", "--prompt", "geometric:200"]
    argv += ["--output", "geometric:101", "--num-requests", "20000", "--no-plots", "--workers", "1"]
    argv += ["--backend", "ray", "--grid", "policy=sarathi,orca,vllm,kfcfs", "--out", str(out)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_signals_as_a_shell_gives
    )
    try:
        deadline = time.monotonic() + 120
        while not list((out / "points").glob("*.json")):  # Ray is up and runs the points
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        err = proc.stderr.read()
        assert err.strip().endswith("llmsched: terminated")
        assert "SIGTERM received" not in err
    finally:
        proc.kill()
        proc.wait()
