"""The one way items get into a gallery, whichever path stores them (the items API, an
``ingest`` job, the first-start bootstrap, the serving benchmark's gallery):

1. ``Source``: an item to store (caller id, text and/or decoded image, payload);
   ``dataset_sources`` makes them from a dataset's records.
2. ``embed``: one text forward and one image forward per batch, with any encoder that
   has ``encode_texts`` and ``encode_images`` (a training ``Encoder``, or the gateway's
   ``Embedder`` on its device lane).
3. ``GalleryWriter.write``: upsert by item id (idempotent), tagged with the version and
   the space that embedded it and the item's origin (what a later re-embedding reads),
   and save a thumbnail of every image. A migrating gallery has two sides (one
   collection per space): ``write_sides`` writes one batch to each with one etag.

One payload schema (``payload``): the caller's own keys, then the keys the service fills
when it knows them: ``caption`` (the item's first caption in the ingest language),
``domain``, the record's string attributes (``shape``, ``colour``, ...), and ``source``
(where the original image is, for a later re-embedding).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from service.state.gallery.store import GalleryStore, Item
from service.state.thumbnails import ThumbnailStore, make_thumbnail


@dataclass(frozen=True)
class Source:
    """One item to store: its id, what to embed, and its payload (``payload()``)."""

    id: str
    text: str | None = None
    image: Image.Image | None = None
    payload: Mapping[str, Any] | None = None
    image_uri: str | None = None  # where the original image is kept (``sources``)

    def origin(self) -> dict[str, Any]:
        """What a re-embedding of this item reads: its text and where its image is."""
        out: dict[str, Any] = {}
        if self.text is not None:
            out["text"] = self.text
        if self.image is not None:
            out["image"] = self.image_uri
        return out


class Encodes(Protocol):
    def encode_texts(self, texts: list[str]) -> np.ndarray: ...  # [N, D]

    def encode_images(self, images: list[Image.Image]) -> np.ndarray: ...  # [N, D]


def payload(extra: Mapping[str, Any] | None = None, *, caption: str | None = None,
            domain: str | None = None, attributes: Mapping[str, Any] | None = None,
            source: str | None = None) -> dict[str, Any]:
    """The stored payload: ``extra`` (the caller's), then the service's keys it was given."""
    out = dict(extra or {})
    out.update({k: v for k, v in (attributes or {}).items() if isinstance(v, str)})
    for key, value in (("caption", caption), ("domain", domain), ("source", source)):
        if value is not None:
            out[key] = value
    return out


def record_payload(record: Any, language: str = "en") -> dict[str, Any]:
    """The payload of a dataset record (``training.data`` records)."""
    captions = record.captions.get(language) or []
    image_path = getattr(record, "image_path", None)
    return payload(caption=str(captions[0]) if captions else None, domain=record.domain,
                   attributes=getattr(record, "attributes", None),
                   source=str(image_path) if image_path is not None else None)


def dataset_sources(dataset: Any, indices: Iterable[int], kinds: Collection[str] = ("image",),
                    language: str = "en") -> list[Source]:
    """Sources of a dataset's records: the image and/or the first caption in ``language``."""
    sources = []
    for i in indices:
        record = dataset.records[i]
        image_path = getattr(record, "image_path", None)
        sources.append(Source(record.id, _caption(record, language) if "text" in kinds else None,
                              dataset.load_image(i) if "image" in kinds else None,
                              record_payload(record, language),
                              str(image_path) if image_path is not None else None))
    return sources


def _caption(record: Any, language: str) -> str:
    captions = record.captions.get(language) or []
    if not captions:
        raise ValueError(f"item {record.id!r} has no {language!r} caption to embed as text")
    return str(captions[0])


def embed(encoder: Encodes, sources: Sequence[Source]) -> list[dict[str, np.ndarray]]:
    """Per source, kind -> [D] vector: one text and one image forward for the batch."""
    vectors: list[dict[str, np.ndarray]] = [{} for _ in sources]
    for kind, encode in (("text", encoder.encode_texts), ("image", encoder.encode_images)):
        order = [n for n, s in enumerate(sources) if getattr(s, kind) is not None]
        if order:
            encoded = encode([getattr(sources[n], kind) for n in order])
            for n, vector in zip(order, encoded, strict=True):
                vectors[n][kind] = vector
    return vectors


@dataclass
class GalleryWriter:
    """Writes embedded sources into one gallery, tagged with who embedded them and where."""

    store: GalleryStore
    thumbnails: ThumbnailStore
    gallery: str
    version: str
    space: str
    collection: str | None = None  # default: the gallery's alias

    def write(self, sources: Sequence[Source], vectors: Sequence[Mapping[str, np.ndarray]],
              ) -> int:
        """Upsert by id (a re-run changes nothing), then the thumbnails (an item stored
        without an image loses the thumbnail of the item it replaced)."""
        return write_sides(self.store, self.thumbnails, self.gallery, self.version, sources,
                           [(self.space, self.collection or self.gallery, vectors)])


def write_sides(store: GalleryStore, thumbnails: ThumbnailStore, gallery: str, version: str,
                sources: Sequence[Source],
                sides: Sequence[tuple[str, str, Sequence[Mapping[str, np.ndarray]]]]) -> int:
    """Upsert ``sources`` into every side, (space, collection, per-source vectors), with
    one etag per item shared by the sides; then the thumbnails."""
    etags = [uuid.uuid4().hex for _ in sources]
    for space, collection, vectors in sides:
        items = [Item(s.id, v, s.payload, s.origin(), etag)
                 for s, v, etag in zip(sources, vectors, etags, strict=True)]
        store.upsert(collection, items, version, space)
    thumbnails.replace(gallery, {
        s.id: make_thumbnail(s.image) if s.image is not None else None for s in sources})
    return len(sources)


def ingest_dataset(encoder: Encodes, writer: GalleryWriter, dataset: Any, batch_size: int,
                   kinds: Collection[str] = ("image",), language: str = "en",
                   on_batch: Callable[[int, int], None] | None = None) -> int:
    """Embed and write every record of ``dataset`` in batches; ``on_batch(done, total)``
    after each (progress, cancellation). Returns the number of items written."""
    total = len(dataset)
    for first in range(0, total, batch_size):
        sources = dataset_sources(dataset, range(first, min(first + batch_size, total)), kinds,
                                  language)
        writer.write(sources, embed(encoder, sources))
        if on_batch is not None:
            on_batch(min(first + batch_size, total), total)
    return total
