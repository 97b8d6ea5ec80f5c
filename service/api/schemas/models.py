from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.state.registry import VersionRecord

Reason = Annotated[str, StringConstraints(max_length=2000)]
GalleryName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class GateReport(BaseModel):
    """The compatibility gate's result; any further fields are kept as given."""

    model_config = ConfigDict(extra="allow")

    passed: bool


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="artifact directory readable by the gateway (e.g. on the shared volume)")
    move: bool = Field(False, description="move instead of copy")
    gate: GateReport | None = Field(None, description="default: the manifest's `gate` report")


class PromoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gallery: GalleryName
    force: bool = Field(False, description="skip the gate and space checks (needs a reason)")
    reason: Reason | None = None


class RollbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gallery: GalleryName
    reason: Reason | None = None


class VersionOut(BaseModel):
    version_id: str
    space: str
    routes: list[str]
    registered_at: str
    registered_by: str
    gate: dict[str, Any] | None
    manifest: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: VersionRecord, manifest: dict[str, Any] | None = None) -> VersionOut:
        return cls(version_id=record.version_id, space=record.space, routes=list(record.routes),
                   registered_at=record.registered_at, registered_by=record.registered_by,
                   gate=record.gate, manifest=manifest)
