from __future__ import annotations

import asyncio

from fastapi import APIRouter

from service.api import API_V1
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas.galleries import GalleryCreate, GalleryOut
from service.core.errors import NotFound
from service.galleries import create_gallery
from service.gateway import Gateway
from service.runtime.serving import Serving

router = APIRouter(prefix=f"{API_V1}/galleries", tags=["galleries"])


@router.post("", response_model=GalleryOut, status_code=201)
async def create(body: GalleryCreate, gateway: GatewayDep, admin: AdminDep) -> GalleryOut:
    """Create a gallery in an embedding space, served by a registered version."""
    record = await create_gallery(gateway.registry, gateway.runtime, gateway.store, body.name,
                                  body.space, body.version, admin, body.validation)
    return GalleryOut.of(record, gateway.runtime.serving(record.name))


@router.get("", response_model=list[GalleryOut])
async def list_galleries(gateway: GatewayDep, _: AdminDep) -> list[GalleryOut]:
    records = await asyncio.to_thread(gateway.registry.galleries)
    return [GalleryOut.of(r, _serving(gateway, r.name)) for r in records]


@router.get("/{gallery}", response_model=GalleryOut)
async def get_gallery(gallery: str, gateway: GatewayDep, _: AdminDep) -> GalleryOut:
    """The gallery's space, active version, history, and what this replica serves."""
    record = await asyncio.to_thread(gateway.registry.gallery, gallery)
    items = await asyncio.to_thread(gateway.store.count, gallery)
    return GalleryOut.of(record, _serving(gateway, gallery), items)


def _serving(gateway: Gateway, gallery: str) -> Serving | None:
    try:
        return gateway.runtime.serving(gallery)
    except NotFound:
        return None  # in the registry but not picked up by this replica yet
