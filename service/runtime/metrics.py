"""Prometheus metrics of one gateway, in two registries, as exporters separate what anyone
may scrape from what describes the deployment:

- ``registry``, process-level and public: requests and latency by route template and
  status, encoder batch sizes, rerank embeddings refused (over a search's limit). Their labels are bounded and name no gallery or version.
- ``gallery_registry``, gallery-level, for the read key or an admin key only (like
  ``/readyz``'s details): the version serving each gallery, swaps per gallery, load
  errors per version. A gallery's series go when it is deleted, a version's when it is
  retired (``forget``), so their number follows what exists, not all that ever did.

Each app gets its own registries so several apps (tests, benchmarks) can live in one
process without duplicate-metric errors."""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Metrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # public
        self.requests = Counter("nobackfill_requests", "HTTP requests by route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("nobackfill_request_seconds", "HTTP request latency by route",
                                 ["method", "route"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.batch_size = Histogram("nobackfill_batch_size", "items per encoder forward",
                                    ["modality"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.rerank_embeds_refused = Counter(
            "nobackfill_rerank_embeds_refused", "rerank candidates the new side lacked that "
            "a search did not embed: past its rerank_embed_max_per_request (they kept the "
            "route's place)", registry=self.registry)
        self.gallery_registry = CollectorRegistry()  # with the read key or an admin key
        self.active = Gauge("nobackfill_active_version", "1 for the version serving a gallery",
                            ["gallery", "version", "space"], registry=self.gallery_registry)
        self.swaps = Counter("nobackfill_swaps", "active-version changes picked up",
                             ["gallery"], registry=self.gallery_registry)
        self._active: dict[str, tuple[str, str]] = {}  # gallery -> (version, space) labels
        self._swapped: set[str] = set()  # galleries with a swaps series
        self.load_errors = Counter("nobackfill_load_errors", "model versions that failed to load",
                                   ["version"], registry=self.gallery_registry)
        self._failed: set[str] = set()  # versions with a load_errors series

    def set_active(self, gallery: str, version: str, space: str) -> None:
        """Exactly one series per gallery: drop the old version's series first."""
        old = self._active.get(gallery)
        if old == (version, space):
            return
        if old is not None:
            self.active.remove(gallery, *old)
        self.active.labels(gallery, version, space).set(1)
        self._active[gallery] = (version, space)

    def swapped(self, gallery: str) -> None:
        self.swaps.labels(gallery).inc()
        self._swapped.add(gallery)

    def load_failed(self, version: str) -> None:
        self.load_errors.labels(version).inc()
        self._failed.add(version)

    def forget(self, galleries: Collection[str], versions: Collection[str]) -> None:
        """Drop the series of every gallery not in ``galleries`` (deleted) and of every
        version not in ``versions`` (retired)."""
        for gallery in [g for g in self._active if g not in galleries]:
            self.active.remove(gallery, *self._active.pop(gallery))
        for gallery in [g for g in self._swapped if g not in galleries]:
            self.swaps.remove(gallery)
            self._swapped.discard(gallery)
        for version in [v for v in self._failed if v not in versions]:
            self.load_errors.remove(version)
            self._failed.discard(version)

    def exposition(self, galleries: bool = False) -> bytes:
        """The public series; with ``galleries`` (a keyed caller), the gallery-level too."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.gallery_registry) if galleries else text
