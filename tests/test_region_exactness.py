"""What the batch-size-cap region claims: `region_exact` only where chunk integrality
cannot bind, a mean prompt of 1 token as every prompt of 1 token, and lambda* that never
falls as k_max is relaxed (docs/stability.md, "The batch-size cap: a two-dimensional
region")."""

import json

import pytest

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.theory import capacity, stability_region

T128, T200 = 0.04675, 0.08222  # paper model: t(128) and t(200) = t(256)


def run_json(capsys, *argv):
    assert main(["capacity", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_request_per_step_cannot_cut_prompts_into_the_regions_chunks(capsys, monkeypatch):
    """k_max 1, prompts of 200 tokens, outputs of 1: the region's only prefill vertex is
    (128, 0), so lambda* = 128 / t(128) / 200 = 13.69 req/s, said exact. A step holds one
    request, so a prompt takes 128 + 72 (two steps of t(128)) or one step of 200 tokens
    (t(200) = 82.22 ms): no policy serves more than 1 / t(200) = 12.16 req/s."""
    argv = ["--cost-model", "paper", "--k-max", "1", "--prompt", "const:200", "--output", "const:1"]
    r = run_json(capsys, *argv)
    c = r["capacity"]
    assert c["critical_rate"] == pytest.approx(128 / T128 / 200)
    assert c["critical_rate"] > 1 / T200 * 1.12  # the bound no policy reaches
    assert c["region_exact"] is False and "chunk integrality" in c["region_note"]
    assert "(128, 0)" in c["region_note"] and "200-token prompts" in c["region_note"]
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["capacity", *argv]) == 0
    assert "note: region" in capsys.readouterr().out


def test_whole_prompts_in_every_step_of_the_face_are_exact():
    """Prompts of 100, outputs of 2, k_max 2: the ray leaves the region at (100, 1), one
    whole prompt and one decode in a step of t(128): 21.39 req/s, which policies reach."""
    r = capacity("paper", 512, 100, 2, k_max=2, max_prefill_per_request=100)
    assert r.critical_rate == pytest.approx(1 / T128) and r.region_exact is True and r.region_note is None


def test_varying_prompts_or_an_unknown_longest_prompt_are_an_upper_bound():
    assert capacity("paper", 512, 100, 2, k_max=2).region_exact is False  # any prompt length
    assert capacity("paper", 512, 100, 2, k_max=2, max_prefill_per_request=300).region_exact is False
    assert capacity("paper", 512, 100, 2, k_max=2, max_prefill_per_request=100, cached_prompt=10).region_exact is False
    # a spare slot takes any cut of the prompt stream: (512, 0) touches at most 3 prompts of 300
    r = capacity("paper", 512, 300, 1, k_max=3, max_prefill_per_request=300)
    assert r.region_exact is True and r.critical_rate == pytest.approx(512 / 0.15316 / 300)
    # with 2 slots the region's (384, 0) needs 3: an upper bound
    assert capacity("paper", 512, 200, 1, k_max=2, max_prefill_per_request=200).region_exact is False
    assert capacity("paper", 512, 200, 101).region_exact is None  # no cap, no region


def test_the_note_names_only_the_steps_short_of_slots():
    """k_max 16, prompts of 700, outputs of 2: the ray leaves the region on the face of
    (512, 0) and (497, 15). (512, 0) has 16 slots for the at most 2 prompts its window
    touches; (497, 15) has 1 for 2. The note named both; only (497, 15) cuts too much."""
    r = capacity("paper", 512, 700, 2, k_max=16, max_prefill_per_request=700)
    assert r.region_exact is False
    assert "(497, 15)" in r.region_note and "(512, 0)" not in r.region_note
    assert "step (497, 15)" in r.region_note and "700-token prompts" in r.region_note
    # k_max 2: (512, 0) has the 2 slots its cut needs, (511, 1) one for 2
    r = capacity("paper", 512, 700, 2, k_max=2, max_prefill_per_request=700)
    assert "(511, 1)" in r.region_note and "(512, 0)" not in r.region_note
    # both steps short: both named
    r = capacity("paper", 512, 100, 2, k_max=3, max_prefill_per_request=100)
    assert "steps (127, 1), (100, 2)" in r.region_note


def test_the_exit_face_names_the_steps_lambda_star_time_shares():
    reg = stability_region("paper", 512, 16)
    assert sorted(reg.exit_face(200, 100)) == [(0, 16), (113, 15)]
    assert reg.exit_face(1, 0) == [(512, 0)]
    assert reg.exit_face(0, 0) == []


def test_a_mean_prompt_of_one_token_is_every_prompt_of_one_token(capsys):
    """--mean-prompt 1 --mean-output 1 --k-max 1 printed 3,342.9 req/s (one request
    supplying 512 prefill tokens a step), --prompt const:1 21.39 (one token a step)."""
    base = ["--cost-model", "paper", "--k-max", "1"]
    given = run_json(capsys, *base, "--mean-prompt", "1", "--mean-output", "1")
    drawn = run_json(capsys, *base, "--prompt", "const:1", "--output", "const:1")
    assert given["capacity"]["critical_rate"] == pytest.approx(drawn["capacity"]["critical_rate"])
    assert given["capacity"]["critical_rate"] == pytest.approx(1 / T128)
    assert given["largest_prompt"] == 1


@pytest.mark.parametrize("k_max", [511, 512, None])
def test_lambda_star_of_a_profile_does_not_fall_when_the_cap_is_relaxed(capsys, k_max):
    """H200 profile, means 1000/200: --k-max 511 gave 23.947 req/s (the LP over step
    shapes), --k-max 512 and none 23.664 (one mixed step at b_max). With the means timed
    as a constant-length mix (2026-12-03): 23.218 for all three, the LP's 23.421 at 511
    and 23.424 at 512 and none."""
    argv = ["--mean-prompt", "1000", "--mean-output", "200", *(["--k-max", str(k_max)] if k_max else [])]
    c = run_json(capsys, *argv)["capacity"]
    assert c["critical_rate"] == pytest.approx(23.218, abs=5e-4)
    assert c["shape_bound_rate"] == pytest.approx(23.421 if k_max == 511 else 23.424, abs=5e-4)


def test_a_given_mean_prompt_keeps_its_last_token_uncached(capsys):
    """--mean-prompt 1 --cached-fraction 0.99 gave 1.01 tokens of work, --prompt const:1 2.0:
    the last prompt token is always computed (it emits output token 1)."""
    base = ["--cost-model", "paper", "--mean-output", "2", "--cached-fraction", "0.99"]
    given = run_json(capsys, *base, "--mean-prompt", "1")["capacity"]
    drawn = run_json(capsys, "--cost-model", "paper", "--prompt", "const:1", "--output", "const:2",
                     "--cached-fraction", "0.99")["capacity"]  # fmt: skip
    assert given["work_per_request"] == drawn["work_per_request"] == 2.0
    # a long prompt: the fraction itself (below the cap)
    long = run_json(capsys, *base, "--mean-prompt", "1000")["capacity"]
    assert long["cached_prompt_per_request"] == pytest.approx(990.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mean_prompt": 0.5}, r"mean prompt and mean output must be >= 1 token, got 0.5"),
        ({"max_prefill_per_request": 50, "k_max": 4}, r"longest prompt, 50\) must be at least the mean prompt \(200\)"),
        ({"max_prefill_per_request": 1.5, "k_max": 4}, r"max_prefill_per_request .* whole number of tokens >= 1"),
        ({"max_prefill_per_request": True, "k_max": 4}, r"max_prefill_per_request .* whole number of tokens >= 1"),
        ({"max_prefill_per_request": 0}, r"max_prefill_per_request .* whole number of tokens >= 1"),
    ],
)
def test_the_python_capacity_refuses_what_the_command_line_refuses(kwargs, match):
    args = {"mean_prompt": 200, "mean_output": 5, **kwargs}
    with pytest.raises(ConfigError, match=match):
        capacity("paper", 512, **args)


def test_adaptive_is_given_lambda_star_as_its_limit_only_where_the_region_is_exact(capsys):
    """k_max 1, prompts of 200: adaptive runs the region's (128, 0) steps, 128 + 72 a
    prompt, and served 10.69 req/s of a lambda* of 13.69 (Sarathi's one 200-token step per
    prompt: 12.15); no limit is claimed for it there."""
    argv = ["--cost-model", "paper", "--k-max", "1", "--output", "const:1", "--policy", "adaptive"]
    assert run_json(capsys, *argv, "--prompt", "const:200")["policy_critical_rate"] is None
    exact = run_json(capsys, "--cost-model", "paper", "--k-max", "2", "--prompt", "const:100", "--output",
                     "const:2", "--policy", "adaptive")  # fmt: skip
    assert exact["policy_critical_rate"] == pytest.approx(exact["capacity"]["critical_rate"]) == pytest.approx(1 / T128)
    import llmsched

    s = llmsched.simulate(
        cost_model="paper", k_max=1, prompt="const:200", output="const:1", policy="adaptive", rate=13.0,
        num_requests=600,
    ).summary  # fmt: skip
    assert s["critical_rate"] == pytest.approx(128 / T128 / 200) and s["policy_critical_rate"] is None
