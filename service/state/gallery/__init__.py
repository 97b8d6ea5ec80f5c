"""Galleries in Qdrant: one collection per gallery behind an alias named after it.

Importable without FastAPI. What writes vectors into them is ``service.vectors``.
"""

from service.state.gallery.client import open_qdrant
from service.state.gallery.store import GalleryStore, Hit, Item

__all__ = ["GalleryStore", "Hit", "Item", "open_qdrant"]
