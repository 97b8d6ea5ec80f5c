"""XBT's stage 1 (text only): phi pretrained on cached text embeddings (METHODS.md, XBT).

Jang & Lim, "Towards Cross-modal Backward-compatible Representation Learning for
Vision-Language Models": cache the corpus' text embeddings by the new text tower and by
the old version (through its route into the target space), release the old model, and
train phi with ``L_pre = L_c(phi(w_new + eps), w_old)``. What stage 2 needs of the old
model is cached here too (``Anchors``): stage 2 never runs it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from training.distributed import World, gather, map_rows
from training.encoders import Encoder
from training.losses import xbt_pretrain_loss
from training.trainer import TrainResult, index_batches, train
from training.upgrades.artifact import result_metrics
from training.upgrades.prepare import (
    OnProgress,
    Prepared,
    Saves,
    free_memory,
    old_pair_embeddings,
    open_old,
)
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector
from training.upgrades.xbt.selection import ValidationSet

EMBED_CHUNK = 4096  # captions per progress-bar tick when caching embeddings


@dataclass
class TextCache:
    """Stage 1's cached corpus embeddings (L2-normalised), row i = caption i."""

    new: torch.Tensor  # [N, D_new] by the new text tower (off the shelf)
    old: torch.Tensor  # [N, D_old] by the old version, routed into the target space


def embed_corpus(encoder: Encoder, captions: Sequence[str], desc: str,
                 show_progress: bool) -> torch.Tensor:
    """[N, D] normalised text embeddings, with a progress bar over chunks. Under
    torch.distributed each rank embeds a block of the corpus and every rank gets all rows
    (``map_rows``): the cache is computed once and identical on every rank."""
    show = show_progress and World.current().is_main

    def block(lo: int, hi: int) -> torch.Tensor:
        return torch.cat([torch.from_numpy(encoder.encode_texts(captions[s:min(s + EMBED_CHUNK,
                                                                                 hi)]))
                          for s in tqdm(range(lo, hi, EMBED_CHUNK), desc=desc, disable=not show,
                                        dynamic_ncols=True)])
    return map_rows(len(captions), block)


class PretrainTask:
    """Stage 1: ``L_pre = L_c(phi(w_new + eps), w_old)`` on cached embeddings; all of phi trains.

    Under torch.distributed the noise is drawn for the global batch (each rank keeps its
    rows) and the loss is over the gathered global batch."""

    def __init__(self, phi: Projector, cache: TextCache, sigma: float, scale: float,
                 seed: int) -> None:
        self.phi, self.cache, self.sigma, self.scale = phi, cache, sigma, scale
        self.noise = torch.Generator().manual_seed(seed + 1)

    def state_dict(self) -> dict[str, Any]:
        """The noise stream's position (saved with a resumable run's state)."""
        return {"noise": self.noise.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise.set_state(state["noise"])

    def losses(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        device = next(self.phi.parameters()).device
        world = World.current()
        w_new = self.cache.new[idx]  # [b, D_new], b = B / ranks
        eps = world.shard(torch.randn((len(idx) * world.size, w_new.shape[1]),
                                      generator=self.noise)) * self.sigma  # [b, D_new]
        projected = nn.functional.normalize(self.phi((w_new + eps).to(device)), dim=-1)
        return {"pretrain_loss": xbt_pretrain_loss(  # [B, D_old] each, the global batch
            gather(projected), gather(self.cache.old[idx].to(device)), self.scale)}


def pretrain_projector(phi: Projector, cache: TextCache, cfg: XbtConfig,
                       show_progress: bool = True, on_progress: OnProgress = None,
                       saves: Saves | None = None) -> TrainResult:
    """Stage 1: train all of phi on the cached text embeddings (resumable with ``saves``)."""
    phi.train().requires_grad_(True)
    task = PretrainTask(phi, cache, cfg.noise_sigma, cfg.logit_scale, cfg.seed)
    state_dir, train_cfg = (saves or Saves()).stage("stage1", cfg.pretrain_config())
    result = train(task, index_batches(len(cache.new), cfg.pretrain_batch_size, cfg.seed),
                   [{"params": list(phi.parameters())}], train_cfg,
                   desc="xbt stage 1 (text)", show_progress=show_progress,
                   on_progress=on_progress, state_dir=state_dir)
    phi.eval()
    return result


@dataclass
class Anchor:
    """Corpus captions (new tokenizer) with their old embeddings cached in stage 1."""

    tokens: torch.Tensor  # [N, ctx]
    old: torch.Tensor  # [N, D_old]


@dataclass
class PairAnchor:
    """The paired set embedded by the old version in stage 1 (row i = pair image i /
    caption i of ``PairTensors``)."""

    images: torch.Tensor  # [N, D_old]
    texts: torch.Tensor  # [M, D_old]


@dataclass
class Anchors:
    """Old embeddings stage 1 cached for stage 2; each part is None when not configured:
    the anchoring terms' (``corpus``, ``pairs``), and the validation split's, which stage 2
    scores its checkpoints against (``validation``, ``select_every``; not a loss term)."""

    corpus: Anchor | None = None
    pairs: PairAnchor | None = None
    validation: ValidationSet | None = None

    def for_config(self, cfg: XbtConfig) -> Anchors:
        """The parts ``cfg`` asks for (``anchor``, ``pair_anchor``, ``select_every``); the
        rest is dropped."""
        return Anchors(self.corpus if cfg.anchor else None,
                       self.pairs if cfg.pair_anchor else None,
                       self.validation if cfg.select_every > 0 else None)


def cache_text(p: Prepared, cfg: XbtConfig,
               show_progress: bool = True) -> tuple[TextCache, Anchors]:
    """Embed the corpus (and, for ``pair_anchor``, the paired set; for selection, the
    validation split) with the old version, then release it; embed the corpus with the
    off-the-shelf new model."""
    old_encoder = open_old(p)
    old = embed_corpus(old_encoder, p.corpus, "old text (cache)", show_progress)
    paired = (PairAnchor(*old_pair_embeddings(old_encoder, p.pairs, p.dataset, p.model))
              if cfg.pair_anchor else None)
    validation = p.validation if cfg.select_every > 0 else None
    if validation is not None:
        validation = validation.with_old(*old_pair_embeddings(
            old_encoder, validation.pairs, validation.dataset, p.model))
    del old_encoder  # the old model is never needed again by XBT
    free_memory()
    with p.adapters.disabled():
        new = embed_corpus(p.encoder, p.corpus, "new text (cache)", show_progress)
    corpus = Anchor(p.encoder.tokenize(p.corpus), old) if cfg.anchor else None
    return TextCache(new, old), Anchors(corpus, paired, validation)


def stage1(p: Prepared, cfg: XbtConfig, show_progress: bool = True,
           on_progress: OnProgress = None) -> tuple[Projector, Anchors, dict[str, Any]]:
    """Cache the corpus embeddings and pretrain a fresh phi on them."""
    start = time.perf_counter()
    cache, anchors = cache_text(p, cfg, show_progress)
    cached = time.perf_counter() - start
    phi, metrics = pretrain_fresh(p, cache, cfg, show_progress, on_progress)
    return phi, anchors, {"corpus_captions": len(p.corpus), "cache_seconds": cached, **metrics}


def fresh_projector(p: Prepared, cache: TextCache, cfg: XbtConfig) -> Projector:
    """A new phi: random (the paper), or starting as the Procrustes map of the cached text
    pairs (new text embedding -> old text embedding), ``cfg.init``."""
    torch.manual_seed(cfg.seed)
    if cfg.init == "random":
        return Projector(p.new_dim, p.target_dim).to(p.device)
    from training.upgrades.adapter.maps import procrustes

    phi = Projector(p.new_dim, p.target_dim, skip=True)
    phi.start_from(procrustes(cache.new, cache.old))
    return phi.to(p.device)


def pretrain_fresh(p: Prepared, cache: TextCache, cfg: XbtConfig, show_progress: bool = True,
                   on_progress: OnProgress = None) -> tuple[Projector, dict[str, Any]]:
    """Stage 1 on an existing cache: a fresh phi (``cfg.init``) pretrained on it."""
    phi = fresh_projector(p, cache, cfg)
    result = pretrain_projector(phi, cache, cfg, show_progress, on_progress, p.saves)
    return phi, {"init": cfg.init, **result_metrics(result)}
