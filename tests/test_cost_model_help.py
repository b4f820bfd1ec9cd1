"""The engine commands' --cost-model help names the policies that read step times by the
flag and the name each takes."""

from __future__ import annotations

import re

import pytest

from llmsched.cli import build_parser
from llmsched.policies import ADMISSION_POLICIES, BATCH_POLICIES


def _help(command: str, option: str) -> str:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if a.choices and command in a.choices).choices[command]
    (action,) = [a for a in sub._actions if option in a.option_strings]
    return " ".join(action.help.split())


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_cost_model_help_names_policies_by_the_flag_that_takes_them(command):
    # generate's help listed "adaptive, twp, dynamic" as policies: `--policy twp` is refused
    # (twp and dynamicbatch are admission policies) and no policy is called dynamic
    text = _help(command, "--cost-model")
    assert "--policy adaptive" in text and "--admission twp or dynamicbatch" in text
    assert "adaptive" in BATCH_POLICIES and {"twp", "dynamicbatch"} <= set(ADMISSION_POLICIES)
    assert not re.search(r"\bdynamic\b", text)
