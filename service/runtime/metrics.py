"""Prometheus metrics of one gateway. Each app gets its own registry so several apps
(tests, benchmarks) can live in one process without duplicate-metric errors."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Metrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("nobackfill_requests", "HTTP requests by route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("nobackfill_request_seconds", "HTTP request latency by route",
                                 ["method", "route"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.batch_size = Histogram("nobackfill_batch_size", "items per encoder forward",
                                    ["modality"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.active = Gauge("nobackfill_active_version", "1 for the version serving a gallery",
                            ["gallery", "version", "space"], registry=self.registry)
        self.swaps = Counter("nobackfill_swaps", "active-version changes picked up",
                             ["gallery"], registry=self.registry)
        self._active: dict[str, tuple[str, str]] = {}  # gallery -> (version, space) labels
        self.load_errors = Counter("nobackfill_load_errors", "model versions that failed to load",
                                   ["version"], registry=self.registry)

    def set_active(self, gallery: str, version: str, space: str) -> None:
        """Exactly one series per gallery: drop the old version's series first."""
        old = self._active.get(gallery)
        if old == (version, space):
            return
        if old is not None:
            self.active.remove(gallery, *old)
        self.active.labels(gallery, version, space).set(1)
        self._active[gallery] = (version, space)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
