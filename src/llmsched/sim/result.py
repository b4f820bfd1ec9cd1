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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .histogram import GapHistogram
from .simulator import NS, RunStats
from ..core.jsonio import to_jsonable

PERCENTILES = (90, 95, 99)


def _stats(name: str, values_ms: np.ndarray) -> dict:
    out = {}
    if len(values_ms) == 0:
        for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES), "max"):
            out[f"{k}_{name}_ms"] = None
        return out
    out[f"mean_{name}_ms"] = float(np.mean(values_ms))
    out[f"median_{name}_ms"] = float(np.median(values_ms))
    out[f"std_{name}_ms"] = float(np.std(values_ms))
    for p, v in zip(PERCENTILES, np.percentile(values_ms, PERCENTILES)):
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


@dataclass
class SimResult:
    """What `llmsched.simulate` returns."""

    config: dict
    stats: RunStats
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tag: np.ndarray | None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    # ---- per-request values (seconds; NaN where not reached) -------------------------
    def _s(self, ns: np.ndarray) -> np.ndarray:
        out = ns.astype(np.float64) / NS
        out[ns < 0] = np.nan
        return out

    @property
    def finished(self) -> np.ndarray:
        return self.stats.e2e_ns >= 0

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
        out = np.full(len(self.output), np.nan)
        ok = self.finished & (self.output > 1)
        out[ok] = (self.e2e_s[ok] - self.ttft_s[ok]) / (self.output[ok] - 1)
        return out

    @property
    def itl(self) -> GapHistogram:
        return self.stats.itl

    @property
    def timeseries(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.stats.timeseries.items()}

    # ---- summary -------------------------------------------------------------------
    @property
    def summary(self) -> dict:
        if "summary" not in self.extra:
            self.extra["summary"] = self._summary()
        return self.extra["summary"]

    def _summary(self) -> dict:
        st = self.stats
        done = self.finished
        start = float(self.arrival_s.min()) if len(self.arrival_s) else 0.0
        last = float(np.max(self.arrival_s[done] + self.e2e_s[done])) if done.any() else start
        duration = max(last - start, 1e-12)
        n_in = int(self.prompt[done].sum())
        n_out = int(self.output[done].sum())
        s = {
            "num_requests": int(st.n),
            "completed": int(done.sum()),
            "unfinished": int(st.unfinished),
            "duration": duration,
            "total_input_tokens": n_in,
            "total_output_tokens": n_out,
            "request_throughput": float(done.sum()) / duration,
            "output_throughput": n_out / duration,
            "total_token_throughput": (n_in + n_out) / duration,
        }
        s.update(_stats("ttft", self.ttft_s[done] * 1e3))
        tpot = self.tpot_s
        s.update(_stats("tpot", tpot[~np.isnan(tpot)] * 1e3))
        s.update(_hist_stats("itl", st.itl))
        s.update(_stats("e2el", self.e2e_s[done] * 1e3))
        s.update(_stats("queue", self.queue_s[done] * 1e3))
        s["itl_cv"] = st.itl.std / st.itl.mean if st.itl.count else None
        s["itl_count"] = int(st.itl.count)
        s["itl_percentiles_exact"] = st.itl.exact
        loads = np.asarray(st.load_hist, dtype=np.float64)
        steps = max(st.steps, 1)
        b_max = len(loads) - 1
        s["steps"] = int(st.steps)
        s["mean_token_load"] = float((loads * np.arange(len(loads))).sum() / steps)
        s["full_budget_step_share"] = float(loads[b_max] / steps) if st.steps else 0.0
        s["mean_batch_size"] = float(sum(k * c for k, c in st.batch_hist.items()) / steps)
        s["max_batch_size"] = int(max(st.batch_hist, default=0))
        s["busy_time_s"] = st.busy_ns / NS
        s["sim_end_s"] = st.end_ns / NS
        s["busy_fraction"] = st.busy_ns / max(st.end_ns - start * NS, 1)
        s["preemptions"] = int(st.preemptions.sum())
        s["offered_token_rate"] = float((self.prompt + self.output - 1).sum() /
                                        max(float(self.arrival_s.max()) - start, 1e-12)) if len(self.prompt) > 1 else None
        s["wall_s"] = self.wall_s
        s.update(self.extra.get("summary_extra", {}))
        return s

    # ---- tables and files ------------------------------------------------------------
    def request_rows(self):
        ttft, tpot, e2e, queue = self.ttft_s, self.tpot_s, self.e2e_s, self.queue_s
        tags = self.tag if self.tag is not None else [""] * len(self.prompt)
        for i in range(len(self.prompt)):
            yield (i, tags[i], f"{self.arrival_s[i]:.9f}", int(self.prompt[i]), int(self.output[i]),
                   _fmt(queue[i]), _fmt(ttft[i]), _fmt(tpot[i]), _fmt(e2e[i]),
                   int(self.stats.preemptions[i]), int(self.finished[i]))

    def write(self, out_dir: str | os.PathLike, steps_tmp: Path | None = None) -> Path:
        """Write summary.json, config.json, requests.csv, timeseries.csv, histograms and,
        if recorded, steps.csv into `out_dir`. Files appear whole or not at all."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files: dict[str, callable] = {
            "summary.json": lambda f: json.dump(to_jsonable(self.summary), f, indent=2),
            "config.json": lambda f: json.dump(to_jsonable(self.config), f, indent=2),
            "requests.csv": self._write_requests,
            "timeseries.csv": self._write_timeseries,
            "itl_histogram.csv": self._write_itl,
            "load_histogram.csv": self._write_load,
            "batch_histogram.csv": self._write_batch,
        }
        for name, writer in files.items():
            tmp = out / f".{name}.tmp"
            with open(tmp, "w", newline="") as f:
                writer(f)
            os.replace(tmp, out / name)
        if steps_tmp is not None:
            os.replace(steps_tmp, out / "steps.csv")
        return out

    def _write_requests(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["id", "tag", "arrival_s", "prompt_tokens", "output_tokens", "queue_s", "ttft_s",
                    "tpot_s", "e2e_s", "preemptions", "finished"])
        w.writerows(self.request_rows())

    def _write_timeseries(self, f) -> None:
        ts = self.stats.timeseries
        cols = list(ts)
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(zip(*(ts[c] for c in cols)))

    def _write_itl(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["itl_ms", "count"])
        for v, c in self.stats.itl.counts():
            w.writerow([f"{v / 1e6:.6f}", c])

    def _write_load(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["token_load", "steps"])
        for b, c in enumerate(self.stats.load_hist):
            if c:
                w.writerow([b, c])


    def _write_batch(self, f) -> None:
        w = csv.writer(f)
        w.writerow(["batch_size", "steps"])
        w.writerows(sorted(self.stats.batch_hist.items()))


def _fmt(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.9f}"
