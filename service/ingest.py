"""Add items to a gallery: validate every item first (a bad one rejects the whole batch,
nothing is written), embed with the active version's route into the gallery's space,
and upsert by caller id (so sending the same batch twice changes nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from service.core.config import Settings
from service.core.errors import InvalidInput, ServiceError
from service.gallery.store import GalleryStore, Item
from service.media import decode_image
from service.runtime.embedder import Embedder
from service.runtime.serving import Runtime
from service.thumbnails import ThumbnailStore, make_thumbnail


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


async def ingest(runtime: Runtime, store: GalleryStore, settings: Settings, gallery: str,
                 items: Sequence[NewItem]) -> Ingested:
    check_items(items, settings.ingest_max_items)
    serving = runtime.serving(gallery)
    embedder = serving.ready()
    pixels, thumbnails = await asyncio.to_thread(_prepare_images, embedder, items, settings)
    vectors = await asyncio.get_running_loop().run_in_executor(
        embedder.lane, _embed, embedder, items, pixels)
    stored = [Item(item.id, vectors[i], item.payload) for i, item in enumerate(items)]
    await asyncio.to_thread(store.upsert, gallery, stored, embedder.version, embedder.space)
    await asyncio.to_thread(ThumbnailStore.of(settings).replace, gallery,
                            {item.id: thumbnails.get(n) for n, item in enumerate(items)})
    return Ingested(gallery, embedder.version, embedder.space, len(stored))


def check_items(items: Sequence[NewItem], max_items: int) -> None:
    if not items:
        raise InvalidInput("no items to add")
    if len(items) > max_items:
        raise InvalidInput(f"{len(items)} items in one request; the limit is {max_items}")
    seen: set[str] = set()
    for n, item in enumerate(items):
        if item.id in seen:
            raise InvalidInput(f"item {n}: id {item.id!r} appears twice in this batch")
        seen.add(item.id)
        if item.text is None and item.image is None:
            raise InvalidInput(f"item {n} ({item.id!r}) has neither a text nor an image")
        if item.text is not None and not item.text.strip():
            raise InvalidInput(f"item {n} ({item.id!r}) has an empty text")


def _prepare_images(embedder: Embedder, items: Sequence[NewItem], settings: Settings,
                    ) -> tuple[dict[int, torch.Tensor], dict[int, bytes]]:
    """Item index -> [3, H, W] pixels, and -> PNG thumbnail (made here so each image is
    decoded once); the error names the item that failed."""
    pixels: dict[int, torch.Tensor] = {}
    thumbnails: dict[int, bytes] = {}
    for n, item in enumerate(items):
        if item.image is None:
            continue
        try:
            image = decode_image(item.image, settings.max_image_pixels, settings.max_image_bytes)
        except ServiceError as exc:
            raise type(exc)(f"item {n} ({item.id!r}): {exc.message}") from exc
        pixels[n] = embedder.pixels(image)
        thumbnails[n] = make_thumbnail(image)
    return pixels, thumbnails


def _embed(embedder: Embedder, items: Sequence[NewItem],
           pixels: dict[int, torch.Tensor]) -> list[dict[str, np.ndarray]]:
    """Per item, kind -> [D]: one text forward and one image forward for the whole batch."""
    vectors: list[dict[str, np.ndarray]] = [{} for _ in items]
    texts = [(n, item.text) for n, item in enumerate(items) if item.text is not None]
    if texts:
        for (n, _), v in zip(texts, embedder.encode_texts([t for _, t in texts]), strict=True):
            vectors[n]["text"] = v
    if pixels:
        order = sorted(pixels)
        encoded = embedder.encode_pixels([pixels[n] for n in order])
        for n, v in zip(order, encoded, strict=True):
            vectors[n]["image"] = v
    return vectors
