"""A migration's own record and files: ``MigrationState`` (one typed model, versioned on
disk) and the folder that holds it beside the migration's work files, from the
migration's start to its end (undone, or retired), whatever happens to its job.

``REGISTRY_ROOT/migrations/<job id>/``:

- ``state.json``: the ``MigrationState`` (what the control plane decided and measured:
  the listing's size, the plan, the transform's outcome and its curve, the switches,
  switch backs and checks, the end's outcome), replaced atomically under a file lock.
- ``listing.json`` (a transformed migration's listed items), ``order.json`` and
  ``transform.json`` (what the transform shard wrote: the backfill order, its outcome
  and curve), ``validation.npz`` (the curve's inputs, for the checks after a switch),
  ``candidates.json`` (the served-candidate counts a candidate-order plan used),
  ``filled-by-reads`` (ids a read-through fill wrote; the backfill skips them).

The job keeps what its machinery needs and nothing of the migration: its shards, the
applier's write counts, and the pause flag its shards read (``PAUSED``). A stopped
migration's job ends and its work directory goes; the migration's folder stays, so a
resumed migration still checks its side and still skips what reads filled.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from service.state.errors import NotFound
from service.state.jobs.store import JOB_ID, JobStore

MIGRATIONS = "migrations"
STATE = "state.json"
TRANSFORMED = "transform.json"  # the transform shard's outcome (read into the state)
SCHEMA = 1


class MigrationState(BaseModel):
    """What a migration's control plane knows, beyond the registry's record (which side
    serves) and its job's (which shards run)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(SCHEMA, description="the record's layout on disk")
    job: str
    gallery: str
    # The listing, when the migration started (None: still listing and planning).
    listed: int | None = None
    embedded_by: dict[str, int] = Field(default_factory=dict)
    planned_shards: int = 0  # shards of the first plan (later ones catch up or resume)
    backfill_planned: bool = False  # a transformed migration planned its backfill
    # What the transform shard measured (``transform.run_transform``): its outcome, the
    # validation curve, the route's score, the directions served, the switch point.
    transform: dict[str, Any] | None = None
    curve: list[dict[str, Any]] | None = None
    curve_directions: list[str] | None = None
    curve_validation: dict[str, Any] | None = None
    curve_note: str | None = None
    routed: dict[str, Any] | None = None
    switch_at: float | None = None
    # The progressive switch, its checks, and a switch back (which ends progressive
    # switching for this migration).
    switched_at_fraction: float | None = None
    switched_at: str | None = None
    checks: list[dict[str, Any]] = Field(default_factory=list)
    switched_back_at_fraction: float | None = None
    switched_back: str | None = None
    resumed_items: int | None = None
    # The candidate order's plan (``planning.keep_counts``): when it was made ("start" or
    # "resume"), how many items it put first (those users retrieved), of how many left.
    candidates: dict[str, Any] | None = None
    # The end of the backfill (``drive.finish``): gate_failed says the job failed by its
    # gate (not a stop); outcome says what happened and why.
    gate_failed: bool = False
    outcome: dict[str, Any] = Field(default_factory=dict)
    # The operator's choice to keep both sides as the served mode (``actions.keep``:
    # phase ``kept``): "rerank" or "hybrid", when, by whom, why, and what the two sides
    # cost when it was chosen (``view.kept_cost``).
    kept: str | None = None
    kept_at: str | None = None
    kept_by: str | None = None
    kept_reason: str | None = None
    kept_cost: dict[str, Any] | None = None

    @property
    def planning(self) -> bool:
        return self.listed is None


def folder(jobs: JobStore, job_id: str) -> Path:
    """The migration's folder (its job's id names it: one migration per job)."""
    if not JOB_ID.fullmatch(job_id):
        raise NotFound(f"no migration of job '{job_id}'")
    return jobs.root.parent / MIGRATIONS / job_id


def create(jobs: JobStore, job_id: str, gallery: str) -> MigrationState:
    state = MigrationState(job=job_id, gallery=gallery)
    where = folder(jobs, job_id)
    where.mkdir(parents=True, exist_ok=True)
    _write(where / STATE, state)
    return state


def load(jobs: JobStore, job_id: str) -> MigrationState | None:
    """The record (None: the migration never got one, or it was removed)."""
    path = folder(jobs, job_id) / STATE
    try:
        return MigrationState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None


def update(jobs: JobStore, job_id: str,
           change: Callable[[MigrationState], MigrationState]) -> MigrationState:
    """Read, change and write the record under its lock (the applier and an operator's
    call never lose each other's changes)."""
    where = folder(jobs, job_id)
    with FileLock(where / ".state.lock"):
        current = load(jobs, job_id)
        if current is None:
            raise NotFound(f"the migration of job '{job_id}' has no record")
        changed = change(current)
        _write(where / STATE, changed)
        return changed


def merge(jobs: JobStore, job_id: str, **fields: Any) -> MigrationState:
    """``update`` setting ``fields`` (validated: a misspelt field is an error)."""
    return update(jobs, job_id, lambda s: MigrationState.model_validate(
        {**s.model_dump(), **fields}))


# A migration opened before migrations kept their own record kept its state in its job's
# result and its files in its job's work directory (``adopt`` moves both here).
ADOPTED = ("listed", "embedded_by", "planned_shards", "backfill_planned", "transform", "curve",
           "curve_directions", "curve_validation", "curve_note", "routed", "switch_at",
           "switched_at_fraction", "switched_at", "checks", "switched_back_at_fraction",
           "switched_back", "resumed_items", "gate_failed")
ADOPTED_FILES = ("listing.json", "order.json", "validation.npz", "filled-by-reads")


def adopt(jobs: JobStore, job: Any) -> MigrationState:
    """The record of a migration opened before migrations kept one: its state read from
    its job's result, its files copied from the job's work directory (a gateway upgraded
    mid-migration goes on where it was)."""
    fields = {k: job.result[k] for k in ADOPTED if job.result.get(k) is not None}
    state = MigrationState.model_validate({"job": job.id, "gallery": job.gallery, **fields})
    where = folder(jobs, job.id)
    where.mkdir(parents=True, exist_ok=True)
    work = jobs.work_dir(job.id)
    for name in ADOPTED_FILES:
        if (work / name).is_file() and not (where / name).exists():
            shutil.copy2(work / name, where / name)
    _write(where / STATE, state)
    return state


def remove(jobs: JobStore, job_id: str) -> None:
    """The migration ended (undone or retired): its folder goes."""
    shutil.rmtree(folder(jobs, job_id), ignore_errors=True)


def write_json(path: Path, value: Any) -> None:
    _replace(path, json.dumps(value))


def _write(path: Path, state: MigrationState) -> None:
    _replace(path, state.model_dump_json(indent=1))


def _replace(path: Path, text: str) -> None:
    """``path`` rewritten whole (a temporary file, then a rename): never half written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
