"""Tests of llmsched.workload: arrivals, length laws, traces, the spec layer and its errors."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from helpers import FULL_TRACES, TRACES, one_line_error

from llmsched.cli import main
from llmsched.core.errors import ConfigError
from llmsched.workload import (
    Constant,
    Deterministic,
    Empirical,
    Gamma,
    Geometric,
    Lognormal,
    Poisson,
    Trace,
    Uniform,
    WorkloadSpec,
    load_trace,
    make_trace,
    parse_length_law,
    read_azure_csv,
    read_trace,
    resolve_dataset,
)
from llmsched.workload import datasets as ds
from llmsched.workload.csvio import MAX_LENGTH

AZURE = TRACES / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT = TRACES / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
ARXIV = TRACES / "arxiv_lengths" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"


def _rows(path):
    with open(path) as fh:
        return sum(1 for _ in fh) - 1


def _cv(x):
    return x.std() / x.mean()


def _file_columns(path, a, b):
    v = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(a, b))
    return v[:, 0], v[:, 1]


# ------------------------------------------------------------------------- arrivals
def test_poisson_interarrival_mean_and_cv():
    n, rate = 200_000, 4.0
    t = Poisson(rate).times(np.random.default_rng(1), n)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) == n and t[0] > 0 and np.all(gaps >= 0)
    # sd of the sample mean is (1/rate)/sqrt(n) ~ 0.00056: 5 sd tolerance
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / np.sqrt(n)
    assert abs(_cv(gaps) - 1.0) < 0.02


def test_poisson_count_in_duration():
    rate, T = 50.0, 400.0
    t = Poisson(rate).times(np.random.default_rng(2), duration_s=T)
    assert t[-1] <= T
    assert abs(len(t) - rate * T) < 5 * np.sqrt(rate * T)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv_matches(cv):
    n, rate = 200_000, 2.0
    gaps = np.diff(Gamma(rate, cv).times(np.random.default_rng(3), n), prepend=0.0)
    assert abs(gaps.mean() * rate - 1) < 0.03 * cv
    assert abs(_cv(gaps) / cv - 1) < 0.05


def test_gamma_cv1_is_exponential_like():
    gaps = np.diff(Gamma(3.0, 1.0).times(np.random.default_rng(4), 100_000), prepend=0.0)
    assert abs(_cv(gaps) - 1) < 0.02


def test_deterministic_spacing():
    t = Deterministic(4.0).times(None, 1000)
    assert np.allclose(np.diff(t), 0.25, rtol=0, atol=1e-12)
    assert t[0] == pytest.approx(0.25)
    assert len(Deterministic(4.0).times(None, duration_s=10.0)) == 40
    spec = WorkloadSpec(arrival="deterministic", rate=2, duration_s=5, prompt=8, output=8)
    tr = make_trace(spec)
    assert len(tr) == 10 and tr.arrival_s[-1] == pytest.approx(5.0)


def test_deterministic_duration_past_the_count(capsys):
    # duration_s * rate overflowed math.floor (OverflowError); 1e20 at rate 3 stepped k one
    # by one through a float's rounding
    assert np.allclose(Deterministic(10.0).times(None, 10, 1e308), np.arange(1, 11) / 10.0)
    assert len(Deterministic(3.0).times(None, 10, 1e20)) == 10
    assert len(Deterministic(4.0).times(None, 1000, 10.0)) == 40
    with pytest.raises(ConfigError, match="duration_s=1e\\+308 at rate 10.0 gives more than 1.8e\\+308 requests"):
        Deterministic(10.0).times(None, None, 1e308)
    argv = ["simulate", "--arrival", "deterministic", "--rate", "10", "--duration", "1e308", "--num-requests", "10"]
    assert main([*argv, "--prompt", "const:10", "--output", "const:5", "--cost-model", "paper", "--quiet"]) == 0
    assert main([*argv[:-2], "--cost-model", "paper", "--quiet"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("process", [Poisson(10.0), Gamma(10.0, 2.0), Deterministic(10.0)], ids=repr)
def test_request_limit_errors_read_the_same_for_every_arrival_process(process):
    with pytest.raises(ConfigError, match="^num_requests=20,000,001 exceeds the limit of 20,000,000$"):
        process.times(np.random.default_rng(0), 20_000_001)
    with pytest.raises(ConfigError, match="^num_requests=1e\\+300 exceeds the limit of 20,000,000$"):
        process.times(np.random.default_rng(0), 10**300)
    over = "^duration_s=1000000000.0 at rate 10.0 gives about 10,000,000,000 requests, over the limit of 20,000,000$"
    with pytest.raises(ConfigError, match=over):
        process.times(np.random.default_rng(0), None, 1e9)
    with pytest.raises(ConfigError, match=over):
        process.times(np.random.default_rng(0), 10**12, 1e9)


def test_num_requests_and_duration_whichever_first():
    base = dict(arrival="deterministic", rate=10, prompt="const:5", output="const:7")
    assert len(make_trace(WorkloadSpec(**base, num_requests=30, duration_s=100))) == 30
    assert len(make_trace(WorkloadSpec(**base, num_requests=3000, duration_s=2))) == 20
    # time_scale on a synthetic process multiplies the rate; duration is in the scaled clock
    fast = make_trace(WorkloadSpec(**base, duration_s=2, time_scale=3))
    assert len(fast) == 60 and fast.arrival_s[-1] == pytest.approx(2.0)


# ------------------------------------------------------------------------- determinism
def _spec(**kw):
    d = dict(
        arrival="poisson",
        rate=5.0,
        prompt="lognormal:mean=800,sigma=1",
        output="geometric:200",
        num_requests=5000,
        seed=7,
    )
    d.update(kw)
    return WorkloadSpec(**d)


def test_seed_reproduces_and_differs():
    a, b = make_trace(_spec()), make_trace(_spec())
    assert a == b
    c = make_trace(_spec(seed=8))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt, c.prompt)


def test_rate_or_process_change_keeps_lengths():
    a = make_trace(_spec())
    for other in (_spec(rate=50.0), _spec(arrival="gamma", cv=3.0), _spec(arrival="deterministic")):
        b = make_trace(other)
        assert not np.array_equal(a.arrival_s, b.arrival_s)
        assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.output, b.output)


def test_lengths_are_prefix_stable_with_duration():
    a = make_trace(_spec(num_requests=None, duration_s=100.0))
    b = make_trace(_spec(num_requests=None, duration_s=100.0, rate=20.0))
    m = min(len(a), len(b))
    assert len(b) > 2 * len(a)
    assert np.array_equal(a.prompt[:m], b.prompt[:m])
    assert np.array_equal(a.output[:m], b.output[:m])


def test_changing_output_law_keeps_prompts():
    a = make_trace(_spec())
    b = make_trace(_spec(output="uniform:1,10"))
    assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.arrival_s, b.arrival_s)


# ------------------------------------------------------------------------- Azure trace
def test_azure_parse():
    t0 = time.perf_counter()
    tr = read_azure_csv(AZURE)
    assert time.perf_counter() - t0 < 1.5
    assert len(tr) == _rows(AZURE)
    assert tr.arrival_s[0] == 0.0
    assert np.all(np.diff(tr.arrival_s) >= 0)
    if FULL_TRACES:  # the figures of shared/traces/README.md
        assert len(tr) == 19_366 and 5.3 < tr.mean_rate < 5.7
    # first rows: 18:15:46.6805900 374,44 then 18:15:50.9951690 396,109
    assert tr.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert (tr.prompt[0], tr.output[0], tr.prompt[1], tr.output[1]) == (374, 44, 396, 109)
    fp, fo = _file_columns(AZURE, 1, 2)
    assert tr.prompt.mean() == pytest.approx(np.maximum(fp, 1).mean())
    assert tr.output.mean() == pytest.approx(np.maximum(fo, 1).mean())
    if FULL_TRACES:
        assert tr.prompt.mean() == pytest.approx(1155, abs=1)
        assert tr.output.mean() == pytest.approx(211, abs=1)
    assert read_trace(AZURE) == tr  # format detected from the header


def test_azure_replay_spec_and_time_scaling():
    whole = make_trace(WorkloadSpec(arrival="azure-conv"))
    assert len(whole) == _rows(AZURE)
    fast = make_trace(WorkloadSpec(arrival=f"trace:{AZURE}", time_scale=4))
    assert np.allclose(fast.arrival_s, whole.arrival_s / 4)
    assert np.array_equal(fast.prompt, whole.prompt)
    assert fast.mean_rate == pytest.approx(4 * whole.mean_rate)
    # rate rescales to a target mean rate
    r = make_trace(WorkloadSpec(trace="azure-conv", rate=20.0))
    assert r.mean_rate == pytest.approx(20.0)
    # duration is in the scaled clock; num_requests cuts first
    part = make_trace(WorkloadSpec(arrival="azure-conv", time_scale=2, duration_s=600))
    assert part.arrival_s[-1] <= 600 and len(part) == np.sum(whole.arrival_s / 2 <= 600)
    assert len(make_trace(WorkloadSpec(arrival="azure-conv", num_requests=100))) == 100


def test_trace_lengths_overridden_by_law_and_vice_versa():
    whole = load_trace("azure-conv")
    tr = make_trace(WorkloadSpec(arrival="azure-conv", prompt="const:100", num_requests=500))
    assert np.all(tr.prompt == 100)
    assert np.array_equal(tr.output, whole.output[:500])
    assert np.array_equal(tr.arrival_s, whole.arrival_s[:500])
    # arrivals from a process, lengths replayed in trace order
    tr2 = make_trace(
        WorkloadSpec(
            arrival="poisson", rate=2, num_requests=500, prompt="replay:azure-conv", output="replay:azure-conv"
        )
    )
    assert np.array_equal(tr2.prompt, whole.prompt[:500])
    assert np.array_equal(tr2.output, whole.output[:500])


# ------------------------------------------------------------------------- length laws
def test_simple_length_laws():
    rng = np.random.default_rng(0)
    assert np.all(parse_length_law("const:512").sample(rng, 10) == 512)
    assert parse_length_law(64) == Constant(64)
    u = parse_length_law("uniform:16,32").sample(rng, 20_000)
    assert u.min() == 16 and u.max() == 32 and u.dtype == np.int64
    g = parse_length_law("geometric:256").sample(rng, 200_000)
    assert g.min() >= 1 and abs(g.mean() / 256 - 1) < 0.02
    assert np.all(parse_length_law("geometric:1").sample(rng, 100) == 1)
    ln = parse_length_law("lognormal:mean=1000,sigma=1.0").sample(rng, 200_000)
    assert ln.min() >= 1 and abs(ln.mean() / 1000 - 1) < 0.03
    lc = parse_length_law("lognormal:mean=500,cv=0.5").sample(rng, 200_000)
    assert abs(_cv(lc) / 0.5 - 1) < 0.05
    clip = parse_length_law("lognormal:mean=1000,sigma=2,max=3000").sample(rng, 10_000)
    assert clip.max() == 3000 and clip.min() >= 1


@pytest.mark.parametrize(
    "text",
    [
        "const:512",
        "uniform:16,2048",
        "geometric:mean=256",
        "geometric:mean=256,max=4096",
        "lognormal:mean=1000,sigma=1",
        "lognormal:mean=1000,cv=1.5,max=8192",
    ],
)
def test_law_string_round_trip(text):
    law = parse_length_law(text)
    assert law.to_str() == text
    assert parse_length_law(law.to_str()) == law


def test_law_mapping_and_alt_forms():
    assert parse_length_law({"law": "lognormal", "mean": 1000, "sigma": 1}) == Lognormal(1000, sigma=1)
    assert parse_length_law("uniform:lo=3,hi=9") == Uniform(3, 9)
    assert parse_length_law("geometric:mean=10,max=50") == Geometric(10, max=50)


def test_empirical_sharegpt_means():
    fp, fo = _file_columns(SHAREGPT, 0, 1)
    tr = make_trace(
        WorkloadSpec(arrival="poisson", rate=1, num_requests=60_000, prompt="sharegpt", output="sharegpt", seed=3)
    )
    # 6 standard errors
    assert abs(tr.prompt.mean() - fp.mean()) < 6 * fp.std() / np.sqrt(60_000)
    assert abs(tr.output.mean() - np.maximum(fo, 1).mean()) < 6 * fo.std() / np.sqrt(60_000)
    # explicit path and column give the same law as the named dataset's default column
    law = parse_length_law(f"empirical:{SHAREGPT}:num_decode_tokens")
    assert law.expected() == pytest.approx(fo.mean())


def test_joint_sampling_keeps_pairs():
    fp, fo = _file_columns(ARXIV, 0, 1)
    pairs = set(zip(fp.astype(int).tolist(), np.maximum(fo, 1).astype(int).tolist()))
    tr = make_trace(WorkloadSpec(arrival="poisson", rate=1, num_requests=20_000, prompt="arxiv", output="arxiv"))
    assert all(p in pairs for p in zip(tr.prompt.tolist(), tr.output.tolist()))
    file_corr = np.corrcoef(fp, fo)[0, 1]  # about -0.46
    assert abs(np.corrcoef(tr.prompt, tr.output)[0, 1] - file_corr) < 0.05
    # different files: independent draws, no correlation
    ind = make_trace(
        WorkloadSpec(arrival="poisson", rate=1, num_requests=20_000, prompt="arxiv", output=f"empirical:{SHAREGPT}")
    )
    assert abs(np.corrcoef(ind.prompt, ind.output)[0, 1]) < 0.05


# ------------------------------------------------------------------------- classes
def test_class_mix():
    spec = WorkloadSpec.from_dict(
        {
            "arrival": "poisson",
            "rate": 10,
            "num_requests": 20_000,
            "prompt": "const:100",
            "output": "const:10",
            "classes": [{"tag": "chat", "share": 0.7}, {"tag": "summ", "share": 0.3, "prompt": "uniform:1000,2000"}],
        }
    )
    tr = make_trace(spec)
    chat = tr.tag == "chat"
    assert abs(chat.mean() - 0.7) < 0.02
    assert np.all(tr.prompt[chat] == 100) and np.all(tr.output == 10)
    assert tr.prompt[~chat].min() >= 1000 and tr.tag.dtype.kind == "U"
    assert tr.describe()["tags"]["chat"] == int(chat.sum())


@pytest.mark.parametrize("replicas", [None, "2"])
def test_class_shares_near_the_float_limit_draw_as_equal_shares(tmp_path, replicas, capsys):
    """Two shares of 1e308 overflowed their sum: one server's draw was a numpy traceback,
    --replicas ran each class at rate 0 (refused as 'arrival rate ... got 0.0')."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload:\n  num_requests: 400\n  classes: [{tag: a, share: 1e308}, {tag: b, share: 1e308}]\n")
    argv = ["simulate", "--config", str(cfg), "--cost-model", "paper", "--out", "", "--json"]
    assert main([*argv, *(["--replicas", replicas] if replicas else [])]) == 0
    huge = json.loads(capsys.readouterr().out)
    cfg.write_text("workload:\n  num_requests: 400\n  classes: [{tag: a, share: 1}, {tag: b, share: 1}]\n")
    assert main([*argv, *(["--replicas", replicas] if replicas else [])]) == 0
    even = json.loads(capsys.readouterr().out)
    huge.pop("wall_s"), even.pop("wall_s")
    assert huge == even  # the same draws as equal shares


# ------------------------------------------------------------------------- files
def test_csv_round_trip(tmp_path):
    tr = make_trace(_spec(num_requests=2000))
    p = tmp_path / "t.csv"
    tr.to_csv(p)
    assert p.read_text().splitlines()[0] == "arrival_s,prompt_tokens,output_tokens"
    back = Trace.from_csv(p)
    assert back == tr and back.tag is None
    tagged = tr.with_tags(np.where(tr.prompt > 800, "long", "short"))
    tagged.to_csv(p)
    assert read_trace(p) == tagged
    again = make_trace(WorkloadSpec(arrival=f"trace:{p}"))
    assert again == tagged


def test_plain_csv_unsorted_rows_are_sorted(tmp_path):
    p = tmp_path / "u.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n2.0,5,6\n\n1.0,7,8\n")
    tr = read_trace(p)
    assert tr.arrival_s.tolist() == [1.0, 2.0] and tr.prompt.tolist() == [7, 5]


def test_spec_dict_round_trip():
    spec = WorkloadSpec(
        arrival="gamma:rate=3,cv=2",
        prompt="uniform:10,20",
        output="geometric:5",
        duration_s=50,
        seed=11,
        classes=[{"tag": "a", "share": 1}, {"tag": "b", "share": 2, "output": "const:9"}],
    )
    d = spec.to_dict()
    assert d["arrival"] == "gamma" and d["rate"] == 3 and d["cv"] == 2
    again = WorkloadSpec.from_dict(d)
    assert again.to_dict() == d
    assert make_trace(again) == make_trace(spec) == make_trace(d)


def test_million_requests_cheap():
    t0 = time.perf_counter()
    tr = make_trace(
        WorkloadSpec(
            arrival="poisson", rate=100, num_requests=1_000_000, prompt="geometric:500", output="uniform:1,100"
        )
    )
    assert time.perf_counter() - t0 < 3.0
    assert len(tr) == 1_000_000
    assert tr.arrival_s.nbytes + tr.prompt.nbytes + tr.output.nbytes == 24_000_000


def test_trace_slicing_and_requests():
    tr = make_trace(_spec(num_requests=100))
    assert len(tr.head(10)) == 10 and len(tr.slice(90)) == 10
    assert len(tr.until(tr.arrival_s[49])) == 50
    reqs = list(tr.head(3).requests())
    assert [r.prompt for r in reqs] == tr.prompt[:3].tolist()
    assert reqs[1].arrival == int(round(tr.arrival_s[1] * 1e9))


# ------------------------------------------------------------------------- datasets
def test_dataset_resolution_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMSCHED_TRACES", str(TRACES))
    assert resolve_dataset("sharegpt").samefile(SHAREGPT)
    assert isinstance(parse_length_law("arxiv"), Empirical)


def test_an_empty_traces_variable_counts_as_unset(monkeypatch, tmp_path):
    """As README says (the common Unix reading): `LLMSCHED_TRACES=` searches the default
    folders, as no variable does."""
    monkeypatch.delenv("LLMSCHED_TRACES", raising=False)
    unset = ds.traces_dirs()
    monkeypatch.setenv("LLMSCHED_TRACES", "")
    assert ds.traces_dirs() == unset and all(d.name == "traces" and d.parent.name == "shared" for d in unset)
    monkeypatch.setenv("LLMSCHED_TRACES", str(tmp_path))
    assert ds.traces_dirs() == [tmp_path]


def test_dataset_not_found_names_places(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMSCHED_TRACES", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ds, "_repo_root", lambda: tmp_path / "repo")
    with pytest.raises(ConfigError, match="dataset 'sharegpt' not found.*LLMSCHED_TRACES"):
        resolve_dataset("sharegpt")
    with pytest.raises(ConfigError, match="not found"):
        WorkloadSpec(arrival="poisson", rate=1, num_requests=5, prompt="sharegpt", output=5)


# ------------------------------------------------------------------------- errors
def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = dict(arrival="poisson", rate=1.0, num_requests=10, prompt="const:5", output="const:5")


def _bad(**kw):
    d = dict(BASE)
    d.update(kw)
    return lambda: make_trace(WorkloadSpec.from_dict(d))


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (_bad(rate=0), r"rate \(requests per second\) must be a positive"),
        (_bad(rate=-3), r"rate \(requests per second\) must be a positive"),
        (_bad(rate="fast"), "rate .*must be a number"),
        (_bad(arrival="gamma", cv=0), "cv .* must be a positive"),
        (_bad(arrival="gamma", cv=-1), "cv .* must be a positive"),
        (_bad(cv=2), "applies to gamma arrivals only"),
        (_bad(arrival="weibull"), "unknown arrival process 'weibull'"),
        (_bad(prompt="foo:3"), "unknown length law 'foo:3'"),
        (_bad(prompt="const:-5"), "const length must be >= 1"),
        (_bad(output="const:0"), "const length must be >= 1"),
        (_bad(prompt="uniform:10,5"), "needs lo <= hi"),
        (_bad(prompt="uniform:-1,5"), "uniform lo must be >= 1"),
        (_bad(prompt="geometric:0.5"), "geometric mean must be >= 1"),
        (_bad(prompt="lognormal:mean=100"), "exactly one of sigma= or cv="),
        (_bad(prompt="lognormal:mean=100,sigma=1,cv=1"), "exactly one of sigma= or cv="),
        (_bad(prompt="lognormal:mean=100,sigma=0"), "lognormal sigma must be > 0"),
        (_bad(prompt="lognormal:mean=100,sigma=1,foo=2"), "unknown parameter 'foo'"),
        (_bad(prompt="empirical:/no/such/file.csv"), "file /no/such/file.csv does not exist"),
        (_bad(prompt=None), "need a prompt length law"),
        (_bad(num_requests=None), "need num_requests or duration_s"),
        (_bad(num_requests=0), "num_requests must be a whole number >= 1"),
        (_bad(num_requests=2.5), "num_requests must be a whole number >= 1"),
        (_bad(duration_s=-1), "duration_s must be a positive"),
        (_bad(seed=-1), "seed must be a whole number >= 0"),
        (_bad(arrival="deterministic", rate=1, num_requests=None, duration_s=0.5), "workload is empty"),
        (_bad(arrival="trace:/no/such/trace.csv"), "does not exist"),
        (_bad(time_scale=0, arrival="trace:azure-conv"), "time_scale must be a positive"),
        (_bad(bogus=1), "unknown workload key 'bogus'"),
        (_bad(classes=[{"tag": "a", "share": 0}]), "share of class 'a' must be a positive"),
        (_bad(classes=[{"tag": "a"}, {"tag": "a"}]), "class tag 'a' is used twice"),
        (lambda: Trace([1.0, 0.5], [1, 1], [1, 1]), "non-decreasing"),
        (lambda: Trace([0.0], [0], [1]), "prompt lengths must be >= 1"),
        (lambda: Trace([0.0, 1.0], [1], [1, 1]), "differ in length"),
    ],
)
def test_bad_inputs_raise_config_error(fn, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("", "is empty"),
        ("arrival_s,prompt_tokens,output_tokens\n", "has no data rows"),
        (
            "arrival_s,prompt_tokens\n0,1\n",
            r"first line: arrival_s,prompt_tokens\) is not a trace in a known format: plain CSV \(arrival_s",
        ),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,2\n1,abc,2\n", "line 3 column 'prompt_tokens'.*'abc'"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,2\n1,2\n", "line 3 has 2 field"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,2\n1,-4,2\n", "line 3 column 'prompt_tokens'.*below"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,2.5\n", "line 2 column 'output_tokens'.*whole number"),
        ("arrival_s,prompt_tokens,output_tokens\n-1,1,2\n", "line 2 column 'arrival_s'"),
        ("a,b\n1,2\n", "is not a trace"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\nyesterday,3,4\n",
            "line 3 column 'TIMESTAMP'",
        ),
    ],
)
def test_malformed_trace_files(tmp_path, text, pattern):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(ConfigError, match=pattern) as info:
        make_trace(WorkloadSpec(arrival=f"trace:{p}"))
    assert str(p) in str(info.value) and "\n" not in str(info.value)


def test_empirical_errors(tmp_path):
    p = _write(tmp_path, "lens.csv", "x,y\n1,2\n3,4\n")
    with pytest.raises(ConfigError, match="say which column"):
        parse_length_law(f"empirical:{p}", "prompt")
    with pytest.raises(ConfigError, match="has no column 'z'"):
        parse_length_law(f"empirical:{p}:z", "prompt")
    law = parse_length_law(f"empirical:{p}:y", "output")
    assert set(law.sample(np.random.default_rng(0), 100).tolist()) == {2, 4}
    neg = _write(tmp_path, "neg.csv", "n\n5\n-2\n")
    with pytest.raises(ConfigError, match="line 3 column 'n'"):
        parse_length_law(f"empirical:{neg}").sample(np.random.default_rng(0), 5)


def test_an_empirical_length_of_zero_is_drawn_as_one_with_a_warning(tmp_path):
    """A length file's 0 became 1 silently (a request has at least one token), changing
    capacity's means: the draw stands, said once per file."""
    from llmsched.core.errors import InputWarning

    p = _write(tmp_path, "zeros.csv", "n\n5\n0\n0\n")
    law = parse_length_law(f"empirical:{p}")
    with pytest.warns(InputWarning, match="column 'n': 2 lengths of 0 tokens are drawn as 1 token"):
        assert set(law.sample(np.random.default_rng(0), 200).tolist()) == {1, 5}
    ones = _write(tmp_path, "ones.csv", "n\n5\n1\n")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        parse_length_law(f"empirical:{ones}").sample(np.random.default_rng(0), 5)


def test_lognormal_expected_is_the_mean_of_its_clipped_rounded_samples():
    """`expected()` returned the unclipped mean: 1000 for `max=1500`, whose samples average
    736 (the network's law_mean computed the right one on its own; now both are one)."""
    from llmsched.workload.lengths import Lognormal

    for law in (Lognormal(1000, sigma=1.0, max=1500), Lognormal(50, sigma=2.0, max=60), Lognormal(200, sigma=0.5)):
        x = law.sample(np.random.default_rng(0), 1_000_000)
        assert law.expected() == pytest.approx(x.mean(), rel=3e-3)
    assert Lognormal(1000, sigma=1.0, max=1500).expected() < 740


def test_geometric_expected_counts_the_mass_piled_at_its_cap():
    """`expected()` ignored the cap (`geometric:mean=1e9,max=2^30` averages 6.58e8, it said
    1e9): samples past the cap are clipped to it, so E = mean (1 - q^cap)."""
    from llmsched.workload.lengths import Geometric

    for law in (Geometric(1e9, max=MAX_LENGTH), Geometric(256, max=10), Geometric(5e7, max=10**8), Geometric(1.5)):
        x = law.sample(np.random.default_rng(0), 1_000_000)
        assert x.max() <= law.upper
        assert law.expected() == pytest.approx(x.mean(), rel=2e-3)
    assert Geometric(1e9, max=MAX_LENGTH).expected() == pytest.approx(1e9 * (1 - math.exp(-MAX_LENGTH / 1e9)))


@pytest.mark.parametrize(
    "text, cut",
    [
        ("lognormal:mean=1000,sigma=8", "98.3%"),  # every sample 1 token: a sample mean of 2.4
        ("lognormal:mean=1000,sigma=4", "4.7%"),  # 827 on average
        ("lognormal:mean=1e6,cv=20", "2.7%"),
        ("geometric:1e9", "34.2%"),
        ("geometric:2.4e8", "1.1%"),
    ],
)
def test_a_law_whose_mean_the_length_cap_cuts_is_refused(capsys, text, cut):
    """Samples are capped at 2^30 tokens: these laws ran, silently far below their mean."""
    line = one_line_error(capsys, ["simulate", "--prompt", text, "--out", ""], "--prompt: ", "capped at 1,073,741,824")
    assert f"cuts {cut} off its mean" in line
    one_line_error(capsys, ["simulate", "--output", text, "--out", ""], "--output: ", f"cuts {cut}")
    assert parse_length_law(f"{text},max={MAX_LENGTH}").max == MAX_LENGTH  # a clip said on purpose


def test_laws_within_the_length_cap_tolerance_keep_their_mean():
    within = (("lognormal:mean=1000,sigma=3", 1000), ("geometric:2e8", 2e8), ("lognormal:mean=1e8,sigma=1", 1e8))
    for text, mean in within:
        assert parse_length_law(text).expected() == pytest.approx(mean, rel=0.01)


def test_asking_a_trace_for_more_requests_than_it_has_says_so(tmp_path):
    """`--num-requests` above a trace's length ran the whole trace silently."""
    from llmsched.core.errors import InputWarning

    p = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n2,10,5\n")
    with pytest.warns(InputWarning, match=r"t.csv has 3 requests: num_requests=10 replays them all") as caught:
        assert len(make_trace(WorkloadSpec(arrival="trace", trace=str(p), num_requests=10)).arrival_s) == 3
    assert caught[0].filename == __file__  # the warning names the caller's line, not ours
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        assert len(make_trace(WorkloadSpec(arrival="trace", trace=str(p), num_requests=3)).arrival_s) == 3
        # a duration that cuts the replay short anyway: the count was never what ran short
        # ("replays them all" was said of a run of 371 of the trace's 19,366 requests)
        spec = WorkloadSpec(arrival="trace", trace=str(p), num_requests=10, duration_s=1.5)
        assert len(make_trace(spec).arrival_s) == 2


def test_gamma_arrivals_warn_when_the_realised_rate_is_loose(capsys, tmp_path):
    """cv 1000 over 5,000 requests put every arrival of one seed at t = 0 and printed a
    utilisation of 473,462,788.8% for `--rate 5`, without a word: the realised rate of n
    gamma gaps varies by about cv / sqrt(n); past 25% a run says so, once (a sweep's points
    share the text), and never beside a refusal's one line."""
    from llmsched.workload.arrivals import loose_rate

    assert loose_rate(17, 5_000) is None  # 17 / sqrt(5000) = 24%
    assert loose_rate(1, 10) is None  # Poisson: a short run, not bursts
    assert "cv 20: the realised rate of 5,000 requests varies by about +-28%" in loose_rate(20, 5_000)
    assert "at least 40,000 requests for +-10%" in loose_rate(20, 5_000)
    run = ["--arrival", "gamma", "--rate", "5", "--cv", "30", "--cost-model", "paper"]
    assert main(["simulate", *run, "--out", ""]) == 0
    err = capsys.readouterr().err
    assert "warning: gamma arrivals of cv 30: the realised rate of 5,000 requests varies by about +-42%" in err
    # refused: the refusal's line alone
    one_line_error(capsys, ["simulate", *run, "--num-requests", "100", "--kv-capacity", "50", "--out", ""], "KV")
    # capacity draws no run's arrivals: nothing to warn about
    assert main(["capacity", *run]) == 0
    assert "warning" not in capsys.readouterr().err
    sweep = ["sweep", *run[:2], *run[4:], "--num-requests", "100", "--grid", "rate=2,4", "--grid", "seed=0,1"]
    assert main([*sweep, "--no-plots", "--workers", "1", "--out", str(tmp_path / "sw")]) == 0
    assert capsys.readouterr().err.count("warning: gamma arrivals of cv 30") == 1
