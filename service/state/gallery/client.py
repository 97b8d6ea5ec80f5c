"""One code path, three backends: a Qdrant server when a URL is configured, otherwise an
embedded engine in the gateway's process: Qdrant Edge (the default, ``edge.py``) or
qdrant-client's local mode (``qdrant_engine = "local"``), on a path under the data
directory, or ``:memory:`` in tests (Edge: a temporary directory removed at close)."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient

from service.state.config import MEMORY, Settings
from service.state.errors import Unavailable
from service.state.gallery.edge import CATALOG, EdgeClient

Client = Any  # a QdrantClient, or an EdgeClient (the same calls)


def is_local_mode_dir(path: Path) -> bool:
    """Whether ``path`` holds qdrant-client local-mode data (its ``meta.json``)."""
    return (path / "meta.json").is_file()


class TemporaryEdge(EdgeClient):
    """An Edge store in a fresh temporary directory, removed at close (``:memory:``)."""

    def __init__(self, durability: str = "process") -> None:
        self._tmp = tempfile.mkdtemp(prefix="nobackfill-edge-")
        super().__init__(self._tmp, durability=durability)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self._tmp, ignore_errors=True)


def open_qdrant(settings: Settings) -> Client:
    if settings.qdrant_url:
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantClient(url=settings.qdrant_url, api_key=key)
    location = settings.qdrant_location
    if settings.qdrant_engine == "edge":
        old = settings.data_dir / "qdrant"
        # an Edge store that holds nothing yet (missing, or an empty folder made
        # beforehand) beside local-mode data: those galleries have not been moved
        if (location != MEMORY and settings.qdrant_path is None
                and not (Path(location) / CATALOG).exists() and is_local_mode_dir(old)):
            raise Unavailable(
                f"{old} holds galleries in qdrant-client's local mode, and the embedded "
                f"default is now Qdrant Edge, whose store {location} holds none yet: move "
                f"them once with `nobackfill store move --data-dir {settings.data_dir}` "
                f"(checked by counts and vectors), or keep local mode with "
                f"NOBACKFILL_QDRANT_ENGINE=local")
    return open_embedded(settings.qdrant_engine, location, settings.qdrant_durability)


def open_embedded(engine: str, location: str = MEMORY, durability: str = "process") -> Client:
    """An embedded engine (``edge`` or ``local``) on a path or ``:memory:``, acknowledging
    writes at ``durability`` (``process`` or ``power``). Both lock their directory: only
    one process (the gateway) may open it."""
    if engine == "edge":
        return (TemporaryEdge(durability) if location == MEMORY
                else EdgeClient(location, durability=durability))
    if engine != "local":
        raise ValueError(f"unknown embedded engine {engine!r} (edge or local)")
    if location == MEMORY:
        return QdrantClient(location=MEMORY)
    Path(location).mkdir(parents=True, exist_ok=True)
    client = QdrantClient(path=location)
    client.nobackfill_durability = durability  # read by ``tune_local_writes``
    return client


def tune_local_writes(client: Client, collection: str) -> bool:
    """Let the embedded Qdrant commit a point without waiting for the disk.

    Local mode on a path stores each point in a SQLite file and commits every point on its
    own; in SQLite's default rollback journal each commit waits for an fsync (about 1 ms per
    point here: 20 s of the gateway's time for a 20,000-item backfill, and the gallery's
    lock held meanwhile, so searches wait). Write-ahead logging with ``synchronous=NORMAL``
    makes a commit an append (about 0.1 ms per point). Nothing is lost or corrupted when a
    process dies; on a power cut the last commits may be lost, never the file (SQLite's
    guarantee for WAL). With ``power`` durability (``open_embedded``) a commit waits for
    its fsync again (``synchronous=FULL``). A server, or ``:memory:``, has no such file:
    returns False then, and
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
    power = getattr(client, "nobackfill_durability", "process") == "power"
    connection.execute(f"PRAGMA synchronous={'FULL' if power else 'NORMAL'}")
    return True
