"""Jobs: their records (``store``), the table of job kinds and what each takes (``specs``),
the Celery wiring both sides share (``broker``: task name, queue, the gateway's
sender), and which workers are alive (``workers``: a liveness record per worker). Importable without FastAPI: the worker records progress and results through
the same store."""

from service.state.jobs.specs import JOB_KINDS
from service.state.jobs.store import FINISHED, Job, JobNotFound, JobStore

__all__ = ["FINISHED", "JOB_KINDS", "Job", "JobNotFound", "JobStore"]
