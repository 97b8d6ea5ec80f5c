"""The Celery configuration shared by the gateway (which enqueues jobs by task name) and
the workers (which run them), and the gateway's side of sending.

Deployed: Redis (``NOBACKFILL_BROKER_URL``). Embedded default: kombu's filesystem
transport and a file result backend under ``DATA_DIR/broker``, so a single host runs
without any server. The task code is the same for both.

GPU-job conventions: one queue for training; prefetch 1 (a worker never hoards jobs
while its GPU is busy); early acknowledgement, so a job whose worker is killed is
not redelivered to run twice; the job record (``service.state.jobs.store``) is what tracks
it, and its heartbeat lets the reaper fail it; one task per child process
(``worker_max_tasks_per_child=1``) so each job's GPU memory is returned to the driver.
"""

from __future__ import annotations

from typing import Any

from service.state.config import Settings
from service.state.errors import Unavailable

TASK = "nobackfill.run_job"
SHARD_TASK = "nobackfill.run_shard"  # one shard of a sharded job (a migration's backfill)
WEEK_S = 7 * 24 * 3600


def celery_config(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "task_default_queue": settings.training_queue,
        "task_routes": {TASK: {"queue": settings.training_queue},
                        SHARD_TASK: {"queue": settings.training_queue}},
        "task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
        "task_acks_late": False,
        "worker_prefetch_multiplier": 1,
        "worker_max_tasks_per_child": 1,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": settings.broker_timeout_s,
        "result_expires": WEEK_S,
    }
    if settings.broker_url:
        conf["broker_url"] = settings.broker_url
        conf["broker_transport_options"] = {
            "visibility_timeout": WEEK_S,  # longer than any job, in case acks are ever late
            "socket_connect_timeout": settings.broker_timeout_s,
            "socket_timeout": settings.broker_timeout_s * 10,
        }
    else:
        queue = settings.broker_dir / "queue"
        processed = settings.broker_dir / "processed"
        control = settings.broker_dir / "control"  # exchange tables (default: ./control)
        for folder in (queue, processed, control):
            folder.mkdir(parents=True, exist_ok=True)
        conf["broker_url"] = "filesystem://"
        conf["broker_transport_options"] = {
            "data_folder_in": str(queue), "data_folder_out": str(queue),
            "processed_folder": str(processed), "control_folder": str(control),
            "store_processed": False}
        conf["worker_enable_remote_control"] = False  # no fanout on the filesystem transport
    if settings.result_backend:
        conf["result_backend"] = settings.result_backend
    else:
        results = settings.broker_dir / "results"
        results.mkdir(parents=True, exist_ok=True)
        conf["result_backend"] = f"file://{results.resolve()}"
    return conf


class JobQueue:
    """The gateway's producer: sends a job id to the training queue, or says why it can't."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._app: Any = None

    def _celery(self) -> Any:
        if self._app is None:
            from celery import Celery

            app = Celery("nobackfill-gateway")
            app.conf.update(celery_config(self.settings))
            self._app = app
        return self._app

    def send(self, job_id: str) -> None:
        self._send(TASK, [job_id])

    def send_shard(self, job_id: str, shard: int) -> None:
        self._send(SHARD_TASK, [job_id, shard])

    def _send(self, task: str, args: list[object]) -> None:
        where = self.settings.broker_url or f"filesystem {self.settings.broker_dir}"
        try:
            self._celery().send_task(task, args=args, queue=self.settings.training_queue,
                                     retry=False)
        except Exception as exc:  # kombu/redis/OS errors all mean "not queued"
            raise Unavailable(f"the job queue (broker at {where}) is unavailable: "
                              f"{type(exc).__name__}: {exc}; the job was not created") from exc
