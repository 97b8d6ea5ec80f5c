"""What a batch of embedded items is handed to: a ``GalleryWriter``, with two backends.

``DirectWriter`` (here) writes into the gallery's Qdrant sides now, under the gallery's
write lock when it is given one: the items API, the gateway's applier, the first-start
bootstrap and the benchmarks. ``SpooledWriter`` (``service.vectors.spool``) is a worker's:
it writes the batch into its job's spool, and the gateway's applier writes it with a
``DirectWriter``. One contract (tests/test_gallery_writer.py runs it on both):

- ``upsert`` (new items, or items replaced by id): every side whose space the batch has
  gets its vectors, with one new etag per item shared by the sides; a space the gallery
  no longer has is skipped (retired since the batch was embedded).
- ``backfill`` (a migration's re-embedding): into the migration's target side while it
  is backfilling, only the items whose etag on the source side is still the one that was
  read, with the source's payload, origin and etag; an item deleted or rewritten since
  is neither resurrected nor overwritten with stale vectors.
- ``transform`` (a migration's gallery-side transform: stored vectors mapped into the
  target's space, no encoder run): into the migration's target side, only the items the
  target side does not hold yet (a re-embedded vector is never replaced by a transformed
  one) and whose source etag is still the one that was read; every point records how it
  was made (``Batch.made``). A backfill later replaces a transformed vector in place.
  Backfill and transform batches are written while the migration is open, whatever its
  state: a progressive switch serves the target side while its backfill goes on.
- ``fill`` (a rerank's read-through fill, ``service.usecases.rerank``: vectors NEW
  embedded for a search): as ``backfill`` (the source's etag must still be the one that
  was read), but never over a vector NEW already embedded on the target side (only where
  it holds nothing or a transformed vector).
- thumbnails: a batch that carries its images replaces the items' thumbnails (an item
  stored without an image loses the thumbnail of the item it replaced).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from service.state.config import Settings
from service.state.gallery.locks import gallery_lock
from service.state.gallery.store import GalleryStore, Item
from service.state.registry import Registry
from service.state.registry.records import GalleryRecord, Migration
from service.state.thumbnails import ThumbnailStore, make_thumbnail

MODES = ("upsert", "backfill", "transform", "fill")


@dataclass
class Batch:
    mode: str  # upsert | backfill | transform
    version: str  # the version that embedded it (transform: into whose space it was mapped)
    # upsert: {"id", "payload", "origin"}; backfill, transform: {"id", "etag"}
    items: list[dict[str, Any]]
    vectors: dict[str, list[dict[str, np.ndarray]]]  # space -> per item: kind -> [D]
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"id", "reason"}
    # Per item, the image its thumbnail is made from (None: it has none); None: the batch
    # leaves thumbnails alone (a backfill, or a spooled batch: its worker made them).
    images: list[Image.Image | None] | None = None
    # How the vectors were made (``service.state.gallery.store.Item.made``); None: embedded
    # by ``version``.
    made: dict[str, Any] | None = None


@dataclass(frozen=True)
class Applied:
    written: int = 0
    skipped: int = 0  # backfill: deleted or rewritten since they were read
    unreadable: tuple[dict[str, str], ...] = ()
    spooled: int = 0  # handed to the applier, written later (SpooledWriter)
    ids: tuple[str, ...] = field(default=(), compare=False)  # backfill, transform, fill: written


@dataclass(frozen=True)
class Sides:
    """Where a gallery's writes go: space -> collection (serving side first), and the open
    migration a backfill writes into (None: no migration)."""

    collections: Mapping[str, str]
    migration: Migration | None = None

    @classmethod
    def of(cls, record: GalleryRecord) -> Sides:
        return cls({s.space: s.collection for s in record.sides()}, record.migration)


class GalleryWriter(ABC):
    """Takes batches of embedded items for one gallery."""

    @abstractmethod
    def write(self, batch: Batch) -> Applied:
        """Hand ``batch`` on (the contract above); what was written now."""


@dataclass
class DirectWriter(GalleryWriter):
    """Writes each batch into the gallery's Qdrant sides now (and its thumbnails)."""

    store: GalleryStore
    thumbnails: ThumbnailStore
    gallery: str
    sides: Callable[[], Sides]  # read under the lock, once per batch
    lock: Callable[[], AbstractContextManager[Any]] = nullcontext

    @classmethod
    def fixed(cls, store: GalleryStore, thumbnails: ThumbnailStore, gallery: str, space: str,
              collection: str | None = None) -> DirectWriter:
        """One side, known up front (default: the gallery's alias), no lock: a gallery
        being built before any gateway serves it (bootstrap, benchmarks)."""
        sides = Sides({space: collection or gallery})
        return cls(store, thumbnails, gallery, lambda: sides)

    @classmethod
    def registered(cls, store: GalleryStore, settings: Settings, registry: Registry,
                   gallery: str) -> DirectWriter:
        """The sides the registry records for ``gallery`` when a batch is written, under
        the gallery's write lock (the gateway's applier)."""
        return cls(store, ThumbnailStore.of(settings), gallery,
                   lambda: Sides.of(registry.gallery(gallery)),
                   lambda: gallery_lock(settings, gallery))

    def write(self, batch: Batch) -> Applied:
        if batch.mode not in MODES:
            raise ValueError(f"batch mode must be one of {MODES}, got {batch.mode!r}")
        with self.lock():
            sides = self.sides()
            applied = (self._upsert(sides, batch) if batch.mode == "upsert"
                       else self._backfill(sides, batch, batch.mode))
            write_thumbnails(self.thumbnails, self.gallery, batch)
        return applied

    def _upsert(self, sides: Sides, batch: Batch) -> Applied:
        etags = [uuid.uuid4().hex for _ in batch.items]
        for space, per_item in batch.vectors.items():
            if space not in sides.collections:
                continue  # that side was retired since the batch was embedded
            items = [Item(i["id"], v, i.get("payload"), i.get("origin"), etag)
                     for i, v, etag in zip(batch.items, per_item, etags, strict=True) if v]
            self.store.upsert(sides.collections[space], items, batch.version, space)
        return Applied(written=len(batch.items), unreadable=tuple(batch.unreadable))

    def _backfill(self, sides: Sides, batch: Batch, mode: str = "backfill") -> Applied:
        m = sides.migration
        if m is None:
            return Applied(skipped=len(batch.items), unreadable=tuple(batch.unreadable))
        per_item = batch.vectors.get(m.target.space, [{} for _ in batch.items])
        wanted = {i["id"]: (i.get("etag"), v)
                  for i, v in zip(batch.items, per_item, strict=True) if v}
        current = self.store.stored(m.source.collection, list(wanted))
        held: set[str] = set()
        if mode != "backfill":  # transform: any vector there wins; fill: NEW's own wins
            on_target = self.store.stored(m.target.collection, list(wanted))
            held = {i for i, t in on_target.items()
                    if mode == "transform" or (t.made or {}).get("by", "embed") == "embed"}
        items = [Item(s.id, wanted[s.id][1], s.payload, s.origin, s.etag, batch.made)
                 for s in current.values() if s.etag == wanted[s.id][0] and s.id not in held]
        if items:
            self.store.upsert(m.target.collection, items, batch.version, m.target.space)
        return Applied(written=len(items), skipped=len(batch.items) - len(items),
                       unreadable=tuple(batch.unreadable), ids=tuple(i.id for i in items))


def write_thumbnails(thumbnails: ThumbnailStore, gallery: str, batch: Batch) -> None:
    """Replace the thumbnails of a batch that carries its images; else nothing."""
    if batch.images is not None:
        thumbnails.replace(gallery, {
            i["id"]: make_thumbnail(image) if image is not None else None
            for i, image in zip(batch.items, batch.images, strict=True)})
