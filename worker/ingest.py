"""Large ingests from a manifest: embed in batches with the gallery's active version routed
into the gallery's space, upsert by item id (a re-run changes nothing it already did)."""

from __future__ import annotations

import time
from typing import Any

from service.gallery.store import GalleryStore, Item
from service.jobs.specs import IngestParams
from service.registry import Registry
from service.thumbnails import ThumbnailStore, make_thumbnail
from training.data import PairDataset
from training.trainer import Progress
from worker.run import JobContext


def ingest_dataset(ctx: JobContext, registry: Registry, store: GalleryStore,
                   dataset: PairDataset, p: IngestParams) -> int:
    from training.versions import load_encoder

    gallery = registry.gallery(ctx.job.gallery)
    encoder = load_encoder(registry.artifact(gallery.active), gallery.space, ctx.settings.device)
    thumbnails = ThumbnailStore.of(ctx.settings)
    total, start = len(dataset), time.perf_counter()
    for first in range(0, total, p.batch_size):
        indices = range(first, min(first + p.batch_size, total))
        items = _embed(encoder, dataset, indices, p, thumbnails, gallery.name)
        store.upsert(gallery.name, items, gallery.active, gallery.space)
        done = indices.stop
        elapsed = time.perf_counter() - start
        ctx.heartbeat.report(Progress(done, total, 0.0, elapsed / done * (total - done),
                                      done / max(elapsed, 1e-9), "ingest"))
    return total


def _embed(encoder: Any, dataset: PairDataset, indices: range, p: IngestParams,
           thumbnails: ThumbnailStore, gallery: str) -> list[Item]:
    records = [dataset.records[i] for i in indices]
    vectors: dict[str, Any] = {}
    if "image" in p.kinds:
        images = [dataset.load_image(i) for i in indices]
        vectors["image"] = encoder.encode_images(images)
        thumbnails.replace(gallery, {r.id: make_thumbnail(images[n])
                                     for n, r in enumerate(records)})
    if "text" in p.kinds:
        vectors["text"] = encoder.encode_texts([_caption(r, p.language) for r in records])
    return [Item(r.id, {kind: v[n] for kind, v in vectors.items()}, _payload(r))
            for n, r in enumerate(records)]


def _caption(record: Any, language: str) -> str:
    captions = record.captions.get(language) or []
    if not captions:
        raise ValueError(f"item {record.id!r} has no {language!r} caption to embed as text")
    return str(captions[0])


def _payload(record: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    if record.domain is not None:
        payload["domain"] = record.domain
    if record.attributes:
        payload.update({k: v for k, v in record.attributes.items() if isinstance(v, str)})
    if record.image_path is not None:
        payload["image"] = str(record.image_path)
    return payload
