"""Jobs: submit (check, record, queue; if the broker refuses, undo the record), list, read,
cancel. Reads first reap running jobs whose worker went silent (a killed worker): failed, or
queued again when they saved a checkpoint to resume from. A job is
only accepted while some worker is alive (its liveness record is fresh): one that nothing
would run is a 503 now, not a job that stays queued forever."""

from __future__ import annotations

import asyncio
from typing import Any

from service.runtime.gateway import Gateway
from service.state.errors import Unavailable
from service.state.jobs.specs import check_job
from service.state.jobs.store import Job
from service.state.jobs.workers import live_workers, require_live_worker
from service.state.paths import Roots
from service.usecases import migration


async def submit_job(gateway: Gateway, kind: str, gallery: str, params: dict[str, Any],
                     auto_promote: bool, by: str) -> Job:
    """A queued job, or InvalidInput (bad parameters, nothing created) or Unavailable (no
    live worker, or the broker is down: the record is removed again, so nothing is
    half-created)."""
    settings, jobs = gateway.settings, gateway.jobs
    parsed = await asyncio.to_thread(check_job, kind, gallery, params, gateway.registry,
                                     Roots.of(settings))
    if kind == "migrate":
        await asyncio.to_thread(migration.check_can_start, gateway, gallery)
    await asyncio.to_thread(require_live_worker, settings)
    job = await asyncio.to_thread(jobs.create, kind, gallery, parsed.model_dump(by_alias=True),
                                  by=by, auto_promote=auto_promote)
    if kind == "migrate":
        return await _submit_shards(gateway, job)
    try:  # what the worker needs from the gallery store, read here: this process owns it
        await asyncio.to_thread(parsed.snapshot, gateway.store, gallery, jobs.work_dir(job.id))
    except Exception:
        await asyncio.to_thread(jobs.delete, job.id)
        raise
    try:
        await asyncio.wait_for(asyncio.to_thread(gateway.queue.send, job.id),
                               timeout=settings.broker_timeout_s * 2)
    except (Unavailable, asyncio.TimeoutError) as exc:
        await asyncio.to_thread(jobs.delete, job.id)
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable(f"the job queue did not answer within "
                          f"{settings.broker_timeout_s * 2:.0f}s; the job was not created") from exc
    return job


async def _submit_shards(gateway: Gateway, job: Job) -> Job:
    """A migration: open it and plan its shards (``migration.prepare``), then queue every
    shard; if any step fails, the migration is undone and the job record removed."""
    try:
        shards = await migration.prepare(gateway, job)
    except Exception:
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        raise
    try:
        for shard in shards:
            await asyncio.wait_for(asyncio.to_thread(gateway.queue.send_shard, job.id, shard),
                                   timeout=gateway.settings.broker_timeout_s * 2)
    except (Unavailable, asyncio.TimeoutError) as exc:
        await migration.abort(gateway, job.gallery, job.id)
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable("the job queue did not answer; the migration was not started") from exc
    return await asyncio.to_thread(gateway.jobs.get, job.id)


async def list_jobs(gateway: Gateway) -> list[Job]:
    """Every job, newest first."""
    await _reap(gateway)
    return list(await asyncio.to_thread(gateway.jobs.list))


async def get_job(gateway: Gateway, job_id: str) -> Job:
    await _reap(gateway)
    return await asyncio.to_thread(gateway.jobs.get, job_id)


async def cancel_job(gateway: Gateway, job_id: str) -> Job:
    """A queued job is cancelled at once; a running one stops within a few steps."""
    return await asyncio.to_thread(gateway.jobs.cancel, job_id)


async def worker_count(gateway: Gateway) -> int:
    """How many workers are alive now (for readiness: the gateway still serves search
    without any; only job submission needs one)."""
    return len(await asyncio.to_thread(live_workers, gateway.settings))


async def _reap(gateway: Gateway) -> None:
    """Jobs whose worker went silent: failed, or queued again and sent (they resume from
    their checkpoint); one the broker refuses fails, naming why."""
    reaped = await asyncio.to_thread(gateway.jobs.reap, gateway.settings.job_stale_after_s)
    for job_id in reaped.requeued:
        try:
            await asyncio.wait_for(asyncio.to_thread(gateway.queue.send, job_id),
                                   timeout=gateway.settings.broker_timeout_s * 2)
        except (Unavailable, asyncio.TimeoutError) as exc:
            await asyncio.to_thread(gateway.jobs.requeue_failed_to_send, job_id,
                                    str(exc) or "the job queue did not answer")
