"""Everything one gateway process holds: settings, registry, gallery store, the runtime
that serves models, metrics, the device lane (one thread running model forwards), the
search lane (one thread running batched gallery searches), and the job records and queue."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from service.runtime.embedder import Batching
from service.runtime.metrics import Metrics
from service.runtime.search_batcher import SearchBatcher
from service.runtime.serving import EncoderLoader, Runtime
from service.runtime.threads import lane_torch_threads
from service.state.candidates import CandidateCounts
from service.state.config import Settings
from service.state.gallery import GalleryStore, open_qdrant
from service.state.jobs import JobStore
from service.state.jobs.broker import JobQueue
from service.state.registry import Registry
from training.artifacts import Artifact
from training.encoders import Encoder
from training.versions import load_encoder

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    settings: Settings
    registry: Registry
    store: GalleryStore
    runtime: Runtime
    metrics: Metrics
    lane: ThreadPoolExecutor
    jobs: JobStore
    queue: JobQueue
    searches: SearchBatcher
    search_lane: ThreadPoolExecutor
    candidates: CandidateCounts

    def close(self) -> None:
        self.candidates.save()
        self.lane.shutdown(wait=True, cancel_futures=True)
        self.search_lane.shutdown(wait=True, cancel_futures=True)
        self.store.close()


def open_gateway(settings: Settings, metrics: Metrics,
                 load: EncoderLoader | None = None) -> Gateway:
    registry = Registry.of(settings)  # checks gates under this process's criterion
    # Local Qdrant mode has no internal locking; Edge (``EdgeClient``: a lock per shard)
    # and a server handle concurrency themselves, so a search never queues behind a write
    # that waits (e.g. while Edge copies a shard to index it).
    client = open_qdrant(settings)
    store = GalleryStore(client, serialise=settings.qdrant_url is None
                         and settings.qdrant_engine == "local",
                         search_ef=settings.qdrant_search_ef)
    lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nobackfill-device",
                              initializer=lane_torch_threads, initargs=(settings.torch_threads,))
    batching = Batching(settings.batch_max_size, settings.batch_max_wait_s)
    runtime = Runtime(registry, load or _device_loader(settings.device), lane, batching, metrics,
                      settings.keep_warm_versions)
    search_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nobackfill-search")
    return Gateway(settings, registry, store, runtime, metrics, lane,
                   JobStore(settings.registry_dir), JobQueue(settings),
                   SearchBatcher(store, search_lane, settings.batch_max_size), search_lane,
                   candidate_counts(settings))


def candidate_counts(settings: Settings) -> CandidateCounts:
    from service.state.candidates import FOLDER

    return CandidateCounts(settings.registry_dir / FOLDER, settings.candidate_half_life_s,
                           settings.candidate_items_max, settings.candidate_searches_kept,
                           sets_max=settings.candidate_sets_max)


def _device_loader(device: str | None) -> EncoderLoader:
    def load(artifact: Artifact, space: str) -> Encoder:
        log.info("loading version '%s' into space '%s'", artifact.version_id, space)
        return load_encoder(artifact, space, device)
    return load
