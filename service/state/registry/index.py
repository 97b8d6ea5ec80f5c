"""The registry index: one JSON file, replaced atomically, changed under a file lock.

Readers never lock: ``os.replace`` is atomic, so a reader sees the old index or the
new one, never a mix. Writers serialise on ``index.lock`` (an OS lock, released
when its process dies) so concurrent read-modify-write cycles lose no update, and
a writer that dies before the rename leaves the previous index in place.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock, Timeout

from service.state.errors import RegistryError, Unavailable

FORMAT = "nobackfill-registry/1"
INDEX = "index.json"
LOCK = "index.lock"
T = TypeVar("T")


def empty_index() -> dict[str, Any]:
    return {"format": FORMAT, "revision": 0, "versions": {}, "galleries": {}}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _publish(tmp: Path, final: Path) -> None:
    """The commit point of an update (a separate function so tests can crash before it)."""
    os.replace(tmp, final)


class IndexFile:
    def __init__(self, root: Path, lock_timeout_s: float = 60.0) -> None:
        self.root = root
        self.path = root / INDEX
        self.lock_timeout_s = lock_timeout_s
        root.mkdir(parents=True, exist_ok=True)

    def read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return empty_index()
        try:
            index = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RegistryError(f"registry index {self.path} is not valid JSON: {exc}") from exc
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise RegistryError(f"registry index {self.path} has an unknown format; "
                                f"expected {FORMAT!r}")
        return index

    def update(self, change: Callable[[dict[str, Any]], T],
               undo: Callable[[], None] | None = None) -> T:
        """Apply ``change`` to the current index and commit it; nothing is written if it
        raises or changes nothing. ``undo`` reverts side effects of ``change`` (still under
        the lock) when the commit itself fails."""
        try:
            with FileLock(self.root / LOCK, timeout=self.lock_timeout_s):
                index = self.read()
                before = copy.deepcopy(index)
                result = change(index)
                if index == before:
                    return result  # nothing changed: keep the revision, skip the write
                index["revision"] = int(index.get("revision", 0)) + 1
                index["updated_at"] = utc_now()
                try:
                    self._write(index)
                except BaseException:
                    if undo is not None:
                        undo()
                    raise
                return result
        except Timeout as exc:
            raise Unavailable(f"registry {self.root} stayed locked for "
                              f"{self.lock_timeout_s:.0f}s; is a writer stuck?") from exc

    def _write(self, index: dict[str, Any]) -> None:
        tmp = self.root / f".{INDEX}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "w") as fh:
                json.dump(index, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())  # the data must be on disk before the rename exposes it
            _publish(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_path(self.root)


def fsync_path(path: Path) -> None:
    """Put ``path`` on disk (a file, or a folder's entries: a rename in it survives a
    power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
