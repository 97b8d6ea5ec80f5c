"""An ``ingest`` job: a manifest's items embedded with the gallery's active version into
every side of the gallery (its space; during a migration, the other side's too), through
the shared pipeline (``service.state.gallery.ingest``). The worker writes the thumbnails and
spools the vectors; the gateway, which owns the gallery store, writes them (upsert by item
id: a re-run changes nothing it already did) and then finishes the job."""

from __future__ import annotations

import time
from typing import Any

from service.state.gallery.ingest import dataset_sources, embed
from service.state.gallery.spool import Batch, write_batch
from service.state.jobs.specs import IngestParams
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore, make_thumbnail
from worker.context import JobContext


def run_ingest(ctx: JobContext) -> dict[str, Any]:
    from training.trainer import Progress
    from training.versions import load_encoder

    p = IngestParams.model_validate(ctx.job.params)
    dataset = ctx.open_dataset(p.manifest, "manifest")  # every image under an allowed root
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    artifact = registry.artifact(gallery.active)
    encoders = {side.space: load_encoder(artifact, side.space, ctx.settings.device)
                for side in gallery.sides()}
    thumbnails = ThumbnailStore.of(ctx.settings)
    work = ctx.store.work_dir(ctx.job.id)
    work.mkdir(parents=True, exist_ok=True)
    start, total = time.perf_counter(), len(dataset)
    for first in range(0, total, p.batch_size):
        sources = dataset_sources(dataset, range(first, min(first + p.batch_size, total)),
                                  p.kinds, p.language)
        vectors = {space: embed(encoder, sources) for space, encoder in encoders.items()}
        thumbnails.replace(gallery.name, {s.id: make_thumbnail(s.image) if s.image is not None else None
                                          for s in sources})
        write_batch(work, f"{first:09d}", Batch(
            "upsert", gallery.active,
            [{"id": s.id, "payload": s.payload, "origin": s.origin()} for s in sources],
            vectors))
        done = min(first + p.batch_size, total)
        elapsed = time.perf_counter() - start
        ctx.heartbeat.report(Progress(done, total, 0.0, elapsed / done * (total - done),
                                      done / max(elapsed, 1e-9), "ingest"))
    return {"result": {"items": total}, "hand_off": True}
