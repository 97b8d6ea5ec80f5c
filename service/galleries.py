"""Create a gallery: load the version that will serve it (to learn its vector width),
create the Qdrant collection, then record the gallery in the registry."""

from __future__ import annotations

import asyncio

from service.core.errors import AlreadyExists
from service.gallery.store import GalleryStore
from service.registry import GalleryRecord, Registry
from service.runtime.serving import Runtime


async def create_gallery(registry: Registry, runtime: Runtime, store: GalleryStore, name: str,
                         space: str, version: str | None, by: str,
                         validation: str | None = None) -> GalleryRecord:
    registry.check_gallery_name(name)
    if name in {g.name for g in await asyncio.to_thread(registry.galleries)}:
        raise AlreadyExists(f"gallery '{name}' already exists")
    chosen = version or (await asyncio.to_thread(registry.default_version, space)).version_id
    embedder = await runtime.embedder(chosen, space)
    await asyncio.to_thread(store.create, name, embedder.dim)
    record = await asyncio.to_thread(registry.create_gallery, name, space, by=by,
                                    version=chosen, validation=validation)
    await runtime.refresh()
    return record
