"""Job kinds: one registration object per kind (``base.JobKind``: its parameters, its
runner, its gateway hooks), one module (or folder) per kind, and one registration line per
kind below. The API's job schema, the gateway (submission, applier) and the worker all
read ``KINDS``; a new kind is its own module plus one ``register`` call.

Importing this package registers the built-in kinds. It imports only the state layer
(``service.state``) and ``training`` (the runners load torch when they run), so the worker
imports it too.
"""

from __future__ import annotations

from service.jobkinds import adapter, continual, evaluate, ingest, migrate, plan, xbt
from service.jobkinds.base import KINDS, JobKind, Params, check_job, kind_of, register

# The built-in kinds, in the order the API's schema lists them.
register(continual.KIND)
register(xbt.KIND)
register(adapter.KIND)
register(evaluate.KIND)
register(ingest.KIND)
register(migrate.KIND)
register(plan.KIND)

__all__ = ["KINDS", "JobKind", "Params", "check_job", "kind_of", "register"]
