"""Small PNG thumbnails of ingested images, so the web page can show what a hit looks like.

Qdrant keeps only vectors and payloads, so ingest saves a thumbnail beside them under
``DATA_DIR/thumbnails/<gallery>/<sha256 of the item id>.png``. Item ids are arbitrary
caller strings; hashing them gives a safe, fixed-length file name whatever they contain.
Thumbnails are a convenience for people, never on the query path: search does not read
them, and a failure to write one is logged instead of failing the ingest.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from PIL import Image

from service.state.config import Settings
from service.state.registry.registry import GALLERY_NAME

log = logging.getLogger(__name__)

MAX_SIDE = 96


def make_thumbnail(image: Image.Image, max_side: int = MAX_SIDE) -> bytes:
    """PNG bytes of ``image`` shrunk (never enlarged) to fit ``max_side`` x ``max_side``."""
    small = image.convert("RGB")
    small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def file_name(item_id: str) -> str:
    """A file name for any id: sha256 hex, so no separators, dots or length surprises."""
    return hashlib.sha256(item_id.encode("utf-8", "surrogatepass")).hexdigest() + ".png"


class ThumbnailStore:
    """Thumbnails on the local disk, one directory per gallery."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, settings: Settings) -> ThumbnailStore:
        """The store of a gateway (or worker) process: stateless, so cheap to make per call."""
        return cls(settings.data_dir / "thumbnails")

    def path(self, gallery: str, item_id: str) -> Path | None:
        """Where the item's thumbnail lives; None for a name that cannot be a gallery (the
        registry's name rule also keeps "..", "/" and the like out of the path)."""
        if not GALLERY_NAME.match(gallery):
            return None
        return self.root / gallery / file_name(item_id)

    def read(self, gallery: str, item_id: str) -> bytes | None:
        """The PNG bytes, or None when the item has no thumbnail."""
        path = self.path(gallery, item_id)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def save(self, gallery: str, item_id: str, png: bytes) -> None:
        """Write atomically (temporary file, then rename): a reader never sees half a PNG."""
        path = self.path(gallery, item_id)
        if path is None:
            raise ValueError(f"gallery name {gallery!r} is not valid")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            tmp.write_bytes(png)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, gallery: str, item_ids: Iterable[str]) -> None:
        """Remove the items' thumbnails; absent ones are not an error (as in the gallery)."""
        for item_id in item_ids:
            path = self.path(gallery, item_id)
            if path is not None:
                path.unlink(missing_ok=True)

    def drop(self, gallery: str) -> None:
        """Remove every thumbnail of a deleted gallery: the directory is renamed aside in one
        step (the page sees all of them or none), then deleted."""
        if not GALLERY_NAME.match(gallery):
            return
        trash = self.root / f".deleted-{gallery}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.root / gallery, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def replace(self, gallery: str, thumbnails: Mapping[str, bytes | None]) -> None:
        """After an upsert: save each item's new thumbnail, or drop the old one when the
        item was replaced by one without an image. Logged, never raised: the vectors are
        already stored and a missing picture only costs the page a placeholder."""
        try:
            for item_id, png in thumbnails.items():
                if png is None:
                    self.delete(gallery, [item_id])
                else:
                    self.save(gallery, item_id, png)
        except (OSError, ValueError):
            log.exception("could not write thumbnails of gallery '%s'", gallery)
