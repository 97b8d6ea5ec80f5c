"""The registry: registered model versions and, per gallery, its space, active version and
the history of promotions and rollbacks. Every change is one locked, atomic index update.

Promotion is gated: the version's newest *current* gate report for that gallery must
pass (measured against the gallery's active version, on its validation set as it is now,
under the criterion in force: ``gates.py``), and the version must have a route into the
gallery's space, unless ``force`` is given with a reason (both recorded, in the gallery's
history and on the version). A stored gate report is always one the service ran (a
job's gate, passed in as ``gate`` by the worker): a report inside a registered
artifact's manifest is dropped, never trusted. Every report is kept. Rollback
re-activates any version that was active for that gallery before.

Deleting: a version is retired unless it serves a gallery or is the parent of one that
does (index entry first, then its directory). A gallery is deleted in steps
(``retire_gallery``: its record leaves the index for a tombstone, so nothing lists or
serves it; the caller then drops its collection and thumbnails; ``forget_gallery``
removes the tombstone); a gallery is never recorded without its collection, and an
interrupted delete is finished by repeating it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.state.errors import (
    AlreadyExists,
    Conflict,
    GalleryNotFound,
    GateFailed,
    InvalidInput,
    RegistryError,
    SpaceMismatch,
    VersionNotFound,
    shown,
)
from service.state.registry import gates, staging
from service.state.registry.gates import GatePolicy, Standing
from service.state.registry.index import IndexFile, utc_now
from service.state.registry.records import Event, GalleryRecord, Migration, Side, VersionRecord
from training.artifacts import MANIFEST, Artifact

if TYPE_CHECKING:
    from service.state.config import Settings

GALLERY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
VERSIONS = "versions"
DELETING = "deleting"  # index key: galleries whose deletion started and has not finished


class Registry:
    def __init__(self, root: str | Path, lock_timeout_s: float = 60.0,
                 gate_policy: GatePolicy | None = None) -> None:
        self.root = Path(root)
        self.index = IndexFile(self.root, lock_timeout_s)
        # The criterion in force that a promotion's gate report must have been measured
        # under; None: the settings' defaults (processes that promote pass their own).
        self.gate_policy = gate_policy or GatePolicy.default()

    @classmethod
    def of(cls, settings: Settings) -> Registry:
        """The registry of a process, checking gates under its settings' criterion."""
        return cls(settings.registry_dir, gate_policy=GatePolicy.of(settings))

    # ------------------------------------------------------------ reading
    def revision(self) -> int:
        return int(self.index.read().get("revision", 0))

    def state(self) -> tuple[int, dict[str, VersionRecord], dict[str, GalleryRecord]]:
        """(revision, versions, galleries) from one consistent read of the index."""
        index = self.index.read()
        return int(index.get("revision", 0)), _versions(index), _galleries(index)

    def versions(self) -> list[VersionRecord]:
        return sorted(_versions(self.index.read()).values(), key=lambda v: v.registered_at)

    def version(self, version_id: str) -> VersionRecord:
        return _version(self.index.read(), version_id)

    def artifact_dir(self, version_id: str) -> Path:
        return self.root / self.version(version_id).path

    def artifact(self, version_id: str) -> Artifact:
        """The version's artifact, every checksum verified."""
        return staging.verified(self.artifact_dir(version_id))

    def manifest(self, version_id: str) -> dict[str, Any]:
        """The version's manifest as stored (checksums are verified when it is loaded)."""
        path = self.artifact_dir(version_id) / MANIFEST
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RegistryError(f"manifest of version '{version_id}' is unreadable: {exc}") from exc

    def galleries(self) -> list[GalleryRecord]:
        return sorted(_galleries(self.index.read()).values(), key=lambda g: g.name)

    def gallery(self, name: str) -> GalleryRecord:
        return _gallery(self.index.read(), name)

    def gate_standings(self, versions: list[VersionRecord]) -> dict[str, tuple[Standing, ...]]:
        """Each version's reports with whether each still counts for its gallery, from one
        read of the galleries (each validation set is digested once)."""
        galleries = _galleries(self.index.read())
        digest = functools.cache(gates.validation_digest)
        return {v.version_id: gates.standings(v.gates, galleries, digest, self.gate_policy)
                for v in versions}

    def default_version(self, space: str) -> VersionRecord:
        """The newest registered version native to ``space``."""
        return _newest_native(self.index.read(), space)

    @staticmethod
    def check_gallery_name(name: str) -> None:
        if not GALLERY_NAME.match(name):
            raise InvalidInput(f"gallery name '{shown(name)}' must match "
                               f"{GALLERY_NAME.pattern}")

    # ------------------------------------------------------------ versions
    def register(self, source: str | Path, *, by: str, move: bool = False,
                 gate: dict[str, Any] | None = None) -> VersionRecord:
        """``add`` without saying whether the version is new."""
        return self.add(source, by=by, move=move, gate=gate)[0]

    def add(self, source: str | Path, *, by: str, move: bool = False,
            gate: dict[str, Any] | None = None) -> tuple[VersionRecord, bool]:
        """Verify the artifact at ``source``, copy (or move) it in, and index it; (record,
        True) when it is new.

        ``gate`` is the report of a gate the service ran (the worker's admission, bound to
        where it was measured); any ``gate`` or ``gates`` in the artifact's manifest is
        dropped from the stored copy, so a version registered from outside has no gate
        until an ``evaluate`` job runs one. Registering the same artifact twice returns
        the existing record (and False); a different artifact under an id that is taken
        is refused.
        """
        artifact = staging.verified(Path(source))
        _check_gate_report(gate)
        existing = _versions(self.index.read()).get(artifact.version_id)
        if existing is not None:
            return self._same_or_conflict(existing, artifact), False
        record = VersionRecord(
            version_id=artifact.version_id, space=artifact.space,
            routes=tuple(sorted(artifact.routes)), path=f"{VERSIONS}/{artifact.version_id}",
            registered_at=utc_now(), registered_by=by, gates=(gate,) if gate else ())
        staged = staging.stage(Path(source), self.root / VERSIONS, move)
        final = self.root / record.path
        try:
            staging.set_manifest_field(staged, "gate", gate)  # the stored copy: ours only
            staging.set_manifest_field(staged, "gates", [gate] if gate else None)
        except BaseException:
            staging.give_back(staged, Path(source))
            shutil.rmtree(staged, ignore_errors=True)
            raise
        try:
            self.index.update(lambda index: self._add_version(index, record, staged),
                              undo=lambda: os.rename(final, staged))  # unpublish
        except BaseException:
            staging.give_back(staged, Path(source))  # a moved artifact goes back on failure
            raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already when published
        if move and Path(source).exists():
            shutil.rmtree(source)  # a cross-filesystem move copied; drop the original now
        return record, True

    def _same_or_conflict(self, existing: VersionRecord, artifact: Artifact) -> VersionRecord:
        if staging.same_files(self.artifact(existing.version_id), artifact):
            return existing
        raise AlreadyExists(f"version '{artifact.version_id}' is already registered with "
                            f"different files; give the new artifact another version id")

    def _add_version(self, index: dict[str, Any], record: VersionRecord, staged: Path) -> None:
        if record.version_id in index["versions"]:
            raise AlreadyExists(f"version '{record.version_id}' was registered concurrently")
        staging.publish(staged, self.root / record.path)
        index["versions"][record.version_id] = record.to_json()

    def delete_version(self, version_id: str) -> VersionRecord:
        """Retire a version: its index entry goes in one atomic update (Conflict while it
        serves a gallery, or is the parent of the version that does), then its directory.
        A crash in between leaves only an unindexed directory, which a later registration
        of that id replaces."""
        def change(index: dict[str, Any]) -> VersionRecord:
            record = _version(index, version_id)
            for gallery in _galleries(index).values():
                if gallery.active == version_id:
                    raise Conflict(f"version '{version_id}' serves gallery '{gallery.name}'; "
                                   f"promote or roll back to another version first")
                if self._parent(index, gallery.active) == version_id:
                    raise Conflict(f"version '{version_id}' is the parent of "
                                   f"'{gallery.active}', which serves gallery "
                                   f"'{gallery.name}'; keep it while its child serves")
            del index["versions"][version_id]
            return record
        record = self.index.update(change)
        _discard(self.root / record.path)
        return record

    def _parent(self, index: dict[str, Any], version_id: str) -> str | None:
        """The manifest's ``parent`` of a registered version (None if it has none)."""
        if version_id not in index.get("versions", {}):
            return None
        try:
            parent = self.manifest(version_id).get("parent")
        except RegistryError:
            return None
        return parent if isinstance(parent, str) else None

    # ------------------------------------------------------------ galleries
    def create_gallery(self, name: str, space: str, *, by: str, version: str | None = None,
                       validation: str | None = None) -> GalleryRecord:
        """A new gallery in ``space``, served by ``version`` (default: the newest version
        native to that space). The first version is not gated: there is nothing to be
        compatible with yet."""
        self.check_gallery_name(name)

        def change(index: dict[str, Any]) -> GalleryRecord:
            _name_free(index, name)
            chosen = _version(index, version) if version else _newest_native(index, space)
            if space not in chosen.routes:
                raise SpaceMismatch(_no_route(chosen, space))
            event = Event("create", chosen.version_id, None, by, utc_now())
            record = GalleryRecord(name, space, chosen.version_id, event.at, (event,),
                                   validation)
            index["galleries"][name] = record.to_json()
            return record
        return self.index.update(change)

    def check_new_gallery(self, name: str) -> None:
        """AlreadyExists, or Conflict while an earlier gallery of that name is being deleted
        (its collection may still exist: a new gallery must not inherit its items)."""
        self.check_gallery_name(name)
        _name_free(self.index.read(), name)

    def retire_gallery(self, name: str, *, by: str) -> GalleryRecord:
        """Step 1 of deleting a gallery: its record leaves the index for a tombstone (one
        atomic update), so from here on nothing lists, serves or writes to it. Repeating
        it for a gallery whose deletion was interrupted returns the record again."""
        def change(index: dict[str, Any]) -> GalleryRecord:
            pending = index.get(DELETING, {})
            if name in pending:
                return GalleryRecord.from_json(pending[name]["record"])
            record = _gallery(index, name)
            del index["galleries"][name]
            index.setdefault(DELETING, {})[name] = {"record": record.to_json(), "by": by,
                                                    "at": utc_now()}
            return record
        return self.index.update(change)

    def forget_gallery(self, name: str) -> None:
        """The last step of deleting a gallery (its collection and thumbnails are gone)."""
        self.index.update(lambda index: index.get(DELETING, {}).pop(name, None))

    def add_gate(self, version_id: str, report: dict[str, Any]) -> VersionRecord:
        """Keep a new gate report of a registered version after the earlier ones: in the
        index, and in the manifest of its artifact (``gate``: the newest, ``gates``: all;
        rewritten atomically; the manifest is not checksummed)."""
        _check_gate_report(report)

        def change(index: dict[str, Any]) -> VersionRecord:
            old = _version(index, version_id)
            record = replace(old, gates=(*old.gates, report))
            staging.write_manifest_field(self.root / record.path, "gate", report)
            staging.write_manifest_field(self.root / record.path, "gates", list(record.gates))
            index["versions"][version_id] = record.to_json()
            return record
        return self.index.update(change)

    def promote(self, gallery: str, version: str, *, by: str, force: bool = False,
                reason: str | None = None) -> GalleryRecord:
        reason = (reason or "").strip() or None
        if force and reason is None:
            raise InvalidInput("a forced promotion needs a reason (it is recorded)")
        # Only read when the candidate has a report for this gallery (under the lock).
        digest = functools.cache(gates.validation_digest)

        def change(index: dict[str, Any]) -> GalleryRecord:
            record, candidate = _gallery(index, gallery), _version(index, version)
            if record.active == version:
                return record  # idempotent: promoting the active version changes nothing
            _serves_every_side(record, candidate)
            refused = gates.refusal(version, candidate.gates, record, digest, self.gate_policy)
            overrides = _failed_checks(record, candidate, refused)
            if overrides and not force:
                raise _refusal(overrides[0], record, candidate, refused)
            event = Event("promote", version, record.active, by, utc_now(), reason,
                          bool(overrides), tuple(overrides))
            if overrides:
                _record_forced(index, candidate, gallery, event)
            return _save(index, record.with_event(event))
        return self.index.update(change)

    def rollback(self, gallery: str, version: str, *, by: str,
                 reason: str | None = None) -> GalleryRecord:
        def change(index: dict[str, Any]) -> GalleryRecord:
            record = _gallery(index, gallery)
            candidate = _version(index, version)
            if record.active == version:
                return record
            _serves_every_side(record, candidate)
            if version not in record.earlier_versions():
                raise Conflict(f"version '{version}' was never active for gallery '{gallery}'; "
                               f"earlier versions: {record.earlier_versions()}")
            event = Event("rollback", version, record.active, by, utc_now(),
                          (reason or "").strip() or None)
            return _save(index, record.with_event(event))
        return self.index.update(change)

    # ------------------------------------------------------------ migrations
    def begin_migration(self, gallery: str, *, job: str, source: str, target: str,
                        by: str, serving: str = "route",
                        rerank_k: int | None = None) -> GalleryRecord:
        """Open a migration of ``gallery`` into its active version's native space: the
        serving side is recorded as ``source`` (a collection), ``target`` is the new,
        empty collection. Conflict while one is open, or when the gallery is already in
        that space."""
        def change(index: dict[str, Any]) -> GalleryRecord:
            record = _gallery(index, gallery)
            version = _version(index, record.active)
            _can_migrate(record, version)
            migration = Migration(job, version.version_id, Side(record.space, source),
                                  Side(version.space, target), "backfilling", utc_now(), by,
                                  serving, rerank_k)
            return _save(index, replace(record, collection=source, migration=migration))
        return self.index.update(change)

    def check_can_migrate(self, gallery: str) -> None:
        """The Conflicts ``begin_migration`` would raise now, without changing anything."""
        index = self.index.read()
        record = _gallery(index, gallery)
        _can_migrate(record, _version(index, record.active))

    def switch_migration(self, gallery: str, *, by: str, reason: str | None = None,
                         ) -> GalleryRecord:
        """backfilling -> switched: the gallery's space and collection become the target's
        in one index update (a replica swaps to it whole, as for a promotion)."""
        def change(index: dict[str, Any]) -> GalleryRecord:
            record = _gallery(index, gallery)
            m = require_migration(record, "backfilling", "switch")
            event = Event("migrate", record.active, record.active, by, utc_now(), reason,
                          space=m.target.space)
            switched = replace(record, space=m.target.space, collection=m.target.collection,
                               migration=replace(m, state="switched"))
            return _save(index, switched.with_event(event))
        return self.index.update(change)

    def serve_migration(self, gallery: str, *, serving: str, rerank_k: int | None,
                        by: str, reason: str | None = None) -> GalleryRecord:
        """How an open migration's searches are served while the source side serves
        (``serving``: route, rerank or hybrid; ``rerank_k`` with rerank), recorded as a
        ``migration-serving`` event: the operator's ``keep`` at the end of a backfill."""
        def change(index: dict[str, Any]) -> GalleryRecord:
            record = _gallery(index, gallery)
            m = require_migration(record, "backfilling", "change how it is served")
            event = Event("migration-serving", record.active, record.active, by, utc_now(),
                          (reason or "").strip() or f"served by {serving}", space=record.space)
            served = replace(record, migration=replace(m, serving=serving, rerank_k=rerank_k))
            return _save(index, served.with_event(event))
        return self.index.update(change)

    def rollback_migration(self, gallery: str, *, by: str, reason: str | None = None,
                           ) -> GalleryRecord:
        """switched -> rolled_back: the source side (space, collection, route) serves again."""
        return self._back_to_source(gallery, "roll back", "migration-rollback", "rolled_back",
                                    by, (reason or "").strip() or None)

    def switch_back_migration(self, gallery: str, *, by: str, reason: str) -> GalleryRecord:
        """switched -> backfilling (the applier, not the operator): the source side serves
        again while the backfill goes on, because the target side fell below the route
        beyond the error, or the end-of-backfill gate failed after a progressive switch."""
        return self._back_to_source(gallery, "switch back", "migration-switch-back",
                                    "backfilling", by, reason)

    def _back_to_source(self, gallery: str, verb: str, action: str, state: str, by: str,
                        reason: str | None) -> GalleryRecord:
        """A switched migration's source side serves again (its migration now ``state``),
        recorded as event ``action``; SpaceMismatch when the active version has no route
        into the source space."""
        def change(index: dict[str, Any]) -> GalleryRecord:
            record = _gallery(index, gallery)
            m = require_migration(record, "switched", verb)
            active = _version(index, record.active)
            if m.source.space not in active.routes:
                raise SpaceMismatch(_no_route(active, m.source.space))
            event = Event(action, record.active, record.active, by, utc_now(), reason,
                          space=m.source.space)
            back = replace(record, space=m.source.space, collection=m.source.collection,
                           migration=replace(m, state=state))
            return _save(index, back.with_event(event))
        return self.index.update(change)

    def end_migration(self, gallery: str, *, abort: bool) -> tuple[GalleryRecord, Side]:
        """Close the migration; (the record, the side to drop). ``abort`` (its job was
        cancelled or failed): only while backfilling, the target side goes. Otherwise
        (retire): only after a switch or a rollback, the side that does not serve goes."""
        def change(index: dict[str, Any]) -> tuple[GalleryRecord, Side]:
            record = _gallery(index, gallery)
            m = record.migration
            if m is None:
                raise Conflict(f"gallery '{gallery}' has no migration to "
                               f"{'cancel' if abort else 'retire'}")
            if abort != (m.state == "backfilling"):
                raise Conflict(f"the migration of gallery '{gallery}' is {m.state}; " + (
                    "retire it instead" if abort else
                    f"cancel its job {m.job} to abandon it, or wait for the switch"))
            dropped = record.sides()[1]
            return _save(index, replace(record, migration=None)), dropped
        return self.index.update(change)


# ---------------------------------------------------------------- index helpers
def _versions(index: dict[str, Any]) -> dict[str, VersionRecord]:
    return {k: VersionRecord.from_json(v) for k, v in index.get("versions", {}).items()}


def _galleries(index: dict[str, Any]) -> dict[str, GalleryRecord]:
    return {k: GalleryRecord.from_json(v) for k, v in index.get("galleries", {}).items()}


def _version(index: dict[str, Any], version_id: str) -> VersionRecord:
    data = index.get("versions", {}).get(version_id)
    if data is None:
        raise VersionNotFound(f"model version '{shown(version_id)}' is not registered")
    return VersionRecord.from_json(data)


def _gallery(index: dict[str, Any], name: str) -> GalleryRecord:
    data = index.get("galleries", {}).get(name)
    if data is None:
        raise GalleryNotFound(f"gallery '{shown(name)}' does not exist")
    return GalleryRecord.from_json(data)


def _name_free(index: dict[str, Any], name: str) -> None:
    if name in index.get("galleries", {}):
        raise AlreadyExists(f"gallery '{name}' already exists")
    if name in index.get(DELETING, {}):
        raise Conflict(f"gallery '{name}' is still being deleted; repeat DELETE "
                       f"/v1/galleries/{name} to finish, then create it again")


def _record_forced(index: dict[str, Any], version: VersionRecord, gallery: str,
                   event: Event) -> None:
    """A forced promotion is written on the version too: who, when, why, what it skipped."""
    entry = {"gallery": gallery, "by": event.by, "at": event.at, "reason": event.reason,
             "overrides": list(event.overrides)}
    index["versions"][version.version_id] = replace(
        version, forced=(*version.forced, entry)).to_json()


def _discard(path: Path) -> None:
    """Remove a directory that is no longer indexed: renamed aside first (one atomic step,
    so no reader ever sees half of it), then deleted."""
    trash = path.with_name(f".deleted-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _save(index: dict[str, Any], record: GalleryRecord) -> GalleryRecord:
    index["galleries"][record.name] = record.to_json()
    return record


def _newest_native(index: dict[str, Any], space: str) -> VersionRecord:
    native = [v for v in _versions(index).values() if v.space == space]
    if not native:
        raise Conflict(f"no registered version embeds natively into space '{shown(space)}'; "
                       f"register one or name the version that serves the gallery")
    return max(native, key=lambda v: v.registered_at)


def require_migration(record: GalleryRecord, state: str, action: str) -> Migration:
    """The gallery's migration, in ``state``; Conflict naming ``action`` otherwise."""
    m = record.migration
    if m is None:
        raise Conflict(f"gallery '{record.name}' has no migration to {action}")
    if m.state != state:
        raise Conflict(f"cannot {action} the migration of gallery '{record.name}': it is "
                       f"{m.state}, not {state}")
    return m


def _can_migrate(record: GalleryRecord, version: VersionRecord) -> None:
    """Conflict while a migration is open, or when the gallery is already in the native
    space of its active version (there is nothing to migrate to)."""
    m = record.migration
    if m is not None:
        raise Conflict(f"gallery '{record.name}' already has a migration ({m.state}, job "
                       f"{m.job}, '{m.source.space}' -> '{m.target.space}'); finish it "
                       f"(switch, then retire) or cancel it first")
    if version.space == record.space:
        raise Conflict(f"gallery '{record.name}' is already in space '{record.space}', the "
                       f"native space of its active version '{version.version_id}'; promote "
                       f"the version to migrate to first")


def _serves_every_side(record: GalleryRecord, candidate: VersionRecord) -> None:
    """While a migration keeps two sides, every write reaches both: a version may serve
    only if it embeds into both spaces."""
    missing = [s.space for s in record.sides() if s.space not in candidate.routes]
    if record.migration is not None and missing:
        raise Conflict(f"gallery '{record.name}' keeps sides in spaces "
                       f"{[s.space for s in record.sides()]} during its migration; version "
                       f"'{candidate.version_id}' has no route into {missing}; retire or cancel "
                       f"the migration first")


def _failed_checks(gallery: GalleryRecord, candidate: VersionRecord,
                   gate_refused: str | None) -> list[str]:
    failed = [] if gate_refused is None else ["gate"]
    return failed + ([] if gallery.space in candidate.routes else ["space"])


def _refusal(check: str, gallery: GalleryRecord, candidate: VersionRecord,
             gate_refused: str | None) -> Exception:
    if check == "space":
        return SpaceMismatch(_no_route(candidate, gallery.space))
    return GateFailed(f"{gate_refused}; run an evaluate job of it for gallery "
                      f"'{gallery.name}', or promote it with force=true and a reason")


def _no_route(version: VersionRecord, space: str) -> str:
    return (f"version '{version.version_id}' (space '{version.space}') has no route into "
            f"space '{space}'; its routes: {list(version.routes)}")


def _check_gate_report(gate: dict[str, Any] | None) -> None:
    if gate is not None and not isinstance(gate.get("passed"), bool):
        raise InvalidInput("a gate report needs a boolean 'passed' field")
