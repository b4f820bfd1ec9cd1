"""Prefix caching in the shared KV accounting: hand cases and properties."""

from __future__ import annotations

import io
import re
from collections import Counter, OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsched
from llmsched.core import ConfigError, make_cost_model
from llmsched.core.constraints import Constraints, check_prefix_block_size
from llmsched.core.prefix_cache import PrefixCache, held_ids
from llmsched.policies import ADMISSION_POLICIES, BATCH_POLICIES, BatchPolicy, Scheduler
from llmsched.policies.spec import SchedulerSpec
from llmsched.sim.result import SimResult
from llmsched.sim.simulator import simulate_trace

BS = 16


def trace(rows, blocks):
    a, p, o = zip(*rows)
    return SimpleNamespace(
        arrival_s=np.array(a, float), prompt=np.array(p), output=np.array(o), tag=None, blocks=list(blocks)
    )


def run(rows, blocks, fast=True, cost="const:10", **spec):
    spec = {"policy": "sarathi", "b_max": 512, "prefix_caching": True, "block_size": BS, **spec}
    sched = SchedulerSpec(**spec).build()
    buf = io.StringIO()
    tr = trace(rows, blocks)
    stats = simulate_trace(tr, sched, make_cost_model(cost), fast=fast, steps_file=buf)
    return stats, prefills(buf.getvalue())


def prefills(steps_csv: str) -> dict[int, list[int]]:
    """Prefill chunks per request id, in step order."""
    out: dict[int, list[int]] = {}
    for line in steps_csv.splitlines():
        for e in line.split(",")[6].split():
            rid, work = e.split(":")
            if work not in ("d", "x"):  # (a decode token, a preemption)
                out.setdefault(int(rid), []).append(int(work[1:]))
    return out


# ---- the cache alone ---------------------------------------------------------------------
def test_cache_match_acquire_release_evict_order():
    pc = PrefixCache(BS)
    a = (1, 2, 3)
    held_a: list = []
    assert pc.insert(a, 0, 3, held_a) == 3 and held_ids(held_a) == [1, 2, 3]
    other: list = []
    assert pc.insert((1, 2), 1, 2, other) == 0 and other == []  # cached already: the caller keeps its own copy
    assert pc.match((1, 2, 3, 4), 10) == (3, 3)
    assert pc.match((1, 2, 3), 2) == (2, 2)  # the limit
    assert pc.match((1, 9, 10), 10) == (1, 1)  # divergence: the chain stops at the first miss
    assert pc.match((1, 2, 3), 10, freed=set(pc.let_go(held_a, {}))) == (3, 0)
    assert pc.release(held_a) == (3, 3)
    assert pc.n_free == 3 and pc.match((1, 2, 3), 10) == (3, 0)  # free blocks still hit
    assert pc.free_order() == [3, 2, 1]  # deepest first
    held_b, was_free = pc.acquire((1, 2, 3), 1)
    assert was_free == 1 and pc.refs(1) == 1 and pc.n_free == 2
    assert pc.match((1, 2, 3), 10, freed=set(pc.let_go(held_b, {}))) == (3, 0)
    assert pc.release(held_b) == (1, 1)  # 1 is now the most recently released
    assert pc.free_order() == [3, 2, 1]
    evicted = []
    pc.on_evict = evicted.append
    assert pc.evict(2) == 2 and evicted == [3, 2]
    assert pc.evict(5) == 1 and evicted == [3, 2, 1] and len(pc) == 0
    assert pc.evictions == 3 and pc.refs(1) == -1


def test_referenced_blocks_are_never_evicted():
    pc = PrefixCache(BS)
    held_a: list = []
    held_b: list = []
    pc.insert((7,), 0, 1, held_a)
    pc.insert((8,), 0, 1, held_b)
    held_c, _ = pc.acquire((7,), 1)  # two holders
    assert pc.evict(2) == 0 and 7 in pc
    assert pc.release(held_c) == (1, 0) and pc.release(held_a) == (1, 1) and pc.release(held_b) == (1, 1)
    assert pc.evict(1) == 1 and 7 not in pc and 8 in pc


def test_a_hit_into_the_middle_of_a_run_splits_it():
    pc = PrefixCache(BS)
    a = tuple(range(100, 110))  # one request's ten blocks: one run
    held_a: list = []
    pc.insert(a, 0, 4, held_a)
    pc.insert(a, 4, 10, held_a)  # its next chunk extends its run
    assert len(held_a) == 2 and held_ids(held_a) == list(a)
    b = a[:6] + (200, 201)  # shares six blocks, then branches off
    assert pc.match(b, 8) == (6, 6)
    held_b, was_free = pc.acquire(b, 6)
    assert was_free == 0
    assert pc.refs(a[5]) == 2 and pc.refs(a[6]) == 1  # the run is cut where b's hit ends
    # a's holding now reaches the piece beyond the cut; b's own blocks branch off at 6
    assert held_ids(held_a) == list(a) and held_ids(held_b) == list(a[:6])
    assert pc.insert(b, 6, 8, held_b) == 2 and held_ids(held_b) == list(b)
    assert pc.match(b, 8) == (8, 8) and pc.match(a, 10) == (10, 10)
    # a preemption of a frees only what a alone holds: its blocks after the cut
    assert pc.match(a, 10, freed=set(pc.let_go(held_a, {}))) == (10, 6)
    assert pc.release(held_a) == (10, 4)
    assert pc.free_order() == list(a[9:5:-1])
    assert pc.release(held_b) == (8, 8)
    assert pc.free_order() == [*a[9:5:-1], 201, 200, *a[5::-1]]


def test_a_free_run_split_keeps_its_tail_first_in_the_lru():
    pc = PrefixCache(BS)
    a = (1, 2, 3, 4, 5)
    held_a: list = []
    pc.insert(a, 0, 5, held_a)
    pc.release(held_a)
    held_c: list = []
    pc.insert((9,), 0, 1, held_c)
    pc.release(held_c)
    assert pc.free_order() == [5, 4, 3, 2, 1, 9]
    held_b, was_free = pc.acquire(a, 2)  # the head of a free run is taken again
    assert was_free == 2 and pc.free_order() == [5, 4, 3, 9]
    pc.release(held_b)
    assert pc.free_order() == [5, 4, 3, 9, 2, 1]


def test_eviction_trims_a_run_from_its_deep_end():
    pc = PrefixCache(BS)
    a = (1, 2, 3, 4, 5, 6)
    held_a: list = []
    pc.insert(a, 0, 6, held_a)
    pc.release(held_a)
    assert pc.evict(2) == 2 and pc.free_order() == [4, 3, 2, 1]
    assert pc.match(a, 6) == (4, 0)
    # a prompt that computes the evicted tail again caches it as a new run after the old one
    held_b, _ = pc.acquire(a, 4)
    assert pc.insert(a, 4, 6, held_b) == 2 and pc.match(a, 6) == (6, 6)
    assert pc.release(held_b) == (6, 6) and pc.free_order() == [6, 5, 4, 3, 2, 1]
    assert pc.evict(6) == 6 and len(pc) == 0 and pc.n_free == 0


def test_any_cached_finds_runs_starting_in_or_before_the_range():
    pc = PrefixCache(BS)
    a = (1, 2, 3, 4, 5)
    b = (1, 2, 9, 10)  # branches off a after two blocks
    held: list = []
    pc.insert(a, 0, 3, held)  # one run: blocks 0..2 of a
    assert pc.any_cached(a, 0, 1) and pc.any_cached(a, 1, 2) and pc.any_cached(a, 2, 5)
    assert not pc.any_cached(a, 3, 5) and not pc.any_cached(a, 2, 2)
    assert pc.any_cached(b, 1, 3) and not pc.any_cached(b, 2, 4)
    pc.release(held)
    pc.evict(1)  # the run's deep end: block 2 goes
    assert not pc.any_cached(a, 2, 5) and pc.any_cached(a, 1, 5)
    held2: list = []
    pc.insert(a, 3, 5, held2)  # a run that starts at 3, after a gap
    assert pc.any_cached(a, 2, 4) and pc.any_cached(a, 4, 5) and not pc.any_cached(a, 2, 3)


def test_a_block_cached_after_a_gap_stays_a_private_copy():
    # a holds the first block, b (the same prefix, running alongside) caches the next two;
    # a's run is evicted, so 2 and 3 are cached after a gap: a prompt that computes 1..4
    # caches 1 and 4 and keeps its own copies of 2 and 3
    pc = PrefixCache(BS)
    chain = (1, 2, 3, 4)
    held_a: list = []
    pc.insert(chain, 0, 1, held_a)
    held_b, _ = pc.acquire(chain, 1)
    pc.insert(chain, 1, 3, held_b)
    pc.release(held_a)
    pc.release(held_b)
    held_d, _ = pc.acquire(chain, 3)  # holds 1..3 again,
    pc.release(held_d)  # then lets them go: free order 3, 2, 1
    assert pc.free_order() == [3, 2, 1]
    held_e, _ = pc.acquire(chain, 1)
    held_f, _ = pc.acquire(chain, 3)
    pc.release(held_e)
    pc.release(held_f)  # free order: nothing (1 went first), then 3, 2, 1
    assert pc.evict(1) == 1 and pc.match(chain, 4) == (2, 0)
    pc2 = PrefixCache(BS)
    mid: list = []
    first: list = []
    pc2.insert(chain, 0, 1, first)
    pc2.insert(chain, 1, 3, mid)  # another holder's run starts at position 1
    pc2.release(first)
    assert pc2.evict(1) == 1 and pc2.match(chain, 4) == (0, 0)  # a gap at position 0
    own: list = []
    assert pc2.insert(chain, 0, 4, own) == 2 and held_ids(own) == [1, 4]
    assert pc2.refs(2) == 1 and pc2.refs(4) == 1 and pc2.match(chain, 4) == (4, 4)
    # a request that went through the gap privately: the run at 1..2 still covers its 2
    late: list = []
    assert pc2.insert(chain, 2, 3, late) == 0 and late == []


def test_a_prefix_computed_alongside_is_cached_from_where_the_prompts_branch():
    # y shares x's first five blocks but computed them itself while x's run was cached:
    # y caches only its own blocks 5..7, a run that starts where it branches off x's
    pc = PrefixCache(BS)
    x = tuple(range(10, 20))
    y = x[:5] + (30, 31, 32)
    held_x: list = []
    held_y: list = []
    pc.insert(x, 0, 10, held_x)
    assert pc.insert(y, 0, 8, held_y) == 3 and held_ids(held_y) == [30, 31, 32]
    assert pc.match(y, 8) == (8, 8)
    # a third request with y's prompt holds x's first five blocks and y's three: x's run
    # is cut where y branches off it
    held_z, was_free = pc.acquire(y, 8)
    assert was_free == 0 and held_ids(held_z) == list(y)
    assert [pc.refs(k) for k in y] == [2] * 5 + [2] * 3 and pc.refs(x[5]) == 1
    assert pc.check() == []
    assert pc.release(held_x) == (10, 5) and pc.free_order() == list(x[9:4:-1])
    assert pc.release(held_z) == (8, 5) and pc.release(held_y) == (3, 3)
    assert pc.free_order() == [*x[9:4:-1], *x[4::-1], 32, 31, 30]
    assert pc.match(x, 10) == (10, 0) and pc.match(y, 8) == (8, 0)
    assert pc.check() == []


def test_ids_that_are_not_prefix_ids_are_refused():
    # 5 starts a cached chain at position 0; another prompt has it at position 1: a
    # ConfigError (one line, exit 2 from the CLI), not a bare ValueError
    pc = PrefixCache(BS)
    pc.insert((5, 6), 0, 2, [])
    pc.insert((1,), 0, 1, [])
    with pytest.raises(ConfigError, match="block ids must be prefix ids") as info:
        pc.match((1, 5), 2)
    assert "\n" not in str(info.value)
    # as a hand-built Trace brings them to a simulation (a file's ids are chained on reading)
    from llmsched.workload import Trace

    t = Trace([0.0, 1.0, 2.0], [40, 40, 40], [3, 3, 3], block_ids=[5, 6, 1, 7, 1, 5], block_ptr=[0, 2, 4, 6])
    with pytest.raises(ConfigError, match="block ids must be prefix ids"):
        llmsched.simulate(trace=t, prefix_caching=True, cost_model="const:10")


class BlockByBlock:
    """The cache's rules one block id at a time (a dict of holders and an LRU of the free
    ids): what the runs must reproduce exactly."""

    def __init__(self):
        self.ref: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict()

    def match(self, keys, limit, freed=frozenset()):
        n = 0
        while n < min(limit, len(keys)) and keys[n] in self.ref:
            n += 1
        return n, sum(1 for k in keys[:n] if self.ref[k] and k not in freed)

    def acquire(self, keys):
        was_free = 0
        for k in keys:
            if not self.ref[k]:
                del self.free[k]
                was_free += 1
            self.ref[k] += 1
        return was_free

    def insert(self, keys):
        new = [k for k in keys if k not in self.ref]
        self.ref.update(dict.fromkeys(new, 1))
        return new

    def release(self, keys):
        freed = 0
        for k in keys:
            self.ref[k] -= 1
            if not self.ref[k]:
                self.free[k] = None
                freed += 1
        return freed

    def evict(self, n):
        out = list(self.free)[:n]
        for k in out:
            del self.free[k]
            del self.ref[k]
        return out


@st.composite
def chain_sets(draw):
    """Prompts as chains of prefix ids: each branches off an earlier one (or starts anew)."""
    ids: dict[tuple, int] = {}
    chains = []
    for _ in range(draw(st.integers(1, 8))):
        base = draw(st.sampled_from(chains)) if chains and draw(st.booleans()) else ()
        keep = draw(st.integers(0, len(base)))
        path = list(base[:keep])
        path += [(len(chains), j) for j in range(draw(st.integers(0 if keep else 1, 12)))]
        prefix: tuple = ()
        out = []
        for step in path:
            prefix = (*prefix, step)
            out.append(ids.setdefault(prefix, len(ids) + 1000))
        chains.append(tuple(out))
    return chains


@settings(max_examples=300, deadline=None)
@given(chains=chain_sets(), data=st.data())
def test_runs_follow_the_block_by_block_rules(chains, data):
    # requests run, cache their blocks a chunk at a time, hit, branch, leave and are
    # evicted in any order; every answer, the holders of every block and the eviction
    # order must be those of the block-by-block rules
    pc, ref = PrefixCache(BS), BlockByBlock()
    evicted: list = []
    pc.on_evict = evicted.append
    running = []  # [chain, holding, its ids, next block to compute]
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["admit", "admit", "compute", "compute", "leave", "evict"]))
        if op == "admit":
            keys = data.draw(st.sampled_from(chains))
            limit = data.draw(st.integers(0, len(keys)))
            n, held_n = pc.match(keys, limit)
            assert (n, held_n) == ref.match(keys, limit)
            holding, was_free = pc.acquire(keys, n) if n else ([], 0)
            assert was_free == ref.acquire(keys[:n])
            running.append([keys, holding, list(keys[:n]), n])
        elif op == "compute" and running:
            req = data.draw(st.sampled_from(running))
            keys, holding, ids, j = req
            if j < len(keys):
                upto = data.draw(st.integers(j + 1, len(keys)))
                new = ref.insert(keys[j:upto])
                assert pc.insert(keys, j, upto, holding) == len(new)
                ids += new
                req[3] = upto
                assert held_ids(holding) == ids
        elif op == "leave" and running:
            req = running.pop(data.draw(st.integers(0, len(running) - 1)))
            assert pc.release(req[1]) == (len(req[2]), ref.release(req[2][::-1]))
        elif op == "evict":
            k = data.draw(st.integers(0, 6))
            evicted.clear()
            assert pc.evict(k) == len(evicted)
            assert evicted == ref.evict(k)
        # a preemption's view: the blocks only some running request holds
        if running:
            keys, holding, ids, _ = running[-1]
            sole = set(pc.let_go(holding, {}))
            sole_ids = {k for k in ids if ref.ref[k] == 1}
            other = data.draw(st.sampled_from(chains))
            assert pc.match(other, len(other), sole) == ref.match(other, len(other), sole_ids)
        assert pc.blocks() == ref.ref
        assert pc.free_order() == list(ref.free)
        assert pc.check() == []


# ---- hit accounting in the simulator -----------------------------------------------------
def test_shared_prefix_is_not_computed_again():
    # B arrives after A finished: it reuses A's two full blocks and computes 8 tokens
    stats, pf = run([(0.0, 40, 2), (1.0, 40, 2)], [(1, 2), (1, 2)])
    assert pf[0] == [40] and pf[1] == [8]
    p = stats.prefix
    assert p["hit_tokens"] == 32 and p["hit_blocks"] == 2 and p["queried_blocks"] == 4
    assert p["queried_tokens"] == 80 and p["token_hit_rate"] == pytest.approx(32 / 80)


def test_divergence_mid_block_reuses_only_the_common_blocks():
    # B's second block differs (its content diverges somewhere inside it): one block reused
    stats, pf = run([(0.0, 40, 2), (1.0, 40, 2)], [(1, 2), (1, 3)])
    assert pf[1] == [24] and stats.prefix["hit_blocks"] == 1


def test_the_last_prompt_token_is_always_computed():
    # a 32-token prompt is two full blocks; reusing both would leave nothing to compute,
    # so only the first is reused and the last block is computed again
    stats, pf = run([(0.0, 32, 2), (1.0, 32, 2)], [(1, 2), (1, 2)])
    assert pf[1] == [16] and stats.prefix["hit_tokens"] == 16
    # a partial last block (40 = 2 full blocks + 8) is never cached: both full blocks hit
    stats, pf = run([(0.0, 40, 2), (1.0, 41, 2)], [(1, 2), (1, 2)])
    assert pf[1] == [9]


def test_caching_off_computes_everything():
    stats, pf = run([(0.0, 40, 2), (1.0, 40, 2)], [(1, 2), (1, 2)], prefix_caching=False)
    assert pf[1] == [40] and stats.prefix is None


def test_blocks_still_being_computed_are_not_reused():
    # A (40 tokens) is computed in chunks of 24; B with the same prompt arrives meanwhile.
    # After A's first chunk only block 1 is complete and cached: B reuses 16 tokens, not 32,
    # although A finishes block 2 in the very step B starts
    stats, pf = run([(0.0, 40, 1), (0.001, 40, 1)], [(1, 2), (1, 2)], b_max=24)
    assert pf[0] == [24, 16]
    assert pf[1] == [8, 16] and stats.prefix["hit_tokens"] == 16
    # admitted in the same step, neither reuses the other's blocks
    stats, pf = run([(0.0, 40, 1), (0.0, 40, 1)], [(1, 2), (1, 2)])
    assert pf == {0: [40], 1: [40]} and stats.prefix["hit_tokens"] == 0


def test_eviction_order_lru_and_deepest_first():
    # capacity 100. A (blocks 1, 2) then C (blocks 5, 6) run alone and leave four free cached
    # blocks, released deepest first: LRU order 2, 1, 6, 5. D has no blocks and needs 80
    # private slots: 80 + 64 cached is 44 over, so three blocks go (2, 1, 6). Then E with A's
    # prompt finds nothing and F with C's prompt hits block 5 only
    rows = [(0.0, 40, 1), (1.0, 40, 1), (2.0, 80, 1), (3.0, 40, 1), (4.0, 40, 1)]
    blocks = [(1, 2), (5, 6), None, (1, 2), (5, 6)]
    stats, pf = run(rows, blocks, kv_capacity=100)
    assert stats.prefix["evictions"] == 3
    assert pf[3] == [40] and pf[4] == [24]
    # D needs 50: 14 over, one block goes, A's deeper block 2; E reuses block 1, F both
    rows[2] = (2.0, 50, 1)
    stats, pf = run(rows, blocks, kv_capacity=100)
    assert stats.prefix["evictions"] == 1
    assert pf[3] == [24] and pf[4] == [8]


def test_shared_blocks_count_once_against_the_capacity():
    # A leaves a cached 64-token prefix. B and C share it, each needing 91 slots (72 + 20 - 1);
    # with capacity 120 both run at once (64 shared + 2 x 27 private), without caching C
    # waits for B
    rows = [(0.0, 72, 1), (0.5, 72, 20), (0.5, 72, 20)]
    blocks = [(1, 2, 3, 4)] * 3
    on, pf = run(rows, blocks, kv_capacity=120)
    off, _ = run(rows, blocks, kv_capacity=120, prefix_caching=False)
    assert pf[1] == [8] and pf[2] == [8]
    assert on.preemptions.sum() == 0
    assert off.queue_ns[2] >= off.e2e_ns[1]  # without caching C starts when B ends
    assert on.queue_ns[2] < off.queue_ns[2]
    assert on.e2e_ns[2] < off.e2e_ns[2]


def test_bad_block_size_is_a_config_error():
    with pytest.raises(ConfigError, match="block_size"):
        SchedulerSpec(prefix_caching=True, block_size=0).build()


class _Checked(BatchPolicy):
    """Sarathi's plan from outside llmsched.policies: its plans go through check_plan."""

    name = "checked-sarathi"

    def build(self, p):
        p.take_decodes()
        p.take_running_prefills()
        p.admit_waiting()
        return p.plan()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("checked", [False, True])
def test_preemption_stops_once_the_victims_shared_blocks_free_enough(fast, checked):
    # capacity 25, 4-token blocks. Six 1-token prompts (0-5) and two 5-token prompts (6, 7)
    # sharing their one full block X. At step 3 the 8 decoders need 8 slots, 5 are free:
    # preempting 7 frees its private slots (X is 6's too), preempting 6 then leaves X held by
    # no one (free, evictable): 9 slots, enough. The planner counted only blocks a single
    # victim held and preempted 5 too (vLLM V1 frees X with its last holder and stops)
    rows = [(0.0, 1, 20)] * 6 + [(0.001, 5, 20), (0.015, 5, 20)]
    blocks = [None] * 6 + [(1, 2), (1, 2)]
    sched = SchedulerSpec(policy="sarathi", b_max=64, kv_capacity=25, prefix_caching=True, block_size=4).build()
    if checked:
        sched = Scheduler(_Checked(), sched.admission, sched.constraints)
    buf = io.StringIO()
    simulate_trace(trace(rows, blocks), sched, make_cost_model("const:10"), fast=fast, steps_file=buf)
    step3 = buf.getvalue().splitlines()[3].split(",")
    assert step3[0] == "3"
    assert step3[4:] == ["6", "6", "7:x 6:x 0:d 1:d 2:d 3:d 4:d 5:d"]  # (was 5 decodes, 5 preempted too)


def test_let_go_frees_a_shared_run_with_its_last_holder():
    pc = PrefixCache(BS)
    a: list = []
    pc.insert((1, 2), 0, 2, a)
    b, _ = pc.acquire((1, 2), 2)
    c, _ = pc.acquire((1,), 1)  # splits the run: (1) held by 3, (2) by 2
    left: dict = {}
    assert pc.let_go(a, left) == []
    assert [(r.lo, r.hi) for r in pc.let_go(b, left)] == [(1, 2)]  # (2) had only a and b
    assert [(r.lo, r.hi) for r in pc.let_go(c, left)] == [(0, 1)]
    assert pc.let_go(a, {}) == [] and pc.n_free == 0  # nothing changed in the cache


@pytest.mark.parametrize("bad", [0, -16, True, 16.5, "16"])
def test_block_size_rule_is_the_same_everywhere(bad):
    # one rule (core.constraints.check_prefix_block_size), each caller's name for the value
    expected = f"must be a positive integer, got {bad!r}"
    with pytest.raises(ConfigError, match=f"^the prefix-cache block size {re.escape(expected)}$"):
        Constraints(prefix_block_size=bad)
    for build in (
        lambda: SchedulerSpec(block_size=bad).build(),  # checked with prefix caching off too
        lambda: llmsched.simulate(block_size=bad, num_requests=10),
    ):
        with pytest.raises(ConfigError, match=f"^block_size {re.escape(expected)}$"):
            build()


def test_a_whole_float_block_size_is_taken_everywhere():
    """16.0 was refused as a block size while `simulate(k_max=16.0)` ran k_max 16: whole
    floats are taken by every integer option (core.checks.whole_as_int)."""
    for whole in (16.0, np.float64(16)):
        assert Constraints(prefix_block_size=whole).prefix_block_size == 16
        assert SchedulerSpec(block_size=whole, prefix_caching=True).build().constraints.prefix_block_size == 16
        run = llmsched.simulate(block_size=whole, prefix_caching=True, system_prompt=32, num_requests=10)
        assert run.config["block_size"] == 16


def test_block_size_limit_is_the_same_everywhere(tmp_path, capsys):
    """simulate refused --block-size 2000000 (1..1048576, the trace readers' limit), serve
    --backend sim started with it and generate failed on the KV memory: one limit, one
    message."""
    from helpers import one_line_error

    from llmsched.workload import Trace, read_trace

    msg = "block_size must be at most 1,048,576 tokens, got 2,000,000"
    big = ["--block-size", "2000000"]
    one_line_error(capsys, ["simulate", "--num-requests", "5", "--out", "", *big], msg)
    one_line_error(capsys, ["simulate", "--num-requests", "5", "--prefix-caching", "--out", "", *big], msg)
    one_line_error(capsys, ["serve", "--backend", "sim", "--prefix-caching", *big], msg)
    for build in (
        lambda: Constraints(prefix_block_size=2_000_000),
        lambda: SchedulerSpec(block_size=2_000_000).build(),
        lambda: Trace([0.0], [5], [1], block_size=2_000_000),
    ):
        with pytest.raises(ConfigError, match="block[_ ]size must be at most 1,048,576 tokens, got 2,000,000$"):
            build()
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,block_ids@2000000\n0,5,1,\n")
    with pytest.raises(ConfigError, match="^the block size in column 'block_ids@2000000' must be at most 1,048,576"):
        read_trace(p)
    assert check_prefix_block_size(1 << 20) == 1 << 20
    pytest.importorskip("torch")
    from llmsched.engine import LLMEngine

    with pytest.raises(ConfigError, match=f"^{msg}$"):  # before the model is read
        LLMEngine(str(tmp_path / "no-model"), block_size=2_000_000)


def test_block_size_rule_accepts_positive_ints():
    assert check_prefix_block_size(16) == 16
    assert Constraints(prefix_block_size=1).prefix_block_size == 1
    assert Constraints().prefix_block_size is None  # off
    assert SchedulerSpec(prefix_caching=True, block_size=32).build().constraints.prefix_block_size == 32
    # the API takes a numpy integer as the int it is (a spec or Constraints does not)
    r = llmsched.simulate(
        block_size=np.int64(32),
        prefix_caching=True,
        cost_model="paper",
        num_requests=5,
        prompt="const:64",
        system_prompt=64,
    )
    assert r.summary["prefix_cache"]["block_size"] == 32


# ---- properties ----------------------------------------------------------------------------
def audit(scheduler, problems):
    """Check the KV accounting at every step boundary (before each plan)."""
    inner = scheduler.plan
    cap = scheduler.constraints.kv_capacity

    def plan(state):
        pc = state.prefix
        bs = pc.block_size
        held = Counter()
        private = 0
        refs = pc.blocks()
        for r in state.running.values():
            ids = held_ids(r.cached) if r.cached else []
            sole = sum(1 for k in ids if refs[k] == 1)
            private += state.footprint(r) - bs * sole  # footprint: private + blocks only r holds
            held.update(ids)
        referenced = {k: c for k, c in refs.items() if c}
        if held != Counter(referenced):
            problems.append("reference counts differ from the requests holding the blocks")
        if state.kv_used != private + bs * len(referenced):
            problems.append(f"kv_used {state.kv_used} != private {private} + referenced {len(referenced)} blocks")
        free = pc.free_order()
        if len(free) != pc.n_free or set(free) != set(refs) - set(referenced):
            problems.append("free list differs from the unreferenced blocks")
        problems.extend(pc.check())
        if cap and state.kv_used + bs * pc.n_free > cap:
            problems.append(f"KV over capacity: {state.kv_used} used + {bs * pc.n_free} cached > {cap}")
        return inner(state)

    scheduler.plan = plan
    return scheduler


@st.composite
def cached_workloads(draw):
    n = draw(st.integers(1, 25))
    bs = draw(st.sampled_from([4, 8, 16]))
    rows, blocks = [], []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.005, 0.02, 0.1]))
        p = draw(st.integers(1, 60))
        o = draw(st.integers(1, 20))
        family = draw(st.integers(0, 3))  # prompts of a family share leading blocks
        shared = draw(st.integers(0, 8))
        ids = tuple((family, j) if j < shared else (family, j, len(rows)) for j in range(p // bs))
        rows.append((t, p, o))
        blocks.append(tuple(hash(x) for x in ids) or None)
    return rows, blocks, bs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_accounting_never_exceeds_capacity_never_leaks_and_fast_equals_exact(data):
    rows, blocks, bs = data.draw(cached_workloads())
    need = max(p + o - 1 for _, p, o in rows)
    spec = SchedulerSpec(
        policy=data.draw(st.sampled_from(sorted(BATCH_POLICIES))),
        admission=data.draw(st.sampled_from(sorted(ADMISSION_POLICIES))),
        b_max=data.draw(st.integers(1, 64)),
        k_max=data.draw(st.one_of(st.none(), st.integers(1, 8))),
        kv_capacity=data.draw(st.one_of(st.none(), st.integers(need, need + 80))),
        max_running=data.draw(st.one_of(st.none(), st.integers(1, 6))),
        prefix_caching=True,
        block_size=bs,
    )
    cost = data.draw(st.sampled_from([make_cost_model("const:10"), make_cost_model("paper:c=1,a=3,b0=4")]))
    tr = trace(rows, blocks)
    out = {}
    for fast in (False, True):
        problems: list[str] = []
        sched = audit(spec.build(), problems)
        buf = io.StringIO()
        stats = simulate_trace(tr, sched, cost, fast=fast, steps_file=buf)
        assert problems == []
        res = SimResult({}, stats, tr.arrival_s, tr.prompt, tr.output, None)
        out[fast] = (res, buf.getvalue())
    (exact, exact_steps), (fast, fast_steps) = out[False], out[True]
    assert exact.summary["completed"] == len(rows)
    # no leak: everything that is left is free cached blocks, and the hits are consistent
    p = exact.stats.prefix
    assert p["cached_blocks"] == p["free_cached_blocks"]
    if exact.summary["preemptions"] == 0:
        computed = sum(sum(v) for v in prefills(exact_steps).values())
        assert computed + p["hit_tokens"] == sum(r[1] for r in rows)
        assert p["hit_tokens"] == bs * p["hit_blocks"]
    # the fast path gives the same steps, times and metrics with caching on
    assert fast_steps == exact_steps
    assert np.array_equal(fast.stats.ttft_ns, exact.stats.ttft_ns)
    sf, se = dict(fast.summary), dict(exact.summary)
    sf.pop("wall_s"), se.pop("wall_s")
    assert sf == se


@pytest.mark.parametrize(
    "seed, admission, kv, block_size, b_max",
    [(12, "twp", 32000, 16, 512), (13, "fcfs", 20000, 32, 128)],
)
def test_fast_equals_exact_when_a_prefill_completes_a_cached_block_evicted_in_its_batch(
    seed, admission, kv, block_size, b_max
):
    # a running request prefills through blocks cached but held by no one (it missed them
    # at admission: a block before them was evicted). Step by step it completes such a
    # block while the cached copy is still there, keeping its own copy private, and a later
    # step's start evicts the cached one; a batch of repeated steps evicted first and
    # cached the request's copies instead (one eviction more or fewer, and then other hits)
    out = []
    for fast in (True, False):
        r = llmsched.simulate(
            workload=dict(system_prompt=512, turns="geometric:3", think_time_s=2, rate=3, num_requests=200, seed=seed),
            kv_capacity=kv,
            prefix_caching=True,
            block_size=block_size,
            policy="sarathi",
            b_max=b_max,
            admission=admission,
            fast=fast,
            verdict=False,
        )
        s = r.stats
        out.append((s.prefix, s.ttft_ns.tobytes(), s.e2e_ns.tobytes(), s.timeseries))
    (fast, *fast_rest), (exact, *exact_rest) = out
    assert fast["evictions"] == exact["evictions"] and fast == exact
    assert fast_rest == exact_rest


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_nothing_shared_means_the_same_steps_as_caching_off(data):
    # every block unique: caching finds nothing to reuse, and its accounting (contexts,
    # KV, preemptions, evictions of blocks no one will use) must not change a single step
    rows, blocks, bs = data.draw(cached_workloads())
    blocks = [None if b is None else tuple(hash((i, k)) for k in b) for i, b in enumerate(blocks)]
    need = max(p + o - 1 for _, p, o in rows)
    base = dict(
        policy=data.draw(st.sampled_from(sorted(BATCH_POLICIES))),
        b_max=data.draw(st.integers(1, 64)),
        kv_capacity=data.draw(st.one_of(st.none(), st.integers(need, need + 80))),
        block_size=bs,
    )
    cost = "paper:c=1,a=3,b0=4"
    on = run(rows, blocks, cost=cost, prefix_caching=True, **base)
    off = run(rows, blocks, cost=cost, prefix_caching=False, **base)
    if off[0].preemptions.sum():
        # a preempted request reuses its own blocks when it comes back, so the runs part
        assert on[0].unfinished == 0
        return
    assert on[1] == off[1]
    assert np.array_equal(on[0].e2e_ns, off[0].e2e_ns) and np.array_equal(on[0].ttft_ns, off[0].ttft_ns)
    assert on[0].prefix["hit_tokens"] == 0


def test_theorem2_without_the_cached_work():
    from llmsched.theory import capacity

    off = capacity("paper", 512, 1000.0, 100.0)
    on = capacity("paper", 512, 1000.0, 100.0, cached_prompt=600.0)
    assert on.work_per_request == 1000 - 600 + 100 - 1
    assert on.critical_rate == pytest.approx(off.critical_rate * off.work_per_request / on.work_per_request)
    with pytest.raises(ConfigError, match="cached prompt"):
        capacity("paper", 512, 1000.0, 100.0, cached_prompt=1000.0)


def test_preempted_requests_hitting_their_own_blocks_again_are_not_counted_as_saved_work():
    # a 256-token shared system prompt is all a request can find cached; under KV pressure
    # preempted requests re-hit their own prompt blocks on re-admission, which only saves
    # the recomputation: theorem 2's work per request must not shrink by those hits
    kw = dict(cost_model="paper", rate=8, system_prompt=256, prompt="geometric:100", output="geometric:100")
    kw.update(num_requests=600, prefix_caching=True)
    free = llmsched.simulate(**kw).summary
    tight = llmsched.simulate(**kw, kv_capacity=2000).summary
    assert tight["preemptions"] > 0 and tight["prefix_cache"]["hit_tokens"] > 600 * 256  # re-hits happened
    assert tight["cached_prompt_tokens_per_request"] <= 256
    assert tight["prefix_cache"]["first_admission_hit_tokens"] <= 600 * 256
    assert tight["critical_rate"] == pytest.approx(free["critical_rate"], rel=0.02)


def test_a_max_time_stop_counts_requests_never_admitted_at_the_admitted_hit_rate():
    # a stopped overloaded run admits only part of the requests; those it never admitted
    # found nothing cached yet, which is no zero hit: counting them as one put the cached
    # prompt tokens per request at a third of the run's and lambda* ~35% low
    kw = dict(workload=dict(system_prompt=2048, rate=30, num_requests=1500), prefix_caching=True)
    full = llmsched.simulate(**kw).summary
    cut = llmsched.simulate(**kw, max_time_s=30)
    s = cut.summary
    admitted = int((cut.stats.queue_ns >= 0).sum())
    assert s["cached_prompt_tokens_per_request"] == pytest.approx(full["cached_prompt_tokens_per_request"], rel=0.01)
    assert s["critical_rate"] == pytest.approx(full["critical_rate"], rel=0.02)
    assert s["utilisation"] == pytest.approx(full["utilisation"], rel=0.02)
    assert 0 < admitted < 1500 and s["cached_prompt_measured_requests"] == admitted
    assert full["cached_prompt_measured_requests"] == 1500


def test_simulate_cli_with_a_mooncake_trace(tmp_path, capsys):
    import json

    from llmsched.cli import main

    row = {"input_length": 1200, "output_length": 20}
    rows = [{"timestamp": 250 * i, **row, "hash_ids": [7, 8, 100 + i]} for i in range(60)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    args = ["simulate", "--trace", str(path), "--cost-model", "paper", "--block-size", "512", "--out", str(out)]
    assert main([*args, "--prefix-caching", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    pc = s["prefix_cache"]
    # every request after the first reuses the two shared 512-token blocks
    assert pc["hit_tokens"] == 59 * 1024 and pc["block_size"] == 512
    assert s["cached_prompt_tokens_per_request"] == pytest.approx(59 * 1024 / 60)
    header = (out / "timeseries.csv").read_text().splitlines()[0].split(",")
    assert {"prefix_hit_tokens", "prefix_evictions", "kv_cached_free_tokens"} <= set(header)
    assert main([*args, "--json"]) == 0
    assert "prefix_cache" not in json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit) as e:
        main([*args, "--prefix-caching", "--block-size", "0"])
    assert e.value.code == 2


def _hits(capsys, argv) -> int:
    import json

    from llmsched.cli import main

    assert main([*argv, "--prefix-caching", "--out", "", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["prefix_cache"]["hit_tokens"]


def test_plain_csv_per_block_ids_share_only_their_common_prefix(tmp_path, capsys):
    """A plain CSV's block_ids@B were used as given: rows `1 2 3` and `1 4 3` (per-block
    content ids) matched on their last id, and shared 48 of 60 tokens at 16- and 8-token
    cache blocks; chained on reading (as Mooncake's hash_ids are) they share block 0."""
    short = tmp_path / "short.csv"
    short.write_text("arrival_s,prompt_tokens,output_tokens,block_ids@16\n0.0,60,3,1 2 3\n1.0,60,3,1 4 3\n")
    for size, hit in (("16", 16), ("8", 16), ("32", 0)):
        assert _hits(capsys, ["simulate", "--trace", str(short), "--block-size", size]) == hit, size
    # ids at other positions (5 first in one prompt, second in another) stopped the run
    # with a traceback ("block ids must be prefix ids"): now only the common `1` is hit
    bad = tmp_path / "bad_plain.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens,block_ids@16\n0.0,40,3,5 6\n1.0,40,3,1 7\n2.0,40,3,1 5\n")
    assert _hits(capsys, ["simulate", "--trace", str(bad)]) == 16
    from llmsched.cli import main

    rep = ["reproduce", "prefix-caching", "--trace", str(bad), "--block-size", "16", "--quick"]
    assert main([*rep, "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    # the same rows as a Parquet table's list column
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = {"arrival_s": [0.0, 1.0], "prompt_tokens": [60, 60], "output_tokens": [3, 3]}
    pq.write_table(pa.table({**table, "block_ids@16": [[1, 2, 3], [1, 4, 3]]}), tmp_path / "short.parquet")
    assert _hits(capsys, ["simulate", "--trace", str(tmp_path / "short.parquet")]) == 16


@pytest.mark.parametrize("block_size", [16, 32])
def test_a_trace_written_with_block_ids_replays_with_the_same_hits(tmp_path, block_size):
    """A workload with a system prompt and conversations, written by Trace.to_csv (its
    prefix ids in block_ids@16) and replayed from the file (chained again on reading,
    re-cut to 32-token blocks for 32): the same hits and the same run as the workload."""
    from llmsched.workload import WorkloadSpec, make_trace

    spec = WorkloadSpec(
        rate=5, num_requests=300, prompt="uniform:100,2000", output="uniform:10,200",
        system_prompt=256, turns="uniform:1,4", think_time_s=2.0, seed=3,
    )  # fmt: skip
    opts = dict(prefix_caching=True, kv_capacity=20000, cost_model="paper", block_size=block_size)
    path = tmp_path / "t.csv"
    make_trace(spec, 16).to_csv(path)
    assert path.read_text().splitlines()[0].endswith(",block_ids@16")
    direct = llmsched.simulate(trace=make_trace(spec, block_size), **opts)
    replay = llmsched.simulate(trace=str(path), **opts)
    hits = direct.summary["prefix_cache"]["hit_tokens"]
    assert hits > 0 and replay.summary["prefix_cache"] == direct.summary["prefix_cache"]
    assert np.array_equal(replay.stats.e2e_ns, direct.stats.e2e_ns)


def test_capacity_cli_with_an_expected_cached_fraction(capsys):
    import json

    from llmsched.cli import main

    args = ["capacity", "--cost-model", "paper", "--mean-prompt", "1000", "--mean-output", "100", "--json"]
    assert main(args) == 0
    off = json.loads(capsys.readouterr().out)["capacity"]
    assert main([*args, "--cached-fraction", "0.6"]) == 0
    on = json.loads(capsys.readouterr().out)["capacity"]
    assert on["cached_prompt_per_request"] == pytest.approx(600.0)
    assert on["critical_rate"] == pytest.approx(off["critical_rate"] * 1099 / 499)
    assert main([*args, "--cached-fraction", "1"]) == 2


def test_serve_sim_backend_with_prefix_caching():
    from llmsched.cli import build_parser
    from llmsched.cli.server import build_backend

    args = build_parser().parse_args(["serve", "--backend", "sim", "--enable-prefix-caching", "--block-size", "32"])
    backend = build_backend(args)
    assert backend.core.state.prefix is not None and backend.core.state.prefix.block_size == 32
    args = build_parser().parse_args(["serve", "--backend", "sim"])
    assert build_backend(args).core.state.prefix is None


def test_adaptive_sees_a_waiting_prompt_net_of_its_cached_prefix():
    from llmsched.core.request import Request
    from llmsched.policies.adaptive import Adaptive
    from llmsched.policies.base import Planner

    sched = SchedulerSpec(policy="adaptive", b_max=512, prefix_caching=True, block_size=BS).build()
    st = sched.new_state()
    a = Request(0, 0, 40, 1)
    a.blocks = (1, 2)
    st.add(a)
    t = 0
    while not st.is_idle():  # A computes its prompt (caching blocks 1 and 2) and finishes
        plan = sched.plan(st)
        st.begin_step(plan, t)
        t += 10
        st.end_step(plan, t)
    b = Request(1, t, 40, 4)
    b.blocks = (1, 2)
    st.add(b)
    rems, _, _, longest = Adaptive.prefill_on_offer(Planner(st, sched.admission), 512)
    assert rems == [8]  # 40 prompt tokens, 32 of them cached: what admitting B computes
    assert longest == 40  # the region's prefill cap counts the prompt whole


def test_readmissions_after_preemption_are_counted_apart():
    # a 256-token shared system prompt under KV pressure: the first admissions look up each
    # prompt once and find the system prompt (all but the first request); the re-admissions
    # after a preemption (prompt + generated tokens looked up again, their own blocks found)
    # are the preempted_* part of the totals, as vLLM's preempted_queries / preempted_hits
    kw = dict(cost_model="paper", rate=8, system_prompt=256, prompt="geometric:100", output="geometric:100")
    r = llmsched.simulate(**kw, num_requests=300, prefix_caching=True, kv_capacity=2000)
    pc = r.summary["prefix_cache"]
    assert r.summary["preemptions"] > 0 and pc["preempted_queried_tokens"] > 0 and pc["preempted_hit_tokens"] > 0
    assert pc["queried_tokens"] - pc["preempted_queried_tokens"] == int(r.prompt.sum())
    assert pc["hit_tokens"] - pc["preempted_hit_tokens"] == pc["first_admission_hit_tokens"] == 299 * 256
    assert pc["hit_blocks"] - pc["preempted_hit_blocks"] == 299 * 256 // 16
    assert pc["queried_blocks"] - pc["preempted_queried_blocks"] == int((r.prompt // 16).sum())
