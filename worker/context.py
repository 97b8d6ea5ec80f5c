"""What a job's runner works with: the job, the process settings, the job store, and the
heartbeat thread that publishes progress and carries cancellation back to the loop."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

from service.state.config import Settings
from service.state.jobs.shards import PAUSED
from service.state.jobs.store import Job, JobStore
from service.state.paths import Roots

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """Raised inside the training loop when the job's cancel flag is seen."""


class Heartbeat:
    """A thread that writes the latest progress and a heartbeat every ``interval_s`` and
    reads the cancel flag back. The training loop only touches memory (cheap per step)."""

    def __init__(self, store: JobStore, job_id: str, interval_s: float,
                 attempt: int | None = None) -> None:
        self.store, self.job_id, self.interval_s = store, job_id, interval_s
        self.attempt = attempt  # this run's start (Job.attempts); None: not checked
        self.progress: dict[str, Any] | None = None
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{job_id}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:  # noqa: PYI034 (Self needs 3.11)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def beat(self) -> None:
        try:
            job = self.store.beat(self.job_id, self.progress, self.attempt)
        except Exception:  # a missed beat is retried next interval; never kill the job
            log.exception("heartbeat of %s failed", self.job_id)
            return
        superseded = self.attempt is not None and job.attempts != self.attempt
        if job.cancel_requested or job.status != "running" or superseded:
            self.cancelled.set()  # asked to stop, or reaped: stop training either way

    def report(self, progress: Any) -> None:
        """The trainer's ``on_progress``: remember the step, stop when asked to."""
        self.progress = {k: v for k, v in asdict(progress).items()}
        self.check()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled(f"job {self.job_id} was cancelled")


class ShardHeartbeat(Heartbeat):
    """The heartbeat of one shard of a sharded job: its items done, and the job's
    aggregate progress (``report`` takes ``done`` and a progress dict)."""

    def __init__(self, store: JobStore, job_id: str, shard: int, interval_s: float) -> None:
        super().__init__(store, job_id, interval_s)
        self.shard = shard
        self.done = 0
        self.paused = threading.Event()  # the job's backfill is paused (``PAUSED``)

    def beat(self) -> None:
        try:
            job = self.store.beat_shard(self.job_id, self.shard, self.done, self.progress)
        except Exception:
            log.exception("heartbeat of %s shard %d failed", self.job_id, self.shard)
            return
        if job.cancel_requested or job.finished:
            self.cancelled.set()
        if job.result.get(PAUSED):
            self.paused.set()
        else:
            self.paused.clear()

    def advance(self, done: int, progress: dict[str, Any]) -> None:
        self.done, self.progress = done, progress
        self.check()


@dataclass
class JobContext:
    """What a kind's runner gets (``service.jobkinds.base.RunContext``): the job, the
    process settings, the store, the heartbeat (and, for a sharded job, which shard this
    task runs), and the job's parameters as its kind's model."""

    job: Job
    settings: Settings
    store: JobStore
    heartbeat: Heartbeat
    shard: int | None = None
    params: Any = None

    def open_dataset(self, path: str, name: str) -> Any:
        """The dataset at ``path``, once it and every image its manifest names are checked
        to lie under the allowed roots again: the gateway checked at submission, but the
        manifest may have changed since (InvalidInput fails the job before any read)."""
        from training.data import open_dataset

        return open_dataset(Roots.of(self.settings).dataset(path, name))

    @property
    def out(self) -> Any:
        """Where the candidate artifact is written (removed when the job ends)."""
        work = self.store.work_dir(self.job.id)
        work.mkdir(parents=True, exist_ok=True)
        return work / "candidate"
