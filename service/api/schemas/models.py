from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.state.registry import VersionRecord

Reason = Annotated[str, StringConstraints(max_length=2000)]
GalleryName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class RegisterIn(BaseModel):
    """No gate report: the service runs the gate (an ``evaluate`` job), or an operator
    forces a promotion with a reason; a report the caller wrote proves nothing."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="artifact directory under an allowed root (DATA_DIR, the registry, "
                    "DATASETS_DIR, ALLOWED_ROOTS) as the gateway sees it")
    move: bool = Field(False, description="move instead of copy")

    @model_validator(mode="before")
    @classmethod
    def _no_gate(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gate" in data:
            raise ValueError("a gate report cannot be supplied: register the version, then "
                             "run an `evaluate` job (the service runs the gate), or promote "
                             "with force=true and a reason")
        return data


class PromoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gallery: GalleryName
    force: bool = Field(False, description="skip the gate and space checks (needs a reason; "
                        "recorded as forced, with who and when, on the gallery and version)")
    reason: Reason | None = None


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


class VersionOut(BaseModel):
    version_id: str
    space: str
    routes: list[str]
    registered_at: str
    registered_by: str
    gate: dict[str, Any] | None = Field(description="the report of a gate the service ran")
    gate_status: Literal["passed", "forced", "failed", "none"] = Field(
        description="forced: it never passed the gate and was promoted past it (see forced)")
    forced: list[ForcedOut] = Field(default_factory=list)
    manifest: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: VersionRecord, manifest: dict[str, Any] | None = None) -> VersionOut:
        return cls(version_id=record.version_id, space=record.space, routes=list(record.routes),
                   registered_at=record.registered_at, registered_by=record.registered_by,
                   gate=record.gate, gate_status=record.gate_status,
                   forced=[ForcedOut(**f) for f in record.forced], manifest=manifest)


class VersionDeletedOut(BaseModel):
    version_id: str
    deleted_by: str
