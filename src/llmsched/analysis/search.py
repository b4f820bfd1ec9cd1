"""Rate searches: each group's maximum stable rate, and the maximum rate meeting SLOs.

A group is one combination of the grid's keys other than rate, load and seed (a
policy, a b_max, ...). For every group at once, the rate is bisected on the runs'
stability verdicts. Each round runs one probe rate per unfinished group, all seeds, on
the runner (probes are ordinary points: cached and resumable). A probe's verdict, over
its seeds (`probe_verdict`):

- **stable** when every seed's run is judged stable, **unstable** when every seed's run
  is judged unstable, **inconclusive** otherwise (a run the verdict could not call, or
  seeds that disagree), and **failed** when any seed's run raised (its `error` column).

Stability: the search narrows two edges, assuming verdicts are monotone in the rate.

- The upper end, search_hi * lambda*, is probed first and, while it is stable, widened
  (x1.5, at most 4 times in all). When even the widest upper end is stable, the search
  has found no rate that is not: `max_stable_rate` is that widest rate, a lower bound
  (`max_stable_lower_bound` true), not a boundary.
- Stable edge: bisection between the largest rate judged stable (rate 0 is stable by
  definition) and the smallest rate not judged stable, until they are closer than
  tol * lambda*. The first is the group's `max_stable_rate`; when no probe was judged
  stable it is the first rate judged unstable (`unstable_rate`) instead, an upper bound
  (`max_stable_upper_bound` true: a 0 would read as a rate found), and when none was
  judged unstable either (every probe inconclusive) no verdict bounds it: no answer
  (None, both flags false; a rate judged inconclusive is no evidence that the max stable
  rate lies below it).
- Unstable edge: when the smallest rate not judged stable was inconclusive, bisection
  between the largest inconclusive rate and the smallest rate judged unstable (found by
  widening above the upper end when none was), to the same tolerance. The second is
  `unstable_rate`: the first rate actually judged unstable, never an inconclusive one
  (None when no probe up to the widest was). Probes between the edges are inconclusive:
  `inconclusive_low`/`inconclusive_high` give their range, `inconclusive_probes` their
  count. A short run near lambda* is often inconclusive, so the gap shows how far the
  runs are from resolving the boundary; more requests per probe narrow it.
- Verdicts that are not monotone: a rate judged inconclusive before a lower one was
  judged unstable (the upper end inconclusive, then a midpoint unstable) lies above
  `unstable_rate`, outside the bracket. It is left out of the inconclusive range, which
  would otherwise reach past the first unstable rate; `inconclusive_above_unstable`
  counts such probes (the command line notes them: the bisection assumed monotone
  verdicts, and more requests per probe give firmer ones).
- A failed probe decides nothing: it is no evidence of instability. Its group's search
  stops there (`failed_rate`) with no answer (None), and the sweep exits 1; a rerun
  retries the failed points (they are not stored as finished).

SLOs: the bracket is [0, max stable rate]; a rate passes when every seed's run is
judged stable and meets every limit. The max stable rate is probed first (a cached
point) and, if it passes, is the answer, so the SLO rate never exceeds the stable rate.
With no rate judged stable there is nothing to probe: `max_slo_rate` is 0 and
`slo_miss_rate` the smallest rate judged not stable (which meets no SLO).
A probe run again (the SLO search's first) is one row of the results table, not two.

Units: every rate is the workload's `rate`. With `turns` it counts conversations, so a
group's `critical_rate` is lambda* over the mean turns per conversation (conversations/s,
its row's `rate_unit`). `time_scale` on synthetic arrivals is refused: it would run
every probe faster than its rate. On a replayed trace `time_scale` (it sets the rate the
probes set) and `duration_s` (each probed rate keeps other requests) are refused
(`points.check_rate_settable`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError
from ..theory import rate_unit
from ..workload import replays_trace
from .grid import NON_GROUP_KEYS, expand_grid
from .points import (
    check_point,
    check_rate_settable,
    critical_arrival_rate_of,
    critical_rate_of,
    policy_critical_rate_of,
    resolve_point,
)
from .runner import Runner
from .tables import point_row

__all__ = [
    "SearchSettings",
    "Group",
    "Bracket",
    "bisect",
    "probe_verdict",
    "slo_verdict",
    "search_groups",
    "search_rates",
    "STABLE",
    "UNSTABLE",
    "INCONCLUSIVE",
    "FAILED",
]

#: How often, in all, the search looks 1.5 times higher: past an upper end judged stable,
#: or past rates judged inconclusive when none above them was judged unstable.
WIDENINGS = 4


@dataclass
class SearchSettings:
    """What a search needs besides its runner.

    `config`, `fixed`: the base configuration and the option values of every point, as
    for `run_sweep`; `grid`: the parsed grid, without rate or load (its seeds run at
    every probe, its other keys form the groups); `slo`: {metric: upper limit}, empty
    for a stability search only; `tol`: stop when the bracket is narrower than
    `tol * lambda*`; `search_hi`: the bracket's first upper end, in units of lambda*."""

    config: Any
    fixed: dict
    grid: dict
    slo: dict = field(default_factory=dict)
    tol: float = 0.02
    search_hi: float = 1.25

    @property
    def seeds(self) -> list:
        return self.grid.get("seed") or [self.fixed.get("seed", None)]

    @property
    def group_keys(self) -> list[str]:
        return [k for k in self.grid if k not in NON_GROUP_KEYS]


#: A probe's verdict over its seeds (`probe_verdict`); the SLO search uses STABLE for a
#: rate that passes and UNSTABLE for one that does not.
STABLE, UNSTABLE, INCONCLUSIVE, FAILED = "stable", "unstable", "inconclusive", "failed"


@dataclass
class Bracket:
    """The rates (requests/s) that bisection narrows, for one group.

    `lo`: the largest rate judged stable (rate 0 by definition). `hi`: the smallest rate
    not judged stable once `hi_checked`; until then the next upper end to try,
    multiplied by 1.5 while it is stable (`widenings` times at most). `unstable`: the
    smallest rate judged unstable (None until one is); `top`: the largest rate judged
    not unstable, at or above `hi` and below `unstable` (None when `hi` itself is unstable or
    stable): the unstable edge is narrowed between the two. `failed`: the rate of a
    failed probe, which ends the search. `inconclusive`: every rate judged inconclusive.
    `lower_bound`: the widest upper end was judged stable, so `lo` is only a lower bound
    of the largest stable rate (no probe found one that is not stable)."""

    lo: float
    hi: float
    widenings: int
    hi_checked: bool = False
    probes: int = 0
    unstable: float | None = None
    top: float | None = None
    failed: float | None = None
    inconclusive: list[float] = field(default_factory=list)
    lower_bound: bool = False

    def __post_init__(self):
        self.hi_checked = self.hi_checked or self.hi <= 0

    def next_rate(self, tol_rate: float) -> float | None:
        """The rate to probe next, or None when both edges are narrower than `tol_rate`
        (or a probe failed)."""
        if self.failed is not None:
            return None
        if not self.hi_checked:
            return self.hi
        if self.hi - self.lo > tol_rate and self.hi > 0:
            return 0.5 * (self.lo + self.hi)
        if self.top is None:  # hi was judged unstable (or stable at the widest): one edge
            return None
        if self.unstable is None:  # nothing judged unstable yet: look higher
            return self.top * 1.5 if self.widenings > 0 else None
        if self.unstable - self.top > tol_rate:
            return 0.5 * (self.top + self.unstable)
        return None

    def record(self, rate: float, verdict: str) -> None:
        """Narrow the bracket by the verdict of a probe at `rate` (from `next_rate`)."""
        self.probes += 1
        if verdict == FAILED:  # no evidence either way: stop rather than guess
            self.failed = rate
            return
        if verdict == INCONCLUSIVE:
            self.inconclusive.append(rate)
        if not self.hi_checked:  # the upper end
            if verdict == STABLE and self.widenings > 0:
                self.lo, self.hi = rate, rate * 1.5
                self.widenings -= 1
                return
            self.hi_checked = True
            if verdict == STABLE:  # stable at the largest rate allowed: a lower bound, no edge
                self.lo = self.hi = rate
                self.lower_bound = True
            else:
                self.hi = rate
                self._not_stable(rate, verdict)
        elif rate < self.hi:  # a midpoint of the stable edge
            if verdict == STABLE:
                self.lo = rate
            else:
                self.hi = rate
                self._not_stable(rate, verdict)
        elif verdict == UNSTABLE:  # a probe of the unstable edge
            self.unstable = rate
        else:  # inconclusive, or stable above an inconclusive rate: not unstable
            if self.unstable is None:
                self.widenings -= 1
            self.top = rate

    def _not_stable(self, rate: float, verdict: str) -> None:
        """`rate`, the new `hi`, was judged unstable or inconclusive."""
        if verdict == UNSTABLE:
            # every rate judged inconclusive so far lies above this one: only the edge
            # between the last stable and this first unstable rate is left
            self.unstable, self.top = rate, None
        elif self.top is None:
            self.top = rate


@dataclass
class Group:
    """One group of a search: its grid values and critical rate lambda*, and the brackets
    of its stability and SLO searches."""

    params: dict
    critical_rate: float  # in the unit of the workload's rate: conversations/s with turns
    rate_unit: str = "req/s"
    # the group's policy's own limit where theory gives it (`points.policy_critical_rate_of`:
    # below lambda* for a policy filling every step where b / t(b) peaks below b_max)
    policy_critical_rate: float | None = None
    stable: Bracket | None = None
    slo: Bracket | None = None
    policy: str = ""  # the group's policy spec, a grid value or the run's (--policy, the default)


def bisect(
    brackets: list[Bracket],
    tol_rates: list[float],
    probe: Callable[[list[tuple[int, float]]], list[list[dict]]],
    verdict: Callable[[list[dict]], str],
) -> None:
    """Narrow every bracket at once: each round probes one rate per unfinished bracket
    (`probe([(index, rate), ...])` returns each probe's run records) and records its
    `verdict` (stable, unstable, inconclusive or failed)."""
    while True:
        batch = [(i, r) for i, b in enumerate(brackets) if (r := b.next_rate(tol_rates[i])) is not None]
        if not batch:
            return
        for (i, rate), records in zip(batch, probe(batch)):
            brackets[i].record(rate, verdict(records))


def search_groups(settings: SearchSettings) -> list[Group]:
    """The search's groups with their critical rates (lambda* of the first seed run, as
    `critical_rate_of` draws it); every group's configuration is checked before any run."""
    groups, seen = [], set()
    for params in expand_grid({k: settings.grid[k] for k in settings.group_keys}):
        key = json.dumps(params, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        # lambda* of the group's first seed that runs (it depends on the seed's sample of
        # lengths): not the configuration's default seed, which a grid of seeds 1,2 never runs
        first = settings.seeds[0]
        base = resolve_point(settings.config, settings.fixed, {**params, **({} if first is None else {"seed": first})})
        check_point(base, point=params)
        if not base.verdict:  # every probe would be inconclusive: nothing to bisect on
            raise ConfigError("the search bisects on the stability verdict: it cannot run with verdict=false")
        check_rate_settable(base, "the search")
        if not replays_trace(base.workload) and float(base.workload.get("time_scale") or 1.0) != 1.0:
            raise ConfigError(
                "the search sets the rate: drop time_scale (--time-scale K runs every probed rate K times as fast)"
            )
        groups.append(
            Group(
                params,
                critical_arrival_rate_of(base),
                rate_unit(base.workload),
                policy_critical_rate_of(base),
                policy=str(base.policy),
            )
        )
    return groups


def probe_verdict(records: list[dict]) -> str:
    """A probe's verdict over its seeds' runs: failed if any run failed, stable (unstable)
    if every run was judged stable (unstable), inconclusive otherwise."""
    if any("error" in r["summary"] for r in records):
        return FAILED
    stable = [r["summary"].get("stable") for r in records]
    if all(v is True for v in stable):
        return STABLE
    if all(v is False for v in stable):
        return UNSTABLE
    return INCONCLUSIVE


def slo_verdict(records: list[dict], slo: dict[str, float]) -> str:
    """STABLE when every run is judged stable and meets every limit, FAILED when a run
    failed, UNSTABLE (does not pass) otherwise."""
    v = probe_verdict(records)
    if v != STABLE:
        return FAILED if v == FAILED else UNSTABLE
    for r in records:
        for k, limit in slo.items():
            m = r["summary"].get(k)
            if m is None or not m <= limit:
                return UNSTABLE
    return STABLE


def search_rates(settings: SearchSettings, groups: list[Group], runner: Runner) -> tuple[list[dict], list[dict]]:
    """Run the searches (see the module docstring). Returns (one row per probe run, as
    in a grid sweep's table, each (point, rate) once; one row per group:
    `critical_rate`, `max_stable_rate`, `max_stable_load`, `max_stable_lower_bound`
    (every probe up to the widest was stable: the rate is a lower bound),
    `max_stable_upper_bound` (no probe was stable: the rate is the first rate judged
    unstable, an upper bound; None, unflagged, when none was either), `inconclusive_low`,
    `inconclusive_high`, `inconclusive_probes`, `inconclusive_above_unstable`,
    `unstable_rate` (the first rate judged unstable), `failed_rate`, `probes`, and with
    SLOs `max_slo_rate`, `max_slo_load`, `slo_miss_rate` (the smallest rate probed that
    missed them), `run_slo` (the limits, as JSON; not `slo`, a grid key: per-request
    objectives, which name the group))."""
    rows: dict[str, dict] = {}  # by the probe's grid values: a rate probed again is one row
    columns = [*settings.group_keys, "seed", "rate"]
    # lambda* (requests/s) of each group and seed, a grid point's `point_critical_rate`
    lambdas: dict[tuple, float] = {}

    def probe(batch: list[tuple[int, float]]) -> list[list[dict]]:
        cfgs, index = [], []
        for gi, rate in batch:
            for s in settings.seeds:
                params = {**groups[gi].params, **({} if s is None else {"seed": s}), "rate": rate}
                cfgs.append(resolve_point(settings.config, settings.fixed, params))
                index.append((gi, params))
        out: list[list[dict]] = [[] for _ in batch]
        pos = {gi: j for j, (gi, _) in enumerate(batch)}
        for (gi, params), rec, cfg in zip(index, runner.run(cfgs), cfgs):
            out[pos[gi]].append(rec)
            # without a grid of seeds, the seed column holds the one the run used (the
            # configuration's), not a blank
            shown = params if "seed" in params else {**params, "seed": _seed_of(rec)}
            row = rows.setdefault(json.dumps(params, sort_keys=True, default=str), point_row(shown, rec, columns))
            key = (gi, params.get("seed"))  # (sampled with the seed; the rate probed does not change it)
            if key not in lambdas:
                lambdas[key] = critical_rate_of(cfg)
            row["point_critical_rate"] = lambdas[key]
        return out

    tol_rates = [settings.tol * g.critical_rate for g in groups]
    for g in groups:
        g.stable = Bracket(0.0, settings.search_hi * g.critical_rate, widenings=WIDENINGS)
    bisect([g.stable for g in groups], tol_rates, probe, probe_verdict)
    if settings.slo:
        for g in groups:
            st = g.stable
            if st.failed is not None:  # no stable rate to start from
                g.slo = Bracket(0.0, 0.0, widenings=0)
            elif st.lo == 0 and st.hi > 0:
                # no rate was judged stable: a rate that is not stable (unstable or
                # inconclusive) meets no SLO, so the smallest one is already the SLO search's miss, and nothing is left
                # to probe below it (the stability search narrowed it to within tol of 0)
                g.slo = Bracket(0.0, st.hi, widenings=0, hi_checked=True)
            else:
                g.slo = Bracket(0.0, st.lo, widenings=0)
        bisect([g.slo for g in groups], tol_rates, probe, lambda recs: slo_verdict(recs, settings.slo))
    return list(rows.values()), [_group_row(g, settings) for g in groups]


def _seed_of(rec: dict):
    """The workload seed a run used (from its stored configuration)."""
    return ((rec.get("config") or {}).get("workload") or {}).get("seed")


def _group_row(g: Group, settings: SearchSettings) -> dict:
    """A group's row of the search table; a failed search's answers are None."""
    lam, st = g.critical_rate, g.stable
    ok = st.failed is None
    # no probe judged stable: the answer lies below the first rate judged unstable, which
    # the row holds as an upper bound, flagged (a 0 would read as a rate found); with none
    # judged unstable either (every probe inconclusive) no verdict bounds it: no answer
    none_stable = ok and st.lo == 0 and st.hi_checked and st.hi > 0
    upper = none_stable and st.unstable is not None
    found = st.unstable if none_stable else st.lo  # (None when none was judged unstable)
    # the range between the edges: rates above the first unstable one are counted apart
    inc = sorted(r for r in st.inconclusive if st.unstable is None or r < st.unstable)
    row = {
        **g.params,  # (search.csv writes a mapping as JSON, `write_search`; search.json keeps it)
        "policy_name": str(g.params.get("policy", g.policy)).partition(":")[0] or None,
        "critical_rate": lam,
        "policy_critical_rate": g.policy_critical_rate,
        **({"rate_unit": g.rate_unit} if g.rate_unit != "req/s" else {}),
        "max_stable_rate": found if ok else None,
        "max_stable_load": found / lam if ok and found is not None and lam else None,
        "inconclusive_low": inc[0] if inc else None,
        "inconclusive_high": inc[-1] if inc else None,
        "inconclusive_probes": len(inc),
        "inconclusive_above_unstable": len(st.inconclusive) - len(inc),
        "unstable_rate": st.unstable if ok else None,
        "failed_rate": st.failed if not ok else (g.slo.failed if g.slo else None),
        "probes": st.probes,
    }
    if settings.slo:
        slo_ok = ok and g.slo.failed is None
        # 0 when no probed rate met the SLOs: the answer lies below `slo_miss_rate`
        row["max_slo_rate"] = g.slo.lo if slo_ok else None
        row["max_slo_load"] = g.slo.lo / lam if slo_ok and lam else None
        row["slo_miss_rate"] = g.slo.hi if slo_ok and g.slo.hi_checked and g.slo.hi > g.slo.lo else None
        # not `slo`: a grid's `slo` (per-request objectives) names the group, and would be overwritten
        row["run_slo"] = json.dumps(settings.slo, sort_keys=True)
    # every probe stable, up to the widest rate searched: the max stable rate is a lower
    # bound (the boundary lies above it); last, so the other columns keep their places
    row["max_stable_lower_bound"] = ok and st.lower_bound
    row["max_stable_upper_bound"] = upper
    return row
