"""Bodies of /v1/galleries/{gallery}/plans (``service.jobkinds.plan``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from service.api.schemas import FORCE_NEEDS_REASON, needs_reason
from service.api.schemas.examples import (
    APPLIED_RESPONSE,
    APPLY_REQUEST,
    PLAN_REQUEST,
    PLAN_RESPONSE,
    examples,
)
from service.api.schemas.jobs import JobOut
from service.jobkinds.plan import PlanParams
from service.usecases.plans import Applied, PlanView


class PlanIn(PlanParams):
    """Start a plan (a ``plan`` job; the same as POST /v1/jobs with that kind)."""

    model_config = ConfigDict(json_schema_extra=examples(PLAN_REQUEST))


class PlanOut(BaseModel):
    model_config = ConfigDict(json_schema_extra=examples(PLAN_RESPONSE))

    id: str
    gallery: str
    status: str
    progress: dict[str, Any]
    error: str | None
    created_at: str
    ended_at: str | None
    params: dict[str, Any]
    plan: dict[str, Any] | None = Field(description="options (share of the gain per "
                                        "direction with its standard error, negative flip, "
                                        "added latency, storage, compute), the migration's "
                                        "curve, the recommendation and why; null until done")
    basis: dict[str, Any] | None = Field(description="what it measured against: the "
                                         "gallery's size, active version, space, migration "
                                         "(job, state, target space), validation set, and "
                                         "the candidate's content digest")
    stale: list[str] = Field(description="why the plan no longer describes the gallery "
                                         "(empty: current); applying a stale plan needs force")
    applied: list[dict[str, Any]] = Field(description="each apply: option, job, by, when")

    @classmethod
    def of(cls, view: PlanView) -> PlanOut:
        j = view.job
        return cls(id=j.id, gallery=j.gallery, status=j.status, progress=j.progress,
                   error=j.error, created_at=j.created_at, ended_at=j.ended_at, params=j.params,
                   plan=j.result.get("plan"), basis=j.result.get("basis"), stale=view.stale,
                   applied=list(j.result.get("applied", [])))


class ApplyIn(BaseModel):
    """Apply one option of the plan; ``force: true`` (a stale plan) needs a ``reason``."""

    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={**FORCE_NEEDS_REASON,
                                                 **examples(APPLY_REQUEST)})

    option: str = Field(min_length=1, max_length=200, description="an option's name")
    force: StrictBool = Field(False, description="apply although the plan is stale")
    reason: str | None = Field(None, max_length=1000, description="recorded; needed with force")

    @model_validator(mode="after")
    def _reason_when_forced(self) -> ApplyIn:
        needs_reason(self.force, self.reason, "a forced apply")
        return self


class AppliedOut(BaseModel):
    model_config = ConfigDict(json_schema_extra=examples(APPLIED_RESPONSE))

    plan: str
    option: str
    job: JobOut = Field(description="the job it started: adapter (a route, gated and "
                        "promoted if it passes), evaluate (a trained XBT version) or migrate")
    forced: bool
    stale: list[str]

    @classmethod
    def of(cls, done: Applied) -> AppliedOut:
        return cls(plan=done.plan.id, option=done.option, job=JobOut.of(done.job),
                   forced=done.forced, stale=done.stale)
