"""The originals a re-embedding reads (a migration's backfill).

An item's origin is stored with its vectors (``Item.origin``): the text that was embedded,
and where its image is: ``cas:<sha256>`` for an image uploaded through the API (its bytes
as received, kept here, content-addressed, so the same image uploaded twice is stored
once), or the path of a manifest's image (workers read it where the manifest named it,
under the allowed roots).
"""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from pathlib import Path

from PIL import Image

from service.state.config import Settings
from service.state.errors import InvalidInput
from service.state.paths import Roots

CAS = "cas:"


class SourceStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, settings: Settings) -> SourceStore:
        return cls(settings.data_dir / "sources")

    def put(self, data: bytes) -> str:
        """Keep ``data``; its uri. Written once (temporary file, then rename)."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{digest}.{uuid.uuid4().hex[:6]}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return f"{CAS}{digest}"

    def _path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidInput(f"not a content address: {digest[:80]!r}")
        return self.root / digest[:2] / digest

    def bytes_of(self, uri: str) -> bytes:
        return self._path(uri.removeprefix(CAS)).read_bytes()


def origin_bytes(uri: str, sources: SourceStore, roots: Roots,
                 dirs: dict[str, str] | None = None) -> bytes:
    """The bytes of the image an origin names: kept by the service, or a file under a root
    (OSError or InvalidInput when it cannot be read); ``dirs``: ``Roots.read``'s memo."""
    if uri.startswith(CAS):
        return sources.bytes_of(uri)
    return roots.read(uri, "image source", dirs)


def open_origin_image(uri: str, sources: SourceStore, roots: Roots) -> Image.Image:
    """The image an origin names, decoded (OSError or InvalidInput when it cannot be)."""
    with Image.open(io.BytesIO(origin_bytes(uri, sources, roots))) as image:
        return image.convert("RGB")
