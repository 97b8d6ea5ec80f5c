"""Model versions: list and read them (each gate report with whether it still counts for
its gallery), register an artifact (only from the allowed roots, and without a gate: the
service runs gates), promote a version to serve a gallery, roll back, retire one. A
promotion or rollback answers after this replica has swapped (others follow by polling
the registry)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from service.runtime.gateway import Gateway
from service.runtime.serving import Serving
from service.state.errors import Conflict
from service.state.jobs.store import Job
from service.state.paths import Roots
from service.state.registry import GalleryRecord, VersionRecord
from service.state.registry.gates import Standing


@dataclass(frozen=True)
class Version:
    record: VersionRecord
    manifest: dict[str, Any]
    created: bool = True  # False: an identical artifact was registered already
    gates: tuple[Standing, ...] = ()  # its gate reports, oldest first, current or stale


@dataclass(frozen=True)
class Swapped:
    record: GalleryRecord
    serving: Serving


async def list_versions(gateway: Gateway) -> list[Version]:
    records = await asyncio.to_thread(gateway.registry.versions)
    gates = await asyncio.to_thread(gateway.registry.gate_standings, records)
    return [Version(r, await _manifest(gateway, r.version_id), gates=gates[r.version_id])
            for r in records]


async def get_version(gateway: Gateway, version_id: str) -> Version:
    record = await asyncio.to_thread(gateway.registry.version, version_id)
    return await _version(gateway, record)


async def register_version(gateway: Gateway, source: str, by: str, move: bool) -> Version:
    """Copy (or move) an artifact directory under an allowed root into the registry,
    verifying its checksums. It has no gate report until an ``evaluate`` job runs the gate
    (a report in its manifest is dropped). The same artifact again: the existing record,
    ``created`` False; other files under a taken id: AlreadyExists."""
    path = await asyncio.to_thread(Roots.of(gateway.settings).confine, source, "source")
    record, created = await asyncio.to_thread(gateway.registry.add, path, by=by, move=move)
    return await _version(gateway, record, created)


async def delete_version(gateway: Gateway, version_id: str) -> VersionRecord:
    """Retire a version: Conflict while it serves a gallery, is the parent of the version
    that does, or a queued or running job names it; else its index entry and artifact go."""
    busy = [j.id for j in await asyncio.to_thread(gateway.jobs.list)
            if not j.finished and version_id in _versions_named(j)]
    if busy:
        raise Conflict(f"version '{version_id}' is used by unfinished jobs "
                       f"({', '.join(busy[:5])}); cancel them or let them finish first")
    record = await asyncio.to_thread(gateway.registry.delete_version, version_id)
    await gateway.runtime.refresh()
    return record


def _versions_named(job: Job) -> set[str]:
    """The versions a job's parameters name (parent, evaluated version, XBT's new model)."""
    new = job.params.get("new")
    named = {job.params.get("version"), job.params.get("parent"),
             new.get("version") if isinstance(new, dict) else None}
    return {v for v in named if isinstance(v, str)}


async def promote(gateway: Gateway, version_id: str, gallery: str, by: str, force: bool,
                  reason: str | None) -> Swapped:
    record = await asyncio.to_thread(gateway.registry.promote, gallery, version_id, by=by,
                                     force=force, reason=reason)
    return await _swapped(gateway, record)


async def rollback(gateway: Gateway, version_id: str, gallery: str, by: str,
                   reason: str | None) -> Swapped:
    record = await asyncio.to_thread(gateway.registry.rollback, gallery, version_id, by=by,
                                     reason=reason)
    return await _swapped(gateway, record)


async def _swapped(gateway: Gateway, record: GalleryRecord) -> Swapped:
    await gateway.runtime.refresh()
    return Swapped(record, gateway.runtime.serving(record.name))


async def _version(gateway: Gateway, record: VersionRecord, created: bool = True) -> Version:
    gates = await asyncio.to_thread(gateway.registry.gate_standings, [record])
    return Version(record, await _manifest(gateway, record.version_id), created,
                   gates[record.version_id])


async def _manifest(gateway: Gateway, version_id: str) -> dict[str, Any]:
    return dict(await asyncio.to_thread(gateway.registry.manifest, version_id))
