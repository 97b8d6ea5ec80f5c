"""Jobs: submit (check, record, queue; if the broker refuses, undo the record), list, read,
cancel. Reads first reap running jobs whose worker went silent (a killed worker): failed, or
queued again when they saved a checkpoint to resume from. A job is
only accepted while some worker is alive (its liveness record is fresh): one that nothing
would run is a 503 now, not a job that stays queued forever."""

from __future__ import annotations

import asyncio
from typing import Any

from service.jobkinds import Params, check_job, kind_of
from service.runtime.gateway import Gateway
from service.state.errors import Unavailable
from service.state.jobs.store import Job
from service.state.jobs.workers import live_workers, require_live_worker
from service.state.paths import Roots


async def submit_job(gateway: Gateway, kind: str, gallery: str,
                     params: Params | dict[str, Any], auto_promote: bool, by: str) -> Job:
    """A queued job, or InvalidInput (bad parameters, nothing created), Conflict (the kind
    cannot start now) or Unavailable (no live worker, or the broker is down: the record is
    removed again, so nothing is half-created). ``params``: as the API's schema parsed
    them (checked here for what they name), or a dict (parsed here). The kind's ``start``
    queues the job (``service.jobkinds``)."""
    job_kind = kind_of(kind)
    parsed = await asyncio.to_thread(check_job, kind, gallery, params, gateway.registry,
                                     Roots.of(gateway.settings))
    await asyncio.to_thread(job_kind.can_start, gateway, gallery)
    await asyncio.to_thread(require_live_worker, gateway.settings)
    job = await asyncio.to_thread(gateway.jobs.create, kind, gallery,
                                  parsed.model_dump(by_alias=True), by=by,
                                  auto_promote=auto_promote)
    return await job_kind.start(gateway, job, parsed)


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
