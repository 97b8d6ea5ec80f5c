"""A migration's start (a ``migrate`` job's submission) and the plans of its shards.

``start``: create the target collection, record the migration in the registry (from now
on every write reaches both sides: the items API embeds for each side, under the
gallery's write lock), create the migration's own record and folder (``record``), list
the items (under that lock, so a write is either in the list or written to both sides),
and plan its shards (``planning``). With ``transform`` it snapshots the stored vectors
and plans one ``transform`` shard (the sample) instead; the backfill is planned once that
shard is done (``planning.plan_after_transform``).

Why a new collection rather than new named vectors: the target may have another width,
a retire is one collection drop, a rollback is one pointer move, and a half-built side
is never inside the collection that serves.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.ingest import KIND as INGEST
from service.jobkinds.migrate import planning
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.planning import backfill_item, write_shards
from service.jobkinds.migrate.transform import LISTING, write_snapshot
from service.state.errors import Conflict, Unavailable
from service.state.gallery.locks import gallery_lock
from service.state.jobs.shards import PAUSED
from service.state.jobs.store import Job


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
    from service.jobkinds.migrate.actions import abort

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
    from service.jobkinds.migrate.actions import abort

    record = await asyncio.to_thread(gateway.registry.gallery, job.gallery)
    native = await asyncio.to_thread(gateway.registry.version, record.active)
    dim = (await gateway.runtime.embedder(native.version_id, native.space)).dim
    source = record.collection or await asyncio.to_thread(gateway.store.collection_of,
                                                           job.gallery)
    if source is None:
        raise Conflict(f"gallery '{job.gallery}' has no collection in Qdrant")
    target = await asyncio.to_thread(gateway.store.create_side, job.gallery, dim)
    try:
        await asyncio.to_thread(records.create, gateway.jobs, job.id, job.gallery)
        await asyncio.to_thread(gateway.registry.begin_migration, job.gallery, job=job.id,
                                source=source, target=target, by=job.created_by,
                                serving=params.serving, rerank_k=params.rerank_k)
    except BaseException:
        await asyncio.to_thread(gateway.store.drop_collection, target)
        await asyncio.to_thread(records.remove, gateway.jobs, job.id)
        raise
    try:
        await gateway.runtime.refresh()  # this replica writes both sides from here on
        items, versions = await asyncio.to_thread(_listing, gateway, job.gallery, source)
        if params.transform:
            folder = records.folder(gateway.jobs, job.id)
            await asyncio.to_thread(write_snapshot, gateway.store, source, items,
                                    gateway.jobs.work_dir(job.id))
            await asyncio.to_thread(records.write_json, folder / LISTING, items)
            planned = await asyncio.to_thread(write_shards, gateway, job,
                                              [planning.sample(items, params)], "transform")
        else:
            plan = (await asyncio.to_thread(planning.candidate_plan, gateway, job, items,
                                            "start", params.shards)
                    if params.order == "candidates" else planning.planned(items, params))
            planned = await asyncio.to_thread(write_shards, gateway, job, plan)
        if params.backfill == "paused":
            await asyncio.to_thread(gateway.jobs.update, job.id,
                                    lambda j: j.merged(result={PAUSED: True}))
        await asyncio.to_thread(records.merge, gateway.jobs, job.id, listed=len(items),
                                embedded_by=versions, planned_shards=len(planned))
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
    return ([backfill_item(s) for s in sorted(stored.values(), key=lambda s: s.id)],
            dict(versions.most_common()))


