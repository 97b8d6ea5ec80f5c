"""Artifact round trip, checksums and tamper detection, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from training.artifacts import WEIGHTS, load_artifact, model_state, write_artifact
from training.encoders import Encoder, create_model, create_tokenizer
from training.errors import ArtifactError
from training.versions import load_encoder

TEXTS = ["a red circle", "a blue square"]


def _write(micro_spec, out: Path, **extra):
    model = create_model(micro_spec)
    manifest = {"version_id": "v1", "space": "v1", "model_spec": micro_spec.to_dict(),
                "embed_dim": 32, "hyperparameters": {"lr": 1e-3}, "metrics": {"loss": 1.0}, **extra}
    return model, write_artifact(out, manifest, {WEIGHTS: model_state(model)},
                                 json_files={"state.json": {"queue": [1, 2]}})


def test_round_trip_reproduces_embeddings(micro_spec, tmp_path: Path) -> None:
    model, _ = _write(micro_spec, tmp_path / "v1")
    loaded = load_artifact(tmp_path / "v1")
    m = loaded.manifest
    assert m["version_id"] == "v1" and m["space"] == "v1" and m["parent"] is None
    assert m["routes"] == {"v1": {"kind": "native"}}
    for key in ("package_version", "created_at", "format", "hyperparameters", "metrics"):
        assert key in m
    assert set(m["files"]) == {WEIGHTS, "state.json"}
    assert loaded.json_file("state.json") == {"queue": [1, 2]}
    expected = Encoder(model, create_tokenizer(micro_spec), "cpu").encode_texts(TEXTS)
    np.testing.assert_array_equal(load_encoder(loaded, device="cpu").encode_texts(TEXTS), expected)


def test_altered_file_is_detected(micro_spec, tmp_path: Path) -> None:
    _write(micro_spec, tmp_path / "v1")
    weights = tmp_path / "v1" / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"'{WEIGHTS}' does not match its sha256"):
        load_artifact(tmp_path / "v1")


def test_missing_file_and_missing_manifest(micro_spec, tmp_path: Path) -> None:
    _write(micro_spec, tmp_path / "v1")
    (tmp_path / "v1" / "state.json").unlink()
    with pytest.raises(ArtifactError, match="'state.json' is missing"):
        load_artifact(tmp_path / "v1")
    (tmp_path / "v1" / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        load_artifact(tmp_path / "v1")


def test_edited_manifest_is_rejected(micro_spec, tmp_path: Path) -> None:
    _write(micro_spec, tmp_path / "v1")
    path = tmp_path / "v1" / "manifest.json"
    path.write_text("{broken")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_artifact(tmp_path / "v1")


def test_existing_output_is_not_overwritten(micro_spec, tmp_path: Path) -> None:
    _write(micro_spec, tmp_path / "v1")
    before = (tmp_path / "v1" / "manifest.json").read_text()
    with pytest.raises(ArtifactError, match="already exists"):
        _write(micro_spec, tmp_path / "v1")
    assert (tmp_path / "v1" / "manifest.json").read_text() == before


def test_failed_write_leaves_nothing(micro_spec, tmp_path: Path) -> None:
    manifest = {"version_id": "v2", "space": "v2", "model_spec": micro_spec.to_dict()}
    with pytest.raises(AttributeError):
        write_artifact(tmp_path / "v2", manifest, {WEIGHTS: {"w": "not a tensor"}})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []  # neither the artifact nor a temp dir remains


def test_required_manifest_fields(micro_spec, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="'space'"):
        write_artifact(tmp_path / "x", {"version_id": "x", "model_spec": {}}, {})
    assert not (tmp_path / "x").exists()


def test_no_route_to_unknown_space(micro_spec, tmp_path: Path) -> None:
    _, art = _write(micro_spec, tmp_path / "v1")
    with pytest.raises(ArtifactError, match="no route to space 'v0'"):
        load_encoder(art, space="v0")


def test_weights_that_do_not_fit_the_spec(micro_spec, tmp_path: Path) -> None:
    manifest = {"version_id": "v3", "space": "v3", "model_spec": micro_spec.to_dict()}
    art = write_artifact(tmp_path / "v3", manifest, {WEIGHTS: {"w": torch.zeros(1)}})
    with pytest.raises(ArtifactError, match="does not match the model spec"):
        load_encoder(art, device="cpu")
    assert json.loads((tmp_path / "v3" / "manifest.json").read_text())["version_id"] == "v3"
