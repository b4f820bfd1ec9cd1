"""`Trace`: the requests a simulation or a load-test client replays, as flat numpy arrays.

Columns (all of length n): `arrival_s` float64 seconds (non-decreasing, >= 0), `prompt`
int64 prompt tokens (>= 1), `output` int64 requested output tokens (>= 1) and `tag`
(numpy str array, or None). A million requests take about 24 MB (plus the tags).

File formats read here:
- plain: header `arrival_s,prompt_tokens,output_tokens[,tag]` (any column order; extra
  columns are ignored). Written by `Trace.to_csv`.
- Azure LLM inference trace: header `TIMESTAMP,ContextTokens,GeneratedTokens`,
  TIMESTAMP a wall-clock string such as `2023-11-16 18:15:46.6805900`;
  arrival_s = seconds since the earliest row; 0-token entries count as 1 token.
Rows out of time order are sorted (stably) by arrival time when a file is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError
from ..core.request import Request
from .csvio import as_lengths, line_of_row, read_columns, read_header

__all__ = ["Trace", "read_trace", "read_plain_csv", "read_azure_csv", "trace_format"]

PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(eq=False)
class Trace:
    """Requests as parallel arrays; validated (ConfigError) on construction."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tag: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64).reshape(-1)
        self.prompt = _as_int_array(self.prompt, "prompt")
        self.output = _as_int_array(self.output, "output")
        n = self.arrival_s.shape[0]
        if self.prompt.shape[0] != n or self.output.shape[0] != n:
            raise ConfigError(
                f"trace columns differ in length: arrival_s has {n}, prompt "
                f"{self.prompt.shape[0]}, output {self.output.shape[0]}"
            )
        if self.tag is not None:
            self.tag = np.asarray(self.tag).reshape(-1)
            if self.tag.dtype.kind != "U":
                self.tag = self.tag.astype(str)
            if self.tag.shape[0] != n:
                raise ConfigError(f"trace tag column has {self.tag.shape[0]} entries for {n} requests")
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

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def n(self) -> int:
        return len(self)

    def slice(self, start: int = 0, stop: int | None = None) -> Trace:
        """Requests start..stop-1 (Python slice semantics; arrival times kept as they are)."""
        s = slice(start, stop)
        return Trace(self.arrival_s[s], self.prompt[s], self.output[s], None if self.tag is None else self.tag[s])

    def head(self, n: int) -> Trace:
        """The first n requests."""
        return self.slice(0, max(0, int(n)))

    def until(self, duration_s: float) -> Trace:
        """Requests arriving at or before `duration_s`."""
        return self.head(int(np.searchsorted(self.arrival_s, duration_s, side="right")))

    def time_scaled(self, k: float) -> Trace:
        """Arrival times divided by k (k > 1 replays the trace k times faster)."""
        k = float(k)
        if not (np.isfinite(k) and k > 0):
            raise ConfigError(f"time_scale must be a positive number, got {k}")
        return Trace(self.arrival_s / k, self.prompt, self.output, self.tag)

    def with_lengths(self, prompt=None, output=None) -> Trace:
        """Same arrivals with prompt and/or output lengths replaced."""
        return Trace(
            self.arrival_s,
            self.prompt if prompt is None else prompt,
            self.output if output is None else output,
            self.tag,
        )

    def with_tags(self, tag) -> Trace:
        return Trace(self.arrival_s, self.prompt, self.output, tag)

    def copy(self) -> Trace:
        return Trace(
            self.arrival_s.copy(), self.prompt.copy(), self.output.copy(), None if self.tag is None else self.tag.copy()
        )

    def arrival_ns(self) -> np.ndarray:
        """Arrival times as int64 nanoseconds (the simulator's clock)."""
        return np.rint(self.arrival_s * 1e9).astype(np.int64)

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: (n - 1) / span (nan with fewer than 2 requests or no span)."""
        span = self.span_s
        return (len(self) - 1) / span if len(self) > 1 and span > 0 else float("nan")

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
        return d

    def requests(self, start_id: int = 0):
        """Yield `llmsched.core.Request` objects (arrival in integer ns), one at a time."""
        ns = self.arrival_ns().tolist()
        prompt = self.prompt.tolist()
        output = self.output.tolist()
        tags = self.tag.tolist() if self.tag is not None else None
        for i in range(len(self)):
            yield Request(start_id + i, ns[i], prompt[i], output[i], tags[i] if tags is not None else "")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if (self.tag is None) != (other.tag is None):
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
            f"tags={'none' if self.tag is None else len(np.unique(self.tag))})"
        )

    # ------------------------------------------------------------------ files
    def to_csv(self, path: str | os.PathLike) -> None:
        """Write `arrival_s,prompt_tokens,output_tokens[,tag]`; arrival times round-trip exactly."""
        cols = [map(repr, self.arrival_s.tolist()), map(str, self.prompt.tolist()), map(str, self.output.tolist())]
        header = ",".join(PLAIN_COLUMNS)
        if self.tag is not None:
            if len(self) and (
                np.char.find(self.tag, ",").max() >= 0
                or np.char.find(self.tag, '"').max() >= 0
                or np.char.find(self.tag, "\n").max() >= 0
            ):
                raise ConfigError("trace tags must not contain commas, quotes or newlines to be written as CSV")
            cols.append(self.tag.tolist())
            header += ",tag"
        try:
            with open(path, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(header + "\n")
                chunk = 100_000
                rows = zip(*cols)
                while True:
                    block = [",".join(r) for _, r in zip(range(chunk), rows)]
                    if not block:
                        break
                    fh.write("\n".join(block) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write trace file {path}: {exc}") from None

    @classmethod
    def from_csv(cls, path: str | os.PathLike) -> Trace:
        """Read a plain `arrival_s,prompt_tokens,output_tokens[,tag]` CSV file."""
        return read_plain_csv(path)


def _as_int_array(x, name: str) -> np.ndarray:
    a = np.asarray(x).reshape(-1)
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "b" or a.dtype.kind not in "f":
        if a.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise ConfigError(f"trace {name} lengths must be integers, got dtype {a.dtype}")
    if not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
        raise ConfigError(f"trace {name} lengths must be whole numbers of tokens")
    if np.any(np.abs(a) > 2.0**62):
        raise ConfigError(f"trace {name} lengths are too large ({float(np.abs(a).max()):g} tokens)")
    return a.astype(np.int64)


def _sorted(arrival, prompt, output, tag):
    if arrival.size > 1 and np.any(arrival[1:] < arrival[:-1]):
        order = np.argsort(arrival, kind="stable")
        arrival, prompt, output = arrival[order], prompt[order], output[order]
        tag = None if tag is None else tag[order]
    return arrival, prompt, output, tag


def trace_format(path: str | os.PathLike) -> str:
    """'plain' or 'azure' from a file's header; ConfigError for anything else."""
    header = read_header(path)
    if all(c in header for c in PLAIN_COLUMNS):
        return "plain"
    if all(c in header for c in AZURE_COLUMNS):
        return "azure"
    raise ConfigError(
        f"file {path} is not a trace: its header ({','.join(header)}) needs "
        f"{','.join(PLAIN_COLUMNS)} or {','.join(AZURE_COLUMNS)}"
    )


def read_plain_csv(path: str | os.PathLike) -> Trace:
    """Read `arrival_s,prompt_tokens,output_tokens[,tag]`."""
    cols = read_columns(
        path, {"arrival_s": "float", "prompt_tokens": "float", "output_tokens": "float"}, {"tag": "str"}
    )
    arrival = cols["arrival_s"]
    if arrival.size == 0:
        raise ConfigError(f"trace file {path} has no data rows")
    bad = ~np.isfinite(arrival) | (arrival < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(
            f"file {path} line {line_of_row(path, i)} column 'arrival_s': {float(arrival[i])!r} is not a time >= 0"
        )
    prompt = as_lengths(cols["prompt_tokens"], path, "prompt_tokens")
    output = as_lengths(cols["output_tokens"], path, "output_tokens")
    return Trace(*_sorted(arrival, prompt, output, cols.get("tag")))


def read_azure_csv(path: str | os.PathLike) -> Trace:
    """Read an Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    cols = read_columns(path, {"TIMESTAMP": "datetime", "ContextTokens": "float", "GeneratedTokens": "float"})
    ts = cols["TIMESTAMP"]
    if ts.size == 0:
        raise ConfigError(f"trace file {path} has no data rows")
    if np.isnat(ts).any():
        i = int(np.argmax(np.isnat(ts)))
        raise ConfigError(f"file {path} line {line_of_row(path, i)} column 'TIMESTAMP' is empty or not a time")
    ns = ts.astype(np.int64)
    arrival = (ns - ns.min()).astype(np.float64) / 1e9
    # Production logs may hold 0-token entries: counted as 1 token (negatives are errors).
    prompt = as_lengths(cols["ContextTokens"], path, "ContextTokens", clip_low=True)
    output = as_lengths(cols["GeneratedTokens"], path, "GeneratedTokens", clip_low=True)
    return Trace(*_sorted(arrival, prompt, output, None))


def read_trace(path: str | os.PathLike) -> Trace:
    """Read a trace file in either format (told apart by the header)."""
    fmt = trace_format(path)
    return read_azure_csv(path) if fmt == "azure" else read_plain_csv(path)
