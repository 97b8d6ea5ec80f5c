"""Galleries: create one (load the version that will serve it to learn its vector width,
create the Qdrant collection, then record it in the registry), list them, read one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from service.runtime.gateway import Gateway
from service.runtime.serving import Serving
from service.state.errors import AlreadyExists, NotFound
from service.state.registry import GalleryRecord


@dataclass(frozen=True)
class Gallery:
    record: GalleryRecord
    serving: Serving | None  # None: in the registry, not picked up by this replica yet
    items: int | None = None


async def create_gallery(gateway: Gateway, name: str, space: str, version: str | None,
                         by: str, validation: str | None = None) -> Gallery:
    registry = gateway.registry
    registry.check_gallery_name(name)
    if name in {g.name for g in await asyncio.to_thread(registry.galleries)}:
        raise AlreadyExists(f"gallery '{name}' already exists")
    chosen = version or (await asyncio.to_thread(registry.default_version, space)).version_id
    embedder = await gateway.runtime.embedder(chosen, space)
    await asyncio.to_thread(gateway.store.create, name, embedder.dim)
    record = await asyncio.to_thread(registry.create_gallery, name, space, by=by,
                                     version=chosen, validation=validation)
    await gateway.runtime.refresh()
    return Gallery(record, gateway.runtime.serving(record.name))


async def list_galleries(gateway: Gateway) -> list[Gallery]:
    records = await asyncio.to_thread(gateway.registry.galleries)
    return [Gallery(r, _serving(gateway, r.name)) for r in records]


async def get_gallery(gateway: Gateway, name: str) -> Gallery:
    """The gallery's space, active version, history, item count, what this replica serves."""
    record = await asyncio.to_thread(gateway.registry.gallery, name)
    items = await asyncio.to_thread(gateway.store.count, name)
    return Gallery(record, _serving(gateway, name), items)


def _serving(gateway: Gateway, gallery: str) -> Serving | None:
    try:
        return gateway.runtime.serving(gallery)
    except NotFound:
        return None
