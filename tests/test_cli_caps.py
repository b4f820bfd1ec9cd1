"""Upper bounds and "given" checks of the command line: a 0 is a given value, huge finite
numbers are one-line errors (not OverflowError tracebacks), and their messages stay short."""

from __future__ import annotations

import math

import pytest
from helpers import one_line_error

from llmsched.core.errors import ConfigError
from llmsched.policies import make_scheduler
from llmsched.sim.virtual import VirtualEngine


def test_capacity_refuses_a_load_of_0_without_find_counterexample(capsys):
    """--load 0 exited 0 (0.0 == False passed the `not in (None, False)` test)."""
    argv = ["capacity", "--mean-prompt", "100", "--mean-output", "100", "--load", "0"]
    one_line_error(capsys, argv, "--load is an option of --find-counterexample")


def test_reproduce_clusters_refuses_a_load_of_0(capsys, tmp_path):
    argv = ["reproduce", "clusters", "--quick", "--load", "0", "--out", str(tmp_path / "r")]
    one_line_error(capsys, argv, "--load is an option of", "not of `reproduce clusters`")
    assert not (tmp_path / "r").exists()


def test_is_given():
    from llmsched.cli.common import is_given

    assert [is_given(v) for v in (None, False, 0, 0.0, "", True, 1)] == [False, False, True, True, True, True, True]


@pytest.mark.parametrize("grid", ["b_max=1e308", "b_max=1e308:1e308:1", "k_max=1e20"])
def test_sweep_grid_huge_integer_key_is_short(capsys, tmp_path, grid):
    """b_max=1e308 printed an integer of 309 digits, twice."""
    err = one_line_error(capsys, ["sweep", "--grid", grid, "--out", str(tmp_path / "s")], "grid point", "e+")
    assert len(err) < 200, err


def test_sweep_grid_keeps_whole_numbers_as_integers():
    from llmsched.analysis.grid import parse_grid

    g = parse_grid(["b_max=256.0,1e3", "seed=1e20", "num_requests=2:4:2"])
    assert g["b_max"] == [256, 1000] and all(type(v) is int for v in g["b_max"])
    assert g["seed"] == [10**20] and type(g["seed"][0]) is int  # any integer is a seed (as before)
    assert g["num_requests"] == [2, 4]
    assert type(parse_grid(["b_max=1e308"])["b_max"][0]) is float


def test_turns_cap_message_does_not_say_tokens(capsys):
    err = one_line_error(
        capsys, ["simulate", "--turns", "geometric:1e9", "--out", ""], "--turns", "capped at 1,073,741,824"
    )
    assert "tokens" not in err, err


@pytest.mark.parametrize("value", ["inf", "1e308", "1.1e12"])
def test_serve_sim_max_debt_has_an_upper_bound(capsys, value):
    """inf and 1e308 ended in an OverflowError traceback (int(max_debt_s * NS))."""
    argv = ["serve", "--backend", "sim", "--port", "0", "--sim-max-debt-ms", value]
    one_line_error(capsys, argv, "--sim-max-debt-ms must be at most 1e+12 ms")


@pytest.mark.parametrize("value", [math.inf, 1e308, math.nan, -1.0, "1", True])
def test_virtual_engine_refuses_bad_max_debt(value):
    with pytest.raises(ConfigError, match="max_debt_s"):
        VirtualEngine(make_scheduler("sarathi", b_max=64), "const:10", realtime=False, max_debt_s=value)


def test_virtual_engine_takes_the_largest_max_debt():
    core = VirtualEngine(make_scheduler("sarathi", b_max=64), "const:10", realtime=False, max_debt_s=1e9)
    assert core.max_debt_ns == 10**18
