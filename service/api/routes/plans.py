"""Upgrade plans of a gallery (admin): start one (a ``plan`` job), read them (with whether
each still describes the gallery), apply an option in one call."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.examples import PLAN_JOB, example_response
from service.api.schemas.jobs import JobOut
from service.api.schemas.plans import AppliedOut, ApplyIn, PlanIn, PlanOut
from service.jobkinds.plan import KIND as PLAN
from service.usecases import jobs, plans

router = APIRouter(prefix=f"{API_V1}/galleries/{{gallery}}/plans", tags=["plans"])


@router.post("", response_model=JobOut, status_code=202,
             responses=example_response(202, PLAN_JOB))
async def start(gallery: str, body: PlanIn, gateway: GatewayDep, admin: AdminDep) -> JobOut:
    """Measure every way to the candidate model on this gallery (a sample the candidate
    embeds; the gallery's validation set) and recommend one under the constraints. 422
    when the gallery has no validation set and none is given."""
    return JobOut.of(await jobs.submit_job(gateway, PLAN.name, gallery, body, False, admin))


@router.get("", response_model=list[PlanOut])
async def list_plans(gallery: str, gateway: GatewayDep, _: AdminDep) -> list[PlanOut]:
    """The gallery's plans, newest first."""
    return [PlanOut.of(v) for v in await plans.list_plans(gateway, gallery)]


@router.get("/{plan_id}", response_model=PlanOut)
async def get(gallery: str, plan_id: str, gateway: GatewayDep, _: AdminDep) -> PlanOut:
    """The plan: its table, curve and recommendation (once done), and whether it is stale."""
    return PlanOut.of(await plans.get_plan(gateway, gallery, plan_id))


@router.post("/{plan_id}/apply", response_model=AppliedOut, status_code=202)
async def apply(gallery: str, plan_id: str, body: ApplyIn, gateway: GatewayDep,
                admin: AdminDep) -> AppliedOut:
    """Start the job that makes the option happen: a route is fitted, gated and promoted if
    the gate passes; a trained XBT version is gated and promoted; a migration starts with
    the option's transform, order and switch rule (the candidate must serve first). 409
    when the plan is stale (unless forced with a reason), not finished, or the option
    cannot be applied now; 422 for an unknown option."""
    done = await plans.apply_plan(gateway, gallery, plan_id, body.option, body.force,
                                  body.reason, admin)
    return AppliedOut.of(done)
