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
from service.state.jobs.broker import celery_config
from service.state.jobs.store import JobStore

log = logging.getLogger(__name__)
settings = Settings()

app = Celery("nobackfill", include=["worker.tasks"])
app.conf.update(celery_config(settings))


def node_name() -> str:
    """This worker's Celery node name (unique per worker: one per GPU)."""
    return os.environ.get("NOBACKFILL_WORKER_NAME") or f"worker@{socket.gethostname()}"


@signals.worker_ready.connect
def _fail_jobs_of_a_previous_life(sender: Any = None, **_: Any) -> None:
    """A (re)started worker fails the jobs its node was running when it died: they cannot
    still be running, and early acknowledgement means they will not come back."""
    name = getattr(sender, "hostname", None) or node_name()
    reaped = JobStore(settings.registry_dir).reap(0, worker=name)
    if reaped:
        log.warning("failed %d job(s) left running by a previous life of %s: %s",
                    len(reaped), name, reaped)
