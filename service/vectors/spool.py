"""The spooled backend of ``GalleryWriter``: vectors computed by workers, on their way
into the gallery store.

Workers never open Qdrant: the process that owns the gallery store (the gateway; the
embedded Qdrant allows one process per path) applies what they write here, the same way
on the embedded default and on a server. A job's spool is a folder of batch files in its
work directory on the shared volume; each file is written atomically and named so that
their order is the order to apply them in. The gateway's applier reads each batch and
writes it with a ``DirectWriter`` (``service.vectors.writer``: the contract, both modes).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.state.thumbnails import ThumbnailStore
from service.vectors.writer import MODES, Applied, Batch, GalleryWriter, write_thumbnails

SPOOL = "spool"


@dataclass
class SpooledWriter(GalleryWriter):
    """Writes each batch's thumbnails (they need its images, which the spool does not
    keep), then the batch into ``work``'s spool, named ``<prefix><position:09d>``:
    ``position`` is the index of the batch's first item, and advances by its items.
    ``durable`` (the ``power`` durability level): each file is on disk before ``write``
    returns, so a batch a worker has handed over survives a power cut."""

    work: Path  # the job's work directory
    thumbnails: ThumbnailStore
    gallery: str
    prefix: str = ""
    position: int = 0
    durable: bool = False

    def write(self, batch: Batch) -> Applied:
        write_thumbnails(self.thumbnails, self.gallery, batch)
        write_batch(self.work, f"{self.prefix}{self.position:09d}", batch, self.durable)
        self.position += len(batch.items)
        return Applied(spooled=len(batch.items))


def write_batch(work: Path, name: str, batch: Batch, durable: bool = False) -> Path:
    """``work/spool/<name>.npz``, atomically (and on disk, file and folder, when
    ``durable``). ``work`` must exist (a finished job's work directory is gone, and a
    late batch of it must not bring it back)."""
    if batch.mode not in MODES:
        raise ValueError(f"spool mode must be one of {MODES}, got {batch.mode!r}")
    folder = work / SPOOL
    folder.mkdir(exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for space, per_item in batch.vectors.items():
        kinds = sorted({k for vectors in per_item for k in vectors})
        for kind in kinds:
            rows = [n for n, vectors in enumerate(per_item) if kind in vectors]
            arrays[f"{space}|{kind}|rows"] = np.asarray(rows, dtype=np.int64)
            arrays[f"{space}|{kind}"] = np.stack([per_item[n][kind] for n in rows]).astype(
                np.float32)
    meta = {"mode": batch.mode, "version": batch.version, "items": batch.items,
            "spaces": sorted(batch.vectors), "unreadable": batch.unreadable,
            "made": batch.made}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = folder / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    final = folder / f"{name}.npz"
    os.replace(tmp, final)
    if durable:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return final


def pending(work: Path) -> list[Path]:
    """The batch files not applied yet, in the order to apply them."""
    folder = work / SPOOL
    return sorted(folder.glob("*.npz")) if folder.is_dir() else []


def read_batch(path: Path) -> Batch:
    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        vectors: dict[str, list[dict[str, np.ndarray]]] = {
            space: [{} for _ in meta["items"]] for space in meta["spaces"]}
        for key in data.files:
            parts = key.split("|")
            if len(parts) != 2:
                continue
            space, kind = parts
            for row, vector in zip(data[f"{key}|rows"], data[key], strict=True):
                vectors[space][int(row)][kind] = vector
    return Batch(meta["mode"], meta["version"], meta["items"], vectors, meta["unreadable"],
                 made=meta.get("made"))
