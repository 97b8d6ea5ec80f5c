"""Galleries: create one (load the version that will serve it to learn its vector width,
create the Qdrant collection, then record it in the registry), list them, read one,
delete one (the registry record first, then the collection and the thumbnails)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from service.runtime.gateway import Gateway
from service.runtime.serving import Serving
from service.state.errors import Conflict, NotFound
from service.state.paths import Roots
from service.state.registry import GalleryRecord
from service.state.thumbnails import ThumbnailStore


@dataclass(frozen=True)
class Gallery:
    record: GalleryRecord
    serving: Serving | None  # None: in the registry, not picked up by this replica yet
    items: int | None = None


async def create_gallery(gateway: Gateway, name: str, space: str, version: str | None,
                         by: str, validation: str | None = None) -> Gallery:
    registry = gateway.registry
    await asyncio.to_thread(registry.check_new_gallery, name)
    if validation is not None:  # the gate reads it in a worker: only under the allowed roots
        await asyncio.to_thread(Roots.of(gateway.settings).dataset, validation, "validation")
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
    items = await asyncio.to_thread(gateway.store.count, record.serving_side.collection)
    return Gallery(record, _serving(gateway, name), items)


async def delete_gallery(gateway: Gateway, name: str, by: str) -> GalleryRecord:
    """Delete a gallery: Conflict while a job for it is queued or running; otherwise its
    registry record goes first (so no replica lists or serves it, and it is never recorded
    without a collection), then its Qdrant collections (both sides of a migration) and
    alias, then its thumbnails, and last the registry's tombstone. Repeating an
    interrupted delete finishes it."""
    busy = [j.id for j in await asyncio.to_thread(gateway.jobs.list)
            if j.gallery == name and not j.finished]
    if busy:
        raise Conflict(f"gallery '{name}' has unfinished jobs ({', '.join(busy[:5])}); "
                       f"cancel them or let them finish, then delete it")
    record = await asyncio.to_thread(gateway.registry.retire_gallery, name, by=by)
    await gateway.runtime.refresh()  # this replica stops serving it before it goes
    await asyncio.to_thread(gateway.store.drop, name)  # the alias and its collection
    for side in record.sides():  # a migrating gallery's other side, a migrated one's own
        if side.collection != name:
            await asyncio.to_thread(gateway.store.drop_collection, side.collection)
    await asyncio.to_thread(ThumbnailStore.of(gateway.settings).drop, name)
    await asyncio.to_thread(gateway.candidates.forget, name)  # what its users retrieved
    await asyncio.to_thread(gateway.registry.forget_gallery, name)
    return record


def _serving(gateway: Gateway, gallery: str) -> Serving | None:
    try:
        return gateway.runtime.serving(gallery)
    except NotFound:
        return None
