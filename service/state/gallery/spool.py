"""Vectors computed by workers, on their way into the gallery store.

Workers never open Qdrant: the process that owns the gallery store (the gateway; the
embedded Qdrant allows one process per path) applies what they write here, the same way
on the embedded default and on a server. A job's spool is a folder of batch files in its
work directory on the shared volume; each file is written atomically and named so that
their order is the order to apply them in.

Two modes: ``upsert`` (an ``ingest`` job: new items, one vector set per side of the
gallery) and ``backfill`` (a migration: existing items re-embedded into the target side;
each carries the etag of the stored item it was read from, and is written only if the
item still has that etag, so an item deleted or rewritten meanwhile is neither resurrected
nor overwritten with stale vectors).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.state.gallery.store import GalleryStore, Item
from service.state.registry.records import GalleryRecord

SPOOL = "spool"
MODES = ("upsert", "backfill")


@dataclass
class Batch:
    mode: str
    version: str  # the version that embedded it
    # upsert: {"id", "payload", "origin"}; backfill: {"id", "etag"}
    items: list[dict[str, Any]]
    vectors: dict[str, list[dict[str, np.ndarray]]]  # space -> per item: kind -> [D]
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"id", "reason"}


@dataclass(frozen=True)
class Applied:
    written: int = 0
    skipped: int = 0  # backfill: deleted or rewritten since they were read
    unreadable: tuple[dict[str, str], ...] = ()


def write_batch(work: Path, name: str, batch: Batch) -> Path:
    """``work/spool/<name>.npz``, atomically. ``work`` must exist (a finished job's work
    directory is gone, and a late batch of it must not bring it back)."""
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
            "spaces": sorted(batch.vectors), "unreadable": batch.unreadable}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = folder / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    final = folder / f"{name}.npz"
    os.replace(tmp, final)
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
    return Batch(meta["mode"], meta["version"], meta["items"], vectors, meta["unreadable"])


def apply_batch(store: GalleryStore, record: GalleryRecord, batch: Batch) -> Applied:
    """Write a batch into the gallery's sides (the caller holds the gallery's write lock).

    upsert: each side whose space the batch has gets its vectors (one etag per item).
    backfill: into the migration's target side, the items whose etag on the source side
    is still the one the worker read, with the source's payload and origin."""
    sides = {s.space: s.collection for s in record.sides()}
    if batch.mode == "upsert":
        etags = [uuid.uuid4().hex for _ in batch.items]
        for space, per_item in batch.vectors.items():
            if space not in sides:
                continue  # that side was retired since the worker embedded the batch
            items = [Item(i["id"], v, i.get("payload"), i.get("origin"), etag)
                     for i, v, etag in zip(batch.items, per_item, etags, strict=True) if v]
            store.upsert(sides[space], items, batch.version, space)
        return Applied(written=len(batch.items), unreadable=tuple(batch.unreadable))
    m = record.migration
    if m is None or m.state != "backfilling":
        return Applied(skipped=len(batch.items), unreadable=tuple(batch.unreadable))
    per_item = batch.vectors.get(m.target.space, [{} for _ in batch.items])
    wanted = {i["id"]: (i.get("etag"), v) for i, v in zip(batch.items, per_item, strict=True)
              if v}
    current = store.stored(m.source.collection, list(wanted))
    items = [Item(s.id, wanted[s.id][1], s.payload, s.origin, s.etag)
             for s in current.values() if s.etag == wanted[s.id][0]]
    if items:
        store.upsert(m.target.collection, items, batch.version, m.target.space)
    return Applied(written=len(items), skipped=len(batch.items) - len(items),
                   unreadable=tuple(batch.unreadable))


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
