"""Model version artifacts: a directory with ``manifest.json`` and safetensors files.

The manifest records everything needed to reproduce the version's embeddings:
version id, parent, model spec, embedding dim, preprocessing, the embedding
space it natively produces and the routes into other spaces, hyperparameters,
metrics, package version, creation time, and the sha256 of every file.

Artifacts are written to a temporary sibling directory and renamed into place,
so a crash never leaves a half-written artifact under the final name. Loading
verifies every checksum and fails with ``ArtifactError`` naming the bad file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import training
from training.errors import ArtifactError

FORMAT = "nobackfill-artifact/1"
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def new_version_id(prefix: str = "v") -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S")
    return f"{prefix}-{stamp}-{uuid.uuid4().hex[:6]}"


@dataclass
class Artifact:
    """A loaded (checksum-verified) model version artifact."""

    path: Path
    manifest: dict[str, Any]

    @property
    def version_id(self) -> str:
        return str(self.manifest["version_id"])

    @property
    def space(self) -> str:
        """The embedding space this version natively produces."""
        return str(self.manifest["space"])

    @property
    def routes(self) -> dict[str, dict[str, Any]]:
        """Target space -> how this version's embeddings reach it."""
        return dict(self.manifest.get("routes", {}))

    def tensors(self, name: str = WEIGHTS) -> dict[str, torch.Tensor]:
        if name not in self.manifest.get("files", {}):
            raise ArtifactError(f"artifact {self.path} has no file '{name}'")
        return load_file(str(self.path / name))

    def json_file(self, name: str) -> Any:
        if name not in self.manifest.get("files", {}):
            raise ArtifactError(f"artifact {self.path} has no file '{name}'")
        return json.loads((self.path / name).read_text())


def _write_payload(tmp: Path, tensors: Mapping[str, Mapping[str, torch.Tensor]],
                   json_files: Mapping[str, Any]) -> dict[str, str]:
    for name, state in tensors.items():
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp / name))
    for name, obj in json_files.items():
        (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True))
    return {name: sha256_file(tmp / name) for name in sorted([*tensors, *json_files])}


def write_artifact(out_dir: str | Path, manifest: Mapping[str, Any],
                   tensors: Mapping[str, Mapping[str, torch.Tensor]],
                   json_files: Mapping[str, Any] | None = None,
                   overwrite: bool = False) -> Artifact:
    """Write an artifact atomically; fills in format, package version, time and checksums."""
    out = Path(out_dir)
    for key in ("version_id", "space", "model_spec"):
        if key not in manifest:
            raise ArtifactError(f"artifact manifest lacks the required field '{key}'")
    if out.exists() and not overwrite:
        raise ArtifactError(f"{out} already exists; choose another --out or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = _write_payload(tmp, tensors, json_files or {})
        full = {"format": FORMAT, "package_version": training.__version__,
                "created_at": datetime.now(timezone.utc).isoformat(), "parent": None,
                "routes": {manifest["space"]: {"kind": "native"}}, **manifest, "files": files}
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Artifact(out, full)


def _replace_dir(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def load_artifact(path: str | Path) -> Artifact:
    """Read and verify an artifact; ``ArtifactError`` on a missing or altered file."""
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{root} is not a model version artifact: {MANIFEST} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{manifest_path} is not valid JSON: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{root}: unknown artifact format {manifest.get('format')!r}, "
                            f"expected {FORMAT!r}")
    for name, expected in manifest.get("files", {}).items():
        file = root / name
        if not file.is_file():
            raise ArtifactError(f"artifact {root} is incomplete: file '{name}' is missing")
        if sha256_file(file) != expected:
            raise ArtifactError(f"artifact {root} is corrupt: file '{name}' does not match "
                                f"its sha256 in the manifest (altered after writing)")
    return Artifact(root, manifest)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A state dict with shared tensors cloned (safetensors refuses shared storage)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_model_weights(artifact: Artifact, model: torch.nn.Module) -> None:
    try:
        state = artifact.tensors(WEIGHTS)
    except SafetensorError as exc:
        raise ArtifactError(f"{artifact.path / WEIGHTS} could not be read: {exc}") from exc
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ArtifactError(f"{artifact.path / WEIGHTS} does not match the model spec: "
                            f"missing {missing[:5]}, unexpected {unexpected[:5]}")
