"""TWP and DynamicBatch pace to the user's ITL objective (`slo={"itl_ms": ...}`, or
`tpot_ms`, the same limit) under every spelling of their names, unless their own
`itl_target_ms` is given."""

import json

import pytest

import llmsched
from llmsched.cli import main


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


# ---- DynamicBatch takes the same target (docs/twp.md: "the same target as TWP, for a
# like-for-like comparison"), and tpot_ms is the same limit as itl_ms (core/slo.py)


def _admission(r) -> dict:
    return r.config["scheduler"]["admission"]


@pytest.mark.parametrize("name", ["dynamicbatch", "DynamicBatch", "dynamic-batch"])
def test_the_slo_is_dynamicbatchs_target_too(name):
    r = llmsched.simulate(num_requests=50, rate=5, admission=name, slo={"itl_ms": 37}, seed=1)
    assert _admission(r)["itl_target_ms"] == 37
    assert _target(r) == 37  # the target in use, recorded in config.json


def test_dynamicbatch_records_its_default_target_and_an_explicit_one_wins():
    r = llmsched.simulate(num_requests=50, rate=5, admission="dynamicbatch", seed=1)
    resolved = _admission(r)["resolved"]
    assert resolved["itl_target_ms"] == pytest.approx(1.5 * resolved["l_min_ms"])  # 1.5 l_min
    assert "itl_target_ms" not in _admission(r)  # not an option given
    r = llmsched.simulate(
        num_requests=50,
        rate=5,
        admission="dynamicbatch",
        admission_options={"itl_target_ms": 21},
        slo={"itl_ms": 37},
        seed=1,
    )
    assert _target(r) == 21


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_tpot_ms_is_the_same_limit_and_with_both_the_smaller_binds(admission):
    r = llmsched.simulate(num_requests=50, rate=5, admission=admission, slo={"tpot_ms": 33}, seed=1)
    assert _target(r) == 33
    for slo in ({"itl_ms": 40, "tpot_ms": 33}, {"itl": 33, "tpot": 40}):
        # a request meets both only within the smaller: that is the limit to pace to
        assert _target(llmsched.simulate(num_requests=50, rate=5, admission=admission, slo=slo, seed=1)) == 33


def test_a_running_cap_keeps_the_target():
    r = llmsched.simulate(num_requests=50, rate=5, admission="dynamicbatch", max_running=8, slo={"itl_ms": 37}, seed=1)
    assert _target(r) == 37 and _admission(r)["max_running"] == 8


@pytest.mark.parametrize("admission", ["twp", "dynamicbatch"])
def test_the_cli_slo_sets_the_target_in_config_json(tmp_path, admission):
    out = tmp_path / admission
    argv = ["simulate", "--admission", admission, "--slo", "itl_ms=15", "--num-requests", "50", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    adm = json.loads((out / "config.json").read_text())["scheduler"]["admission"]
    assert adm["itl_target_ms"] == 15 and adm["resolved"]["itl_target_ms"] == 15
    out = tmp_path / f"{admission}-explicit"
    assert main([*argv, "--admission-option", "itl_target_ms=25", "--out", str(out)]) == 0
    adm = json.loads((out / "config.json").read_text())["scheduler"]["admission"]
    assert adm["itl_target_ms"] == 25 and adm["resolved"]["itl_target_ms"] == 25


def test_a_registered_admission_that_takes_an_itl_target_gets_the_slo():
    """The SLO sets `itl_target_ms` of any admission that takes one (its factory's
    parameter), not only of the two built in; one without it is left alone."""
    from llmsched.policies import ADMISSION_POLICIES, AdmissionPolicy, register_admission_policy

    got = {}

    class Paced(AdmissionPolicy):
        name = "paced-test"

        def __init__(self, itl_target_ms=None):
            got["target"] = itl_target_ms

    class Plain(AdmissionPolicy):
        name = "plain-test"

    register_admission_policy("paced-test", Paced)
    register_admission_policy("plain-test", Plain)
    try:
        llmsched.simulate(num_requests=20, rate=5, admission="paced-test", slo={"itl_ms": 37}, seed=1)
        assert got["target"] == 37
        llmsched.simulate(num_requests=20, rate=5, admission="plain-test", slo={"itl_ms": 37}, seed=1)  # no error
    finally:
        ADMISSION_POLICIES.pop("paced-test", None)
        ADMISSION_POLICIES.pop("plain-test", None)
