"""The ``migrate`` job: a managed migration of a gallery into its active version's native
space, its whole control in this folder, one file per role:

- ``params``: what a migration takes; ``lifecycle``: its phases and the table of
  transitions every change asks; ``record``: its own typed record and files.
- ``submit``: the start (open it, list the items); ``planning``: the shards' plans;
  ``drive``: the applier's step (switch progressively, check, catch up, gate, finish);
  ``actions``: the transitions (switch, rollback, retire, cancel, pause, resume, undo,
  stop); ``view``: what it shows, with its progress counted on the target side.
- the workers' shards: ``shards`` (by task), ``backfill`` (re-embed a range of items,
  or run the gate), ``transform`` (the gallery-side transform, its order and its
  validation curve); ``check`` (the side measured again after a progressive switch).
"""

from __future__ import annotations

from service.jobkinds.base import JobKind
from service.jobkinds.migrate.drive import tick
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.shards import run
from service.jobkinds.migrate.submit import check_can_start, start
from service.jobkinds.migrate.view import job_progress

KIND = JobKind("migrate", MigrateParams, run, can_start=check_can_start, start=start,
               spools=True, progress=job_progress, tick=tick)
