"""A network result's per-server, per-class and per-replica metrics come from one grouping
pass over the calls (`network_result.group_indices`, `_split_codes`); they must equal the
straightforward computation that scans every call once per server, class or replica (the
code before 2026-12-03), on random networks (servers with replicas, prefix caching,
back-pressure, a max_time_s stop that leaves calls unfinished)."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.core.request import NS
from llmsched.sim.network_result import (
    _codes,
    _latency_stats,
    _split_codes,
    decode_time_s,
    group_indices,
    service_time_s,
    simulate_network,
)


def _a(col):
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)


def _random_network(seed: int, control: str = "none") -> dict:
    rng = np.random.default_rng(seed)
    n_servers = int(rng.integers(4, 8))
    servers = {}
    for i in range(n_servers):
        s = {"policy": "sarathi", "b_max": int(rng.choice([64, 128, 256])), "cost_model": "paper"}
        if rng.random() < 0.5:
            s.update(replicas=int(rng.integers(2, 4)), router=str(rng.choice(["jsq", "random", "round-robin"])))
        if rng.random() < 0.3:
            s.update(prefix_caching=True, block_size=16)
        servers[f"s{i}"] = s
    jobs = {}
    for j in range(int(rng.integers(2, 4))):
        hops = rng.choice(n_servers, size=int(rng.integers(1, 5)))
        route = [
            {
                "call": {
                    "server": f"s{h}",
                    "prompt": f"geometric:{int(rng.integers(10, 80))}",
                    "output": f"geometric:{int(rng.integers(2, 20))}",
                    "context": bool(rng.random() < 0.5),
                }
            }
            for h in hops
        ]
        jobs[f"J{j}"] = {"arrival": {"process": "poisson", "rate": float(rng.uniform(0.5, 3.0))}, "route": route}
    return {"servers": servers, "jobs": jobs, "num_jobs": 300, "seed": int(seed), "control": control}


def _plain_per_server(res) -> dict:
    """Each server's metrics by one boolean scan of every call per server (as before)."""
    st = res.stats
    where = np.asarray(st.call_server, dtype=object)
    e2e_all, ttft_all = _a(st.call_e2e), _a(st.call_ttft)
    prompt, output, cached = _a(st.call_prompt), _a(st.call_output), _a(st.call_cached)
    out = {}
    for name in dict.fromkeys(rep["server"] for rep in st.replicas):
        sel = where == name
        e2e, ttft = e2e_all[sel], ttft_all[sel]
        ok = e2e >= 0
        sims = [r["sim"] for r in st.replicas if r["server"] == name]
        out[name] = {
            "calls": int(sel.sum()),
            "completed_calls": int(ok.sum()),
            **_latency_stats("ttft", ttft[ok & (ttft >= 0)]),
            **_latency_stats("e2el", e2e[ok]),
            "decode_time_s": decode_time_s(sims, output[sel]),
            "service_time_s": service_time_s(sims, (prompt - cached)[sel], output[sel], st.spec.servers[name].b_max),
        }
    return out


def _plain_per_class(res) -> dict:
    st = res.stats
    classes = np.asarray(st.call_class, dtype=object)
    e2e, ttft = _a(st.call_e2e), _a(st.call_ttft)
    out = {}
    for cls in st.spec.call_classes():
        sel = classes == cls
        ok = sel & (e2e >= 0)
        out[cls] = {
            "calls": int(sel.sum()),
            "completed": int(ok.sum()),
            **_latency_stats("ttft", ttft[ok & (ttft >= 0)]),
            **_latency_stats("e2el", e2e[ok]),
        }
    return out


@pytest.mark.parametrize(
    ("seed", "control", "max_time_s"),
    [(1, "none", None), (2, "none", 60.0), (3, "backpressure", None), (4, "none", None), (5, "backpressure", 40.0)],
)
def test_grouped_metrics_equal_per_server_scans(seed, control, max_time_s):
    res = simulate_network(_random_network(seed, control), max_time_s=max_time_s)
    st = res.stats
    s = res.summary
    plain = _plain_per_server(res)
    assert set(plain) == set(s["servers"])
    for name, want in plain.items():
        got = {k: s["servers"][name][k] for k in want}
        assert got == want, name  # exact: the same calls in the same order
    assert s["classes"] == _plain_per_class(res)
    # the groups themselves: each server's / class's / replica's call indices, ascending
    where = np.asarray(st.call_server, dtype=object)
    for name, idx in res.server_calls().items():
        np.testing.assert_array_equal(idx, np.flatnonzero(where == name))
    classes = np.asarray(st.call_class, dtype=object)
    for cls, idx in res.class_calls().items():
        np.testing.assert_array_equal(idx, np.flatnonzero(classes == cls))
    rep_of = _a(st.call_replica)
    for i, r in enumerate(res.replicas()):
        sel = rep_of == i
        assert r.stats.n == int(sel.sum())
        np.testing.assert_array_equal(r.arrival_s, _a(st.call_arrival)[sel] / NS)
        np.testing.assert_array_equal(r.prompt, _a(st.call_prompt)[sel])
    # the per-job sums: each server's calls per job times its times
    jobs = int(res.job_arrived.sum())
    dec = [(where == n).sum() / jobs * d for n, d in res.decode_times().items() if d and jobs]
    assert res.job_decode_time_s() == (float(sum(dec)) if dec else None)
    # prefix caching: the saved share over the admitted calls of the server
    for name in st.spec.servers:
        caches = [r.stats.prefix for r in res.replicas() if r.config["server"] == name and r.stats.prefix]
        if not caches:
            assert res.saved_work_share(name) is None
            continue
        sel = (where == name) & (_a(st.call_queue) >= 0)
        work = int((_a(st.call_prompt)[sel] + _a(st.call_output)[sel] - 1).sum())
        hits = sum(c["first_admission_hit_tokens"] for c in caches)
        assert res.saved_work_share(name) == (min(1.0, hits / work) if work > 0 else 0.0)


def test_split_codes_equals_one_scan_per_code():
    rng = np.random.default_rng(0)
    for k in (1, 3, 20, 40000):  # (40000: past the 16-bit keys)
        codes = rng.integers(-1, k + 2, size=5000)  # -1 and k, k+1: in no group
        groups = _split_codes(codes, k)
        assert len(groups) == k
        for i in {0, k - 1, *rng.integers(0, k, size=10).tolist()}:
            np.testing.assert_array_equal(groups[i], np.flatnonzero(codes == i))
    assert [len(g) for g in _split_codes(np.zeros(0, dtype=np.int64), 3)] == [0, 0, 0]


def test_group_indices_and_codes_equal_scans():
    rng = np.random.default_rng(1)
    names = ["b", "a", "a[1]", "z", "é", "a "]
    values = [names[i] for i in rng.integers(0, len(names), size=3000)]
    groups = group_indices(values, ["a", "b", "z", "missing"])
    obj = np.asarray(values, dtype=object)
    for n in ("a", "b", "z", "missing"):
        np.testing.assert_array_equal(groups[n], np.flatnonzero(obj == n))
    got_names, got_codes = _codes(values)
    want_names, want_codes = np.unique(np.asarray(values, dtype=str), return_inverse=True)
    assert got_names == want_names.tolist()
    np.testing.assert_array_equal(got_codes, want_codes.reshape(-1))
