"""The one way items get into a gallery, whichever path stores them (the items API, an
``ingest`` job, the first-start bootstrap, the serving benchmark's gallery):

1. ``Source``: an item to store (caller id, text and/or decoded image, payload);
   ``dataset_sources`` makes them from a dataset's records.
2. ``service.vectors.embed.embed``: one text forward and one image forward per batch, into
   each space the gallery has a side in (one side; two during a migration).
3. ``upserts``: the batch to write, tagged with the version that embedded it, each
   item's origin (what a later re-embedding reads) and its image (for the thumbnail);
   a ``GalleryWriter`` writes it: directly, or through a worker's spool
   (``service.vectors.writer``). ``ingest_dataset`` runs the three over a dataset.

One payload schema (``payload``): the caller's own keys, then the keys the service fills
when it knows them: ``caption`` (the item's first caption in the ingest language),
``domain``, the record's string attributes (``shape``, ``colour``, ...), and ``source``
(where the original image is, for a later re-embedding).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from service.vectors.embed import Encodes, embed
from service.vectors.writer import Batch, GalleryWriter


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


def upserts(version: str, sources: Sequence[Source],
            vectors: Mapping[str, Sequence[Mapping[str, np.ndarray]]]) -> Batch:
    """The batch that stores ``sources`` (upsert by id: a re-run changes nothing), with
    ``vectors`` (space -> per source, kind -> [D]) embedded by ``version``."""
    return Batch("upsert", version,
                 [{"id": s.id, "payload": s.payload, "origin": s.origin()} for s in sources],
                 {space: [dict(v) for v in per_source] for space, per_source in vectors.items()},
                 images=[s.image for s in sources])


def ingest_dataset(encoders: Mapping[str, Encodes], version: str, writer: GalleryWriter,
                   dataset: Any, batch_size: int, kinds: Collection[str] = ("image",),
                   language: str = "en",
                   on_batch: Callable[[int, int], None] | None = None) -> int:
    """Embed every record of ``dataset`` in batches with ``version``'s encoder into each
    space (``encoders``: space -> encoder) and hand each batch to ``writer``;
    ``on_batch(done, total)`` after each (progress, cancellation). Returns the number of
    items written."""
    total = len(dataset)
    for first in range(0, total, batch_size):
        sources = dataset_sources(dataset, range(first, min(first + batch_size, total)), kinds,
                                  language)
        writer.write(upserts(version, sources, {space: embed(encoder, sources)
                                                for space, encoder in encoders.items()}))
        if on_batch is not None:
            on_batch(min(first + batch_size, total), total)
    return total
