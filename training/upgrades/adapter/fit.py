"""Fit an adapter route and write it as a version artifact.

Inputs are a ``Sample``: K gallery items with the OLD vectors the gallery already stores
(read, never re-embedded: no old model is loaded unless SLERP asks for it) and the
sources NEW embeds (images and/or captions). The fit is a closed form or a few hundred
steps on [K, D] matrices, so its cost does not grow with the gallery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from open_clip.model import get_model_preprocess_cfg
from PIL import Image

from training.artifacts import WEIGHTS, Artifact, model_state, new_version_id, write_artifact
from training.encoders import Encoder, ModelSpec, create_tokenizer, model_embed_dim
from training.errors import ConfigError
from training.upgrades.adapter.config import AdapterFitConfig
from training.upgrades.adapter.maps import MAPS, EmbeddingMap
from training.upgrades.adapter.route import KINDS, MAPS_FILE, maps_state
from training.upgrades.inputs import new_model_of
from training.upgrades.slerp import OLD_WEIGHTS, old_weights


@dataclass
class Sample:
    """K items of a gallery: what NEW embeds, and the OLD vectors stored for them."""

    images: list[Image.Image] = field(default_factory=list)
    image_old: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    texts: list[str] = field(default_factory=list)
    text_old: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    source: str = ""  # where it came from (gallery name, dataset), for the manifest

    def counts(self) -> dict[str, int]:
        return {"image": len(self.images), "text": len(self.texts)}


def sample_from_dataset(old: Artifact, dataset: Any, k: int, seed: int = 0,
                        language: str = "en", space: str | None = None) -> Sample:
    """K items of a dataset with OLD's vectors, as a gallery of them would store (the CLI
    and the benchmark have no gallery to read them from)."""
    from training.versions import load_encoder

    idx = np.random.default_rng(seed).permutation(len(dataset))[:k]
    images = [dataset.load_image(int(i)) for i in idx]
    texts = [dataset.records[int(i)].captions[language][0] for i in idx
             if dataset.records[int(i)].captions.get(language)]
    encoder = load_encoder(old, space)
    return Sample(images, encoder.encode_images(images), texts, encoder.encode_texts(texts),
                  source=f"dataset sample of {len(idx)} items (seed {seed})")


def fit_maps(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor],
             cfg: AdapterFitConfig) -> dict[str, EmbeddingMap]:
    """Modality -> map: one per modality with pairs (the other modality's map where one
    has none), or one shared map fitted on both modalities' pairs."""
    fit = MAPS.lookup(cfg.method).fit
    have = [kind for kind in KINDS if len(x.get(kind, ())) >= 2]
    if not have:
        raise ConfigError("the sample has fewer than 2 pairs of every modality: nothing to fit")
    if not cfg.per_modality or len(have) == 1:
        shared = fit(torch.cat([x[k] for k in have]), torch.cat([y[k] for k in have]), cfg)
        return dict.fromkeys(KINDS, shared)
    return {kind: fit(x[kind], y[kind], cfg) for kind in KINDS}


def embed_sample(encoder: Encoder, sample: Sample) -> dict[str, torch.Tensor]:
    """NEW's [N, D_new] vectors of the sample, per modality."""
    out = {}
    if sample.images:
        out["image"] = torch.from_numpy(encoder.encode_images(sample.images))
    if sample.texts:
        out["text"] = torch.from_numpy(encoder.encode_texts(sample.texts))
    return out


def fit_adapter(new: Artifact | ModelSpec, sample: Sample, cfg: AdapterFitConfig,
                target_space: str, out: str | Path, old: Artifact | None = None,
                version_id: str | None = None, device: str | None = None,
                on_stage: Callable[[str], None] | None = None) -> Artifact:
    """Embed the sample with NEW, fit the maps, write the version (routes: native, and
    ``adapter`` into ``target_space``). ``old`` is needed only for SLERP (its weights go
    into the artifact) and names the parent."""
    spec, model, native_space = new_model_of(new)
    encoder = Encoder(model, create_tokenizer(spec), device)
    (on_stage or _quiet)("embed")
    start = time.perf_counter()
    x = embed_sample(encoder, sample)
    embed_s = time.perf_counter() - start
    y = {kind: torch.from_numpy(np.asarray(v, np.float32)) for kind, v in
         (("image", sample.image_old), ("text", sample.text_old)) if len(v)}
    _check_dims(x, y)
    (on_stage or _quiet)("fit")
    start = time.perf_counter()
    maps = fit_maps(x, y, cfg)
    fit_s = time.perf_counter() - start
    metrics = {"embed_seconds": round(embed_s, 3), "fit_seconds": round(fit_s, 3),
               "pairs": sample.counts(), "sample": sample.source,
               "fit_cosine": _fit_cosine(maps, x, y)}
    return _write(spec, model, native_space, maps, cfg, target_space, old, metrics, out,
                  version_id)


def _quiet(stage: str) -> None:
    return None


def _check_dims(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> None:
    for kind, new in x.items():
        if kind not in y or len(new) != len(y[kind]):
            raise ConfigError(f"the sample's {kind}s: {len(new)} embedded by the new model "
                              f"but {len(y.get(kind, ()))} stored old vectors")


@torch.no_grad()
def _fit_cosine(maps: dict[str, EmbeddingMap], x: dict[str, torch.Tensor],
                y: dict[str, torch.Tensor]) -> dict[str, float]:
    """Mean cosine of map(new) with the stored old vector, on the fitted pairs."""
    out = {}
    for kind, new in x.items():
        target = torch.nn.functional.normalize(y[kind].float(), dim=-1)
        out[kind] = round(float((maps[kind](new) * target).sum(-1).mean()), 4)
    return out


def _write(spec: ModelSpec, model: torch.nn.Module, native_space: str | None,
           maps: dict[str, EmbeddingMap], cfg: AdapterFitConfig, target_space: str,
           old: Artifact | None, metrics: dict[str, Any], out: str | Path,
           version_id: str | None) -> Artifact:
    vid = version_id or new_version_id()
    space = native_space or vid
    route: dict[str, Any] = {
        "kind": "adapter", "method": cfg.method, "maps_file": MAPS_FILE,
        "maps": {kind: m.dims() for kind, m in maps.items()},
        "embed_dim": maps["text"].out_dim, "slerp_t": cfg.slerp_t}
    tensors = {WEIGHTS: model_state(model), MAPS_FILE: maps_state(maps)}
    if cfg.slerp_t > 0:
        tensors[OLD_WEIGHTS] = old_weights(old, target_space, route)
    manifest = {
        "version_id": vid, "space": space, "kind": "adapter", "method": cfg.method,
        "parent": old.version_id if old is not None else None, "target_space": target_space,
        "model_spec": spec.to_dict(), "base_model": spec.describe(),
        "embed_dim": model_embed_dim(model), "preprocess": dict(get_model_preprocess_cfg(model)),
        "languages": [cfg.language], "hyperparameters": cfg.to_dict(), "metrics": metrics,
        "routes": {space: {"kind": "native"}, target_space: route}}
    return write_artifact(out, manifest, tensors)
