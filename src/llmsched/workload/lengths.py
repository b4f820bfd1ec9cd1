"""Length laws for prompt and output token counts (all samples are int64 >= 1).

String forms (what a user types on a command line):

    const:512                         every request 512 tokens (also a bare 512)
    uniform:16,2048                   integer uniform, both ends included (uniform:lo=16,hi=2048)
    geometric:256                     geometric on {1, 2, ...} with mean 256 (geometric:mean=256,max=4096)
    lognormal:mean=1000,sigma=1.0     lognormal with that arithmetic mean and log-sd sigma,
    lognormal:mean=1000,cv=1.5          or that coefficient of variation; rounded, >= 1,
                                        optional max=N clip
    empirical:PATH[:COLUMN]           rows drawn uniformly with replacement from a CSV column
    replay:PATH[:COLUMN]              the column's rows in file order (wrapping around),
                                        from the first row for each class of a mix and
                                        each serverless model; with turns, in conversation
                                        order (turns cut by num_requests skip their rows)
    sharegpt | arxiv | azure-conv     named datasets (= empirical:NAME)

For an empirical file without COLUMN, the column is chosen by role: prompt reads the first
of num_prefill_tokens, ContextTokens, prompt_tokens; output reads the first of
num_decode_tokens, GeneratedTokens, output_tokens. PATH may be a dataset name.

Mapping of the ShareGPT / arXiv files: prompt tokens = num_prefill_tokens and output
tokens = num_decode_tokens (the number of generated tokens), each raised to at least 1.
(The simulator counts output token 1 as emitted by the last prefill step, so such a
request needs num_decode_tokens - 1 decode steps; docs/stability.md "Work and capacity".)

Samples are capped at MAX_LENGTH (2^30) tokens. A geometric or lognormal law without max=
whose mean that cap would cut by more than CAP_MEAN_TOLERANCE (1%) is refused; with max=,
`expected()` is the mean of the clipped law.

When prompt and output both come from the same file (same mode), a request's prompt and
output are read from the same row, which keeps their correlation (see `sample_pair`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.checks import quoted_number
from ..core.errors import ConfigError, warn
from ..core.paths import recorded_path
from .csvio import MAX_LENGTH, as_lengths, read_columns, read_header
from .datasets import DATASETS, is_dataset, resolve_path

__all__ = [
    "LengthLaw",
    "Constant",
    "Uniform",
    "Geometric",
    "Lognormal",
    "Empirical",
    "named_length_law",
    "parse_length_law",
    "sample_pair",
    "LAW_NAMES",
]

LAW_NAMES = ("const", "uniform", "geometric", "lognormal", "empirical", "replay", *DATASETS)

PROMPT_COLUMNS = ("num_prefill_tokens", "ContextTokens", "prompt_tokens")
OUTPUT_COLUMNS = ("num_decode_tokens", "GeneratedTokens", "output_tokens")


def _fmt(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _pos_int(value, what: str, minimum: int = 1) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a whole number, got {value!r}") from None
    if not math.isfinite(f) or f != math.floor(f):
        raise ConfigError(f"{what} must be a whole number, got {value!r}")
    if f < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value!r}")
    if f > MAX_LENGTH:
        raise ConfigError(f"{what} must be at most {MAX_LENGTH} tokens, got {value!r}")
    return int(f)


def _pos_float(value, what: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number, got {value!r}") from None
    if not (math.isfinite(f) and f > 0):
        raise ConfigError(f"{what} must be > 0, got {value!r}")
    if f > MAX_LENGTH:
        raise ConfigError(f"{what} must be at most {MAX_LENGTH}, got {value!r}")
    return f


#: how far the sampler's cap at MAX_LENGTH may pull a law's mean below the mean it states
CAP_MEAN_TOLERANCE = 0.01


def _check_cap_loss(law: str, loss: float) -> None:
    """Refuse a law without max= whose samples, capped at MAX_LENGTH, lose more than
    CAP_MEAN_TOLERANCE of its stated mean (`loss`, a share of it)."""
    if loss > CAP_MEAN_TOLERANCE:
        raise ConfigError(
            f"{law}: samples are capped at {MAX_LENGTH:,} (a length law's largest value), which cuts {loss:.1%} "
            f"off its mean (at most {CAP_MEAN_TOLERANCE:.0%}): use a smaller mean or spread, or say max= to clip "
            "on purpose"
        )


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


class LengthLaw:
    """A distribution of token counts; `sample(rng, n)` returns int64 values >= 1."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def expected(self) -> float:  # pragma: no cover
        """Mean of the samples (approximate where rounding applies)."""
        raise NotImplementedError

    def largest(self) -> int | None:
        """The longest sample the law can draw; None when it has no bound of its own (a
        geometric or lognormal law without max=, whose samples only the cap MAX_LENGTH stops)."""
        return None

    def to_str(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def recorded(self) -> str:
        """The law as a run's config.json records it (`to_str`; a named dataset as its file)."""
        return self.to_str()

    def __str__(self) -> str:
        return self.to_str()


@dataclass(frozen=True)
class Constant(LengthLaw):
    value: int

    def __post_init__(self):
        object.__setattr__(self, "value", _pos_int(self.value, "const length"))

    def sample(self, rng, n):
        return np.full(n, self.value, dtype=np.int64)

    def expected(self):
        return float(self.value)

    def largest(self):
        return self.value

    def to_str(self):
        return f"const:{self.value}"


@dataclass(frozen=True)
class Uniform(LengthLaw):
    lo: int
    hi: int

    def __post_init__(self):
        object.__setattr__(self, "lo", _pos_int(self.lo, "uniform lo"))
        object.__setattr__(self, "hi", _pos_int(self.hi, "uniform hi"))
        if self.hi < self.lo:
            raise ConfigError(f"uniform:{self.lo},{self.hi} needs lo <= hi")

    def sample(self, rng, n):
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)

    def expected(self):
        return (self.lo + self.hi) / 2.0

    def largest(self):
        return self.hi

    def to_str(self):
        return f"uniform:{self.lo},{self.hi}"


@dataclass(frozen=True)
class Geometric(LengthLaw):
    """P(k) = p (1-p)^(k-1), k >= 1, p = 1/mean; optional clip at max."""

    mean: float
    max: int | None = None

    def __post_init__(self):
        m = _pos_float(self.mean, "geometric mean")
        if m < 1:
            raise ConfigError(f"geometric mean must be >= 1 token, got {self.mean!r}")
        object.__setattr__(self, "mean", m)
        if self.max is not None:
            object.__setattr__(self, "max", _pos_int(self.max, "geometric max"))
        else:
            _check_cap_loss(self.to_str(), self._tail(MAX_LENGTH))

    def _tail(self, m: int) -> float:
        """P(X > m) = q^m, q = 1 - 1/mean."""
        return math.exp(m * math.log1p(-1.0 / self.mean)) if self.mean > 1 else 0.0

    def sample(self, rng, n):
        x = rng.geometric(1.0 / self.mean, size=n).astype(np.int64, copy=False)
        # (as lognormal: never past the longest length a trace can hold)
        np.minimum(x, self.upper, out=x)
        return x

    @property
    def upper(self) -> int:
        """Where samples are clipped: `max`, else MAX_LENGTH (max is at most MAX_LENGTH)."""
        return MAX_LENGTH if self.max is None else self.max

    def expected(self):
        """E[min(X, M)] = sum_{k<M} q^k = mean (1 - q^M), M = `upper` (the mass past M piles at M)."""
        return self.mean * (1.0 - self._tail(self.upper))

    def largest(self):
        return self.max

    def to_str(self):
        s = f"geometric:mean={_fmt(self.mean)}"
        return s + (f",max={self.max}" if self.max is not None else "")


_LOGNORMAL_EXACT_TERMS = 20_000  # integers whose rounding probability is summed one by one


@dataclass(frozen=True)
class Lognormal(LengthLaw):
    """exp(N(mu, sigma^2)) with mu = ln(mean) - sigma^2/2, rounded, >= 1, optional max."""

    mean: float
    sigma: float | None = None
    cv: float | None = None
    max: int | None = None

    def __post_init__(self):
        m = _pos_float(self.mean, "lognormal mean")
        if m < 1:  # (every sample is rounded up to 1 token at least: the mean asked for is never drawn)
            raise ConfigError(f"lognormal mean must be >= 1 token, got {self.mean!r}")
        object.__setattr__(self, "mean", m)
        if (self.sigma is None) == (self.cv is None):
            raise ConfigError("lognormal needs exactly one of sigma= or cv= (e.g. lognormal:mean=1000,sigma=1.0)")
        if self.sigma is not None:
            object.__setattr__(self, "sigma", _pos_float(self.sigma, "lognormal sigma"))
        else:
            object.__setattr__(self, "cv", _pos_float(self.cv, "lognormal cv"))
        if self.max is not None:
            object.__setattr__(self, "max", _pos_int(self.max, "lognormal max"))
        else:
            _check_cap_loss(self.to_str(), self._cap_loss())

    def _cap_loss(self) -> float:
        """E[(X - MAX_LENGTH)+] / mean, the share of the mean the sampler's cap cuts (in
        closed form: the lognormal's partial expectation past the cap; rounding, under a
        token a sample, does not count)."""
        s = self.log_sigma
        d1 = (math.log(self.mean) + 0.5 * s * s - math.log(MAX_LENGTH)) / s
        return max(0.0, _normal_cdf(d1) - MAX_LENGTH / self.mean * _normal_cdf(d1 - s))

    @property
    def log_sigma(self) -> float:
        if self.sigma is not None:
            return self.sigma
        # sqrt(log(1 + cv^2)) is cv to double precision for a small cv, and cv**2 underflows
        # to 0 below about 1e-162 (a log-sd of 0 divided by zero: a traceback)
        return self.cv if self.cv < 1e-8 else math.sqrt(math.log1p(self.cv**2))

    def sample(self, rng, n):
        s = self.log_sigma
        mu = math.log(self.mean) - 0.5 * s * s
        x = np.minimum(np.rint(rng.lognormal(mu, s, size=n)), MAX_LENGTH)
        np.clip(x, 1, self.max if self.max is not None else 2**62, out=x)
        return x.astype(np.int64)

    def expected(self):
        """The mean of the samples: of the law rounded to integers, clipped to >= 1 and to
        `max` (or the sampler's cap). E[R] = 1 + sum_{j=2..U} P(X > j - 1/2): the first
        terms summed exactly, the rest by the midpoint rule as the closed-form integral of
        the survival function (error about the density there / 24, below 1e-6 tokens)."""
        from scipy.special import ndtr  # noqa: PLC0415 - start-up time of the CLI

        s = self.log_sigma
        mu = math.log(self.mean) - 0.5 * s * s
        upper = MAX_LENGTH if self.max is None else min(MAX_LENGTH, self.max)
        if upper <= 1:
            return 1.0
        last = min(upper, _LOGNORMAL_EXACT_TERMS)
        j = np.arange(2, last + 1, dtype=np.float64)
        total = 1.0 + float(np.sum(ndtr(-(np.log(j - 0.5) - mu) / s)))
        if upper > last:
            # sum_{j=last+1..upper} S(j - 1/2) ~ integral_{last}^{upper} S(y) dy
            #                                 = E[min(X, upper)] - E[min(X, last)]
            def emin(a: float) -> float:
                la = math.log(a)
                partial = math.exp(mu + 0.5 * s * s) * float(ndtr((la - mu - s * s) / s))
                return partial + a * float(ndtr(-(la - mu) / s))

            total += emin(float(upper)) - emin(float(last))
        return total

    def largest(self):
        return self.max

    def to_str(self):
        s = f"lognormal:mean={_fmt(self.mean)},"
        s += f"sigma={_fmt(self.sigma)}" if self.sigma is not None else f"cv={_fmt(self.cv)}"
        return s + (f",max={self.max}" if self.max is not None else "")


_EMPIRICAL_CACHE: dict[tuple, np.ndarray] = {}


@dataclass(frozen=True)
class Empirical(LengthLaw):
    """Values of one CSV column: drawn uniformly with replacement (`sequential=False`) or
    read in file order, wrapping around (`sequential=True`).

    `source` is what the user gave (a path or a dataset name); `column` None means the
    default column for `role` ("prompt" or "output")."""

    source: str
    column: str | None = None
    sequential: bool = False
    role: str | None = None
    path: Path = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "path", resolve_path(self.source))

    def with_role(self, role: str) -> Empirical:
        return Empirical(self.source, self.column, self.sequential, role)

    @property
    def resolved_column(self) -> str:
        header = read_header(self.path)
        if header[0].startswith(("{", "[")):  # (its fields: a JSON line split at its commas)
            law = "replay" if self.sequential else "empirical"
            raise ConfigError(
                f"file {self.path} is not a CSV file: its first line is JSON (a JSON Lines file such as a Mooncake "
                f"trace?); {law}: reads a column of a CSV file with a header line, and a Mooncake trace replays "
                "with --trace (workload trace: in a configuration)"
            )
        if self.column is not None:
            if self.column not in header:
                raise ConfigError(f"file {self.path} has no column '{self.column}' (its header is: {','.join(header)})")
            return self.column
        names = PROMPT_COLUMNS if self.role == "prompt" else (OUTPUT_COLUMNS if self.role == "output" else ())
        for c in names:
            if c in header:
                return c
        if len(header) == 1:
            return header[0]
        raise ConfigError(
            f"say which column of {self.path} to use for "
            f"{self.role or 'lengths'}, e.g. empirical:{self.source}:"
            f"{header[0]} (columns: {','.join(header)})"
        )

    def values(self) -> np.ndarray:
        """The column as int64 >= 1 (cached per file version; read-only)."""
        col = self.resolved_column
        st = self.path.stat()
        key = (str(self.path.resolve()), st.st_mtime_ns, st.st_size, col)
        v = _EMPIRICAL_CACHE.get(key)
        if v is None:
            raw = read_columns(self.path, {col: "float"})[col]
            if raw.size == 0:
                raise ConfigError(f"file {self.path} has no data rows for column '{col}'")
            v = as_lengths(raw, self.path, col, minimum=1, clip_low=True)
            zeros = int(np.count_nonzero(raw == 0))
            if zeros:  # (a request has at least one token)
                some = "1 length of 0 tokens is" if zeros == 1 else f"{zeros:,} lengths of 0 tokens are"
                warn(f"file {self.path} column '{col}': {some} drawn as 1 token")
            v.setflags(write=False)
            if len(_EMPIRICAL_CACHE) > 16:
                _EMPIRICAL_CACHE.clear()
            _EMPIRICAL_CACHE[key] = v
        return v

    def indices(self, rng, n: int, size: int, start: int = 0) -> np.ndarray:
        """Rows of n draws; `start`: in file order, the draws already made (a caller drawing
        in blocks continues the file instead of replaying its first rows)."""
        if self.sequential:
            return (start + np.arange(n, dtype=np.int64)) % size
        return rng.integers(0, size, size=n, dtype=np.int64)

    def sample(self, rng, n, start: int = 0):
        v = self.values()
        return v[self.indices(rng, n, v.shape[0], start)]

    def expected(self):
        return float(self.values().mean())

    def largest(self):
        return int(self.values().max())

    def to_str(self):
        if not self.sequential and self.column is None and is_dataset(self.source) and not Path(self.source).is_file():
            return self.source
        s = f"{'replay' if self.sequential else 'empirical'}:{recorded_path(self.source)}"
        return s + (f":{self.column}" if self.column is not None else "")

    def recorded(self):
        """`to_str`, but a named dataset (`sharegpt`, `replay:azure-conv`) as the file it
        resolved to, absolute, with the column read (`empirical:/.../file.csv:COLUMN`): a
        rerun of the run's config.json reads that file from any folder, whatever
        $LLMSCHED_TRACES then names, and draws the same lengths (laws on one file and mode
        draw the same rows, as a dataset's prompt and output did: `sample_pair`)."""
        if Path(self.source).is_file() or not is_dataset(self.source):
            return self.to_str()
        try:
            column = self.resolved_column
        except ConfigError:  # (no role picks one: read back the same way, without it)
            column = self.column
        s = f"{'replay' if self.sequential else 'empirical'}:{self.path.resolve()}"
        return s + (f":{column}" if column is not None else "")


def sample_pair(
    prompt: LengthLaw,
    output: LengthLaw,
    rng_prompt: np.random.Generator,
    rng_output: np.random.Generator,
    n: int,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw n prompt and n output lengths. Two empirical laws on the same file (and mode)
    read the same rows (joint sampling, from `rng_prompt`); otherwise independent.
    `start`: the draws made before, for a caller drawing in blocks (a `replay:` law
    continues the file from there)."""
    if (
        isinstance(prompt, Empirical)
        and isinstance(output, Empirical)
        and prompt.sequential == output.sequential
        and prompt.path.resolve() == output.path.resolve()
    ):
        pv, ov = prompt.values(), output.values()
        idx = prompt.indices(rng_prompt, n, pv.shape[0], start)
        return pv[idx], ov[idx]
    return _draw(prompt, rng_prompt, n, start), _draw(output, rng_output, n, start)


def _draw(law: LengthLaw, rng, n: int, start: int) -> np.ndarray:
    return law.sample(rng, n, start) if isinstance(law, Empirical) else law.sample(rng, n)


# ---------------------------------------------------------------------------- parsing
def _split_args(text: str, law: str, positional: tuple[str, ...], keys: tuple[str, ...]):
    out: dict[str, str] = {}
    args = [a.strip() for a in text.split(",")] if text.strip() else []
    pos = 0
    for a in args:
        if not a:
            raise ConfigError(f"empty argument in length law '{law}:{text}'")
        if "=" in a:
            k, v = (s.strip() for s in a.split("=", 1))
            k = k.lower()
            if k not in keys:
                raise ConfigError(f"unknown parameter '{k}' in length law '{law}:{text}' (allowed: {', '.join(keys)})")
            if k in out:
                raise ConfigError(f"parameter '{k}' given twice in length law '{law}:{text}'")
            out[k] = v
        else:
            if pos >= len(positional):
                raise ConfigError(f"too many values in length law '{law}:{text}'")
            if positional[pos] in out:
                raise ConfigError(f"parameter '{positional[pos]}' given twice in length law '{law}:{text}'")
            out[positional[pos]] = a
            pos += 1
    return out


def _need(args: dict, key: str, spec: str, example: str):
    if key not in args:
        raise ConfigError(f"length law '{spec}' is missing {key} (e.g. {example})")
    return args[key]


def _from_string(spec: str) -> LengthLaw:
    s = spec.strip()
    if not s:
        raise ConfigError("length law is empty (e.g. const:512, lognormal:mean=1000,sigma=1)")
    if is_dataset(s):
        return Empirical(s.lower())
    try:
        value = int(s)
    except ValueError:
        value = None
    if value is not None:
        return Constant(value)
    law, sep, rest = s.partition(":")
    law = law.strip().lower()
    if law in ("const", "constant", "fixed"):
        a = _split_args(rest, law, ("value",), ("value",))
        return Constant(_need(a, "value", s, "const:512"))
    if law == "uniform":
        a = _split_args(rest, law, ("lo", "hi"), ("lo", "hi"))
        return Uniform(_need(a, "lo", s, "uniform:16,2048"), _need(a, "hi", s, "uniform:16,2048"))
    if law in ("geometric", "geom"):
        a = _split_args(rest, law, ("mean",), ("mean", "max"))
        return Geometric(_need(a, "mean", s, "geometric:256"), a.get("max"))
    if law == "lognormal":
        a = _split_args(rest, law, ("mean",), ("mean", "sigma", "cv", "max"))
        return Lognormal(
            _need(a, "mean", s, "lognormal:mean=1000,sigma=1.0"), a.get("sigma"), a.get("cv"), a.get("max")
        )
    if law in ("empirical", "replay"):
        if not rest.strip():
            raise ConfigError(f"length law '{s}' needs a file: {law}:PATH[:COLUMN]")
        return _empirical_from(rest.strip(), sequential=(law == "replay"))
    raise ConfigError(
        f"unknown length law '{s}' (known: const:N, uniform:LO,HI, geometric:MEAN, "
        "lognormal:mean=M,sigma=S|cv=C, empirical:PATH[:COLUMN], "
        f"replay:PATH[:COLUMN], {', '.join(DATASETS)})"
    )


def _empirical_from(rest: str, sequential: bool, column: str | None = None) -> Empirical:
    if column is None and not Path(os.path.expanduser(rest)).is_file() and not is_dataset(rest) and ":" in rest:
        path, col = rest.rsplit(":", 1)
        # (a tail with no "/" is a column: a missing file is then named without it)
        if col.strip() and (Path(os.path.expanduser(path)).is_file() or is_dataset(path) or "/" not in col):
            return Empirical(path.strip(), col.strip(), sequential)
    src = rest.lower() if is_dataset(rest) and not Path(rest).is_file() else rest
    return Empirical(src, column, sequential)


def _from_mapping(d: dict) -> LengthLaw:
    d = {str(k).lower(): v for k, v in d.items()}
    kind = d.pop("law", None) or d.pop("kind", None) or d.pop("type", None)
    if kind is None:
        raise ConfigError(f"length law mapping {d} needs a 'law' key (e.g. law: lognormal)")
    kind = str(kind).strip().lower()
    if is_dataset(kind) and not d:
        return Empirical(kind)
    if kind in ("empirical", "replay"):
        src = d.pop("path", None) or d.pop("dataset", None) or d.pop("file", None)
        if src is None:
            raise ConfigError(f"{kind} length law needs a 'path' key")
        if not isinstance(src, (str, os.PathLike)):  # (a list was looked for as the file "['x']")
            raise ConfigError(f"{kind} length law: 'path' must be a file's path or a dataset's name, got {src!r:.60}")
        col = d.pop("column", None)
        if d:
            raise ConfigError(f"unknown key(s) {sorted(d)} in {kind} length law")
        return _empirical_from(str(src), kind == "replay", None if col is None else str(col))
    for k, v in d.items():
        # text is refused as a config's numbers are (`mean: "100"` is a YAML string); joined
        # into the string form below, a comma in it started another parameter:
        # {law: uniform, hi: "9,2"} read as uniform:2,9
        if isinstance(v, (str, bytes)):
            raise ConfigError(f"{kind} length law: '{k}' must be one number, got {v!r:.60}{quoted_number(v)}")
    args = ",".join(f"{k}={v}" for k, v in d.items())
    return _from_string(f"{kind}:{args}")


def named_length_law(spec, where: str, role: str | None = None) -> LengthLaw:
    """`parse_length_law`, its errors prefixed by where the law came from (`--prompt`, a
    configuration's `turns`)."""
    try:
        return parse_length_law(spec, role)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def parse_length_law(spec, role: str | None = None) -> LengthLaw:
    """A LengthLaw from a string (see module doc), an int (constant), a mapping such as
    {"law": "lognormal", "mean": 1000, "sigma": 1}, or a LengthLaw. `role` ("prompt" or
    "output") picks an empirical file's default column."""
    if isinstance(spec, LengthLaw):
        law = spec
    elif isinstance(spec, bool):
        raise ConfigError(f"length law must be a string like const:512, got {spec!r}")
    elif isinstance(spec, (int, np.integer)):
        law = Constant(int(spec))
    elif isinstance(spec, float):
        law = Constant(spec)
    elif isinstance(spec, str):
        law = _from_string(spec)
    elif isinstance(spec, dict):
        law = _from_mapping(spec)
    else:
        raise ConfigError(f"length law must be a string like const:512, got {spec!r}")
    if isinstance(law, Empirical) and role is not None and law.role != role:
        law = law.with_role(role)
        law.resolved_column  # check the column now: errors surface when the spec is built
    return law
