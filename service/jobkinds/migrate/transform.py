"""A migration's gallery-side transform (``transform: true``), in three parts:

- ``write_snapshot`` (the gateway, when the migration starts, after listing the items
  under the write lock): every stored vector of the source side, into the job's work
  directory (workers never open Qdrant).
- the ``transform`` shard (a worker): NEW embeds the sample's sources (those real vectors
  are spooled as a backfill: the first items re-embedded), fits the per-modality maps OLD
  -> NEW and the order's error predictor on them (``training.upgrades.transform``),
  spools every other item's mapped vectors as ``transform`` batches (the gateway writes
  them only where the target side has no vector yet, so a re-embedded vector always
  wins), writes the backfill order of the remaining items, and simulates the migration on
  the validation set (``validation_curve``): the side as it would stand at each fraction
  against the route that serves now, which decides a progressive switch.
- ``read_order`` (the gateway, when the transform is done): the backfill's items in order.

A killed transform shard is queued again and starts over: what it spooled is the same
upserts again, and a transformed vector never replaces a re-embedded one.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.jobkinds.base import RunContext
from service.jobkinds.migrate.backfill import _gallery_version
from service.jobkinds.migrate.params import MigrateParams
from service.state.gallery.store import KINDS, GalleryStore
from service.state.jobs.shards import read_items
from service.state.paths import Roots
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from service.vectors.backfill import OriginReader, backfill_shard, read_ahead
from service.vectors.sources import SourceStore
from service.vectors.spool import SpooledWriter
from service.vectors.writer import Applied, Batch, GalleryWriter

SNAPSHOT = "old-vectors.npz"
ORDER = "order.json"
TRANSFORM_DIR = "transform"
CHUNK = 2048  # items per spooled transform batch
GRID = tuple(round(0.05 * k, 2) for k in range(21))  # fractions the validation curve has
EXTRA = (0.01,)


# ------------------------------------------------------------------ snapshot (gateway)
def write_snapshot(store: GalleryStore, collection: str, listed: list[dict[str, Any]],
                   work: Path) -> int:
    """The stored vectors of the ``listed`` items of ``collection`` into
    ``work/old-vectors.npz`` (ids, the etags the listing read, and per kind the rows that
    have a vector and the vectors); the items written. An item rewritten since it was
    listed keeps its listed etag: its transform is then skipped (its write reached the
    target side itself)."""
    etag_of = {i["id"]: i.get("etag") for i in listed}
    ids: list[str] = []
    rows: dict[str, list[int]] = {k: [] for k in KINDS}
    mats: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
    for page_ids, vectors in store.scan_vectors(collection):
        for row, item in enumerate(page_ids):
            if item not in etag_of:
                continue  # written after the listing: both sides have it already
            for kind in KINDS:
                if row in vectors[kind]:
                    rows[kind].append(len(ids))
                    mats[kind].append(vectors[kind][row])
            ids.append(item)
    meta = {"ids": ids, "etags": [etag_of[i] for i in ids]}
    arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    for kind in KINDS:
        arrays[f"{kind}_rows"] = np.asarray(rows[kind], np.int64)
        arrays[kind] = (np.stack(mats[kind]).astype(np.float32) if mats[kind]
                        else np.zeros((0, 0), np.float32))
    work.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=work, suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, work / SNAPSHOT)
    return len(ids)


def read_snapshot(work: Path) -> tuple[list[str], dict[str, str | None],
                                       dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(ids, id -> listed etag, kind -> (rows [M], vectors [M, D]))."""
    with np.load(work / SNAPSHOT) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        return (list(meta["ids"]), dict(zip(meta["ids"], meta["etags"], strict=True)),
                {k: (data[f"{k}_rows"], data[k]) for k in KINDS})


def write_order(work: Path, order: str, ids: list[str]) -> None:
    fd, tmp = tempfile.mkstemp(dir=work, suffix=".json.tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump({"order": order, "ids": ids}, fh)
    os.replace(tmp, work / ORDER)


def read_order(work: Path) -> list[str]:
    return list(json.loads((work / ORDER).read_text())["ids"])


# ------------------------------------------------------------------ the shard (worker)
class _Collecting(GalleryWriter):
    """Hands each batch on and keeps its vectors in ``space`` by item id."""

    def __init__(self, inner: GalleryWriter, space: str) -> None:
        self.inner, self.space, self.vectors = inner, space, {}

    def write(self, batch: Batch) -> Applied:
        for item, v in zip(batch.items, batch.vectors.get(self.space, []), strict=True):
            if v:
                self.vectors[item["id"]] = v
        return self.inner.write(batch)


def run_transform(ctx: RunContext) -> dict[str, Any]:
    from training.upgrades.transform import fit_transform
    from training.upgrades.transform.order import order_items
    from training.versions import load_encoder

    assert ctx.shard is not None
    shard, p = ctx.shard, ctx.params
    assert isinstance(p, MigrateParams)
    work = ctx.store.work_dir(ctx.job.id)
    registry = Registry(ctx.settings.registry_dir)
    record = registry.gallery(ctx.job.gallery)
    m = record.migration
    if m is None or m.job != ctx.job.id:
        raise RuntimeError(f"gallery '{ctx.job.gallery}' has no migration of job {ctx.job.id}")
    space, version = m.target.space, m.version
    start = time.monotonic()
    sample = read_items(work, shard)
    ids, etags, old = read_snapshot(work)
    encoder = load_encoder(registry.artifact(version), space, ctx.settings.device)
    writer = SpooledWriter(work, ThumbnailStore.of(ctx.settings), ctx.job.gallery,
                           f"{shard:04d}-", 0)
    collect = _Collecting(writer, space)
    reader = OriginReader(SourceStore.of(ctx.settings), Roots.of(ctx.settings),
                          encoder.image_tensors)
    ctx.heartbeat.advance(0, {"stage": "transform: embedding the sample"})
    backfill_shard(encoder, reader, sample, 0, p.batch_size,
                   read_ahead(ctx.settings.migration_read_ahead, encoder.device), version,
                   space, collect, lambda pos, n: ctx.heartbeat.advance(pos, {
                       "stage": "transform: embedding the sample"}))
    embed_s = time.monotonic() - start
    ctx.heartbeat.advance(len(sample), {"stage": "transform: fitting"})
    position = {item: n for n, item in enumerate(ids)}
    pairs_old: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
    pairs_new: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
    lookup = {k: dict(zip(old[k][0].tolist(), range(len(old[k][0])))) for k in KINDS}
    for item, vectors in collect.vectors.items():
        row = position.get(item)
        for kind, v in vectors.items():
            at = lookup[kind].get(row) if row is not None else None
            if at is not None:
                pairs_old[kind].append(old[kind][1][at])
                pairs_new[kind].append(v)
    cfg = p.transform_settings()
    fitted = fit_transform({k: np.stack(v) for k, v in pairs_old.items() if v},
                           {k: np.stack(v) for k, v in pairs_new.items() if v}, cfg)
    fitted.save(work / TRANSFORM_DIR)
    made = {"by": "transform", "version": version, "from_space": m.source.space,
            "map": f"{cfg.method}{f' x{cfg.ensemble}' if cfg.ensemble > 1 else ''} fitted by "
                   f"job {ctx.job.id} on {len(collect.vectors)} items"}
    ctx.heartbeat.advance(len(sample), {"stage": "transform: mapping the stored vectors"})
    t0 = time.monotonic()
    # A sampled item whose source could not be read is transformed like the others.
    rest, scores, transformed = _map_all(fitted, ids, old, set(collect.vectors), etags,
                                         version, space, made, writer)
    map_s = time.monotonic() - t0
    sampled = {i["id"] for i in sample}
    keep = [n for n, i in enumerate(rest) if i not in sampled]  # the sample was tried once
    order = order_items(p.order, [rest[n] for n in keep], scores[keep], seed=p.seed)
    write_order(work, p.order, [rest[keep[n]] for n in order])
    ctx.heartbeat.advance(len(sample), {"stage": "transform: validation curve"})
    curve = validation_curve(ctx, record, fitted, p)
    return {"result": {"transform": {
        "method": cfg.method, "ensemble": cfg.ensemble, "sample": len(sample),
        "sample_embedded": len(collect.vectors), "transformed_items": transformed,
        "made": made, "metrics": fitted.metrics, "embed_seconds": round(embed_s, 2),
        "map_seconds": round(map_s, 2)}, "order": p.order, **curve}}


def _map_all(fitted: Any, ids: list[str], old: dict[str, tuple[np.ndarray, np.ndarray]],
             sampled: set[str], etags: dict[str, str | None], version: str, space: str,
             made: dict[str, Any], writer: GalleryWriter,
             ) -> tuple[list[str], np.ndarray, int]:
    """Spool every listed, unsampled item's mapped vectors; (those ids, their predicted
    errors, how many were spooled)."""
    rest = [i for i in ids if i not in sampled and i in etags]
    keep = {i: n for n, i in enumerate(rest)}
    per_item: list[dict[str, np.ndarray]] = [{} for _ in rest]
    scores = np.zeros(len(rest), np.float64)
    for kind in fitted.kinds:
        rows, vectors = old[kind]
        chosen = [(keep[ids[r]], n) for n, r in enumerate(rows.tolist()) if ids[r] in keep]
        if not chosen:
            continue
        where = np.asarray([c[0] for c in chosen])
        src = vectors[np.asarray([c[1] for c in chosen])]
        mapped = fitted.apply(kind, src)
        scores[where] += fitted.predicted_error(kind, src, mapped)
        for at, v in zip(where.tolist(), mapped, strict=True):
            per_item[at][kind] = v
    for start in range(0, len(rest), CHUNK):
        chunk = rest[start:start + CHUNK]
        writer.write(Batch("transform", version, [{"id": i, "etag": etags[i]} for i in chunk],
                           {space: per_item[start:start + CHUNK]}, made=made))
    return rest, scores, len(rest)


# ------------------------------------------------------------------ validation curve
def validation_curve(ctx: RunContext, record: Any, fitted: Any, p: MigrateParams,
                     ) -> dict[str, Any]:
    """The migration simulated on the validation set, the way the gallery's items go: each
    item's OLD vectors (by the version that embedded the gallery) transformed, then
    re-embedded by NEW in the backfill's order, at each fraction; against the route
    (NEW's query into the source space, what serves now) and OLD->OLD. Where it would
    switch progressively: the first fraction from which the side beats the route in
    both directions (and keeps to the negative-flip bound, when one is set)."""
    from training.upgrades.transform.order import order_items
    from training.upgrades.transform.simulate import Items, Queries, curve, share, switch_fraction
    from training.versions import load_encoder

    m = record.migration
    validation = p.validation or record.validation
    if validation is None:
        return {"curve": None, "switch_at": None, "curve_note": f"gallery '{record.name}' "
                "has no validation set: no curve, no progressive switch"}
    registry = Registry(ctx.settings.registry_dir)
    dataset = ctx.open_dataset(validation, "validation")
    old_art = registry.artifact(_gallery_version(
        registry, ctx.job.result.get("embedded_by") or {}, record.history, m.source.space))
    target = registry.artifact(m.version)
    device = ctx.settings.device
    old_enc = load_encoder(old_art, m.source.space, device)
    new_enc = load_encoder(target, m.target.space, device)
    routed_enc = load_encoder(target, m.source.space, device)
    language = "en" if "en" in dataset.languages() else dataset.languages()[0]
    texts, owners = dataset.captions(language)
    first_of: dict[int, int] = {}
    for c, owner in enumerate(owners):
        first_of.setdefault(owner, c)
    first = [first_of[n] for n in range(len(dataset))]  # each item's stored caption
    images = [dataset.load_image(n) for n in range(len(dataset))]
    captions = [texts[c] for c in first]
    item_old = {"image": old_enc.encode_images(images), "text": old_enc.encode_texts(captions)}
    item_new = {"image": new_enc.encode_images(images), "text": new_enc.encode_texts(captions)}
    transformed = {k: fitted.apply(k, item_old[k]) for k in fitted.kinds}
    for k in KINDS:  # a kind without a map (no pairs of it): its transform is missing
        transformed.setdefault(k, np.zeros_like(item_new[k]))
    scores = sum(fitted.predicted_error(k, item_old[k], transformed[k]) for k in fitted.kinds)
    names = [r.id for r in dataset.records]
    order = order_items(p.order, names, scores, seed=p.seed)
    rel = dataset.relevance(language)  # [captions, images]
    queries = Queries(
        new={"text": new_enc.encode_texts(texts), "image": item_new["image"]},
        routed={"text": routed_enc.encode_texts(texts), "image": routed_enc.encode_images(images)},
        old={"text": old_enc.encode_texts(texts), "image": item_old["image"]},
        relevant={"t2i": rel, "i2t": rel[first].T})
    grid = sorted({*GRID, *EXTRA})
    hits = curve(Items(item_old, item_new, transformed), queries, {p.order: order}, grid,
                 hybrid=False)
    bound = ctx.settings.gate_max_negative_flip
    points = []
    for f in grid:
        key = f"side {p.order} {f:g}"
        points.append({"fraction": f, **{d: {
            "side": round(float(hits[key][d].mean()), 4),
            "share": _rounded(share(hits, key, d, boot=200))} for d in ("t2i", "i2t")}})
    routed = {d: {"R@1": round(float(hits["routed"][d].mean()), 4),
                  "share": _rounded(share(hits, "routed", d, boot=200))} for d in ("t2i", "i2t")}
    return {"curve": points, "routed": routed,
            "switch_at": switch_fraction(hits, p.order, grid, bound),
            "curve_validation": {"path": validation, "items": len(dataset),
                                 "queries": {"t2i": len(texts), "i2t": len(dataset)},
                                 "max_negative_flip": bound}}


def _rounded(value: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (round(v, 4) if v is not None else None) for k, v in value.items()}
