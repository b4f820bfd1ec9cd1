"""The contexts of a full step when lengths vary (`core.length_mix`): the size-biased decode
context, the prefill windows of the prompt stream, and lambda* against the simulator."""

import numpy as np
import pytest

from llmsched import simulate
from llmsched.api import build_config
from llmsched.core import length_mix
from llmsched.core.cost import CostModel, make_cost_model
from llmsched.core.errors import ConfigError
from llmsched.core.length_mix import STREAM_PROMPTS, LengthMix
from llmsched.core.profile import ProfileCostModel
from llmsched.theory import capacity, workload_means, workload_mix

H200 = "profile:h200-llama-3-8b"


def test_decode_context_is_token_weighted():
    # request 1 decodes nothing; request 2 (prompt 20, output 3) decodes tokens 2 and 3 at
    # contexts 21 and 22
    mix = LengthMix([10, 20], [1, 3])
    assert mix.decode_context == pytest.approx(21.5)
    assert (mix.mean_prompt, mix.mean_output) == (15.0, 2.0)
    # constant lengths: the mean context, p + o / 2
    assert LengthMix([100] * 5, [40] * 5).decode_context == pytest.approx(120.0)
    # a long output decodes more tokens, at longer contexts: above the means' p + o / 2
    assert LengthMix([100, 100], [2, 200]).decode_context > 100 + 101 / 2


def _brute_window(tokens, prompts, u: int, x: int):
    """The window of `x` tokens from `u` of the circular stream `tokens` ((prompt, position
    in it) per token), by brute force: ([(chunk tokens, context before it)], prompts it
    completes)."""
    want, completed, prev = [], 0, None
    for t in range(u, u + x):
        i, j = tokens[t % len(tokens)]
        if want and prev == (i, j - 1):
            want[-1][1] += 1
        else:
            want.append([i, 1, j])  # prompt, tokens, context before the piece
        prev = (i, j)
        if j == prompts[i] - 1:
            completed += 1
    return [(c, ctx) for _, c, ctx in want], completed


def test_windows_cut_the_prompt_stream():
    prompts = [4, 6, 2, 9, 1, 3]
    mix = LengthMix(prompts, [1] * len(prompts))
    total = sum(prompts)
    # every token of the (circular) stream as (its prompt, its position in the prompt)
    tokens = [(i, j) for i, n in enumerate(prompts) for j in range(n)]
    for x in (1, 3, 5, 8, 12, total - 1, total, total + 1, 3 * total + 7):
        windows = mix.window_chunks(x)
        starts = mix._windows(x)[0].tolist()
        assert len(windows) == len(starts)
        for window, u in zip(windows, starts):
            assert window == _brute_window(tokens, prompts, u, x)


def test_a_windows_mean_does_not_depend_on_what_was_asked_before():
    cost = make_cost_model(H200)
    p, o = [300, 1200, 50, 4000, 700], [100, 20, 300, 5, 60]
    fresh = LengthMix(p, o).chunk_mean(cost, 200)
    mix = LengthMix(p, o)
    mix.chunk_mean(cost, 1 << 20)  # a budget of many laps of the sample's prompts
    assert mix.chunk_mean(cost, 200) == fresh
    # and a tiny sample with a huge budget stays cheap: the stream never grows
    assert len(mix._prompts) == len(p)


def test_the_stream_is_taken_evenly_through_a_large_sample():
    n = 3 * STREAM_PROMPTS
    prompts = np.concatenate([np.full(n // 2, 100), np.full(n - n // 2, 3000)])  # a trace drifting in time
    mix = LengthMix(prompts, np.ones(n, dtype=int))
    assert len(mix._prompts) == STREAM_PROMPTS
    assert mix._prompts.mean() == pytest.approx(prompts.mean(), rel=0.01)


def _every_window_mean(cost, tokens, prompts, x: int) -> float:
    """The mean chunk time of the windows of `x` tokens from every start of the stream."""
    total = 0.0
    for u in range(len(tokens)):
        chunks, _ = _brute_window(tokens, prompts, u, x)
        total += sum(cost.chunk_time(c, ctx) for c, ctx in chunks)
    return total / len(tokens)


def test_chunk_mean_is_the_mean_over_every_window():
    cost = make_cost_model(H200)
    rng = np.random.default_rng(0)
    for _ in range(3):
        prompts = rng.integers(1, 300, int(rng.integers(1, 8))).tolist()
        mix = LengthMix(prompts, [1] * len(prompts))
        tokens = [(i, j) for i, n in enumerate(prompts) for j in range(n)]
        for x in (1, 2, 63, 64, 65, max(prompts), len(tokens) + 5, 3 * len(tokens) + 1):
            want = _every_window_mean(cost, tokens, prompts, x)
            assert mix.chunk_mean(cost, x) == pytest.approx(want, rel=1e-9)
    assert mix.chunk_mean(cost, 0) == 0.0


def test_a_profiles_sums_over_contexts_match_its_chunk_times():
    cost = make_cost_model(H200)
    lo = np.array([0, 0, 5, 1000, 1023, 4000, 30000, 70000])
    hi = np.array([0, 1, 2000, 1025, 5000, 4001, 40000, 70003])
    for chunk in (1, 64, 100, 5000):
        want = [sum(cost.chunk_time(chunk, c) for c in range(a, b)) for a, b in zip(lo, hi)]
        assert cost.chunk_time_sums(chunk, lo, hi) == pytest.approx(want, rel=1e-9)
        assert cost.chunk_times(chunk, lo).tolist() == [cost.chunk_time(chunk, int(c)) for c in lo]


def test_the_order_of_the_lengths_does_not_matter():
    # every window counts: permuting the sample moves no window's time (256 sampled windows
    # moved lambda* by 0.35-2.9% between orders)
    cost = make_cost_model(H200)
    rng = np.random.default_rng(3)
    p, o = rng.integers(2, 5000, 300), rng.integers(1, 400, 300)
    c = (rng.random(300) * (p - 1)).astype(int)
    perm = rng.permutation(300)
    a, b = LengthMix(p, o, c).timer(cost), LengthMix(p[perm], o[perm], c[perm]).timer(cost)
    for x, y in ((1, 0), (100, 412), (2048, 0), (5000, 7)):
        assert a(x, y) == pytest.approx(b(x, y), rel=1e-12)


class _AdditiveModel(CostModel):
    """A user's model whose step time is a sum over its chunks, without vectorised sums."""

    load_only = False

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        parts = sum(self.chunk_time(c, ctx) for c, ctx in chunks)
        return 0.01 + 1e-5 * (prefill_tokens + decode_tokens) + 1e-8 * decode_context + parts + 1e-6 * sampled

    def chunk_time(self, chunk, context):
        return 1e-6 + 1e-9 * chunk * (context + (chunk + 1) / 2) + 1e-7 * (context > 20)


class _SummedModel(_AdditiveModel):
    """The same model, summing its chunk times over contexts itself."""

    def chunk_time_sums(self, chunk, lo, hi):
        return np.array([sum(self.chunk_time(chunk, c) for c in range(a, b)) for a, b in zip(lo, hi)])


def test_a_models_own_sums_of_chunk_times_are_summed_over_every_window():
    cost = _SummedModel()
    prompts, cached = [5, 30, 2, 17], [0, 12, 1, 3]
    mix = LengthMix(prompts, [1] * 4, cached)
    tokens = [(i, j) for i, n in enumerate(prompts) for j in range(cached[i], n)]
    for x in (1, 4, 9, 20, len(tokens) + 3):
        assert mix.chunk_mean(cost, x) == pytest.approx(_every_window_mean(cost, tokens, prompts, x), rel=1e-12)


def test_a_model_with_chunk_times_only_is_averaged_over_sampled_windows(monkeypatch):
    # summing every window would call its chunk_time once per context per prompt per load
    cost = _AdditiveModel()
    monkeypatch.setattr(cost, "chunk_times", None)  # neither the vectorised times ...
    monkeypatch.setattr(cost, "chunk_time_sums", None)  # ... nor the sums are used
    rng = np.random.default_rng(5)
    p = rng.integers(1, 3000, 400)
    mix = LengthMix(p, np.ones(400, dtype=int))
    for x in (1, 37, 256):  # exact over the sample up to EXACT_LOADS
        windows = mix.window_chunks(x)
        want = sum(sum(cost.chunk_time(c, ctx) for c, ctx in chunks) for chunks, _ in windows) / len(windows)
        assert mix.chunk_mean(cost, x) == pytest.approx(want, rel=1e-12)
    # above it interpolated between nearby loads: close to the sampled windows' mean
    windows = mix.window_chunks(5000)
    want = sum(sum(cost.chunk_time(c, ctx) for c, ctx in chunks) for chunks, _ in windows) / len(windows)
    assert mix.chunk_mean(cost, 5000) == pytest.approx(want, rel=0.01)


def test_long_pieces_are_interpolated_between_loads(monkeypatch):
    # the exact sum walks every piece length up to the load: past EXACT_EDGES the loads
    # between grid knots are interpolated, close to the exact mean
    cost = make_cost_model(H200)
    rng = np.random.default_rng(6)
    p = rng.integers(2000, 6000, 50)
    exact = LengthMix(p, np.ones(50, dtype=int))
    want = {x: exact.chunk_mean(cost, x) for x in (500, 1500, 4000, 9000, 20000)}
    monkeypatch.setattr(length_mix, "EXACT_EDGES", 1000)
    mix = LengthMix(p, np.ones(50, dtype=int))
    assert mix.chunk_mean(cost, 500) == want[500]  # pieces under the bound: exact, bit for bit
    for x in (1500, 4000, 9000, 20000):
        assert mix.chunk_mean(cost, x) == pytest.approx(want[x], rel=0.02)
    assert len(mix._per_cost(cost).edges) <= 1001


def test_constant_lengths_move_lambda_star_little():
    # with lengths that do not vary only the prefill windows differ from the means' one
    # chunk (a window may straddle two prompts): lambda* moves by under 2%
    mix = LengthMix([1011] * 1000, [255] * 1000)
    old = capacity(H200, 512, 1011, 255)
    new = capacity(H200, 512, 1011, 255, mix=mix)
    assert new.contexts == "length mix" and old.contexts == "mean lengths"
    assert new.critical_rate == pytest.approx(old.critical_rate, rel=0.02)


def test_a_load_only_model_ignores_the_mix():
    mix = LengthMix([10, 4000], [1, 900])
    a = capacity("paper", 512, 2005, 450.5)
    b = capacity("paper", 512, 2005, 450.5, mix=mix)
    assert a.critical_rate == b.critical_rate and b.contexts == "load"


def test_bad_lengths_are_one_line_errors():
    for p, o in (([], []), ([1, 2], [1]), ([0, 5], [1, 1]), ([5, 5], [1, 0]), ([5.0, np.nan], [1, 1])):
        with pytest.raises(ConfigError):
            LengthMix(p, o)


class _NotAdditive(CostModel):
    """A context-dependent model whose step time is not a sum over its chunks."""

    load_only = False

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        longest = max((c + ctx for c, ctx in chunks), default=0)
        return 0.01 + 1e-5 * (prefill_tokens + decode_tokens) + 1e-8 * (decode_context + longest**1.5)


def test_a_model_without_chunk_times_is_timed_window_by_window():
    cost = _NotAdditive()
    mix = LengthMix(np.arange(100, 2100, 10), np.full(200, 50))
    t = mix.timer(cost)(300, 100)
    ctx = round(100 * mix.decode_context)
    windows = mix.window_chunks(300, 32)
    by_hand = sum(cost.step_time(300, 100, ctx, ch, 100 + d) for ch, d in windows) / len(windows)
    assert t == pytest.approx(by_hand)
    rep = capacity(cost, 512, mix.mean_prompt, mix.mean_output, mix=mix, k_max=64)
    assert rep.critical_rate > 0 and rep.contexts == "length mix"


def _full_step_rate(workload: dict, b_max: int, rate: float) -> float:
    """Tokens per second of busy time over the full steps (b_max tokens) of an overloaded
    run, from 20% of its arrival window to its end."""
    r = simulate(**workload, b_max=b_max, rate=rate, record_steps=True)
    s = np.genfromtxt(r.steps_path, delimiter=",", skip_header=1, usecols=(1, 2, 3, 4))
    start, dur, pf, dc = s.T
    window_end = float(r.arrival_s.max())
    sel = (start > 0.2 * window_end) & (start < window_end)
    assert (pf[sel] + dc[sel] == b_max).mean() > 0.99  # overloaded: every step full
    return float((pf[sel] + dc[sel]).sum() / dur[sel].sum())


def test_the_mix_predicts_the_simulators_full_steps():
    """On the default workload (lognormal prompts, geometric outputs) the mean contexts were
    about 8% optimistic; the mix comes within 2% of what Sarathi's full steps serve."""
    workload = {"num_requests": 3000, "seed": 3}
    full = build_config(None, **workload).workload
    mp, mo = workload_means(full)
    mix = workload_mix(full)
    old = capacity(H200, 512, mp, mo)
    new = capacity(H200, 512, mp, mo, mix=mix)
    measured = _full_step_rate(workload, 512, 1.3 * old.critical_rate)
    assert old.token_capacity / measured > 1.04  # the old answer: optimistic
    assert new.token_capacity / measured == pytest.approx(1.0, abs=0.02)


def test_a_clusters_servers_time_steps_with_their_calls_lengths():
    from llmsched.api import cluster_network
    from llmsched.theory.network import traffic

    net = cluster_network(None, replicas=1, num_requests=1000)
    server = traffic(net).servers[0]
    assert server.contexts == "length mix"
    workload = build_config(None, num_requests=1000).workload
    mp, mo = workload_means(workload)
    one = capacity(H200, 512, mp, mo, mix=workload_mix(workload))
    # the same laws, drawn apart (20,000 lengths from the call's laws against the
    # workload's 200,000): the same capacity within 1%, not the means' (8% above)
    assert server.replica_token_capacity == pytest.approx(one.token_capacity, rel=0.01)
    assert capacity(H200, 512, mp, mo).token_capacity > 1.05 * server.replica_token_capacity


def test_a_server_whose_calls_resend_context_keeps_the_means_contexts():
    from llmsched.theory.network import traffic

    base = {"policy": "sarathi", "b_max": 512}
    spec = {
        "servers": {"llm": {**base, "cost_model": H200}, "fast": {**base, "cost_model": "paper"}},
        "jobs": {
            "agent": {
                "arrival": {"process": "poisson", "rate": 1.0},
                "route": [
                    {"call": {"server": "llm", "prompt": "geometric:300", "output": "geometric:50"}},
                    {"call": {"server": "llm", "prompt": 20, "output": 30, "context": True}},
                    {"call": {"server": "fast", "prompt": 100, "output": 10}},
                ],
            }
        },
    }
    rep = traffic(spec)
    assert [s.contexts for s in rep.servers] == ["mean lengths", "load"]


def test_the_capacity_command_says_which_contexts_it_used(capsys):
    from llmsched.cli import main

    assert main(["capacity"]) == 0
    assert "contexts of the workload's length mix" in capsys.readouterr().out
    assert main(["capacity", "--mean-prompt", "1000", "--mean-output", "200"]) == 0
    assert "contexts of the mean lengths" in capsys.readouterr().out
    assert main(["capacity", "--json"]) == 0
    import json

    rep = json.loads(capsys.readouterr().out)
    mp, mo = rep["capacity"]["mean_prompt"], rep["capacity"]["mean_output"]
    full = build_config(None).workload
    assert rep["capacity"]["contexts"] == "length mix"
    assert rep["capacity"]["critical_rate"] == pytest.approx(
        capacity(H200, 512, mp, mo, mix=workload_mix(full)).critical_rate
    )


def _one_server_network(route, cost=H200):
    return {
        "servers": {"s": {"policy": "sarathi", "b_max": 512, "cost_model": cost}},
        "jobs": {"job": {"arrival": {"process": "poisson", "rate": 1.0}, "route": route}},
    }


def test_a_servers_mix_keeps_a_files_pairs(tmp_path):
    # a call whose prompt and output read one file draws whole rows, as the simulator does:
    # long prompts with long outputs here. Drawn apart, the pairs would mix.
    from llmsched.theory.network import traffic

    f = tmp_path / "pairs.csv"
    f.write_text("prompt_tokens,output_tokens\n" + "100,1\n4000,500\n" * 50)
    route = [{"call": {"server": "s", "prompt": f"empirical:{f}", "output": f"empirical:{f}"}}]
    server = traffic(_one_server_network(route)).servers[0]
    assert server.contexts == "length mix"
    # joint rows: only the 4,000-token prompts decode, at contexts 4,001..4,499
    joint = LengthMix([100, 4000], [1, 500]).decode_context
    assert joint == pytest.approx(4250.0)
    mix = server_mix(route)
    assert mix.decode_context == pytest.approx(joint)


def server_mix(route):
    from llmsched.theory.network import _server_mix
    from llmsched.workload.network import load_network

    spec = load_network(_one_server_network(route))
    return _server_mix(spec, "s")


def test_calls_sharing_a_class_each_give_their_lengths():
    # two calls of one class at the server: both lengths, in proportion to their visits
    route = [
        {"call": {"server": "s", "prompt": 100, "output": 10, "class": "x"}},
        {"call": {"server": "s", "prompt": 4000, "output": 500, "class": "x"}},
    ]
    mix = server_mix(route)
    assert (mix.mean_prompt, mix.mean_output) == (2050.0, 255.0)
    # and a loop's call counts its passes: 3 of the second for 1 of the first
    route = [
        {"call": {"server": "s", "prompt": 100, "output": 10, "class": "x"}},
        {"loop": {"times": 3, "body": [{"call": {"server": "s", "prompt": 4000, "output": 500, "class": "x"}}]}},
    ]
    assert server_mix(route).mean_prompt == pytest.approx((100 + 3 * 4000) / 4, rel=1e-3)


def test_points_that_differ_in_arrivals_share_one_sample(tmp_path):
    from llmsched.analysis.points import _critical_rate, critical_rate_of, resolve_point
    from llmsched.theory.means import _mix, sample_key

    base = {"prompt": "lognormal:mean=500,sigma=1.0", "output": "geometric:200", "seed": 3}
    a = sample_key({**base, "num_requests": 100, "rate": 2.0})
    b = sample_key({**base, "num_requests": 5000, "rate": 9.0, "arrival": "gamma", "cv": 3.0})
    assert a == b
    assert sample_key({**base, "seed": 4}) != a  # another seed draws other lengths
    # a trace's requests are its sample: how many it replays counts
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n2,30,7\n")
    assert sample_key({"trace": str(trace), "num_requests": 2}) != sample_key({"trace": str(trace), "num_requests": 3})

    _mix.cache_clear()
    _critical_rate.cache_clear()
    rates = {
        critical_rate_of(resolve_point(None, {"workload": base, "cost_model": H200}, {"num_requests": n, "rate": r}))
        for n, r in ((100, 1.0), (200, 5.0), (300, 7.0))
    }
    assert len(rates) == 1
    assert _mix.cache_info().misses == 1


def test_windows_run_over_uncached_tokens_after_their_prefix():
    # the same brute force as above, over each prompt's uncached tokens only: token j of
    # prompt i (j >= cached[i]) attends to the j tokens before it, cached ones included
    prompts, cached = [4, 6, 2, 9, 1, 3], [2, 0, 1, 8, 0, 2]
    mix = LengthMix(prompts, [1] * len(prompts), cached)
    assert mix.mean_cached == pytest.approx(sum(cached) / len(cached))
    tokens = [(i, j) for i, n in enumerate(prompts) for j in range(cached[i], n)]
    total = len(tokens)
    for x in (1, 3, 5, total - 1, total, total + 2, 2 * total + 3):
        for window, u in zip(mix.window_chunks(x), mix._windows(x)[0].tolist()):
            assert window == _brute_window(tokens, prompts, u, x)
    # a load's mean chunk time is the mean over the windows from every start of the stream
    cost = make_cost_model(H200)
    for x in (1, 3, total + 2):
        assert mix.chunk_mean(cost, x) == pytest.approx(_every_window_mean(cost, tokens, prompts, x), rel=1e-9)
    # nothing cached: the mix of whole prompts
    plain, zeros = LengthMix(prompts, [1] * 6), LengthMix(prompts, [1] * 6, [0] * 6)
    assert plain.window_chunks(7) == zeros.window_chunks(7)
    assert plain.chunk_mean(cost, 7) == zeros.chunk_mean(cost, 7)


@pytest.mark.parametrize(
    "cached",
    [[4, 0], [-1, 0], [0], [0.5, float("nan")], ["a", "b"]],
)
def test_cached_tokens_must_leave_the_last_prompt_token(cached):
    with pytest.raises(ConfigError, match="cached prompt tokens must"):
        LengthMix([4, 6], [1, 1], cached)


def test_lambda_star_with_a_cached_system_prompt_matches_saturated_throughput():
    """A shared 2,048-token system prompt, cached: the uncached tokens attend to it. Timed as
    if they sat at the start of their prompts, the full step's rate was 7-8% above what
    Sarathi's full steps serve; placed after the prefix, it is within 1%."""
    r = simulate(
        system_prompt=2048, prefix_caching=True, rate=30, num_requests=3000, cost_model=H200, seed=1, record_steps=True
    )
    s = r.summary
    hits = r.stats.prefix_hits
    assert hits is not None and hits.mean() == pytest.approx(s["cached_prompt_tokens_per_request"])
    start, dur, pf, dc = np.genfromtxt(r.steps_path, delimiter=",", skip_header=1, usecols=(1, 2, 3, 4)).T
    window_end = float(r.arrival_s.max())
    sel = (start > 0.2 * window_end) & (start < window_end)
    assert (pf[sel] + dc[sel] == 512).mean() > 0.99  # overloaded: every step full
    measured = float((pf[sel] + dc[sel]).sum() / dur[sel].sum())
    assert s["token_capacity"] / measured == pytest.approx(1.0, abs=0.01)
    whole = capacity(
        H200,
        512,
        float(r.prompt.mean()),
        float(r.output.mean()),
        cached_prompt=float(hits.mean()),
        mix=LengthMix(r.prompt, r.output),
        peak=False,
    )
    assert whole.token_capacity / measured > 1.05  # the placement is what changed


def test_a_sweep_points_lambda_star_with_prefix_caching_places_uncached_tokens():
    from llmsched.analysis.points import critical_rate_of
    from llmsched.theory.means import cached_workload_mix, ideal_cached_prompt

    cfg = build_config(None, system_prompt=2048, prefix_caching=True, num_requests=500, cost_model=H200)
    mix = cached_workload_mix(cfg.workload, cfg.block_size)
    assert mix.mean_cached == ideal_cached_prompt(cfg.workload, cfg.block_size)
    assert mix.mean_cached > 2000  # every prompt but the first finds the system prompt
    rate = critical_rate_of(cfg)
    plain = capacity(
        H200, 512, mix.mean_prompt, mix.mean_output, cached_prompt=mix.mean_cached, mix=workload_mix(cfg.workload)
    )
    assert rate < 0.95 * plain.critical_rate


def test_orca_passes_lambda_star_where_split_steps_are_cheaper_but_not_the_shape_bound():
    """The H200 Llama-3.2-1B profile times decode-only steps as CUDA graphs: Orca, which
    runs prefill and decode in separate steps, served about 7% above lambda* (full mixed
    steps), which `capacity` called an upper bound. The LP over step shapes bounds it."""
    cost = "profile:h200-llama-3.2-1b"
    workload = build_config(None, num_requests=6000).workload
    mp, mo = workload_means(workload)
    rep = capacity(cost, 512, mp, mo, mix=workload_mix(workload))
    assert rep.shape_bound_rate > 1.05 * rep.critical_rate
    served = simulate(cost_model=cost, policy="orca", rate=200, num_requests=6000, out=None).summary
    assert 1.03 * rep.critical_rate < served["request_throughput"] < rep.shape_bound_rate
    # a load-only model has no shapes to trade: theorem 2's C / w is the bound
    assert capacity("paper", 512, mp, mo).shape_bound_rate is None
    assert capacity(H200, 512, mp, mo, mix=workload_mix(workload), peak=False).shape_bound_rate is None


def test_prefix_caching_without_shared_prefixes_keeps_lambda_star(tmp_path):
    """Caching on for a workload the cache serves nothing of moved a sweep point's lambda*
    by 2% (a smaller sample), and a trace's was taken from its first 20,000 rows."""
    from llmsched.analysis.points import critical_rate_of

    laws = {"prompt": "lognormal:mean=1000,sigma=1.5,max=32000", "output": "geometric:mean=300,max=4096"}
    rates = [
        critical_rate_of(build_config(None, cost_model=H200, b_max=512, prefix_caching=pc, **laws))
        for pc in (False, True)
    ]
    assert rates[0] == rates[1]
    # a trace longer than the cache replay's sample: the whole trace's lengths count
    rows = ["arrival_s,prompt_tokens,output_tokens"]
    rows += [f"{i * 0.01:.2f},{100 + i % 300},{50}" for i in range(20_000)]
    rows += [f"{200 + i * 0.01:.2f},{1500 + i % 1500},{50}" for i in range(5_000)]
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(rows) + "\n")
    rates = [
        critical_rate_of(build_config(None, cost_model=H200, b_max=512, prefix_caching=pc, trace=str(trace)))
        for pc in (False, True)
    ]
    assert rates[0] == rates[1]


def _physical_profile(rng) -> ProfileCostModel:
    """A profile of random scales whose tables have the shapes GPU time has: linear work and
    LM head linear in tokens, decode attention linear in the KV it reads, prefill attention
    in the attention work c * (ctx + (c + 1) / 2), each above a launch floor."""
    lin0, lin1 = rng.uniform(1, 10), rng.uniform(1e-3, 2e-2)
    dec, dec_floor = rng.uniform(1e-6, 1e-4), rng.uniform(0.005, 0.05)
    pre, pre_floor = rng.uniform(1e-8, 1e-6), rng.uniform(0.005, 0.05)
    lm0, lm1 = rng.uniform(0.05, 0.2), rng.uniform(1e-4, 1e-3)
    sizes, contexts = (1, 16, 64, 256, 1024, 4096), (0, 1024, 8192, 65536)
    tables = {
        "linear": [(n, "eager", lin0 + lin1 * n) for n in sizes],
        "lm_head": [(n, lm0 + lm1 * n) for n in sizes],
        "decode_attn": [(n, c, dec_floor + dec * n * max(c, 1)) for n in sizes for c in contexts],
        "prefill_attn": [(n, c, pre_floor + pre * n * (c + (n + 1) / 2)) for n in sizes for c in contexts],
    }
    return ProfileCostModel(tables, int(rng.integers(1, 40)))


def _random_hits(rng, n_max: int):
    """Random lengths (prompts from a few tokens to tens of thousands) and a random pattern
    of prefix-cache hits: some requests, each a random share of its prompt."""
    n = int(rng.integers(1, n_max))
    prompts = np.maximum(2, np.rint(rng.lognormal(rng.uniform(1, 10), rng.uniform(0, 2), n))).astype(int)
    outputs = np.maximum(1, np.rint(rng.lognormal(rng.uniform(0, 6), 1, n))).astype(int)
    hit = rng.random(n) < rng.uniform(0.05, 1)
    hit[int(rng.integers(n))] = True
    share = rng.uniform(0, 1, n) ** rng.uniform(0.2, 5)
    cached = np.where(hit, np.floor(share * (prompts - 1)), 0).astype(int)
    return prompts, outputs, cached


def _lambda_stars(cost, b_max, prompts, outputs, cached) -> tuple[float, float]:
    """(lambda* without caching, lambda* with `cached` prompt tokens served by the cache)."""
    mp, mo = prompts.mean(), outputs.mean()
    off = capacity(cost, b_max, mp, mo, mix=LengthMix(prompts, outputs), peak=False)
    mix = LengthMix(prompts, outputs, cached)
    on = capacity(cost, b_max, mp, mo, cached_prompt=mix.mean_cached, mix=mix, peak=False)
    return off.critical_rate, on.critical_rate


def test_prefix_caching_never_lowers_lambda_star():
    """Cached tokens are only removed work, and the uncached ones run at the same contexts,
    so lambda* with caching is at least lambda* without. It came out up to 24% below when a
    step's prefill was a sample of 256 windows (on a Mooncake head, 3% below) or a rounded
    share of the budget (a workload's only decoder dropped from the step without caching)."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        cost = _physical_profile(rng)
        b_max = int(rng.choice([8, 16, 64, 256, 512, 2048]))
        off, on = _lambda_stars(cost, b_max, *_random_hits(rng, 80))
        assert on >= off
    # the H200 profile, budgets whose prefill share fills its smallest measured chunk
    h200 = make_cost_model(H200)
    for _ in range(20):
        off, on = _lambda_stars(h200, int(rng.choice([512, 2048])), *_random_hits(rng, 80))
        assert on >= off


def test_means_given_are_timed_as_lengths_that_do_not_vary():
    """`capacity --mean-prompt 300 --mean-output 11` (1B profile, no overlap, b_max 256) gave
    147.95 req/s against 121.40 for `--prompt const:300 --output const:11` and 121.4
    served saturated: the means' contexts timed a step's prefill as whole prompts plus one
    mid-prompt chunk (a window across two prompts paid one chunk) and rounded the prompts
    completing it. Means are now timed as the constant-length mix at them."""
    cost = "profile:h200-llama-3.2-1b,overlap=0"
    for b_max, mp, mo in ((256, 300, 11), (256, 3000, 11), (512, 1000, 200)):
        given = capacity(cost, b_max, float(mp), float(mo), k_max=64 if mp == 1000 else None)
        mixed = capacity(cost, b_max, float(mp), float(mo), mix=LengthMix([mp], [mo]), k_max=64 if mp == 1000 else None)
        assert given.critical_rate == pytest.approx(mixed.critical_rate, rel=1e-9), (b_max, mp, mo)
        assert given.contexts == "mean lengths"
    r = simulate(cost_model=cost, prompt="const:300", output="const:11", b_max=256, rate=400, num_requests=5000, seed=1)
    served = r.summary["request_throughput"]
    assert r.summary["full_budget_step_share"] > 0.99  # saturated
    assert capacity(cost, 256, 300.0, 11.0).critical_rate == pytest.approx(served, rel=0.01)


def test_means_with_a_cache_time_each_chunk_after_its_cached_prefix():
    """A decode server's 8,002-token prompts with 8,001 cached (docs/networks.md): the
    means' contexts put the uncached token mid-prompt, 3,649.5 tokens/s against the
    constant-length mix's 3,458.9 (the simulator served 3,467)."""
    given = capacity("profile", 256, 8002.0, 200.0, cached_prompt=8001.0, peak=False)
    mixed = capacity(
        "profile", 256, 8002.0, 200.0, cached_prompt=8001.0, mix=LengthMix([8002], [200], [8001]), peak=False
    )
    assert given.token_capacity == pytest.approx(mixed.token_capacity, rel=1e-9)
    assert given.contexts == "mean lengths"


def test_a_fractional_mean_prompt_is_two_whole_lengths_around_it():
    for p in (300.5, 1.25, 1023.7):
        mix = LengthMix.of_means(p, 11.5)
        assert mix.mean_prompt == pytest.approx(p, abs=1 / 256)
        assert set(np.unique(mix._prompts)) <= {int(p), int(p) + 1}
        assert mix.decode_context == pytest.approx(mix.mean_prompt + 11.5 / 2)
