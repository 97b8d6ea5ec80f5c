"""One code path, two backends: a Qdrant server when a URL is configured, otherwise the
embedded local mode (a path under the data directory, or ``:memory:`` in tests)."""

from __future__ import annotations

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
