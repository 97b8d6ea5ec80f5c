"""Training jobs: their records (``store``), what each kind takes (``specs``), and how the
gateway hands them to Celery workers (``broker``, ``submit``). Importable without
FastAPI: the worker records progress and results through the same store."""

from service.jobs.store import FINISHED, KINDS, Job, JobNotFound, JobStore

__all__ = ["FINISHED", "KINDS", "Job", "JobNotFound", "JobStore"]
