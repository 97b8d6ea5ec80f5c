"""The Direct baseline's training: a random phi and XBT's stage 2 adapters, end to end.

``L_c(phi(v_new), w_old) + L_c(phi(w_new), v_old)`` on the paired set, against the old
model's embeddings of the pairs (computed once up front; the old model is then released).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from training.distributed import gather
from training.losses import xbt_direct_loss
from training.pairs import PairTensors, pair_index_batches
from training.trainer import TrainResult, train
from training.upgrades.artifact import result_metrics
from training.upgrades.prepare import OnProgress, Prepared, Saves, old_pairs
from training.upgrades.xbt.adapters import Adapters
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector, to_old_space
from training.upgrades.xbt.stage2 import stage2_groups


class DirectTask:
    """Direct baseline: ``L_c(phi(v_new), w_old) + L_c(phi(w_new), v_old)`` on the same pairs.

    The old model is frozen and deterministic, so its embeddings of the pairs are
    computed once up front (``old_images`` [N, D_old], ``old_texts`` [M, D_old]).
    """

    def __init__(self, model: nn.Module, phi: Projector, pairs: PairTensors,
                 old_images: torch.Tensor, old_texts: torch.Tensor, scale: float) -> None:
        self.model, self.phi, self.pairs, self.scale = model, phi, pairs, scale
        self.old_images, self.old_texts = old_images, old_texts

    def losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        images, captions = batch
        device = self.model.logit_scale.device
        v = gather(to_old_space(self.phi, self.model.encode_image(
            self.pairs.pixels[images].float().to(device))))  # [B, D_old], the global batch
        w = gather(to_old_space(self.phi, self.model.encode_text(
            self.pairs.tokens[captions].to(device))))
        loss = xbt_direct_loss(v, w, gather(self.old_images[images].to(device)),
                               gather(self.old_texts[captions].to(device)), self.scale)
        return {"direct_loss": loss}


def train_direct(adapters: Adapters, phi: Projector, pairs: PairTensors,
                 old_images: torch.Tensor, old_texts: torch.Tensor, cfg: XbtConfig,
                 show_progress: bool = True, on_progress: OnProgress = None,
                 saves: Saves | None = None) -> TrainResult:
    """The Direct baseline: the same adapters and steps as stage 2, phi random and all trained."""
    model = adapters.model
    groups = stage2_groups(adapters, phi, cfg, train_phi="all")
    state_dir, train_cfg = (saves or Saves()).stage("direct", cfg.stage2_config())
    adapters.train_mode()
    phi.train()
    try:
        return train(DirectTask(model, phi, pairs, old_images, old_texts, cfg.logit_scale),
                     pair_index_batches(pairs, cfg.batch_size, cfg.seed), groups,
                     train_cfg, desc="direct baseline", show_progress=show_progress,
                     on_progress=on_progress, state_dir=state_dir)
    finally:
        model.eval()
        phi.eval()


def direct(p: Prepared, cfg: XbtConfig, show_progress: bool = True,
           on_progress: OnProgress = None) -> tuple[Projector, dict[str, Any]]:
    """The Direct baseline: embed the pairs with the old model once, then train end to end."""
    start = time.perf_counter()
    old_images, old_texts = old_pairs(p)
    cached = time.perf_counter() - start
    torch.manual_seed(cfg.seed)
    phi = Projector(p.new_dim, p.target_dim).to(p.device)
    result = train_direct(p.adapters, phi, p.pairs, old_images, old_texts, cfg,
                          show_progress, on_progress, p.saves)
    return phi, {"cache_seconds": cached, **result_metrics(result)}
