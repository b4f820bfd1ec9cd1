"""CSV text of many rows at once, built with numpy.

requests.csv holds one row per request, so it is formatted a block of rows at a time with
numpy: every field becomes an (n, width) matrix of ASCII bytes with a mask of the bytes
it uses (numbers right-aligned, strings left-aligned), the fields and separators are laid
side by side, and the masked bytes read in row order are the CSV text. The output is
byte for byte what `csv.writer` writes, times (whole ns) as seconds with nine decimals
(tests/test_outputs_format.py).
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np

from ..core.request import NS


class NotFormattable(Exception):
    pass


CHUNK = 1 << 14  # rows per block: about 10 MB of scratch arrays
_TRIPLES = np.frombuffer("".join(f"{k:03d}" for k in range(1000)).encode(), dtype=np.uint8).reshape(1000, 3)


class IntField:
    """Integers in decimal (as str(int)); where `shown` is False, an empty field."""

    def __init__(self, v: np.ndarray, shown: np.ndarray | None = None):
        self.v, self.shown = v, shown

    def __getitem__(self, s: slice) -> IntField:
        return IntField(self.v[s], None if self.shown is None else self.shown[s])

    def bytes(self) -> tuple[np.ndarray, np.ndarray]:
        v = self.v
        if len(v) and v.min() < 0:
            neg = v < 0
            m, k = digits(np.abs(v))
            m = np.concatenate([np.where(neg, ord("-"), 0).astype(np.uint8)[:, None], m], axis=1)
            k = np.concatenate([neg[:, None], k], axis=1)
        else:
            m, k = digits(v)
        if self.shown is not None:
            k &= self.shown[:, None]
        return m, k


def digit_block(v: np.ndarray, w: int) -> np.ndarray:
    """(n, w) ASCII digits of non-negative int64 `v` < 10**w, with leading zeros."""
    groups = -(-w // 3)
    out = np.empty((len(v), 3 * groups), dtype=np.uint8)
    rest = v
    for g in range(groups - 1, 0, -1):  # three digits at a time, from a table
        rest, low = np.divmod(rest, 1000)
        out[:, 3 * g : 3 * g + 3] = _TRIPLES[low]
    out[:, :3] = _TRIPLES[rest]
    return out[:, 3 * groups - w :]


def digits(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, w) ASCII digits of non-negative int64 `v`, right-aligned, and the mask of the
    digits each value uses (no leading zeros, at least one digit)."""
    w = len(str(int(v.max()))) if len(v) else 1
    ndig = np.ones(len(v), dtype=np.int64)
    for k in range(1, w):
        ndig += v >= 10**k
    return digit_block(v, w), np.arange(w) >= (w - ndig)[:, None]


class FixedField:
    """Non-negative numbers with nine decimals, blank where `blank` is set: integer part
    `ip` and nine decimals `frac`."""

    def __init__(self, ip: np.ndarray, frac: np.ndarray, blank: np.ndarray | None):
        self.ip, self.frac, self.blank = ip, frac, blank

    def __getitem__(self, s: slice) -> FixedField:
        return FixedField(self.ip[s], self.frac[s], None if self.blank is None else self.blank[s])

    def bytes(self) -> tuple[np.ndarray, np.ndarray]:
        ip, ipmask = digits(self.ip)
        n, w = ip.shape
        out = np.empty((n, w + 10), dtype=np.uint8)
        out[:, :w] = ip
        out[:, w] = ord(".")
        out[:, w + 1 :] = digit_block(self.frac, 9)
        mask = np.ones((n, w + 10), dtype=bool)
        mask[:, :w] = ipmask
        if self.blank is not None:
            mask[self.blank] = False
        return out, mask


class StrField:
    """Strings, already CSV-quoted, as codes into a table of encoded values."""

    def __init__(self, table: np.ndarray, lengths: np.ndarray, codes: np.ndarray):
        self.table, self.lengths, self.codes = table, lengths, codes

    def __getitem__(self, s: slice) -> StrField:
        return StrField(self.table, self.lengths, self.codes[s])

    def bytes(self) -> tuple[np.ndarray, np.ndarray]:
        w = self.table.shape[1]
        return self.table[self.codes], np.arange(w) < self.lengths[self.codes][:, None]


def tag_field(tag, n: int) -> StrField:
    if tag is None:
        values, codes = [""], np.zeros(n, dtype=np.int64)
    else:
        values, codes = np.unique(np.asarray(tag).astype(str), return_inverse=True)
        values = values.tolist()
        codes = codes.reshape(-1)
    encoded = []
    for v in values:
        buf = io.StringIO()
        csv.writer(buf).writerow([v, ""])  # csv's quoting of `v` as one field of a row
        encoded.append(buf.getvalue()[:-3].encode("utf-8"))
    return _str_field(encoded, codes)


def seconds_field(ns: np.ndarray) -> FixedField:
    """Nanoseconds as seconds with nine decimals (exact integer arithmetic); negative (not
    reached) as an empty field."""
    ns = np.asarray(ns, dtype=np.int64)
    missing = ns < 0
    whole, frac = np.divmod(np.where(missing, 0, ns), NS)
    return FixedField(whole, frac, missing if missing.any() else None)


def names_field(names: list[str], codes: np.ndarray) -> StrField:
    """Strings written as they are (no CSV quoting), as `codes` into `names`."""
    return _str_field([name.encode("utf-8") for name in names] or [b""], codes)


def _str_field(encoded: list[bytes], codes: np.ndarray) -> StrField:
    """The field of `codes` into the byte strings `encoded` (a table of them, zero-padded)."""
    w = max(1, max((len(e) for e in encoded), default=0))
    table = np.zeros((len(encoded), w), dtype=np.uint8)
    for k, e in enumerate(encoded):
        table[k, : len(e)] = np.frombuffer(e, dtype=np.uint8)
    return StrField(table, np.array([len(e) for e in encoded], dtype=np.int64), codes)


def format_rows(fields: list, line_end: str = "\r\n") -> str:
    """CSV text of the rows of `fields` (comma-separated; CRLF line ends, as csv.writer,
    unless told)."""
    parts = [fld.bytes() for fld in fields]
    n = len(parts[0][0])
    width = sum(m.shape[1] for m, _ in parts) + len(parts) - 1 + len(line_end)
    out = np.empty((n, width), dtype=np.uint8)
    mask = np.ones((n, width), dtype=bool)
    c = 0
    for j, (m, k) in enumerate(parts):
        if j:
            out[:, c] = ord(",")
            c += 1
        w = m.shape[1]
        out[:, c : c + w] = m
        mask[:, c : c + w] = k
        c += w
    out[:, c:] = np.frombuffer(line_end.encode(), dtype=np.uint8)
    return out[mask].tobytes().decode("utf-8")


def write_csv(f, header: str, n: int, fields, block: int = CHUNK) -> None:
    """CSV of `n` rows, `fields(lo, hi)` giving the fields of rows [lo, hi), `block` rows
    at a time: memory stays flat however many rows (the text does not depend on `block`)."""
    f.write(header + "\n")
    for lo in range(0, n, block):
        f.write(format_rows(fields(lo, min(n, lo + block)), "\n"))


def write_file(path, writer) -> None:
    """`writer(f)` into `path` through a temporary file, replaced at the end (a reader
    never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            writer(f)
        os.replace(tmp, path)
    except BaseException:  # (an error, Ctrl-C): no half-written temporary file stays
        tmp.unlink(missing_ok=True)
        raise


def ns_text(ns: int) -> str:
    """Whole nanoseconds as seconds with nine decimals, exact at any clock (a float / 1e9
    loses nanoseconds past about 4.5e6 s): one value of `seconds_field`."""
    whole, frac = divmod(abs(ns), NS)
    return f"{'-' if ns < 0 else ''}{whole}.{frac:09d}"


def time_text(ns: int) -> str:
    """A time in ns as the output files write it: '' where not reached (negative)."""
    return "" if ns < 0 else ns_text(ns)
