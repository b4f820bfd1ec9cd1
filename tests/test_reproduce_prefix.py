"""`llmsched reproduce prefix-caching` on a small generated Mooncake-style trace."""

from __future__ import annotations

import json
import random
import warnings

import pytest

from llmsched.analysis.reproduce_prefix import reproduce_prefix_caching
from llmsched.cli import main
from llmsched.core.errors import InputWarning


def write_fixture(path, n=300, seed=0):
    """Mooncake JSON lines: one of 8 shared 4096-token system prompts (8 blocks of 512),
    then 1-3 blocks of the request's own (the last one partial); a request every 0.5 s."""
    rng = random.Random(seed)
    nxt = 1000
    with open(path, "w") as f:
        for i in range(n):
            fam = rng.randrange(8)
            own = rng.randint(1, 3)
            ids = [fam * 100 + j for j in range(8)] + list(range(nxt, nxt + own))
            nxt += own
            row = {
                "timestamp": i * 500,
                "input_length": 512 * (8 + own) - rng.randrange(0, 300),
                "output_length": rng.randint(5, 40),
                "hash_ids": ids,
            }
            f.write(json.dumps(row) + "\n")


def test_reproduce_prefix_caching(tmp_path):
    path = tmp_path / "trace.jsonl"
    write_fixture(path)
    with warnings.catch_warnings():
        # the runs without caching take no block size: nothing to warn the user about
        warnings.simplefilter("error", InputWarning)
        res = reproduce_prefix_caching(
            str(path),
            out_dir=tmp_path / "out",
            cost_model="paper",
            b_max=512,
            loads=(0.6, 1.3),
            kv_capacities=(8000, 60000),
        )
    rows = {(r["kv_capacity"], r["load"], r["prefix_caching"]): r for r in res["rows"]}
    assert len(rows) == 8
    for (kv, load, on), r in rows.items():
        if not on:
            assert r["token_hit_rate"] == 0 and r["capacity_gain_theory"] == 1
            continue
        off = rows[(kv, load, False)]
        assert 0 < r["token_hit_rate"] and r["mean_ttft_ms"] < off["mean_ttft_ms"]
        # a cache can reuse no more than an unbounded one
        assert r["capacity_gain_theory"] <= res["ideal_capacity_gain"] + 1e-9
    # a small cache evicts the shared prompts it could have reused
    assert rows[(8000, 1.3, True)]["evictions"] > rows[(60000, 1.3, True)]["evictions"]
    assert rows[(8000, 1.3, True)]["token_hit_rate"] < rows[(60000, 1.3, True)]["token_hit_rate"]
    # above lambda* without caching: unstable; with caching it is below the raised lambda*
    big_off, big_on = rows[(60000, 1.3, False)], rows[(60000, 1.3, True)]
    assert big_on["capacity_gain_theory"] > 1.3
    assert big_off["verdict"] == "unstable" and big_on["verdict"] == "stable"
    assert (tmp_path / "out" / "table.csv").is_file() and (tmp_path / "out" / "result.json").is_file()


def test_reproduce_prefix_caching_needs_a_trace_with_blocks(tmp_path, capsys):
    assert main(["reproduce", "prefix-caching", "--quick", "--out", str(tmp_path)]) == 2
    assert "--trace" in capsys.readouterr().err
    plain = tmp_path / "plain.csv"
    plain.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,12,3\n")
    # (--out: a folder of its own; one that holds other files, the trace here, is refused)
    assert main(["reproduce", "prefix-caching", "--trace", str(plain), "--out", str(tmp_path / "out")]) == 2
    assert "block ids" in capsys.readouterr().err


def test_requests_at_one_time_have_no_rate_to_rescale(tmp_path, capsys):
    """The shared Mooncake trace's first two requests both arrive at 0 ms: --num-requests 2
    was 'time_scale must be a positive number, got nan'."""
    t = tmp_path / "t.jsonl"
    rows = [{"timestamp": ts, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]} for ts in (0, 0, 500)]
    t.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["reproduce", "prefix-caching", "--trace", str(t), "--kv-capacities", "2000", "--load", "0.5"]
    assert main([*argv, "--num-requests", "2", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "its first 2 requests have no rate" in err and "--num-requests" in err
    assert not (tmp_path / "a").exists()
    assert main([*argv, "--num-requests", "3", "--cost-model", "paper", "--out", str(tmp_path / "b")]) == 0


def test_reproduce_prefix_caching_refuses_the_parallel_options(tmp_path, capsys):
    """Its runs go one after the other in this process: --workers, --backend and --address
    did nothing."""
    from helpers import one_line_error

    path = tmp_path / "trace.jsonl"
    write_fixture(path, n=20)
    base = ["reproduce", "prefix-caching", "--trace", str(path), "--quick", "--out", str(tmp_path / "o")]
    for extra, flag in ((["--workers", "2"], "--workers"), (["--backend", "ray"], "--backend")):
        one_line_error(capsys, [*base, *extra], f"{flag} is not an option of `reproduce prefix-caching`")
    # an empty value is refused, not run as the default (`if args.kv_capacities:`)
    one_line_error(capsys, [*base, "--kv-capacities", ""], "--kv-capacities must be comma-separated whole numbers")
    one_line_error(capsys, [*base, "--cost-model", ""], "unknown cost model ''")


def test_a_trace_kept_under_a_name_the_run_writes_is_refused_and_kept(tmp_path):
    """A trace kept in an earlier run's folder as table.csv was written over by the table."""
    import pytest

    from llmsched.core.errors import ConfigError

    path = tmp_path / "trace.jsonl"
    write_fixture(path, n=60)
    out = tmp_path / "out"
    small = dict(out_dir=out, cost_model="paper", b_max=512, loads=(0.6,), kv_capacities=(60000,))
    reproduce_prefix_caching(str(path), **small)
    kept = out / "table.csv"
    kept.write_bytes(path.read_bytes())
    with pytest.raises(ConfigError, match="would replace"):
        reproduce_prefix_caching(str(kept), **small)
    assert kept.read_bytes() == path.read_bytes()


def test_a_trace_that_is_no_path_is_one_line_over_an_existing_folder(tmp_path):
    """The check of the run's own files ran os.path on the trace first: None, over an
    existing folder, was a TypeError traceback, not the reader's one line."""
    import pytest

    from llmsched.core.errors import ConfigError

    (tmp_path / "rp").mkdir()
    for bad in (None, 5):
        with pytest.raises(ConfigError):
            reproduce_prefix_caching(bad, out_dir=tmp_path / "rp", quick=True)


def test_more_requests_than_the_trace_holds_records_those_it_ran(tmp_path):
    """result.json recorded the number asked for (100) where the runs replayed the trace's
    60, with no word; a simulate run warns and records what it replayed."""
    path = tmp_path / "trace.jsonl"
    write_fixture(path, n=60)
    kw = dict(cost_model="paper", b_max=512, loads=(0.6,), kv_capacities=(60000,))
    with pytest.warns(UserWarning, match=r"has 60 requests: num_requests=100 replays them all"):
        res = reproduce_prefix_caching(str(path), out_dir=tmp_path / "a", num_requests=100, **kw)
    assert res["config"]["num_requests"] == 60
    assert json.loads((tmp_path / "a" / "result.json").read_text())["config"]["num_requests"] == 60
    quick = reproduce_prefix_caching(str(path), out_dir=tmp_path / "b", quick=True, **kw)  # (quick: 400 asked)
    assert quick["config"]["num_requests"] == 60 and quick["rows"] == res["rows"]
