"""Sweep outputs as tables: one row per point (`point_row`), written as `NAME.csv` and,
with pyarrow, `NAME.parquet` (`write_table`); a search's table (`write_search`).
Every file appears whole or not at all (`atomic_write`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..api import FLOAT_OPTIONS, INT_WORKLOAD_OPTIONS, SimConfig, option_number
from ..core.paths import atomic_write
from ..workload import WorkloadSpec

__all__ = ["point_row", "grid_cell", "group_label", "write_table", "write_search", "atomic_write"]


def grid_cell(v):
    """A grid value as a table cell: a mapping or list as JSON (sorted keys), as the
    configuration's columns hold them; anything else as it is."""
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True, default=str)
    return v


def _flatten(prefix: str, v, out: dict) -> None:
    if isinstance(v, dict):
        out[prefix] = json.dumps(v, sort_keys=True)
    elif isinstance(v, (list, tuple)):
        if len(v) == 2 and all(isinstance(x, (int, float)) or x is None for x in v):
            out[f"{prefix}_low"], out[f"{prefix}_high"] = v
        else:
            out[prefix] = json.dumps(v)
    else:
        out[prefix] = v


#: Configuration options named like a summary metric, and their column in a table: the
#: `verdict` option (whether to judge stability) vs the run's `verdict`.
CONFIG_COLUMNS = {"verdict": "verdict_enabled"}
#: Options a summary metric may be named like (`num_requests`): such a metric's column is
#: `metric_NAME` in every table, whether or not the run's configuration set the option (a
#: sweep by duration had the metric under `num_requests`, one by count under `metric_...`)
OPTION_NAMES = frozenset(f.name for f in fields(SimConfig)) | frozenset(f.name for f in fields(WorkloadSpec))


def point_row(params: dict, rec: dict, grid_keys: Sequence[str]) -> dict:
    """One table row: the point's grid values (`grid_keys` of `params`), its configuration
    and workload options (`CONFIG_COLUMNS` renames a few), then every summary metric (pairs
    such as a CI become `NAME_low`/`NAME_high`; mappings, the grid's too, become JSON)."""
    cfg = rec["config"]
    row: dict[str, Any] = {"key": rec["key"]}
    for k in grid_keys:  # (a number as its option's kind: rate=2 is 2.0, as --rate 2 records it)
        # (a mapping was written as Python's repr, `{'ttft_ms': 1000}`, which JSON cannot read)
        row[k] = grid_cell(option_number(k, params.get(k), floats=FLOAT_OPTIONS, ints=INT_WORKLOAD_OPTIONS))
    row["policy_name"] = str(params.get("policy", cfg.get("policy"))).partition(":")[0]
    for k, v in cfg.items():
        if k == "workload":
            continue
        k = CONFIG_COLUMNS.get(k, k)
        if k not in row:
            _flatten(k, v, row)
    for k, v in (cfg.get("workload") or {}).items():
        if k not in row:
            _flatten(k, v, row)
    for k, v in rec["summary"].items():
        name = k if k not in row and (k not in OPTION_NAMES or k in CONFIG_COLUMNS) else f"metric_{k}"
        _flatten(name, v, row)
    row.setdefault("error", None)
    return row


def group_label(params: dict, group_keys: Sequence[str]) -> str:
    """A group's name in tables and legends: `sarathi, b_max=512`; a sweep's one group
    (a grid over load or rate alone): its policy (`vllm`, `sarathi + spf`), which gives
    its line the policy's colour, or `all` without one."""
    if not group_keys:
        policy = params.get("policy") or params.get("policy_name")  # (a search's row: its name)
        if policy in (None, ""):
            return "all"
        admission = params.get("admission")
        return str(policy) + (f" + {admission}" if admission not in (None, "", "fcfs") else "")
    parts = []
    for k in group_keys:
        v = params.get(k)
        parts.append(str(v) if k == "policy" else f"{k}={grid_cell(v)}")  # (a mapping as JSON)
    return ", ".join(parts)


def _columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    seen = set()
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


_INT64 = (-(1 << 63), (1 << 63) - 1)


def write_table(rows: list[dict], out_dir, name: str = "results", *, csv_last: bool = False) -> list[str]:
    """`NAME.csv` and (with pyarrow) `NAME.parquet`; returns the paths written (the CSV
    first). A column of whole numbers is int64 in the parquet file, or text where one is
    past int64's range (a seed may be any whole number >= 0). `csv_last`: the CSV is
    written after the parquet file (a sweep's results.csv, the last file it writes)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = _columns(rows)

    def w_csv(p):
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})

    if not csv_last:
        atomic_write(out / f"{name}.csv", w_csv)
    written = [str(out / f"{name}.csv"), *_write_parquet(rows, cols, out / f"{name}.parquet")]
    if csv_last:
        atomic_write(out / f"{name}.csv", w_csv)
    return written


def _write_parquet(rows: list[dict], cols: list[str], path: Path) -> list[str]:
    """`path` (`write_table`'s parquet file), with pyarrow; the paths written (none without it)."""
    try:
        import pyarrow as pa  # noqa: PLC0415 (heavy, and optional)
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        return []
    arrays = {}
    for c in cols:
        vals = [r.get(c) for r in rows]
        kinds = {type(v) for v in vals if v is not None}
        if kinds and kinds <= {int, bool} and bool in kinds and int not in kinds:
            arrays[c] = pa.array(vals, type=pa.bool_())
        elif kinds and kinds <= {int} and all(_INT64[0] <= v <= _INT64[1] for v in vals if v is not None):
            arrays[c] = pa.array(vals, type=pa.int64())
        elif kinds and kinds <= {int}:  # (digits kept: a float would round them)
            arrays[c] = pa.array([None if v is None else str(v) for v in vals], type=pa.string())
        elif kinds and kinds <= {int, float, bool}:
            arrays[c] = pa.array([None if v is None else float(v) for v in vals], type=pa.float64())
        else:
            arrays[c] = pa.array([None if v is None else str(v) for v in vals], type=pa.string())
    table = pa.table(arrays)
    atomic_write(path, lambda p: pq.write_table(table, p))
    return [str(path)]


def write_search(search: list[dict], out_dir) -> list[str]:
    """`search.csv` (and, with pyarrow, `search.parquet`) and `search.json`: one row per
    group of a rate search."""
    out = Path(out_dir)
    # a grid's mapping as JSON in the table's cells (as results.csv); search.json keeps it an object
    paths = write_table([{k: grid_cell(v) for k, v in r.items()} for r in search], out, "search")
    atomic_write(out / "search.json", lambda p: p.write_text(json.dumps(search, indent=2, default=str)))
    return paths + [str(out / "search.json")]
