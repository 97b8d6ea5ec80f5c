"""Bodies of /v1/galleries/{gallery}/migration (``service.jobkinds.migrate``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from service.api.schemas import FORCE_NEEDS_REASON, needs_reason
from service.api.schemas.examples import MIGRATION_REQUEST, SWITCH_REQUEST, examples
from service.api.schemas.galleries import ItemId
from service.jobkinds.migrate.lifecycle import OPERATOR, PHASES, options, phase_of
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.view import MigrationView


class MigrationIn(MigrateParams):
    """Start a migration (a ``migrate`` job; the same as POST /v1/jobs with that kind)."""

    model_config = ConfigDict(json_schema_extra=examples(MIGRATION_REQUEST))


class SwitchIn(BaseModel):
    """``force: true`` needs a non-blank ``reason`` (stated as the schema's if/then)."""

    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={**FORCE_NEEDS_REASON,
                                                 **examples(SWITCH_REQUEST)})

    drop: list[ItemId] = Field(default_factory=list, max_length=100_000, description=(
        "items without a new vector (unreadable sources) to delete from both sides so the "
        "switch can go on; it must list every such item"))
    force: StrictBool = Field(False, description="switch although the gate did not pass "
                              "(needs a reason)")
    reason: str | None = Field(None, max_length=1000, description="recorded; needed with force")

    @model_validator(mode="after")
    def _reason_when_forced(self) -> SwitchIn:
        needs_reason(self.force, self.reason, "a forced switch")
        return self


class KeepIn(BaseModel):
    """Keep both sides as the served mode at the end of the backfill (phase kept)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["rerank", "hybrid"] = Field(description=(
        "the fused ranking searches get: rerank (the route's top rerank_k ranked by the "
        "new model's stored vectors) or hybrid (both sides' scores summed)"))
    rerank_k: int | None = Field(None, ge=1, description=(
        "with rerank: how many of the route's candidates (default: the migration's, else "
        "the server's rerank_k; at most rerank_k_max)"))
    reason: str | None = Field(None, max_length=1000, description="recorded")


class ReasonIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=1000)


class SideOut(BaseModel):
    space: str
    collection: str


class MigrationOut(BaseModel):
    gallery: str
    state: str = Field(description="backfilling | switched | rolled_back (which side serves)")
    phase: str = Field(description=(
        "the migration's life (service/jobkinds/migrate/lifecycle.py): " + "; ".join(
            f"{name}: {note}" for name, note in PHASES.items())))
    phase_note: str = Field(description="what the phase means, in words")
    options: list[str] = Field(description="the operator's actions allowed now (of "
                                           f"{', '.join(OPERATOR)})")
    job_error: str | None = Field(None, description="why the job failed or stopped (a failed "
                                                    "gate names the operator's options)")
    serving: str = Field("route", description="how searches are served while the source "
                                              "side serves: route, rerank (with rerank_k), "
                                              "or hybrid (both sides kept)")
    rerank_k: int | None = None
    serving_space: str = Field(description="the space the gallery answers in now")
    version: str = Field(description="the version whose native space is the target")
    source: SideOut
    target: SideOut
    job: str
    job_status: str | None
    started_at: str
    started_by: str
    progress: dict[str, Any] = Field(description=(
        "stage, done, total, items_per_s, eta_s, paused (the shards); applied, unreadable "
        "(the job's writes); reembedded (items on the target side with the new version's "
        "own vectors, whoever wrote them), items (the gallery's), fraction (their ratio: "
        "what the switch uses), listed, transformed (items holding a transformed vector), "
        "filled_by_reads, filled_by_backfill (the rest of reembedded: the backfill and "
        "writes), order, switch, switch_at (the fraction from which the validation curve "
        "says the side beats the route), switched_at_fraction and switched_at (once "
        "switched), switched_back_at_fraction; with order candidates: candidates {planned "
        "(start or resume), first (items users retrieved, re-embedded first), left (items "
        "planned then), items_counted, sets (distinct sets of candidates counted), "
        "searches (kept)}; "
        "with a transform: transform (method, sample, metrics), curve [{fraction, t2i, i2t: "
        "{side, share: {share, se}}}], routed, share_estimate (the curve at the current "
        "fraction)"))
    gate: dict[str, Any] | None = Field(None, description="new->new against the route "
                                                          "new->old on the validation set")
    result: dict[str, Any] = Field(default_factory=dict, description=(
        "the job's write counts (applied, skipped, transformed, unreadable [{id, reason}], "
        "unreadable_count), then the record's: gate_failed, checks, switched_at_fraction, "
        "switched_back_at_fraction, switched_back, resumed_items, and at the end missing, "
        "switched, gate_passed, switch_refused, options"))
    end: dict[str, Any] | None = Field(None, description=(
        "once the backfill has ended without a switch (awaiting) or both sides were kept "
        "(kept): the end states the gate measured at R@1 (the native side alone, "
        "rerank@k, hybrid), whether the native side is below what serves now "
        "(native_below_what_serves: then the automatic switch waited for the operator), "
        "the choices (switch, keep with a mode) and the cost of keeping both sides "
        "(service/jobkinds/migrate/keep.py)"))
    record: dict[str, Any] | None = Field(None, description=(
        "the migration's own record as stored (listing, plan, transform outcome and curve, "
        "switches and checks, the end's outcome): service/jobkinds/migrate/record.py"))

    @classmethod
    def of(cls, found: MigrationView) -> MigrationOut:
        m, job = found.migration, found.job
        phase = phase_of(m, job, found.state)
        return cls(gallery=found.gallery.name, state=m.state, phase=phase,
                   phase_note=PHASES[phase], options=options(phase, job, found.state),
                   job_error=job.error if job else None, serving=m.serving,
                   rerank_k=m.rerank_k, serving_space=found.gallery.space,
                   version=m.version, source=SideOut(**m.source.__dict__),
                   target=SideOut(**m.target.__dict__), job=m.job,
                   job_status=job.status if job else None, started_at=m.started_at,
                   started_by=m.by, progress=found.progress, gate=job.gate if job else None,
                   result=found.result(), end=found.end,
                   record=found.state.model_dump() if found.state else None)


class RetiredOut(BaseModel):
    gallery: str
    space: str = Field(description="the space the gallery serves in (kept)")
    dropped: SideOut = Field(description="the side that was deleted")
