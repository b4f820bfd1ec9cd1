"""The YAML files a user writes (a configuration, a network, a serverless platform) are
read by one function: a key given twice in one mapping is refused (PyYAML kept the last
silently: a second `platform:` section replaced the first), as are a folder and bad YAML."""

import os

import pytest
from helpers import one_line_error

import llmsched
from llmsched.core.errors import ConfigError
from llmsched.core.yamlfile import read_yaml

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("b_max: 256\nworkload:\n  rate: 3\n  rate: 4\n")
    with pytest.raises(
        ConfigError, match=r"^config file '.*c.yaml': 'rate' is given twice in one mapping \(lines 3 and 4\)$"
    ):
        read_yaml(f, "config")
    # the same key in two mappings, anchors and merges are fine
    f.write_text("a: &x {rate: 3}\nb: {<<: *x, rate: 4}\nc: {rate: 5}\n")
    assert read_yaml(f, "config") == {"a": {"rate": 3}, "b": {"rate": 4}, "c": {"rate": 5}}


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["simulate", "--config", "{f}", "--out", ""], "config"),
        (["sweep", "--config", "{f}", "--grid", "seed=0", "--out", "{d}"], "config"),
        (["capacity", "--config", "{f}"], "config"),
        (["simulate", "--network", "{f}", "--out", ""], "network"),
        (["simulate", "--serverless", "{f}", "--out", ""], "serverless"),
    ],
)
def test_a_file_without_settings_is_refused(tmp_path, capsys, text, argv, what):
    """An empty or comment-only --config ran every default silently (capacity printed a
    report of the default workload); a serverless file said "missing section 'cluster'"."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    argv = [a.format(f=f, d=tmp_path / "out") for a in argv]
    one_line_error(capsys, argv, f"{what} file '{f}' holds no settings")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="holds no settings"):
        read_yaml(f, what)


def test_folders_missing_files_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        read_yaml(tmp_path, "network")
    with pytest.raises(ConfigError, match="does not exist"):
        read_yaml(tmp_path / "no.yaml", "network")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="^serverless file .* is not valid YAML: ") as e:
        read_yaml(tmp_path / "bad.yaml", "serverless")
    assert "\n" not in str(e.value)


def test_a_pipe_reads_as_a_file_and_a_device_is_named(tmp_path):
    """`--config <(...)` in a shell names a pipe (/dev/fd/63): it was "does not exist";
    /dev/null too, though it exists."""
    import threading

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w") as f:
            f.write("workload:\n  rate: 3\n")

    writer = threading.Thread(target=write, daemon=True)  # (never left blocked on a pipe no one reads)
    writer.start()
    try:
        assert read_yaml(fifo, "config") == {"workload": {"rate": 3}}
    finally:
        writer.join(timeout=10)
    with pytest.raises(ConfigError, match="^config file '/dev/null' is not a file"):
        read_yaml("/dev/null", "config")


@pytest.mark.parametrize(
    "flag, example, section",
    [
        ("--serverless", os.path.join("serverless", "small.yaml"), "platform"),
        ("--network", os.path.join("networks", "tandem.yaml"), "jobs"),
    ],
)
def test_every_command_file_refuses_a_repeated_section(capsys, tmp_path, flag, example, section):
    text = open(os.path.join(EXAMPLES, example)).read()
    assert f"\n{section}:" in text
    f = tmp_path / "twice.yaml"
    f.write_text(text + f"\n{section}: {{}}\n")
    one_line_error(capsys, ["simulate", flag, str(f), "--out", ""], f"'{section}' is given twice")
    c = tmp_path / "c.yaml"
    c.write_text("b_max: 256\nb_max: 512\n")
    one_line_error(capsys, ["simulate", "--config", str(c), "--out", ""], "'b_max' is given twice", "lines 1 and 2")


def test_a_plain_number_with_an_exponent_is_a_number(tmp_path):
    # YAML 1.1 (PyYAML's) reads 1e6 as a string; YAML 1.2 and JSON read it as a number
    f = tmp_path / "c.yaml"
    f.write_text("a: 1e6\nb: 2.5e-3\nc: -1E+2\nd: .5e1\ne: '1e6'\nf: 1e\ng: 12\nh: 1.5\ni: e5\n")
    assert read_yaml(f, "config") == {
        "a": 1e6,
        "b": 2.5e-3,
        "c": -100.0,
        "d": 5.0,
        "e": "1e6",
        "f": "1e",
        "g": 12,
        "h": 1.5,
        "i": "e5",
    }


@pytest.mark.parametrize(
    "top, workload, named",
    [
        ({"b_max": "512"}, {}, "b_max must be a positive integer, got '512'"),
        ({"k_max": "16"}, {}, "k_max must be a positive integer"),
        ({"kv_capacity": "100000"}, {}, "kv_capacity must be a positive integer"),
        ({"max_running": "8"}, {}, "max_running must be a positive integer"),
        ({}, {"rate": "5"}, "arrival rate (requests per second) must be a number, got '5'"),
        ({}, {"arrival": {"process": "gamma", "cv": "2"}}, "cv (coefficient"),
        ({}, {"time_scale": "2"}, "time_scale must be a number"),
        ({}, {"num_requests": "50"}, "num_requests must be a whole number >= 1, got '50'"),
        ({}, {"duration_s": "10"}, "duration_s must be a number"),
        ({}, {"seed": "3"}, "seed must be a whole number >= 0, got '3'"),
        ({}, {"system_prompt": "100"}, "system_prompt must be a whole number of tokens"),
        ({}, {"turns": "const:2", "think_time_s": "5"}, "think_time_s must be a number"),
        ({}, {"classes": [{"tag": "a", "share": "2"}]}, "share of class 'a' must be a number"),
        ({}, {"classes": [{"tag": "a", "system_prompt": "20"}]}, "system_prompt of class 'a'"),
    ],
)
def test_a_config_refuses_a_number_in_quotes_as_a_network_file_does(capsys, tmp_path, top, workload, named):
    """A YAML string is text: `rate: "5"` ran at 5 req/s (and `b_max: "512"` at 512) where a
    network or serverless file refuses it naming the key; now a configuration refuses it too."""
    import json

    wl = {"num_requests": 50, "rate": 2, "prompt": "const:10", "output": "const:5", **workload}
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({"cost_model": "paper", **top, "workload": wl}))  # (JSON is YAML)
    one_line_error(capsys, ["simulate", "--config", str(f), "--out", ""], named, "(a number in quotes")
    with pytest.raises(ConfigError, match=r"must be .*, got '"):  # and so does Python (a keyword or the mapping)
        llmsched.simulate(cost_model="paper", **top, workload=wl)
