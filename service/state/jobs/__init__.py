"""Jobs: their records (``store``; the kinds and what each takes are ``service.jobkinds``),
the Celery wiring both sides share (``broker``: task name, queue, the gateway's
sender), and which workers are alive (``workers``: a liveness record per worker). Importable without FastAPI: the worker records progress and results through
the same store."""

from service.state.jobs.store import FINISHED, Job, JobNotFound, JobStore

__all__ = ["FINISHED", "Job", "JobNotFound", "JobStore"]
