"""What the registry stores: plain records with JSON round trips (no HTTP schemas here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class VersionRecord:
    """A registered model version; its artifact lives at ``path`` under the registry root."""

    version_id: str
    space: str  # the space it natively embeds into
    routes: tuple[str, ...]  # every space it can embed into (native included)
    path: str  # relative to the registry root
    registered_at: str
    registered_by: str
    # The compatibility gate report, {"passed": bool, ...}: only ever one the service ran (a
    # job's gate); a report that came with the artifact or the request is never trusted.
    gate: dict[str, Any] | None = None
    # Forced promotions of this version that skipped a check: {"gallery", "by", "at",
    # "reason", "overrides"}, so the version shows how it got past the gate.
    forced: tuple[dict[str, Any], ...] = ()

    @property
    def gate_passed(self) -> bool:
        return isinstance(self.gate, dict) and self.gate.get("passed") is True

    @property
    def gate_status(self) -> str:
        """passed | forced | failed | none: "forced" when it never passed the gate but an
        operator promoted it past the gate anyway (who and when are in ``forced``)."""
        if self.gate_passed:
            return "passed"
        if any("gate" in f.get("overrides", ()) for f in self.forced):
            return "forced"
        return "none" if self.gate is None else "failed"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "routes": list(self.routes), "forced": list(self.forced)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionRecord:
        return cls(**{**data, "routes": tuple(data.get("routes", ())),
                      "forced": tuple(data.get("forced", ()))})


@dataclass(frozen=True)
class Event:
    """One change of a gallery's active version: who, when, why."""

    action: str  # "create" | "promote" | "rollback"
    version: str
    previous: str | None
    by: str
    at: str
    reason: str | None = None
    forced: bool = False  # the promotion skipped a check (``overrides``), on an operator's word
    overrides: tuple[str, ...] = ()  # checks a forced promotion skipped: "gate", "space"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        return cls(**{**data, "overrides": tuple(data.get("overrides", ()))})


@dataclass(frozen=True)
class GalleryRecord:
    name: str
    space: str
    active: str
    created_at: str
    history: tuple[Event, ...] = field(default_factory=tuple)
    validation: str | None = None  # held-out data the gate evaluates candidates on

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "history": [e.to_json() for e in self.history]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GalleryRecord:
        history = tuple(Event.from_json(e) for e in data.get("history", ()))
        return cls(**{**data, "history": history})

    def with_event(self, event: Event) -> GalleryRecord:
        return replace(self, active=event.version, history=(*self.history, event))

    def earlier_versions(self) -> list[str]:
        return list(dict.fromkeys(e.version for e in self.history if e.version != self.active))
