"""Model versions (admin): list, read, register, promote, roll back, retire."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.galleries import GalleryOut
from service.api.schemas.models import (
    PromoteIn,
    RegisterIn,
    RollbackIn,
    VersionDeletedOut,
    VersionOut,
)
from service.usecases import models

router = APIRouter(prefix=f"{API_V1}/models", tags=["models"])


@router.get("", response_model=list[VersionOut])
async def list_versions(gateway: GatewayDep, _: AdminDep) -> list[VersionOut]:
    """Every registered version with its manifest and gate reports (each with the gallery,
    incumbent, validation set and criterion it was measured with, and whether it still
    counts)."""
    return [VersionOut.of(v.record, v.manifest, v.gates)
            for v in await models.list_versions(gateway)]


@router.get("/{version_id}", response_model=VersionOut)
async def get_version(version_id: str, gateway: GatewayDep, _: AdminDep) -> VersionOut:
    version = await models.get_version(gateway, version_id)
    return VersionOut.of(version.record, version.manifest, version.gates)


@router.post("", response_model=VersionOut, status_code=201,
             responses={200: {"model": VersionOut, "description": "already registered (the "
                                                                 "same files): the record"}})
async def register(body: RegisterIn, gateway: GatewayDep, admin: AdminDep,
                   response: Response) -> VersionOut:
    """Copy (or move) an artifact directory under an allowed root into the registry,
    verifying its checksums: 201. The same artifact again: 200 with the existing record;
    different files under a taken version id: 409. It has no gate until an `evaluate` job
    runs one."""
    version = await models.register_version(gateway, body.source, admin, body.move)
    if not version.created:
        response.status_code = 200
    return VersionOut.of(version.record, version.manifest, version.gates)


@router.delete("/{version_id}", response_model=VersionDeletedOut)
async def delete(version_id: str, gateway: GatewayDep, admin: AdminDep) -> VersionDeletedOut:
    """Retire a version (index entry and artifact). 409 naming the gallery while it serves
    one or is the parent of the version that does, or while an unfinished job names it."""
    record = await models.delete_version(gateway, version_id)
    return VersionDeletedOut(version_id=record.version_id, deleted_by=admin)


@router.post("/{version_id}/promote", response_model=GalleryOut)
async def promote(version_id: str, body: PromoteIn, gateway: GatewayDep,
                  admin: AdminDep) -> GalleryOut:
    """Make the version serve a gallery; needs a passing gate report measured for that
    gallery against its active version, on its current validation set, under the criterion
    in force, unless forced (409 names the report that is missing, stale or failed)."""
    done = await models.promote(gateway, version_id, body.gallery, admin, body.force,
                                body.reason)
    return GalleryOut.of(done.record, done.serving)


@router.post("/{version_id}/rollback", response_model=GalleryOut)
async def rollback(version_id: str, body: RollbackIn, gateway: GatewayDep,
                   admin: AdminDep) -> GalleryOut:
    """Re-activate a version that served the gallery before."""
    done = await models.rollback(gateway, version_id, body.gallery, admin, body.reason)
    return GalleryOut.of(done.record, done.serving)
