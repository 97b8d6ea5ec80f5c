"""One code path, two backends: a Qdrant server when a URL is configured, otherwise the
embedded local mode (a path under the data directory, or ``:memory:`` in tests)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from qdrant_client import QdrantClient

from service.state.config import MEMORY, Settings


def open_qdrant(settings: Settings) -> QdrantClient:
    if settings.qdrant_url:
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantClient(url=settings.qdrant_url, api_key=key)
    location = settings.qdrant_location
    if location == MEMORY:
        return QdrantClient(location=MEMORY)
    Path(location).mkdir(parents=True, exist_ok=True)
    # Local mode locks its directory: only one process (the gateway) may open it.
    return QdrantClient(path=location)


def tune_local_writes(client: QdrantClient, collection: str) -> bool:
    """Let the embedded Qdrant commit a point without waiting for the disk.

    Local mode on a path stores each point in a SQLite file and commits every point on its
    own; in SQLite's default rollback journal each commit waits for an fsync (about 1 ms per
    point here: 20 s of the gateway's time for a 20,000-item backfill, and the gallery's
    lock held meanwhile, so searches wait). Write-ahead logging with ``synchronous=NORMAL``
    makes a commit an append (about 0.1 ms per point). Nothing is lost or corrupted when a
    process dies; on a power cut the last commits may be lost, never the file (SQLite's
    guarantee for WAL). A server, or ``:memory:``, has no such file: returns False then, and
    also when the client's internals are not the ones this was written against (the writes
    stay correct, only slower). True when the pragmas are set."""
    local = getattr(client, "_client", None)
    get = getattr(local, "_get_collection", None)
    if get is None:
        return False
    try:
        storage = getattr(get(collection), "storage", None)
    except (ValueError, RuntimeError):
        return False
    connection = getattr(storage, "storage", None)
    if not isinstance(connection, sqlite3.Connection):
        return False
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    return True
