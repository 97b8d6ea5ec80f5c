"""Model versions: list and read them, register an artifact, promote a version to serve a
gallery, roll back. A promotion or rollback answers after this replica has swapped
(others follow by polling the registry)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from service.runtime.gateway import Gateway
from service.runtime.serving import Serving
from service.state.registry import GalleryRecord, VersionRecord


@dataclass(frozen=True)
class Version:
    record: VersionRecord
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Swapped:
    record: GalleryRecord
    serving: Serving


async def list_versions(gateway: Gateway) -> list[Version]:
    records = await asyncio.to_thread(gateway.registry.versions)
    return [Version(r, await _manifest(gateway, r.version_id)) for r in records]


async def get_version(gateway: Gateway, version_id: str) -> Version:
    record = await asyncio.to_thread(gateway.registry.version, version_id)
    return Version(record, await _manifest(gateway, version_id))


async def register_version(gateway: Gateway, source: str, by: str, move: bool,
                           gate: dict[str, Any] | None) -> Version:
    """Copy (or move) an artifact directory into the registry, verifying its checksums."""
    record = await asyncio.to_thread(gateway.registry.register, source, by=by, move=move,
                                     gate=gate)
    return Version(record, await _manifest(gateway, record.version_id))


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


async def _manifest(gateway: Gateway, version_id: str) -> dict[str, Any]:
    return dict(await asyncio.to_thread(gateway.registry.manifest, version_id))
