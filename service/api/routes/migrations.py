"""A gallery's migration into its active version's native space (admin): start it (a
``migrate`` job), watch it, switch, roll back, retire the side that does not serve, pause
or resume its backfill, keep both sides as the served mode at its end, or cancel it
(before a switch the target side is dropped; after a progressive switch the backfill
stops and can be resumed). Every action asks the
lifecycle table: a refused one is a 409 that names the phase and what is allowed."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.examples import MIGRATE_JOB, MIGRATION_RESPONSE, example_response
from service.api.schemas.jobs import JobOut
from service.api.schemas.migrations import (
    KeepIn,
    MigrationIn,
    MigrationOut,
    ReasonIn,
    RetiredOut,
    SideOut,
    SwitchIn,
)
from service.jobkinds.migrate import KIND as MIGRATE
from service.jobkinds.migrate import actions as migration
from service.jobkinds.migrate import keep as ending
from service.jobkinds.migrate.view import view
from service.usecases import jobs

router = APIRouter(prefix=f"{API_V1}/galleries/{{gallery}}/migration", tags=["migrations"])


@router.post("", response_model=JobOut, status_code=202,
             responses=example_response(202, MIGRATE_JOB))
async def start(gallery: str, body: MigrationIn, gateway: GatewayDep, admin: AdminDep) -> JobOut:
    """Re-embed every item with the active version natively into a new side, while
    searches go on through its route; switch when done and gated (auto_switch). 409 while
    a migration of the gallery is open or it is already in that space."""
    return JobOut.of(await jobs.submit_job(gateway, MIGRATE.name, gallery, body, False, admin))


@router.get("", response_model=MigrationOut,
            responses=example_response(200, MIGRATION_RESPONSE))
async def get(gallery: str, gateway: GatewayDep, _: AdminDep) -> MigrationOut:
    """State, sides, progress (done/total, items/s, ETA), gate and unreadable items."""
    return MigrationOut.of(await view(gateway, gallery))


@router.post("/switch", response_model=MigrationOut)
async def switch(gallery: str, body: SwitchIn, gateway: GatewayDep,
                 admin: AdminDep) -> MigrationOut:
    """Switch to the new side now (when auto_switch was off, the gate failed, or items
    must be dropped). 409 while the backfill runs or items lack a new vector."""
    await migration.switch(gateway, gallery, by=admin, drop=list(body.drop), force=body.force,
                           reason=body.reason)
    return MigrationOut.of(await view(gateway, gallery))


@router.post("/rollback", response_model=MigrationOut)
async def rollback(gallery: str, body: ReasonIn, gateway: GatewayDep,
                   admin: AdminDep) -> MigrationOut:
    """Serve from the old side again (its space, through the route) in one call."""
    await migration.rollback(gateway, gallery, by=admin, reason=body.reason)
    return MigrationOut.of(await view(gateway, gallery))


@router.post("/retire", response_model=RetiredOut)
async def retire(gallery: str, gateway: GatewayDep, _: AdminDep) -> RetiredOut:
    """End the migration: delete the side that does not serve (no rollback after this)."""
    record, dropped = await migration.retire(gateway, gallery)
    return RetiredOut(gallery=gallery, space=record.space,
                      dropped=SideOut(space=dropped.space, collection=dropped.collection))


@router.post("/cancel", status_code=204)
async def cancel(gallery: str, gateway: GatewayDep, _: AdminDep) -> None:
    """Before any switch: abandon the migration (a running backfill stops; one that
    finished without switching is undone at once): the new side is dropped, the gallery
    serves as before. After a progressive switch (phase serving, or rolled_back while the
    backfill runs): the backfill stops where it is and the sides stay (phase stopped:
    resume, roll back, or retire). 409 in any other phase (switched: roll back, then
    retire)."""
    await migration.cancel(gateway, gallery)


@router.post("/pause", response_model=MigrationOut)
async def pause(gallery: str, gateway: GatewayDep, _: AdminDep) -> MigrationOut:
    """Pause the bulk backfill (a lazy migration): its shards stop at their cursors and
    free the workers; the gallery serves as before, and with serving rerank its searches
    go on filling the new side. 409 when no backfill runs or it is paused already."""
    await migration.pause(gateway, gallery)
    return MigrationOut.of(await view(gateway, gallery))


@router.post("/resume", response_model=MigrationOut)
async def resume(gallery: str, gateway: GatewayDep, _: AdminDep) -> MigrationOut:
    """Go on with a paused backfill (its shards resume from their cursors), or with one
    that stopped after a switch (cancelled, or a shard failed: the items that still hold
    transformed vectors, or none, are re-embedded). 409 in any other phase (the message
    lists what is allowed)."""
    await migration.resume(gateway, gallery)
    return MigrationOut.of(await view(gateway, gallery))


@router.post("/keep", response_model=MigrationOut)
async def keep(gallery: str, body: KeepIn, gateway: GatewayDep,
               admin: AdminDep) -> MigrationOut:
    """At the end of the backfill, instead of switching: keep both sides as the served
    mode (phase kept), searches ranked by rerank or hybrid and every write embedded into
    both; or change the mode of a kept migration. The view's ``end`` shows what each end
    state measured and what keeping costs. 409 in any other phase, or while an item has
    no new vector of its own."""
    await ending.keep(gateway, gallery, body.mode, by=admin, rerank_k=body.rerank_k,
                      reason=body.reason)
    return MigrationOut.of(await view(gateway, gallery))
