"""`llmsched sweep --backend ray --address`: an address nothing answers at is one line on
stderr and exit 2 within seconds, not a hang in Ray's connection retries."""

import json
import logging
import socket
import sys
import time
import warnings

import pytest

from llmsched.analysis import runner
from llmsched.analysis.runner import Backend, probe_ray_address, ray_endpoint
from llmsched.cli import main
from llmsched.core.errors import ConfigError


def closed_port() -> int:
    """A localhost port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep_argv(tmp_path, address):
    return ["sweep", "--cost-model", "paper", "--num-requests", "30", "--grid", "rate=1", "--no-plots"] + [
        "--out",
        str(tmp_path / "s"),
        "--backend",
        "ray",
        "--address",
        address,
    ]


def test_an_unreachable_ray_address_fails_fast(tmp_path, capsys):
    address = f"127.0.0.1:{closed_port()}"
    t0 = time.perf_counter()
    assert main(sweep_argv(tmp_path, address)) == 2
    assert time.perf_counter() - t0 < 60  # Ray alone retries for minutes: this is the hang guard
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach the Ray cluster at {address}" in err[0], err
    assert not (tmp_path / "s").exists()  # no output folder for a sweep that never ran


def test_a_silent_ray_address_times_out_before_ray_init(tmp_path, capsys, monkeypatch):
    import ray  # a test dependency (make install-test)

    def black_hole(address, timeout):  # what a firewalled or absent host does
        assert timeout == runner.RAY_CONNECT_TIMEOUT_S
        raise TimeoutError

    def no_init(*a, **kw):
        raise AssertionError("ray.init was called for an address that does not answer")

    monkeypatch.setattr(runner.socket, "create_connection", black_hole)
    monkeypatch.setattr(ray, "init", no_init)
    assert main(sweep_argv(tmp_path, "10.255.255.1:6379")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"llmsched sweep: error: cannot reach the Ray cluster at 10.255.255.1:6379: "
        f"no answer in {runner.RAY_CONNECT_TIMEOUT_S:g} s"
    ]


@pytest.mark.parametrize(
    "address, endpoint",
    [
        ("10.0.0.1:6379", ("10.0.0.1", 6379)),
        ("head.example:6380", ("head.example", 6380)),
        ("[::1]:6379", ("::1", 6379)),
        ("ray://head.example", ("head.example", 10001)),
        ("ray://head.example:10002", ("head.example", 10002)),
        ("auto", None),
        ("local", None),
    ],
)
def test_ray_endpoint(address, endpoint):
    assert ray_endpoint(address) == endpoint


@pytest.mark.parametrize("address", ["head", "head:", "head:port", ":6379", "head:70000", "ray://", "[::1]"])
def test_bad_ray_addresses(address, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--address must be HOST:PORT"):
        ray_endpoint(address)
    assert main(sweep_argv(tmp_path, address)) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_probe_names_the_address():
    with pytest.raises(ConfigError, match=r"^cannot reach the Ray cluster at 127\.0\.0\.1:\d+: "):
        probe_ray_address(f"127.0.0.1:{closed_port()}", timeout_s=1.0)


class _ChattyRay:
    """A stand-in for the ray module whose start says what Ray 2.60's does (a notice on
    a logger under "ray", a Python warning) and an error, or fails."""

    def __init__(self, fail=False):
        self.fail, self.started = fail, False

    def is_initialized(self):
        return self.started

    def init(self, **kw):
        log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        log.warning("Token authentication is enabled for this Ray cluster.")
        warnings.warn("a start-up warning", UserWarning, stacklevel=1)
        log.error("a real problem")
        if self.fail:
            raise RuntimeError("no Ray today")
        self.started = True

    def shutdown(self):
        logging.getLogger("ray._private.worker").warning("shutting down")
        self.started = False


@pytest.mark.parametrize("quiet", [True, False])
def test_a_quiet_ray_start_passes_only_errors(monkeypatch, quiet):
    said = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    collect = Collect()
    ray_logger.addHandler(collect)
    monkeypatch.setitem(sys.modules, "ray", _ChattyRay())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Backend("ray", 1, quiet=quiet):
                pass
            assert ray_logger.level == level  # given back at exit
            monkeypatch.setitem(sys.modules, "ray", _ChattyRay(fail=True))
            with pytest.raises(RuntimeError, match="no Ray today"):
                Backend("ray", 1, quiet=quiet).__enter__()
            assert ray_logger.level == level  # and when the start fails
    finally:
        ray_logger.removeHandler(collect)
    if quiet:
        assert said == ["a real problem", "a real problem"] and not caught
    else:
        assert said.count("Token authentication is enabled for this Ray cluster.") == 2
        assert "shutting down" in said and len(caught) == 2


def test_sweep_quiet_on_a_local_ray_prints_nothing(tmp_path, capfd):
    """`sweep --backend ray --quiet` printed Ray's token-authentication notice."""
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "30", "--grid", "rate=1,2", "--no-plots"]
    argv += ["--out", str(tmp_path / "s"), "--backend", "ray", "--workers", "1", "--quiet"]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    points = [json.loads(p.read_text()) for p in (tmp_path / "s" / "points").glob("*.json")]
    assert sorted(p["config"]["workload"]["rate"] for p in points) == [1, 2]
    assert all(p["summary"]["completed"] == 30 for p in points)


def test_a_ray_sweep_shows_each_point_warning_once(tmp_path, capfd):
    """A point's warning was printed in its Ray worker, whose stderr does not reach the
    driver: a gamma run whose rate spreads past 25% warned under the local pool and said
    nothing under Ray. It comes back with the result and is shown once for three points."""
    argv = ["sweep", "--cost-model", "paper", "--num-requests", "100", "--arrival", "gamma", "--cv", "10"]
    argv += ["--grid", "seed=0,1,2", "--no-plots", "--out", str(tmp_path / "s"), "--backend", "ray", "--workers", "2"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "gamma arrivals of cv 10" in ln]
    assert len(lines) == 1, err
    assert len(list((tmp_path / "s" / "points").glob("*.json"))) == 3
