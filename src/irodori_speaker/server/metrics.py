"""Prometheus metrics of one server (its own registry: several apps in one process do not mix)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_length = Gauge("irodori_queue_length", "Lines waiting for the model", registry=r)
        self.requests = Counter(
            "irodori_requests_total", "Requests answered", ["route", "status"], registry=r
        )
        self.rejected = Counter(
            "irodori_rejected_total",
            "Requests and connections turned away, by reason (queue_full, shutting_down, "
            "body_too_large, connections_per_client / connections_total: refused with a 503; "
            "evicted_*: an idle connection closed to make room; read_timeout: headers too slow)",
            ["reason"],
            registry=r,
        )
        self.errors = Counter("irodori_errors_total", "Requests that failed", ["route", "kind"], registry=r)
        self.ttfb = Histogram(
            "irodori_time_to_first_byte_seconds",
            "Request start to the first audio byte sent",
            ["route"],
            buckets=_LATENCY,
            registry=r,
        )
        self.total = Histogram(
            "irodori_request_seconds",
            "Request start to the last byte",
            ["route"],
            buckets=_LATENCY,
            registry=r,
        )
        self.rtf = Histogram(
            "irodori_real_time_factor",
            "Wall time of a line / its audio length (below 1: faster than real time)",
            buckets=(0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.audio_seconds = Counter("irodori_audio_seconds_total", "Seconds of audio sent", registry=r)
        self.cancelled = Counter(
            "irodori_cancelled_total", "Lines cancelled because the client went away", registry=r
        )
        self.cache_hits = Counter(
            "irodori_cache_hits_total", "Lines served from the phrase cache", registry=r
        )
        self.sampler_steps = Counter("irodori_sampler_steps_total", "Sampler steps run", registry=r)
        self.sample_batch = Histogram(
            "irodori_sample_batch_lines",
            "Lines sampled together with each rendered line (itself included; 1: alone)",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )

        self.gpu_memory_budget = Gauge(
            "irodori_gpu_memory_budget_bytes",
            "The GPU memory budget (--max-gpu-memory) in bytes on CUDA; 0: none, or not applicable here",
            registry=r,
        )
        self.gpu_memory_peak: Gauge | None = None  # on CUDA only (gpu_peak)

    def gpu_peak(self, read: Callable[[], float]) -> None:
        """Export the allocator's peak (CUDA), read when /metrics is scraped."""
        self.gpu_memory_peak = Gauge(
            "irodori_gpu_memory_peak_bytes",
            "The most GPU memory PyTorch's allocator has held in this process (CUDA only)",
            registry=self.registry,
        )
        self.gpu_memory_peak.set_function(read)

    def render(self) -> bytes:
        return generate_latest(self.registry)
