"""One runner per job kind, keyed by the kinds of ``service.state.jobs.specs.JOB_KINDS``.

Each runner parses the job's parameters, calls one ``training`` entry point (or the
shared ingest pipeline) with the job's progress callback, and hands the result on;
none knows Celery. Importing this module fails if a kind has no runner, or a runner
no kind, so the two tables cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.state.jobs.specs import JOB_KINDS
from worker.context import JobContext
from worker.runners.adapter import run_adapter
from worker.runners.continual import run_continual
from worker.runners.evaluate import run_evaluate
from worker.runners.ingest import run_ingest
from worker.runners.migrate import run_migrate
from worker.runners.xbt import run_xbt

Runner = Callable[[JobContext], dict[str, Any]]

RUNNERS: dict[str, Runner] = {"continual": run_continual, "xbt": run_xbt,
                              "adapter": run_adapter, "evaluate": run_evaluate,
                              "ingest": run_ingest, "migrate": run_migrate}

if set(RUNNERS) != set(JOB_KINDS):
    raise RuntimeError(f"job kinds without a runner: {sorted(set(JOB_KINDS) - set(RUNNERS))}; "
                       f"runners without a kind: {sorted(set(RUNNERS) - set(JOB_KINDS))}")
