"""The ``migrate`` job: a managed migration of a gallery into its active version's native
space, its whole control in this folder: the parameters (``params``), the gateway's side
(``control``: start, drive, switch, rollback, retire, cancel, view) and the workers'
shards (``shards``: by task; ``backfill``: re-embed a range of items, or run the
migration's gate; ``transform``: the gallery-side transform, its order and its validation
curve)."""

from __future__ import annotations

from service.jobkinds.base import JobKind
from service.jobkinds.migrate.control import check_can_start, job_progress, start, tick
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.shards import run

KIND = JobKind("migrate", MigrateParams, run, can_start=check_can_start, start=start,
               spools=True, progress=job_progress, tick=tick)
