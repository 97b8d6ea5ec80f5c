"""A job's life in the worker: start (queued -> running), run its kind's runner
(``service.jobkinds.KINDS[kind].run``, with the parameters as checked at submission) under a
heartbeat, and record the final status. Whatever goes wrong, the job's work directory
(where a candidate artifact is written) is removed, so a failed or cancelled job leaves
the registry and the galleries as they were."""

from __future__ import annotations

import logging
import shutil
from typing import Any

from service.jobkinds import KINDS
from service.state.config import Settings
from service.state.jobs.shards import Paused
from service.state.jobs.store import Job, JobNotFound, JobStore
from worker.context import Cancelled, Heartbeat, JobContext, ShardHeartbeat

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
    attempt = job.attempts  # a run given up for dead and queued again finishes nothing
    with Heartbeat(store, job.id, settings.job_heartbeat_s, attempt) as heartbeat:
        ctx = JobContext(job, settings, store, heartbeat)
        if attempt > 1:  # its previous worker died, maybe after writing the candidate
            log.warning("job %s: start %d (its previous worker died); it resumes from its "
                        "checkpoint", job.id, attempt)
            shutil.rmtree(ctx.out, ignore_errors=True)
        try:
            ctx.params = _params(job)
            outcome = KINDS[job.kind].run(ctx)
        except Cancelled:
            return store.finish(job.id, "cancelled", attempt, progress=heartbeat.progress or {},
                                error="cancelled while running; no version was registered")
        except Exception as exc:
            log.exception("job %s failed", job.id)
            return store.finish(job.id, "failed", attempt, progress=heartbeat.progress or {},
                                error=f"{type(exc).__name__}: {exc}")
    if outcome.pop("hand_off", False):  # the gateway applies its spool, then finishes it
        return store.hand_off(job.id, progress=heartbeat.progress or {}, **outcome)
    return store.finish(job.id, "succeeded", attempt, progress=heartbeat.progress or {},
                        **outcome)


def run_shard(job_id: str, shard: int, settings: Settings, worker: str) -> Job | None:
    """Run one shard of a sharded job (a migration's backfill); None when there is nothing
    to run. A cancelled shard stops; a paused one stops at its cursor; a failing one fails the job (the gateway then undoes
    what the job started); a killed one is queued again by the reaper and resumes."""
    store = JobStore(settings.registry_dir)
    try:
        job = store.start_shard(job_id, shard, worker)
    except JobNotFound:
        log.warning("job %s has no record; shard %d skipped", job_id, shard)
        return None
    if job is None:
        log.info("job %s shard %d is not queued any more; skipped", job_id, shard)
        return None
    log.info("job %s (%s) shard %d started on %s", job.id, job.kind, shard, worker)
    with ShardHeartbeat(store, job.id, shard, settings.job_heartbeat_s) as heartbeat:
        try:
            ctx = JobContext(job, settings, store, heartbeat, shard, params=_params(job))
            outcome = KINDS[job.kind].run(ctx)
        except Cancelled:
            return store.finish_shard(job.id, shard, "cancelled")
        except Paused:  # its cursor is saved: queued again (from there) on resume
            return store.finish_shard(job.id, shard, "paused")
        except Exception as exc:
            log.exception("job %s shard %d failed", job.id, shard)
            return store.finish_shard(job.id, shard, "failed", f"{type(exc).__name__}: {exc}")
    return store.finish_shard(job.id, shard, "done", gate=outcome.get("gate"),
                              result=outcome.get("result"))


def _params(job: Job) -> Any:
    """The job's parameters as its kind's model, read from the record as submission stored
    them (checked then; not again)."""
    return KINDS[job.kind].params.model_validate(job.params)
