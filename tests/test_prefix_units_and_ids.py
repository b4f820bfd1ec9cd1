"""Prefix caching in the simulator: the predicted backlog growth in the backlog's own units,
unsigned 64-bit block ids, a block size without a cache, a system prompt under one block,
a sweep's block-size warning and `reproduce prefix-caching`'s KV capacities."""

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmsched.analysis.reproduce_prefix import reproduce_prefix_caching
from llmsched.analysis.sweep import run_sweep
from llmsched.api import check_config, simulate
from llmsched.cli import main
from llmsched.core.errors import ConfigError, InputWarning
from llmsched.workload import WorkloadSpec, make_trace
from llmsched.workload.trace import read_trace

MOONCAKE = "tests/data/traces/formats/mooncake.jsonl"
TOP = 2**64 - 1  # an unsigned 64-bit hash's largest value: the same bits as int64 -1


# ---- 1: predicted backlog growth in the backlog's units --------------------------------


def test_predicted_growth_with_a_cache_is_in_the_backlogs_units():
    """The backlog counts a waiting request's whole prompt (its cached prefix leaves only at
    admission): the prediction was in work tokens, 2,718 against a measured 6,051 [5,855,
    6,248]; in the backlog's units it is 5,983, inside the interval."""
    s = simulate(
        prefix_caching=True,
        block_size=8,
        system_prompt=600,
        prompt="const:400",
        output="const:100",
        cost_model="paper",
        rate=12,
        num_requests=3000,
    ).summary
    assert s["verdict"] == "unstable" and s["cached_prompt_tokens_per_request"] > 590
    lo, hi = s["backlog_growth_ci"]
    assert lo <= s["predicted_backlog_growth_tokens_per_s"] <= hi
    # the threshold, 2% of the capacity, in the same units: gross / work tokens per work token
    units = s["offered_token_rate"] / s["offered_work_rate"]
    assert units > 2
    assert s["verdict_threshold_tokens_per_s"] == pytest.approx(0.02 * s["token_capacity"] * units, rel=1e-9)


# ---- 2: block ids from 2^63 up ------------------------------------------------------------


def _rows(trace):
    return [tuple(trace.block_ids[a:b].tolist()) for a, b in zip(trace.block_ptr[:-1], trace.block_ptr[1:])]


def test_unsigned_64_bit_ids_are_read_as_their_bits_in_every_format(tmp_path):
    csv = tmp_path / "big.csv"
    csv.write_text(
        f"arrival_s,prompt_tokens,output_tokens,block_ids@4\n0,12,5,{TOP} 2 3\n1,12,5,-1 2 3\n2,12,5,{2**63} 2 4\n"
    )
    rows = _rows(read_trace(csv, block_size=None))
    assert rows[0] == rows[1]  # 2^64 - 1 is -1's bits
    assert rows[2][0] != rows[0][0]
    table = pa.table(
        {
            "arrival_s": [0.0, 1.0],
            "prompt_tokens": [12, 12],
            "output_tokens": [5, 5],
            "block_ids@4": pa.array([[TOP, 2, 3], [2**63, 2, 4]], type=pa.list_(pa.uint64())),
        }
    )
    pq.write_table(table, tmp_path / "big.parquet")
    assert _rows(read_trace(tmp_path / "big.parquet", block_size=None)) == [rows[0], rows[2]]
    # Mooncake lines, as the fast reader takes them and with an extra key (the json reader)
    for extra in ("", ', "x": 1'):
        lines = [
            f'{{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [{TOP}, 1]{extra}}}',
            f'{{"timestamp": 10, "input_length": 1024, "output_length": 5, "hash_ids": [-1, 1]{extra}}}',
            f'{{"timestamp": 20, "input_length": 1024, "output_length": 5, "hash_ids": [{2**63 + 5}, 1]{extra}}}',
        ]
        path = tmp_path / f"big{len(extra)}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        got = _rows(read_trace(path, block_size=None))
        assert got[0] == got[1] and got[2][0] != got[0][0]


def test_ids_past_64_bits_are_refused_naming_the_range(tmp_path):
    csv = tmp_path / "over.csv"
    csv.write_text(f"arrival_s,prompt_tokens,output_tokens,block_ids@4\n0,12,5,{TOP + 1} 2 3\n")
    with pytest.raises(ConfigError, match=r"line 2 .*block ids \(integers from -2\^63 to 2\^64 - 1\)"):
        read_trace(csv)
    for extra in ("", ', "x": 1'):
        path = tmp_path / f"over{len(extra)}.jsonl"
        path.write_text(
            f'{{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [{TOP + 1}]{extra}}}\n'
        )
        with pytest.raises(ConfigError, match=r"line 1 key 'hash_ids' must be a list of integers from -2\^63 to 2\^64"):
            read_trace(path)


# ---- 3: a block size the trace's blocks do not map onto, without a cache -----------------


def test_an_unmappable_block_size_without_a_cache_only_warns(capsys):
    for bs in ("48", "64"):
        code = main(["simulate", "--trace", MOONCAKE, "--block-size", bs, "--cost-model", "paper", "--out", ""])
        err = capsys.readouterr().err
        assert code == 0, err
        assert f"warning: block_size={bs} has no effect without prefix caching" in err
    # with the cache it is refused, by the run and by the check a sweep makes of its points
    code = main(["simulate", "--trace", MOONCAKE, "--block-size", "48", "--prefix-caching", "--cost-model", "paper"])
    assert code == 2 and "onto 48-token cache blocks" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="onto 48-token cache blocks"):
        check_config(trace=MOONCAKE, block_size=48, prefix_caching=True, cost_model="paper")
    check_config(trace=MOONCAKE, block_size=48, cost_model="paper")
    assert make_trace(WorkloadSpec(arrival=f"trace:{MOONCAKE}"), 48, blocks=False).block_ids is None


# ---- 4: a system prompt shorter than one block ---------------------------------------------


@pytest.mark.parametrize(("system", "block", "prompt"), [(10, 16, "geometric:100"), (2048, 4096, "const:3000")])
def test_a_system_prompt_under_one_block_warns_nothing_to_hit(system, block, prompt):
    kw = dict(prefix_caching=True, system_prompt=system, block_size=block, prompt=prompt, output="const:5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = simulate(cost_model="paper", rate=4, num_requests=100, verdict=False, **kw).summary
    assert s["prefix_cache"]["first_admission_hit_tokens"] == 0
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert said == [
        f"prefix caching has nothing to hit: every system prompt is shorter than one {block}-token block (the "
        f"longest: {system} tokens), and without --turns requests share only the blocks wholly inside one, so "
        "every prompt is a miss (a block size at most the system prompt would share it)"
    ]


def test_a_system_prompt_of_one_block_hits_and_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        s = simulate(
            cost_model="paper", rate=4, num_requests=100, verdict=False, prefix_caching=True, system_prompt=16
        ).summary
    assert s["prefix_cache"]["first_admission_hit_tokens"] > 0


# ---- 5: a sweep's block-size warning; reproduce's KV capacities --------------------------


def test_a_sweep_with_cached_points_does_not_warn_of_the_block_size(tmp_path):
    kw = dict(cost_model="paper", system_prompt=64, rate=2, num_requests=30, block_size=8, progress=False, plots=False)
    for values, warned in (([False, True], False), ([False], True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_sweep(grid={"prefix_caching": values}, out_dir=tmp_path / str(len(values)), **kw)
        said = [str(w.message) for w in caught if "no effect without prefix caching" in str(w.message)]
        assert said == (["block_size=8 has no effect without prefix caching (--prefix-caching)"] if warned else [])


@pytest.mark.parametrize("kv", [-5, 0])
def test_reproduce_refuses_a_capacity_below_one_token_plainly(tmp_path, kv):
    with pytest.raises(ConfigError, match=f"^KV capacities must be at least 1 token, got {kv}$"):
        reproduce_prefix_caching(MOONCAKE, out_dir=tmp_path / "r", cost_model="paper", kv_capacities=(kv, 10**6))
    assert not (tmp_path / "r").exists()
