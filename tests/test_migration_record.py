"""A migration's own record (``service/jobkinds/migrate/record.py``): typed and versioned on
disk, changed under its lock, refused when a field is misspelt, and adopted from the job of
a migration opened before migrations kept one."""

from __future__ import annotations

import pydantic
import pytest

from service.jobkinds.migrate import record as records
from service.state.jobs.store import JobStore


def test_a_record_round_trips_and_refuses_what_it_does_not_hold(tmp_path) -> None:
    jobs = JobStore(tmp_path / "registry")
    job = jobs.create("migrate", "g", {}, by="test")
    assert records.load(jobs, job.id) is None
    records.create(jobs, job.id, "g")
    state = records.merge(jobs, job.id, listed=7, switch_at=0.3,
                          checks=[{"fraction": 0.4, "below": False}])
    assert records.load(jobs, job.id) == state and state.schema_version == records.SCHEMA
    with pytest.raises(pydantic.ValidationError):
        records.merge(jobs, job.id, switchat=0.5)  # a misspelt field is an error
    assert records.load(jobs, job.id) == state  # and nothing was written
    records.remove(jobs, job.id)
    assert records.load(jobs, job.id) is None and not records.folder(jobs, job.id).exists()


def test_a_migration_opened_before_records_is_adopted_from_its_job(tmp_path) -> None:
    jobs = JobStore(tmp_path / "registry")
    job = jobs.create("migrate", "g", {}, by="test")
    jobs.update(job.id, lambda j: j.merged(result={
        "listed": 5, "planned_shards": 2, "switch_at": 0.3, "switched_at_fraction": 0.35,
        "checks": [{"fraction": 0.4, "below": False}], "applied": 5, "gate_failed": False,
        "backfill_paused": True}))
    work = jobs.work_dir(job.id)
    work.mkdir(parents=True)
    (work / "listing.json").write_text("[]")
    (work / "validation.npz").write_bytes(b"inputs of the checks")
    state = records.adopt(jobs, jobs.get(job.id))
    assert (state.listed, state.planned_shards, state.switch_at) == (5, 2, 0.3)
    assert state.switched_at_fraction == 0.35 and len(state.checks) == 1
    folder = records.folder(jobs, job.id)
    assert (folder / "listing.json").read_text() == "[]"
    assert (folder / "validation.npz").read_bytes() == b"inputs of the checks"
    assert records.load(jobs, job.id) == state
