"""One colour per policy in every figure: batch policies, admission policies, serverless
platform schedulers and routers keep the same colour in `llmsched plot`, sweeps and every
reproduction. Plain hex strings (no matplotlib here), from matplotlib's `tab10` and the
dark shades of `tab20b`/`tab20c`."""

from __future__ import annotations

import re

POLICY_COLORS = {
    # batch policies
    "sarathi": "#1f77b4",  # blue
    "orca": "#2ca02c",  # green
    "vllm": "#d62728",  # red
    "fastertransformer": "#8c564b",  # brown
    "kfcfs": "#9467bd",  # purple
    "adaptive": "#ff7f0e",  # orange
    # admission policies and serverless platform schedulers
    "fcfs": "#7f7f7f",  # grey
    "spf": "#bcbd22",  # olive
    "twp": "#17becf",  # cyan
    "dynamicbatch": "#e377c2",  # pink
    "priority": "#393b79",  # indigo
    "round-robin": "#637939",  # dark olive
    "serverlessllm": "#843c39",  # dark red
    # routers
    "random": "#8c6d31",  # dark gold
    "jsq": "#7b4173",  # plum
    "least-tokens": "#3182bd",  # steel blue
    "power-of-two": "#e6550d",  # dark orange
}

# for names outside the table (a group of a sweep by another key): colours no policy uses
OTHER_COLORS = ("#000000", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd", "#9c9ede", "#31a354")

_ALIASES = {"sarathi-serve": "sarathi", "ft": "fastertransformer", "round_robin": "round-robin", "rr": "round-robin"}


def policy_of(label: str) -> str | None:
    """The policy a label names: the label itself (`sarathi`, `twp`), its first word
    (`orca (stable)`), a `policy=` or `scheduler=` part (`b_max=512, policy=vllm`), or a
    spec with options (`adaptive:cost=paper`); None if it names none."""
    text = str(label).strip().lower()
    candidates = [text]
    for m in re.finditer(r"(?:policy|scheduler)=([\w.-]+)", text):
        candidates.append(m.group(1))
    candidates += [part.strip() for part in re.split(r"[,;()]", text)]
    candidates += re.split(r"[\s,:;()]+", text)
    for c in candidates:
        c = _ALIASES.get(c, c)
        if c in POLICY_COLORS:
            return c
    return None


def color_of(label: str, index: int = 0) -> str:
    """The colour of the policy `label` names; otherwise the `index`-th of OTHER_COLORS."""
    p = policy_of(label)
    return POLICY_COLORS[p] if p is not None else OTHER_COLORS[index % len(OTHER_COLORS)]


def group_styles(labels) -> list[dict]:
    """matplotlib keyword arguments (color, linestyle, marker) for lines of `labels`: the
    policy's colour; groups sharing a policy (a grid over b_max, say) differ by line style."""
    styles, seen = [], {}
    dashes = ("-", "--", ":", "-.")
    marks = ("o", "s", "^", "D", "v")
    others = 0
    for label in labels:
        p = policy_of(label)
        if p is None:
            color, key = OTHER_COLORS[others % len(OTHER_COLORS)], f"?{others}"
            others += 1
        else:
            color, key = POLICY_COLORS[p], p
        k = seen.get(key, 0)
        seen[key] = k + 1
        styles.append({"color": color, "linestyle": dashes[k % len(dashes)], "marker": marks[k % len(marks)]})
    return styles


__all__ = ["POLICY_COLORS", "OTHER_COLORS", "policy_of", "color_of", "group_styles"]
