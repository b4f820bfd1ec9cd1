"""TWP paces to the user's ITL objective (`slo={"itl_ms": ...}`) under every spelling of its
name, unless its own `itl_target_ms` is given."""

import pytest

import llmsched


def _target(r) -> float | None:
    return r.config["scheduler"]["admission"]["resolved"]["itl_target_ms"]


@pytest.mark.parametrize("name", ["twp", "TWP", "token-window-pacing", " Twp "])
def test_the_slo_is_twps_target_whatever_its_spelling(name):
    r = llmsched.simulate(num_requests=50, rate=5, admission=name, slo={"itl_ms": 37}, seed=1)
    assert _target(r) == 37


def test_an_explicit_target_wins_over_the_slo():
    r = llmsched.simulate(
        num_requests=50, rate=5, admission="TWP", admission_options={"itl_target_ms": 21}, slo={"itl_ms": 37}, seed=1
    )
    assert _target(r) == 21


def test_without_an_itl_objective_the_target_is_twps_default():
    default = _target(llmsched.simulate(num_requests=50, rate=5, admission="twp", seed=1))
    assert default is not None and default != 37
    assert _target(llmsched.simulate(num_requests=50, rate=5, admission="TWP", slo={"ttft_ms": 37}, seed=1)) == default
