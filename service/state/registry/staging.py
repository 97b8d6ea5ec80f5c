"""Bring an artifact directory into the registry root: verify, copy (or move), verify again.

The copy goes to a hidden temporary sibling first and is only renamed to its final
name under the registry lock, so a crash mid-copy never leaves a version that looks
registered.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from service.state.errors import InvalidArtifact
from training.artifacts import MANIFEST, Artifact, load_artifact
from training.errors import ArtifactError

VERSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def verified(path: Path) -> Artifact:
    """The artifact at ``path`` with every checksum checked, or ``InvalidArtifact``."""
    try:
        artifact = load_artifact(path)
    except ArtifactError as exc:
        raise InvalidArtifact(str(exc)) from exc
    except (OSError, ValueError) as exc:  # unreadable, name too long, NUL in the path
        raise InvalidArtifact(f"cannot read an artifact at {str(path)[:200]!r}: {exc}") from exc
    if not VERSION_ID.match(artifact.version_id):
        # The id becomes a directory name in the registry: keep it path-safe.
        raise InvalidArtifact(f"version id {artifact.version_id!r} must match {VERSION_ID.pattern}")
    return artifact


def stage(source: Path, versions_dir: Path, move: bool) -> Path:
    """A verified copy of ``source`` in a temporary directory under ``versions_dir``."""
    versions_dir.mkdir(parents=True, exist_ok=True)
    tmp = versions_dir / f".stage-{uuid.uuid4().hex[:12]}"
    try:
        if move and _rename(source, tmp):
            return tmp  # same filesystem: the bytes did not change, no second check needed
        shutil.copytree(source, tmp)
        verified(tmp)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InvalidArtifact(f"could not copy {source} into the registry: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _rename(source: Path, target: Path) -> bool:
    try:
        os.rename(source, target)
    except OSError as exc:
        if exc.errno == errno.EXDEV:  # another filesystem: fall back to copy + delete
            return False
        raise
    return True


def publish(staged: Path, final: Path) -> None:
    """Rename a staged copy to its final name, replacing an unindexed leftover of a crash."""
    if final.exists():
        shutil.rmtree(final)
    os.rename(staged, final)


def give_back(staged: Path, source: Path) -> None:
    """Undo a move: the staged directory returns to where it came from."""
    if staged.exists() and not source.exists():
        os.rename(staged, source)


def same_files(a: Artifact, b: Artifact) -> bool:
    return a.manifest.get("files") == b.manifest.get("files")


def write_manifest_field(artifact_dir: Path, key: str, value: object) -> None:
    """Set one top-level manifest field, atomically (temp file + rename)."""
    path = artifact_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest[key] = value
    _write_manifest(path, manifest)


def set_manifest_field(artifact_dir: Path, key: str, value: object | None) -> None:
    """Make one top-level field ``value`` (None: absent); an unchanged manifest is not
    rewritten. Registration uses it so a stored manifest holds only the service's gate."""
    path = artifact_dir / MANIFEST
    manifest = json.loads(path.read_text())
    if manifest.get(key) == value and (value is not None or key not in manifest):
        return
    if value is None:
        del manifest[key]
    else:
        manifest[key] = value
    _write_manifest(path, manifest)


def _write_manifest(path: Path, manifest: dict) -> None:
    tmp = path.with_name(f".{MANIFEST}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
