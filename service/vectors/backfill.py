"""A migration's re-embedding (its backfill), one shard at a time: read each item's
origin (its text, its kept or manifest image: ``service.vectors.sources``), embed it
with the target version natively through the one embed function, and hand each batch to
a ``GalleryWriter`` as a ``backfill`` (written only where the item still has the etag
that was read: ``service.vectors.writer``). The worker's writer is a ``SpooledWriter``.
A source that cannot be read is reported by item id, not fatal.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from service.state.paths import Roots
from service.vectors.embed import EncodesTensors, Pixels, embed
from service.vectors.sources import SourceStore, open_origin_image
from service.vectors.writer import Batch, GalleryWriter

if TYPE_CHECKING:
    import torch


def origin_of(kinds: Sequence[str], origin: Mapping[str, Any],
              payload: Mapping[str, Any]) -> dict[str, Any]:
    """What re-embedding an item reads: its stored origin, or for an item stored before
    origins were kept, its payload's ``caption`` and ``source`` where it had those kinds."""
    if origin:
        return dict(origin)
    out: dict[str, Any] = {}
    if "text" in kinds and isinstance(payload.get("caption"), str):
        out["text"] = payload["caption"]
    if "image" in kinds and isinstance(payload.get("source"), str):
        out["image"] = payload["source"]
    return out


def read_ahead(setting: int | None, device: Any) -> int:
    """Batches to read ahead of the forward: the setting, else 1 on CUDA (the forward leaves
    the CPU to the reader) and 0 on the CPU, where a reader thread takes the cores the
    forward's threads spin on: measured on 2 cores, in line 1,499 items/s at 1.13 CPU-ms
    an item, one batch ahead 1,349 items/s at 1.39 CPU-ms (README, bench migrate)."""
    if setting is not None:
        return setting
    return 1 if str(device).startswith("cuda") else 0


def backfill_shard(encoder: EncodesTensors, reader: OriginReader, items: list[dict[str, Any]],
                   cursor: int, batch_size: int, ahead: int, version: str, space: str,
                   writer: GalleryWriter, on_batch: Callable[[int, int, int], None],
                   skip: Callable[[], set[str]] | None = None) -> None:
    """Re-embed ``items[cursor:]`` (``{"id", "etag", "kinds", "origin"}``, as the migration
    listed them) in batches into ``space`` with ``version``'s ``encoder``, each handed to
    ``writer``; ``on_batch(position, items, skipped)`` after each (the next item to read,
    the batch's items, how many of them were skipped): the caller saves its cursor
    there, reports progress, paces. ``skip()``: ids not to embed (already filled by
    reads), read as each batch is loaded."""
    for first, loaded in reader.batches(items, cursor, batch_size, ahead, skip):
        chunk = items[first:first + batch_size]
        kept = loaded["items"]
        if kept:
            vectors = embed(Pixels(encoder, loaded["pixels"]), _rows(loaded))
            writer.write(Batch("backfill", version,
                               [{"id": i["id"], "etag": i.get("etag")} for i in kept],
                               {space: vectors}, list(loaded["unreadable"])))
        on_batch(first + len(chunk), len(chunk), len(chunk) - len(kept))


@dataclass(frozen=True)
class _Row:
    """One item of a loaded batch, as ``embed`` reads it: its image is its row in the
    batch's preprocessed pixels."""

    text: str | None
    image: int | None


def _rows(loaded: dict[str, Any]) -> list[_Row]:
    image_of = {row: k for k, row in enumerate(loaded["image_rows"])}
    return [_Row(loaded["texts"].get(n), image_of.get(n)) for n in range(loaded["n"])]


class OriginReader:
    """Reads, decodes and preprocesses a batch's origins: ``ahead`` batches ahead of the
    forward in a thread (decoding and the forward release the GIL), or in line (0)."""

    def __init__(self, sources: SourceStore, roots: Roots,
                 to_pixels: Callable[[list[Image.Image]], torch.Tensor]) -> None:
        self.sources, self.roots, self.to_pixels = sources, roots, to_pixels

    def batches(self, items: list[dict[str, Any]], cursor: int, size: int, ahead: int = 0,
                skip: Callable[[], set[str]] | None = None,
                ) -> Iterator[tuple[int, dict[str, Any]]]:
        starts = iter(range(cursor, len(items), size))

        def load(first: int) -> dict[str, Any]:
            chunk = items[first:first + size]
            skipped = skip() if skip is not None else set()
            return self.load([i for i in chunk if i["id"] not in skipped])

        if ahead <= 0:
            for first in starts:
                yield first, load(first)
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="backfill-read")
        try:
            reading = deque((first, pool.submit(load, first))
                            for first in itertools.islice(starts, ahead))
            while reading:
                first, loaded = reading.popleft()
                nxt = next(starts, None)
                if nxt is not None:
                    reading.append((nxt, pool.submit(load, nxt)))
                yield first, loaded.result()
        finally:  # stopped (cancelled, failed): what was not started is dropped
            pool.shutdown(wait=True, cancel_futures=True)

    def load(self, chunk: list[dict[str, Any]]) -> dict[str, Any]:
        """Per item of ``chunk`` (``items``), its text and preprocessed image where it has
        them; unreadable ids."""
        texts: dict[int, str] = {}
        images: dict[int, Image.Image] = {}
        unreadable: list[dict[str, str]] = []
        for n, item in enumerate(chunk):
            origin = item.get("origin") or {}
            missing = [k for k in item.get("kinds") or () if not origin.get(k)]
            if missing:
                unreadable.append({"id": item["id"], "reason": f"no {'/'.join(missing)} "
                                   f"source was kept for this item"})
                continue
            try:
                if origin.get("image"):
                    images[n] = open_origin_image(str(origin["image"]), self.sources, self.roots)
            except Exception as exc:  # noqa: BLE001 - reported per item, the shard goes on
                unreadable.append({"id": item["id"], "reason": f"image source "
                                   f"{str(origin['image'])[:200]!r}: {type(exc).__name__}: "
                                   f"{str(exc)[:200]}"})
                continue
            if origin.get("text"):
                texts[n] = str(origin["text"])
        rows = sorted(images)
        pixels = self.to_pixels([images[r] for r in rows]) if rows else None  # [k, 3, H, W]
        return {"n": len(chunk), "items": chunk, "texts": texts, "image_rows": rows,
                "pixels": pixels, "unreadable": unreadable}
