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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.jobkinds.base import RunContext
from service.jobkinds.migrate import record as records
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
LISTING = "listing.json"  # a transformed migration's listed items, planned after the transform
VALIDATION = "validation.npz"  # the curve's inputs, for the checks after a switch
DISTRACTORS = 5000  # gallery items per kind the curve adds (at most the sample's size)
BOOT = 200
SWITCH_RULE = ("switch at the first fraction from which the side beats the route beyond the "
               "paired error (one-sided bootstrap test at 5%, items resampled) in every "
               "direction the gallery serves, there and at every later fraction, on the "
               "validation set among distractors drawn from the gallery")


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
                           f"{shard:04d}-", 0, ctx.settings.qdrant_durability == "power")
    collect = _Collecting(writer, space)
    reader = OriginReader(SourceStore.of(ctx.settings), Roots.of(ctx.settings),
                          encoder.image_tensors)
    ctx.heartbeat.advance(0, {"stage": "transform: embedding the sample"})
    backfill_shard(encoder, reader, sample, 0, p.batch_size,
                   read_ahead(ctx.settings.migration_read_ahead, encoder.device), version,
                   space, collect, lambda pos, n, skipped: ctx.heartbeat.advance(pos, {
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
    folder = records.folder(ctx.store, ctx.job.id)  # the migration's files, beyond its job
    write_order(folder, p.order, [rest[keep[n]] for n in order])
    ctx.heartbeat.advance(len(sample), {"stage": "transform: validation curve"})
    distractors = gallery_distractors(fitted, ids, old, collect.vectors, DISTRACTORS, p.seed)
    curve = validation_curve(ctx, record, fitted, p, distractors)
    records.write_json(folder / records.TRANSFORMED, {"transform": {
        "method": cfg.method, "ensemble": cfg.ensemble, "sample": len(sample),
        "sample_embedded": len(collect.vectors), "transformed_items": transformed,
        "made": made, "metrics": fitted.metrics, "embed_seconds": round(embed_s, 2),
        "map_seconds": round(map_s, 2)}, **curve})
    return {}


def _embedded_by(ctx: RunContext) -> dict[str, int]:
    """How many listed items each version embedded (the migration's record)."""
    state = records.load(ctx.store, ctx.job.id)
    return state.embedded_by if state is not None else {}


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
                     distractors: Distractors) -> dict[str, Any]:
    """The migration simulated on the validation set plus distractors from the gallery
    itself, the way the gallery's items go: each validation item's OLD vectors (by the
    version that embedded the gallery) transformed, then re-embedded by NEW in the
    backfill's order, at each fraction, among ``distractors`` (gallery items in the same
    states: ``Distractors``); against the route that serves now (NEW's query into the
    source space, over the validation items' and the distractors' OLD vectors) and
    OLD->OLD. Only the directions the gallery serves are scored (t2i: it holds images;
    i2t: it holds captions). The switch point: the first fraction from which the side
    beats the route beyond the paired error (one-sided test at 5%, items resampled) in
    every served direction, there and at every later fraction (``switch_fraction``).
    The inputs are kept in the migration's folder for the checks after a switch."""
    from training.upgrades.transform.simulate import curve, share, switch_fraction

    validation = p.validation or record.validation
    if validation is None:
        return {"curve": None, "switch_at": None, "curve_note": f"gallery '{record.name}' "
                "has no validation set: no curve, no progressive switch"}
    served = distractors.directions()
    sim = _simulation(ctx, record, fitted, p, validation, distractors)
    grid = sorted({*GRID, *EXTRA})
    hits = curve(sim.items, sim.queries, {p.order: sim.order}, grid, hybrid=False)
    units = {d: sim.units[d] for d in served}
    bound = ctx.settings.gate_max_negative_flip
    points = [{"fraction": f, **{d: {
        "side": round(float(hits[f"side {p.order} {f:g}"][d].mean()), 4),
        "share": _rounded(share(hits, f"side {p.order} {f:g}", d, boot=BOOT,
                                units=units[d]))} for d in served}} for f in grid]
    routed = {d: {"R@1": round(float(hits["routed"][d].mean()), 4),
                  "share": _rounded(share(hits, "routed", d, boot=BOOT, units=units[d]))}
              for d in served}
    sim.save(records.folder(ctx.store, ctx.job.id) / VALIDATION, p.order, served)
    return {"curve": points, "routed": routed, "curve_directions": served,
            "switch_at": switch_fraction(hits, p.order, grid, bound, directions=served,
                                         units=units),
            "curve_validation": {"path": validation, "items": sim.n_items,
                                 "distractors": distractors.size(),
                                 "queries": {d: len(sim.units[d]) for d in served},
                                 "max_negative_flip": bound, "directions": served,
                                 "rule": SWITCH_RULE}}


@dataclass
class Distractors:
    """Gallery items standing in for the rest of the gallery in the validation curve, per
    kind: row ``j`` is re-embedded (``new``: NEW's vector of a sampled item, which NEW
    embedded) or transformed (``transformed``: the map applied to the stored OLD vector
    of an item outside the sample, so its error is the one the gallery's items carry),
    and ``old`` (that item's stored vector: what the route searches). Each row is a
    random item of the gallery in one state or the other; ``order`` re-embeds them at
    the backfill's pace."""

    old: dict[str, np.ndarray]
    new: dict[str, np.ndarray]
    transformed: dict[str, np.ndarray]
    scores: dict[str, np.ndarray]  # predicted error of each transformed row (learned order)

    def size(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.old.items()}

    def directions(self) -> list[str]:
        """The directions the gallery serves: t2i when it holds images, i2t captions."""
        from training.upgrades.transform.simulate import DIRECTIONS

        return [d for d, (_, ik) in DIRECTIONS.items() if self.size().get(ik, 0) > 0]


def gallery_distractors(fitted: Any, ids: list[str],
                        old: dict[str, tuple[np.ndarray, np.ndarray]],
                        sampled: dict[str, dict[str, list[float]]], limit: int,
                        seed: int) -> Distractors:
    """Per kind, up to ``limit`` pairs (a sampled item's NEW vector, another item's
    stored vector and its transform), drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    out = Distractors({}, {}, {}, {})
    for kind in KINDS:
        rows, vectors = old[kind]
        if not len(rows) or kind not in fitted.kinds:
            continue  # the gallery holds no vector of this kind (or none was paired)
        new = [np.asarray(v[kind], np.float32) for v in sampled.values() if kind in v]
        rest = [n for n, r in enumerate(rows.tolist()) if ids[r] not in sampled]
        size = min(limit, len(new), len(rest))
        picked_new = rng.permutation(len(new))[:size]
        picked_old = vectors[np.asarray(rest, np.int64)[rng.permutation(len(rest))[:size]]]
        out.old[kind] = picked_old.astype(np.float32)
        out.new[kind] = (np.stack([new[n] for n in picked_new]) if size else
                         np.zeros((0, fitted.apply(kind, vectors[:1]).shape[1]), np.float32))
        out.transformed[kind] = fitted.apply(kind, picked_old)
        out.scores[kind] = fitted.predicted_error(kind, picked_old, out.transformed[kind])
    return out


@dataclass
class Simulation:
    """What the validation curve scores, kept so the live check scores the same queries:
    items (validation rows, then distractor rows, per kind), the order over them, the
    queries and relevance (distractors never relevant), units per direction."""

    items: Any  # simulate.Items
    queries: Any  # simulate.Queries
    order: dict[str, list[int]]  # per kind, over the joined rows
    units: dict[str, np.ndarray]
    n_items: int  # validation items (the first rows of every kind)

    def save(self, path: Path, order: str, served: list[str]) -> None:
        arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps({
            "order": order, "served": served, "n_items": self.n_items}).encode(), np.uint8)}
        for k in self.items.old:
            for state in ("old", "new", "transformed"):
                arrays[f"item_{state}_{k}"] = getattr(self.items, state)[k][:self.n_items]
            arrays[f"order_{k}"] = np.asarray(
                [r for r in self.order[k] if r < self.n_items], np.int64)
        for k in self.queries.new:
            for state in ("new", "routed", "old"):
                arrays[f"query_{state}_{k}"] = getattr(self.queries, state)[k]
        for d in served:
            arrays[f"relevant_{d}"] = np.asarray(self.queries.relevant[d])[:, :self.n_items]
            arrays[f"units_{d}"] = self.units[d]
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)


def _simulation(ctx: RunContext, record: Any, fitted: Any, p: MigrateParams,
                validation: str, distractors: Distractors) -> Simulation:
    """The validation set embedded (OLD: the gallery's version; NEW natively; the route:
    NEW into the source space), its items in the gallery's kinds, joined with the
    distractors."""
    from training.upgrades.transform.order import order_items
    from training.upgrades.transform.simulate import (
        DIRECTIONS,
        Items,
        Queries,
        join,
        joined_order,
        pad_relevance,
    )
    from training.versions import load_encoder

    m = record.migration
    registry = Registry(ctx.settings.registry_dir)
    dataset = ctx.open_dataset(validation, "validation")
    old_art = registry.artifact(_gallery_version(
        registry, _embedded_by(ctx), record.history, m.source.space))
    target = registry.artifact(m.version)
    device = ctx.settings.device
    old_enc = load_encoder(old_art, m.source.space, device)
    new_enc = load_encoder(target, m.target.space, device)
    routed_enc = load_encoder(target, m.source.space, device)
    language = "en" if "en" in dataset.languages() else dataset.languages()[0]
    texts, owners = dataset.captions(language)
    stored = dataset.stored_captions(language)
    first = [stored[n] for n in range(len(dataset))]
    images = [dataset.load_image(n) for n in range(len(dataset))]
    kinds = list(distractors.old)  # the gallery's kinds
    encode = {"image": lambda enc: enc.encode_images(images),
              "text": lambda enc: enc.encode_texts([texts[c] for c in first])}
    item_old = {k: encode[k](old_enc) for k in kinds}
    item_new = {k: encode[k](new_enc) for k in kinds}
    transformed = {k: fitted.apply(k, item_old[k]) for k in kinds}
    scores = sum(fitted.predicted_error(k, item_old[k], transformed[k]) for k in kinds)
    names = [r.id for r in dataset.records]
    order = order_items(p.order, names, scores, seed=p.seed)
    items = join(Items(item_old, item_new, transformed),
                 Items(distractors.old, distractors.new, distractors.transformed))
    joined = {k: joined_order(order, order_items(
        p.order, [f"d{j:08d}" for j in range(len(distractors.old[k]))],
        distractors.scores[k], seed=p.seed + 1)) for k in kinds}
    rel = dataset.relevance(language)  # [captions, images]
    relevant = {"t2i": rel, "i2t": rel[first].T}
    relevant = {d: pad_relevance({d: relevant[d]}, len(distractors.old[ik]))[d]
                for d, (_, ik) in DIRECTIONS.items() if ik in kinds}
    queries = Queries(
        new={"text": new_enc.encode_texts(texts), "image": new_enc.encode_images(images)},
        routed={"text": routed_enc.encode_texts(texts), "image": routed_enc.encode_images(images)},
        old={"text": old_enc.encode_texts(texts), "image": old_enc.encode_images(images)},
        relevant=relevant)
    units = {"t2i": np.asarray(owners, np.int64), "i2t": np.arange(len(dataset))}
    return Simulation(items, queries, joined, units, len(dataset))


def _rounded(value: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (round(v, 4) if v is not None else None) for k, v in value.items()}
