from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    model_validator,
)

from service.api.schemas import FORCE_NEEDS_REASON, needs_reason
from service.state.registry import VersionRecord
from service.state.registry.gates import Standing

Reason = Annotated[str, StringConstraints(max_length=2000)]
GalleryName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class RegisterIn(BaseModel):
    """No gate report: the service runs the gate (an ``evaluate`` job), or an operator
    forces a promotion with a reason; a report the caller wrote proves nothing."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="artifact directory under an allowed root (DATA_DIR, the registry, "
                    "DATASETS_DIR, ALLOWED_ROOTS) as the gateway sees it")
    move: StrictBool = Field(False, description="move instead of copy")

    @model_validator(mode="before")
    @classmethod
    def _no_gate(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gate" in data:
            raise ValueError("a gate report cannot be supplied: register the version, then "
                             "run an `evaluate` job (the service runs the gate), or promote "
                             "with force=true and a reason")
        return data


class PromoteIn(BaseModel):
    """``force: true`` needs a non-blank ``reason`` (stated as the schema's if/then)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=FORCE_NEEDS_REASON)

    gallery: GalleryName
    # Strict: "true" or 1 never force a promotion.
    force: StrictBool = Field(False, description="skip the gate and space checks (needs a "
                              "reason; recorded as forced, with who and when, on the gallery "
                              "and version)")
    reason: Reason | None = None

    @model_validator(mode="after")
    def _reason_when_forced(self) -> PromoteIn:
        needs_reason(self.force, self.reason, "a forced promotion")
        return self


class RollbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gallery: GalleryName
    reason: Reason | None = None


class ForcedOut(BaseModel):
    """A promotion of the version that skipped checks on an operator's word."""

    gallery: str
    by: str
    at: str
    reason: str | None
    overrides: list[str]


class GateReportOut(BaseModel):
    """One gate report and where it was measured; it lets the version into its gallery
    only while ``current`` (and passed)."""

    gallery: str | None = Field(description="the gallery it was measured for (None: a "
                                "report from before reports were bound; it counts nowhere)")
    incumbent: str | None = Field(description="the version serving that gallery then")
    validation: str | None = Field(description="the validation set the gate read")
    validation_digest: str | None = Field(
        description="sha256 of the validation manifest and every image it lists, then")
    criterion: dict[str, Any] | None = Field(
        description="the criterion in force then (metric, margin, retention limit, max "
                    "negative-flip rate)")
    passed: bool
    measured_at: str | None = None
    current: bool = Field(description="the gallery still has that incumbent, validation "
                          "digest and criterion in force")
    stale: list[str] = Field(description="why it no longer counts (empty when current)")
    report: dict[str, Any]

    @classmethod
    def of(cls, standing: Standing) -> GateReportOut:
        r = standing.report
        found = r.get("validation")
        validation: dict[str, Any] = found if isinstance(found, dict) else {}
        return cls(gallery=_text(r.get("gallery")), incumbent=_text(r.get("incumbent")),
                   validation=_text(validation.get("path")),
                   validation_digest=_text(validation.get("digest")),
                   criterion=r.get("policy") if isinstance(r.get("policy"), dict) else None,
                   passed=r.get("passed") is True, measured_at=_text(r.get("measured_at")),
                   current=standing.current, stale=list(standing.stale), report=r)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class VersionOut(BaseModel):
    version_id: str
    space: str
    routes: list[str]
    registered_at: str
    registered_by: str
    gate: dict[str, Any] | None = Field(
        description="the newest report of a gate the service ran (any gallery; see gates)")
    gate_status: Literal["passed", "forced", "failed", "none"] = Field(
        description="the verdict of the newest report; forced: it never passed the gate and "
                    "was promoted past it (see forced). Whether a report still lets the "
                    "version into a gallery is in gates")
    gates: list[GateReportOut] = Field(
        default_factory=list, description="every gate report, oldest first, each with the "
        "gallery, incumbent, validation set and criterion it was measured with, and whether "
        "it is still current")
    forced: list[ForcedOut] = Field(default_factory=list)
    manifest: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: VersionRecord, manifest: dict[str, Any] | None = None,
           gates: tuple[Standing, ...] = ()) -> VersionOut:
        return cls(version_id=record.version_id, space=record.space, routes=list(record.routes),
                   registered_at=record.registered_at, registered_by=record.registered_by,
                   gate=record.gate, gate_status=record.gate_status,
                   gates=[GateReportOut.of(g) for g in gates],
                   forced=[ForcedOut(**f) for f in record.forced], manifest=manifest)


class VersionDeletedOut(BaseModel):
    version_id: str
    deleted_by: str
