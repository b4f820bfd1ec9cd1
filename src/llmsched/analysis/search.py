"""Rate searches: each group's maximum stable rate, and the maximum rate meeting SLOs.

A group is one combination of the grid's keys other than rate, load and seed (a
policy, a b_max, ...). For every group at once, the rate is bisected on the runs'
stability verdicts: a rate passes when every seed's run is judged stable, not unstable
and not inconclusive (and, for the SLO search, also meets every limit). Each round runs one probe rate per unfinished
group, all seeds, on the runner (probes are ordinary points: cached and resumable).

- Stability: the bracket starts at [0, search_hi * lambda*]; its upper end is probed
  first and, while it passes, widened (x1.5, at most 4 times). Bisection stops when the
  bracket is narrower than tol * lambda*.
- SLOs: the bracket is [0, max stable rate]; that rate is probed first (a cached point)
  and, if it passes, is the answer, so the SLO rate never exceeds the stable rate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .grid import NON_GROUP_KEYS, expand_grid
from .points import check_point, critical_rate_of, resolve_point
from .runner import Runner
from .tables import point_row

__all__ = ["SearchSettings", "Group", "Bracket", "bisect", "search_groups", "search_rates"]

#: How often a passing upper end of the stability bracket is widened by 1.5.
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


@dataclass
class Bracket:
    """A rate interval (requests/s) that bisection narrows: `lo` passed (rate 0 passes by
    definition); `hi` failed once `hi_checked`, and until then is the next upper end to
    try, multiplied by 1.5 while it passes (`widenings` times at most)."""

    lo: float
    hi: float
    widenings: int
    hi_checked: bool = False
    probes: int = 0

    def __post_init__(self):
        self.hi_checked = self.hi_checked or self.hi <= 0

    def next_rate(self, tol_rate: float) -> float | None:
        """The rate to probe next, or None when the bracket is narrower than `tol_rate`."""
        if not self.hi_checked:
            return self.hi
        if self.hi - self.lo > tol_rate and self.hi > 0:
            return 0.5 * (self.lo + self.hi)
        return None

    def record(self, rate: float, passed: bool) -> None:
        self.probes += 1
        if not self.hi_checked:
            if passed and self.widenings > 0:  # the upper end is not unstable: widen
                self.lo, self.hi = rate, rate * 1.5
                self.widenings -= 1
            else:
                self.hi_checked = True
                if passed:  # passing at the largest rate allowed: that is the answer
                    self.lo = self.hi = rate
        elif passed:
            self.lo = rate
        else:
            self.hi = rate


@dataclass
class Group:
    """One group of a search: its grid values and critical rate lambda*, and the brackets
    of its stability and SLO searches."""

    params: dict
    critical_rate: float
    stable: Bracket | None = None
    slo: Bracket | None = None


def bisect(
    brackets: list[Bracket],
    tol_rates: list[float],
    probe: Callable[[list[tuple[int, float]]], list[list[dict]]],
    passes: Callable[[list[dict]], bool],
) -> None:
    """Narrow every bracket at once: each round probes one rate per unfinished bracket
    (`probe([(index, rate), ...])` returns each probe's run records) and records whether
    it `passes`."""
    while True:
        batch = [(i, r) for i, b in enumerate(brackets) if (r := b.next_rate(tol_rates[i])) is not None]
        if not batch:
            return
        for (i, rate), records in zip(batch, probe(batch)):
            brackets[i].record(rate, passes(records))


def search_groups(settings: SearchSettings) -> list[Group]:
    """The search's groups with their critical rates; every group's configuration is
    checked before any run."""
    groups, seen = [], set()
    for params in expand_grid({k: settings.grid[k] for k in settings.group_keys}):
        key = json.dumps(params, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        base = resolve_point(settings.config, settings.fixed, params)
        check_point(base)
        groups.append(Group(params, critical_rate_of(base)))
    return groups


def _stable(records: list[dict]) -> bool:
    return all(r["summary"].get("stable") is True for r in records)


def _meets(records: list[dict], slo: dict[str, float]) -> bool:
    if not _stable(records):
        return False
    for r in records:
        for k, limit in slo.items():
            v = r["summary"].get(k)
            if v is None or not v <= limit:
                return False
    return True


def search_rates(settings: SearchSettings, groups: list[Group], runner: Runner) -> tuple[list[dict], list[dict]]:
    """Run the searches (see the module docstring). Returns (one row per probe run, as
    in a grid sweep's table; one row per group: `critical_rate`, `max_stable_rate`,
    `max_stable_load`, `unstable_rate` (the bracket's upper end), `probes`, and with
    SLOs `max_slo_rate`, `max_slo_load`, `slo`)."""
    rows: list[dict] = []
    columns = [*settings.group_keys, "seed", "rate"]

    def probe(batch: list[tuple[int, float]]) -> list[list[dict]]:
        cfgs, index = [], []
        for gi, rate in batch:
            for s in settings.seeds:
                params = {**groups[gi].params, **({} if s is None else {"seed": s}), "rate": rate}
                cfgs.append(resolve_point(settings.config, settings.fixed, params))
                index.append((gi, params))
        out: list[list[dict]] = [[] for _ in batch]
        pos = {gi: j for j, (gi, _) in enumerate(batch)}
        for (gi, params), rec in zip(index, runner.run(cfgs)):
            out[pos[gi]].append(rec)
            rows.append(point_row(params, rec, columns))
        return out

    tol_rates = [settings.tol * g.critical_rate for g in groups]
    for g in groups:
        g.stable = Bracket(0.0, settings.search_hi * g.critical_rate, widenings=WIDENINGS)
    bisect([g.stable for g in groups], tol_rates, probe, _stable)
    if settings.slo:
        for g in groups:
            g.slo = Bracket(0.0, g.stable.lo, widenings=0)
        bisect([g.slo for g in groups], tol_rates, probe, lambda recs: _meets(recs, settings.slo))

    table = []
    for g in groups:
        lam = g.critical_rate
        row = {
            **g.params,
            "policy_name": str(g.params.get("policy", "")).partition(":")[0] or None,
            "critical_rate": lam,
            "max_stable_rate": g.stable.lo,
            "max_stable_load": g.stable.lo / lam if lam else None,
            "unstable_rate": g.stable.hi,
            "probes": g.stable.probes,
        }
        if settings.slo:
            row["max_slo_rate"] = g.slo.lo
            row["max_slo_load"] = g.slo.lo / lam if lam else None
            row["slo"] = json.dumps(settings.slo, sort_keys=True)
        table.append(row)
    return rows, table
