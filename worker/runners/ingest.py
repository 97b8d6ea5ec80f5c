"""An ``ingest`` job: a manifest's items embedded with the gallery's active version routed
into the gallery's space, through the shared pipeline (``service.state.gallery.ingest``),
upserted by item id (a re-run changes nothing it already did)."""

from __future__ import annotations

import time
from typing import Any

from service.state.gallery import GalleryStore, open_qdrant
from service.state.gallery.ingest import GalleryWriter, ingest_dataset
from service.state.jobs.specs import IngestParams
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from worker.context import JobContext


def run_ingest(ctx: JobContext) -> dict[str, Any]:
    from training.trainer import Progress
    from training.versions import load_encoder

    p = IngestParams.model_validate(ctx.job.params)
    dataset = ctx.open_dataset(p.manifest, "manifest")  # every image under an allowed root
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    encoder = load_encoder(registry.artifact(gallery.active), gallery.space, ctx.settings.device)
    start = time.perf_counter()

    def on_batch(done: int, total: int) -> None:
        elapsed = time.perf_counter() - start
        ctx.heartbeat.report(Progress(done, total, 0.0, elapsed / done * (total - done),
                                      done / max(elapsed, 1e-9), "ingest"))

    store = GalleryStore(open_qdrant(ctx.settings), serialise=ctx.settings.qdrant_url is None)
    try:
        writer = GalleryWriter(store, ThumbnailStore.of(ctx.settings), gallery.name,
                               gallery.active, gallery.space)
        count = ingest_dataset(encoder, writer, dataset, p.batch_size, p.kinds, p.language,
                               on_batch)
    finally:
        store.close()
    return {"result": {"items": count}}
