"""Flag audit of `capacity`, `sweep` and `reproduce`: what a flag cannot do is refused
with one line and exit 2, never ignored (and `--workers` is bounded)."""

import pytest

from llmsched.analysis.runner import MAX_WORKERS, Backend
from llmsched.cli import main
from llmsched.core.errors import ConfigError

SWEEP = ["sweep", "--cost-model", "paper", "--prompt", "const:20", "--output", "const:5", "--num-requests", "20"]


def refused(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert msg in err, err


# -- 1. --workers is bounded, and a pool has no more processes than jobs ---------------------


@pytest.mark.parametrize("cmd", ["sweep", "capacity", "reproduce"])
def test_absurd_workers_are_refused_before_any_work(capsys, tmp_path, cmd):
    out = str(tmp_path / "o")
    argv = {
        "sweep": [*SWEEP, "--grid", "seed=0", "--out", out],
        "capacity": ["capacity", "--cost-model", "paper", "--k-max", "16", "--find-counterexample"],
        "reproduce": ["reproduce", "stability", "--quick", "--out", out],
    }[cmd]
    refused(capsys, [*argv, "--workers", "100000"], f"--workers must be at most {MAX_WORKERS}")
    assert not (tmp_path / "o").exists()


def test_a_pool_has_no_more_processes_than_jobs():
    with pytest.raises(Exception, match="at most"):
        Backend("local", MAX_WORKERS + 1)
    with Backend("local", 64) as be:
        assert be._pool is None  # nothing forked before there are jobs
        assert sorted(v for _, v in be.run([("a", -1), ("b", -2)], abs)) == [1, 2]
        assert be._pool_size == 2 and be._pool._max_workers == 2
        assert [v for _, v in be.run([("c", -3)], abs)] == [3]  # the pool is reused
        assert be._pool_size == 2


# -- 2. a fixed flag the grid also sets is refused, not overridden ---------------------------


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--grid", "seed=0", "--seed", "3"], "--seed and --grid seed=... both set each point's seed: give one"),
        (["--grid", "policy=orca", "--policy", "vllm"], "--policy and --grid policy=... both set each point's policy"),
        (["--grid", "b_max=256", "--b-max", "1024"], "--b-max and --grid b_max=... both set each point's b_max"),
        (["--grid", "rate=1,2", "--rate", "3"], "--rate and --grid rate=... both set each point's rate"),
        (["--grid", "load=0.5", "--rate", "3"], "--rate and --grid load=... both set each point's rate"),
    ],
)
def test_a_fixed_flag_the_grid_sets_is_refused(capsys, tmp_path, extra, msg):
    refused(capsys, [*SWEEP, "--out", str(tmp_path / "o"), *extra], msg)
    assert not (tmp_path / "o").exists()


# -- 3. a value repeated in one grid key is refused ------------------------------------------


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("seed=0,0", "grid seed: the value 0 is given twice"),
        ("policy=orca,sarathi,orca", "grid policy: the value 'orca' is given twice"),
        ("seed=1:1:3", "grid seed: the value 1 is given twice"),
        # the same value spelt another way (JSON does not read 00 or +2: they were strings)
        ("seed=0,00", "grid seed: the value 0 is given twice"),
        ("b_max=512,0512", "grid b_max: the value 512 is given twice"),
        ("rate=2,+2", "grid rate: the value 2 is given twice"),
        ("policy=orca,ORCA", "grid policy: the value 'ORCA' is the same value as 'orca'"),
        ("policy=sarathi,sarathi-serve", "grid policy: the value 'sarathi-serve' is the same value as 'sarathi'"),
        ("admission=fcfs,FCFS", "grid admission: the value 'FCFS' is the same value as 'fcfs'"),
        # a whole float is the integer (seed=1.0 ran as its own point, keyed apart from 1)
        ("seed=1,1.0", "grid seed: the value 1 is given twice"),
        # the paper model with its defaults written out is the paper model: two equal runs
        ("cost_model=paper:c=11.28,a=35.47|paper", "grid cost_model: the value 'paper' is the same model as 'paper:"),
        ("cost_model=const:10|linear:c=10,a=0", "grid cost_model: the value 'linear:c=10,a=0' is the same model as"),
        # `profile` is the default profile, the kind in any case
        (
            "cost_model=profile|profile:h200-llama-3-8b",
            "the value 'profile:h200-llama-3-8b' is the same model as 'profile'",
        ),
        (
            "cost_model=Profile:h200-llama-3-8b|profile:h200-llama-3-8b",
            "is the same model as 'Profile:h200-llama-3-8b'",
        ),
        # an SLO mapping in another key order, with a whole float, or by an alias (each ran
        # twice, or one row twice under one key)
        ("slo={ttft_ms: 100, tpot_ms: 50}|{tpot_ms: 50, ttft_ms: 100}", "grid slo: the value {'tpot_ms': 50"),
        ("slo={ttft_ms: 100}|{ttft_ms: 100.0}", "grid slo: the value {'ttft_ms': 100.0} is given twice"),
        ("slo={ttft: 100}|{ttft_ms: 100}", "grid slo: the value {'ttft_ms': 100} is the same value as {'ttft': 100}"),
        ("policy_options={a: 1, b: 2}|{b: 2, a: 1}", "grid policy_options: the value {'b': 2, 'a': 1} is given"),
        ("admission_options={a: 1}|{a: 1.0}", "grid admission_options: the value {'a': 1.0} is given twice"),
    ],
)
def test_a_repeated_grid_value_is_refused(capsys, tmp_path, spec, msg):
    refused(capsys, [*SWEEP, "--out", str(tmp_path / "o"), "--grid", spec], msg)


def test_a_repeated_grid_value_is_refused_in_a_mapping_too():
    from llmsched.analysis.grid import parse_grid

    with pytest.raises(ConfigError, match="grid rate: the value 1.0 is given twice"):
        parse_grid({"rate": [1.0, 2.0, 1.0]})
    assert parse_grid({"seed": [0, 1]}) == {"seed": [0, 1]}
    # numbers JSON does not read are numbers still, not strings stored in the points
    assert parse_grid(["seed=00,7", "rate=+2,1.,.5", "b_max=0512"]) == {
        "seed": [0, 7],
        "rate": [2, 1.0, 0.5],
        "b_max": [512],
    }
    assert parse_grid(["policy=orca:x=1,orca"]) == {"policy": ["orca:x=1", "orca"]}  # options make another value
    assert parse_grid(["seed=1_0,2", "rate=1_000.5"]) == {"seed": [10, 2], "rate": [1000.5]}  # as Python reads them
    # an integer option's whole floats are ints, stored and keyed as the same point's
    assert parse_grid({"seed": [1.0, 2], "b_max": [512.0], "rate": [2.0]}) == {
        "seed": [1, 2],
        "b_max": [512],
        "rate": [2.0],
    }
    assert type(parse_grid(["seed=3.0"])["seed"][0]) is int
    assert parse_grid(["cost_model=paper|paper:c=12"]) == {"cost_model": ["paper", "paper:c=12"]}


# -- 4-6. capacity refuses what it would ignore -------------------------------------------

CAP = ["capacity", "--cost-model", "paper"]
MEANS = ["--mean-prompt", "100", "--mean-output", "10"]


@pytest.mark.parametrize("line", ["kv_capacity: 1000", "max_running: 3", "admission: twp"])
def test_capacity_refuses_what_the_config_sets_and_it_does_not_model(capsys, tmp_path, line):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(line + "\n")
    refused(capsys, [*CAP, "--config", str(cfg), *MEANS], f"sets {line.split(':')[0]}: capacity's bounds do not")


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--mean-prompt", "100", "--prompt", "const:5"], "--mean-prompt and --prompt both give the prompt lengths"),
        (["--mean-output", "10", "--output", "const:5"], "--mean-output and --output both give the output lengths"),
        ([*MEANS, "--lengths", "sharegpt"], "--mean-prompt and --lengths both give the prompt lengths"),
        ([*MEANS, "--samples", "10"], "--samples sets the draws of the means"),
        ([*MEANS, "--seed", "5"], "--seed sets the draws of the means"),
        ([*MEANS, "--num-requests", "10"], "--num-requests sets the runs of --find-counterexample"),
        ([*MEANS, "--duration", "10"], "--duration cuts a replayed trace"),
        (["--lengths", ""], "--lengths: give a CSV file or a dataset name"),
        ([*MEANS, "--plot", ""], "--plot: give a file name"),
        # what simulate refuses (capacity reported as if they were fine)
        ([*MEANS, "--policy", "foo"], "unknown batch policy 'foo'"),
        ([*MEANS, "--arrival", "foo"], "unknown arrival process 'foo'"),
        (["--prompt", "geometric:200", "--output", "geometric:100", "--cv", "3"], "cv=3.0 applies to gamma"),
        ([*MEANS, "--rate", "5", "--arrival", "poisson:3"], "rate given twice"),
        ([*MEANS, "--system-prompt", "1000"], "a system prompt adds to the workload's prompts"),
    ],
)
def test_capacity_refuses_moot_workload_flags(capsys, extra, msg):
    refused(capsys, [*CAP, *extra], msg)


def test_capacity_refuses_a_folder_as_the_plot(capsys, tmp_path):
    refused(capsys, [*CAP, *MEANS, "--plot", str(tmp_path)], "is a folder: give a file name")
    assert not tmp_path.with_name(tmp_path.name + ".png").exists()


# -- 7. reproduce ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--address", "1.2.3.4:6379"], "--address is a Ray cluster's: give --backend ray"),
        (["--policies", ""], "--policies: give comma-separated policy names, got ''"),
        (["--policies", "orca,orca"], "--policies: 'orca' is given twice"),
        (["--no-search", "--seeds", "0,1"], "--seeds: with --no-search give one seed"),
    ],
)
def test_reproduce_refuses_what_it_would_ignore_or_repeat(capsys, tmp_path, extra, msg):
    refused(capsys, ["reproduce", "stability", "--quick", "--out", str(tmp_path / "r"), *extra], msg)
    assert not (tmp_path / "r").exists()


def test_reproduce_help_says_what_seeds_sets(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    assert "the queue runs use the first" in " ".join(capsys.readouterr().out.split())


def test_reproduce_help_states_each_experiments_num_requests_default(capsys):
    """--num-requests stated no default, and it differs per experiment: the help's are the code's."""
    from llmsched.analysis import reproduce, reproduce_twp
    from llmsched.analysis.reproduce_networks import NUM_JOBS

    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    (synthetic, *_), (sharegpt, *_), (azure, *_) = (reproduce.SIZES[w] for w in ("synthetic", "sharegpt", "azure"))
    assert sharegpt == azure
    for words in (
        f"stability: requests per queue run, and per search probe unless --search-requests (default {synthetic:,} "
        f"synthetic, {sharegpt:,} sharegpt and azure)",
        f"clusters: jobs per replica (default {NUM_JOBS['clusters']:,})",
        f"agents: jobs per run (default {NUM_JOBS['agents']:,})",
        f"rybko-stolyar: jobs per run (default {NUM_JOBS['rybko-stolyar']:,})",
        f"twp: requests per run (default {reproduce_twp.SIZES['full'][0]:,})",
    ):
        assert words in text, words


def test_prompt_help_and_the_readme_name_every_length_law(capsys):
    """`replay:PATH[:COLUMN]` and `azure-conv` were read but named in neither."""
    from pathlib import Path

    from llmsched.workload.lengths import LAW_NAMES

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    workloads = " ".join(readme[readme.index("## Workloads") :].split("\n## ")[0].split())
    for law in LAW_NAMES:
        assert law in help_text, law
        assert f"`{law}" in workloads, law


# -- a sweep's grid keys take the flags' aliases ----------------------------------------------


def test_a_grid_key_may_be_any_alias_of_the_flag(capsys, tmp_path):
    """`--grid max-num-batched-tokens=256,512` was an unknown grid key though the flag
    --max-num-batched-tokens is --b-max's alias: every flag with aliases (the parser's,
    from the one OPTION_ALIASES mapping) names the same grid key by each of its names."""
    from llmsched.analysis.grid import parse_grid
    from llmsched.cli import build_parser

    sweep = build_parser("sweep")._subparsers._group_actions[0].choices["sweep"]
    group = next(g for g in sweep._action_groups if g.title == "scheduler")
    names = [a.option_strings for a in group._group_actions if len(a.option_strings) > 1]
    assert ["--b-max", "--max-num-batched-tokens"] in names and len(names) >= 5
    value = {"--policy": "sarathi", "--admission-option": "{a: 1}", "--prefix-caching": "true"}
    for flags in names:
        v = value.get(flags[0], "256")
        keys = [list(parse_grid([f"{f[2:]}={v}"])) for f in flags]
        assert all(k == keys[0] for k in keys), (flags, keys)
    out = tmp_path / "sw"
    argv = [*SWEEP, "--grid", "max-num-batched-tokens=256,512", "--out", str(out), "--quiet", "--no-plots"]
    assert main(argv) == 0
    assert main([*SWEEP, "--grid", "b_max=256,512", "--out", str(out), "--json", "--no-plots"]) == 0
    assert '"skipped": 2' in capsys.readouterr().out  # the same two points
    # the message names both spellings: "policy given twice" alone, for scheduler= and
    # policy=, left the user looking for a second policy= that is not there
    twice = "grid key 'policy' given twice (as 'scheduler' and 'policy')"
    refused(capsys, [*SWEEP, "--grid", "scheduler=orca", "--grid", "policy=vllm"], twice)
    assert "(as" not in str(pytest.raises(ConfigError, parse_grid, ["b_max=1", "b_max=2"]).value)
    twice = "grid key 'b_max' given twice (as 'max_num_batched_tokens' and 'b-max')"
    assert str(pytest.raises(ConfigError, parse_grid, {"max_num_batched_tokens": [1], "b-max": [2]}).value) == twice


def test_a_grid_key_may_be_any_simulate_flags_spelling(capsys, tmp_path):
    """`--grid max-time=1,2` was an unknown grid key `max_time`: the flags whose option is
    named otherwise (max_time_s, duration_s, ...) were not grid keys by their spelling."""
    from llmsched.cli.analysis import _grid_in_option_keys

    given = ["max-time=1,2", "duration=3", "think-time=1", "sample-interval=0.01", "steps=true", "b-max=64"]
    assert _grid_in_option_keys(given) == [
        "max_time_s=1,2",
        "duration_s=3",
        "think_time_s=1",
        "sample_interval_s=0.01",
        "record_steps=true",
        "b-max=64",
    ]
    out = tmp_path / "sw"
    assert main([*SWEEP, "--grid", "max-time=1,2", "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert main([*SWEEP, "--grid", "max_time_s=1,2", "--out", str(out), "--json", "--no-plots"]) == 0
    assert '"skipped": 2' in capsys.readouterr().out  # the same two points
    refused(capsys, [*SWEEP, "--grid", "exact=true", "--out", str(out)], "grid fast=false (as --exact)")
    refused(capsys, [*SWEEP, "--grid", "out=a", "--out", str(out)], "unknown grid key 'out'")


def test_grid_specs_keep_their_comma_separated_options():
    """`cost_model=paper:c=1,a=2` was split into `paper:c=1` and a point `a=2` (an unknown
    cost model); a KEY=VALUE piece belongs to the spec before it."""
    from llmsched.analysis.grid import parse_grid

    g = parse_grid(["cost_model=paper:c=1,a=2,const:5", "arrival=poisson,gamma:rate=5,cv=2"])
    assert g["cost_model"] == ["paper:c=1,a=2", "const:5"]
    assert g["arrival"] == ["poisson", "gamma:rate=5,cv=2"]
    assert parse_grid(["cost_model=paper,const:5"])["cost_model"] == ["paper", "const:5"]
