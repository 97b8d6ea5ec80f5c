"""The model registry: version artifacts, their index, and each gallery's active version.

Importable without FastAPI so the worker can record results through the same code.
"""

from service.state.registry.records import Event, GalleryRecord, VersionRecord
from service.state.registry.registry import Registry

__all__ = ["Event", "GalleryRecord", "Registry", "VersionRecord"]
