"""A job's life in the worker: start (queued -> running), run its kind's runner under a
heartbeat, and record the final status. Whatever goes wrong, the job's work directory
(where a candidate artifact is written) is removed, so a failed or cancelled job leaves
the registry and the galleries as they were."""

from __future__ import annotations

import logging

from service.state.config import Settings
from service.state.jobs.store import Job, JobNotFound, JobStore
from worker.context import Cancelled, Heartbeat, JobContext
from worker.runners import RUNNERS

log = logging.getLogger(__name__)


def run(job_id: str, settings: Settings, worker: str) -> Job | None:
    """Run a queued job to its end; None when there is nothing to run (unknown id, or
    not queued any more: cancelled, or a duplicate delivery)."""
    store = JobStore(settings.registry_dir)
    try:
        job = store.start(job_id, worker)
    except JobNotFound:
        log.warning("job %s has no record (its submission was rolled back); skipped", job_id)
        return None
    if job is None:
        log.info("job %s is not queued any more; skipped", job_id)
        return None
    log.info("job %s (%s) started on %s", job.id, job.kind, worker)
    with Heartbeat(store, job.id, settings.job_heartbeat_s) as heartbeat:
        try:
            outcome = RUNNERS[job.kind](JobContext(job, settings, store, heartbeat))
        except Cancelled:
            return store.finish(job.id, "cancelled", progress=heartbeat.progress or {},
                                error="cancelled while running; no version was registered")
        except Exception as exc:
            log.exception("job %s failed", job.id)
            return store.finish(job.id, "failed", progress=heartbeat.progress or {},
                                error=f"{type(exc).__name__}: {exc}")
    return store.finish(job.id, "succeeded", progress=heartbeat.progress or {}, **outcome)
