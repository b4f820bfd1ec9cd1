"""A simulation's results: summary metrics, per-request table, time series, and files.

Metric names follow `vllm bench serve` where they overlap (duration, completed,
total_input_tokens, total_output_tokens, request_throughput, output_throughput,
total_token_throughput, mean/median/std/pNN of ttft, tpot, itl and e2el in ms).
"""

from __future__ import annotations

import csv
import json
import math
import os
import weakref
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path

import numpy as np

from ..core.checks import check_bool
from ..core.clock import to_clock_ns
from ..core.errors import ConfigError
from ..core.jsonio import to_jsonable
from ..core.paths import (
    begin_simulate_write,
    check_inputs_kept,
    check_out_dir,
    check_run_dir,
    clear_stale,
    end_simulate_write,
    make_run_dir,
    run_kind,
    writes_alone,
)
from ..policies import paced_by_slo
from .csv_rows import (
    CHUNK,
    IntField,
    NotFormattable,
    format_rows,
    ns_text,
    seconds_field,
    tag_field,
    time_text,
    write_file,
)
from .histogram import GapHistogram
from .simulator import NS, RunStats

PERCENTILES = (90, 95, 99)
# steps.csv's column types, given to its readers: a run of no step (a --max-time stop before
# the first arrival) has a header alone, whose columns were read as null or object
STEPS_TYPES = {
    "step": "int64",
    "start_s": "float64",
    "duration_s": "float64",
    "prefill_tokens": "int64",
    "decode_tokens": "int64",
    "batch_size": "int64",
    "entries": "string",
}


def clear_other_run(out: Path, kind: str) -> None:
    """Before a `kind` run writes into `out`: remove the outputs of a run of another kind
    held there (a rerun replaces its own files; another kind's would stay beside them).
    Refuses (ConfigError) a folder of other files, or of a sweep's or an experiment's."""
    check_run_dir(out, kind)
    held = run_kind(out)
    if held is not None and held != kind:
        clear_stale(out, held, ())


def check_inputs_not_replaced(out_dir, kind: str, config: dict) -> None:
    """Refuse (ConfigError) a `kind` run into `out_dir` whose configuration reads a file
    the run would replace or remove there (`core.paths.check_inputs_kept`): before the
    run, and again by a result's `write`."""
    from ..workload.datasets import file_stamps  # noqa: PLC0415 - start-up: the workload package, for writes only

    # (not the command line a run's config.json records: its config file is read whole first)
    d = {k: v for k, v in config.items() if k != "provenance"} if isinstance(config, dict) else config
    check_inputs_kept(out_dir, kind, [f for f, _, _ in file_stamps(d)])


def checked_slo(value) -> dict:
    """A result's `slo` as `r.slo = value` after a run sets it: checked as a run's `slo=`
    is (ConfigError), None or {} meaning no objectives."""
    if value is None or value == {}:
        return {}
    from ..core.slo import check_request_slo  # noqa: PLC0415 - its patterns cost start-up time

    return check_request_slo(value)


class SloAfterRun:
    """A result whose `slo` may be set after its run (`r.slo = ...`: goodput under other
    limits), checked as the run's was; its cached summary (`_summary`) is computed anew
    when `slo`, or another of `_summary_inputs`, is set."""

    _summary_inputs: tuple[str, ...] = ("slo",)

    def __setattr__(self, name: str, value) -> None:
        if name == "slo":
            value = checked_slo(value)
        super().__setattr__(name, value)
        if name in self._summary_inputs and "_summary" in self.__dict__:
            self.__dict__["_summary"] = None

    def _slo_config(self, config: dict, section: str | None = None) -> tuple[dict, dict | None]:
        """`config` (the run's, as config.json records it; its SLO at `config[section]["slo"]`,
        or `config["slo"]`) as the summary's: where `slo` was set after the run to other
        limits, those as its SLO and the run's under `provenance.slo_of_run`, which a rerun
        ignores. Returns it with the run's SLO, or None where they are the same (`config`
        as it is)."""
        holder = config if section is None else config.get(section) or {}
        run_slo = checked_slo(holder.get("slo"))
        if self.slo == run_slo:
            return config, None
        holder = {**holder, "slo": dict(self.slo)}
        config = {**config, **({"slo": holder["slo"]} if section is None else {section: holder})}
        config["provenance"] = {**config.get("provenance", {}), "slo_of_run": run_slo}
        return config, run_slo


def _median(values: np.ndarray) -> float:
    """np.median's value without its NaN check, which imports numpy.ma (20 ms of start-up)."""
    n = len(values)
    k = n // 2
    if n % 2:
        return float(np.partition(values, k)[k])
    part = np.partition(values, [k - 1, k])
    return float((part[k - 1] + part[k]) / 2)


def _percentiles(values: np.ndarray, ps) -> list[float]:
    """np.percentile's 'linear' values (same arithmetic), without the numpy.ma import that
    np.percentile pulls in."""
    n = len(values)
    pos = [p / 100 * (n - 1) for p in ps]
    lows = [math.floor(x) for x in pos]
    ranks = sorted({k for lo in lows for k in (lo, min(lo + 1, n - 1))})
    part = np.partition(values, ranks)
    out = []
    for x, lo in zip(pos, lows):
        a, b = float(part[lo]), float(part[min(lo + 1, n - 1)])
        t = x - lo
        d = b - a
        out.append(b - d * (1 - t) if t >= 0.5 else a + d * t)
    return out


def _stats(name: str, values_ms: np.ndarray) -> dict:
    out = {}
    if len(values_ms) == 0:
        for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES), "max"):
            out[f"{k}_{name}_ms"] = None
        return out
    out[f"mean_{name}_ms"] = float(np.mean(values_ms))
    out[f"median_{name}_ms"] = _median(values_ms)
    out[f"std_{name}_ms"] = float(np.std(values_ms))
    for p, v in zip(PERCENTILES, _percentiles(values_ms, PERCENTILES)):
        out[f"p{p}_{name}_ms"] = float(v)
    out[f"max_{name}_ms"] = float(np.max(values_ms))
    return out


def _hist_stats(name: str, h: GapHistogram) -> dict:
    if not h.count:
        return _stats(name, np.array([]))
    out = {f"mean_{name}_ms": h.mean / 1e6}
    med, *ps = h.percentiles((50, *PERCENTILES))
    out[f"median_{name}_ms"] = med / 1e6
    out[f"std_{name}_ms"] = h.std / 1e6
    for p, v in zip(PERCENTILES, ps):
        out[f"p{p}_{name}_ms"] = v / 1e6
    out[f"max_{name}_ms"] = h.max / 1e6
    return out


def new_steps_file(folder=None) -> tuple[int, Path]:
    """A new temporary steps file (`.steps-*.csv.tmp`, in `folder` or the system's temporary
    folder), readable as every output is (mkstemp makes it 0600): (its descriptor, its path)."""
    import tempfile  # noqa: PLC0415 - start-up: only runs that record their steps need it

    fd, name = tempfile.mkstemp(prefix=".steps-", suffix=".csv.tmp", dir=folder)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    return fd, Path(name)


@dataclass(eq=False)  # (==: identity; a field-wise == over numpy arrays has no one truth value)
class SimResult(SloAfterRun):
    """What `llmsched.simulate` returns."""

    config: dict
    stats: RunStats
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tag: np.ndarray | None
    wall_s: float = 0.0
    # summary fields computed by the caller from the run: theorem 2's capacity and the
    # stability verdict (`llmsched.simulate`), or a network replica's verdict
    stability: dict = field(default_factory=dict)
    # per-request objectives in ms (ttft_ms, tpot_ms, itl_ms, e2el_ms): the summary reports goodput
    slo: dict = field(default_factory=dict)
    # the run's steps.csv when steps were recorded (`record_steps`)
    steps_path: Path | None = None
    _summary: dict | None = field(default=None, init=False, repr=False)
    _steps_temporary: bool = field(default=False, init=False, repr=False)
    # the steps file's identity (device, inode, size, mtime_ns) when this result made or
    # moved it: another run written into the same folder replaces its steps.csv
    _steps_id: tuple | None = field(default=None, init=False, repr=False)
    # the folders `write` wrote this result into, by their summary.json's identity (device,
    # inode, size, mtime_ns: another run written there since replaced it), each with
    # whether that write had the Parquet tables: `write_parquet` and `write_config` write
    # only into such a folder
    _written: dict = field(default_factory=dict, init=False, repr=False)

    # the summary reports both: one read before either was set is computed anew
    _summary_inputs = ("slo", "stability")

    def own_steps(self, path: Path) -> None:
        """`path`: the run's recorded steps in a temporary file, which `write` moves into
        its folder; removed with the result if never written."""
        self.steps_path = Path(path)
        self._steps_temporary = True
        self._steps_id = _file_id(self.steps_path)
        weakref.finalize(self, Path(path).unlink, missing_ok=True)

    def __getstate__(self) -> dict:
        """A copy (pickle, `copy.deepcopy`, a multiprocessing worker's result) carries the
        steps of a run that has not written them yet: the temporary file is this result's
        alone (removed with it, moved by its `write`), so the copy gets its bytes and makes
        a file of its own (`__setstate__`)."""
        state = self.__dict__.copy()
        if self._steps_temporary:
            path = self._steps_file()
            state["_steps_temporary"] = False
            state["_steps_id"] = None
            state["steps_path"] = None
            state["_steps_bytes"] = path.read_bytes() if path is not None else None
        return state

    def __setstate__(self, state: dict) -> None:
        data = state.pop("_steps_bytes", None)
        self.__dict__.update(state)
        if data is not None:
            fd, path = new_steps_file()
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.own_steps(path)

    def _steps_file(self) -> Path | None:
        """The run's recorded steps file, None when it recorded none. ConfigError when the
        file this result wrote was replaced (another run written into its folder) or
        removed since: never another run's steps as this one's. A `steps_path` set by the
        caller is taken as it is (None when no file is there)."""
        if self.steps_path is None:
            return None
        path = Path(self.steps_path)
        if self._steps_id is None:
            return path if path.is_file() else None
        if _file_id(path) != self._steps_id:
            raise ConfigError(
                f"{path.name} in {path.parent} was replaced by another run (or removed) since this result "
                "wrote it: its steps are no longer this run's; rerun with record_steps=True"
            )
        return path

    # ---- per-request values (seconds; NaN where not reached) -------------------------
    def _s(self, ns: np.ndarray) -> np.ndarray:
        return _seconds(ns)

    @property
    def finished(self) -> np.ndarray:
        return self.stats.e2e_ns >= 0

    @property
    def arrival_ns(self) -> np.ndarray:
        """Arrival times in whole ns as the simulator's clock takes them (float64: NaN or
        inf stay as they are); every time the result reports is measured from these."""
        return to_clock_ns(self.arrival_s, np.float64)

    @property
    def arrival_span_s(self) -> float:
        """First to last arrival, in seconds, from the whole-ns times the clock took
        (`arrival_ns`, as every other time of the run), so that a replay of the run's
        requests.csv (its arrivals in whole ns) offers exactly the same rate; 0.0 with fewer
        than two requests."""
        if len(self.arrival_s) < 2:
            return 0.0
        a = self.arrival_ns
        return float(a.max() - a.min()) / NS

    @property
    def offered_rate(self) -> float | None:
        """Requests per second offered: (n - 1) over the arrivals' span
        (`arrival_span_s`); None, not an epsilon's absurd figure, when every request
        arrives at once (or there is only one)."""
        span = self.arrival_span_s
        return (len(self.arrival_s) - 1) / span if span > 0 else None

    @property
    def arrived(self) -> np.ndarray:
        """True for the requests that arrived before the simulation stopped; False for
        those of the trace after a `max_time_s` stop (they never reached the server)."""
        return _arrived(self.arrival_ns, self.stats.end_ns, self.stats.stop_ns)

    @property
    def ttft_s(self) -> np.ndarray:
        return self._s(self.stats.ttft_ns)

    @property
    def e2e_s(self) -> np.ndarray:
        return self._s(self.stats.e2e_ns)

    @property
    def queue_s(self) -> np.ndarray:
        return self._s(self.stats.queue_ns)

    @property
    def tpot_s(self) -> np.ndarray:
        """Each finished request's exact mean inter-token gap (vLLM's TPOT; the summary's
        statistics). requests.csv, requests.parquet and `to_pandas()` round it up to the ns
        (`tpot_ceil_ns`), goodput's test."""
        return _tpot(self.finished, self.output, self.e2e_s, self.ttft_s)

    @property
    def tpot_ns(self) -> np.ndarray:
        """`tpot_s` rounded up to the ns as requests.csv writes it, -1 where there is none
        (`tpot_ceil_ns`)."""
        return tpot_ceil_ns(self.output, self.stats.e2e_ns, self.stats.ttft_ns)

    @property
    def itl(self) -> GapHistogram:
        return self.stats.itl

    @property
    def timeseries(self) -> dict[str, np.ndarray]:
        """The sampled series: `time_s` in seconds, every other column a count (int64,
        also with no sample: an empty list's default, float64, typed them otherwise)."""
        return {
            k: np.asarray(v, dtype=np.float64 if k == "time_s" else np.int64) for k, v in self.stats.timeseries.items()
        }

    # ---- summary -------------------------------------------------------------------
    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = self._make_summary()
        return self._summary

    def _make_summary(self) -> dict:
        st = self.stats
        done = self.finished
        # in whole ns, as the clock ran: busy time over the run's span is at most 1 exactly
        arrival_ns = self.arrival_ns
        start_ns = int(arrival_ns.min()) if len(arrival_ns) else 0
        # int64: a float64 sum rounds past 2**53 ns (about 104 days of clock)
        last_ns = int(np.max(arrival_ns[done].astype(np.int64) + st.e2e_ns[done])) if done.any() else None
        duration = run_duration(start_ns if len(arrival_ns) else None, last_ns, st.end_ns) / NS
        n_in = int(self.prompt[done].sum())
        n_out = int(self.output[done].sum())
        s = {
            "num_requests": int(st.n),
            "completed": int(done.sum()),
            "unfinished": int(st.unfinished),
            "arrived": int(self.arrived.sum()),
            "duration": duration,
            "total_input_tokens": n_in,
            "total_output_tokens": n_out,
            "request_throughput": per_second(int(done.sum()), duration),
            "output_throughput": per_second(n_out, duration),
            "total_token_throughput": per_second(n_in + n_out, duration),
        }
        # theorem 2's work of the finished requests (uncached prompt + output - 1), the
        # served counterpart of `offered_work_rate`: with a prefix cache the tokens served
        # exceed the work, and only the work is bounded by token_capacity
        ph = st.prefix_hits
        work = n_in + n_out - int(done.sum())
        if ph is not None and len(ph) == len(done):
            s["work_throughput"] = per_second(work - int(ph[done].sum()), duration)
        else:  # (a network's replica keeps no hits per call: with a cache its work is not known)
            s["work_throughput"] = per_second(work, duration) if st.prefix is None else None
        s.update(_stats("ttft", self.ttft_s[done] * 1e3))
        tpot = self.tpot_s
        s.update(_stats("tpot", tpot[~np.isnan(tpot)] * 1e3))
        s.update(_hist_stats("itl", st.itl))
        s.update(_stats("e2el", self.e2e_s[done] * 1e3))
        s.update(_stats("queue", self.queue_s[done] * 1e3))
        s["itl_cv"] = st.itl.std / st.itl.mean if st.itl.count else None
        s["itl_count"] = int(st.itl.count)
        s["itl_percentiles_exact"] = st.itl.exact
        steps = max(st.steps, 1)
        s["steps"] = int(st.steps)
        s["mean_token_load"] = sum(b * c for b, c in st.load_hist.items()) / steps
        s["full_budget_step_share"] = st.load_hist.get(st.b_max, 0) / steps if st.steps else 0.0
        s["mean_batch_size"] = float(sum(k * c for k, c in st.batch_hist.items()) / steps)
        s["max_batch_size"] = int(max(st.batch_hist, default=0))
        s["busy_time_s"] = st.busy_ns / NS
        s["sim_end_s"] = st.end_ns / NS
        s["busy_fraction"] = st.busy_ns / max(st.end_ns - start_ns, 1)
        s["preemptions"] = int(st.preemptions.sum())
        if st.prefix is not None:
            s["prefix_cache"] = dict(st.prefix)
        # `offered_rate` times the mean prompt + output - 1 tokens per request (None when
        # every request arrives at once); the prompt tokens a prefix cache serves are
        # counted, so the utilisation's numerator is `offered_work_rate` (`api`), not this
        span, n = self.arrival_span_s, len(self.prompt)
        tokens = float((self.prompt + self.output - 1).sum())
        s["offered_token_rate"] = tokens / n * (n - 1) / span if span > 0 else None
        s["wall_s"] = self.wall_s
        s.update(self.stability)
        if self.slo:
            s["slo"] = dict(self.slo)
            s.update(goodput(meets_slo(self.slo, done, st.ttft_ns, st.e2e_ns, self.output), done, duration))
        if self.tag is not None and len(self.tag):
            tags = np.asarray(self.tag, dtype=object)
            names = sorted(set(tags.tolist()))
            if len(names) > 1:  # a multi-class workload: each class's own latencies
                ttft, e2e = self.ttft_s, self.e2e_s
                s["tags"] = {}
                for name in names:
                    sel = (tags == name) & done
                    s["tags"][str(name)] = {
                        "num_requests": int((tags == name).sum()),
                        "completed": int(sel.sum()),
                        **_stats("ttft", ttft[sel] * 1e3),
                        **_stats("e2el", e2e[sel] * 1e3),
                        **_stats("tpot", tpot[sel & ~np.isnan(tpot)] * 1e3),
                    }
        return s

    # ---- tables and files ------------------------------------------------------------
    REQUEST_COLUMNS = (
        "id",
        "tag",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "queue_s",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "preemptions",
        "arrived",
        "finished",
    )

    def request_rows(self):
        """Rows of requests.csv as Python values (strings for the times, '' where not
        reached): every time in whole ns, the arrival as the simulator's clock took it."""
        st = self.stats
        ttft, e2e, queue = st.ttft_ns.tolist(), st.e2e_ns.tolist(), st.queue_ns.tolist()
        tpot = self.tpot_ns.tolist()
        arrival_ns = self.arrival_ns.tolist()
        finished = self.finished.tolist()
        arrived = self.arrived.tolist()
        preempts = self.stats.preemptions.tolist()
        prompt, output = self.prompt.tolist(), self.output.tolist()
        tags = self.tag.tolist() if self.tag is not None else [""] * len(prompt)
        for i, a in enumerate(self.arrival_s.tolist()):
            yield (
                i,
                tags[i],
                ns_text(int(arrival_ns[i])) if abs(a) < _MAX_ARRIVAL_S else f"{a:.9f}",
                int(prompt[i]),
                int(output[i]),
                time_text(queue[i]),
                time_text(ttft[i]),
                time_text(tpot[i]),
                time_text(e2e[i]),
                int(preempts[i]),
                int(arrived[i]),
                int(finished[i]),
            )

    def request_columns(self) -> dict[str, np.ndarray]:
        """requests.csv as typed columns: integers, seconds as floats (NaN where not
        reached), `arrived` and `finished` as booleans."""
        n = len(self.prompt)
        return {
            "id": np.arange(n, dtype=np.int64),
            "tag": np.asarray(self.tag, dtype=object) if self.tag is not None else np.full(n, "", dtype=object),
            "arrival_s": self.arrival_ns / NS,
            "prompt_tokens": np.asarray(self.prompt, dtype=np.int64),
            "output_tokens": np.asarray(self.output, dtype=np.int64),
            "queue_s": self.queue_s,
            "ttft_s": self.ttft_s,
            "tpot_s": _seconds(self.tpot_ns),
            "e2e_s": self.e2e_s,
            "preemptions": np.asarray(self.stats.preemptions, dtype=np.int64),
            "arrived": self.arrived,
            "finished": self.finished,
        }

    def itl_columns(self) -> dict[str, np.ndarray]:
        """itl_histogram.csv as columns (ms): the value (an exact gap or a bucket's
        midpoint), the bin's lower and upper edges, the number of gaps."""
        rows = self.stats.itl.bins()
        v, lo, hi, c = (np.array(x) for x in zip(*rows)) if rows else ([], [], [], [])
        return {
            "itl_ms": np.asarray(v, dtype=np.float64) / 1e6,
            "lower_ms": np.asarray(lo, dtype=np.float64) / 1e6,
            "upper_ms": np.asarray(hi, dtype=np.float64) / 1e6,
            "count": np.asarray(c, dtype=np.int64),
        }

    def to_pandas(self) -> dict:
        """The run's tables as pandas DataFrames: `requests` (one row per request, typed;
        `arrived` and `finished` flags), `timeseries`, `itl_histogram` and, when steps
        were recorded, `steps`. Needs pandas (`pip install 'llmsched[analysis]'`)."""
        try:
            import pandas as pd  # noqa: PLC0415 - optional, and slow to import
        except ImportError:
            raise ConfigError(
                "SimResult.to_pandas() needs pandas, which is not installed: pip install 'llmsched[analysis]'"
            ) from None
        out = {
            "requests": pd.DataFrame(self.request_columns()),
            "timeseries": pd.DataFrame(self.timeseries),
            "itl_histogram": pd.DataFrame(self.itl_columns()),
        }
        steps = self._steps_file()
        if steps is not None:
            out["steps"] = pd.read_csv(steps, dtype={**STEPS_TYPES, "entries": str}, keep_default_na=False)
        return out

    def write_parquet(self, out_dir: str | os.PathLike) -> list[Path]:
        """Write requests.parquet, timeseries.parquet and, when steps were recorded,
        steps.parquet into `out_dir`, a folder this result was written into (`write`,
        `simulate(out_dir=...)`; typed columns, the CSV files stay). Needs pyarrow. Any
        other folder is refused (ConfigError): the user's own requests.parquet, or another
        run's folder, whose CSV files and summary.json the tables would sit beside
        (`write(DIR, parquet=True)` writes a new folder with them)."""
        require_pyarrow("--parquet")
        check_out_dir(out_dir)  # a file there, an unwritable folder: one line, not an OSError
        self._steps_file()  # steps this result no longer has: refused first
        self._check_own_folder(out_dir, "write_parquet", "write(DIR, parquet=True)")
        out = Path(out_dir)
        written = self._write_parquet(out)
        self._written[_file_id(out / "summary.json")] = True
        # the folder's config.json says it has the tables, as `write(DIR, parquet=True)`'s
        # does (it said nothing of them, though a later `write_config` added the flag): the
        # file as it is there, a `write_config`'s changes kept
        path = out / "config.json"
        if path.is_file():
            config = json.loads(path.read_text())
            config["provenance"] = {**config.get("provenance", {}), "parquet": True}
            write_file(path, lambda f: json.dump(config, f, indent=2))
        return written

    def _own_write(self, out: Path):
        """The write of this result `out` holds (whether it had the Parquet tables), or None
        when its summary.json is not the one this result's `write` put there."""
        return self._written.get(_file_id(out / "summary.json"))

    def _check_own_folder(self, out_dir, what: str, instead: str) -> None:
        """Refuse (one-line ConfigError) `what` into `out_dir` unless the folder holds this
        result's own write (`_written`): never over the user's files or beside another
        run's, which would mix two runs in one folder."""
        check_out_dir(out_dir)  # a file there, an unwritable folder: one line, not an OSError
        check_run_dir(out_dir, "single-server")  # another tool's config.json, another kind's run
        out = Path(out_dir)
        if self._own_write(out) is not None:
            return
        if (out / "summary.json").exists():
            held = "holds another run (its summary.json is not the one this result wrote)"
        else:
            held = "holds no run this result wrote" if out.is_dir() else "does not exist"
        raise ConfigError(
            f"SimResult.{what}: {str(out_dir)!r} {held}; it writes only into a folder of this result's own "
            f"files (never one that mixes two runs, nor over other files): use result.{instead}"
        )

    def _write_parquet(self, out: Path) -> list[Path]:
        pa, pq, pacsv = require_pyarrow("--parquet")
        steps = self._steps_file()  # before any file is written
        out.mkdir(parents=True, exist_ok=True)
        tables = {
            "requests": pa.table({k: pa.array(v) for k, v in self.request_columns().items()}),
            "timeseries": pa.table({k: pa.array(v) for k, v in self.timeseries.items()}),
        }
        if steps is not None:
            tables["steps"] = pacsv.read_csv(
                steps,
                convert_options=pacsv.ConvertOptions(
                    column_types={k: pa.type_for_alias(t) for k, t in STEPS_TYPES.items()}
                ),
            )
        written = []
        for name, table in tables.items():
            tmp = out / f".{name}.parquet.tmp"
            try:
                pq.write_table(table, tmp)
                os.replace(tmp, out / f"{name}.parquet")
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            written.append(out / f"{name}.parquet")
        return written

    @writes_alone("simulate")
    def write(self, out_dir: str | os.PathLike, parquet: bool = False) -> Path:
        """Write config.json, requests.csv, timeseries.csv, histograms, if recorded,
        steps.csv, with `parquet` the Parquet tables (`write_parquet`), and last
        summary.json into `out_dir`. Files appear whole or not at all, and the earlier run's
        go first (`begin_simulate_write`): a write that stops leaves no summary.json, never
        a folder that mixes two runs."""
        check_out_dir(out_dir)  # a file there, an unwritable folder: one line, not an OSError
        if check_bool(parquet, "parquet"):  # (parquet="no" is truthy: it wrote the tables)
            require_pyarrow("--parquet")  # before any file goes
        steps = self._steps_file()  # before any file is written
        check_inputs_not_replaced(out_dir, "single-server", self.config)
        out = make_run_dir(out_dir)
        clear_other_run(out, "single-server")
        summary = to_jsonable(self.summary)  # (before the earlier run's files go)
        # a rerun into the same folder: nothing of an older run stays beside the new files
        # (this run's steps, recorded into the folder, stay)
        begin_simulate_write(out, "single-server", keep=steps)
        files: dict[str, callable] = {
            "config.json": lambda f: self._write_config(f, parquet),
            "requests.csv": self._write_requests,
            "timeseries.csv": self._write_timeseries,
            "itl_histogram.csv": self._write_itl,
            "load_histogram.csv": self._write_load,
            "batch_histogram.csv": self._write_batch,
        }
        for name, writer in files.items():
            write_file(out / name, writer)
        dest = out / "steps.csv"
        if steps is not None and not (dest.exists() and os.path.samefile(steps, dest)):
            import shutil  # noqa: PLC0415 - start-up: only runs that record steps need it

            if self._steps_temporary:  # the run's own file: moved (it may sit on another file system)
                shutil.move(steps, dest)
                self._steps_temporary = False
            else:  # written before, into another folder: both keep it
                tmp = out / ".steps.csv.tmp"
                try:
                    shutil.copyfile(steps, tmp)
                    os.replace(tmp, dest)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            self.steps_path = dest
            self._steps_id = _file_id(dest)
        if parquet:
            self._write_parquet(out)
        end_simulate_write(out, lambda p: p.write_text(json.dumps(summary, indent=2)))
        self._written[_file_id(out / "summary.json")] = parquet
        return out

    def write_config(self, out_dir: str | os.PathLike) -> Path:
        """Write config.json alone into `out_dir`, a folder this result was written into
        (`write`, `simulate(out_dir=...)`), whole or not at all, as `write` does: after a
        change to `config` that describes the run's outputs. Any other folder is refused
        (ConfigError): another tool's config.json (a model folder's), another run's."""
        self._check_own_folder(out_dir, "write_config", "write(DIR)")
        out = Path(out_dir)
        written = json.loads((out / "summary.json").read_text()).get("slo") or {}
        if written != self.slo:  # (config.json records the summary's SLO: `_config_of_summary`)
            raise ConfigError(
                f"SimResult.write_config: slo is {self.slo} where {str(out_dir)!r}'s summary.json has {written}: "
                "use result.write(DIR), which writes both"
            )
        write_file(out / "config.json", lambda f: self._write_config(f, self._own_write(out)))
        return out / "config.json"

    def _write_config(self, f, parquet: bool = False) -> None:
        """config.json: `config`, with `"parquet": true` under its provenance when the
        folder has the Parquet tables (in the file only: the result's config is left as it
        is, so a later write without them does not claim them). Under provenance, which a
        rerun from this config.json ignores: the options beside it are the simulation's
        (SimConfig's), and --parquet is the command's."""
        config = self._config_of_summary()
        if parquet:
            config = {**config, "provenance": {**config.get("provenance", {}), "parquet": True}}
        json.dump(to_jsonable(config), f, indent=2)

    def _config_of_summary(self) -> dict:
        """`config`, or where `slo` was set after the run (`r.slo = ...`) to other limits
        than the run's: the summary's SLO as its `slo`, the run's own under provenance
        (`slo_of_run`), and where the run's admission took its ITL target from the run's
        SLO (TWP, DynamicBatch: `paced_by_slo`) and the new one's ITL limit differs, that
        target pinned as its `itl_target_ms` (None: its default), so that a rerun from
        config.json runs the same steps and reports the same summary."""
        from ..core.slo import itl_limit_ms  # noqa: PLC0415 - as checked_slo

        config, run_slo = self._slo_config(self.config)
        if run_slo is None:
            return config
        admission, options = config.get("admission"), config.get("admission_options") or {}
        target = itl_limit_ms(run_slo)
        if admission and target != itl_limit_ms(self.slo) and paced_by_slo(admission, options):
            config["admission_options"] = {**options, "itl_target_ms": target}
        return config

    def _write_requests(self, f) -> None:
        header = ",".join(self.REQUEST_COLUMNS) + "\r\n"
        f.write(header)
        try:
            for fields in self._request_blocks():
                f.write(format_rows(fields))
        except NotFormattable:  # a value the vectorised formatter does not cover: row by row
            f.seek(0)
            f.truncate()
            f.write(header)
            csv.writer(f).writerows(self.request_rows())

    def _request_blocks(self):
        """requests.csv's fields for `format_rows`, a block of rows at a time (bounded
        scratch memory). Raises NotFormattable for a value that needs the row-by-row
        writer: a negative, huge or non-finite arrival, a negative count. Times are whole ns."""
        st = self.stats
        n = len(self.prompt)
        prompt, output = np.asarray(self.prompt), np.asarray(self.output)
        arrival = np.asarray(self.arrival_s, dtype=np.float64)
        arrival_ns = self.arrival_ns
        tpot_ns = self.tpot_ns
        tags = tag_field(self.tag, n)
        arrived_all = self.arrived
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            e2e_ns = st.e2e_ns[lo:hi]
            out = output[lo:hi]
            finished = e2e_ns >= 0
            ints = [
                np.arange(lo, hi, dtype=np.int64),
                prompt[lo:hi].astype(np.int64),
                out.astype(np.int64),
                np.asarray(st.preemptions[lo:hi]).astype(np.int64),
                arrived_all[lo:hi].astype(np.int64),
                finished.astype(np.int64),
            ]
            a = arrival[lo:hi]
            if any(len(v) and v.min() < 0 for v in ints) or not ((a >= 0) & (a < _MAX_ARRIVAL_S)).all():
                raise NotFormattable
            fixed = [
                seconds_field(arrival_ns[lo:hi].astype(np.int64)),
                seconds_field(st.queue_ns[lo:hi]),
                seconds_field(st.ttft_ns[lo:hi]),
                seconds_field(tpot_ns[lo:hi]),
                seconds_field(e2e_ns),
            ]
            rid, p, o, pre, arr, fin = (IntField(v) for v in ints)
            yield [rid, tags[lo:hi], fixed[0], p, o, *fixed[1:], pre, arr, fin]

    def _write_timeseries(self, f) -> None:
        ts = self.stats.timeseries
        cols = list(ts)
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(zip(*(ts[c] for c in cols)))

    def _write_itl(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["itl_ms", "lower_ms", "upper_ms", "count"])
        for v, lo, hi, c in self.stats.itl.bins():
            w.writerow([f"{v / 1e6:.6f}", f"{lo / 1e6:.6f}", f"{hi / 1e6:.6f}", c])  # (edges: whole ns)

    def _write_load(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["token_load", "steps"])
        for b, c in sorted(self.stats.load_hist.items()):
            w.writerow([b, c])

    def _write_batch(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["batch_size", "steps"])
        w.writerows(sorted(self.stats.batch_hist.items()))


def _file_id(path: Path) -> tuple | None:
    """A file's identity (device, inode, size, mtime_ns); None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def require_pyarrow(what: str):
    """pyarrow's table, Parquet and CSV modules, or a one-line ConfigError naming `what`."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional, and slow to import
        import pyarrow.csv as pacsv  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        raise ConfigError(f"{what} needs pyarrow, which is not installed: pip install 'llmsched[analysis]'") from None
    return pa, pq, pacsv


def run_duration(first_arrival: float | None, last_completion: float | None, end: float) -> float:
    """A run's duration in seconds, the time its throughputs are rates over: first arrival
    to last completion; with none completed (a max_time_s stop), the time simulated since
    the first arrival, `end` (0 when the stop came first); 0 when nothing arrived. Never a
    placeholder epsilon, which made a run of no completion look like one of absurd rates."""
    if first_arrival is None:
        return 0.0
    if last_completion is not None:
        return last_completion - first_arrival
    return max(end - first_arrival, 0.0)


def goodput(ok: np.ndarray, done: np.ndarray, duration: float | None) -> dict:
    """`goodput` (requests meeting every objective, per second) and `goodput_share` (of the
    finished ones; None where none finished: a share of nothing is undefined, as the
    latency statistics of no requests are None), from `meets_slo`'s `ok` and the finished
    requests `done`."""
    finished = int(done.sum())
    share = float(ok.sum()) / finished if finished else None
    return {"goodput": per_second(int(ok.sum()), duration), "goodput_share": share}


def meets_slo(slo: dict, done: np.ndarray, ttft_ns: np.ndarray, e2e_ns: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Which requests finished within every per-request objective of `slo` (ms: `ttft_ms`,
    `e2el_ms`, and `tpot_ms` / `itl_ms`, both a request's mean inter-token gap, its TPOT;
    a request without a gap meets those). Goodput counts them. Compared on the clock's
    integer nanoseconds: a TPOT of exactly the objective meets it whenever the request ran
    (in float seconds, (116.03 - 116.01) / 2 came to 10.000000000000231 ms)."""
    ok = done.copy()
    for key, values in (("ttft_ms", ttft_ns), ("e2el_ms", e2e_ns)):
        if key in slo:
            ok &= values <= _limit_ns(slo[key])
    # TPOT <= limit in whole ns: its ceiling is (no gap: -1, met); requests.csv's tpot_s
    tpot_ns = tpot_ceil_ns(np.asarray(output, dtype=np.int64), e2e_ns, ttft_ns)
    for key in ("tpot_ms", "itl_ms"):
        if key in slo:
            ok &= tpot_ns <= _limit_ns(slo[key])
    return ok


def _limit_ns(ms: float) -> int:
    """The most whole nanoseconds within an objective of `ms` (a clock time v meets it iff
    v <= this), at most 2^62 (any larger one is met by every run of a clock that ends at
    1e9 s, and fits no int64). From the decimal the objective was written as: in binary,
    10 ms * 1e6 may come to 9999999.999999998 ns, and rounding let a TPOT of 6847126.8 ns
    meet an objective of 6.8471266 ms."""
    ns = Decimal(repr(float(ms))) * 1_000_000
    return int(ns.to_integral_value(rounding=ROUND_FLOOR)) if ns < 2**62 else 1 << 62


def per_second(count: int, duration: float) -> float | None:
    """count / duration; 0 when nothing was counted (also over no time: no completion is
    a throughput of 0), None for a count over no time (no rate to report)."""
    if duration > 0:
        return float(count) / duration
    return 0.0 if count == 0 else None


def _arrived(at: np.ndarray, end_ns: int, stop_ns: int | None = None) -> np.ndarray:
    """The simulator's own test: a request joins the queue once the clock (integer ns)
    reaches its arrival `at` (ns), before a `max_time_s` stop at `stop_ns` (the clock may
    run on to the end of the step across it, `end_ns`, but no request arrives then)."""
    return (at <= end_ns) & (at < stop_ns) if stop_ns is not None else at <= end_ns


def _seconds(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds to seconds; NaN where not reached (negative)."""
    out = ns.astype(np.float64) / NS
    out[ns < 0] = np.nan
    return out


def tpot_ceil_ns(output: np.ndarray, e2e_ns: np.ndarray, ttft_ns: np.ndarray) -> np.ndarray:
    """Each request's mean inter-token gap in whole ns, rounded up (-1 unless it finished
    with 2+ tokens): requests.csv's `tpot_s`, so that `tpot_s <= objective` is exactly
    goodput's test (`meets_slo`), which compares in integer ns."""
    out = np.full(len(output), -1, dtype=np.int64)
    ok = (e2e_ns >= 0) & (ttft_ns >= 0) & (output > 1)
    out[ok] = -((ttft_ns[ok] - e2e_ns[ok]) // (output[ok] - 1))
    return out


def _tpot(finished: np.ndarray, output: np.ndarray, e2e_s: np.ndarray, ttft_s: np.ndarray) -> np.ndarray:
    out = np.full(len(output), np.nan)
    ok = finished & (output > 1)
    out[ok] = (e2e_s[ok] - ttft_s[ok]) / (output[ok] - 1)
    return out


#: arrivals in seconds whose ns count fits an int64 with room to spare
_MAX_ARRIVAL_S = 2.0**62 / NS
