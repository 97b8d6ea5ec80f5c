"""A ``migrate`` job's shards (``control.prepare`` plans them).

``backfill``: re-embed a range of the gallery's items from their origins with the target
version natively (``service.vectors.backfill``), into the job's spool (the gateway writes
them into the target side). The shard's cursor is saved after each batch, so a shard
whose worker was killed resumes at the first batch it had not spooled (a batch spooled
twice is the same upsert). Items a reranked search already embedded and wrote (the
read-through fill, recorded in the migration's ``FilledByReads``) are skipped, not embedded
again. While the job's backfill is paused (a lazy migration) the shard stops at its
cursor (``Paused``) and the gateway queues it again on resume.

``gate``: on the gallery's validation set, the target version natively (new->new) against
its route into the source space (new->old, what serves during the backfill).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from service.jobkinds.base import RunContext
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.params import MigrateParams
from service.state.jobs.shards import (
    PAUSED,
    FilledByReads,
    Paused,
    read_cursor,
    read_items,
    write_cursor,
)
from service.state.paths import Roots
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from service.vectors.backfill import OriginReader, backfill_shard, read_ahead
from service.vectors.sources import SourceStore
from service.vectors.spool import SpooledWriter

DIRECTIONS = ("t2i", "i2t")


class RateLimit:
    """At most ``rate`` items/s on average (0: no limit)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.start, self.count = rate, time.monotonic(), 0

    def wait(self, items: int) -> None:
        self.count += items
        if self.rate > 0:
            ahead = self.count / self.rate - (time.monotonic() - self.start)
            if ahead > 0:
                time.sleep(ahead)


def run_backfill(ctx: RunContext) -> dict[str, Any]:
    from training.versions import load_encoder

    assert ctx.shard is not None  # a shard's heartbeat (advance)
    shard, heartbeat = ctx.shard, ctx.heartbeat
    p: MigrateParams = ctx.params
    work = ctx.store.work_dir(ctx.job.id)
    items = read_items(work, ctx.shard)
    folder = records.folder(ctx.store, ctx.job.id)  # the migration's files (reads' fills)
    cursor = read_cursor(work, ctx.shard)
    registry = Registry(ctx.settings.registry_dir)
    migration = registry.gallery(ctx.job.gallery).migration
    if migration is None or migration.job != ctx.job.id:
        raise RuntimeError(f"gallery '{ctx.job.gallery}' has no migration of job {ctx.job.id}")
    space, version = migration.target.space, migration.version
    encoder = load_encoder(registry.artifact(version), space, ctx.settings.device)
    rate = p.rate_limit if p.rate_limit is not None else ctx.settings.migration_rate_limit
    running = sum(1 for s in ctx.job.shards if s.get("task", "backfill") == "backfill")
    limit = RateLimit(rate / max(running, 1))
    reader = OriginReader(SourceStore.of(ctx.settings), Roots.of(ctx.settings),
                          encoder.image_tensors)
    writer = SpooledWriter(work, ThumbnailStore.of(ctx.settings), ctx.job.gallery,
                           f"{shard:04d}-", cursor, ctx.settings.qdrant_durability == "power")
    start = time.monotonic()
    if ctx.job.result.get(PAUSED):
        raise Paused(f"the backfill of job {ctx.job.id} is paused")
    heartbeat.advance(cursor, {"stage": "backfill"})
    filled = FilledByReads(folder)

    def advanced(position: int, batch: int, skips: int) -> None:
        write_cursor(work, shard, position)
        elapsed = time.monotonic() - start
        heartbeat.advance(position, {"stage": "backfill", "items_per_s": round(
            (position - cursor) / max(elapsed, 1e-9), 2)})
        if heartbeat.paused.is_set():  # a shard's heartbeat (ShardHeartbeat)
            raise Paused(f"the backfill of job {ctx.job.id} is paused")
        limit.wait(batch - skips)

    backfill_shard(encoder, reader, items, cursor, p.batch_size,
                   read_ahead(ctx.settings.migration_read_ahead, encoder.device), version,
                   space, writer, advanced, skip=filled)
    return {}


def run_gate(ctx: RunContext) -> dict[str, Any]:
    """new->new against new->old (the route that serves now) on the validation set: passed
    when the migrated side is at least as good at R@1 in both directions."""
    from training.compatibility import compatibility_of_artifacts

    p: MigrateParams = ctx.params
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    m = gallery.migration
    if m is None or m.job != ctx.job.id:
        raise RuntimeError(f"gallery '{ctx.job.gallery}' has no migration of job {ctx.job.id}")
    validation = p.validation or gallery.validation
    if validation is None:
        return {"passed": False, "gallery": gallery.name, "target": m.target.collection,
                "reason": f"gallery '{gallery.name}' has no validation set; "
                "switch with force=true and a reason to override"}
    ctx.heartbeat.progress = {"stage": "gate"}
    target = registry.artifact(m.version)
    state = records.load(ctx.store, ctx.job.id)
    old = registry.artifact(_gallery_version(registry, state.embedded_by if state else {},
                                             gallery.history, m.source.space))
    dataset = ctx.open_dataset(validation, "validation")
    cache: dict[tuple[str, str], Any] = {}
    cells = compatibility_of_artifacts([old, target], dataset, cache=cache)["cells"]
    routed, migrated = cells[target.version_id][old.version_id], cells[target.version_id][
        target.version_id]
    checks = [{"direction": d, "migrated": migrated[d]["R@1"], "routed": routed[d]["R@1"],
               "passed": migrated[d]["R@1"] >= routed[d]["R@1"] - 1e-12} for d in DIRECTIONS]
    report = {"passed": all(c["passed"] for c in checks), "checks": checks, "metric": "R@1",
              "gallery": gallery.name, "target": m.target.collection, "version": m.version,
              "old_gallery_version": old.version_id,
              "validation": validation, "validation_items": len(dataset)}
    k = min(m.rerank_k or ctx.settings.rerank_k, ctx.settings.rerank_k_max)
    report["serving"] = what_serves(cache, old, target, dataset, k, m.serving)
    return report


def what_serves(cache: dict[tuple[str, str], Any], old: Any, target: Any, dataset: Any,
                k: int, serving: str) -> dict[str, Any]:
    """The end states of the migration at R@1 on the validation set: the native side
    alone, and both sides kept with a fused ranking (``rerank@k``: the route's top k
    ranked by the new model; ``hybrid``: both sides' scores summed), with, for each fused
    one, whether the native side is below it beyond the error (one-sided test at 5%, an
    image with its captions as one unit: ``simulate.falls_below``). ``native_below``: the
    native side is below what serves now (a migration served by rerank: rerank@k; by the
    route, the gate itself compares). The gate still passes or fails against the route;
    this decides whether the switch may be made without asking, and what the operator
    sees of the choice (``keep.end_report``)."""
    from training.compatibility import cell_top1_hits, hybrid_top1_hits, reranked_top1_hits
    from training.upgrades.transform.simulate import falls_below

    relevance = dataset.relevance("en")  # as compatibility_of_artifacts embedded it
    route, stored = cache[(target.version_id, old.space)], cache[(old.version_id, old.space)]
    own = cache[(target.version_id, target.space)]
    fused = f"rerank@{k}"
    hits = {"native": cell_top1_hits(cache, target, target, relevance),
            fused: reranked_top1_hits(route, stored, own, relevance, k),
            "hybrid": hybrid_top1_hits(route, stored, own, relevance)}
    owners = np.asarray(relevance, bool).argmax(axis=1)
    units = {"t2i": owners, "i2t": np.arange(relevance.shape[1])}
    below = {mode: bool(falls_below(hits, "native", mode, list(DIRECTIONS), units))
             for mode in (fused, "hybrid")}
    r1 = {d: {name: round(float(h[d].mean()), 4) for name, h in hits.items()}
          for d in DIRECTIONS}
    now = fused if serving == "rerank" else None
    why = "; ".join(f"{d}: the native side {v['native']:.3f} against {fused} {v[fused]:.3f}, "
                    f"hybrid {v['hybrid']:.3f}" for d, v in r1.items())
    return {"mode": now or serving, "rerank_k": k, "R@1": r1, "native_below_fused": below,
            "native_below": bool(now and below[now]), "why": why}


def _gallery_version(registry: Registry, embedded_by: dict[str, int], history: Any,
                     space: str) -> str:
    """The version that embedded most of the source side's items (counted when the items
    were listed) if it is still registered and native to that space; else the latest of
    the gallery's history native to it (else the newest registered one native to it)."""
    versions = {v.version_id: v for v in registry.versions()}  # retired ones are absent
    for version in embedded_by:  # most items first
        found = versions.get(version)
        if found is not None and found.space == space:
            return version
    for event in reversed(history):
        found = versions.get(event.version)
        if found is not None and found.space == space:
            return found.version_id
    return registry.default_version(space).version_id
