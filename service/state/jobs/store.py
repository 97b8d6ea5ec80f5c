"""Job records: one JSON file per job under ``REGISTRY_ROOT/jobs``, changed under a lock.

The registry root is the volume every gateway and worker shares, so the same records
serve the embedded default and the deployed stack (one code path). A record is
replaced atomically (temp file + rename) under its own file lock, so the gateway
(submit, cancel) and the worker (progress, result) never lose each other's updates.

Lifecycle: ``queued -> running -> succeeded | failed | cancelled``; ``queued ->
cancelled``. A running job whose heartbeat stops (its worker was killed) is failed
by :meth:`JobStore.reap`; its work directory, which holds any partial artifact, is
removed with it. A job that saved a training checkpoint in its work directory
(:meth:`JobStore.checkpoint_dir`) is queued again instead, up to ``MAX_ATTEMPTS`` starts,
and resumes from that checkpoint (``running -> queued``, its ``attempts`` counted).

Jobs whose results the gateway writes into a gallery (``ingest``, ``migrate``) go
``running -> applying`` when their workers are done; the gateway finishes them once it has
applied their spool (``service.vectors.spool``). A ``migrate`` job runs as shards
(``Job.shards``), each its own task: a shard whose worker dies is queued again
(:meth:`JobStore.reap_shards`) and resumes where it stopped.
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
STATUSES = ("queued", "running", "applying", *FINISHED)
SHARD_STATES = ("queued", "running", "done", "failed", "cancelled")
JOBS = "jobs"
JOB_ID = re.compile(r"job-[0-9a-f]{12}")
CHECKPOINTS = "checkpoints"  # under a job's work directory: the saved training state
CHECKPOINT_FILE = "train_state.pt"  # training.trainer.TrainState.FILE
MAX_ATTEMPTS = 3  # starts of a resumable job whose workers keep dying, before it fails


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
    attempts: int = 0  # starts so far (a job resumed from its checkpoint starts again)
    # Sharded jobs: {"index", "start", "end", "state", "done", "total", "worker",
    # "heartbeat_at", "attempts", "started_at", "error"} per shard.
    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def merged(self, **fields: Any) -> Job:
        """This job with ``fields`` replaced, except ``result``, which is merged: several
        writers add to it (the gateway counts what it applied from a job's spool while the
        job runs; a requeue notes why), and a worker's final summary must not erase theirs."""
        if "result" in fields:
            fields["result"] = {**self.result, **fields["result"]}
        return replace(self, **fields)

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

    def checkpoint_dir(self, job_id: str) -> Path:
        """Where a training job saves its whole training state: a job whose worker dies
        after a save is queued again and resumes from it (``reap``)."""
        return self.work_dir(job_id) / CHECKPOINTS

    def resumable(self, job: Job) -> bool:
        """Whether a running job whose worker died can go on: it has starts left and saved
        a training state (directly in its checkpoint directory, or in a stage's folder of
        it: an XBT upgrade saves ``stage1/``, ``stage2/``)."""
        saved = self.checkpoint_dir(job.id)
        return job.attempts < MAX_ATTEMPTS and any(saved.rglob(CHECKPOINT_FILE))

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
                           worker=worker, attempts=job.attempts + 1)
        job = self.update(job_id, change)
        return job if job.status == "running" and job.worker == worker else None

    def beat(self, job_id: str, progress: dict[str, Any] | None,
             attempt: int | None = None) -> Job:
        """Record a heartbeat (and the latest progress) of a running job (of its run
        ``attempt``, when given: a run that was superseded records nothing)."""
        def change(job: Job) -> Job:
            if job.status != "running" or (attempt is not None and job.attempts != attempt):
                return job
            return replace(job, heartbeat_at=utc_now(),
                           progress=progress if progress is not None else job.progress)
        return self.update(job_id, change)

    def finish(self, job_id: str, status: str, attempt: int | None = None,
               **fields: Any) -> Job:
        """The job's final status; its work directory goes. With ``attempt`` (the run's
        start, ``Job.attempts``), only while that run is the job's current one: a run that
        was given up for dead and queued again (``reap``) leaves the job to its next run."""
        if status not in FINISHED:
            raise ValueError(f"not a final status: {status}")
        superseded = False

        def change(job: Job) -> Job:
            nonlocal superseded
            if attempt is not None and (job.attempts != attempt or job.status == "queued"):
                superseded = True
                return job
            if job.finished:
                return job  # first final word wins (e.g. reaped before the worker returned)
            return job.merged(status=status, ended_at=utc_now(), **fields)
        job = self.update(job_id, change)
        if not superseded:
            shutil.rmtree(self.work_dir(job_id), ignore_errors=True)
        return job

    # ------------------------------------------------------------ shards
    def add_shards(self, job_id: str, shards: list[dict[str, Any]]) -> Job:
        """Append shards ({"start", "end", "total"}); a job that was applying runs again."""
        def change(job: Job) -> Job:
            now = utc_now()
            new = [{"index": len(job.shards) + n, "state": "queued", "done": 0, "attempts": 0,
                    "worker": None, "heartbeat_at": None, "started_at": None, "error": None,
                    "queued_at": now, "sends": 1, **shard} for n, shard in enumerate(shards)]
            status = "running" if job.status == "applying" else job.status
            return replace(job, shards=[*job.shards, *new], status=status)
        return self.update(job_id, change)

    def start_shard(self, job_id: str, index: int, worker: str) -> Job | None:
        """A shard: queued -> running (the job too, the first time); None when there is
        nothing to run (the job ended or is being cancelled, or the shard is not queued:
        a duplicate delivery)."""
        def change(job: Job) -> Job:
            shard = job.shards[index] if index < len(job.shards) else None
            if (job.finished or job.cancel_requested or shard is None
                    or shard["state"] != "queued"):
                return job
            now = utc_now()
            shards = _with_shard(job, index, state="running", worker=worker, heartbeat_at=now,
                                 started_at=shard.get("started_at") or now,
                                 attempts=shard["attempts"] + 1)
            return replace(job, status="running", started_at=job.started_at or now,
                           heartbeat_at=now, worker=worker, shards=shards)
        job = self.update(job_id, change)
        shard = job.shards[index] if index < len(job.shards) else None
        ok = shard is not None and shard["state"] == "running" and shard["worker"] == worker
        return job if ok and not job.finished else None

    def beat_shard(self, job_id: str, index: int, done: int,
                   progress: dict[str, Any] | None = None) -> Job:
        """A running shard's heartbeat: how many of its items it has done."""
        def change(job: Job) -> Job:
            if job.finished or job.shards[index]["state"] != "running":
                return job
            now = utc_now()
            return replace(job, heartbeat_at=now, progress={**job.progress, **(progress or {})},
                           shards=_with_shard(job, index, done=done, heartbeat_at=now))
        return self.update(job_id, change)

    def finish_shard(self, job_id: str, index: int, state: str, error: str | None = None,
                     gate: dict[str, Any] | None = None,
                     result: dict[str, Any] | None = None) -> Job:
        """A shard ends: ``done``, ``cancelled``, ``paused`` (it stopped at its cursor and
        waits to be queued again: ``requeue_shards``), or ``failed`` (then the job fails);
        ``result`` (a done shard's findings) is merged into the job's result."""
        def change(job: Job) -> Job:
            if job.finished:
                return job
            shard = job.shards[index]
            shards = _with_shard(job, index, state=state, error=error,
                                 done=shard["total"] if state == "done" else shard["done"])
            if state == "failed":
                return replace(job, shards=shards, status="failed", ended_at=utc_now(),
                               error=f"shard {index}: {error}")
            return replace(job, shards=shards, gate=gate if gate is not None else job.gate,
                           result={**job.result, **(result or {})})
        return self.update(job_id, change)

    def requeue_shards(self, job_id: str, state: str) -> list[int]:
        """Every shard of the job in ``state`` (``paused``: its backfill was resumed) goes
        back to queued, to resume from its cursor; their indices (the caller sends them)."""
        again: list[int] = []

        def change(job: Job) -> Job:
            again.clear()
            if job.finished:
                return job
            shards = list(job.shards)
            for n, shard in enumerate(shards):
                if shard["state"] == state:
                    shards[n] = {**shard, "state": "queued", "worker": None,
                                 "queued_at": utc_now(), "sends": int(shard.get("sends", 1)) + 1}
                    again.append(n)
            return replace(job, shards=shards)
        self.update(job_id, change)
        return list(again)

    def reap_shards(self, stale_after_s: float, worker: str | None = None,
                    ) -> list[tuple[str, int]]:
        """Shards to send again; (job id, shard) of each. A running shard whose heartbeat
        is older than ``stale_after_s`` (or, with ``worker``, that ran on that worker node,
        which restarted) goes back to queued. A queued shard that has not started within
        ``stale_after_s`` times 2 ** (sends so far) is sent again: its message may have been
        reserved by a worker that was killed (a duplicate delivery is skipped)."""
        now = datetime.now(timezone.utc)
        lost: list[tuple[str, int]] = []
        for job in self.list():
            if job.finished or job.cancel_requested or not job.shards:
                continue

            def change(job: Job) -> Job:
                shards = list(job.shards)
                for n, shard in enumerate(shards):
                    if shard["state"] == "running":
                        dead = (_same_node(shard["worker"], worker) if worker is not None
                                else _older(shard["heartbeat_at"],
                                            now - timedelta(seconds=stale_after_s)))
                    elif shard["state"] == "queued" and worker is None:
                        wait = stale_after_s * 2 ** int(shard.get("sends", 1))
                        dead = _older(shard.get("queued_at"), now - timedelta(seconds=wait))
                    else:
                        dead = False
                    if dead:
                        shards[n] = {**shard, "state": "queued", "worker": None,
                                     "queued_at": utc_now(),
                                     "sends": int(shard.get("sends", 1)) + 1}
                        lost.append((job.id, n))
                return replace(job, shards=shards)
            self.update(job.id, change)
        return lost

    def hand_off(self, job_id: str, **fields: Any) -> Job:
        """running -> applying: the workers are done; the gateway applies the job's spool
        and finishes it (its work directory stays until then)."""
        def change(job: Job) -> Job:
            if job.finished:
                return job
            return job.merged(status="applying", **fields)
        return self.update(job_id, change)

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

    def reopen(self, job_id: str) -> Job:
        """A finished job runs again (a migration resumed after its backfill stopped): its
        shards that had not finished are marked cancelled (the caller plans what is left
        as new shards); Conflict while it still runs."""
        def change(job: Job) -> Job:
            if not job.finished:
                raise Conflict(f"job '{shown(job_id)}' is {job.status}; nothing to resume")
            shards = [s if s["state"] == "done" else {**s, "state": "cancelled"}
                      for s in job.shards]
            return replace(job, status="running", ended_at=None, error=None,
                           cancel_requested=False, shards=shards, result={
                               **job.result, "stopped": False,
                               "resumed": [*job.result.get("resumed", []), utc_now()]})
        return self.update(job_id, change)

    def reap(self, stale_after_s: float, worker: str | None = None) -> Reaped:
        """Running jobs whose heartbeat is older than ``stale_after_s`` (or, with
        ``worker``, every running job of that worker: it restarted, so they are dead):
        queued again when they can resume from a checkpoint (``resumable``: the caller
        sends them to the broker), else failed."""
        limit = datetime.now(timezone.utc) - timedelta(seconds=stale_after_s)
        reaped = Reaped()
        for job in self.list():
            if job.status != "running" or job.shards:
                continue  # sharded jobs: their shards are reaped (``reap_shards``)
            dead = (job.worker is not None and _same_node(job.worker, worker)
                    if worker is not None else _older(job.heartbeat_at, limit))
            if not dead:
                continue
            since = job.heartbeat_at or job.started_at
            lost = f"worker lost: no heartbeat from {job.worker} since {since}"
            if self.resumable(job) and self._requeue(job, lost):
                reaped.requeued.append(job.id)
                continue
            tries = f" after {job.attempts} starts" if job.attempts >= MAX_ATTEMPTS else ""
            self.finish(job.id, "failed", error=f"{lost}{tries}; nothing was registered")
            reaped.failed.append(job.id)
        return reaped

    def _requeue(self, job: Job, why: str) -> bool:
        """running -> queued for the same run that was found dead; False if it moved on."""
        def change(current: Job) -> Job:
            if current.status != "running" or current.attempts != job.attempts:
                return current
            requeued = {"at": utc_now(), "attempt": current.attempts, "why": why}
            return current.merged(status="queued", worker=None, result={
                "requeued": [*current.result.get("requeued", []), requeued]})
        return self.update(job.id, change).status == "queued"

    def requeue_failed_to_send(self, job_id: str, error: str) -> Job:
        """A job queued again whose message the broker refused: failed, naming why."""
        def change(job: Job) -> Job:
            if job.status != "queued":
                return job
            return replace(job, status="failed", ended_at=utc_now(),
                           error=f"could not be queued again after its worker died: {error}")
        job = self.update(job_id, change)
        if job.status == "failed":
            shutil.rmtree(self.work_dir(job_id), ignore_errors=True)
        return job

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


@dataclass
class Reaped:
    """What ``JobStore.reap`` did: jobs failed, and jobs queued again (to send)."""

    failed: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)


def _with_shard(job: Job, index: int, **fields: Any) -> list[dict[str, Any]]:
    shards = list(job.shards)
    shards[index] = {**shards[index], **fields}
    return shards


def _older(stamp: str | None, limit: datetime) -> bool:
    return stamp is None or datetime.fromisoformat(stamp) < limit


def _same_node(job_worker: str, worker: str) -> bool:
    """Jobs of worker node ``worker`` (any pid): ``job_worker`` is ``node:pid``."""
    return job_worker.rsplit(":", 1)[0] == worker
