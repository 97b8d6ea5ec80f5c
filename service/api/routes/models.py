"""Model versions (admin): list, read, register, promote, roll back."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.galleries import GalleryOut
from service.api.schemas.models import PromoteIn, RegisterIn, RollbackIn, VersionOut
from service.usecases import models

router = APIRouter(prefix=f"{API_V1}/models", tags=["models"])


@router.get("", response_model=list[VersionOut])
async def list_versions(gateway: GatewayDep, _: AdminDep) -> list[VersionOut]:
    """Every registered version with its manifest and gate report."""
    return [VersionOut.of(v.record, v.manifest) for v in await models.list_versions(gateway)]


@router.get("/{version_id}", response_model=VersionOut)
async def get_version(version_id: str, gateway: GatewayDep, _: AdminDep) -> VersionOut:
    version = await models.get_version(gateway, version_id)
    return VersionOut.of(version.record, version.manifest)


@router.post("", response_model=VersionOut, status_code=201)
async def register(body: RegisterIn, gateway: GatewayDep, admin: AdminDep) -> VersionOut:
    """Copy (or move) an artifact directory into the registry, verifying its checksums."""
    gate = body.gate.model_dump() if body.gate is not None else None
    version = await models.register_version(gateway, body.source, admin, body.move, gate)
    return VersionOut.of(version.record, version.manifest)


@router.post("/{version_id}/promote", response_model=GalleryOut)
async def promote(version_id: str, body: PromoteIn, gateway: GatewayDep,
                  admin: AdminDep) -> GalleryOut:
    """Make the version serve a gallery; needs a passing gate report unless forced."""
    done = await models.promote(gateway, version_id, body.gallery, admin, body.force,
                                body.reason)
    return GalleryOut.of(done.record, done.serving)


@router.post("/{version_id}/rollback", response_model=GalleryOut)
async def rollback(version_id: str, body: RollbackIn, gateway: GatewayDep,
                   admin: AdminDep) -> GalleryOut:
    """Re-activate a version that served the gallery before."""
    done = await models.rollback(gateway, version_id, body.gallery, admin, body.reason)
    return GalleryOut.of(done.record, done.serving)
