"""Fast, strict reading of the small comma-separated files the workload layer uses.

Numeric columns are parsed by `numpy.loadtxt` (C speed: a million rows in about a
second). When numpy rejects a file, a slow line-by-line pass finds the first bad line
so that the `ConfigError` can name the file, the line and the column.

A gzip-compressed file is read as the text it holds; a Parquet file (told by its first
bytes, as `--parquet` writes requests.parquet) as a table of the same columns, with
pyarrow (a one-line ConfigError when it is not installed).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import os
import re
import warnings
import zlib
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from ..core.request import MAX_LENGTH
from .datasets import not_a_file

__all__ = ["read_header", "read_columns", "row_place", "as_lengths", "open_bytes", "read_bytes", "CSV_UNSAFE"]

#: characters a name or tag written unquoted into a CSV cell must not hold (a reader ends a
#: line at a lone carriage return too)
CSV_UNSAFE = ',"\n\r'

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
# what reading a damaged, truncated or binary file raises
_READ_ERRORS = (OSError, EOFError, zlib.error, csv.Error)


def _magic(p: Path) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(4)
    except OSError as exc:
        raise ConfigError(f"cannot read file {p}: {exc}") from None


def _gzipped(p: Path) -> bool:
    return _magic(p).startswith(GZIP_MAGIC)


def _is_parquet(p: Path) -> bool:
    return _magic(p) == PARQUET_MAGIC


def _open_text(path: Path):
    if _gzipped(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def open_bytes(path: str | os.PathLike):
    """The file opened for binary reading, decompressed if gzip-compressed."""
    p = Path(path)
    return gzip.open(p, "rb") if _gzipped(p) else open(p, "rb")


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes (decompressed if gzip-compressed); ConfigError if unreadable."""
    try:
        with open_bytes(path) as fh:
            return fh.read()
    except _READ_ERRORS as exc:
        raise ConfigError(f"cannot read file {path}: {exc}") from None


def _unreadable(p: Path, exc: Exception) -> ConfigError:
    if isinstance(exc, UnicodeDecodeError):
        return ConfigError(
            f"cannot read file {p}: it is not UTF-8 text ({_undecodable_place(p)}); give a CSV file, plain or "
            "gzip-compressed, or a Parquet table"
        )
    return ConfigError(f"cannot read file {p}: {exc}")


def _undecodable_place(p: Path) -> str:
    """'line N, byte M' of the first byte that is not UTF-8 (M counts from the start of the
    decompressed file): a decode error's own offset counts from the start of a read chunk."""
    offset = 0
    try:
        with open_bytes(p) as fh:
            for number, line in enumerate(fh, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return f"line {number}, byte {offset + exc.start}"
                offset += len(line)
    except _READ_ERRORS:
        pass
    return "a byte past the text it could read"


def _pyarrow(p: Path):
    """pyarrow and its Parquet module, or a one-line ConfigError naming the file."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional, and slow to import
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        raise ConfigError(
            f"file {p} is a Parquet file: reading it needs pyarrow, which is not installed "
            "(pip install 'llmsched[analysis]'), or give the table as CSV"
        ) from None
    return pa, pq


def _blank(fields: list[str]) -> bool:
    """A line of nothing but spaces, or empty fields."""
    return all(not f.strip() for f in fields)


# a field that reads as a number (as numpy reads a value): a first line of one is data, not a header
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def read_header(path: str | os.PathLike) -> list[str]:
    """Column names of a CSV file (its first non-blank line), stripped of spaces;
    ConfigError if absent, or if a name is a number (a file without a header line,
    whose first row would otherwise be taken for the column names and lost)."""
    return _header(Path(path))[0]


def _numeric_header(p: Path, names: list[str]) -> ConfigError | None:
    """The error for a CSV file whose first line holds a number: it has no header line."""
    number = next((name for name in names if _NUMBER.fullmatch(name)), None)
    if number is None:
        return None
    first = ",".join(names)
    first = first if len(first) <= 60 else first[:57] + "..."
    if len(names) == 1:
        return ConfigError(
            f"file {p}: first line '{first}' is a number: the file needs a header line naming its column, "
            "such as prompt_tokens"
        )
    return ConfigError(
        f"file {p}: first line '{first}' holds a number ('{number}'): the file needs a header line naming "
        "its columns, such as prompt_tokens,output_tokens (lengths) or arrival_s,prompt_tokens,output_tokens "
        "(a trace)"
    )


def _header(p: Path) -> tuple[list[str], int]:
    """(column names, lines up to and including the header line: 0 for Parquet)."""
    if not p.is_file():
        raise not_a_file(p)
    if _is_parquet(p):
        pa, pq = _pyarrow(p)
        try:
            return [str(name).strip() for name in pq.read_schema(p).names], 0
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise ConfigError(f"cannot read file {p}: {exc}") from None
    try:
        with _open_text(p) as fh:
            reader = csv.reader(fh)
            for fields in reader:
                if not _blank(fields):
                    names = [name.strip() for name in fields]
                    error = _numeric_header(p, names)
                    if error is not None:
                        raise error
                    return names, reader.line_num
    except (*_READ_ERRORS, UnicodeDecodeError) as exc:
        raise _unreadable(p, exc) from None
    raise ConfigError(f"file {p} is empty (expected a CSV header line)")


def _data_rows(p: Path):
    """Yield (line_number, fields) for each non-blank data line after the header."""
    with _open_text(p) as fh:
        reader = csv.reader(fh)
        for fields in reader:
            if not _blank(fields):
                break  # the header
        for fields in reader:
            if not _blank(fields):
                yield reader.line_num, fields


def row_place(path: str | os.PathLike, row: int) -> str:
    """Where data row `row` (0-based) is in the file: 'line N' of a CSV file (1-based,
    blank lines and the header counted), 'row N' of a Parquet table (1-based)."""
    if _is_parquet(Path(path)):
        return f"row {row + 1}"
    for i, (line, _) in enumerate(_data_rows(Path(path))):
        if i == row:
            return f"line {line}"
    return "line ?"


def _locate_error(p: Path, header: list[str], cols: dict[str, int], kinds: dict[str, str]) -> str:
    """Find the first line that numpy could not read, or that is wider than the header
    (`_check_widths`: the first bad line is named, whichever its fault), and describe it in
    one clause."""
    for line, fields in _data_rows(p):
        wide = _too_wide(line, fields, len(header))
        if wide:
            return wide
        for name, idx in cols.items():
            if idx >= len(fields):
                return f"line {line} has {len(fields)} field(s) but column '{name}' is field {idx + 1} of the header"
            value = fields[idx].strip()
            kind = kinds[name]
            if kind == "float":
                try:
                    if "_" in value:  # (Python reads 2_0 as 20; numpy, which reads the file, refuses it)
                        raise ValueError(value)
                    float(value)
                except ValueError:
                    return f"line {line} column '{name}': cannot read {value!r} as a number"
            elif kind == "datetime":
                try:
                    with _offsets_read_quietly():
                        np.datetime64(value, "ns")
                except ValueError:
                    return (
                        f"line {line} column '{name}': cannot read {value!r} as a "
                        "timestamp like 2023-11-16 18:15:46.6805900"
                    )
    return ""


def read_columns(
    path: str | os.PathLike, wanted: dict[str, str], optional: dict[str, str] | None = None
) -> dict[str, np.ndarray]:
    """Read named columns of a CSV file with a header line.

    `wanted` / `optional` map a column name to its kind: "float" (float64 array), "str"
    (numpy str array), "text" (object array of Python str: for a column whose values may
    be long, as block ids are, since a numpy str array holds every value at the width of
    the longest, four bytes a character) or "datetime" (datetime64[ns] array). Text is
    stripped of surrounding spaces. A missing wanted column, a
    short line or a value that does not parse raises ConfigError naming file, line and
    column. Blank lines (nothing but spaces, or empty fields) are skipped. A file with a
    header but no data rows gives empty arrays (the caller decides whether that is an
    error).
    """
    p = Path(path)
    header, header_lines = _header(p)
    optional = optional or {}
    cols: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for name, kind in list(wanted.items()) + list(optional.items()):
        if header.count(name) > 1:  # which one was meant? (the first was read, silently)
            raise ConfigError(f"file {p} has column '{name}' twice in its header")
        if name in header:
            cols[name] = header.index(name)
            kinds[name] = kind
        elif name in wanted:
            raise ConfigError(f"file {p} has no column '{name}' (its header is: {','.join(header)})")
    try:
        if _is_parquet(p):
            return _parquet_columns(p, kinds)
        return _read_text_columns(p, header, header_lines, cols, kinds)
    except (TimestampOutOfRange, MixedOffsets) as e:
        raise e.error(p) from None


def _read_text_columns(p: Path, header: list[str], header_lines: int, cols: dict, kinds: dict) -> dict[str, np.ndarray]:
    try:
        out = _parse(_text_lines(p) if _gzipped(p) else p, cols, kinds, header_lines)
    except UnicodeDecodeError as exc:  # (a ValueError, of which `_locate_error` would raise it again)
        raise _unreadable(p, exc) from None
    except (ValueError, IndexError) as exc:
        where = _locate_error(p, header, cols, kinds)
        if where:
            raise ConfigError(f"file {p} is malformed: {where}") from None
        # every line the slow pass reads is good: numpy stopped at a line of spaces or empty
        # fields, blank here as a line with nothing is (numpy skips only the latter)
        try:
            out = _parse(_unblanked(p), cols, kinds, 1)
        except (ValueError, IndexError):
            raise ConfigError(f"file {p} is malformed: {exc}") from None
    except _READ_ERRORS as exc:
        raise _unreadable(p, exc) from None
    _check_widths(p, len(header))
    return out


def _parquet_columns(p: Path, kinds: dict[str, str]) -> dict[str, np.ndarray]:
    """The columns `kinds` names of a Parquet table, as `read_columns` gives a CSV's."""
    pa, pq = _pyarrow(p)
    try:
        table = pq.read_table(p, columns=list(kinds))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ConfigError(f"cannot read file {p}: {exc}") from None
    out: dict[str, np.ndarray] = {}
    for name, kind in kinds.items():
        col = table.column(name)
        if kind not in ("str", "text") and col.null_count:  # (a number read as NaN: reported as "nan")
            i = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
            raise ConfigError(f"file {p} {row_place(p, i)} column '{name}' holds no value (null)")
        if kind == "datetime" and pa.types.is_timestamp(col.type):
            stamps = col.to_numpy()
            micro = stamps.astype("datetime64[us]")  # (compared in ns, its values may wrap)
            far = ~np.isnat(micro) & ((micro < _US_FIRST) | (micro > _US_LAST))
            if far.any():
                i = int(np.argmax(far))
                raise TimestampOutOfRange(i, str(stamps[i]), name)
            out[name] = stamps.astype("datetime64[ns]")
            continue
        try:
            if kind == "float":
                if pa.types.is_boolean(col.type):  # (cast to 1.0 and 0.0: read as 1- and 0-token lengths)
                    raise ValueError(name)
                out[name] = col.cast(pa.float64()).to_numpy()  # missing values: NaN
            elif kind in ("str", "text") and pa.types.is_list(col.type):
                # a list column (block ids written as lists): the space-separated text of a CSV
                rows = col.to_pylist()
                out[name] = _as_kind(_objects([" ".join(map(str, x)) if x else "" for x in rows]), kind, name)
            else:
                out[name] = _as_kind(col.cast(pa.string()).fill_null("").to_numpy(zero_copy_only=False), kind, name)
        except (ValueError, pa.ArrowException):
            what = {"float": "numbers", "datetime": "timestamps like 2023-11-16 18:15:46.6805900"}.get(kind, "text")
            raise ConfigError(f"file {p} column '{name}' ({col.type}) cannot be read as {what}") from None
    return out


def _check_widths(p: Path, width: int) -> None:
    """ConfigError naming the first data line with more fields than the header: numpy
    reads the columns asked for by position and drops the rest (`1,1,500,60` read as
    prompt 1, output 500). Trailing empty fields are allowed."""
    with _open_text(p) as fh:
        text = fh.read()
    if '"' not in text:  # no quoted field: a comma is a separator (the common, fast case)
        # the file reduced to its commas and newlines: each line's comma count, exactly
        marks = text.encode().translate(None, _NOT_COMMA_OR_NEWLINE)
        row = b"," * (width - 1) + b"\n"
        rows, tail = divmod(len(marks), len(row))
        if marks == row * rows or (tail == width - 1 and marks == row * rows + row[:-1]):
            return  # every line as wide as the header: a million-row trace checked in 0.04 s
        ends = np.flatnonzero(np.frombuffer(marks, np.uint8) == ord("\n"))
        commas = np.diff(ends, prepend=-1, append=len(marks)) - 1  # per line ("\n" ended)
        if commas.max() < width:
            return  # some lines are short (the columns read are checked when parsed), none wide
    for line, fields in _data_rows(p):
        wide = _too_wide(line, fields, width)
        if wide:
            raise ConfigError(f"file {p} is malformed: {wide}")


def _too_wide(line: int, fields: list[str], width: int) -> str:
    """The clause naming a line with more fields than the header's `width` (trailing empty
    fields allowed); "" when it is not."""
    n = len(fields)
    while n > width and not fields[n - 1].strip():
        n -= 1
    if n <= width:
        return ""
    return (
        f"line {line} has {n} fields but the header names {width} "
        "(a comma inside a number, or a value without its column?)"
    )


# every byte but "," and "\n": deleted to count a line's fields (UTF-8 never uses either
# byte inside a multi-byte character)
_NOT_COMMA_OR_NEWLINE = bytes(b for b in range(256) if b not in b",\n")


def _text_lines(p: Path) -> list[str]:
    """The file's lines as numpy reads the plain file: split at \n, \r\n and \r only (not
    at str.splitlines' \x85, \u2028, \x1c...), each with its \n, so a quoted field keeps
    the line breaks inside it (numpy joins a list's lines as they are)."""
    with _open_text(p) as fh:
        text = fh.read().replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    del text
    if lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):  # in place: a second list of every line would double the memory
        lines[i] = line + "\n"
    return lines


def _unblanked(p: Path) -> list[str]:
    """The file's lines without those of nothing but spaces, commas and empty quoted fields
    (`"",""`: an even number of quotes), the header first; a line inside a quoted field
    (after an odd number of quotes) is kept, blank or not: it is the field's text."""
    out = []
    quoted = False
    for line in _text_lines(p):
        if quoted or not _blank_line(line):
            out.append(line)
        quoted ^= line.count('"') % 2 == 1
    return out


def _blank_line(line: str) -> bool:
    if not line.strip(" \t,\r\n"):
        return True
    quotes = line.count('"')
    return quotes % 2 == 0 and not line.replace('""', "").strip(" \t,\r\n")


def _parse(source, cols: dict[str, int], kinds: dict[str, str], skip: int) -> dict[str, np.ndarray]:
    """numpy's parse of the columns `cols` (name -> field index) of a file or its lines,
    after its first `skip` lines (the header and any blank lines before it)."""
    out: dict[str, np.ndarray] = {}

    def load(usecols, ndmin, dtype):
        return np.loadtxt(
            source,
            delimiter=",",
            skiprows=skip,
            comments=None,
            quotechar='"',
            usecols=usecols,
            ndmin=ndmin,
            dtype=dtype,
            encoding="utf-8-sig",
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
        num = [n for n in cols if kinds[n] == "float"]
        if num:
            arr = load([cols[n] for n in num], 2, np.float64)
            for j, n in enumerate(num):
                out[n] = np.ascontiguousarray(arr[:, j])
        for n in cols:
            if kinds[n] == "float":
                continue
            # read as Python str objects: a numpy str array (what dtype=str builds) is as wide
            # as the longest value, so one row of 100,000 characters of block ids made every
            # row take 400 kB
            out[n] = _as_kind(load([cols[n]], 1, object), kinds[n], n)
    return out


def _objects(texts: list[str]) -> np.ndarray:
    """A 1-D object array of the strings `texts`."""
    arr = np.empty(len(texts), dtype=object)
    arr[:] = texts
    return arr


def _as_kind(text: np.ndarray, kind: str, column: str) -> np.ndarray:
    """A column's text (an object array of str) stripped, as `read_columns` gives a column
    of `kind`: kept as objects ("text"), else a numpy str array ("str"; timestamps are
    parsed from one)."""
    if kind == "text":
        return _objects([t.strip() for t in text.tolist()])
    text = text.astype(str)
    text = np.char.strip(text) if text.size else text
    return _datetimes(text, column) if kind == "datetime" else text


# the instants a datetime64[ns] holds, in whole microseconds: numpy wraps a time outside
# them around silently (a year 1500 reads as 2085), so timestamps are checked against them
# first, in us (compared with a ns bound, a us time is cast to ns: it would wrap too)
_US_FIRST = np.datetime64(-(-(np.iinfo(np.int64).min + 1) // 1000), "us")
_US_LAST = np.datetime64(np.iinfo(np.int64).max // 1000, "us")


class TimestampOutOfRange(Exception):
    """Data row `row`'s timestamp `value` in `column` lies outside [_US_FIRST, _US_LAST]."""

    def __init__(self, row: int, value: str, column: str):
        super().__init__(row, value, column)
        self.row, self.value, self.column = row, value, column

    def error(self, path) -> ConfigError:
        first, last = _US_FIRST.astype("datetime64[D]"), _US_LAST.astype("datetime64[D]")
        return ConfigError(
            f"file {path} {row_place(path, self.row)} column '{self.column}': timestamp {self.value!r} is outside "
            f"{first} to {last}, the times a nanosecond clock holds"
            + (
                " (numpy reads a bare number as a year: times in seconds go in a CSV column 'arrival_s')"
                if self.value.strip().lstrip("+-").isdigit()
                else ""
            )
        )


def _datetimes(text: np.ndarray, column: str) -> np.ndarray:
    """Timestamp strings as datetime64[ns] (those with a UTC offset, `+00:00`, converted to
    UTC); TimestampOutOfRange for the first one outside what nanoseconds hold."""
    n = len(text)
    if n:
        # the year from a timestamp's first four characters where they are digits and a '-'
        # follows (years 1678-2261 are whole within the range); any other, to the second
        width = text.dtype.itemsize // 4
        if text.dtype.kind == "U" and width >= 5:
            head = text.view(np.uint32).reshape(n, width)[:, :5].astype(np.int64) - ord("0")
            digits = ((head[:, :4] >= 0) & (head[:, :4] <= 9)).all(axis=1) & (head[:, 4] == ord("-") - ord("0"))
            year = head[:, :4] @ np.array([1000, 100, 10, 1])
            unsure = np.flatnonzero(~digits | (year < 1678) | (year > 2261))
        else:
            unsure = np.arange(n)
        if len(unsure):
            with _offsets_read_quietly():
                micro = text[unsure].astype("datetime64[us]")  # (ns would wrap; us spans 290,000 years)
            # (a blank field reads as NaT: not out of range here, the caller refuses it)
            out = ~np.isnat(micro) & ((micro < _US_FIRST) | (micro > _US_LAST))
            if out.any():
                i = int(unsure[np.argmax(out)])
                raise TimestampOutOfRange(i, str(text[i]), column)
    with _offsets_read_quietly():
        stamps = text.astype("datetime64[ns]")
    _refuse_mixed_offsets(text, stamps, column)
    return stamps


class MixedOffsets(Exception):
    """Data row `row`'s timestamp has a UTC offset (`offset`) where row `first`'s has none,
    or none where it has one."""

    def __init__(self, row: int, first: int, text: np.ndarray, column: str, offset: bool):
        super().__init__(row, first, column)
        self.row, self.first, self.column, self.offset = row, first, column, offset
        self.value, self.first_value = str(text[row]), str(text[first])

    def error(self, path) -> ConfigError:
        has = "has a UTC offset" if self.offset else "has no UTC offset"
        return ConfigError(
            f"file {path} {row_place(path, self.row)} column '{self.column}': timestamp {self.value!r} {has}, "
            f"unlike {row_place(path, self.first)}'s {self.first_value!r} (numpy would take a time without one "
            "as UTC, shifting its arrival by the others' offset): give every timestamp an offset, or none"
        )


def _has_offset(text: np.ndarray) -> np.ndarray:
    """Per timestamp string, whether it ends in a UTC offset (`Z`, `+01:00`, `-0130`, ...):
    a `+`, `-` or `Z` after the date's end (its `T` or space; the date's own `-` come before)."""
    n = len(text)
    width = text.dtype.itemsize // 4
    if not n or not width:
        return np.zeros(n, dtype=bool)
    codes = text.view(np.uint32).reshape(n, width)
    time_part = np.logical_or.accumulate((codes == ord("T")) | (codes == ord(" ")), axis=1)
    marks = (codes == ord("+")) | (codes == ord("-")) | (codes == ord("Z"))
    return (time_part & marks).any(axis=1)


def _refuse_mixed_offsets(text: np.ndarray, stamps: np.ndarray, column: str) -> None:
    """MixedOffsets for the first timestamp that has a UTC offset where the first has none,
    or none where it has one: datetime64 takes a time without one as UTC, so a file mixing
    them (local times beside offset ones) would shift some arrivals by the offset, silently."""
    given = ~np.isnat(stamps)  # (blank fields: the caller refuses them)
    if not given.any():
        return
    offset = _has_offset(text)
    first = int(np.argmax(given))
    differ = given & (offset != offset[first])
    if differ.any():
        row = int(np.argmax(differ))
        raise MixedOffsets(row, first, text, column, bool(offset[row]))


@contextlib.contextmanager
def _offsets_read_quietly():
    """A context in which numpy reads a timestamp with a UTC offset without its UserWarning
    that datetime64 has no time zones (it converts the time to UTC, as meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "no explicit representation of timezones", UserWarning)
        yield


def as_lengths(
    values: np.ndarray, path: str | os.PathLike, column: str, minimum: int = 1, clip_low: bool = False
) -> np.ndarray:
    """Check that a float column holds whole numbers >= `minimum` and return int64.

    With `clip_low`, non-negative values below `minimum` are raised to it instead of
    rejected (used for empirical length files, where 0 output tokens means 1).
    """
    v = values
    bad = ~np.isfinite(v) | (v != np.floor(v))
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(
            f"file {path} {row_place(path, i)} column '{column}': {float(v[i])!r} is not a whole number of tokens"
        )
    floor = 0 if clip_low else minimum
    low = v < floor
    if low.any():
        i = int(np.argmax(low))
        raise ConfigError(
            f"file {path} {row_place(path, i)} column '{column}': {int(v[i])} tokens is below the minimum of {floor}"
        )
    high = v > MAX_LENGTH
    if high.any():
        i = int(np.argmax(high))
        raise ConfigError(
            f"file {path} {row_place(path, i)} column '{column}': "
            f"{float(v[i]):g} tokens is above the maximum of {MAX_LENGTH}"
        )
    out = v.astype(np.int64)
    if clip_low:
        np.maximum(out, minimum, out=out)
    return out
