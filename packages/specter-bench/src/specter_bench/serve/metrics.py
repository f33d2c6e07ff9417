"""The server's Prometheus metrics: traffic, latency, and what Specter's decoding did.

Counters carry totals (PromQL's ``rate`` turns them into per-second figures and ratios:
``rate(specter_draft_accepted_tokens_total[5m]) / rate(specter_draft_proposed_tokens_total[5m])``
is the acceptance rate); histograms carry per-request figures (latencies, and each
request's acceptance rate, mean depth, expert cache hit rate, prefetch precision and
recall); gauges the queue and the running batch. Each figure comes from the generation's
statistics; a figure the engine did not report (None: no speculation, no cache traffic) is
not observed.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ServerMetrics", "bytes_moved", "draft_counts"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_TOKEN_BUCKETS = (0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_DEPTH_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)


def bytes_moved(stats: dict[str, Any]) -> float | None:
    """Host-to-device expert bytes of one generation (from ``bytes_moved``, else from the
    per-token figure ``h2d_mb_per_token``)."""
    if stats.get("bytes_moved") is not None:
        return float(stats["bytes_moved"])
    per_token, tokens = stats.get("h2d_mb_per_token"), stats.get("new_tokens")
    if per_token is None or not tokens:
        return None
    return float(per_token) * 1e6 * int(tokens)


def draft_counts(stats: dict[str, Any]) -> tuple[float, float] | None:
    """(proposed, accepted) draft tokens of one generation: the counts where the statistics
    hold them, else from the mean depth, the iterations and the acceptance rate (None
    without speculation)."""
    if stats.get("proposed") is not None and stats.get("accepted") is not None:
        return float(stats["proposed"]), float(stats["accepted"])
    depth, iterations = stats.get("mean_depth"), stats.get("iterations")
    rate = stats.get("acceptance_rate")
    if depth is None or not iterations or rate is None:
        return None
    proposed = round(float(depth) * int(iterations))
    return float(proposed), float(round(float(rate) * proposed))


class ServerMetrics:
    """Every metric of one server, in its own registry (so tests can run several)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specter_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specter_prompt_tokens", "prompt tokens of finished generations", registry=r
        )
        self.generation_tokens = Counter(
            "specter_generation_tokens", "tokens generated", registry=r
        )
        self.cancelled = Counter(
            "specter_generations_cancelled",
            "generations stopped early, by reason (disconnect, stop_string, timeout)",
            ["reason"],
            registry=r,
        )
        self.queue_time = Histogram(
            "specter_queue_time_seconds",
            "time a request waited for the engine",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "specter_time_to_first_token_seconds",
            "time from a request's arrival to its first generated token (queue included)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "specter_time_per_output_token_seconds",
            "mean time per generated token after the first, per request",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specter_request_duration_seconds",
            "time from a request's arrival to its generation's end",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "specter_queue_depth", "requests waiting for the engine", registry=r
        )
        self.running = Gauge(
            "specter_requests_running", "requests the engine is generating for", registry=r
        )
        self.batch_size = Gauge(
            "specter_batch_size",
            "sequences in the engine's running batch (continuous batching, --max-batch)",
            registry=r,
        )
        self.proposed = Counter(
            "specter_draft_proposed_tokens", "tokens the INT4 draft proposed", registry=r
        )
        self.accepted = Counter(
            "specter_draft_accepted_tokens", "proposed tokens the target accepted", registry=r
        )
        self.acceptance = Histogram(
            "specter_acceptance_rate",
            "per request: accepted / proposed draft tokens",
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.depth = Histogram(
            "specter_speculation_depth",
            "per request: mean speculation depth K per iteration",
            buckets=_DEPTH_BUCKETS,
            registry=r,
        )
        self.hit_rate = Histogram(
            "specter_expert_cache_hit_rate",
            "per request: routed experts found resident in the expert cache",
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.precision = Histogram(
            "specter_prefetch_precision",
            "per request: prefetched experts the target then used",
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.recall = Histogram(
            "specter_prefetch_recall",
            "per request: experts the target used that were prefetched",
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.h2d_bytes = Counter(
            "specter_host_to_device_bytes",
            "expert bytes copied from host to device memory",
            registry=r,
        )

    def observe_generation(
        self,
        *,
        queue_s: float,
        ttft_s: float | None,
        tpot_s: float | None,
        duration_s: float,
        prompt_tokens: int,
        completion_tokens: int,
        stats: dict[str, Any],
    ) -> None:
        """Record one finished (or stopped) generation."""
        self.queue_time.observe(queue_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        self.e2e.observe(duration_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        counts = draft_counts(stats)
        if counts is not None:
            self.proposed.inc(counts[0])
            self.accepted.inc(counts[1])
        per_request = (
            ("acceptance_rate", self.acceptance),
            ("mean_depth", self.depth),
            ("hit_rate", self.hit_rate),
            ("prefetch_precision", self.precision),
            ("prefetch_recall", self.recall),
        )
        for key, histogram in per_request:
            if stats.get(key) is not None:
                histogram.observe(float(stats[key]))
        moved = bytes_moved(stats)
        if moved is not None:
            self.h2d_bytes.inc(moved)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
