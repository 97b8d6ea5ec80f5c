"""Which workers are alive: each worker process keeps a small record under
``REGISTRY_ROOT/workers`` fresh, and the gateway reads them before it accepts a job.

Why files on the registry volume: every gateway and worker already shares it (the job
records live there), and the embedded default's filesystem broker has no remote control
to ping workers with, so one mechanism serves the embedded default and the deployed
stack alike. A record is replaced atomically (temp file + rename), one file per worker
name, so readers never see half a record and workers never contend for a lock.

A worker writes its record when it is ready to consume jobs and every
``worker_heartbeat_s`` after, from its main process (a busy worker whose child trains
for hours is still alive), and removes it when it shuts down cleanly. A killed worker's
record just ages: once no record is younger than ``worker_stale_after_s``, job
submission answers 503 instead of queueing a job nothing will run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from service.state.config import Settings
from service.state.errors import Unavailable
from service.state.registry.index import utc_now

log = logging.getLogger(__name__)
WORKERS = "workers"
UNSAFE = re.compile(r"[^A-Za-z0-9@._-]")


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's liveness record: who (node name, host, pid), since when, last seen."""

    name: str
    host: str
    pid: int
    started_at: str
    at: str

    def age_s(self, now: datetime) -> float:
        return (now - datetime.fromisoformat(self.at)).total_seconds()


def workers_dir(settings: Settings) -> Path:
    return settings.registry_dir / WORKERS


def record_path(settings: Settings, name: str) -> Path:
    """One file per worker name: readable, yet safe for any name (a hash keeps it unique)."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return workers_dir(settings) / f"{UNSAFE.sub('_', name)[:64]}-{digest}.json"


def write_beat(settings: Settings, name: str, started_at: str) -> WorkerBeat:
    """Write (or refresh) this process's record, atomically."""
    beat = WorkerBeat(name, socket.gethostname(), os.getpid(), started_at, utc_now())
    path = record_path(settings, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        tmp.write_text(json.dumps(asdict(beat)))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return beat


def remove_beat(settings: Settings, name: str) -> None:
    """Remove this process's record (a clean shutdown), unless a newer process of the same
    name has taken it over already."""
    path = record_path(settings, name)
    beat = _read(path)
    if beat is not None and beat.pid == os.getpid():
        path.unlink(missing_ok=True)


def workers(settings: Settings) -> list[WorkerBeat]:
    """Every record, fresh or stale, newest first."""
    found = [b for b in map(_read, sorted(workers_dir(settings).glob("*.json"))) if b]
    return sorted(found, key=lambda b: b.at, reverse=True)


def live_workers(settings: Settings) -> list[WorkerBeat]:
    """Workers seen within ``worker_stale_after_s``: what can run a job submitted now."""
    now = datetime.now(timezone.utc)
    return [b for b in workers(settings) if b.age_s(now) <= settings.worker_stale_after_s]


def require_live_worker(settings: Settings) -> None:
    """Unavailable (503) when no worker has been seen for ``worker_stale_after_s``."""
    if live_workers(settings):
        return
    seen = workers(settings)
    last = f"; the last one, {seen[0].name}, was seen at {seen[0].at}" if seen else ""
    raise Unavailable(f"no worker has been seen for {settings.worker_stale_after_s:.0f}s, so "
                      f"nothing would run the job{last}; start one (python -m worker) or "
                      f"wait for the embedded worker to restart; the job was not created")


def _read(path: Path) -> WorkerBeat | None:
    try:
        beat = WorkerBeat(**json.loads(path.read_text()))
        beat.age_s(datetime.now(timezone.utc))  # a time it cannot compare is no record
        return beat
    except (OSError, ValueError, TypeError):
        return None  # removed meanwhile, or not a record: not a live worker either way


class Heartbeat:
    """A daemon thread that keeps a worker's record fresh until ``stop``."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings, self.name = settings, name
        self.started_at = utc_now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-heartbeat",
                                        daemon=True)

    def start(self) -> None:
        """The first record is written before this returns: ready means visible."""
        write_beat(self.settings, self.name, self.started_at)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        remove_beat(self.settings, self.name)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.worker_heartbeat_s):
            try:
                write_beat(self.settings, self.name, self.started_at)
            except OSError:  # a full or flaky volume: retried next interval
                log.exception("could not write the liveness record of %s", self.name)

