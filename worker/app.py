"""The one Celery app of the workers (``celery -A worker.app worker``; ``python -m worker``).

Nothing here touches CUDA: torch and the models load inside the task, in the child
process that runs it, and that process exits after one task (max_tasks_per_child=1),
giving its GPU memory back.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import Celery, signals

from service.state.config import Settings
from service.state.jobs.broker import SHARD_TASK, TASK, celery_config
from service.state.jobs.store import JobStore
from service.state.jobs.workers import Heartbeat

log = logging.getLogger(__name__)
settings = Settings()

app = Celery("nobackfill", include=["worker.tasks"])
app.conf.update(celery_config(settings))
_liveness: list[Heartbeat] = []  # this process's liveness record, while it consumes jobs


def node_name() -> str:
    """This worker's Celery node name (unique per worker: one per GPU)."""
    return os.environ.get("NOBACKFILL_WORKER_NAME") or f"worker@{socket.gethostname()}"


@signals.worker_ready.connect
def _fail_jobs_of_a_previous_life(sender: Any = None, **_: Any) -> None:
    """A (re)started worker fails the jobs its node was running when it died: they cannot
    still be running, and early acknowledgement means they will not come back. Jobs that
    saved a checkpoint, and shards of a sharded job, are queued again instead."""
    name = getattr(sender, "hostname", None) or node_name()
    store = JobStore(settings.registry_dir)
    reaped = store.reap(0, worker=name)
    if reaped.failed:
        log.warning("failed %d job(s) left running by a previous life of %s: %s",
                    len(reaped.failed), name, reaped.failed)
    # A job that saved a checkpoint resumes from it: queued again, sent again.
    for job_id in reaped.requeued:
        log.warning("job %s was running in a previous life of %s; it resumes from its "
                    "checkpoint", job_id, name)
        app.send_task(TASK, args=[job_id], queue=settings.training_queue)
    # A shard resumes where it stopped (its cursor), so it is queued again, not failed.
    for job_id, shard in store.reap_shards(0, worker=name):
        log.warning("shard %d of job %s was running in a previous life of %s; queued again",
                    shard, job_id, name)
        app.send_task(SHARD_TASK, args=[job_id, shard], queue=settings.training_queue)


@signals.worker_ready.connect
def _start_liveness(sender: Any = None, **_: Any) -> None:
    """Announce this worker to the gateways (``service.state.jobs.workers``): they accept
    jobs only while some worker's record is fresh. Written before Celery logs "ready"."""
    name = getattr(sender, "hostname", None) or node_name()
    beat = Heartbeat(settings, name)
    beat.start()
    _liveness.append(beat)
    log.info("liveness record of %s written every %.0fs", name, settings.worker_heartbeat_s)


@signals.worker_shutdown.connect
def _stop_liveness(**_: Any) -> None:
    """A clean stop withdraws the record at once; a killed worker's record goes stale."""
    while _liveness:
        _liveness.pop().stop()
