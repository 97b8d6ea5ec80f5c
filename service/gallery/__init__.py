"""Galleries in Qdrant: one collection per gallery behind an alias named after it.

Importable without FastAPI (the worker writes through the same code).
"""

from service.gallery.client import open_qdrant
from service.gallery.store import GalleryStore, Hit, Item

__all__ = ["GalleryStore", "Hit", "Item", "open_qdrant"]
