"""Job records: one JSON file per job under ``REGISTRY_ROOT/jobs``, changed under a lock.

The registry root is the volume every gateway and worker shares, so the same records
serve the embedded default and the deployed stack (one code path). A record is
replaced atomically (temp file + rename) under its own file lock, so the gateway
(submit, cancel) and the worker (progress, result) never lose each other's updates.

Lifecycle: ``queued -> running -> succeeded | failed | cancelled``; ``queued ->
cancelled``. A running job whose heartbeat stops (its worker was killed) is failed
by :meth:`JobStore.reap`; its work directory, which holds any partial artifact, is
removed with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from service.state.errors import Conflict, NotFound, shown
from service.state.registry.index import utc_now

FINISHED = ("succeeded", "failed", "cancelled")
STATUSES = ("queued", "running", *FINISHED)
JOBS = "jobs"
JOB_ID = re.compile(r"job-[0-9a-f]{12}")


class JobNotFound(NotFound):
    code = "job_not_found"


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    gallery: str
    params: dict[str, Any]
    auto_promote: bool
    created_by: str
    created_at: str
    status: str = "queued"
    progress: dict[str, Any] = field(default_factory=dict)  # stage, step, total, loss, eta_s
    started_at: str | None = None
    ended_at: str | None = None
    heartbeat_at: str | None = None
    worker: str | None = None  # host:pid of the process running it
    cancel_requested: bool = False
    version: str | None = None  # the version it produced (or evaluated)
    gate: dict[str, Any] | None = None
    promoted: bool = False
    result: dict[str, Any] = field(default_factory=dict)  # kind-specific summary
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(**data)


class JobStore:
    def __init__(self, registry_root: str | Path) -> None:
        self.root = Path(registry_root) / JOBS
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ paths
    def _path(self, job_id: str) -> Path:
        if not JOB_ID.fullmatch(job_id):  # ids are ours: anything else names no job
            raise JobNotFound(f"job '{shown(job_id)}' does not exist")
        return self.root / f"{job_id}.json"

    def work_dir(self, job_id: str) -> Path:
        """Scratch space of a running job (its candidate artifact before registration)."""
        return self.root / f"{job_id}.work"

    # ------------------------------------------------------------ reading
    def get(self, job_id: str) -> Job:
        path = self._path(job_id)
        try:
            return Job.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise JobNotFound(f"job '{shown(job_id)}' does not exist") from None

    def list(self) -> list[Job]:
        jobs = []
        for path in self.root.glob("*.json"):
            try:
                jobs.append(Job.from_json(json.loads(path.read_text())))
            except FileNotFoundError:
                continue  # deleted between glob and read
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    # ------------------------------------------------------------ writing
    def create(self, kind: str, gallery: str, params: dict[str, Any], *, by: str,
               auto_promote: bool = False) -> Job:
        job = Job(id=f"job-{uuid.uuid4().hex[:12]}", kind=kind, gallery=gallery,
                  params=params, auto_promote=auto_promote, created_by=by, created_at=utc_now())
        with self._lock(job.id):
            self._write(job)
        return job

    def delete(self, job_id: str) -> None:
        """Remove a record that was never queued (the broker refused it)."""
        with self._lock(job_id):
            self._path(job_id).unlink(missing_ok=True)
        shutil.rmtree(self.work_dir(job_id), ignore_errors=True)

    def update(self, job_id: str, change: Callable[[Job], Job]) -> Job:
        with self._lock(job_id):
            before = self.get(job_id)
            after = change(before)
            if after != before:
                self._write(after)
            return after

    def start(self, job_id: str, worker: str) -> Job | None:
        """queued -> running; None when the job is not queued (cancelled, or a duplicate
        delivery of a job that already ran): tasks stay idempotent."""
        def change(job: Job) -> Job:
            if job.status != "queued":
                return job
            now = utc_now()
            return replace(job, status="running", started_at=now, heartbeat_at=now,
                           worker=worker)
        job = self.update(job_id, change)
        return job if job.status == "running" and job.worker == worker else None

    def beat(self, job_id: str, progress: dict[str, Any] | None) -> Job:
        """Record a heartbeat (and the latest progress) of a running job."""
        def change(job: Job) -> Job:
            if job.status != "running":
                return job
            return replace(job, heartbeat_at=utc_now(),
                           progress=progress if progress is not None else job.progress)
        return self.update(job_id, change)

    def finish(self, job_id: str, status: str, **fields: Any) -> Job:
        if status not in FINISHED:
            raise ValueError(f"not a final status: {status}")

        def change(job: Job) -> Job:
            if job.finished:
                return job  # first final word wins (e.g. reaped before the worker returned)
            return replace(job, status=status, ended_at=utc_now(), **fields)
        job = self.update(job_id, change)
        shutil.rmtree(self.work_dir(job_id), ignore_errors=True)
        return job

    def cancel(self, job_id: str) -> Job:
        """A queued job is cancelled at once; a running one is asked to stop (the training
        loop checks the flag every few steps and leaves no artifact)."""
        def change(job: Job) -> Job:
            if job.finished:
                raise Conflict(f"job '{shown(job_id)}' already {job.status}; nothing to cancel")
            if job.status == "queued":
                return replace(job, status="cancelled", ended_at=utc_now(),
                               error="cancelled before it started")
            return replace(job, cancel_requested=True)
        return self.update(job_id, change)

    def reap(self, stale_after_s: float, worker: str | None = None) -> list[str]:
        """Fail running jobs whose heartbeat is older than ``stale_after_s`` (or, with
        ``worker``, every running job of that worker: it restarted, so they are dead)."""
        limit = datetime.now(timezone.utc) - timedelta(seconds=stale_after_s)
        reaped = []
        for job in self.list():
            if job.status != "running":
                continue
            dead = (job.worker is not None and _same_node(job.worker, worker)
                    if worker is not None else _older(job.heartbeat_at, limit))
            if dead:
                since = job.heartbeat_at or job.started_at
                self.finish(job.id, "failed", error=f"worker lost: no heartbeat from "
                            f"{job.worker} since {since}; nothing was registered")
                reaped.append(job.id)
        return reaped

    # ------------------------------------------------------------ internals
    def _lock(self, job_id: str) -> FileLock:
        self._path(job_id)  # validates the id
        return FileLock(self.root / f".{job_id}.lock", timeout=30)

    def _write(self, job: Job) -> None:
        tmp = self.root / f".{job.id}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            tmp.write_text(json.dumps(job.to_json(), indent=1, sort_keys=True))
            os.replace(tmp, self._path(job.id))
        finally:
            tmp.unlink(missing_ok=True)


def _older(stamp: str | None, limit: datetime) -> bool:
    return stamp is None or datetime.fromisoformat(stamp) < limit


def _same_node(job_worker: str, worker: str) -> bool:
    """Jobs of worker node ``worker`` (any pid): ``job_worker`` is ``node:pid``."""
    return job_worker.rsplit(":", 1)[0] == worker
