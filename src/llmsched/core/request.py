"""A request and its progress through the phases waiting -> prefill -> decode -> done.

Token accounting (paper 1; README "The model"): the step that computes the last prefill token also
emits output token 1; each later decode step emits one more. A request asking for `o`
output tokens therefore needs `prompt` prefill tokens plus `o - 1` decode tokens of work.

Times are integers in nanoseconds so that the step-by-step and the fast simulator paths
add up exactly the same clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from .checks import as_real
from .errors import ConfigError

NS = 1_000_000_000  # nanoseconds per second: every clock of the project counts integer ns
# The longest time any input may span (seconds; about 31 years): clocks in integer ns stay
# far below the simulators' 2**62 ns sentinel (every spec's times are bounded by it)
MAX_SECONDS = 1e9
MAX_LENGTH = 1 << 30  # tokens per request field (a prompt, an output)


def clock_ns(seconds: float) -> int:
    """A time in seconds as the clocks take it: whole ns, rounded half to even (as
    `core.clock.to_clock_ns` rounds arrays)."""
    return int(round(seconds * NS))


def seconds_problem(v) -> str | None:
    """Why `v` is no run time option (`max_time_s`, `sample_interval_s`), None when it is
    one: a positive number of seconds up to MAX_SECONDS (a larger one overflows the clock)
    that is at least 1 ns on it (a smaller one rounded to 0 ns: a stop at 0 ran no request
    and exited 0)."""
    x = as_real(v)
    if x is None or not 0 < x <= MAX_SECONDS:
        return f"must be a positive number of seconds up to {MAX_SECONDS:g}"
    if clock_ns(x) == 0:
        return "must be at least 1 ns (the simulator's clock counts whole ns; it rounds this to 0)"
    return None


def check_seconds(name: str, v) -> int | float | None:
    """A run's time option (`max_time_s`, `sample_interval_s`): None, or one
    `seconds_problem` finds none in; a numpy number is one too. Returns it as a Python
    number (None for None)."""
    if v is None:
        return None
    problem = seconds_problem(v)
    if problem:
        raise ConfigError(f"{name} {problem}, got {v!r}")
    return as_real(v)


def check_sample_interval(v) -> int | float | None:
    """A time series' sampling interval (`sample_interval_s`): `check_seconds`, and at least
    1 microsecond (a smaller one rounds towards 0 ns on the clock)."""
    x = as_real(v)
    if x is not None and 0 < x <= MAX_SECONDS and clock_ns(x) < 1000:
        raise ConfigError(f"the sampling interval must be at least 1 microsecond, got {v} s")
    return check_seconds("sample_interval_s", v)


WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
PHASE_NAMES = ("waiting", "prefill", "decode", "done")


class Request:
    """One request. Fields that change while a request decodes are kept lazily by
    `ServerState` for decoders it serves every step (see `ServerState.emitted`)."""

    __slots__ = (
        "id",
        "index",
        "arrival",
        "prompt",
        "output",
        "tag",
        "key",
        "phase",
        "prefill_target",
        "prefilled",
        "emitted",
        "kv",
        "first_scheduled",
        "first_token",
        "last_emit",
        "finish",
        "preemptions",
        "active",
        "round0",
        "act_seq",
        "payload",
        "blocks",
        "cached",
        "reuse_prefix",
        "next_block",
        "first_hit",
    )

    def __init__(
        self, id: int, arrival: int, prompt: int, output: int, tag: str = "", index: int | None = None, payload=None
    ):
        self.id = id
        self.index = id if index is None else index
        self.arrival = arrival  # ns
        self.prompt = prompt
        self.output = output  # requested output tokens, >= 1
        self.tag = tag
        self.key = (arrival, id)  # decode order and tie-break: arrival, then id
        self.phase = WAITING
        self.prefill_target = prompt  # prompt, or prompt + emitted after a preemption
        self.prefilled = 0  # prefill tokens computed in the current residency
        self.emitted = 0  # output tokens emitted (lazy while an active decoder)
        self.kv = 0  # KV footprint in tokens (lazy while an active decoder)
        self.first_scheduled = -1
        self.first_token = -1
        self.last_emit = -1
        self.finish = -1
        self.preemptions = 0
        self.active = False  # a decoder served in the current step
        self.round0 = 0  # decode round when it became active
        self.act_seq = 0  # activation number, validates completion-heap entries
        self.payload = payload  # engine/server data (token ids, sampling params)
        # Prefix caching: one id per full block of the prompt (the cache's block size), each
        # identifying the block's content and everything before it; None = nothing shareable.
        # A tuple, or in the simulator a read-only memoryview onto the trace's int64 ids
        # (`Trace.iter_block_views`: 8 bytes an id, where a tuple of ints costs about 40)
        self.blocks: Sequence[int] | None = None
        self.cached: list | None = None  # the prefix cache's blocks it holds (a PrefixCache holding)
        self.next_block = 0  # index in `blocks` of the next block to cache once computed
        self.first_hit = 0  # prompt tokens the cache served at its first admission
        # False: admission reuses no cached block (the whole prompt is computed: its prompt
        # logprobs are wanted); what it computes is still cached for others
        self.reuse_prefix = True

    @property
    def remaining_prefill(self) -> int:
        return self.prefill_target - self.prefilled

    @property
    def total_tokens(self) -> int:
        """Token processings this request needs without preemption: prompt + output - 1."""
        return self.prompt + self.output - 1

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, phase={PHASE_NAMES[self.phase]}, prompt={self.prompt}, "
            f"output={self.output}, prefilled={self.prefilled}/{self.prefill_target})"
        )
