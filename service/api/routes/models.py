from __future__ import annotations

import asyncio

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.galleries import GalleryOut
from service.api.schemas.models import PromoteIn, RegisterIn, RollbackIn, VersionOut
from service.gateway import Gateway
from service.registry import GalleryRecord

router = APIRouter(prefix=f"{API_V1}/models", tags=["models"])


@router.get("", response_model=list[VersionOut])
async def list_versions(gateway: GatewayDep, _: AdminDep) -> list[VersionOut]:
    """Every registered version with its manifest and gate report."""
    records = await asyncio.to_thread(gateway.registry.versions)
    return [VersionOut.of(r, await _manifest(gateway, r.version_id)) for r in records]


@router.get("/{version_id}", response_model=VersionOut)
async def get_version(version_id: str, gateway: GatewayDep, _: AdminDep) -> VersionOut:
    record = await asyncio.to_thread(gateway.registry.version, version_id)
    return VersionOut.of(record, await _manifest(gateway, version_id))


@router.post("", response_model=VersionOut, status_code=201)
async def register(body: RegisterIn, gateway: GatewayDep, admin: AdminDep) -> VersionOut:
    """Copy (or move) an artifact directory into the registry, verifying its checksums."""
    gate = body.gate.model_dump() if body.gate is not None else None
    record = await asyncio.to_thread(gateway.registry.register, body.source, by=admin,
                                     move=body.move, gate=gate)
    return VersionOut.of(record, await _manifest(gateway, record.version_id))


@router.post("/{version_id}/promote", response_model=GalleryOut)
async def promote(version_id: str, body: PromoteIn, gateway: GatewayDep,
                  admin: AdminDep) -> GalleryOut:
    """Make the version serve a gallery; needs a passing gate report unless forced."""
    record = await asyncio.to_thread(gateway.registry.promote, body.gallery, version_id,
                                     by=admin, force=body.force, reason=body.reason)
    return await _swapped(gateway, record)


@router.post("/{version_id}/rollback", response_model=GalleryOut)
async def rollback(version_id: str, body: RollbackIn, gateway: GatewayDep,
                   admin: AdminDep) -> GalleryOut:
    """Re-activate a version that served the gallery before."""
    record = await asyncio.to_thread(gateway.registry.rollback, body.gallery, version_id,
                                     by=admin, reason=body.reason)
    return await _swapped(gateway, record)


async def _swapped(gateway: Gateway, record: GalleryRecord) -> GalleryOut:
    """Answer after this replica has swapped (others follow by polling the registry)."""
    await gateway.runtime.refresh()
    return GalleryOut.of(record, gateway.runtime.serving(record.name))


async def _manifest(gateway: Gateway, version_id: str) -> dict:
    return await asyncio.to_thread(gateway.registry.manifest, version_id)
