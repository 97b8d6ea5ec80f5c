"""The gateway's applier: the one process that owns the gallery store writes what workers
computed (``service.vectors.spool``), with a ``DirectWriter``, on the embedded default and
on a server alike.

Every ``apply_interval_s``: apply the spool of each unfinished job of a kind that spools
(``JobKind.spools``: ``ingest``, ``migrate``; under the gallery's write lock), then call
its kind's ``finish`` (an ``ingest`` job whose spool is all written succeeds), queue again
the shards of workers that went silent, and run each kind's ``tick`` (a backfilling
migration moves one step: ``service.jobkinds.migrate.drive``). Replicas share the work through a lock
on the shared volume: one applies at a time.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from filelock import FileLock, Timeout

from service.jobkinds import KINDS
from service.runtime.gateway import Gateway
from service.state.gallery.locks import LOCKS
from service.state.jobs.store import Job
from service.vectors.spool import pending, read_batch
from service.vectors.writer import Applied, DirectWriter

log = logging.getLogger(__name__)
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
            if j.kind in KINDS and KINDS[j.kind].spools and not j.finished]
    for job in jobs:
        await asyncio.to_thread(apply_spool, gateway, job)
        await asyncio.to_thread(KINDS[job.kind].finish, gateway, job)
    queue = await asyncio.to_thread(gateway.jobs.reap_shards,
                                    gateway.settings.job_stale_after_s)
    for kind in KINDS.values():
        queue += await kind.tick(gateway)
    for job_id, shard in queue:
        log.info("queueing shard %d of job %s", shard, job_id)
        await asyncio.to_thread(gateway.queue.send_shard, job_id, shard)


def apply_spool(gateway: Gateway, job: Job) -> int:
    """Write the job's spooled batches into its gallery, oldest first; each file is removed
    once written, and the job record counts what was written. A batch that cannot be
    read or written fails the job (a migration is then undone)."""
    work = gateway.jobs.work_dir(job.id)
    writer = DirectWriter.registered(gateway.store, gateway.settings, gateway.registry,
                                     job.gallery)
    written = 0
    for path in pending(work):
        try:
            batch = read_batch(path)
            applied = writer.write(batch)
        except Exception as exc:
            log.exception("job %s: spooled batch %s could not be applied", job.id, path.name)
            gateway.jobs.finish(job.id, "failed", error=f"spooled batch {path.name} could not "
                                f"be written: {type(exc).__name__}: {str(exc)[:300]}")
            return written
        gateway.jobs.update(job.id, lambda j, a=applied, m=batch.mode: _count(j, a, m))
        path.unlink(missing_ok=True)
        written += applied.written
    return written


def _count(job: Job, applied: Applied, mode: str = "upsert") -> Job:
    result = dict(job.result)
    key = "transformed" if mode == "transform" else "applied"  # transformed: no encoder ran
    result[key] = int(result.get(key, 0)) + applied.written
    result["skipped"] = int(result.get("skipped", 0)) + applied.skipped
    if applied.unreadable:
        listed = [*result.get("unreadable", []), *applied.unreadable]
        result["unreadable_count"] = int(result.get("unreadable_count", 0)) + len(
            applied.unreadable)
        result["unreadable"] = listed[:KEPT_UNREADABLE]
    return replace(job, result=result)
