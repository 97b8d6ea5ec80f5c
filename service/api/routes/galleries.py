"""Galleries (admin): create, list, read, delete."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.galleries import GalleryCreate, GalleryDeletedOut, GalleryOut
from service.usecases import galleries

router = APIRouter(prefix=f"{API_V1}/galleries", tags=["galleries"])


@router.post("", response_model=GalleryOut, status_code=201)
async def create(body: GalleryCreate, gateway: GatewayDep, admin: AdminDep) -> GalleryOut:
    """Create a gallery in an embedding space, served by a registered version."""
    made = await galleries.create_gallery(gateway, body.name, body.space, body.version, admin,
                                          body.validation)
    return GalleryOut.of(made.record, made.serving)


@router.get("", response_model=list[GalleryOut])
async def list_galleries(gateway: GatewayDep, _: AdminDep) -> list[GalleryOut]:
    return [GalleryOut.of(g.record, g.serving) for g in await galleries.list_galleries(gateway)]


@router.get("/{gallery}", response_model=GalleryOut)
async def get_gallery(gallery: str, gateway: GatewayDep, _: AdminDep) -> GalleryOut:
    """The gallery's space, active version, history, and what this replica serves."""
    found = await galleries.get_gallery(gateway, gallery)
    return GalleryOut.of(found.record, found.serving, found.items)


@router.delete("/{gallery}", response_model=GalleryDeletedOut)
async def delete_gallery(gallery: str, gateway: GatewayDep, admin: AdminDep) -> GalleryDeletedOut:
    """Delete a gallery: its registry record, Qdrant collection and alias, and thumbnails.
    409 while a job for it is queued or running; repeat it to finish an interrupted one."""
    record = await galleries.delete_gallery(gateway, gallery, admin)
    return GalleryDeletedOut(name=record.name, space=record.space, active=record.active,
                             deleted_by=admin)
