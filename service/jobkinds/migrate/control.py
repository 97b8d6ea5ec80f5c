"""Managed migration: move a gallery into its active version's native space without
downtime (DESIGN.md step 5). Blue-green: the target side is a new Qdrant collection.

1. ``prepare`` (a ``migrate`` job's submission): create the target collection, record the
   migration in the registry (from now on every write reaches both sides: the items API
   embeds for each side, under the gallery's write lock), list the items (under that
   lock, so a write is either in the list or written to both sides), and plan shards:
   contiguous ranges of the items by id, one task each.
2. Workers backfill their shards into the job's spool; ``drive`` (the gateway's applier,
   every ``apply_interval_s``) writes them into the target side, re-queues the shards of
   a lost worker, backfills what the listing missed (catch-up shards), runs the gate
   (a shard: new->new against the route new->old on the validation set), and then, when
   every item has its new vector and the gate passed, ``switch``es.
3. ``switch``: one registry update moves the gallery's space and collection to the target
   side (each request captured one ``Serving``: it finishes on the side it started on).
   The source side is kept, and still written, until ``retire``; ``rollback`` goes back.

Why a new collection rather than new named vectors: the target may have another width,
a retire is one collection drop, a rollback is one pointer move, and a half-built side
is never inside the collection that serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.ingest import KIND as INGEST
from service.jobkinds.migrate.params import MigrateParams
from service.state.errors import Conflict, GateFailed, InvalidInput, NotFound, Unavailable, shown
from service.state.gallery.locks import gallery_lock
from service.state.gallery.store import Stored
from service.state.jobs.shards import write_items
from service.state.jobs.store import Job
from service.state.registry import GalleryRecord
from service.state.registry.records import Migration, Side
from service.state.registry.registry import require_migration
from service.vectors.backfill import origin_of
from service.vectors.spool import pending

log = logging.getLogger(__name__)
CATCH_UP_ROUNDS = 3  # backfills of items the listing missed, before the switch gives up
SHOWN_IDS = 20  # item ids an error message names (the job record has all)


@dataclass(frozen=True)
class MigrationView:
    gallery: GalleryRecord
    migration: Migration
    job: Job | None
    progress: dict[str, Any]


# ------------------------------------------------------------------ submission
def check_can_start(gateway: GatewayPort, gallery: str) -> None:
    """409s before anything is created: a migration is open, the gallery is already in
    its active version's space, or an ingest job of it is unfinished (its worker embeds
    for the sides it saw when it started)."""
    gateway.registry.check_can_migrate(gallery)
    busy = [j.id for j in gateway.jobs.list()
            if j.gallery == gallery and j.kind == INGEST.name and not j.finished]
    if busy:
        raise Conflict(f"gallery '{gallery}' has unfinished ingest jobs ({', '.join(busy[:5])}); "
                       f"let them finish before migrating it")


async def start(gateway: GatewayPort, job: Job, params: MigrateParams) -> Job:
    """A migration's start (the job's record exists, ``check_can_start`` passed): open it
    and plan its shards (``prepare``), then queue every shard; if any step fails, the
    migration is undone and the job record removed."""
    try:
        shards = await prepare(gateway, job, params)
    except Exception:
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        raise
    try:
        for shard in shards:
            await asyncio.wait_for(asyncio.to_thread(gateway.queue.send_shard, job.id, shard),
                                   timeout=gateway.settings.broker_timeout_s * 2)
    except (Unavailable, asyncio.TimeoutError) as exc:
        await abort(gateway, job.gallery, job.id)
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable("the job queue did not answer; the migration was not started") from exc
    return await asyncio.to_thread(gateway.jobs.get, job.id)


async def prepare(gateway: GatewayPort, job: Job, params: MigrateParams) -> list[int]:
    """Open the migration of ``job`` and plan its shards; the shard indices to queue.
    On failure nothing is left open (the caller deletes the job record). A migration
    opened meanwhile is refused by ``begin_migration``."""
    record = await asyncio.to_thread(gateway.registry.gallery, job.gallery)
    native = await asyncio.to_thread(gateway.registry.version, record.active)
    dim = (await gateway.runtime.embedder(native.version_id, native.space)).dim
    source = record.collection or await asyncio.to_thread(gateway.store.collection_of,
                                                           job.gallery)
    if source is None:
        raise Conflict(f"gallery '{job.gallery}' has no collection in Qdrant")
    target = await asyncio.to_thread(gateway.store.create_side, job.gallery, dim)
    try:
        await asyncio.to_thread(gateway.registry.begin_migration, job.gallery, job=job.id,
                                source=source, target=target, by=job.created_by)
    except BaseException:
        await asyncio.to_thread(gateway.store.drop_collection, target)
        raise
    try:
        await gateway.runtime.refresh()  # this replica writes both sides from here on
        items, versions = await asyncio.to_thread(_listing, gateway, job.gallery, source)
        planned = await asyncio.to_thread(_write_shards, gateway, job, _plan(items, params.shards))
        await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(
            result={"planned_shards": len(planned), "listed": len(items),
                    "embedded_by": versions}))
    except BaseException:
        await abort(gateway, job.gallery, job.id)
        raise
    return planned


def _listing(gateway: GatewayPort, gallery: str,
             collection: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every item of the source side, sorted by id (id, etag, origin, kinds), and how many
    items each version embedded (the migration gate compares against the main one)."""
    with gallery_lock(gateway.settings, gallery):
        stored = gateway.store.stored(collection)
    versions = Counter(str(s.version) for s in stored.values() if s.version)
    return ([_backfill_item(s) for s in sorted(stored.values(), key=lambda s: s.id)],
            dict(versions.most_common()))


def _backfill_item(stored: Stored) -> dict[str, Any]:
    """What a shard needs of an item: id, the etag it was read with, kinds, origin."""
    return {"id": stored.id, "etag": stored.etag, "kinds": list(stored.kinds),
            "origin": origin_of(stored.kinds, stored.origin, stored.payload)}


def _plan(items: list[dict[str, Any]], shards: int) -> list[list[dict[str, Any]]]:
    """Contiguous ranges of the sorted items, as even as they split (at least one)."""
    n = max(1, min(shards, len(items)))
    bounds = [round(k * len(items) / n) for k in range(n + 1)]
    return [items[bounds[k]:bounds[k + 1]] for k in range(n)]


def _write_shards(gateway: GatewayPort, job: Job, shards: list[list[dict[str, Any]]],
                  task: str = "backfill") -> list[int]:
    """Write the shards' item files and add them to the job; their indices."""
    first = len(gateway.jobs.get(job.id).shards)
    work = gateway.jobs.work_dir(job.id)
    work.mkdir(parents=True, exist_ok=True)
    for n, items in enumerate(shards):
        write_items(work, first + n, items)
    gateway.jobs.add_shards(job.id, [
        {"task": task, "start": items[0]["id"] if items else None,
         "end": items[-1]["id"] if items else None, "total": len(items)} for items in shards])
    return list(range(first, first + len(shards)))


# ------------------------------------------------------------------ driving
async def tick(gateway: GatewayPort) -> list[tuple[str, int]]:
    """The applier's step for migrations (after it applied every spool): drive each
    backfilling migration, settle the others; the shards to queue."""
    queue: list[tuple[str, int]] = []
    for record in await asyncio.to_thread(gateway.registry.galleries):
        if record.migration is not None and record.migration.state == "backfilling":
            queue += await drive(gateway, record)
        elif record.migration is not None:
            await settle(gateway, record)
    return queue


async def drive(gateway: GatewayPort, record: GalleryRecord) -> list[tuple[str, int]]:
    """One step of a backfilling migration (the applier calls it after applying the
    job's spool); the shards to queue. Aborts it when its job failed or was cancelled;
    switches it when the backfill is complete, the gate passed and auto_switch is on."""
    m = record.migration
    assert m is not None and m.state == "backfilling"
    job = await asyncio.to_thread(gateway.jobs.get, m.job)
    if job.status in ("failed", "cancelled") or job.cancel_requested:
        await abort(gateway, record.name, job.id)
        return []
    if "planned_shards" not in job.result:
        return []  # its submission is still listing the items and planning the shards
    if job.finished or any(s["state"] != "done" for s in job.shards):
        return []  # still running, or complete and waiting for the operator's switch
    if pending(gateway.jobs.work_dir(job.id)):
        return []  # applied at the next tick first
    missing = await asyncio.to_thread(_locked_reconcile, gateway, record.name, m, job)
    listed_all = int(job.result.get("unreadable_count", 0)) <= len(
        job.result.get("unreadable", []))  # else some missing ones are unreadable: final
    if missing and listed_all and _rounds(job) < CATCH_UP_ROUNDS:
        log.info("migration of %s: %d item(s) missed by the listing; backfilling them",
                 record.name, len(missing))
        added = await asyncio.to_thread(_write_shards, gateway, job, _plan(missing, 1))
        return [(job.id, n) for n in added]
    if not any(s.get("task") == "gate" for s in job.shards):
        added = await asyncio.to_thread(_write_shards, gateway, job, [[]], "gate")
        return [(job.id, n) for n in added]
    outcome: dict[str, Any] = {"missing": [i["id"] for i in missing][:1000],
                               "missing_count": len(missing), "switched": False}
    if MigrateParams.model_validate(job.params).auto_switch:
        try:  # the switch comes first, so a finished job says whether it switched
            await switch(gateway, record.name, by=f"job:{job.id}", backfilled=True,
                         reason="auto_switch: every item has its new vector and the gate passed")
            outcome["switched"] = True
        except Conflict as exc:  # the gate failed or items are missing: the operator decides
            log.warning("migration of %s not switched: %s", record.name, exc.message)
            outcome["switch_refused"] = exc.message
    else:
        outcome["switch_refused"] = "auto_switch is off: switch with POST .../migration/switch"
    await asyncio.to_thread(gateway.jobs.finish, job.id, "succeeded",
                            result=outcome)
    return []


async def settle(gateway: GatewayPort, record: GalleryRecord) -> None:
    """A switched migration whose job is still open (the gateway stopped between the switch
    and the job's end) ends its job."""
    assert record.migration is not None
    try:
        job = await asyncio.to_thread(gateway.jobs.get, record.migration.job)
    except NotFound:
        return  # its record is gone: nothing to end
    if not job.finished:
        await asyncio.to_thread(gateway.jobs.finish, job.id, "succeeded",
                                result={"switched": True})


def _rounds(job: Job) -> int:
    """Catch-up rounds so far: backfill shards added after the first plan."""
    first = int(job.result.get("planned_shards", 0))
    return sum(1 for s in job.shards[first:] if s.get("task", "backfill") == "backfill")


def _locked_reconcile(gateway: GatewayPort, gallery: str, m: Migration,
                      job: Job) -> list[dict[str, Any]]:
    with gallery_lock(gateway.settings, gallery):
        return _reconcile(gateway, m, job, skip_unreadable=True)


def _reconcile(gateway: GatewayPort, m: Migration, job: Job,
               skip_unreadable: bool) -> list[dict[str, Any]]:
    """(Under the write lock.) Drop target items the source no longer has (deletes reach
    both sides, so normally none), and list the source items the target lacks; with
    ``skip_unreadable``, not those a worker could not read (they wait for the operator)."""
    source = gateway.store.stored(m.source.collection)
    target = gateway.store.stored(m.target.collection)
    extra = [i for i in target if i not in source]
    if extra:
        gateway.store.delete(m.target.collection, extra)
    unreadable = ({u["id"] for u in job.result.get("unreadable", [])} if skip_unreadable
                  else set())
    return [_backfill_item(s) for i, s in sorted(source.items())
            if i not in target and i not in unreadable]


async def abort(gateway: GatewayPort, gallery: str, job_id: str) -> None:
    """Undo a backfilling migration (its job was cancelled or failed): the registry first
    (writes stop reaching the target), then the target collection; the job ends."""
    dropped = await asyncio.to_thread(_locked_end, gateway, gallery, True)
    await gateway.runtime.refresh()
    if dropped is not None:
        await asyncio.to_thread(gateway.store.drop_collection, dropped.collection)
    current = await asyncio.to_thread(gateway.jobs.get, job_id)
    if not current.finished:
        await asyncio.to_thread(
            gateway.jobs.finish, job_id, "cancelled",
            error="cancelled; the migration was undone (its target side was dropped, the "
                  "gallery serves as before)")
    else:
        await asyncio.to_thread(gateway.jobs.update, job_id,
                                lambda j: j.merged(result={"undone": True}))
    log.warning("migration of %s (job %s) undone", gallery, job_id)


def _locked_end(gateway: GatewayPort, gallery: str, abort: bool) -> Side | None:
    with gallery_lock(gateway.settings, gallery):
        try:
            return gateway.registry.end_migration(gallery, abort=abort)[1]
        except Conflict:
            if abort:
                return None  # ended already (a repeated abort)
            raise


# ------------------------------------------------------------------ operator calls
async def switch(gateway: GatewayPort, gallery: str, *, by: str, drop: list[str] | None = None,
                 force: bool = False, reason: str | None = None,
                 backfilled: bool = False) -> GalleryRecord:
    """Switch the gallery to the target side. Conflict while the backfill runs, while any
    item has no new vector (unless ``drop`` lists every such item: they are deleted from
    both sides), or when the gate did not pass (unless ``force`` with a reason).
    ``backfilled``: the applier's auto switch, before it ends the job."""
    record = await asyncio.to_thread(_locked_switch, gateway, gallery, by, drop or [], force,
                                     reason, backfilled)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.target.collection)
    await gateway.runtime.refresh()
    return record


def _locked_switch(gateway: GatewayPort, gallery: str, by: str, drop: list[str], force: bool,
                   reason: str | None, backfilled: bool) -> GalleryRecord:
    record = gateway.registry.gallery(gallery)
    m = require_migration(record, "backfilling", "switch")
    job = gateway.jobs.get(m.job)
    if job.status != "succeeded" and not backfilled:
        view = progress(job)
        raise Conflict(f"the backfill of gallery '{gallery}' is {job.status} ({view['done']}/"
                       f"{view['total']} items); switch when its job {job.id} has succeeded")
    if force and not (reason or "").strip():
        raise InvalidInput("a forced switch needs a reason (it is recorded)")
    gate = job.gate or {}
    if gate.get("passed") is not True and not force:
        raise GateFailed(f"the migration gate did not pass ({_gate_summary(gate)}); switch "
                         f"with force=true and a reason to override")
    with gallery_lock(gateway.settings, gallery):
        missing = [i["id"] for i in _reconcile(gateway, m, job, skip_unreadable=False)]
        not_dropped = sorted(set(missing) - set(drop))
        if not_dropped:
            reasons = {u["id"]: u["reason"] for u in job.result.get("unreadable", [])}
            named = "; ".join(f"{shown(i)}: {reasons.get(i, 'not backfilled')}"
                              for i in not_dropped[:SHOWN_IDS])
            raise Conflict(f"{len(not_dropped)} item(s) of gallery '{gallery}' have no vector "
                           f"in the new space ({named}); fix their sources and migrate again, "
                           f"or switch with drop=[their ids] to delete them")
        if drop:
            for side in record.sides():
                gateway.store.delete(side.collection, drop)
        return gateway.registry.switch_migration(gallery, by=by, reason=reason)


async def rollback(gateway: GatewayPort, gallery: str, *, by: str,
                   reason: str | None = None) -> GalleryRecord:
    """A switched gallery goes back to the source side (its space and the route)."""
    def locked() -> GalleryRecord:
        with gallery_lock(gateway.settings, gallery):
            return gateway.registry.rollback_migration(gallery, by=by, reason=reason)
    record = await asyncio.to_thread(locked)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.source.collection)
    await gateway.runtime.refresh()
    return record


async def retire(gateway: GatewayPort, gallery: str) -> tuple[GalleryRecord, Side]:
    """End a switched (or rolled back) migration: the side that does not serve is dropped."""
    dropped = await asyncio.to_thread(_locked_end, gateway, gallery, False)
    assert dropped is not None
    await gateway.runtime.refresh()
    await asyncio.to_thread(gateway.store.drop_collection, dropped.collection)
    return await asyncio.to_thread(gateway.registry.gallery, gallery), dropped


async def cancel(gateway: GatewayPort, gallery: str) -> None:
    """Abandon a backfilling migration: a running job is asked to stop (the applier then
    undoes the migration); one whose backfill finished without a switch (its gate failed,
    or items are unreadable) is undone now."""
    record = await asyncio.to_thread(gateway.registry.gallery, gallery)
    m = require_migration(record, "backfilling", "cancel")
    job = await asyncio.to_thread(gateway.jobs.get, m.job)
    if job.finished:
        await abort(gateway, gallery, job.id)
    else:
        await asyncio.to_thread(gateway.jobs.cancel, job.id)


async def view(gateway: GatewayPort, gallery: str) -> MigrationView:
    record = await asyncio.to_thread(gateway.registry.gallery, gallery)
    if record.migration is None:
        raise NotFound(f"gallery '{shown(gallery)}' has no migration")
    m = record.migration
    try:
        job: Job | None = await asyncio.to_thread(gateway.jobs.get, m.job)
    except NotFound:
        job = None
    return MigrationView(record, m, job, progress(job) if job else {})


def job_progress(job: Job) -> dict[str, Any]:
    """What a migrate job's record shows: its shards' progress once it has them."""
    return progress(job) if job.shards else {}


def progress(job: Job) -> dict[str, Any]:
    """done/total over the backfill shards, items/s since the job started, ETA, stage."""
    backfill = [s for s in job.shards if s.get("task", "backfill") == "backfill"]
    done = sum(int(s.get("done", 0)) for s in backfill)
    total = sum(int(s.get("total", 0)) for s in backfill)
    rate = None
    if job.started_at and done:
        end = datetime.fromisoformat(job.ended_at) if job.ended_at else datetime.now(timezone.utc)
        rate = done / max((end - datetime.fromisoformat(job.started_at)).total_seconds(), 1e-6)
    eta = (total - done) / rate if rate else None
    gate = [s for s in job.shards if s.get("task") == "gate"]
    stage = ("backfill" if any(s["state"] != "done" for s in backfill) else
             "gate" if not gate or gate[-1]["state"] != "done" else
             "done" if job.finished else "applying")
    return {"stage": stage, "done": done, "total": total,
            "items_per_s": round(rate, 2) if rate else None,
            "eta_s": round(eta, 1) if eta is not None else None,
            "applied": int(job.result.get("applied", 0)),
            "unreadable": int(job.result.get("unreadable_count",
                                             len(job.result.get("unreadable", []))))}


def _gate_summary(gate: dict[str, Any]) -> str:
    checks = gate.get("checks") or []
    if not checks:
        return str(gate.get("reason") or "no gate report")
    return ", ".join(f"{c['direction']} migrated {c['migrated']:.3f} vs routed "
                     f"{c['routed']:.3f}" for c in checks)
