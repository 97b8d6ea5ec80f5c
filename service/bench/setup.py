"""Build what the benchmark serves: a random-init artifact registered in a fresh registry,
and a gallery of N points in local Qdrant, embedded by the real encoder (all of them, or
a subset replicated with deterministic noise)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.state.config import Settings
from service.state.gallery import GalleryStore, open_qdrant
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from service.usecases.media import png_base64
from service.vectors.embed import embed
from service.vectors.ingest import Source, payload, upserts
from service.vectors.writer import DirectWriter, GalleryWriter
from training.artifacts import WEIGHTS, model_state, write_artifact
from training.data import generate_items, render
from training.encoders import ModelSpec, create_model, model_embed_dim
from training.versions import load_encoder

GALLERY = "bench"
VERSION = "bench-v1"
NOISE = 0.05  # per-dimension std of the noise added to replicated vectors (before renorm)



def fresh_work_dir(out: Path) -> Path:
    """``OUT/work``, emptied: each benchmark run starts from nothing (a gallery, a registry
    and logs left by an earlier run would change what it measures)."""
    work = Path(out) / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work

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


def build_gallery(settings: Settings, spec: ModelSpec, points: int, embed_count: int,
                  work: Path) -> dict[str, Any]:
    start = time.perf_counter()
    registry = Registry(settings.registry_dir)
    registry.register(write_version(spec, work / "artifact"), by="bench", move=True)
    registry.create_gallery(GALLERY, VERSION, by="bench", version=VERSION)
    encoder = load_encoder(registry.artifact(VERSION), VERSION, settings.device)
    store = GalleryStore(open_qdrant(settings), serialise=True)
    try:
        store.create(GALLERY, encoder.embed_dim)
        writer = DirectWriter.fixed(store, ThumbnailStore.of(settings), GALLERY, VERSION)
        sources = _sources(min(embed_count, points))
        _write_replicated(writer, sources, embed(encoder, sources), points)
    finally:
        store.close()
    return {"gallery_points": points, "embedded_by_encoder": min(embed_count, points),
            "replicated_with_noise": points > embed_count, "noise_std": NOISE,
            "dim": encoder.embed_dim, "seconds": round(time.perf_counter() - start, 1)}


def _sources(n: int) -> list[Source]:
    """n synthetic items, each with its first English caption and its rendered image."""
    return [Source(it.id, it.captions["en"][0], render(it, 64), payload(domain=it.domain))
            for it in generate_items(n, seed=7, languages=("en",))]


def _write_replicated(writer: GalleryWriter, sources: list[Source],
                      vectors: list[dict[str, np.ndarray]], points: int, chunk: int = 500) -> None:
    """Point i copies embedded item i % n (no image kept: no thumbnail); copies beyond the
    first get seeded noise."""
    rng = np.random.default_rng(0)
    n = len(sources)
    for first in range(0, points, chunk):
        copies, moved = [], []
        for i in range(first, min(points, first + chunk)):
            base = sources[i % n]
            copies.append(Source(f"{base.id}#{i}", payload=payload(
                {"copy_of": i % n}, domain=(base.payload or {}).get("domain"))))
            moved.append({k: _jitter(v, rng, i >= n) for k, v in vectors[i % n].items()})
        writer.write(upserts(VERSION, copies, {VERSION: moved}))


def _jitter(vector: np.ndarray, rng: np.random.Generator, noisy: bool) -> np.ndarray:
    if not noisy:
        return vector
    moved = vector + rng.normal(0.0, NOISE, size=vector.shape).astype(np.float32)
    return moved / np.linalg.norm(moved)


def make_queries(n_texts: int = 200, n_images: int = 50) -> Queries:
    items = generate_items(max(n_texts, n_images), seed=11, languages=("en",))
    texts = [it.captions["en"][k % 5] for k, it in enumerate(items[:n_texts])]
    return Queries(texts, [png_base64(render(it, 64)) for it in items[:n_images]])
