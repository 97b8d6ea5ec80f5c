"""The task: thin and idempotent. It receives a job id; everything else is in the record."""

from __future__ import annotations

import os
from typing import Any

from service.state.jobs.broker import SHARD_TASK, TASK
from worker.app import app, settings


@app.task(name=TASK, bind=True, ignore_result=False)
def run_job(self: Any, job_id: str) -> str | None:
    from worker.lifecycle import run  # torch and training load here, in the task's process

    node = getattr(self.request, "hostname", None) or "worker"
    job = run(job_id, settings, f"{node}:{os.getpid()}")
    return job.status if job is not None else None


@app.task(name=SHARD_TASK, bind=True, ignore_result=False)
def run_shard(self: Any, job_id: str, shard: int) -> str | None:
    from worker.lifecycle import run_shard as run  # torch loads here, in the task's process

    node = getattr(self.request, "hostname", None) or "worker"
    job = run(job_id, int(shard), settings, f"{node}:{os.getpid()}")
    return job.status if job is not None else None
