"""Synthetic workloads with shared prefixes: system prompts per class and multi-turn
conversations, and the block ids they give (workload.conversations)."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.core.errors import ConfigError
from llmsched.workload import WorkloadSpec, make_trace

BASE = dict(arrival="poisson", rate=5.0, num_requests=400, prompt="uniform:20,300", output="uniform:1,50", seed=3)


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a or (), b or ()):
        if x != y:
            break
        n += 1
    return n


def test_system_prompt_per_class():
    classes = [
        {"tag": "chat", "share": 1, "system_prompt": 100},
        {"tag": "code", "share": 1, "system_prompt": 64},
        {"tag": "none", "share": 1},
    ]
    plain = make_trace(
        WorkloadSpec(**BASE, classes=[{k: v for k, v in c.items() if k != "system_prompt"} for c in classes])
    )
    t = make_trace(WorkloadSpec(**BASE, classes=classes))
    # same arrivals, classes and drawn lengths; the system prompt comes on top
    system = {"chat": 100, "code": 64, "none": 0}
    assert np.array_equal(t.arrival_s, plain.arrival_s) and np.array_equal(t.tag, plain.tag)
    assert np.array_equal(t.prompt, plain.prompt + np.array([system[x] for x in t.tag]))
    assert np.array_equal(t.output, plain.output)
    blocks = t.blocks()
    assert [len(b or ()) for b in blocks] == (t.prompt // 16).tolist()
    chat = [b for b, tag in zip(blocks, t.tag) if tag == "chat"]
    code = [b for b, tag in zip(blocks, t.tag) if tag == "code"]
    none = [b for b, tag in zip(blocks, t.tag) if tag == "none"]
    # 100 tokens = 6 full shared blocks (the 7th holds each request's own text too)
    assert all(_common(a, b) == 6 for a, b in zip(chat, chat[1:]))
    assert all(_common(a, b) == 4 for a, b in zip(code, code[1:]))
    assert all(_common(a, b) == 0 for a, b in zip(none, none[1:]) if a and b)
    assert _common(chat[0], code[0]) == 0
    # every id outside the system prompts is a request's own
    own = [x for b in chat for x in b[6:]] + [x for b in code for x in b[4:]] + [x for b in none if b for x in b]
    assert len(set(own)) == len(own)


def test_system_prompt_block_size_and_seed():
    spec = WorkloadSpec(**BASE, system_prompt=256)
    t32 = make_trace(spec, block_size=32)
    assert t32.block_size == 32 and [len(b) for b in t32.blocks()] == (t32.prompt // 32).tolist()
    assert all(_common(a, b) == 8 for a, b in zip(t32.blocks(), t32.blocks()[1:]))
    assert make_trace(spec) == make_trace(spec)
    other = make_trace(WorkloadSpec(**{**BASE, "seed": 4}, system_prompt=256))
    assert _common(make_trace(spec).blocks()[0], other.blocks()[0]) == 0
    # the requests carry them
    reqs = list(make_trace(spec).head(3).requests())
    assert [r.blocks for r in reqs] == make_trace(spec).head(3).blocks()


def _conversations(t, system_blocks):
    """Group requests by the id of their first block after the system prompt."""
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(t.blocks()):
        groups.setdefault(b[system_blocks], []).append(i)
    return list(groups.values())


def test_multi_turn_conversations():
    spec = WorkloadSpec(
        **{**BASE, "prompt": "uniform:40,200", "num_requests": 600},
        system_prompt=32,
        turns="uniform:1,6",
        think_time_s=4.0,
    )
    t = make_trace(spec)
    assert len(t) == 600 and np.all(np.diff(t.arrival_s) >= 0)
    blocks = t.blocks()
    # every request shares the 2 system-prompt blocks, then its conversation's
    assert all(b[:2] == blocks[0][:2] for b in blocks)
    convs = _conversations(t, 2)
    assert 100 < len(convs) < 600 and max(len(c) for c in convs) > 1
    for c in convs:
        for a, b in zip(c, c[1:]):
            # turn t + 1 resends turn t and its output: a longer prompt whose ids start with turn t's
            assert t.arrival_s[b] >= t.arrival_s[a]
            assert t.prompt[b] > t.prompt[a] + t.output[a]
            assert blocks[b][: len(blocks[a])] == blocks[a]
            # the block that held turn t's partial end is now full, with the same prefix
            assert _common(blocks[a], blocks[b]) == len(blocks[a])
    # different conversations share only the system prompt
    firsts = [blocks[c[0]] for c in convs]
    assert all(_common(a, b) == 2 for a, b in zip(firsts, firsts[1:]))
    # first turns: system prompt + drawn text, within the law
    first = np.array([c[0] for c in convs])
    assert t.prompt[first].min() >= 32 + 40 and t.prompt[first].max() <= 32 + 200


def test_multi_turn_arrivals_and_stopping():
    spec = dict(BASE, prompt="const:50", output="const:10", turns="const:3", think_time_s=2.0)
    t = make_trace(WorkloadSpec(**{**spec, "num_requests": 90}))
    assert len(t) == 90
    # the first 90 arrivals among all turns of the conversations: no later conversation
    # could add an earlier one, so a longer run starts with the same requests
    longer = make_trace(WorkloadSpec(**{**spec, "num_requests": 300}))
    assert longer.head(90) == t
    # prompts grow by 60 tokens (own 50 + output 10) a turn: 50, 110, 170
    assert set(t.prompt.tolist()) <= {50, 110, 170} and (t.prompt == 50).sum() >= 30
    d = make_trace(WorkloadSpec(**{k: v for k, v in spec.items() if k != "num_requests"}, duration_s=20.0))
    assert d.arrival_s.max() <= 20.0 and len(d) > 100
    # time_scale speeds up everything, think times included
    fast = make_trace(WorkloadSpec(**{**spec, "num_requests": 90}, time_scale=2.0))
    assert np.allclose(fast.arrival_s, t.arrival_s / 2)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        ({"turns": 3}, r"need think_time_s \(--think-time\)"),
        ({"think_time_s": 2.0}, r"think_time_s \(--think-time\) applies to multi-turn conversations only"),
        ({"system_prompt": -1}, "system_prompt must be a whole number of tokens"),
        ({"system_prompt": 2.5}, "system_prompt must be a whole number of tokens"),
        ({"turns": "const:0", "think_time_s": 1}, "const length must be >= 1"),
        ({"turns": 2, "think_time_s": 0}, "think_time_s must be a positive number"),
        ({"classes": [{"tag": "a", "system_prompt": "x"}]}, "system_prompt of class 'a' must be"),
        (
            {"arrival": "trace:azure-conv", "system_prompt": 10, "prompt": None, "output": None, "num_requests": None},
            "a trace replays its own prompts",
        ),
    ],
)
def test_bad_options(changes, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        make_trace(WorkloadSpec.from_dict({**BASE, **changes}))
    assert "\n" not in str(info.value)


def test_spec_round_trip_with_new_keys():
    spec = WorkloadSpec(
        **BASE,
        system_prompt=10,
        turns="geometric:3",
        think_time_s=1.5,
        classes=[{"tag": "a", "system_prompt": 64}, {"tag": "b"}],
    )
    d = spec.to_dict()
    assert d["turns"] == "geometric:mean=3" and d["classes"][0]["system_prompt"] == 64
    assert make_trace(WorkloadSpec.from_dict(d)) == make_trace(spec)


def test_the_means_of_conversations_do_not_depend_on_the_think_time():
    """Turn t's prompt holds the t - 1 turns before it, so the mean prompt per request is
    the steady state's over whole conversations; sampling the first requests of a stream
    with a long think time saw mostly first turns (535.9 tokens at 3,600 s, 254.9 at
    36,000 s, for 700: lambda* overstated by a quarter and more)."""
    from llmsched.theory import workload_means

    def wl(think):
        return {
            "arrival": "poisson",
            "rate": 1.0,
            "prompt": "const:100",
            "output": "const:100",
            "turns": "geometric:4",
            "think_time_s": think,
        }

    means = [workload_means(wl(t))[0] for t in (20.0, 3600.0, 36000.0)]
    assert means[0] == means[1] == means[2]
    # turn t's prompt is 200 t - 100; the mean turn of a request is E[T^2 + T] / (2 E[T]) = 4
    assert means[0] == pytest.approx(700, rel=0.02)
