"""A migration's transitions that change which side serves or whether it goes on: the
operator's (switch, rollback, retire, cancel, pause, resume) and the ones the applier
carries out (the progressive switch, the switch back, the auto switch at the end, the
stop after a switch, the undo). Each asks the lifecycle table first (``require``): a
refused one is a Conflict (409) that names the phase and what is allowed.

A switch is one registry update that moves the gallery's space and collection to the
target side (each request captured one ``Serving``: it finishes on the side it started
on). The source side is kept, and still written, until ``retire``; ``rollback`` goes
back. Changes that race (a cancel and the applier's progressive switch, a write and a
reconcile) take the gallery's write lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.lifecycle import paused, require
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.planning import (
    backfill_item,
    candidate_plan,
    ranges,
    replan_paused,
    write_shards,
)
from service.jobkinds.migrate.record import MigrationState
from service.state.errors import Conflict, GateFailed, InvalidInput, NotFound, shown
from service.state.gallery.locks import gallery_lock
from service.state.jobs.shards import PAUSED
from service.state.jobs.store import Job
from service.state.registry import GalleryRecord
from service.state.registry.records import Migration, Side

log = logging.getLogger(__name__)
SHOWN_IDS = 20  # item ids an error message names (the job record has all)


@dataclass(frozen=True)
class Current:
    """A gallery's migration as its three records hold it now."""

    record: GalleryRecord
    migration: Migration | None
    job: Job | None
    state: MigrationState | None

    def require(self, action: str) -> str:
        return require(self.record.name, self.migration, self.job, action, self.state)


def current(gateway: GatewayPort, gallery: str) -> Current:
    record = gateway.registry.gallery(gallery)
    m = record.migration
    if m is None:
        return Current(record, None, None, None)
    job = job_or_none(gateway, m.job)
    state = records.load(gateway.jobs, m.job)
    if state is None and job is not None and "listed" in job.result:
        state = records.adopt(gateway.jobs, job)  # opened before records were kept
    return Current(record, m, job, state)


def job_or_none(gateway: GatewayPort, job_id: str) -> Job | None:
    try:
        return gateway.jobs.get(job_id)
    except NotFound:
        return None


def bound_gate(job: Job, m: Migration, gallery: str) -> dict[str, Any] | None:
    """The job's gate report if it was measured for this gallery and this target side
    (else None: no gate has run for them)."""
    gate = job.gate
    if not gate or gate.get("gallery") != gallery or gate.get("target") != m.target.collection:
        return None
    return gate


# ------------------------------------------------------------------ switching
async def switch(gateway: GatewayPort, gallery: str, *, by: str, drop: list[str] | None = None,
                 force: bool = False, reason: str | None = None,
                 backfilled: bool = False, progressive: bool = False) -> GalleryRecord:
    """Switch the gallery to the target side. The operator's switch (phase ``awaiting``):
    Conflict while any item has no new vector (unless ``drop`` lists every such item:
    they are deleted from both sides), or when the gate did not pass (unless ``force``
    with a reason); a transformed vector counts as a new vector. ``backfilled``: the
    applier's auto switch at the end of the backfill (``finish``). ``progressive``: the
    applier's switch while the backfill goes on (the validation curve decided it; only
    the missing-vector check applies; refused once a cancel was asked or the side was
    switched back)."""
    record = await asyncio.to_thread(_locked_switch, gateway, gallery, by, drop or [], force,
                                     reason, backfilled, progressive)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.target.collection)
    await gateway.runtime.refresh()
    return record


def _locked_switch(gateway: GatewayPort, gallery: str, by: str, drop: list[str], force: bool,
                   reason: str | None, backfilled: bool, progressive: bool) -> GalleryRecord:
    if force and not (reason or "").strip():
        raise InvalidInput("a forced switch needs a reason (it is recorded)")
    with gallery_lock(gateway.settings, gallery):
        now = current(gateway, gallery)
        m, job = now.migration, now.job
        now.require("progressive" if progressive else "finish" if backfilled else "switch")
        assert m is not None and job is not None
        if progressive:
            if job.cancel_requested:
                raise Conflict(f"the migration of gallery '{gallery}' is being cancelled")
            if now.state is not None and now.state.switched_back_at_fraction is not None:
                raise Conflict(f"the migration of gallery '{gallery}' was switched back: it "
                               f"switches again only at the end of its backfill")
            missing = reconcile(gateway, m, job, skip_unreadable=False)
            if missing:
                raise Conflict(f"{len(missing)} item(s) have no vector on the target side yet")
            return gateway.registry.switch_migration(gallery, by=by, reason=reason)
        gate = bound_gate(job, m, gallery) or {}
        if gate.get("passed") is not True and not force:
            raise GateFailed(f"the migration gate did not pass ({gate_summary(gate)}); switch "
                             f"with force=true and a reason to override")
        missing = [i["id"] for i in reconcile(gateway, m, job, skip_unreadable=False)]
        not_dropped = sorted(set(missing) - set(drop))
        if not_dropped:
            reasons = {u["id"]: u["reason"] for u in job.result.get("unreadable", [])}
            named = "; ".join(f"{shown(i)}: {reasons.get(i, 'not backfilled')}"
                              for i in not_dropped[:SHOWN_IDS])
            raise Conflict(f"{len(not_dropped)} item(s) of gallery '{gallery}' have no vector "
                           f"in the new space ({named}); fix their sources and migrate again, "
                           f"or switch with drop=[their ids] to delete them")
        if drop:
            for side in now.record.sides():
                gateway.store.delete(side.collection, drop)
        return gateway.registry.switch_migration(gallery, by=by, reason=reason)


def gate_summary(gate: dict[str, Any]) -> str:
    checks = gate.get("checks") or []
    if not checks:
        return str(gate.get("reason") or "no gate report")
    return ", ".join(f"{c['direction']} migrated {c['migrated']:.3f} vs routed "
                     f"{c['routed']:.3f}" for c in checks)


async def rollback(gateway: GatewayPort, gallery: str, *, by: str,
                   reason: str | None = None) -> GalleryRecord:
    """A switched gallery goes back to the source side (its space and the route)."""
    return await _serve_source(gateway, gallery, "rollback", lambda: (
        gateway.registry.rollback_migration(gallery, by=by, reason=reason)))


async def switch_back(gateway: GatewayPort, gallery: str, *, by: str, reason: str,
                      action: str = "switch_back") -> None:
    """The applier's transition serving -> backfilling (``action``: switch_back after a
    check, gate_failed at the end): the source side serves again."""
    await _serve_source(gateway, gallery, action, lambda: (
        gateway.registry.switch_back_migration(gallery, by=by, reason=reason)))
    log.warning("migration of %s: %s", gallery, reason)


async def _serve_source(gateway: GatewayPort, gallery: str, action: str,
                        change: Callable[[], GalleryRecord]) -> GalleryRecord:
    """The source side serves again: ``action`` asked of the table and the registry's
    ``change``, under the write lock; then the alias and this replica's serving state."""
    def locked() -> GalleryRecord:
        with gallery_lock(gateway.settings, gallery):
            current(gateway, gallery).require(action)
            return change()
    record = await asyncio.to_thread(locked)
    assert record.migration is not None
    await asyncio.to_thread(gateway.store.point_alias, gallery, record.migration.source.collection)
    await gateway.runtime.refresh()
    return record


# ------------------------------------------------------------------ ending
async def retire(gateway: GatewayPort, gallery: str) -> tuple[GalleryRecord, Side]:
    """End a switched (or rolled back) migration: the side that does not serve is dropped.
    Conflict while its backfill still runs (it checks each item against the source side),
    and, when the target side serves, while items still hold transformed vectors (the
    source side is the only way to re-embed them: resume the migration first)."""
    now = await asyncio.to_thread(current, gateway, gallery)
    phase = now.require("retire")
    m = now.migration
    if m is not None and phase in ("switched", "stopped"):
        left = await asyncio.to_thread(gateway.store.count_made, m.target.collection,
                                       "transform")
        if left:
            raise Conflict(f"{left} item(s) of gallery '{gallery}' still hold transformed "
                           f"vectors on the serving side; retiring would drop the only side "
                           f"they can be re-embedded from: resume the migration (POST "
                           f".../migration/resume) and retire when its backfill has ended, "
                           f"or delete those items")
    dropped = await asyncio.to_thread(_locked_end, gateway, gallery, False, "retire")
    assert dropped is not None
    await gateway.runtime.refresh()
    await asyncio.to_thread(gateway.store.drop_collection, dropped.collection)
    return await asyncio.to_thread(gateway.registry.gallery, gallery), dropped


async def abort(gateway: GatewayPort, gallery: str, job_id: str, action: str = "fail") -> None:
    """Undo a migration before any switch (``action``: cancel, or fail: its job was
    cancelled or failed, or its start failed): the registry first (writes stop reaching
    the target), then the target collection and the migration's folder; the job ends."""
    dropped = await asyncio.to_thread(_locked_end, gateway, gallery, True, action, job_id)
    await gateway.runtime.refresh()
    if dropped is not None:
        await asyncio.to_thread(gateway.store.drop_collection, dropped.collection)
    try:
        now = await asyncio.to_thread(gateway.jobs.get, job_id)
    except NotFound:
        return  # a start that failed: its record is removed by the caller
    if not now.finished:
        await asyncio.to_thread(
            gateway.jobs.finish, job_id, "cancelled",
            error="cancelled; the migration was undone (its target side was dropped, the "
                  "gallery serves as before)")
    log.warning("migration of %s (job %s) undone", gallery, job_id)


def _locked_end(gateway: GatewayPort, gallery: str, abort: bool, action: str,
                job_id: str | None = None) -> Side | None:
    with gallery_lock(gateway.settings, gallery):
        now = current(gateway, gallery)
        if abort and (now.migration is None or now.migration.job != job_id):
            if job_id is not None:
                records.remove(gateway.jobs, job_id)
            return None  # ended already (a repeated abort)
        now.require(action)
        ended = gateway.registry.end_migration(gallery, abort=abort)[1]
        assert now.migration is not None
        records.remove(gateway.jobs, now.migration.job)
        return ended


async def stop(gateway: GatewayPort, record: GalleryRecord, job: Job) -> None:
    """The applier carries out a cancel after a switch: the backfill stops where it is
    (each shard keeps its cursor) and the sides stay; ``resume`` goes on from there."""
    assert record.migration is not None
    await asyncio.to_thread(lambda: current(gateway, record.name).require("cancel"))
    transformed = await asyncio.to_thread(gateway.store.count_made,
                                          record.migration.target.collection, "transform")
    await asyncio.to_thread(
        gateway.jobs.finish, job.id, "cancelled",
        error=f"cancelled after the switch: the backfill stopped with {transformed} item(s) "
              f"still holding transformed vectors; gallery '{record.name}' keeps its sides "
              f"(resume the migration, or roll back)")


# ------------------------------------------------------------------ the backfill
async def cancel(gateway: GatewayPort, gallery: str) -> None:
    """Cancel a migration's backfill. Before any switch the migration is undone: a running
    job is asked to stop (the applier then undoes it); one whose backfill ended without a
    switch (its gate failed, or items are unreadable) is undone now. After a progressive
    switch (or a rollback while the backfill runs) the backfill stops where it is; the
    migration can be resumed. (Asked under the write lock: a progressive switch the
    applier is about to make sees it.)"""
    def locked() -> tuple[str, Job | None, str]:
        with gallery_lock(gateway.settings, gallery):
            now = current(gateway, gallery)
            phase = now.require("cancel")
            assert now.migration is not None
            if now.job is not None and not now.job.finished:
                gateway.jobs.cancel(now.job.id)
            return phase, now.job, now.migration.job
    phase, job, job_id = await asyncio.to_thread(locked)
    if job is None or job.finished:
        await abort(gateway, gallery, job_id, "cancel")
    log.info("migration of %s: cancel in phase %s", gallery, phase)


async def pause(gateway: GatewayPort, gallery: str) -> Job:
    """Pause a running backfill (a lazy migration): each shard stops at its cursor after
    its current batch and frees its worker; the gallery serves as before (with serving
    ``rerank``, searches go on filling the new side). ``resume`` goes on."""
    now = await asyncio.to_thread(current, gateway, gallery)
    phase = now.require("pause")
    assert now.job is not None
    log.info("migration of %s: backfill paused in phase %s", gallery, phase)
    return await asyncio.to_thread(gateway.jobs.update, now.job.id,
                                   lambda j: j.merged(result={PAUSED: True}))


async def resume(gateway: GatewayPort, gallery: str) -> Job:
    """A paused backfill goes on (the applier queues its paused shards again, each from
    its cursor). A backfill stopped after a switch (cancelled, or a shard failed) goes on:
    its job runs again, unpaused, and every item still to re-embed is planned again (the
    gate, if it has not run for this side, is planned at the end as usual)."""
    now = await asyncio.to_thread(current, gateway, gallery)
    now.require("resume")
    m, job = now.migration, now.job
    assert job is not None and m is not None
    if paused(job):
        if MigrateParams.model_validate(job.params).order == "candidates":
            dealt = await asyncio.to_thread(replan_paused, gateway, job)
            log.info("migration of %s: %d item(s) dealt again in candidate order", gallery,
                     dealt)
        log.info("migration of %s: backfill resumed", gallery)
        return await asyncio.to_thread(gateway.jobs.update, job.id,
                                       lambda j: j.merged(result={PAUSED: False}))
    await asyncio.to_thread(gateway.jobs.reopen, job.id)
    job = await asyncio.to_thread(gateway.jobs.update, job.id,
                                  lambda j: j.merged(result={PAUSED: False}))
    left = await asyncio.to_thread(locked_reconcile, gateway, gallery, m, job)
    params = MigrateParams.model_validate(job.params)
    plan = (await asyncio.to_thread(candidate_plan, gateway, job, left, "resume", params.shards)
            if params.order == "candidates" else ranges(left, params.shards))
    added = await asyncio.to_thread(write_shards, gateway, job, plan)
    await asyncio.to_thread(records.merge, gateway.jobs, job.id, resumed_items=len(left),
                            planned_shards=len(job.shards) + len(added))
    for n in added:
        await asyncio.to_thread(gateway.queue.send_shard, job.id, n)
    log.info("migration of %s resumed: %d item(s) left to re-embed", gallery, len(left))
    return await asyncio.to_thread(gateway.jobs.get, job.id)


# What a reconcile reads of every point of both sides (the missing ones are then read
# whole): a scan converts each payload it reads, holding the interpreter lock while
# searches wait, so it reads the keys only.
RECONCILED = ("item_id", "etag", "made")


def locked_reconcile(gateway: GatewayPort, gallery: str, m: Migration,
                     job: Job) -> list[dict[str, Any]]:
    with gallery_lock(gateway.settings, gallery):
        return reconcile(gateway, m, job, skip_unreadable=True, transformed_missing=True)


def reconcile(gateway: GatewayPort, m: Migration, job: Job, skip_unreadable: bool,
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
    return [backfill_item(whole[i]) for i in missing if i in whole]
