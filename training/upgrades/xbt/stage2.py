"""XBT's stage 2 (image-text pairs, no old model; METHODS.md, XBT).

LoRA on both new towers, visual soft prompts, LayerNorm deltas, and phi's LayerNorms
train with ``L_x = L_c(phi(v_new), phi(w_new))`` (+ optional anchoring terms on old
embeddings cached in stage 1: the corpus' old text, and the paired set's old images and
captions). With ``select_every`` the best checkpoint on a validation split ships
(:mod:`.selection`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from training.distributed import World, gather
from training.losses import xbt_anchor_loss, xbt_direct_loss, xbt_loss
from training.pairs import PairTensors, pair_index_batches
from training.trainer import TrainResult, index_batches, train
from training.upgrades.artifact import result_metrics
from training.upgrades.prepare import OnProgress, Saves
from training.upgrades.xbt.adapters import Adapters
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector, to_old_space
from training.upgrades.xbt.selection import Selector
from training.upgrades.xbt.stage1 import Anchors


class XbtTask:
    """Stage 2: ``L_x = L_c(phi(v_new), phi(w_new))`` through the adapted new towers.

    Holds no old model: the optional anchoring terms read old embeddings that stage 1
    cached (``anchors``). Under torch.distributed every term is over the gathered global
    batch (projections with their gradients, cached old rows without).
    """

    def __init__(self, model: nn.Module, phi: Projector, pairs: PairTensors, cfg: XbtConfig,
                 anchors: Anchors | None = None, selector: Selector | None = None) -> None:
        self.model, self.phi, self.pairs, self.cfg = model, phi, pairs, cfg
        self.anchors = (anchors or Anchors()).for_config(cfg)
        self.selector = selector  # its curve and best checkpoint go with a saved state
        corpus = self.anchors.corpus
        self.anchor_batches = (index_batches(len(corpus.tokens), cfg.batch_size, cfg.seed + 2)
                               if corpus is not None else None)

    def losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        images, captions = batch
        device = self.model.logit_scale.device
        v = gather(to_old_space(self.phi, self.model.encode_image(  # [B, D_old]
            self.pairs.pixels[images].float().to(device))))
        w = gather(to_old_space(self.phi, self.model.encode_text(
            self.pairs.tokens[captions].to(device))))  # [B, D_old]
        out = {"xbt_loss": xbt_loss(v, w, self.cfg.logit_scale)}
        corpus, paired = self.anchors.corpus, self.anchors.pairs
        if corpus is not None and self.anchor_batches is not None:
            idx = next(self.anchor_batches)
            w_anchor = gather(to_old_space(self.phi, self.model.encode_text(
                corpus.tokens[idx].to(device))))  # [B, D_old]
            out["anchor_loss"] = self.cfg.anchor_weight * xbt_anchor_loss(
                w_anchor, gather(corpus.old[idx].to(device)), self.cfg.logit_scale)
        if paired is not None:  # the same batch against its cached old embeddings
            out["pair_anchor_loss"] = self.cfg.pair_anchor_weight * xbt_direct_loss(
                v, w, gather(paired.images[images].to(device)),
                gather(paired.texts[captions].to(device)), self.cfg.logit_scale)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"selector": self.selector.state_dict() if self.selector is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed stage 2 (rank 0, which selects) takes its curve and best state back."""
        if self.selector is not None and state.get("selector") is not None:
            self.selector.load_state_dict(state["selector"])


def stage2_groups(adapters: Adapters, phi: Projector, cfg: XbtConfig,
                  train_phi: str) -> list[dict[str, Any]]:
    """AdamW groups: adapters at ``lr``, prompts at ``prompt_lr`` (100x in the paper), phi:

    - ``train_phi="layer_norms"`` (XBT stage 2): only phi's LayerNorms, at ``lr``;
    - ``train_phi="all"`` (Direct): all of a random phi, at ``pretrain_lr``, the rate phi
      trains at from scratch in stage 1, so the baseline's phi is not handicapped.
    """
    if train_phi == "layer_norms":
        phi.train_only_layer_norms()
        phi_group = {"params": phi.layer_norm_parameters(), "lr": cfg.lr}
    else:
        phi.requires_grad_(True)
        phi_group = {"params": list(phi.parameters()), "lr": cfg.pretrain_lr}
    adapter_params = [*adapters.named_lora().values(), *adapters.named_layer_norm_deltas().values()]
    groups = [{"params": adapter_params, "lr": cfg.lr}, phi_group]
    prompts = list(adapters.named_prompts().values())
    if prompts:
        groups.append({"params": prompts, "lr": cfg.prompt_lr})
    return groups


@dataclass
class Stage2:
    """What stage 2 did: its training run, and (``select_every``) the validation curve and
    the chosen step (``training.upgrades.xbt.selection``)."""

    result: TrainResult
    selection: dict[str, Any] | None = None

    def metrics(self) -> dict[str, Any]:
        """The artifact's ``stage2`` metrics, and its ``selection`` when stage 2 selected."""
        out: dict[str, Any] = {"stage2": result_metrics(self.result)}
        if self.selection is not None:
            out["selection"] = self.selection
        return out


def train_stage2(adapters: Adapters, phi: Projector, pairs: PairTensors, cfg: XbtConfig,
                 anchors: Anchors | None = None, show_progress: bool = True,
                 on_progress: OnProgress = None, saves: Saves | None = None) -> Stage2:
    """Stage 2 on image-text pairs (``adapters.model`` is the new model). Takes no old
    model: XBT never runs it here. With ``cfg.select_every`` and a validation split in
    ``anchors``, the route is scored at step 0 (stage 1 alone) and every ``select_every``
    steps, and the best checkpoint is put back into ``adapters`` and ``phi`` at the end
    (adapters switched off when it is step 0). Under torch.distributed rank 0 selects: it
    alone writes the artifact. With ``saves`` the whole state (the selection's curve and
    best checkpoint included) is saved at every selection point (else every
    ``saves.every`` steps), and a run that finds one resumes from it."""
    model = adapters.model
    anchors = (anchors or Anchors()).for_config(cfg)
    selects = anchors.validation is not None  # for_config keeps it only with select_every
    # the number of comparisons is known: each is tested at 5% / that (Bonferroni)
    selector = (Selector(anchors.validation, adapters, phi, cfg.select_every,
                         compared=-(-cfg.steps // cfg.select_every))
                if selects and World.current().is_main else None)
    if selector is not None:
        selector.stage1()
    groups = stage2_groups(adapters, phi, cfg, train_phi="layer_norms")
    state_dir, train_cfg = (saves or Saves()).stage("stage2", cfg.stage2_config())
    if selects:  # every rank checkpoints at the selection points (rank 0 scores them)
        train_cfg = replace(train_cfg, checkpoint_every=cfg.select_every)
    adapters.train_mode()
    phi.train()
    try:
        result = train(XbtTask(model, phi, pairs, cfg, anchors, selector),
                       pair_index_batches(pairs, cfg.batch_size, cfg.seed), groups, train_cfg,
                       desc="xbt stage 2 (pairs)", show_progress=show_progress,
                       on_progress=on_progress,
                       on_checkpoint=selector.at_step if selector is not None else None,
                       state_dir=state_dir)
    finally:
        model.eval()
        phi.eval()
    return Stage2(result, selector.finish(result.steps) if selector is not None else None)
