"""The gateway's applier: the one process that owns the gallery store writes what workers
computed (``service.state.gallery.spool``), on the embedded default and on a server alike.

Every ``apply_interval_s``: apply the spool of each unfinished ``ingest`` and ``migrate``
job (under the gallery's write lock), finish ``ingest`` jobs whose spool is all written,
queue again the shards of workers that went silent, and drive each backfilling migration
one step (``service.usecases.migration.drive``). Replicas share the work through a lock
on the shared volume: one applies at a time.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from filelock import FileLock, Timeout

from service.runtime.gateway import Gateway
from service.state.gallery.locks import LOCKS, gallery_lock
from service.state.gallery.spool import Applied, apply_batch, pending, read_batch
from service.state.jobs.store import Job
from service.usecases import migration

log = logging.getLogger(__name__)
SPOOLING = ("ingest", "migrate")  # job kinds whose workers spool into a gallery
KEPT_UNREADABLE = 1000  # unreadable items a job record lists (it counts them all)


async def run_applier(gateway: Gateway, interval_s: float) -> None:
    """Apply forever; a failed tick is logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await tick(gateway)
        except asyncio.CancelledError:
            raise
        except Exception:  # logged; the applier must outlive one bad step
            log.exception("applier tick failed")


async def tick(gateway: Gateway) -> None:
    """One pass (tests call it directly). Skipped while another replica runs one."""
    folder = gateway.settings.registry_dir / LOCKS
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / "applier.lock", timeout=0, thread_local=False)
    try:
        await asyncio.to_thread(lock.acquire)
    except Timeout:
        return
    try:
        await _tick(gateway)
    finally:
        lock.release()


async def _tick(gateway: Gateway) -> None:
    jobs = [j for j in await asyncio.to_thread(gateway.jobs.list)
            if j.kind in SPOOLING and not j.finished]
    for job in jobs:
        await asyncio.to_thread(apply_spool, gateway, job)
        if job.kind == "ingest":
            await asyncio.to_thread(_finish_ingest, gateway, job.id)
    queue = await asyncio.to_thread(gateway.jobs.reap_shards,
                                    gateway.settings.job_stale_after_s)
    for record in await asyncio.to_thread(gateway.registry.galleries):
        if record.migration is not None and record.migration.state == "backfilling":
            queue += await migration.drive(gateway, record)
        elif record.migration is not None:
            await migration.settle(gateway, record)
    for job_id, shard in queue:
        log.info("queueing shard %d of job %s", shard, job_id)
        await asyncio.to_thread(gateway.queue.send_shard, job_id, shard)


def apply_spool(gateway: Gateway, job: Job) -> int:
    """Write the job's spooled batches into its gallery, oldest first; each file is removed
    once written, and the job record counts what was written. A batch that cannot be
    read or written fails the job (a migration is then undone)."""
    work = gateway.jobs.work_dir(job.id)
    written = 0
    for path in pending(work):
        try:
            batch = read_batch(path)
            with gallery_lock(gateway.settings, job.gallery):
                record = gateway.registry.gallery(job.gallery)
                applied = apply_batch(gateway.store, record, batch)
        except Exception as exc:
            log.exception("job %s: spooled batch %s could not be applied", job.id, path.name)
            gateway.jobs.finish(job.id, "failed", error=f"spooled batch {path.name} could not "
                                f"be written: {type(exc).__name__}: {str(exc)[:300]}")
            return written
        gateway.jobs.update(job.id, lambda j, a=applied: _count(j, a))
        path.unlink(missing_ok=True)
        written += applied.written
    return written


def _count(job: Job, applied: Applied) -> Job:
    result = dict(job.result)
    result["applied"] = int(result.get("applied", 0)) + applied.written
    result["skipped"] = int(result.get("skipped", 0)) + applied.skipped
    if applied.unreadable:
        listed = [*result.get("unreadable", []), *applied.unreadable]
        result["unreadable_count"] = int(result.get("unreadable_count", 0)) + len(
            applied.unreadable)
        result["unreadable"] = listed[:KEPT_UNREADABLE]
    return replace(job, result=result)


def _finish_ingest(gateway: Gateway, job_id: str) -> None:
    """An ingest job whose worker is done and whose spool is all written succeeds (one
    cancelled meanwhile ends cancelled: what was written stays, a re-run is idempotent)."""
    job = gateway.jobs.get(job_id)
    if job.status != "applying" or pending(gateway.jobs.work_dir(job_id)):
        return
    if job.cancel_requested:
        gateway.jobs.finish(job_id, "cancelled", error="cancelled while its items were "
                            f"written; {job.result.get('applied', 0)} were written")
        return
    gateway.jobs.finish(job_id, "succeeded")
