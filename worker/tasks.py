"""The task: thin and idempotent. It receives a job id; everything else is in the record.

The tasks are shared tasks (bound to the app that includes this module, ``worker.app``), so
this module does not import the app back: the app names it by string (``include``)."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from celery import shared_task

from service.state.config import Settings
from service.state.jobs.broker import SHARD_TASK, TASK


@cache
def settings() -> Settings:
    """This process's settings (the environment's, as ``worker.app`` reads them)."""
    return Settings()


@shared_task(name=TASK, bind=True, ignore_result=False)
def run_job(self: Any, job_id: str) -> str | None:
    from worker.lifecycle import run  # torch and training load here, in the task's process

    node = getattr(self.request, "hostname", None) or "worker"
    job = run(job_id, settings(), f"{node}:{os.getpid()}")
    return job.status if job is not None else None


@shared_task(name=SHARD_TASK, bind=True, ignore_result=False)
def run_shard(self: Any, job_id: str, shard: int) -> str | None:
    from worker.lifecycle import run_shard as run  # torch loads here, in the task's process

    node = getattr(self.request, "hostname", None) or "worker"
    job = run(job_id, int(shard), settings(), f"{node}:{os.getpid()}")
    return job.status if job is not None else None
