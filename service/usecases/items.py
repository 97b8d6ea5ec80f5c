"""Add and delete a gallery's items.

Adding: validate every item first (a bad one rejects the whole batch, nothing is
written), keep each uploaded image's bytes (``service.vectors.sources``: a migration
re-embeds from them), embed with the serving version's route into the gallery's space on
the device lane (and into the other side's space while a migration keeps two), and write
through the shared pipeline (``service.vectors``: a ``DirectWriter``): upsert by caller id
(sending the same batch twice changes nothing), thumbnails beside. Writes and deletes take
the gallery's write lock, which orders them against a migration's backfill.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from service.runtime.embedder import Embedder
from service.runtime.gateway import Gateway
from service.runtime.serving import Serving
from service.state.config import Settings
from service.state.errors import InvalidInput, NotFound, ServiceError, Unavailable, shown
from service.state.gallery.locks import gallery_lock
from service.state.thumbnails import MAX_SIDE, ThumbnailStore
from service.usecases.media import DecodeBudget, decode_image
from service.vectors.embed import embed
from service.vectors.ingest import Source, payload, upserts
from service.vectors.sources import SourceStore
from service.vectors.writer import DirectWriter, Sides


@dataclass(frozen=True)
class NewItem:
    id: str
    text: str | None = None
    image: bytes | None = None
    payload: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Ingested:
    gallery: str
    version: str
    space: str
    count: int


async def add_items(gateway: Gateway, gallery: str, items: Sequence[NewItem]) -> Ingested:
    check_items(items, gateway.settings.ingest_max_items)
    serving = gateway.runtime.serving(gallery)
    embedder = serving.ready()
    side = max(e.image_side for e in (embedder, *(o.embedder for o in serving.others)))
    sources = await asyncio.to_thread(_sources, items, gateway.settings, side)
    vectors = {}
    for space, side_embedder in ((serving.space, embedder),
                                 *((o.space, o.embedder) for o in serving.others)):
        prepared = await asyncio.to_thread(Preprocessed, side_embedder, sources)
        vectors[space] = await asyncio.get_running_loop().run_in_executor(
            side_embedder.lane, embed, prepared, sources)
    writer = DirectWriter(gateway.store, ThumbnailStore.of(gateway.settings), serving.gallery,
                          lambda: _same_sides(gateway, serving),
                          lambda: gallery_lock(gateway.settings, serving.gallery))
    applied = await asyncio.to_thread(writer.write, upserts(serving.version, sources, vectors))
    return Ingested(gallery, embedder.version, embedder.space, applied.written)


def _same_sides(gateway: Gateway, serving: Serving) -> Sides:
    """Under the write lock: the sides this request embedded for are still the gallery's
    (a migration that began or ended since it started would miss a side): else 503, retry."""
    record = gateway.registry.gallery(serving.gallery)
    now = [(s.space, s.collection) for s in record.sides()]
    had = [(serving.space, serving.collection), *((o.space, o.collection)
                                                  for o in serving.others)]
    if now != had:
        raise Unavailable(f"gallery '{serving.gallery}' changed sides (a migration began, "
                          f"switched or ended) while this request ran; nothing was written, "
                          f"send it again")
    return Sides.of(record)


async def delete_items(gateway: Gateway, gallery: str, ids: list[str]) -> int:
    """Delete by id from every side (an unknown id is not an error); thumbnails go too."""
    known_gallery(gateway, gallery)
    await asyncio.to_thread(_locked_delete, gateway, gallery, ids)
    await asyncio.to_thread(ThumbnailStore.of(gateway.settings).delete, gallery, ids)
    return len(ids)


def _locked_delete(gateway: Gateway, gallery: str, ids: list[str]) -> None:
    with gallery_lock(gateway.settings, gallery):
        for side in gateway.registry.gallery(gallery).sides():
            gateway.store.delete(side.collection, ids)


def known_gallery(gateway: Gateway, gallery: str) -> None:
    gateway.runtime.serving(gallery)  # 404 for a gallery this replica does not know


def check_items(items: Sequence[NewItem], max_items: int) -> None:
    if not items:
        raise InvalidInput("no items to add")
    if len(items) > max_items:
        raise InvalidInput(f"{len(items)} items in one request; the limit is {max_items}")
    seen: set[str] = set()
    for n, item in enumerate(items):
        if item.id in seen:
            raise InvalidInput(f"item {n}: id '{shown(item.id)}' appears twice in this batch")
        seen.add(item.id)
        if item.text is None and item.image is None:
            raise InvalidInput(f"item {n} ('{shown(item.id)}') has neither a text nor an image")
        if item.text is not None and not item.text.strip():
            raise InvalidInput(f"item {n} ('{shown(item.id)}') has an empty text")


class Preprocessed:
    """The embedder for one ingest batch, its images already turned into model input off
    the device lane: the lane runs forwards only, as it does for queries."""

    def __init__(self, embedder: Embedder, sources: Sequence[Source]) -> None:
        self.embedder = embedder
        self.pixels = {id(s.image): embedder.pixels(s.image) for s in sources
                       if s.image is not None}

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return self.embedder.encode_texts(texts)

    def encode_images(self, images: list[Image.Image]) -> np.ndarray:
        return self.embedder.encode_pixels([self.pixels[id(image)] for image in images])


def _sources(items: Sequence[NewItem], settings: Settings, side: int) -> list[Source]:
    """Decode every image (the error names the item that failed) into the pipeline's
    sources, then keep the originals; the caller's payload is stored as given. Images are
    decoded only as large as the models (input ``side``) and the thumbnail need, under the
    process's decode budget: the kept original is what a later re-embedding reads, at
    full size."""
    images = [_image(n, item, settings, side) for n, item in enumerate(items)]
    kept = SourceStore.of(settings)
    return [Source(item.id, item.text, image, payload(item.payload),
                   kept.put(item.image) if item.image is not None else None)
            for item, image in zip(items, images, strict=True)]


def _image(n: int, item: NewItem, settings: Settings, side: int) -> Image.Image | None:
    if item.image is None:
        return None
    try:
        return decode_image(item.image, settings.max_image_pixels, settings.max_image_bytes,
                            side, DecodeBudget.of(settings), at_least=MAX_SIDE)
    except ServiceError as exc:
        raise type(exc)(f"item {n} ('{shown(item.id)}'): {exc.message}") from exc


async def read_thumbnail(gateway: Gateway, gallery: str, item_id: str) -> bytes:
    """The PNG thumbnail made at ingest; NotFound when the item has none."""
    png = await asyncio.to_thread(ThumbnailStore.of(gateway.settings).read, gallery, item_id)
    if png is None:
        raise NotFound(f"no thumbnail for item '{shown(item_id)}' in gallery "
                       f"'{shown(gallery)}'")
    return png
