"""What a migration shows (GET .../migration, the CLI, the web page): its phase's
records, and one notion of progress read from the target side itself.

Progress: ``reembedded`` is the number of items on the target side whose vector is the
new version's own (``made.by`` "embed"), whoever wrote it (the backfill, a reranked
search's read-through fill, a write through the items API); ``items`` the items the
gallery holds (its source side); ``fraction`` their ratio. The same count decides the
progressive switch and its checks (``drive``) and the plan reads it, so the figure the
operator sees is the one the switch used.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.migrate.actions import current
from service.jobkinds.migrate.keep import end_report, kept_cost
from service.jobkinds.migrate.lifecycle import paused, phase_of
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.record import MigrationState
from service.state.errors import NotFound, shown
from service.state.gallery.store import GalleryStore
from service.state.jobs.store import Job
from service.state.registry import GalleryRecord
from service.state.registry.records import Migration

# What ``result`` shows of the job: the applier's write counts (the rest is the record's).
JOB_COUNTS = ("applied", "skipped", "transformed", "unreadable", "unreadable_count")


@dataclass(frozen=True)
class Counts:
    """The target side counted: items with the new version's own vectors (``reembedded``;
    of them ``by_reads`` written by reranked searches), with transformed vectors, and
    the items the gallery holds (its source side)."""

    reembedded: int
    transformed: int
    by_reads: int
    items: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.reembedded / self.items) if self.items else 0.0


def counts(store: GalleryStore, m: Migration) -> Counts:
    target = m.target.collection
    transformed = store.count_made(target, "transform")
    return Counts(store.count(target) - transformed, transformed,
                  store.count_where(target, "made.via", "read"), store.count(m.source.collection))


@dataclass(frozen=True)
class MigrationView:
    gallery: GalleryRecord
    migration: Migration
    job: Job | None
    state: MigrationState | None
    progress: dict[str, Any]
    # the end states the gate measured and the operator's choice (``keep.end_report``)
    end: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        """The job's write counts, then what the migration's record says of its end and
        of its switches."""
        out = {k: v for k, v in (self.job.result if self.job else {}).items() if k in JOB_COUNTS}
        if self.state is not None:
            out.update(self.state.outcome)
            out.update(self.state.model_dump(include={
                "gate_failed", "checks", "switched_at_fraction", "switched_back_at_fraction",
                "switched_back", "resumed_items", "kept", "kept_at", "kept_by"}))
        return out


async def view(gateway: GatewayPort, gallery: str) -> MigrationView:
    now = await asyncio.to_thread(current, gateway, gallery)
    if now.migration is None:
        raise NotFound(f"gallery '{shown(gallery)}' has no migration")
    m = now.migration
    side = await asyncio.to_thread(counts, gateway.store, m)
    shown_progress = progress(now.job, now.state, side) if now.job else {}
    phase = phase_of(m, now.job, now.state)
    end = None
    if phase in ("awaiting", "kept"):  # the choice is open (or made): show it, with its cost
        end = end_report(now.record.name, m, now.job, phase, None)
        if end is not None:  # the store is read only when the gate measured the end states
            end["cost_of_keeping"] = await asyncio.to_thread(kept_cost, gateway.store, m)
    return MigrationView(now.record, m, now.job, now.state, shown_progress, end)


def job_progress(job: Job) -> dict[str, Any]:
    """What a migrate job's record shows: its shards' progress once it has them."""
    return shard_progress(job) if job.shards else {}


def shard_progress(job: Job) -> dict[str, Any]:
    """done/total over the items the shards embed (a transform's sample, then the
    backfill shards), items/s since the job started, ETA, and the stage."""
    embedding = [s for s in job.shards if s.get("task", "backfill") in ("backfill", "transform")]
    done = sum(int(s.get("done", 0)) for s in embedding)
    total = sum(int(s.get("total", 0)) for s in embedding)
    rate = None
    if job.started_at and done:
        end = datetime.fromisoformat(job.ended_at) if job.ended_at else datetime.now(timezone.utc)
        rate = done / max((end - datetime.fromisoformat(job.started_at)).total_seconds(), 1e-6)
    eta = (total - done) / rate if rate else None
    gate = [s for s in job.shards if s.get("task") == "gate"]
    transform = [s for s in job.shards if s.get("task") == "transform"]
    waiting = bool(transform) and not any(s.get("task", "backfill") == "backfill"
                                          for s in job.shards)
    stage = ("transform" if transform and transform[-1]["state"] != "done" else
             "backfill" if any(s["state"] != "done" for s in embedding) or waiting else
             "gate" if not gate or gate[-1]["state"] != "done" else
             "done" if job.finished else "applying")
    return {"stage": stage, "done": done, "total": total,
            "items_per_s": round(rate, 2) if rate else None,
            "eta_s": round(eta, 1) if eta is not None else None,
            "paused": paused(job)}


def progress(job: Job, state: MigrationState | None, side: Counts) -> dict[str, Any]:
    """The shards' progress, the side's counts (``Counts``) and what the record says of
    the switch; with a transform: what it did, the validation curve, the share of the
    gain it estimates at the current fraction, where it switches (or did)."""
    params = MigrateParams.model_validate(job.params)
    s = state or MigrationState(job=job.id, gallery=job.gallery)
    out = {**shard_progress(job),
           "applied": int(job.result.get("applied", 0)),
           "unreadable": int(job.result.get("unreadable_count",
                                            len(job.result.get("unreadable", [])))),
           "fraction": round(side.fraction, 4), "reembedded": side.reembedded,
           "items": side.items, "listed": s.listed, "transformed": side.transformed,
           "filled_by_reads": side.by_reads,
           "filled_by_backfill": side.reembedded - side.by_reads,
           "order": params.order, "switch": params.switch,
           "switch_at": s.switch_at, "switched_at_fraction": s.switched_at_fraction,
           "switched_at": s.switched_at,
           "switched_back_at_fraction": s.switched_back_at_fraction}
    if params.order == "candidates":  # the plan: what users retrieved, put first
        out["candidates"] = s.candidates
    if params.transform:
        out.update({"transform": s.transform, "curve": s.curve, "routed": s.routed,
                    "share_estimate": _estimate(s.curve, side.fraction)})
    return out


def _estimate(curve: list[dict[str, Any]] | None, fraction: float) -> dict[str, Any] | None:
    """The validation curve's share of the gain at the last point at or below
    ``fraction`` (what the side as it stands is estimated to deliver)."""
    if not curve:
        return None
    point = max((p for p in curve if p["fraction"] <= fraction + 1e-9),
                key=lambda p: p["fraction"], default=curve[0])
    return {"fraction": point["fraction"],
            **{d: point[d]["share"] for d in ("t2i", "i2t") if d in point}}
