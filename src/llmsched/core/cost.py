"""Step cost models: how long one GPU step takes.

A cost model answers `step_time(prefill_tokens, decode_tokens, decode_context, chunks,
sampled)` in seconds, where
- `prefill_tokens`, `decode_tokens`: the step's token load b is their sum;
- `decode_context`: KV tokens read by the step's decoders, summed over them;
- `chunks`: `(chunk tokens, context before the chunk)` for each prefill chunk;
- `sampled`: sequences that sample a token in the step (LM head rows).
Models whose time depends on the load b alone set `load_only = True` and also answer
`load_time(b)`; the simulator then times a run of identical steps in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .checks import whole_from_text
from .errors import ConfigError, warn
from .request import NS


class CostModel:
    name = "cost"
    load_only = False

    def step_time(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        sampled: int,
    ) -> float:
        raise NotImplementedError

    def load_time(self, b: int) -> float:
        """Step time at token load b with context-free shape (theory uses it as t(b))."""
        return self.step_time(b, 0, 0, [(b, 0)] if b else [], 1 if b else 0)

    def load_times(self, b):
        """`load_time` of each load in the integer array `b`, as a float array (a model may
        vectorise it; the values must equal `load_time`'s exactly). Theory scans every load
        up to a budget with it."""
        import numpy as np  # noqa: PLC0415

        return np.array([self.load_time(int(v)) for v in b], dtype=float)

    def decode_times(self, n, context: int):
        """The time of a decode-only step of `k` decoders with `context` cached tokens each,
        `step_time(0, k, k * context, [], k)`, for each k of the integer array `n`, as a
        float array (a model may vectorise it; the values must equal `step_time`'s
        exactly). TWP scans decode batches up to the budget with it."""
        import numpy as np  # noqa: PLC0415

        return np.array([self.step_time(0, int(k), int(k) * context, [], int(k)) for k in n], dtype=float)

    def chunk_time(self, chunk: int, context: int) -> float | None:
        """Seconds one prefill chunk of `chunk` tokens after `context` cached tokens adds to
        a step's time, for a model whose step time is a sum over its chunks (plus terms of
        the step's token load); None (the default) for a model that is not. Theory uses it
        to time steps of many whole prompts without listing them."""
        return None

    def chunk_times(self, chunk: int, contexts):
        """`chunk_time(chunk, c)` for each context c of the integer array `contexts`, as a
        float array (a model may vectorise it; the values must equal `chunk_time`'s)."""
        import numpy as np  # noqa: PLC0415

        return np.array([self.chunk_time(chunk, int(c)) for c in contexts], dtype=float)

    def chunk_time_sums(self, chunk: int, lo, hi):
        """For integer arrays `lo <= hi`: the sum of `chunk_time(chunk, c)` over the contexts
        lo <= c < hi, pair by pair, as a float array (a model may compute it in closed form;
        this default times every context)."""
        import numpy as np  # noqa: PLC0415

        return np.array(
            [sum(self.chunk_time(chunk, c) for c in range(int(a), int(b))) for a, b in zip(lo, hi)], dtype=float
        )

    def step_timing(self):
        """Optional fast paths for `StepTimer`: a pair (`step_ns`, `time_steps`), or None
        (the default: the timer wraps `step_time`). `step_ns` takes `step_time`'s arguments
        and gives exactly `int(round(step_time(...) * NS))` (raising through
        `StepTimer._check` when that is not positive); `time_steps` is
        `StepTimer.time_steps` (same arguments, same durations), or None (the timer then
        calls `step_ns` per step). A model that overrides `step_time` must not inherit a
        parent's."""
        return None

    def describe(self) -> dict:
        return {"name": self.name}


#: The largest c and a of a paper, linear or const model (ms): a step of over 1,000 s is
#: no GPU's, and clocks of such steps soon pass what the simulator can hold.
MAX_STEP_MS = 1e6
#: The shortest one-token step (ms): the simulator clocks whole nanoseconds, and a step
#: that rounds to 0 ns would make time stand still.
MIN_STEP_MS = 1e-6


def _check_scale(kind: str, c_ms: float, a_ms: float, one_ms: float) -> None:
    """c and a at most MAX_STEP_MS; a one-token step (`one_ms`) at least MIN_STEP_MS."""
    what = f"{c_ms:g} ms" if kind == "const" else f"c={c_ms:g}, a={a_ms:g}"
    if c_ms > MAX_STEP_MS or a_ms > MAX_STEP_MS:
        raise ConfigError(f"{kind} cost model times must be at most {MAX_STEP_MS:g} ms, got {what}")
    if one_ms < MIN_STEP_MS:
        raise ConfigError(
            f"{kind} cost model times a one-token step at {one_ms:g} ms, under {MIN_STEP_MS:g} ms "
            f"(1 ns, the simulator's clock tick), got {what}"
        )


class PaperCostModel(CostModel):
    """t(b) = c + a * ceil(b / b0) (paper 1), or c + a * max(0, b - b0) (`variant="max"`).
    Defaults: CodeLlama-34B on one A100 (c = 11.28 ms, a = 35.47 ms, b0 = 128)."""

    name = "paper"
    load_only = True

    def __init__(self, c_ms: float = 11.28, a_ms: float = 35.47, b0: int = 128, variant: str = "ceil"):
        if not (math.isfinite(c_ms) and math.isfinite(a_ms)):
            raise ConfigError(f"paper cost model needs finite c and a, got c={c_ms}, a={a_ms}")
        if c_ms < 0 or a_ms < 0:
            raise ConfigError(f"paper cost model needs c >= 0 and a >= 0, got c={c_ms}, a={a_ms}")
        if b0 <= 0:
            raise ConfigError(f"paper cost model needs b0 > 0, got {b0}")
        if variant not in ("ceil", "max"):
            raise ConfigError(f"paper cost model variant must be 'ceil' or 'max', got {variant!r}")
        self.c = c_ms / 1e3
        self.a = a_ms / 1e3
        self.b0 = b0
        self.variant = variant
        _check_scale("paper", c_ms, a_ms, self.load_time(1) * 1e3)

    def load_time(self, b: int) -> float:
        if self.variant == "ceil":
            return self.c + self.a * math.ceil(b / self.b0)
        return self.c + self.a * max(0, b - self.b0)

    def load_times(self, b):
        import numpy as np  # noqa: PLC0415

        if type(self).load_time is not PaperCostModel.load_time:  # a subclass's own t(b)
            return super().load_times(b)
        b = np.asarray(b, dtype=np.int64)
        if self.variant == "ceil":
            return self.c + self.a * -(-b // self.b0).astype(float)
        return self.c + self.a * np.maximum(0, b - self.b0).astype(float)

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return self.load_time(prefill_tokens + decode_tokens)

    def describe(self):
        return {"name": self.name, "c_ms": self.c * 1e3, "a_ms": self.a * 1e3, "b0": self.b0, "variant": self.variant}


class LinearCostModel(CostModel):
    """t(b) = c + a * b: a simple affine model (and, with a = 0, a constant step time)."""

    name = "linear"
    load_only = True

    def __init__(self, c_ms: float = 10.0, a_ms: float = 0.0, *, kind: str = "linear"):
        # `kind`: the spec's word, for messages (a const spec is linear with a = 0)
        if not (math.isfinite(c_ms) and math.isfinite(a_ms)) or c_ms < 0 or a_ms < 0 or c_ms + a_ms <= 0:
            raise ConfigError(f"linear cost model needs c >= 0, a >= 0, not both 0; got c={c_ms}, a={a_ms}")
        _check_scale(kind, c_ms, a_ms, c_ms + a_ms)
        self.c = c_ms / 1e3
        self.a = a_ms / 1e3

    def load_time(self, b: int) -> float:
        return self.c + self.a * b

    def load_times(self, b):
        import numpy as np  # noqa: PLC0415

        if type(self).load_time is not LinearCostModel.load_time:  # a subclass's own t(b)
            return super().load_times(b)
        return self.c + self.a * np.asarray(b, dtype=np.int64).astype(float)

    def step_time(self, prefill_tokens, decode_tokens, decode_context, chunks, sampled):
        return self.c + self.a * (prefill_tokens + decode_tokens)

    def describe(self):
        return {"name": self.name, "c_ms": self.c * 1e3, "a_ms": self.a * 1e3}


class StepTimer:
    """A cost model's step times in integer nanoseconds, as every driver clocks them (the
    simulator, the virtual GPU); times of load-only models are cached by load.

    `step_ns(prefill_tokens, decode_tokens, decode_context, chunks, sampled)` is the
    step's time: a function made for the model once, as the simulator calls it every
    step (a method testing `load_only` and calling a checker took a third of its time).
    A model may give its own (`CostModel.step_timing`), which saves the call of
    `step_time` inside it.

    `time_steps(durs, t, limit, upto, prefill_tokens, decode_tokens, decode_context,
    chunks, remaining)` times the repeated steps of one plan: it appends to `durs` the
    durations of steps j = len(durs), len(durs) + 1, ... while j < upto and the step
    starts before `limit` (`t`, the end of the steps in `durs`, is the start of step
    len(durs)), and returns the end of the last. Step j of the plan is
    `step_ns(prefill_tokens, decode_tokens, decode_context + j * decode_tokens,
    [(c, ctx + j * c) for c, ctx in chunks], sampled_j)`, where sampled_j counts the
    decode tokens and the chunks whose prefill that step completes (`remaining` holds each
    chunk's prefill tokens left before step 0: chunk c completes in step j if
    `remaining - j * c == c`). A model may give its own (`CostModel.step_timing`)
    that looks the plan's constant parts up once."""

    __slots__ = ("cost", "load_only", "_by_load", "step_ns", "time_steps")

    def __init__(self, cost: CostModel):
        self.cost = cost
        self.load_only = cost.load_only
        self._by_load: dict[int, int] = {}
        if cost.load_only:
            self.step_ns = self._load_step_ns
            self.time_steps = steps_by_step(self.step_ns)
            return
        timing = getattr(cost, "step_timing", None)
        step_ns, time_steps = (timing and timing()) or (None, None)
        self.step_ns = step_ns or _nanoseconds(cost.step_time)
        self.time_steps = time_steps or steps_by_step(self.step_ns)

    def load_ns(self, b: int) -> int:
        """Step time at load b of a load-only model."""
        d = self._by_load.get(b)
        if d is None:
            d = self._by_load[b] = self._check(self.cost.load_time(b), b)
        return d

    def _load_step_ns(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        sampled: int,
    ) -> int:
        return self.load_ns(prefill_tokens + decode_tokens)

    @staticmethod
    def _check(seconds: float, b: int) -> int:
        d = int(round(seconds * NS))
        if d <= 0:
            raise ConfigError(f"the cost model gives a non-positive step time at load {b}")
        return d


def _nanoseconds(step_time):
    """`step_time` (seconds) as integer nanoseconds, rounded as `StepTimer._check` does."""

    def step_ns(prefill_tokens, decode_tokens, decode_context, chunks, sampled) -> int:
        seconds = step_time(prefill_tokens, decode_tokens, decode_context, chunks, sampled)
        d = int(round(seconds * NS))
        return d if d > 0 else StepTimer._check(seconds, prefill_tokens + decode_tokens)  # raises

    return step_ns


def steps_by_step(step_ns):
    """`StepTimer.time_steps` for the step function `step_ns`, calling it for every step."""

    def time_steps(
        durs: list[int],
        t: int,
        limit: int,
        upto: int,
        prefill_tokens: int,
        decode_tokens: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        remaining: Sequence[int],
    ) -> int:
        m = decode_tokens
        j = len(durs)
        if not chunks:
            while j < upto and t < limit:
                d = step_ns(0, m, decode_context + j * m, [], m)
                durs.append(d)
                t += d
                j += 1
            return t
        while j < upto and t < limit:
            s = m
            for (c, _), rem in zip(chunks, remaining):
                if rem - j * c == c:  # the chunk that completes its prefill samples a token
                    s += 1
            d = step_ns(prefill_tokens, m, decode_context + j * m, [(c, ctx + j * c) for c, ctx in chunks], s)
            durs.append(d)
            t += d
            j += 1
        return t

    return time_steps


def _parse_params(text: str, spec: str) -> dict[str, str]:
    params = {}
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise ConfigError(f"cost model {spec!r}: expected key=value, got {part!r}")
        k, v = part.split("=", 1)
        k = k.strip()
        if k in params:  # the last one silently winning hides a typo in the other
            raise ConfigError(f"cost model {spec!r}: {k} given twice")
        params[k] = v.strip()
    return params


def _floats(params: dict[str, str], spec: str, allowed: dict[str, type]) -> dict:
    out = {}
    for k, v in params.items():
        if k not in allowed:
            raise ConfigError(f"cost model {spec!r}: unknown parameter {k!r} (known: {', '.join(allowed)})")
        if allowed[k] is int:  # b0=1e3 is 1000, as in a length law
            out[k] = whole_from_text(v)
            if out[k] is None:
                raise ConfigError(f"cost model {spec!r}: {k} must be a whole number, got {v!r}")
            continue
        try:
            out[k] = allowed[k](v)
        except ValueError:
            raise ConfigError(f"cost model {spec!r}: {k} must be a number, got {v!r}") from None
    return out


def recorded_cost_model(spec):
    """`spec` as a run's config.json records it: `profile:PATH` with PATH absolute
    (`profile.recorded_spec`), so that a rerun from another folder reads the same tables."""
    kind, sep, rest = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if kind.strip().lower() != "profile" or not rest.strip():
        return spec
    from .profile import recorded_spec  # noqa: PLC0415 (as in make_cost_model)

    return kind + sep + recorded_spec(rest)


#: The kinds of `make_cost_model` spec other than a profile's (`KIND` or `KIND:...`).
FORMULA_KINDS = ("paper", "linear", "const", "constant")


def make_cost_model(spec: str | CostModel) -> CostModel:
    """Build a cost model from a spec string:

    - `paper` or `paper:c=11.28,a=35.47,b0=128,variant=max`
    - `linear:c=10,a=0.05` (milliseconds; `const:10` is linear with a = 0)
    - `profile` (the default H200 Llama-3-8B tables), `profile:NAME` (a shipped profile:
      h200-llama-3-8b, h200-llama-3.2-1b) or `profile:PATH` (a folder or CSV of your own)
    """
    if isinstance(spec, CostModel):
        return spec
    if not isinstance(spec, str):  # (str() made None "unknown cost model 'none'", and 3 '3')
        raise ConfigError(f"cost model must be a name (paper, profile, ...) or a CostModel, got {spec!r:.60}")
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "paper":
        p = _floats(_parse_params(rest, spec), spec, {"c": float, "a": float, "b0": int, "variant": str})
        return PaperCostModel(
            c_ms=p.get("c", 11.28),
            a_ms=p.get("a", 35.47),
            b0=p.get("b0", 128),
            variant=p.get("variant", "ceil").lower(),  # case-blind, as profile's mode=
        )
    if kind == "linear":
        p = _floats(_parse_params(rest, spec), spec, {"c": float, "a": float})
        return LinearCostModel(c_ms=p.get("c", 10.0), a_ms=p.get("a", 0.0))
    if kind in ("const", "constant"):
        try:
            ms = float(rest) if rest else 10.0
        except ValueError:
            raise ConfigError(f"cost model {spec!r}: constant step time must be a number of ms") from None
        if not 0 < ms < math.inf:  # (nan too)
            raise ConfigError(f"cost model {spec!r}: constant step time must be a finite number > 0 ms, got {ms:g}")
        return LinearCostModel(c_ms=ms, a_ms=0.0, kind="const")
    if kind == "profile":
        from .profile import load_profile  # noqa: PLC0415 (tables are read only when asked for)

        return load_profile(rest or "h200-llama-3-8b")
    raise ConfigError(f"unknown cost model {kind!r} (known: paper, linear, const, profile)")


MIN_STEP_S = 1e-4  # a step faster than 0.1 ms is no GPU's: probably seconds given as ms


def warn_fast_steps(cost, label) -> None:
    """Warn when the cost model `label` (its spec, for the message) times a one-token step
    under 0.1 ms (`simulate`, a network's servers, and `capacity`)."""
    one = min(cost.load_time(1), cost.step_time(0, 1, 1, [], 1))
    if one < MIN_STEP_S:
        warn(
            f"the cost model {label!r} times a one-token step at {one * 1e3:.3g} ms, under 0.1 ms: "
            "are its times in milliseconds?"
        )


def warn_past_grid(cost, b_max: int, batch: int, context: int, ran: bool = False, said: set | None = None) -> None:
    """Warn when a measured profile (a cost model with `extrapolation`; others: no-op) is
    used more than twice past its grid at this token budget, decode batch (0: not judged)
    and longest context: before a run ("is"), or after it (`ran`: "was ... in this run").
    A message already in `said` is not given again (servers sharing one profile)."""
    far = cost.extrapolation(b_max, batch, context) if hasattr(cost, "extrapolation") else []
    if not far:
        return
    verb, when = ("was", " in this run") if ran else ("is", "")
    message = f"profile {cost.label!r} {verb} extrapolated far past its grid: {'; '.join(far)}{when}"
    if said is None or message not in said:
        if said is not None:
            said.add(message)
        warn(message)
