"""Caller ids are strings; Qdrant wants unsigned ints or UUIDs. A name-based UUID (v5)
maps each id to the same point every time, which makes ingest idempotent."""

from __future__ import annotations

import uuid

NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://nobackfill/gallery-item")


def point_id(item_id: str) -> str:
    return str(uuid.uuid5(NAMESPACE, item_id))
