"""Where a request may point the service: every path it names must lie under an allowed root.

The gateway and the workers can read much more than datasets (``/proc/self/environ``
holds the secrets, ``/etc`` the host's configuration), so a path taken from a request
(a dataset, a gallery's validation set, a corpus, a checkpoint, a model to register) is
resolved, symlinks followed, and refused with ``InvalidInput`` (422) unless it lies under
one of ``Settings.path_roots``: DATA_DIR, the registry, DATASETS_DIR and ALLOWED_ROOTS.

A dataset is a directory holding ``manifest.jsonl`` or a ``.jsonl``/``.csv`` manifest, and
every image a manifest names must lie under a root too: a manifest inside a root could
otherwise point the worker anywhere. Rows are checked by string (the image path joined
onto the manifest's resolved folder and normalised), which is cheap for large manifests;
symlinks *inside* the roots are trusted, since whoever can create them can already write
there. The gateway checks before anything is queued, and the worker again before it reads
(``worker.context.JobContext.open_dataset``): the file may have changed in between.

Error messages never echo more than 64 characters of what the caller sent.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from service.state.config import Settings
from service.state.errors import InvalidInput, shown
from training.data.dataset import manifest_rows
from training.errors import NobackfillError

MANIFEST = "manifest.jsonl"
MANIFEST_TYPES = (".jsonl", ".csv")


def quoted(text: str) -> str:
    """A caller's path as an error message may echo it (``errors.shown``: 64 characters)."""
    return f"'{shown(text)}'"


@dataclass(frozen=True)
class Roots:
    """The allowed roots, resolved once; ``confine`` and ``dataset`` check request paths."""

    dirs: tuple[Path, ...]

    @classmethod
    def of(cls, settings: Settings) -> Roots:
        return cls(tuple(dict.fromkeys(Path(os.path.realpath(p)) for p in settings.path_roots)))

    def contains(self, path: str) -> bool:
        """Whether the absolute, normalised ``path`` is a root or lies under one."""
        return any(path == str(root) or path.startswith(str(root).rstrip(os.sep) + os.sep)
                   for root in self.dirs)

    def describe(self) -> str:
        return ", ".join(str(root) for root in self.dirs)

    def confine(self, path: str, name: str) -> Path:
        """``path`` resolved (symlinks followed), or InvalidInput when it is outside every
        root or cannot be a path at all (NUL bytes, too long)."""
        return Path(self._confined(path, name, None))

    def _confined(self, path: str, name: str, dirs: dict[str, str] | None) -> str:
        """``confine``'s path as text; ``dirs`` (see ``read``) memoises directories."""
        try:
            head, tail = os.path.split(path)
            if dirs is None or tail in ("", ".", ".."):
                resolved = os.path.realpath(path)
            else:  # the directory resolved once; the last part followed if it is a link
                parent = dirs.get(head)
                if parent is None:
                    parent = dirs[head] = os.path.realpath(head)
                resolved = os.path.join(parent, tail)
                try:
                    mode = os.lstat(resolved).st_mode
                except OSError:  # nothing there (yet): as realpath, not a link
                    mode = 0
                if stat.S_ISLNK(mode):
                    resolved = os.path.realpath(resolved)
        except (OSError, RuntimeError, ValueError):
            raise InvalidInput(f"{name}: {quoted(path)} is not a usable path") from None
        if not self.contains(resolved):
            raise InvalidInput(f"{name}: {quoted(path)} is outside the allowed roots "
                               f"({self.describe()}); put it under one of them or add a root "
                               f"with NOBACKFILL_ALLOWED_ROOTS")
        return resolved

    def read(self, path: str, name: str, dirs: dict[str, str] | None = None) -> bytes:
        """The bytes of a regular file under a root: ``file``'s checks, made on the file
        it opens (once, never following a link in its last part, never waiting on a
        FIFO). ``dirs`` is a memo the caller keeps over one batch of paths (a search's
        candidates): each directory is resolved once, so a path whose last part is not a
        link costs one lstat instead of a walk of every part (0.35 ms for 15 images ->
        0.05 ms). InvalidInput outside the roots or where no regular file is; OSError
        when it cannot be read."""
        resolved = self._confined(path, name, dirs)
        missing = f"{name}: no file at {quoted(path)}"
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(resolved, flags)
        except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL
            raise InvalidInput(missing) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # became a link since it was resolved
                raise InvalidInput(missing) from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidInput(missing)
            with open(fd, "rb", closefd=False) as file:
                return file.read()
        finally:
            os.close(fd)

    def file(self, path: str, name: str) -> Path:
        """A regular file under a root."""
        resolved = self.confine(path, name)
        if _kind(resolved) != "file":
            raise InvalidInput(f"{name}: no file at {quoted(path)}")
        return resolved

    def manifest(self, path: str, name: str) -> Path:
        """The manifest file of a dataset under a root: ``path/manifest.jsonl`` for a
        directory, else ``path`` itself, which must be a ``.jsonl`` or ``.csv`` file."""
        target = self.confine(path, name)
        kind = _kind(target)
        if kind == "dir":
            target = target / MANIFEST
        elif kind is not None and target.suffix not in MANIFEST_TYPES:
            raise InvalidInput(f"{name}: {quoted(path)} is not a dataset: give a directory "
                               f"holding {MANIFEST} or a .jsonl/.csv manifest")
        if _kind(target) != "file":
            raise InvalidInput(f"{name}: no dataset at {quoted(path)} (a directory with "
                               f"{MANIFEST}, or a JSONL/CSV manifest)")
        return target

    def dataset(self, path: str, name: str) -> Path:
        """The dataset's manifest once it and every image it names are under a root."""
        manifest = self.manifest(path, name)
        for where, image in manifest_images(manifest):
            full = os.path.normpath(image)
            if not self.contains(full):
                raise InvalidInput(f"{name}: {where}: image {quoted(image)} is outside the "
                                   f"allowed roots ({self.describe()})")
        return manifest


def _kind(path: Path) -> str | None:
    """"dir", "file", "other", or None when nothing is there or it cannot be looked at (a
    name too long, no permission): a request's path must never turn into a 500."""
    try:
        if path.is_dir():
            return "dir"
        if path.is_file():
            return "file"
        return "other" if path.exists() else None
    except (OSError, ValueError):
        return None


def manifest_images(manifest: Path) -> Iterator[tuple[str, str]]:
    """(where, image path) of every row, read by ``training.data``'s own manifest reader
    (paths joined onto the manifest's folder); InvalidInput for a manifest it refuses."""
    try:
        for where, record in manifest_rows(manifest):
            yield where, str(record.image_path)
    except UnicodeDecodeError:
        raise InvalidInput(f"{manifest.name}: not UTF-8 text") from None
    except OSError as exc:
        raise InvalidInput(f"{manifest.name}: unreadable ({exc.strerror})") from None
    except NobackfillError as exc:
        raise InvalidInput(shown(exc, 300)) from None
