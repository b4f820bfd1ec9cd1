"""`Trace`: the requests a simulation or a load-test client replays, as flat numpy arrays.

Columns (all of length n): `arrival_s` float64 seconds (non-decreasing, >= 0), `prompt`
int64 prompt tokens (>= 1), `output` int64 requested output tokens (>= 1), `tag` (numpy
str array, or None) and optional prefix-cache block ids (`block_ids`, `block_ptr`,
`block_size`; see `workload.blocks`). A million requests take about 24 MB (plus the tags
and ids).

File formats, told apart by the first line (`trace_format`; docs/workloads.md):
- plain: header `arrival_s,prompt_tokens,output_tokens[,tag][,block_ids@B]` (any column
  order; extra columns are ignored), block ids chained on reading as Mooncake's are.
  Written by `Trace.to_csv`.
- Azure LLM inference trace (2023 and 2024 releases): header
  `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP a wall-clock string such as
  `2023-11-16 18:15:46.6805900` (a UTC offset is allowed, on every row or none); arrival_s = seconds since the
  earliest row; 0-token entries count as 1 token.
- BurstGPT: header `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`
  (Timestamp in seconds); filters by model and log type; failed rows (0 response tokens)
  are dropped and counted in a `TraceWarning`.
- Mooncake JSON lines: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
  (ids of 512-token blocks), which become block ids; ids past a row's input_length are
  dropped and counted in a `TraceWarning`.
Any of them may be gzip-compressed, and the CSV formats' columns may come as a Parquet
table (`csvio`). Rows out of time order are sorted (stably) by arrival time when a file is
read; a bad row is a ConfigError naming the file, its line (a table's row) and the column
or key.
"""

from __future__ import annotations

import json
import math
import os
import warnings
import zlib
from dataclasses import dataclass, replace
from itertools import compress
from pathlib import Path

import numpy as np

from ..core.checks import as_int, as_real, whole_as_int
from ..core.clock import to_clock_ns
from ..core.errors import ConfigError, InputWarning
from ..core.paths import atomic_write
from ..core.request import MAX_SECONDS, Request
from .arrivals import MAX_RATE
from .blocks import (
    DEFAULT_BLOCK_SIZE,
    as_tuples,
    as_views,
    cap_rows,
    chain_ragged,
    check_block_size,
    reblock,
    take_rows,
)
from .csvio import CSV_UNSAFE, MAX_LENGTH, as_lengths, open_bytes, read_bytes, read_columns, read_header, row_place
from .datasets import resolve_path

__all__ = [
    "Trace",
    "TraceWarning",
    "FORMATS",
    "read_trace",
    "replay_cut",
    "replayed_times",
    "mean_rate",
    "read_plain_csv",
    "read_azure_csv",
    "read_burstgpt_csv",
    "read_mooncake_jsonl",
    "trace_format",
]

PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")
BLOCKS_COLUMN = "block_ids@"  # + the block size: block_ids@16


@dataclass(eq=False)
class Trace:
    """Requests as parallel arrays; validated (ConfigError) on construction."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tag: np.ndarray | None = None
    # prefix-cache block ids, ragged (see workload.blocks): request i owns
    # block_ids[block_ptr[i]:block_ptr[i + 1]], ids of its full `block_size`-token blocks
    block_ids: np.ndarray | None = None
    block_ptr: np.ndarray | None = None
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        self.arrival_s = _as_float_array(self.arrival_s, "arrival_s")
        self.prompt = _as_int_array(self.prompt, "prompt")
        self.output = _as_int_array(self.output, "output")
        n = self.arrival_s.shape[0]
        if self.prompt.shape[0] != n or self.output.shape[0] != n:
            raise ConfigError(
                f"trace columns differ in length: arrival_s has {n}, prompt "
                f"{self.prompt.shape[0]}, output {self.output.shape[0]}"
            )
        if self.tag is not None:
            self.tag = np.array(self.tag).reshape(-1)  # (a copy, as the lengths: the caller's list or array may change)
            if self.tag.dtype.kind != "U":
                self.tag = self.tag.astype(str)
            if self.tag.shape[0] != n:
                raise ConfigError(f"trace tag column has {self.tag.shape[0]} entries for {n} requests")
        self._check_blocks(n)
        if n:
            a = self.arrival_s
            if not np.all(np.isfinite(a)):
                raise ConfigError("trace arrival times must be finite numbers")
            if a[0] < 0:
                raise ConfigError(f"trace arrival times must be >= 0 (first is {a[0]})")
            if n > 1 and np.any(a[1:] < a[:-1]):
                i = int(np.argmax(a[1:] < a[:-1])) + 1
                raise ConfigError(
                    f"trace arrival times must be non-decreasing (request {i} arrives at {a[i]} s, before {a[i - 1]} s)"
                )
            for name, col in (("prompt", self.prompt), ("output", self.output)):
                if col.min() < 1:
                    i = int(np.argmin(col))
                    raise ConfigError(f"trace {name} lengths must be >= 1 token (request {i} has {int(col[i])})")

    def _check_blocks(self, n: int) -> None:
        self.block_size = check_block_size(self.block_size)
        if (self.block_ids is None) != (self.block_ptr is None):
            raise ConfigError("trace block ids need both block_ids and block_ptr (or neither)")
        if self.block_ids is None:
            return
        self.block_ids = np.asarray(self.block_ids).reshape(-1)
        self.block_ptr = np.asarray(self.block_ptr).reshape(-1)
        for name in ("block_ids", "block_ptr"):
            a = getattr(self, name)
            if a.size and a.dtype.kind not in "iu":
                raise ConfigError(f"trace {name} must be integers, got dtype {a.dtype}")
            setattr(self, name, a.astype(np.int64, copy=False))
        ptr = self.block_ptr
        if ptr.shape[0] != n + 1 or ptr[0] != 0 or ptr[-1] != self.block_ids.shape[0]:
            raise ConfigError(
                f"trace block_ptr must have {n + 1} offsets from 0 to {self.block_ids.shape[0]}, "
                f"got {ptr.shape[0]} offsets"
            )
        counts = np.diff(ptr)
        if n and counts.min() < 0:
            raise ConfigError("trace block_ptr offsets must be non-decreasing")
        # the last id may be a partial block's (kept for re-blocking, never handed out)
        over = counts > -(-self.prompt // self.block_size)
        if over.any():
            i = int(np.argmax(over))
            raise ConfigError(
                f"request {i} has {int(counts[i])} block ids but its {int(self.prompt[i])}-token prompt "
                f"holds only {-(-int(self.prompt[i]) // self.block_size)} blocks of {self.block_size} tokens"
            )

    @property
    def has_blocks(self) -> bool:
        return self.block_ids is not None

    def _with(self, **changes) -> Trace:
        return replace(self, **changes)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def n(self) -> int:
        return len(self)

    def slice(self, start: int = 0, stop: int | None = None) -> Trace:
        """Requests start..stop-1 (Python slice semantics; arrival times kept as they are)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        stop = max(start, stop)
        s = slice(start, stop)
        ids = ptr = None
        if self.block_ids is not None:
            ptr = self.block_ptr[start : stop + 1] - self.block_ptr[start]
            ids = self.block_ids[self.block_ptr[start] : self.block_ptr[stop]]
        return self._with(
            arrival_s=self.arrival_s[s],
            prompt=self.prompt[s],
            output=self.output[s],
            tag=None if self.tag is None else self.tag[s],
            block_ids=ids,
            block_ptr=ptr,
        )

    def head(self, n: int) -> Trace:
        """The first n requests (n a whole number >= 0)."""
        # int(n) cut head(2.5) to 2 requests and head(-1) to none, and read head("5"): silently
        count = as_int(whole_as_int(n))
        if count is None or count < 0:
            raise ConfigError(f"Trace.head: n must be a whole number >= 0, got {n!r:.60}")
        return self.slice(0, count)

    def until(self, duration_s: float) -> Trace:
        """Requests arriving at or before `duration_s` (seconds)."""
        t = as_real(duration_s)
        if t is None or math.isnan(t):  # (a string was compared with the times; NaN kept none)
            raise ConfigError(f"Trace.until: duration_s must be a number of seconds, got {duration_s!r:.60}")
        return self.head(int(np.searchsorted(self.arrival_s, t, side="right")))

    def time_scaled(self, k: float) -> Trace:
        """Arrival times divided by k (k > 1 replays the trace k times faster)."""
        k = float(k)
        if not (np.isfinite(k) and k > 0):
            raise ConfigError(f"time_scale must be a positive number, got {k}")
        return self._with(arrival_s=self.arrival_s / k)

    def with_lengths(self, prompt=None, output=None) -> Trace:
        """Same arrivals with prompt and/or output lengths replaced (block ids beyond a
        new prompt's blocks are dropped; a longer prompt keeps only the old prompt's
        full blocks)."""
        t = self._with(output=self.output if output is None else output)
        if prompt is None:
            return t
        prompt = _as_int_array(prompt, "prompt")
        if t.block_ids is None or prompt.shape[0] != len(t):
            return t._with(prompt=prompt)
        b = t.block_size
        # an old partial last block's id stands for its tokens only: it may stay while the
        # prompt does not grow, but a longer prompt would make it a full-block hit
        cap = np.where(prompt <= t.prompt, -(-prompt // b), t.prompt // b)
        ids, ptr = cap_rows(t.block_ids, t.block_ptr, cap)
        return t._with(prompt=prompt, block_ids=ids, block_ptr=ptr)

    def with_tags(self, tag) -> Trace:
        return self._with(tag=tag)

    def with_blocks(self, block_ids, block_ptr, block_size: int = DEFAULT_BLOCK_SIZE) -> Trace:
        """The same requests with these block ids (None, None: without any)."""
        return self._with(block_ids=block_ids, block_ptr=block_ptr, block_size=block_size)

    def with_block_size(self, block_size: int) -> Trace:
        """Block ids for cache blocks of `block_size` tokens (`workload.blocks.reblock`:
        one size must divide the other). Going coarser and back loses sharing below the
        coarse size; a trace without block ids just records the size."""
        block_size = check_block_size(block_size)
        if block_size == self.block_size:
            return self
        if self.block_ids is None:
            return self._with(block_size=block_size)
        ids, ptr = reblock(self.block_ids, self.block_ptr, self.prompt, self.block_size, block_size)
        return self._with(block_ids=ids, block_ptr=ptr, block_size=block_size)

    def blocks(self, block_size: int | None = None) -> list:
        """Per-request tuples of block ids (None where a request has none), at the trace's
        block size or `block_size`."""
        return list(self.iter_blocks(block_size))

    def iter_blocks(self, block_size: int | None = None, chunk: int = 4096):
        """Yield each request's block ids (a tuple, or None), at `block_size` tokens per
        block (default: the trace's own): `iter_block_views` as tuples. Re-blocking is done
        `chunk` requests at a time, so a big trace can be stored at its source block size
        (Mooncake: 512 tokens) and fed at the cache's 16 without ever holding all the finer
        ids."""
        for view in self.iter_block_views(block_size, chunk):
            yield None if view is None else tuple(view)

    def iter_block_views(self, block_size: int | None = None, chunk: int = 4096):
        """`iter_blocks`' ids as read-only memoryviews (`workload.blocks.as_views`: 8 bytes
        per id instead of a tuple's ~40, and nothing copied at the trace's own block size),
        what the simulator sets `Request.blocks` to. At another block size each chunk of
        `chunk` requests is re-blocked once, its views sharing the chunk's array."""
        n = len(self)
        if self.block_ids is None:
            yield from (None for _ in range(n))
            return
        b = self.block_size if block_size is None else check_block_size(block_size)
        if b == self.block_size:
            # views onto the trace's own ids, without a partial last block's id (as `reblock`)
            keep = np.minimum(np.diff(self.block_ptr), self.prompt // b)
            yield from as_views(self.block_ids, self.block_ptr, keep)
            return
        for start in range(0, n, chunk):
            part = self.slice(start, start + chunk)
            ids, ptr = reblock(part.block_ids, part.block_ptr, part.prompt, self.block_size, b)
            yield from as_views(ids, ptr)

    def copy(self) -> Trace:
        return self._with(
            arrival_s=self.arrival_s.copy(),
            prompt=self.prompt.copy(),
            output=self.output.copy(),
            tag=None if self.tag is None else self.tag.copy(),
            block_ids=None if self.block_ids is None else self.block_ids.copy(),
            block_ptr=None if self.block_ptr is None else self.block_ptr.copy(),
        )

    def arrival_ns(self) -> np.ndarray:
        """Arrival times as int64 nanoseconds (the simulator's clock)."""
        return to_clock_ns(self.arrival_s)

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: (n - 1) / span (nan with fewer than 2 requests or no span)."""
        return mean_rate(self.arrival_s)

    def describe(self) -> dict:
        """Summary numbers (count, span, rate, length means and p99s)."""
        n = len(self)
        d = {"requests": n, "span_s": self.span_s, "mean_rate": self.mean_rate}
        for name, col in (("prompt", self.prompt), ("output", self.output)):
            d[f"{name}_mean"] = float(col.mean()) if n else float("nan")
            d[f"{name}_p99"] = float(np.percentile(col, 99)) if n else float("nan")
        if self.tag is not None:
            tags, counts = np.unique(self.tag, return_counts=True)
            d["tags"] = {str(t): int(c) for t, c in zip(tags, counts)}
        if self.block_ids is not None:
            ids, _ = reblock(self.block_ids, self.block_ptr, self.prompt, self.block_size, self.block_size)
            # distinct ids by sorting: numpy 2.4's np.unique of integers (a hash table) took
            # 2.1 s of CPU for 1.9M ids, sorting and counting the changes 0.03 s
            srt = np.sort(ids)
            distinct = int(srt.size and 1 + np.count_nonzero(srt[1:] != srt[:-1]))
            d["block_size"] = self.block_size
            d["full_blocks"] = int(ids.shape[0])
            # the block hit rate of an unbounded cache: blocks whose id came before
            d["block_reuse"] = 1.0 - distinct / ids.shape[0] if ids.shape[0] else 0.0
        return d

    def requests(self, start_id: int = 0, block_size: int | None = None):
        """Yield `llmsched.core.Request` objects (arrival in integer ns), one at a time,
        with `Request.blocks` set from the block ids (at `block_size` tokens per block if
        given, else at the trace's own block size)."""
        ns = self.arrival_ns().tolist()
        prompt = self.prompt.tolist()
        output = self.output.tolist()
        tags = self.tag.tolist() if self.tag is not None else None
        for i, blocks in enumerate(self.iter_blocks(block_size)):
            r = Request(start_id + i, ns[i], prompt[i], output[i], tags[i] if tags is not None else "")
            r.blocks = blocks
            yield r

    def __eq__(self, other) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if (self.tag is None) != (other.tag is None) or (self.block_ids is None) != (other.block_ids is None):
            return False
        if self.block_ids is not None and not (
            self.block_size == other.block_size
            and np.array_equal(self.block_ptr, other.block_ptr)
            and np.array_equal(self.block_ids, other.block_ids)
        ):
            return False
        return (
            np.array_equal(self.arrival_s, other.arrival_s)
            and np.array_equal(self.prompt, other.prompt)
            and np.array_equal(self.output, other.output)
            and (self.tag is None or np.array_equal(self.tag, other.tag))
        )

    def __repr__(self) -> str:
        return (
            f"Trace(n={len(self)}, span_s={self.span_s:.3f}, "
            f"tags={'none' if self.tag is None else len(np.unique(self.tag))}"
            + ("" if self.block_ids is None else f", block_size={self.block_size}")
            + ")"
        )

    # ------------------------------------------------------------------ files
    def to_csv(self, path: str | os.PathLike) -> None:
        """Write `arrival_s,prompt_tokens,output_tokens[,tag][,block_ids@B]`; everything
        round-trips exactly (arrival times too) but the block ids' values: reading chains
        them again, which keeps what the requests share."""
        cols = [map(repr, self.arrival_s.tolist()), map(str, self.prompt.tolist()), map(str, self.output.tolist())]
        header = ",".join(PLAIN_COLUMNS)
        if self.tag is not None:
            if len(self) and any(np.char.find(self.tag, c).max() >= 0 for c in CSV_UNSAFE):
                raise ConfigError(
                    "trace tags must not contain commas, quotes, newlines or carriage returns to be written as CSV"
                )
            cols.append(self.tag.tolist())
            header += ",tag"
        if self.block_ids is not None:
            # space-separated ids in one column whose name carries the block size; the ids
            # as stored, a partial last block's included (`blocks()` hands out full blocks
            # only), so that re-blocking the file read back gives the same ids
            cols.append(" ".join(map(str, b)) if b else "" for b in as_tuples(self.block_ids, self.block_ptr))
            header += f",{BLOCKS_COLUMN}{self.block_size}"

        def write(tmp) -> None:
            with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(header + "\n")
                chunk = 100_000
                rows = zip(*cols)
                while True:
                    block = [",".join(r) for _, r in zip(range(chunk), rows)]
                    if not block:
                        break
                    fh.write("\n".join(block) + "\n")

        try:  # whole or not at all: a write stopped between rows left a shorter trace that reads as valid
            atomic_write(path, write)
        except OSError as exc:
            raise ConfigError(f"cannot write trace file {path}: {exc}") from None

    @classmethod
    def from_csv(cls, path: str | os.PathLike) -> Trace:
        """Read a plain `arrival_s,prompt_tokens,output_tokens[,tag][,block_ids@B]` CSV file."""
        with open_bytes(path) as f:  # (a JSON line read as a CSV header "holds a number")
            first = next((line for line in f if line.strip()), b"")
        if first.lstrip(b"\xef\xbb\xbf \t").startswith((b"{", b"[")):
            raise ConfigError(
                f"file {path} is not a CSV file: its first line is JSON (a Mooncake trace?): read it with "
                "llmsched.workload.read_trace (or --trace)"
            )
        return read_plain_csv(path)


def mean_rate(arrival_s) -> float:
    """Arrivals per second of sorted arrival times: (n - 1) / (t_last - t_first), nan with
    fewer than 2 arrivals or no time between them."""
    n = len(arrival_s)
    span = float(arrival_s[-1] - arrival_s[0]) if n else 0.0
    return (n - 1) / span if n > 1 and span > 0 else float("nan")


def _column(x, name: str, what: str, hint: str = "") -> np.ndarray:
    """`x` as a 1-D array of one value per request (a vector of shape (n, 1) or (1, n) too).
    Rows of several values, or a sequence among numbers (a prompt's token ids where its
    length goes: `[[1, 2, 3], 5]`, `[[1, 2, 3], [4, 5, 6]]`), are a ConfigError naming
    `name` and adding `hint`: numpy raised a ValueError for the first, and the second was
    flattened into 6 lengths."""
    one = f"trace {name} must hold one {what} per request"
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):  # (a ragged sequence: numpy builds no array of it)
        raise ConfigError(f"{one}, got lists among numbers{hint}") from None
    if a.ndim > 1 and a.size != max(a.shape):
        raise ConfigError(f"{one}, got an array of shape {a.shape}{hint}")
    a = a.reshape(-1)
    if a.dtype.kind == "O" and any(isinstance(v, (list, tuple, np.ndarray)) for v in a.tolist()):
        raise ConfigError(f"{one}, got lists among numbers{hint}")
    return a


def _as_float_array(x, name: str) -> np.ndarray:
    """Times as float64: numbers (or an empty column) only, not strings nor booleans."""
    a = _column(x, name, "time")
    if a.dtype.kind in "iuf" or a.size == 0:
        return a.astype(np.float64)
    if a.dtype.kind == "O" and not any(isinstance(v, (str, bytes, bool, np.bool_)) for v in a.tolist()):
        try:
            return a.astype(np.float64)
        except (TypeError, ValueError):
            pass
    raise ConfigError(f"trace {name} must be numbers (seconds), got dtype {a.dtype}")


def _as_int_array(x, name: str) -> np.ndarray:
    """Lengths as int64, always a copy: a Trace (and the SimResult of its run) must not change
    when the caller reuses the array it was built from."""
    a = _column(x, name, "length", " (a prompt's token ids are no length: give len(ids))")
    if a.dtype.kind in "iu":
        if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:  # (int64 would wrap it negative)
            raise ConfigError(f"trace {name} lengths are too large ({int(a.max())} tokens)")
        return a.astype(np.int64)
    if a.dtype.kind == "b" or a.dtype.kind not in "f":
        if a.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise ConfigError(f"trace {name} lengths must be integers, got dtype {a.dtype}")
    if not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
        raise ConfigError(f"trace {name} lengths must be whole numbers of tokens")
    if np.any(np.abs(a) > 2.0**62):
        raise ConfigError(f"trace {name} lengths are too large ({float(np.abs(a).max()):g} tokens)")
    return a.astype(np.int64)


def _sorted(arrival, prompt, output, tag, ids=None, ptr=None):
    """Rows in (stable) arrival order."""
    if arrival.size > 1 and np.any(arrival[1:] < arrival[:-1]):
        order = np.argsort(arrival, kind="stable")
        arrival, prompt, output = arrival[order], prompt[order], output[order]
        tag = None if tag is None else tag[order]
        if ids is not None:
            ids, ptr = take_rows(ids, ptr, order)
    return arrival, prompt, output, tag, ids, ptr


# ---------------------------------------------------------------------------- formats
FORMATS = {
    "plain": "plain CSV (arrival_s,prompt_tokens,output_tokens[,tag][,block_ids@B])",
    "azure": "Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
    "burstgpt": "BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)",
    "mooncake": "Mooncake JSON lines (timestamp,input_length,output_length,hash_ids)",
}


def trace_format(path: str | os.PathLike) -> str:
    """'plain', 'azure', 'burstgpt' or 'mooncake' from a file's first non-blank line; ConfigError
    (one line naming the formats) for anything else."""
    p = Path(path)
    if p.is_file():
        try:
            with open_bytes(p) as fh:
                first = fh.read(1 << 16).lstrip(b"\xef\xbb\xbf \t\r\n")
        except (OSError, EOFError, zlib.error) as exc:
            raise ConfigError(f"cannot read file {p}: {exc}") from None
        if first.startswith(b"{"):
            return "mooncake"
    header = read_header(p)
    if all(c in header for c in PLAIN_COLUMNS):
        return "plain"
    if all(c in header for c in AZURE_COLUMNS):
        return "azure"
    if all(c in header for c in BURSTGPT_COLUMNS):
        return "burstgpt"
    raise ConfigError(
        f"file {p} (first line: {','.join(header)[:120]}) is not a trace in a known format: "
        + "; ".join(FORMATS.values())
    )


def _blocks_column(header: list[str]) -> tuple[str, int] | None:
    cols = [c for c in header if c.startswith(BLOCKS_COLUMN)]
    if not cols:
        return None
    if len(cols) > 1:
        raise ConfigError(f"a trace file has one {BLOCKS_COLUMN}B column at most, found {', '.join(cols)}")
    return cols[0], check_block_size(cols[0][len(BLOCKS_COLUMN) :] or None, f"the block size in column '{cols[0]}'")


def read_plain_csv(path: str | os.PathLike) -> Trace:
    """Read `arrival_s,prompt_tokens,output_tokens[,tag][,block_ids@B]` (or the same
    columns of a Parquet table); block ids are chained (`chain_ragged`) as Mooncake's are."""
    bcol = _blocks_column(read_header(path))
    optional = {"tag": "str"}
    if bcol:
        optional[bcol[0]] = "text"  # (a str array would hold every row at the longest row's width)
    cols = read_columns(path, {"arrival_s": "float", "prompt_tokens": "float", "output_tokens": "float"}, optional)
    arrival = cols["arrival_s"]
    if arrival.size == 0:
        raise ConfigError(f"trace file {path} has no data rows")
    bad = ~np.isfinite(arrival) | (arrival < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(
            f"file {path} {row_place(path, i)} column 'arrival_s': {float(arrival[i])!r} is not a time >= 0"
        )
    prompt = as_lengths(cols["prompt_tokens"], path, "prompt_tokens")
    output = as_lengths(cols["output_tokens"], path, "output_tokens")
    ids = ptr = None
    size = DEFAULT_BLOCK_SIZE
    if bcol:
        name, size = bcol
        ids, ptr = _parse_id_lists(cols[name], path, f"column {name!r}", sep=" ")
        counts = np.diff(ptr)
        over = counts > -(-prompt // size)
        if over.any():
            i = int(np.argmax(over))
            raise ConfigError(
                f"file {path} {row_place(path, i)} column '{name}': {int(counts[i])} block ids for a "
                f"{int(prompt[i])}-token prompt (at most {-(-int(prompt[i]) // size)} blocks of {size} tokens)"
            )
    arrival, prompt, output, tag, ids, ptr = _sorted(arrival, prompt, output, cols.get("tag"), ids, ptr)
    if ids is not None:
        # chained as Mooncake's hash_ids are: id k then stands for the row's ids 0..k, so a
        # file of per-block content ids works (the cache compares prefix ids), and a file of
        # prefix ids (what `to_csv` writes) shares exactly what it shared before
        ids = chain_ragged(ids, ptr)
    return Trace(arrival, prompt, output, tag, ids, ptr, size)


def _parse_id_lists(texts, path, column: str, sep: str, rows_to_lines=None) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int64 ids from per-row strings of `sep`-separated integers (C speed: one
    join and one numpy parse); ConfigError naming the line of a bad row."""
    texts = [t.strip() for t in (texts.tolist() if isinstance(texts, np.ndarray) else texts)]
    counts = np.fromiter((t.count(sep) + 1 if t else 0 for t in texts), dtype=np.int64, count=len(texts))
    ptr = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    ids = _numbers(sep.join(t for t in texts if t), np.int64, sep, int(ptr[-1]))
    if ids is None:
        for i, t in enumerate(texts):
            if t and _numbers(t, np.int64, sep, int(counts[i])) is None:
                place = f"line {rows_to_lines(i)}" if rows_to_lines else row_place(path, i)
                raise ConfigError(
                    f"file {path} {place} {column}: cannot read {t[:60]!r} as block ids ({ID_RANGE}) "
                    f"separated by {'spaces' if sep == ' ' else repr(sep)}"
                )
        raise ConfigError(f"file {path} {column}: malformed block ids")
    return ids, ptr


_INT64_LIMITS = (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
_UINT64_MAX = 2**64 - 1
#: the block ids the readers take (`_wide_ids`), named in their messages
ID_RANGE = "integers from -2^63 to 2^64 - 1"


def read_azure_csv(path: str | os.PathLike) -> Trace:
    """Read an Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    cols = read_columns(path, {"TIMESTAMP": "datetime", "ContextTokens": "float", "GeneratedTokens": "float"})
    ts = cols["TIMESTAMP"]
    if ts.size == 0:
        raise ConfigError(f"trace file {path} has no data rows")
    if np.isnat(ts).any():
        i = int(np.argmax(np.isnat(ts)))
        raise ConfigError(f"file {path} {row_place(path, i)} column 'TIMESTAMP' is empty or not a time")
    ns = ts.astype(np.int64)
    arrival = (ns - ns.min()).astype(np.float64) / 1e9
    # Production logs may hold 0-token entries: counted as 1 token (negatives are errors).
    prompt = as_lengths(cols["ContextTokens"], path, "ContextTokens", clip_low=True)
    output = as_lengths(cols["GeneratedTokens"], path, "GeneratedTokens", clip_low=True)
    return Trace(*_sorted(arrival, prompt, output, None))


# Mooncake's own layout, one request a line: each line split once at its brackets, then
# checked by bytes.translate and parsed by numpy (two calls for the whole file). Anything
# else (other key order, extra keys, a bad value, a number JSON does not allow) falls back
# to json.loads line by line, which also names the bad line.
_MOONCAKE_HEAD = b'{"timestamp":,"input_length":,"output_length":,"hash_ids":'
_NUMBER_BYTES = b"0123456789.-"
_TO_SPACE = bytes(c if c in _NUMBER_BYTES else ord(" ") for c in range(256))
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_SIZE = 512  # tokens per hash_ids entry in Mooncake's traces


def read_mooncake_jsonl(
    path: str | os.PathLike, block_size: int | None = DEFAULT_BLOCK_SIZE, source_block_size: int = MOONCAKE_BLOCK_SIZE
) -> Trace:
    """Read Mooncake JSON lines: `timestamp` (ms), `input_length`, `output_length`,
    `hash_ids` (ids of the prompt's `source_block_size`-token blocks, 512 in Mooncake's
    traces, the last one possibly partial). The ids are chained (so equal ids at a
    position mean equal prefixes even if a trace's ids were per-block content hashes) and
    mapped to `block_size`-token cache blocks (None: kept at the source size, the partial
    last block's id included, for `Trace.iter_blocks` to re-block a chunk at a time)."""
    p = Path(path)
    source_block_size = check_block_size(source_block_size, "the trace's block size")
    raw = read_bytes(p)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = raw.split(b"\n")
    del raw
    # blank lines are skipped (C-level passes: a million lines take well under a second)
    filled = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)) > 0
    nonblank = np.flatnonzero(filled).tolist()
    rows = list(compress(lines, filled.tolist()))
    del lines
    spaces = list(map(bytes.isspace, rows))
    if any(spaces):
        keep = [not x for x in spaces]
        rows, nonblank = list(compress(rows, keep)), list(compress(nonblank, keep))
    if not rows:
        raise ConfigError(f"trace file {p} has no data rows")
    parsed = _mooncake_fast(rows) or _mooncake_slow(p, rows, nonblank)
    ts, inp, out, ids, ptr = parsed

    def line(i: int) -> int:
        return nonblank[i] + 1

    for key, v in (("timestamp", ts), ("input_length", inp), ("output_length", out)):
        bad = ~np.isfinite(v) | (v < 0)
        if key != "timestamp":
            bad |= (v != np.floor(v)) | (v > MAX_LENGTH)
        if bad.any():
            i = int(np.argmax(bad))
            what = "a time >= 0 in ms" if key == "timestamp" else "a whole number of tokens >= 0"
            raise ConfigError(f"file {p} line {line(i)} key '{key}': {float(v[i])!r} is not {what}")
    arrival = (ts - ts.min()) / 1000.0
    # as in the Azure trace, a 0-token prompt or output counts as 1 token
    prompt = np.maximum(inp, 1).astype(np.int64)
    output = np.maximum(out, 1).astype(np.int64)
    # ids past the prompt's last (possibly partial) block describe nothing: dropped, and
    # counted (Mooncake's published traces have none: a trace cut to a shorter input_length,
    # or one of other block sizes, would share prefixes its prompts do not hold)
    need = -(-prompt // source_block_size)
    extra = np.diff(ptr) > need
    if extra.any():
        i = int(np.argmax(extra))
        warnings.warn(
            f"trace {p}: dropped the hash_ids past the prompt of {int(extra.sum()):,} row(s) with more ids than "
            f"their input_length needs at {source_block_size} tokens a block (first: line {line(i)}, "
            f"{int(ptr[i + 1] - ptr[i])} ids for {int(prompt[i])} tokens, at most {int(need[i])})",
            TraceWarning,
            stacklevel=2,
        )
    ids, ptr = cap_rows(ids, ptr, need)
    arrival, prompt, output, _, ids, ptr = _sorted(arrival, prompt, output, None, ids, ptr)
    chained = chain_ragged(ids, ptr)
    t = Trace(arrival, prompt, output, None, chained, ptr, source_block_size)
    return t if block_size is None else t.with_block_size(block_size)


def _mooncake_fast(rows: list[bytes]):
    """(timestamps, input lengths, output lengths, ids, ptr) of rows in Mooncake's exact
    layout, or None if any row is laid out otherwise."""
    heads, lists, tails = [], [], []
    for row in rows:
        head, sep, rest = row.partition(b"[")
        lst, sep2, tail = rest.partition(b"]")
        if not sep2:
            return None
        heads.append(head)
        lists.append(lst)
        tails.append(tail)
    n = len(rows)
    # the keys in this order and nothing but numbers and spaces between them
    joined = b"".join(heads)
    if joined.translate(None, b"0123456789.- \t") != _MOONCAKE_HEAD * n:
        return None
    # an empty value (':,') could make up for a value split by a space ('1 2') in the count
    if b":," in joined.translate(None, b" \t"):
        return None
    if b"".join(tails).translate(None, b" \t\r") != b"}" * n:
        return None
    body = b",".join(filter(None, lists))
    if body.translate(None, b"0123456789-, \t"):
        return None
    # numpy would read an empty field ('1, ,2', a list of only spaces) as 0: leave those to json
    compact = body.translate(None, b" \t")
    if b",," in compact or compact[:1] == b"," or compact[-1:] == b"," or (body and not compact):
        return None
    spaced = b" ".join(heads).translate(_TO_SPACE)
    if not (_json_numbers(spaced) and _json_numbers(body)):
        return None
    scalars = _numbers(spaced, np.float64, " ", 3 * n)
    counts = np.fromiter((x.count(b",") + 1 if x else 0 for x in lists), dtype=np.int64, count=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    ids = _numbers(body, np.int64, ",", int(ptr[-1]))
    if scalars is None or ids is None:
        return None
    scalars = scalars.reshape(n, 3)
    return scalars[:, 0].copy(), scalars[:, 1].copy(), scalars[:, 2].copy(), ids, ptr


def _json_numbers(text: bytes) -> bool:
    """Whether every number in `text` (digits, '.' and '-', between separators: spaces,
    tabs, commas) is spelt as JSON allows, so that numpy reads what json.loads would, and
    refuses what it refuses: no leading zero ('007'), a '.' between digits ('1.', '.5' are
    not JSON), a '-' only before a number's first digit. numpy refuses the rest ('1.2.3',
    '1-2'). Vectorised over the text's bytes, of which digits are the only ones from '0' up."""
    a = np.frombuffer(text, dtype=np.uint8)
    if a.size > 1 and a[0] == ord("0") and a[1] >= ord("0"):
        return False
    # a zero that starts a number (after a separator or a sign) and is followed by a digit
    if ((a[1:-1] == ord("0")) & (a[:-2] < ord(".")) & (a[2:] >= ord("0"))).any():
        return False
    last = a.size - 1
    if b"." in text:
        dot = np.flatnonzero(a == ord("."))
        if dot[0] == 0 or dot[-1] == last or (a[dot - 1] < ord("0")).any() or (a[dot + 1] < ord("0")).any():
            return False
    if b"-" in text:
        minus = np.flatnonzero(a == ord("-"))
        if minus[-1] == last or (a[minus + 1] < ord("0")).any():  # a digit next
            return False
        if (a[minus[minus > 0] - 1] >= ord("-")).any():  # a separator before: no digit, '.' or '-'
            return False
    return True


def _numbers(text: str | bytes, dtype, sep: str, expected: int) -> np.ndarray | None:
    """Exactly `expected` numbers separated by `sep`, or None if the text is anything else."""
    if expected == 0:
        return np.zeros(0, dtype=dtype) if not text.strip() else None
    with warnings.catch_warnings():
        # numpy reports text it cannot parse ('1.5' as int, 'x', '1,,2') as a DeprecationWarning
        warnings.simplefilter("error", DeprecationWarning)
        try:
            out = np.fromstring(text, dtype=dtype, sep=sep)
        except (ValueError, DeprecationWarning):
            return None
    if out.shape[0] != expected:
        return None
    # numpy saturates out-of-range integers at the int64 limits instead of failing
    if dtype == np.int64 and out.size and (out.min() == _INT64_LIMITS[0] or out.max() == _INT64_LIMITS[1]):
        return _wide_ids(text, sep, expected)
    return out


def _wide_ids(text: str | bytes, sep: str, expected: int) -> np.ndarray | None:
    """Block ids (the only int64 `_numbers` reads) from -2**63 to 2**64 - 1, an id from
    2**63 up as its int64 bit pattern (less 2**64): unsigned 64-bit hashes (xxhash64's,
    vLLM's, SGLang's) are only compared and chained (`chain_ragged` hashes the bits), so
    that loses nothing. None for text of `expected` numbers with one outside that range."""
    if (b"-" if isinstance(text, bytes) else "-") not in text:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            try:
                out = np.fromstring(text, dtype=np.uint64, sep=sep)
            except (ValueError, DeprecationWarning):
                return None
        # (numpy saturates here too: 2**64 - 1 itself is checked exactly below)
        if out.shape[0] == expected and out.max() < _UINT64_MAX:
            return out.view(np.int64)
    if isinstance(text, bytes):
        text = text.decode("ascii")
    try:
        vals = [int(x) for x in text.replace(sep, " ").split()]
    except ValueError:
        return None
    if len(vals) != expected or not all(_INT64_LIMITS[0] <= v <= _UINT64_MAX for v in vals):
        return None
    return np.array([_int64_bits(v) for v in vals], dtype=np.int64)


def _int64_bits(v: int) -> int:
    """An id from 2**63 up as its int64 bit pattern (less 2**64); a smaller one as it is."""
    return v - 2**64 if v > _INT64_LIMITS[1] else v


class _RepeatedKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_repeated_key(pairs: list) -> dict:
    """A JSON object's dict, refusing a key given twice: json.loads keeps the last, so
    `{"timestamp": 1, ..., "timestamp": 5}` replayed at 5 ms, silently (as a config file's
    repeated key is refused)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


# a file that starts with "{" or "[" is read as Mooncake's JSON lines: a pretty-printed
# JSON file (a run's summary.json given as --trace) failed at line 1 without saying so
MOONCAKE_LINES = " (a JSON trace is Mooncake JSON lines: one object a line)"


def _mooncake_slow(p: Path, rows: list[bytes], nonblank: list[int]):
    """As `_mooncake_fast` for any key order and extra keys, one JSON object a line;
    ConfigError naming the first bad line."""
    ts, inp, out, ids = [], [], [], []
    for row, i in zip(rows, nonblank):
        try:
            obj = json.loads(row, object_pairs_hook=_no_repeated_key)
        except _RepeatedKey as exc:
            raise ConfigError(f"file {p} line {i + 1} gives key '{exc.key}' twice") from None
        except ValueError as exc:
            raise ConfigError(f"file {p} line {i + 1} is not a JSON object: {exc}{MOONCAKE_LINES}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"file {p} line {i + 1} is not a JSON object{MOONCAKE_LINES}")
        missing = [k for k in MOONCAKE_KEYS if k not in obj]
        if missing:
            raise ConfigError(
                f"file {p} line {i + 1} has no '{missing[0]}' (Mooncake rows need {', '.join(MOONCAKE_KEYS)})"
            )
        for key, dest in (("timestamp", ts), ("input_length", inp), ("output_length", out)):
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"file {p} line {i + 1} key '{key}': {v!r} is not a number")
            dest.append(float(v))
        h = obj["hash_ids"]
        if not isinstance(h, list) or any(
            isinstance(x, bool) or not isinstance(x, int) or not _INT64_LIMITS[0] <= x <= _UINT64_MAX for x in h
        ):
            raise ConfigError(f"file {p} line {i + 1} key 'hash_ids' must be a list of {ID_RANGE}")
        # an unsigned 64-bit hash as its int64 bit pattern (`_wide_ids`)
        ids.append([_int64_bits(x) for x in h])
    counts = np.array([len(h) for h in ids], dtype=np.int64)
    ptr = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    flat = np.fromiter((x for h in ids for x in h), dtype=np.int64, count=int(ptr[-1]))
    return np.array(ts), np.array(inp), np.array(out), flat, ptr


def read_burstgpt_csv(
    path: str | os.PathLike, model: str | list | None = None, log_type: str | list | None = None
) -> Trace:
    """Read a BurstGPT CSV (`Timestamp,Model,Request tokens,Response tokens,Total
    tokens,Log Type`; Timestamp in seconds). `model` / `log_type` keep only rows whose
    Model / Log Type is one of the given names (case-insensitive; a comma-separated string
    or a list). Rows with 0 response tokens are failed requests: they are dropped, and
    their count is reported as a `TraceWarning`. A 0-token request counts as 1 token."""
    cols = read_columns(
        path,
        {
            "Timestamp": "float",
            "Request tokens": "float",
            "Response tokens": "float",
            "Model": "str",
            "Log Type": "str",
        },
    )
    ts = cols["Timestamp"]
    if ts.size == 0:
        raise ConfigError(f"trace file {path} has no data rows")
    bad = ~np.isfinite(ts) | (ts < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"file {path} {row_place(path, i)} column 'Timestamp': {float(ts[i])!r} is not a time >= 0")
    prompt = as_lengths(cols["Request tokens"], path, "Request tokens", clip_low=True)
    response = as_lengths(cols["Response tokens"], path, "Response tokens", minimum=0)
    keep = np.ones(ts.shape[0], dtype=bool)
    for column, wanted, key in (("Model", model, "trace_model"), ("Log Type", log_type, "trace_log_type")):
        names = _names(wanted, key)
        if names is None:
            continue
        have = np.char.lower(cols[column])
        keep &= np.isin(have, [n.lower() for n in names])
        if not np.isin([n.lower() for n in names], have).all():
            known = ", ".join(sorted(set(cols[column].tolist())))
            missing = [n for n in names if n.lower() not in set(have.tolist())]
            raise ConfigError(f"trace {path} has no rows with {column} '{missing[0]}' (it has: {known})")
    failed = keep & (response == 0)
    if failed.any():
        warnings.warn(
            f"trace {path}: dropped {int(failed.sum())} failed request(s) with 0 response tokens",
            TraceWarning,
            stacklevel=2,
        )
    keep &= ~failed
    if not keep.any():
        raise ConfigError(f"trace {path} has no requests left after filtering")
    arrival = ts[keep] - ts[keep].min()
    return Trace(*_sorted(arrival, prompt[keep], response[keep], None))


def _names(x, key: str) -> list[str] | None:
    """The names a BurstGPT filter gives (a string of comma-separated names, or a list);
    None for no filter. One that names nothing (`--trace-model ,`) is a ConfigError naming
    `key`: it kept every row, as no filter does."""
    if x is None:
        return None
    names = [str(n).strip() for n in (x.split(",") if isinstance(x, str) else x) if str(n).strip()]
    if not names:
        flag = "--" + key.replace("_", "-")
        raise ConfigError(f"{key} ({flag}) {x!r:.60} names nothing: give one or more names separated by commas")
    return names


class TraceWarning(InputWarning):
    """Something a trace reader dropped or changed (e.g. BurstGPT's failed requests)."""


def read_trace(
    path: str | os.PathLike,
    block_size: int | None = DEFAULT_BLOCK_SIZE,
    *,
    model: str | list | None = None,
    log_type: str | list | None = None,
) -> Trace:
    """Read a trace file in any of the formats (told apart by the first line, see
    `FORMATS`); block ids (Mooncake, or a plain CSV's block_ids@B column) are mapped to
    `block_size`-token cache blocks (None: kept as the file has them). `model` and
    `log_type` filter BurstGPT rows (an error for other formats)."""
    path = resolve_path(path)  # a named trace (azure-conv) as `--trace` takes it
    fmt = trace_format(path)
    if fmt != "burstgpt" and (model is not None or log_type is not None):
        raise ConfigError(f"trace model and log type filters apply to BurstGPT traces only; {path} is {FORMATS[fmt]}")
    if fmt == "mooncake":
        return read_mooncake_jsonl(path, block_size)
    if fmt == "burstgpt":
        t = read_burstgpt_csv(path, model, log_type)
    elif fmt == "azure":
        t = read_azure_csv(path)
    else:
        t = read_plain_csv(path)
    return t if block_size is None else t.with_block_size(block_size)


def replay_cut(
    arrival,
    *,
    rate: float | None = None,
    time_scale: float = 1.0,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> tuple[float, int]:
    """How to replay a trace with (sorted) arrival times `arrival`: (k, n), replay its
    first n requests at times arrival[:n] / k.

    Without `rate`: k = time_scale (k times as fast); n keeps the first num_requests, then
    those arriving at or before duration_s in the scaled clock.

    With `rate` R: the replayed part itself has mean rate R, measured as `Trace.mean_rate`
    measures it: (n - 1) / (t_last - t_first), its n - 1 gaps over the span from its first
    to its last arrival. (Scaling by the whole trace's rate and then cutting would not do:
    a trace's rate drifts, so its head runs faster or slower than asked.) Hence:
    - neither num_requests nor duration_s: the whole trace, k = R / its mean rate;
    - num_requests N: the first N requests, k = R / their mean rate;
    - duration_s D (and at most N requests): the longest head whose arrivals, scaled to
      mean rate R by that head's own rate, all come at or before D (R to rounding). For a
      trace starting at 0 (Azure) that is floor(R * D) + 1 requests, the last at
      (n - 1) / R; a trace starting later keeps its (scaled) offset.
    A rate needs two requests at different times: fewer is a ConfigError, and so is a rate
    asked for past MAX_RATE (one request a nanosecond, the simulator's clock tick): `rate`,
    or a time_scale > 1 that speeds the replayed part past it. The trace's own times
    (time_scale <= 1) are replayed whatever their rate: arrivals closer than a ns share
    one, in the trace's order, as a burst at one timestamp does."""
    arrival = np.asarray(arrival, dtype=np.float64)
    cap = len(arrival) if num_requests is None else min(len(arrival), int(num_requests))
    if rate is None:
        k = float(time_scale)
        n = cap
        if duration_s is not None:
            with np.errstate(over="ignore"):  # a tiny time_scale: times past any float are inf
                n = min(n, int(np.searchsorted(arrival / k, duration_s, side="right")))
        replayed = mean_rate(arrival[:n]) * k
        if k > 1.0 and replayed > MAX_RATE:
            raise ConfigError(
                f"the {n:,} requests replayed at time_scale {k:g} arrive at a mean rate of {replayed:.3g} req/s, "
                f"over {MAX_RATE:g} (one a nanosecond, the simulator's clock tick)"
            )
        return k, n
    if rate > MAX_RATE:
        raise ConfigError(
            f"cannot rescale the trace to {rate:g} req/s: at most {MAX_RATE:g} (one a nanosecond, the "
            "simulator's clock tick)"
        )
    a = arrival[:cap]
    span = a - a[0] if cap else a  # span of the head ending at each request
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = float(rate) * span / np.arange(cap)  # k of each head: R / ((n - 1) / span)
        ok = span > 0
        if duration_s is not None:
            # relative slack of a few roundings: (n - 1) / R can come out just above D when
            # R * D is whole
            ok &= a / k <= duration_s * (1 + 1e-12)
    if duration_s is None:
        if cap < 2 or not ok[-1]:
            held = "its one request has" if cap == 1 else f"its first {cap:,} requests have"
            raise ConfigError(
                f"cannot rescale the trace to {rate:g} req/s: {held} no rate (that takes two requests at "
                "different times)"
            )
        return float(k[-1]), cap
    heads = np.flatnonzero(ok)
    if not heads.size:
        raise ConfigError(
            f"cannot rescale the trace to {rate:g} req/s within duration_s={duration_s:g}: at that rate "
            "fewer than two of its requests (at different times) arrive by then (give a longer duration_s)"
        )
    i = int(heads[-1])
    k_i = float(k[i])
    if a[i] / k_i > duration_s:  # within the slack: a hair faster keeps every arrival by D
        k_i = max(k_i, float(a[i]) / duration_s)
        while a[i] / k_i > duration_s:  # a rounding or two at most
            k_i = float(np.nextafter(k_i, np.inf))
    return k_i, i + 1


def replayed_times(arrival, k: float, n: int, what: str, hint: str) -> np.ndarray:
    """arrival[:n] / k: the times at which replay_cut's (k, n) replays a trace. ConfigError
    naming `what` (the trace) when one is at or past the simulator's clock (MAX_SECONDS),
    or past any float (a tiny time_scale); `hint` names the option that divides the times."""
    with np.errstate(over="ignore"):  # (inf, refused below)
        times = np.asarray(arrival[:n], dtype=np.float64) / k
    last = float(times.max()) if n else 0.0
    if not last < MAX_SECONDS:
        scaled = f", divided by {k!r}," if k != 1.0 else ""
        reach = f"reach {last:g} s" if math.isfinite(last) else "overflow to infinity"
        why = ": are they in seconds?" if k == 1.0 else ""
        raise ConfigError(
            f"{what}: its arrival times{scaled} {reach}, past the simulator's clock of {MAX_SECONDS:g} s{why} ({hint})"
        )
    return times
