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

With ``transform`` (``service.jobkinds.migrate.transform``), step 1 also snapshots the
stored vectors and plans one ``transform`` shard (the sample); when it is done and its
spool (the sample's real vectors, every other item's mapped ones) is written, ``drive``
plans the backfill shards from the order it wrote: strided over the order, so every
shard walks it together. With ``switch: progressive``, ``drive`` switches as soon as the
fraction re-embedded (what the gateway has written) reaches the point where the
validation curve says the side beats the route, and keeps driving the backfill after the
switch; the job then ends after the backfill and the gate, without a second switch.

Why a new collection rather than new named vectors: the target may have another width,
a retire is one collection drop, a rollback is one pointer move, and a half-built side
is never inside the collection that serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from service.jobkinds.base import GatewayPort
from service.jobkinds.ingest import KIND as INGEST
from service.jobkinds.migrate.lifecycle import paused, phase_of, require
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.transform import LISTING, read_order, write_snapshot
from service.state.errors import Conflict, GateFailed, InvalidInput, NotFound, Unavailable, shown
from service.state.gallery.locks import gallery_lock
from service.state.gallery.store import Stored
from service.state.jobs.shards import PAUSED, write_items
from service.state.jobs.store import Job
from service.state.registry import GalleryRecord
from service.state.registry.records import Migration, Side
from service.state.registry.registry import require_migration
from service.vectors.backfill import origin_of
from service.vectors.spool import pending

log = logging.getLogger(__name__)
CATCH_UP_ROUNDS = 3  # backfills of items the listing missed, before the switch gives up
SHOWN_IDS = 20  # item ids an error message names (the job record has all)
CHECK_EVERY = 0.05  # after a progressive switch, the side is checked again at every 5%


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
                                source=source, target=target, by=job.created_by,
                                serving=params.serving, rerank_k=params.rerank_k)
    except BaseException:
        await asyncio.to_thread(gateway.store.drop_collection, target)
        raise
    try:
        await gateway.runtime.refresh()  # this replica writes both sides from here on
        items, versions = await asyncio.to_thread(_listing, gateway, job.gallery, source)
        if params.transform:
            work = gateway.jobs.work_dir(job.id)
            await asyncio.to_thread(write_snapshot, gateway.store, source, items, work)
            await asyncio.to_thread(_write_json, work / LISTING, items)
            planned = await asyncio.to_thread(_write_shards, gateway, job,
                                              [_sample(items, params)], "transform")
        else:
            planned = await asyncio.to_thread(_write_shards, gateway, job,
                                              _planned(items, params))
        await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(
            result={"planned_shards": len(planned), "listed": len(items),
                    "embedded_by": versions, PAUSED: params.backfill == "paused"}))
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


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _strided(items: list[dict[str, Any]], shards: int) -> list[list[dict[str, Any]]]:
    """Items in backfill order dealt to the shards in turn (shard k: items k, k + n, ...),
    so that the shards, running at once, walk the order together."""
    n = max(1, min(shards, len(items)))
    return [items[k::n] for k in range(n)]


def _planned(items: list[dict[str, Any]], params: MigrateParams) -> list[list[dict[str, Any]]]:
    """The backfill shards of a migration without a transform: id order in contiguous
    ranges (as before there was a choice), or a seeded random order, strided."""
    if params.order == "random":
        perm = np.random.default_rng(params.seed).permutation(len(items))
        return _strided([items[i] for i in perm], params.shards)
    return _plan(items, params.shards)


def _sample(items: list[dict[str, Any]], params: MigrateParams) -> list[dict[str, Any]]:
    """The transform's sample: ``sample_size`` listed items drawn with the job's seed."""
    k = params.sample_size(len(items))
    chosen = np.random.default_rng(params.seed).permutation(len(items))[:k]
    return [items[i] for i in sorted(chosen.tolist())]


def _plan_after_transform(gateway: GatewayPort, job: Job) -> list[int]:
    """The backfill shards of a transformed migration: the listed items in the order the
    transform shard wrote, strided; their indices (planned once: ``backfill_planned``)."""
    params = MigrateParams.model_validate(job.params)
    work = gateway.jobs.work_dir(job.id)
    listed = {i["id"]: i for i in json.loads((work / LISTING).read_text())}
    items = [listed[i] for i in read_order(work) if i in listed]
    planned = _write_shards(gateway, job, _strided(items, params.shards) if items else [[]])
    gateway.jobs.update(job.id, lambda j: j.merged(result={
        "backfill_planned": True, "planned_shards": len(j.shards)}))
    return planned


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
    """The applier's step for migrations (after it applied every spool): each migration
    whose backfill runs moves one step (``drive``); one whose job failed or was cancelled
    before any switch is undone; the shards to queue."""
    queue: list[tuple[str, int]] = []
    for record in await asyncio.to_thread(gateway.registry.galleries):
        m = record.migration
        if m is None:
            continue
        job = await asyncio.to_thread(_job_or_none, gateway, m.job)
        phase = phase_of(m, job)
        if phase == "undoing":
            await abort(gateway, record.name, m.job)
        elif job is not None and not job.finished:
            queue += await drive(gateway, record, job, phase)
    return queue


def _job_or_none(gateway: GatewayPort, job_id: str) -> Job | None:
    try:
        return gateway.jobs.get(job_id)
    except NotFound:
        return None


async def drive(gateway: GatewayPort, record: GalleryRecord, job: Job,
                phase: str) -> list[tuple[str, int]]:
    """One step of a running backfill (``phase``: backfilling, serving, or rolled_back
    with its job still running); the shards to queue. A cancel undoes a migration that
    never switched and stops one that did; the backfill is planned once a transform is
    written; a progressive migration switches when the side beats the route beyond the
    error, and after its switch is checked again (switched back if it falls below the
    route beyond the error); at the end: catch up, gate, ``_finish``."""
    if job.cancel_requested:
        if phase == "backfilling":
            await abort(gateway, record.name, job.id)
        else:
            await _stop(gateway, record, job)
        return []
    if "planned_shards" not in job.result:
        return []  # its submission is still listing the items and planning the shards
    if not job.result.get(PAUSED) and any(s["state"] == "paused" for s in job.shards):
        again = await asyncio.to_thread(gateway.jobs.requeue_shards, job.id, "paused")
        return [(job.id, n) for n in again]  # resumed: each from its cursor
    params = MigrateParams.model_validate(job.params)
    work = gateway.jobs.work_dir(job.id)
    if params.transform and not job.result.get("backfill_planned"):
        transform = [s for s in job.shards if s.get("task") == "transform"]
        if not transform or transform[-1]["state"] != "done" or pending(work):
            return []  # the transform runs, or its spool is still being written
        added = await asyncio.to_thread(_plan_after_transform, gateway, job)
        return [(job.id, n) for n in added]
    if params.switch == "progressive":
        if phase == "backfilling" and job.result.get("switched_back_at_fraction") is None:
            await _maybe_switch_progressively(gateway, record, job)
        elif phase == "serving":
            await _check_after_switch(gateway, record, job)
        record = await asyncio.to_thread(gateway.registry.gallery, record.name)
        job = await asyncio.to_thread(gateway.jobs.get, job.id)
    if any(s["state"] not in ("done", "cancelled") for s in job.shards) or pending(work):
        return []  # still running, or applied at the next tick first
    m = record.migration
    assert m is not None
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
    await _finish(gateway, record, job, params, missing)
    return []


async def _finish(gateway: GatewayPort, record: GalleryRecord, job: Job,
                  params: MigrateParams, missing: list[dict[str, Any]]) -> None:
    """The backfill and its gate are done: end the job by the migration's phase.
    backfilling: switch if auto_switch is on and the gate passed (else the operator
    decides: the job succeeds with why it did not switch). serving (switched
    progressively): a passed gate ends it switched; a failed one switches back to the
    route and fails the job, naming the operator's options. rolled_back: ends as is."""
    assert record.migration is not None
    phase = phase_of(record.migration, job)
    gate = job.gate or {}
    outcome: dict[str, Any] = {"missing": [i["id"] for i in missing][:1000],
                               "missing_count": len(missing), "switched": phase == "serving",
                               "gate_failed": gate.get("passed") is not True}
    if phase == "serving" and gate.get("passed") is not True:
        await _gate_failed_after_switch(gateway, record, job, outcome, gate)
        return
    if phase == "rolled_back":
        outcome["switch_refused"] = "rolled back by the operator after the progressive switch"
    elif phase == "backfilling" and params.auto_switch:
        try:  # the switch comes first, so a finished job says whether it switched
            await switch(gateway, record.name, by=f"job:{job.id}", backfilled=True,
                         reason="auto_switch: every item has its new vector and the gate passed")
            outcome["switched"] = True
            outcome["switched_at_fraction"] = 1.0
        except Conflict as exc:  # the gate failed or items are missing: the operator decides
            log.warning("migration of %s not switched: %s", record.name, exc.message)
            outcome["switch_refused"] = exc.message
    elif phase == "backfilling":
        outcome["switch_refused"] = "auto_switch is off: switch with POST .../migration/switch"
    await asyncio.to_thread(gateway.jobs.finish, job.id, "succeeded", result=outcome)


async def _gate_failed_after_switch(gateway: GatewayPort, record: GalleryRecord, job: Job,
                                    outcome: dict[str, Any], gate: dict[str, Any]) -> None:
    """A progressively switched gallery whose end-of-backfill gate failed: the route serves
    again (the gate says the new side is worse than it), the job fails and says what the
    operator can do."""
    summary = _gate_summary(gate)
    await switch_back(gateway, record.name, by=f"job:{job.id}",
                      reason=f"the end-of-backfill gate failed ({summary}): the route serves "
                             f"again")
    options = ("switch with force=true and a reason to serve the new side anyway, or cancel "
               "the migration to drop it")
    outcome.update({"switched": False, "switched_back": "gate", "switch_refused":
                    f"the migration gate did not pass ({summary})", "options": options})
    await asyncio.to_thread(
        gateway.jobs.finish, job.id, "failed", result=outcome,
        error=f"the end-of-backfill gate failed after the progressive switch ({summary}); "
              f"gallery '{record.name}' was switched back to the route: {options}")


async def _stop(gateway: GatewayPort, record: GalleryRecord, job: Job) -> None:
    """Cancel after a switch: the backfill stops where it is (each shard keeps its cursor)
    and the sides stay; ``resume`` goes on from there."""
    transformed = await asyncio.to_thread(gateway.store.count_made, _target(record),
                                          "transform")
    await asyncio.to_thread(
        gateway.jobs.finish, job.id, "cancelled", result={"stopped": True},
        error=f"cancelled after the switch: the backfill stopped with {transformed} item(s) "
              f"still holding transformed vectors; gallery '{record.name}' keeps its sides "
              f"(resume the migration, or roll back)")


def _target(record: GalleryRecord) -> str:
    assert record.migration is not None
    return record.migration.target.collection


def reembedded_fraction(job: Job) -> float:
    """The share of the listed items whose re-embedded vector the gateway has written (a
    count of writes: an item written twice, by a restarted shard, counts twice, so this is
    an upper bound; ``_reembedded`` counts the side itself)."""
    listed = int(job.result.get("listed", 0))
    return min(1.0, int(job.result.get("applied", 0)) / listed) if listed else 0.0


def _reembedded(gateway: GatewayPort, record: GalleryRecord, job: Job) -> float:
    """The share of the listed items the target side holds re-embedded (each item once)."""
    listed = int(job.result.get("listed", 0))
    if not listed:
        return 0.0
    return min(1.0, gateway.store.count_made(_target(record), "embed") / listed)


async def _maybe_switch_progressively(gateway: GatewayPort, record: GalleryRecord,
                                      job: Job) -> None:
    """Switch when the share of items re-embedded (counted on the target side, each item
    once) has reached ``switch_at`` (the validation curve's point from which the side
    beats the route beyond the error, there and later) and every listed item has a vector
    on the target side (transformed or re-embedded)."""
    at = job.result.get("switch_at")
    if at is None or reembedded_fraction(job) + 1e-9 < float(at):
        return  # the write count is an upper bound: only then count the side
    fraction = await asyncio.to_thread(_reembedded, gateway, record, job)
    if fraction + 1e-9 < float(at):
        return
    served = ", ".join(job.result.get("curve_directions") or ("t2i", "i2t"))
    reason = (f"progressive: {fraction:.1%} of the items re-embedded, the rest transformed; "
              f"on the validation set with the gallery's distractors the side beats the "
              f"route beyond the error ({served}) from {float(at):.0%} of the backfill")
    try:
        await switch(gateway, record.name, by=f"job:{job.id}", reason=reason, progressive=True)
    except Conflict as exc:
        log.warning("migration of %s: progressive switch deferred: %s", record.name, exc.message)
        return
    now = datetime.now(timezone.utc).isoformat()
    await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(result={
        "switched_at_fraction": round(fraction, 4), "switched_at": now}))
    log.info("migration of %s switched progressively at %.1f%%", record.name, 100 * fraction)


async def _check_after_switch(gateway: GatewayPort, record: GalleryRecord, job: Job) -> None:
    """After a progressive switch, at each point of the curve the backfill passes: the
    side measured again with the gallery's own vectors as they stand
    (``transform.live_check``); below the route beyond the error -> switch back."""
    from service.jobkinds.migrate.transform import live_check

    fraction = await asyncio.to_thread(_reembedded, gateway, record, job)
    checked = job.result.get("checks") or []
    last = checked[-1]["fraction"] if checked else job.result.get("switched_at_fraction", 0)
    if fraction < float(last or 0) + CHECK_EVERY - 1e-9:
        return
    check = await asyncio.to_thread(live_check, gateway, record, job, fraction)
    if check is None:
        return
    await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(result={
        "checks": [*(j.result.get("checks") or []), check]}))
    if check["below"]:
        reason = (f"switched back at {fraction:.1%} of the backfill: the side fell below "
                  f"the route beyond the error ({check['why']})")
        await switch_back(gateway, record.name, by=f"job:{job.id}", reason=reason)
        await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(result={
            "switched_back_at_fraction": round(fraction, 4), "switched_back": reason}))


async def switch_back(gateway: GatewayPort, gallery: str, *, by: str, reason: str) -> None:
    """The applier's transition serving -> backfilling: the source side serves again."""
    await _serve_source(gateway, gallery, lambda: gateway.registry.switch_back_migration(
        gallery, by=by, reason=reason))
    log.warning("migration of %s: %s", gallery, reason)



def _rounds(job: Job) -> int:
    """Catch-up rounds so far: backfill shards added after the first plan."""
    first = int(job.result.get("planned_shards", 0))
    return sum(1 for s in job.shards[first:] if s.get("task", "backfill") == "backfill")


# What a reconcile reads of every point of both sides (the missing ones are then read
# whole): a scan converts each payload it reads, holding the interpreter lock while
# searches wait, so it reads the keys only.
RECONCILED = ("item_id", "etag", "made")


def _locked_reconcile(gateway: GatewayPort, gallery: str, m: Migration,
                      job: Job) -> list[dict[str, Any]]:
    with gallery_lock(gateway.settings, gallery):
        return _reconcile(gateway, m, job, skip_unreadable=True, transformed_missing=True)


def _reconcile(gateway: GatewayPort, m: Migration, job: Job, skip_unreadable: bool,
               transformed_missing: bool = False) -> list[dict[str, Any]]:
    """(Under the write lock.) Drop target items the source no longer has (deletes reach
    both sides, so normally none), and list the source items the target lacks; with
    ``transformed_missing``, also those it holds only transformed (still to re-embed);
    with ``skip_unreadable``, not those a worker could not read (they wait for the
    operator)."""
    source = gateway.store.stored(m.source.collection, fields=RECONCILED)
    target = gateway.store.stored(m.target.collection, fields=RECONCILED)
    extra = [i for i in target if i not in source]
    if extra:
        gateway.store.delete(m.target.collection, extra)
    unreadable = ({u["id"] for u in job.result.get("unreadable", [])} if skip_unreadable
                  else set())
    have = {i for i, t in target.items()
            if not (transformed_missing and (t.made or {}).get("by") == "transform")}
    missing = [i for i in sorted(source) if i not in have and i not in unreadable]
    whole = gateway.store.stored(m.source.collection, missing) if missing else {}
    return [_backfill_item(whole[i]) for i in missing if i in whole]


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
                 backfilled: bool = False, progressive: bool = False) -> GalleryRecord:
    """Switch the gallery to the target side. The operator's switch (phase ``awaiting``):
    Conflict while any item has no new vector (unless ``drop`` lists every such item:
    they are deleted from both sides), or when the gate did not pass (unless ``force``
    with a reason); a transformed vector counts as a new vector. ``backfilled``: the
    applier's auto switch at the end of the backfill. ``progressive``: the applier's
    switch while the backfill goes on (the validation curve decided it; only the
    missing-vector check applies)."""
    record = await asyncio.to_thread(_locked_switch, gateway, gallery, by, drop or [], force,
                                     reason, backfilled or progressive, progressive)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.target.collection)
    await gateway.runtime.refresh()
    return record


def _locked_switch(gateway: GatewayPort, gallery: str, by: str, drop: list[str], force: bool,
                   reason: str | None, backfilled: bool,
                   progressive: bool = False) -> GalleryRecord:
    record = gateway.registry.gallery(gallery)
    m = require_migration(record, "backfilling", "switch")
    job = gateway.jobs.get(m.job)
    if progressive:
        require(gallery, m, job, "progressive")
        with gallery_lock(gateway.settings, gallery):
            missing = _reconcile(gateway, m, job, skip_unreadable=False)
            if missing:
                raise Conflict(f"{len(missing)} item(s) have no vector on the target side yet")
            return gateway.registry.switch_migration(gallery, by=by, reason=reason)
    if not backfilled and job.status not in ("succeeded", "failed"):
        view = progress(job)
        raise Conflict(f"the backfill of gallery '{gallery}' is {job.status} ({view['done']}/"
                       f"{view['total']} items); switch when its job {job.id} has ended")
    if not backfilled:
        require(gallery, m, job, "switch")
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
    return await _serve_source(gateway, gallery, lambda: gateway.registry.rollback_migration(
        gallery, by=by, reason=reason))


async def _serve_source(gateway: GatewayPort, gallery: str,
                        change: Callable[[], GalleryRecord]) -> GalleryRecord:
    """The source side serves again: the registry's ``change`` under the write lock, then
    the alias and this replica's serving state."""
    def locked() -> GalleryRecord:
        with gallery_lock(gateway.settings, gallery):
            return change()
    record = await asyncio.to_thread(locked)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.source.collection)
    await gateway.runtime.refresh()
    return record


async def retire(gateway: GatewayPort, gallery: str) -> tuple[GalleryRecord, Side]:
    """End a switched (or rolled back) migration: the side that does not serve is dropped.
    Conflict while its backfill still runs (it checks each item against the source side),
    and, when the target side serves, while items still hold transformed vectors (the
    source side is the only way to re-embed them: resume the migration first)."""
    m, _, phase = await _required(gateway, gallery, "retire")
    if m is not None and phase in ("switched", "stopped"):
        left = await asyncio.to_thread(gateway.store.count_made, m.target.collection,
                                       "transform")
        if left:
            raise Conflict(f"{left} item(s) of gallery '{gallery}' still hold transformed "
                           f"vectors on the serving side; retiring would drop the only side "
                           f"they can be re-embedded from: resume the migration (POST "
                           f".../migration/resume) and retire when its backfill has ended, "
                           f"or delete those items")
    dropped = await asyncio.to_thread(_locked_end, gateway, gallery, False)
    assert dropped is not None
    await gateway.runtime.refresh()
    await asyncio.to_thread(gateway.store.drop_collection, dropped.collection)
    return await asyncio.to_thread(gateway.registry.gallery, gallery), dropped


async def _required(gateway: GatewayPort, gallery: str,
                    action: str) -> tuple[Migration | None, Job | None, str]:
    """The gallery's migration, its job and its phase, if ``action`` is allowed in it
    (``lifecycle.require``: a Conflict that names what is allowed otherwise)."""
    record = await asyncio.to_thread(gateway.registry.gallery, gallery)
    m = record.migration
    job = await asyncio.to_thread(_job_or_none, gateway, m.job) if m else None
    return m, job, require(gallery, m, job, action)


async def cancel(gateway: GatewayPort, gallery: str) -> None:
    """Cancel a migration's backfill. Before any switch the migration is undone: a running
    job is asked to stop (the applier then undoes it); one whose backfill ended without a
    switch (its gate failed, or items are unreadable) is undone now. After a progressive
    switch (or a rollback while the backfill runs) the backfill stops where it is; the
    migration can be resumed."""
    m, job, phase = await _required(gateway, gallery, "cancel")
    assert m is not None
    if job is None or job.finished:
        await abort(gateway, gallery, m.job)
    else:
        await asyncio.to_thread(gateway.jobs.cancel, job.id)
    log.info("migration of %s: cancel in phase %s", gallery, phase)


async def pause(gateway: GatewayPort, gallery: str) -> Job:
    """Pause a running backfill (a lazy migration): each shard stops at its cursor after
    its current batch and frees its worker; the gallery serves as before (with serving
    ``rerank``, searches go on filling the new side). ``resume`` goes on."""
    _, job, phase = await _required(gateway, gallery, "pause")
    assert job is not None
    log.info("migration of %s: backfill paused in phase %s", gallery, phase)
    return await asyncio.to_thread(gateway.jobs.update, job.id,
                                   lambda j: j.merged(result={PAUSED: True}))


async def resume(gateway: GatewayPort, gallery: str) -> Job:
    """A paused backfill goes on (the applier queues its paused shards again, each from
    its cursor). A backfill stopped after a switch (cancelled, or a shard failed) goes on:
    its job runs again and every item still to re-embed is planned again."""
    m, job, _ = await _required(gateway, gallery, "resume")
    assert job is not None and m is not None
    if paused(job):
        log.info("migration of %s: backfill resumed", gallery)
        return await asyncio.to_thread(gateway.jobs.update, job.id,
                                       lambda j: j.merged(result={PAUSED: False}))
    job = await asyncio.to_thread(gateway.jobs.reopen, job.id)
    left = await asyncio.to_thread(_locked_reconcile, gateway, gallery, m, job)
    params = MigrateParams.model_validate(job.params)
    added = await asyncio.to_thread(_write_shards, gateway, job, _plan(left, params.shards))
    await asyncio.to_thread(gateway.jobs.update, job.id, lambda j: j.merged(result={
        "planned_shards": len(j.shards), "resumed_items": len(left)}))
    for n in added:
        await asyncio.to_thread(gateway.queue.send_shard, job.id, n)
    log.info("migration of %s resumed: %d item(s) left to re-embed", gallery, len(left))
    return await asyncio.to_thread(gateway.jobs.get, job.id)



async def view(gateway: GatewayPort, gallery: str) -> MigrationView:
    record = await asyncio.to_thread(gateway.registry.gallery, gallery)
    if record.migration is None:
        raise NotFound(f"gallery '{shown(gallery)}' has no migration")
    m = record.migration
    job = await asyncio.to_thread(_job_or_none, gateway, m.job)
    shown_progress = progress(job) if job else {}
    if job is not None:  # the read-through fill: what reranked searches embedded and wrote
        shown_progress["filled_by_reads"] = await asyncio.to_thread(
            gateway.store.count_where, m.target.collection, "made.via", "read")
        shown_progress["filled_by_backfill"] = shown_progress.get("applied")
    return MigrationView(record, m, job, shown_progress)


def job_progress(job: Job) -> dict[str, Any]:
    """What a migrate job's record shows: its shards' progress once it has them."""
    return progress(job) if job.shards else {}


def progress(job: Job) -> dict[str, Any]:
    """done/total over the items to re-embed (a transform's sample, then the backfill
    shards), items/s since the job started, ETA, stage; the fraction re-embedded (what
    the gateway has written); with a transform: what it did, the validation curve, the
    share of the gain it estimates at the current fraction, where it switches (or did)."""
    embedding = [s for s in job.shards if s.get("task", "backfill") in ("backfill", "transform")]
    done = sum(int(s.get("done", 0)) for s in embedding)
    total = sum(int(s.get("total", 0)) for s in embedding)
    params = MigrateParams.model_validate(job.params)
    if params.transform and not job.result.get("backfill_planned"):
        total = max(total, int(job.result.get("listed", 0)))  # the backfill is not planned yet
    rate = None
    if job.started_at and done:
        end = datetime.fromisoformat(job.ended_at) if job.ended_at else datetime.now(timezone.utc)
        rate = done / max((end - datetime.fromisoformat(job.started_at)).total_seconds(), 1e-6)
    eta = (total - done) / rate if rate else None
    gate = [s for s in job.shards if s.get("task") == "gate"]
    transform = [s for s in job.shards if s.get("task") == "transform"]
    stage = ("transform" if transform and transform[-1]["state"] != "done" else
             "backfill" if any(s["state"] != "done" for s in embedding) or (
                 params.transform and not job.result.get("backfill_planned")) else
             "gate" if not gate or gate[-1]["state"] != "done" else
             "done" if job.finished else "applying")
    fraction = reembedded_fraction(job)
    out = {"stage": stage, "done": done, "total": total,
           "items_per_s": round(rate, 2) if rate else None,
           "eta_s": round(eta, 1) if eta is not None else None,
           "applied": int(job.result.get("applied", 0)),
           "unreadable": int(job.result.get("unreadable_count",
                                            len(job.result.get("unreadable", [])))),
           "fraction": round(fraction, 4), "order": params.order, "switch": params.switch,
           "paused": bool(job.result.get(PAUSED)) and not job.finished,
           "transformed": int(job.result.get("transformed", 0)),
           "switch_at": job.result.get("switch_at"),
           "switched_at_fraction": job.result.get("switched_at_fraction"),
           "switched_at": job.result.get("switched_at")}
    if params.transform:
        curve = job.result.get("curve")
        out.update({"transform": job.result.get("transform"), "curve": curve,
                    "routed": job.result.get("routed"),
                    "share_estimate": _estimate(curve, fraction)})
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


def _gate_summary(gate: dict[str, Any]) -> str:
    checks = gate.get("checks") or []
    if not checks:
        return str(gate.get("reason") or "no gate report")
    return ", ".join(f"{c['direction']} migrated {c['migrated']:.3f} vs routed "
                     f"{c['routed']:.3f}" for c in checks)
