"""Build what the benchmark serves: a random-init artifact registered in a fresh registry,
and a gallery of N points in local Qdrant, embedded by the real encoder (all of them, or
a subset replicated with deterministic noise)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.core.config import Settings
from service.gallery import GalleryStore, Item, open_qdrant
from service.media import png_base64
from service.registry import Registry
from training.artifacts import WEIGHTS, model_state, write_artifact
from training.data import generate_items, render
from training.encoders import Encoder, ModelSpec, create_model, model_embed_dim
from training.versions import load_encoder

GALLERY = "bench"
VERSION = "bench-v1"
NOISE = 0.05  # per-dimension std of the noise added to replicated vectors (before renorm)


@dataclass
class Queries:
    texts: list[str]
    images: list[str]  # base64 PNG

    def to_json(self) -> dict[str, Any]:
        return {"texts": self.texts, "images": self.images}


def write_version(spec: ModelSpec, out: Path) -> Path:
    torch.manual_seed(0)
    model = create_model(spec)
    manifest = {"version_id": VERSION, "space": VERSION, "model_spec": spec.to_dict(),
                "embed_dim": model_embed_dim(model), "kind": "bench-random-init"}
    return write_artifact(out, manifest, {WEIGHTS: model_state(model)}).path


def build_gallery(settings: Settings, spec: ModelSpec, points: int, embed: int,
                  work: Path) -> dict[str, Any]:
    start = time.perf_counter()
    registry = Registry(settings.registry_dir)
    registry.register(write_version(spec, work / "artifact"), by="bench", move=True)
    registry.create_gallery(GALLERY, VERSION, by="bench", version=VERSION)
    encoder = load_encoder(registry.artifact(VERSION), VERSION, settings.device)
    store = GalleryStore(open_qdrant(settings), serialise=True)
    try:
        store.create(GALLERY, encoder.embed_dim)
        embedded = _embed_items(encoder, min(embed, points))
        _upsert_replicated(store, embedded, points)
    finally:
        store.close()
    return {"gallery_points": points, "embedded_by_encoder": min(embed, points),
            "replicated_with_noise": points > embed, "noise_std": NOISE,
            "dim": encoder.embed_dim, "seconds": round(time.perf_counter() - start, 1)}


def _embed_items(encoder: Encoder, n: int) -> dict[str, Any]:
    items = generate_items(n, seed=7, languages=("en",))
    images = encoder.encode_images([render(it, 64) for it in items], batch_size=32)
    texts = encoder.encode_texts([it.captions["en"][0] for it in items], batch_size=32)
    return {"ids": [it.id for it in items], "domains": [it.domain for it in items],
            "image": images, "text": texts}


def _upsert_replicated(store: GalleryStore, embedded: dict[str, Any], points: int,
                       chunk: int = 500) -> None:
    """Point i copies embedded item i % n; copies beyond the first get seeded noise."""
    rng = np.random.default_rng(0)
    n = len(embedded["ids"])
    for start in range(0, points, chunk):
        batch = []
        for i in range(start, min(points, start + chunk)):
            base = i % n
            vectors = {k: _jitter(embedded[k][base], rng, i >= n) for k in ("image", "text")}
            batch.append(Item(f"{embedded['ids'][base]}#{i}", vectors,
                              {"domain": embedded["domains"][base], "copy_of": base}))
        store.upsert(GALLERY, batch, VERSION, VERSION)


def _jitter(vector: np.ndarray, rng: np.random.Generator, noisy: bool) -> np.ndarray:
    if not noisy:
        return vector
    moved = vector + rng.normal(0.0, NOISE, size=vector.shape).astype(np.float32)
    return moved / np.linalg.norm(moved)


def make_queries(n_texts: int = 200, n_images: int = 50) -> Queries:
    items = generate_items(max(n_texts, n_images), seed=11, languages=("en",))
    texts = [it.captions["en"][k % 5] for k, it in enumerate(items[:n_texts])]
    return Queries(texts, [png_base64(render(it, 64)) for it in items[:n_images]])
