"""Shared fixtures: a micro open_clip config (trains in seconds) and small synthetic data."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from training.data import PairDataset, generate_items
from training.encoders import ModelSpec

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
# A gateway sets torch's threads for its whole process (``torch_threads``, default 1: a
# process of its own in production). Gateways started inside this test process leave
# them alone, so the tests after them train at the speed they had; subprocesses inherit it.
os.environ.setdefault("NOBACKFILL_TORCH_THREADS", "0")

MICRO_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
MICRO_PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bilinear"}


def micro_model(text_width: int = 64) -> ModelSpec:
    """The micro architecture, its text tower ``text_width`` wide (a "new" model differs)."""
    config = json.loads(json.dumps(MICRO_CONFIG))
    config["text_cfg"]["width"] = text_width
    return ModelSpec(config=config, preprocess=dict(MICRO_PREPROCESS))


def artifact_tensors(artifact: Any) -> dict[str, torch.Tensor]:
    """Every tensor of an artifact's weight files, keyed "file:name" (to compare two)."""
    return {f"{file}:{key}": value for file in artifact.manifest["files"]
            if file.endswith(".safetensors") for key, value in artifact.tensors(file).items()}


@pytest.fixture
def micro_config_file(tmp_path: Path) -> Path:
    path = tmp_path / "micro.json"
    path.write_text(json.dumps({"model_cfg": MICRO_CONFIG, "preprocess_cfg": MICRO_PREPROCESS}))
    return path


@pytest.fixture
def micro_spec() -> ModelSpec:
    return ModelSpec(config=json.loads(json.dumps(MICRO_CONFIG)), preprocess=dict(MICRO_PREPROCESS))


@pytest.fixture(scope="session")
def small_world() -> PairDataset:
    """200 synthetic items, all domains, all languages."""
    return PairDataset.from_synth(generate_items(200, seed=3, id_prefix="t-"))


# ---------------------------------------------------------------- gateway (service/) fixtures
ADMIN_KEY = "admin-key"
ADMIN = {"X-API-Key": ADMIN_KEY}


def bound(report: dict[str, Any], gallery: str = "shapes", incumbent: str = "v1",
          validation: str | None = None) -> dict[str, Any]:
    """``report`` bound as the worker binds what it measures: for ``gallery`` served by
    ``incumbent``, on ``validation`` as it is now, under the default criterion (a report
    counts only where it was measured)."""
    from service.state.registry.gates import Binding, GatePolicy, validation_digest

    return Binding(gallery, incumbent, validation, validation_digest(validation),
                   GatePolicy.default()).apply(report)


def register_gated(registry, path: Path, by: str = "fixture", gallery: str = "shapes",
                   incumbent: str = "v1"):
    """Register a fixture artifact with its manifest's ``gate`` as the report of a gate the
    service ran (the registry trusts only a report handed in by the worker's admission;
    it drops one that merely sits in a manifest), measured for ``gallery`` against
    ``incumbent`` (the fixtures' gallery 'shapes' is served by v1, without validation set)."""
    gate = json.loads((Path(path) / "manifest.json").read_text()).get("gate")
    return registry.register(path, by=by, gate=bound(gate, gallery, incumbent) if gate else None)


@pytest.fixture(scope="session")
def micro_versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random-init micro artifacts: v1 (space v1, no gate report), v2 (space v1, other
    weights, gate passed: a continual successor), v3 (space v3 only, gate passed)."""
    from training.artifacts import WEIGHTS, model_state, write_artifact
    from training.encoders import create_model

    root = tmp_path_factory.mktemp("versions")
    spec = ModelSpec(config=json.loads(json.dumps(MICRO_CONFIG)),
                     preprocess=dict(MICRO_PREPROCESS))
    out = {}
    for vid, space, seed, gate in (("v1", "v1", 1, None), ("v2", "v1", 2, {"passed": True}),
                                   ("v3", "v3", 3, {"passed": True})):
        torch.manual_seed(seed)
        manifest = {"version_id": vid, "space": space, "model_spec": spec.to_dict(),
                    "embed_dim": 32, **({"gate": gate} if gate else {})}
        weights = {WEIGHTS: model_state(create_model(spec))}
        out[vid] = write_artifact(root / vid, manifest, weights).path
    return out


@pytest.fixture
def gateway_factory(tmp_path: Path, micro_versions: dict[str, Path]):
    """``with gateway_factory(**settings) as client``: a started gateway on in-memory Qdrant
    with v1, v2, v3 registered (v2 and v3 gated) and gallery 'shapes' (space v1, served by
    v1); tmp_path is an allowed root, so tests may name files there."""
    import contextlib

    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.state.config import Settings
    from service.state.registry import Registry

    @contextlib.contextmanager
    def make(load=None, **overrides):
        values = {"data_dir": tmp_path / "data", "qdrant_path": ":memory:",
                  "admin_api_keys": {"ops": ADMIN_KEY}, "registry_poll_interval_s": 0.05,
                  "batch_max_wait_ms": 2.0, "allowed_roots": (tmp_path,), **overrides}
        settings = Settings(**values)
        registry = Registry(settings.registry_dir)
        for path in micro_versions.values():
            register_gated(registry, path)
        with TestClient(create_app(settings, load)) as client:
            response = client.post("/v1/galleries", headers=ADMIN,
                                   json={"name": "shapes", "space": "v1", "version": "v1"})
            assert response.status_code == 201, response.text
            yield client
    return make


ENGINES = ("local", "edge")  # the embedded engines the store's contract tests run on


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each embedded engine in turn (``service.state.gallery.client.open_embedded``)."""
    return request.param


@pytest.fixture
def embedded_store(engine: str):
    """A fresh in-memory ``GalleryStore`` on each embedded engine, closed after the test."""
    from service.state.gallery import GalleryStore
    from service.state.gallery.client import open_embedded

    store = GalleryStore(open_embedded(engine), serialise=True)
    yield store
    store.close()
