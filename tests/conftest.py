"""Shared fixtures: a micro open_clip config (trains in seconds) and small synthetic data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.data import PairDataset, generate_items
from training.encoders import ModelSpec

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

MICRO_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
MICRO_PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bilinear"}


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
