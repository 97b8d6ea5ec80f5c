"""The write lock of a gallery, on the shared volume (so every gateway replica takes the
same one): held while items are written to or deleted from its sides, while a worker's
spooled batch is applied, and while the gallery switches sides. It orders a backfill's
etag check against the writes of the items API, so none of them is lost or undone."""

from __future__ import annotations

import hashlib

from filelock import FileLock

from service.state.config import Settings

LOCKS = "locks"


def gallery_lock(settings: Settings, gallery: str, timeout_s: float = 60.0) -> FileLock:
    folder = settings.registry_dir / LOCKS
    folder.mkdir(parents=True, exist_ok=True)
    # Named by a digest: any gallery string makes a short, safe file name.
    digest = hashlib.sha256(gallery.encode()).hexdigest()[:32]
    return FileLock(folder / f"gallery-{digest}.lock", timeout=timeout_s, thread_local=False)
