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
    # Every compatibility gate report, {"passed": bool, ...}, oldest first: only ever ones
    # the service ran (a job's gate); a report that came with the artifact or the request
    # is never trusted. Each is bound to the gallery, incumbent, validation set and
    # criterion it was measured with (``gates.Binding``) and counts only there.
    gates: tuple[dict[str, Any], ...] = ()
    # Forced promotions of this version that skipped a check: {"gallery", "by", "at",
    # "reason", "overrides"}, so the version shows how it got past the gate.
    forced: tuple[dict[str, Any], ...] = ()

    @property
    def gate(self) -> dict[str, Any] | None:
        """The newest report, whatever gallery it was measured for."""
        return self.gates[-1] if self.gates else None

    @property
    def gate_passed(self) -> bool:
        return isinstance(self.gate, dict) and self.gate.get("passed") is True

    @property
    def gate_status(self) -> str:
        """passed | forced | failed | none, of the newest report: "forced" when it never
        passed the gate but an operator promoted it past the gate anyway (who and when are
        in ``forced``). Whether a report still lets the version into a gallery is per
        gallery and read-time (``gates.standings``); a promotion never asks this."""
        if self.gate_passed:
            return "passed"
        if any("gate" in f.get("overrides", ()) for f in self.forced):
            return "forced"
        return "none" if self.gate is None else "failed"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "routes": list(self.routes), "forced": list(self.forced),
                "gates": list(self.gates)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionRecord:
        """Records written before reports were kept per gallery hold one ``gate``: it is
        read as the only report, unbound (it names no gallery, so it authorises nothing)."""
        data = dict(data)
        legacy = data.pop("gate", None)
        gates = data.get("gates", [legacy] if isinstance(legacy, dict) else [])
        return cls(**{**data, "routes": tuple(data.get("routes", ())),
                      "forced": tuple(data.get("forced", ())), "gates": tuple(gates)})


@dataclass(frozen=True)
class Event:
    """One change of a gallery's active version: who, when, why."""

    action: str  # "create" | "promote" | "rollback" | "migrate" | "migration-rollback"
    # | "migration-switch-back" | "migration-serving"
    version: str
    previous: str | None
    by: str
    at: str
    reason: str | None = None
    forced: bool = False  # the promotion skipped a check (``overrides``), on an operator's word
    overrides: tuple[str, ...] = ()  # checks a forced promotion skipped: "gate", "space"
    space: str | None = None  # migration events: the space the gallery moved into

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        return cls(**{**data, "overrides": tuple(data.get("overrides", ()))})


@dataclass(frozen=True)
class Side:
    """Where a gallery keeps the vectors of one space: a Qdrant collection."""

    space: str
    collection: str


@dataclass(frozen=True)
class Migration:
    """A gallery's move from one space to another (blue-green: one collection per side).

    ``backfilling``: the source side serves; a job re-embeds every item into the target
    side while every write goes to both. ``switched``: the target side serves; the source
    side is kept (and still written) for a rollback. ``rolled_back``: the source side
    serves again; the target side is kept until retired. Retiring drops the side that
    does not serve and ends the migration."""

    job: str
    version: str  # the version whose native space is the target
    source: Side
    target: Side
    state: str  # backfilling | switched | rolled_back
    started_at: str
    by: str
    # How searches are served while the source side serves: "route" (the route's order),
    # "rerank" (the route's top ``rerank_k`` ranked by NEW, service/usecases/rerank.py),
    # or "hybrid" (both sides' scores summed, service/usecases/search.py; chosen by the
    # operator's ``keep`` at the end of the backfill).
    serving: str = "route"
    rerank_k: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Migration:
        return cls(**{**data, "source": Side(**data["source"]), "target": Side(**data["target"])})


@dataclass(frozen=True)
class GalleryRecord:
    name: str
    space: str
    active: str
    created_at: str
    history: tuple[Event, ...] = field(default_factory=tuple)
    validation: str | None = None  # held-out data the gate evaluates candidates on
    # The collection holding the vectors of ``space`` (None: the one behind the alias
    # named after the gallery, as every gallery had before its first migration).
    collection: str | None = None
    migration: Migration | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "history": [e.to_json() for e in self.history],
                "migration": self.migration.to_json() if self.migration else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GalleryRecord:
        history = tuple(Event.from_json(e) for e in data.get("history", ()))
        migration = data.get("migration")
        return cls(**{**data, "history": history,
                      "migration": Migration.from_json(migration) if migration else None})

    @property
    def serving_side(self) -> Side:
        return Side(self.space, self.collection or self.name)

    def sides(self) -> tuple[Side, ...]:
        """Every side a write must reach: the serving one first, then the other side of
        an open migration."""
        if self.migration is None:
            return (self.serving_side,)
        m = self.migration
        other = m.target if m.source.space == self.space else m.source
        return (self.serving_side, other)

    def with_event(self, event: Event) -> GalleryRecord:
        return replace(self, active=event.version, history=(*self.history, event))

    def earlier_versions(self) -> list[str]:
        return list(dict.fromkeys(e.version for e in self.history if e.version != self.active))
