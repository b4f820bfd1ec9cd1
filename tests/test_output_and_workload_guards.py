"""Guards a review of the workload and output side asked for: a folder of the user's own
files named like outputs is not overwritten, steps.csv reads as every output does, length
laws and system prompts stay within the longest length a trace holds, and block ids are
built only for a prefix cache."""

import os
import stat

import numpy as np
import pytest
from helpers import one_line_error

from llmsched import simulate
from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec, make_trace
from llmsched.workload.csvio import MAX_LENGTH
from llmsched.workload.lengths import parse_length_law


def test_a_folder_of_files_named_like_outputs_without_a_summary_is_refused(tmp_path, capsys):
    """`--out d` with the user's own requests.csv and steps.csv in d overwrote the first and
    deleted the second (a stale output)."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "requests.csv").write_text("my,precious\n1,2\n")
    (d / "steps.csv").write_text("notes\n")
    argv = ["simulate", "--cost-model", "const:1", "--num-requests", "5", "--quiet", "--out", str(d)]
    one_line_error(capsys, argv, "holds 'requests.csv' but no 'summary.json'", "a single-server simulation writes last")
    assert (d / "requests.csv").read_text() == "my,precious\n1,2\n" and (d / "steps.csv").exists()
    # a run's own folder is replaced as before
    run = tmp_path / "run"
    simulate(cost_model="const:1", num_requests=5, out_dir=str(run))
    simulate(cost_model="const:1", num_requests=6, out_dir=str(run))
    assert (run / "summary.json").is_file()


def test_steps_csv_has_the_mode_of_every_other_output(tmp_path):
    out = tmp_path / "o"
    simulate(cost_model="const:1", num_requests=5, record_steps=True, out_dir=str(out))
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in out.iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes  # steps.csv was 0600 (mkstemp's)


def test_lengths_stay_within_what_a_trace_holds():
    # (a mean the cap cuts by over 1% is refused: geometric:2e8 passes 2^30 one draw in 200)
    law = parse_length_law("geometric:2e8", "prompt")
    x = law.sample(np.random.default_rng(3), 2000)
    assert x.max() == MAX_LENGTH  # it drew 1,194,984,381 tokens: a run whose requests.csv replays refused
    spec = WorkloadSpec.from_dict(
        {"prompt": "const:1073741824", "output": "const:2", "system_prompt": MAX_LENGTH, "num_requests": 3, "rate": 1}
    )
    with pytest.raises(ConfigError, match="with its system prompt has 2,147,483,648 tokens"):
        make_trace(spec)


def test_block_ids_only_for_a_prefix_cache():
    """A shared system prompt built every prompt's block ids even without a cache to read
    them (833 MB and 3 s for 2,000 requests of 100,000 tokens)."""
    spec = {"prompt": "const:5", "system_prompt": 100_000, "output": "const:2", "num_requests": 2000, "rate": 0.5}
    assert make_trace(WorkloadSpec.from_dict(spec), blocks=False).block_ids is None
    assert make_trace(WorkloadSpec.from_dict(spec), 16).block_ids is not None
    r = simulate(
        cost_model="const:1",
        b_max=1 << 20,
        prompt="const:5",
        system_prompt=100_000,
        output="const:2",
        num_requests=200,
        rate=0.5,
    )
    assert r.summary["completed"] == 200


@pytest.mark.parametrize(
    "text, message",
    [
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6,7\n", "line 3 has 4 fields but the header names 3"),
        ('arrival_s,prompt_tokens,output_tokens,tag\n0,10,5,"a,b"\n1,1,500,60,x\n', "line 3 has 5 fields"),
        ("arrival_s,prompt_tokens,output_tokens,arrival_s\n0,10,5,1\n", "column 'arrival_s' twice"),
    ],
)
def test_a_trace_row_with_more_fields_than_its_header_is_refused(tmp_path, capsys, text, message):
    """numpy read the named columns by position and dropped the rest: `1,1,500,60` (a
    thousands separator) ran as prompt 1, output 500."""
    f = tmp_path / "t.csv"
    f.write_text(text)
    one_line_error(capsys, ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""], message)


def test_trailing_empty_fields_are_still_read(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5,\n1,20,6,,\n")
    assert simulate(trace=str(f), cost_model="const:1").summary["completed"] == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--rate", "1e300", "--num-requests", "5", "--cost-model", "const:1", "--out", ""],
        ["capacity", "--rate", "1e300", "--cost-model", "paper"],
        [
            "simulate",
            "--network",
            os.path.join(os.path.dirname(__file__), "..", "examples", "networks", "agent_dag.yaml"),
            "--scale",
            "1e300",
            "--out",
            "",
        ],
    ],
)
def test_a_rate_past_one_request_a_nanosecond_is_refused(capsys, argv):
    """They ran and printed rates and loads of 300 digits."""
    one_line_error(capsys, argv, "at most 1e+09 requests per second")


def test_a_trace_past_the_clock_names_its_file(tmp_path, capsys):
    """The error named neither the file nor the cause, after a warning about the rate."""
    f = tmp_path / "far.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n2000000000,20,6\n")
    line = one_line_error(capsys, ["simulate", "--trace", str(f), "--cost-model", "const:1", "--out", ""], "far.csv")
    assert "are they in seconds" in line
    r = simulate(trace=str(f), time_scale=1000, cost_model="const:1")  # rescaled, it fits the clock
    assert r.summary["completed"] == 3
