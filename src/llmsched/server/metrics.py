"""Prometheus metrics of the server, in the text exposition format (version 0.0.4).

Names follow vLLM's (`vllm:num_requests_running` ...) with the prefix `llmsched:`:

| metric | type | meaning |
|---|---|---|
| llmsched:num_requests_running | gauge | requests running in the engine (admitted, KV held) |
| llmsched:num_requests_waiting | gauge | requests in the engine's waiting queue |
| llmsched:num_requests_queued | gauge | accepted requests without a first token yet (what --max-queued-* bound) |
| llmsched:num_queued_prompt_tokens | gauge | their prompt tokens |
| llmsched:kv_cache_usage_perc | gauge | KV-cache usage, 0..1 (0 when the cache is unbounded) |
| llmsched:kv_cache_used_tokens | gauge | KV-cache slots in use |
| llmsched:prompt_tokens_total | counter | prompt tokens of requests that got a first token |
| llmsched:generation_tokens_total | counter | tokens generated |
| llmsched:request_success_total{finished_reason} | counter | requests finished (stop, length, abort, error) |
| llmsched:request_rejected_total{reason} | counter | requests refused (overloaded: 429, draining: 503,
  body_too_large: 413, read_timeout: 408) |
| llmsched:num_preemptions_total | counter | preemptions (from the engine's stats, if it reports them) |
| llmsched:time_to_first_token_seconds | histogram | arrival at the server to first token dispatched |
| llmsched:inter_token_latency_seconds | histogram | gap between two tokens of a request |
| llmsched:e2e_request_latency_seconds | histogram | arrival to last token |
Times are taken on the server when the engine's output reaches the event loop.
"""

from __future__ import annotations

from bisect import bisect_left

PREFIX = "llmsched:"

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def render(self, name: str, labels: str) -> list[str]:
        out = []
        acc = 0
        sep = "," if labels else ""
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{b}"}} {acc}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ServerMetrics:
    """Counters and histograms updated on the event loop; `render()` for /metrics."""

    def __init__(self, model_name: str):
        self.labels = f'model_name="{_esc(model_name)}"'
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.rejected: dict[str, int] = {"overloaded": 0, "draining": 0, "body_too_large": 0, "read_timeout": 0}
        self.max_queued_requests_seen = 0
        self.max_queued_tokens_seen = 0

    def render(self, engine_stats: dict, queued_requests: int, queued_tokens: int) -> str:
        L = self.labels
        p = PREFIX
        lines: list[str] = []

        def metric(name, kind, help_, value, labels=L):
            lines.append(f"# HELP {p}{name} {help_}")
            lines.append(f"# TYPE {p}{name} {kind}")
            lines.append(f"{p}{name}{{{labels}}} {value}")

        s = engine_stats or {}
        metric("num_requests_running", "gauge", "Number of requests running in the engine.", s.get("running", 0))
        metric(
            "num_requests_waiting", "gauge", "Number of requests waiting in the engine's queue.", s.get("waiting", 0)
        )
        metric(
            "num_requests_queued",
            "gauge",
            "Accepted requests without a first token yet (bounded by --max-queued-requests).",
            queued_requests,
        )
        metric(
            "num_queued_prompt_tokens",
            "gauge",
            "Prompt tokens of the queued requests (bounded by --max-queued-tokens).",
            queued_tokens,
        )
        cap = s.get("kv_capacity_tokens")
        used = s.get("kv_used_tokens", 0)
        metric(
            "kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            (used / cap) if cap else s.get("kv_usage", 0.0),
        )
        metric("kv_cache_used_tokens", "gauge", "KV-cache slots (tokens) in use.", used)
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens)
        metric("generation_tokens_total", "counter", "Number of generation tokens processed.", self.generation_tokens)
        metric("num_preemptions_total", "counter", "Cumulative number of preemptions.", s.get("preemptions", 0))
        lines.append(f"# HELP {p}request_success_total Count of finished requests by finish reason.")
        lines.append(f"# TYPE {p}request_success_total counter")
        for reason, c in self.finished.items():
            lines.append(f'{p}request_success_total{{{L},finished_reason="{reason}"}} {c}')
        lines.append(f"# HELP {p}request_rejected_total Count of refused requests by reason.")
        lines.append(f"# TYPE {p}request_rejected_total counter")
        for reason, c in self.rejected.items():
            lines.append(f'{p}request_rejected_total{{{L},reason="{reason}"}} {c}')
        for name, h, help_ in (
            ("time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
            ("inter_token_latency_seconds", self.itl, "Histogram of inter-token latency in seconds."),
            ("e2e_request_latency_seconds", self.e2e, "Histogram of end to end request latency in seconds."),
        ):
            lines.append(f"# HELP {p}{name} {help_}")
            lines.append(f"# TYPE {p}{name} histogram")
            lines.extend(h.render(p + name, L))
        if "steps" in s:
            metric("engine_steps_total", "counter", "Engine steps executed.", s["steps"])
        if "late_steps" in s:
            metric(
                "virtual_late_steps_total",
                "counter",
                "Virtual-GPU steps that ended after their predicted time (host too slow).",
                s["late_steps"],
            )
            metric(
                "virtual_lag_seconds_total",
                "counter",
                "Time the virtual GPU's schedule was pushed back by a host slower than the cost model.",
                s.get("lag_s", 0.0),
            )
            metric(
                "virtual_max_late_seconds",
                "gauge",
                "Worst lateness of a virtual-GPU step (caught up if under the debt limit).",
                s.get("max_late_s", 0.0),
            )
        return "\n".join(lines) + "\n"
