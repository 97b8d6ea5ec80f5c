"""Submitting a job: check it, record it, queue it; if the broker refuses, undo the record."""

from __future__ import annotations

import asyncio
from typing import Any

from service.core.config import Settings
from service.core.errors import InvalidInput, Unavailable
from service.jobs.broker import JobQueue
from service.jobs.specs import check_job
from service.jobs.store import Job, JobStore
from service.registry import Registry


async def submit_job(registry: Registry, jobs: JobStore, queue: JobQueue, settings: Settings,
                     kind: str, gallery: str, params: dict[str, Any], auto_promote: bool,
                     by: str) -> Job:
    """A queued job, or InvalidInput (bad parameters, nothing created) or Unavailable (the
    broker is down: the record is removed again, so nothing is half-created)."""
    parsed = await asyncio.to_thread(check_job, kind, gallery, params, registry)
    if kind == "ingest" and settings.qdrant_url is None:
        raise InvalidInput("ingest jobs write to Qdrant from a worker, which needs a Qdrant "
                           "server (NOBACKFILL_QDRANT_URL): the embedded Qdrant is open in "
                           "this gateway only; add items with POST /v1/galleries/{gallery}/"
                           "items instead")
    job = await asyncio.to_thread(jobs.create, kind, gallery, parsed.model_dump(by_alias=True),
                                  by=by, auto_promote=auto_promote)
    try:
        await asyncio.wait_for(asyncio.to_thread(queue.send, job.id),
                               timeout=settings.broker_timeout_s * 2)
    except (Unavailable, asyncio.TimeoutError) as exc:
        await asyncio.to_thread(jobs.delete, job.id)
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable(f"the job queue did not answer within "
                          f"{settings.broker_timeout_s * 2:.0f}s; the job was not created") from exc
    return job
