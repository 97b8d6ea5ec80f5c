"""Training jobs (admin): submit, list, watch, cancel. Workers run them; see worker/."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.examples import FINISHED_JOB, QUEUED_JOB, example_response
from service.api.schemas.jobs import JobIn, JobOut
from service.usecases import jobs

router = APIRouter(prefix=f"{API_V1}/jobs", tags=["jobs"])


@router.post("", response_model=JobOut, status_code=202,
             responses=example_response(202, QUEUED_JOB))
async def create(body: JobIn, gateway: GatewayDep, admin: AdminDep) -> JobOut:
    """Queue a job; 422 on bad parameters (the body's ``params`` are those of its ``kind``;
    then what they name must exist under the allowed roots) and 503 when no worker is alive
    or the broker is down (nothing kept)."""
    # The parameters as the schema parsed them: the use case checks what they name.
    return JobOut.of(await jobs.submit_job(gateway, body.kind, body.gallery, body.params,
                                           body.auto_promote, admin))


@router.get("", response_model=list[JobOut])
async def list_jobs(gateway: GatewayDep, _: AdminDep) -> list[JobOut]:
    """Every job, newest first."""
    return [JobOut.of(j) for j in await jobs.list_jobs(gateway)]


@router.get("/{job_id}", response_model=JobOut, responses=example_response(200, FINISHED_JOB))
async def get_job(job_id: str, gateway: GatewayDep, _: AdminDep) -> JobOut:
    """One job with its live progress (step, total, loss, ETA), gate report and result."""
    return JobOut.of(await jobs.get_job(gateway, job_id))


@router.delete("/{job_id}", response_model=JobOut)
async def cancel(job_id: str, gateway: GatewayDep, _: AdminDep) -> JobOut:
    """Cancel: a queued job at once; a running one stops within a few steps, leaving no
    version. 409 when it already finished."""
    return JobOut.of(await jobs.cancel_job(gateway, job_id))
