"""Fit a gallery-side transform on a sample: K items whose OLD vectors the gallery stores
and whose sources NEW embedded. Per modality, a map OLD -> NEW (an adapter map fitted the
other way round: ``training.upgrades.adapter.maps``; an ensemble averages members fitted
on bootstraps), and the learned order's error predictor, fitted on a held-out part of the
sample with the map fitted on the rest; the map is then refitted on the whole sample.

A ``GalleryTransform`` is a directory: ``transform.json`` (dims, config, metrics) and
``transform.safetensors`` (the maps, the predictor), written atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from training.errors import ArtifactError, ConfigError
from training.upgrades.adapter.maps import MAPS, EmbeddingMap
from training.upgrades.transform.config import TransformConfig
from training.upgrades.transform.order import ErrorPredictor, errors, spearman

KINDS = ("image", "text")
MIN_PAIRS = 8  # per modality: fewer cannot be split into a fit and a held-out part
META, TENSORS = "transform.json", "transform.safetensors"


@dataclass
class GalleryTransform:
    """Per modality, the maps OLD -> NEW (members of an ensemble) and the error predictor."""

    maps: dict[str, list[EmbeddingMap]]
    predictor: ErrorPredictor
    config: TransformConfig
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if k in self.maps)

    @torch.no_grad()
    def apply(self, kind: str, old: np.ndarray, batch: int = 8192) -> np.ndarray:
        """[N, D_old] stored vectors -> [N, D_new] L2-normalised float32 in NEW's space."""
        if kind not in self.maps:
            raise ConfigError(f"the transform has no {kind} map (its sample had fewer than "
                              f"{MIN_PAIRS} {kind} pairs)")
        old = np.asarray(old, np.float32)
        out = [_mapped(self.maps[kind], old[start:start + batch])
               for start in range(0, len(old), batch)]
        dim = self.maps[kind][0].out_dim
        return np.concatenate(out) if out else np.zeros((0, dim), np.float32)

    def predicted_error(self, kind: str, old: np.ndarray,
                        transformed: np.ndarray | None = None) -> np.ndarray:
        """[N] the predicted ``1 - cos`` of each item's transformed ``kind`` vector."""
        t = self.apply(kind, old) if transformed is None else transformed
        return self.predictor.predict(kind, np.asarray(old, np.float32), t)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"{kind}.{j}.{k}": v.detach().clone().contiguous()
                   for kind, members in self.maps.items() for j, m in enumerate(members)
                   for k, v in m.state_dict().items()}
        tensors.update({f"order.{kind}.{name}": torch.from_numpy(np.ascontiguousarray(v))
                        for kind, parts in self.predictor.state.items()
                        for name, v in parts.items()})
        meta = {"dims": {kind: [m.dims() for m in members] for kind, members in self.maps.items()},
                "config": self.config.to_dict(), "metrics": self.metrics,
                "order": {"method": self.predictor.method, "k": self.predictor.k}}
        _atomic(directory / TENSORS, lambda path: save_file(tensors, path))
        _atomic(directory / META, lambda path: Path(path).write_text(json.dumps(meta, indent=2)))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> GalleryTransform:
        directory = Path(directory)
        try:
            meta = json.loads((directory / META).read_text())
            state = load_file(str(directory / TENSORS))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"{directory} holds no readable transform: {exc}") from exc
        maps: dict[str, list[EmbeddingMap]] = {}
        for kind, members in meta["dims"].items():
            maps[kind] = []
            for j, dims in enumerate(members):
                m = EmbeddingMap(**dims)
                prefix = f"{kind}.{j}."
                m.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                                   if k.startswith(prefix)}, strict=True)
                maps[kind].append(m.eval())
        parts: dict[str, dict[str, np.ndarray]] = {}
        for key, v in state.items():
            if key.startswith("order."):
                _, kind, name = key.split(".", 2)
                parts.setdefault(kind, {})[name] = v.numpy()
        predictor = ErrorPredictor(meta["order"]["method"], parts, meta["order"]["k"])
        return cls(maps, predictor, TransformConfig.from_dict(meta["config"], lenient=True),
                   meta.get("metrics", {}))


def _atomic(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fit_maps(old: np.ndarray, new: np.ndarray, cfg: TransformConfig) -> list[EmbeddingMap]:
    """The ensemble's members for one modality (x: OLD's stored vectors, y: NEW's)."""
    fit = MAPS.lookup(cfg.method).fit
    x, y = torch.from_numpy(np.asarray(old, np.float32)), torch.from_numpy(
        np.asarray(new, np.float32))
    members = []
    for j in range(cfg.ensemble):
        idx = (np.random.default_rng(cfg.seed + 1000 + j).integers(0, len(x), len(x))
               if cfg.ensemble > 1 else np.arange(len(x)))
        members.append(fit(x[idx], y[idx], cfg.map_config(cfg.seed + j)))
    return members


@torch.no_grad()
def _mapped(members: list[EmbeddingMap], old: np.ndarray) -> np.ndarray:
    """The members' mean map of ``old`` [N, D_old], L2-normalised [N, D_new]."""
    x = torch.from_numpy(np.asarray(old, np.float32))
    y = torch.stack([m(x) for m in members]).mean(0)
    return torch.nn.functional.normalize(y, dim=-1).numpy()


def fit_transform(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray],
                  cfg: TransformConfig) -> GalleryTransform:
    """``old``/``new``: kind -> [K, D] paired rows (the sample's stored OLD vectors and
    NEW's embeddings of the same items). Kinds with fewer than ``MIN_PAIRS`` are left out;
    ConfigError when none has enough."""
    start = time.perf_counter()
    kinds = [k for k in KINDS if len(old.get(k, ())) >= MIN_PAIRS]
    if not kinds:
        raise ConfigError(f"the sample has fewer than {MIN_PAIRS} pairs of every modality: "
                          f"nothing to fit a transform on")
    maps, rows, metrics = {}, {}, {"pairs": {}, "holdout_cosine": {}, "fit_cosine": {}}
    for kind in kinds:
        x, y = np.asarray(old[kind], np.float32), np.asarray(new[kind], np.float32)
        if len(x) != len(y):
            raise ConfigError(f"{kind}: {len(x)} old vectors but {len(y)} new ones")
        perm = np.random.default_rng(cfg.seed).permutation(len(x))
        held = perm[:max(2, round(cfg.holdout * len(x)))]
        rest = perm[len(held):]
        first = fit_maps(x[rest], y[rest], cfg)
        t_held = _mapped(first, x[held])
        err = errors(t_held, y[held])
        rows[kind] = (x[held], t_held, err)
        metrics["holdout_cosine"][kind] = round(float(1 - err.mean()), 4)
        maps[kind] = fit_maps(x, y, cfg)
        metrics["fit_cosine"][kind] = round(float(1 - errors(_mapped(maps[kind], x), y).mean()), 4)
        metrics["pairs"][kind] = len(x)
    predictor = ErrorPredictor.fit(rows, cfg.order_model, cfg.order_ridge, cfg.order_k)
    metrics["order_train_spearman"] = {
        kind: round(spearman(predictor.predict(kind, r[0], r[1]), r[2]), 4)
        for kind, r in rows.items()}
    metrics["fit_seconds"] = round(time.perf_counter() - start, 3)
    return GalleryTransform(maps, predictor, cfg, metrics)
