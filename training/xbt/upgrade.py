"""An XBT upgrade: make a NEW model's embeddings land in the OLD gallery's space.

METHODS.md, XBT (Jang & Lim, "Towards Cross-modal Backward-compatible Representation
Learning for Vision-Language Models"):
1. Stage 1 (text only): cache the corpus' text embeddings by the new text tower and
   by the old version (through its route into the target space), release the old
   model, and train phi with ``L_pre = L_c(phi(w_new + eps), w_old)``.
2. Stage 2 (image-text pairs, no old model): LoRA on both new towers, visual soft
   prompts, LayerNorm deltas, and phi's LayerNorms train with
   ``L_x = L_c(phi(v_new), phi(w_new))`` (+ optional anchoring terms on old embeddings
   cached in stage 1: the corpus' old text, and the paired set's old images and captions).
The Direct baseline instead trains a random phi end to end against the old model.
Both are registered upgrade methods (``training.xbt.methods``); ``train_upgrade`` runs
the one ``XbtConfig.method`` names.
The result is a version artifact whose route into the target space runs the base
model + adapters + phi; its native route is the untouched new model.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from open_clip.model import get_model_preprocess_cfg
from torch import nn
from tqdm import tqdm

from training.artifacts import (
    WEIGHTS,
    Artifact,
    load_artifact,
    model_state,
    new_version_id,
    write_artifact,
)
from training.data import PairDataset
from training.distributed import World, gather, map_rows, on_main
from training.encoders import Encoder, ModelSpec, create_tokenizer, model_embed_dim, pick_device
from training.errors import ConfigError, DataError
from training.losses import xbt_anchor_loss, xbt_direct_loss, xbt_loss, xbt_pretrain_loss
from training.pairs import PairTensors, build_pairs, pair_index_batches
from training.slerp import OLD_WEIGHTS, old_weights
from training.trainer import (
    Progress,
    TrainConfig,
    TrainResult,
    index_batches,
    seed_everything,
    train,
)
from training.versions import load_encoder
from training.xbt.adapters import Adapters
from training.xbt.config import XbtConfig
from training.xbt.inputs import (
    check_dim,
    check_tokenizer,
    declared_dim,
    new_model_of,
    read_corpus,
    target_space_of,
)
from training.xbt.projector import Projector, to_old_space
from training.xbt.registry import get_upgrade
from training.xbt.selection import GIVEN, HELD_OUT, Selector, ValidationSet, hold_out

OnProgress = Callable[[Progress], None] | None

ADAPTERS_FILE = "adapters.safetensors"
PROJECTOR_FILE = "projector.safetensors"
EMBED_CHUNK = 4096  # captions per progress-bar tick when caching embeddings
TOKENIZER_PROBE = 256  # captions tokenized up front to check each tokenizer against its tower


# ---------------------------------------------------------------------------- stage 1
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


# ---------------------------------------------------------------------------- stage 2
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
    the chosen step (``training.xbt.selection``)."""

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
    selector = (Selector(anchors.validation, adapters, phi, cfg.select_every)
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


# ---------------------------------------------------------------------------- Direct
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


# ---------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Saves:
    """Where a resumable upgrade saves each training loop's whole state (``directory``/
    ``stage1``, ``stage2``, ``direct``) and how often (``every`` steps); a run that finds
    a saved state resumes from it. Empty (the default): nothing is saved."""

    directory: Path | None = None
    every: int = 0

    def __post_init__(self) -> None:
        if self.every < 0 or (self.every and self.directory is None):
            raise ConfigError(f"checkpoint_every ({self.every}) must be >= 0, and > 0 only "
                              f"with a checkpoint directory")

    def stage(self, name: str, cfg: TrainConfig) -> tuple[Path | None, TrainConfig]:
        """(state directory, config) of one training loop: unchanged when not saving."""
        if self.directory is None or not self.every:
            return None, cfg
        return self.directory / name, replace(cfg, checkpoint_every=self.every)


@dataclass
class Prepared:
    """Everything an upgrade trains on, resolved and checked before the first step."""

    old: Artifact
    target_space: str
    target_dim: int
    new_source: Artifact | ModelSpec
    spec: ModelSpec  # the new model's architecture (no weight source)
    native_space: str | None  # the new artifact's space, None for a bare model spec
    model: nn.Module  # the new model, adapters attached (its own weights never change)
    adapters: Adapters
    base_state: dict[str, torch.Tensor]  # the new model's weights, as loaded
    encoder: Encoder  # the new model natively (for caching; adapters off)
    corpus: list[str]
    dataset: PairDataset
    pairs: PairTensors  # new-model preprocessing and tokens
    device: torch.device
    validation: ValidationSet | None = None  # what stage 2 selects on (``select_every``)
    saves: Saves = field(default_factory=Saves)  # where each stage saves its state

    @property
    def new_dim(self) -> int:
        return model_embed_dim(self.model)


def prepare(old: Artifact, new: Artifact | ModelSpec, corpus: str | Path | Sequence[str],
            dataset: PairDataset, cfg: XbtConfig, target_space: str | None = None,
            device: str | torch.device | None = None, show_progress: bool = True,
            validation: PairDataset | None = None) -> Prepared:
    """Resolve and check every input (see :mod:`training.xbt.inputs`); nothing trains yet.

    ``validation``: the split stage 2 selects on (``select_every``; never the test set).
    Without one, a method that selects holds ``select_holdout`` of ``dataset`` out of
    training for it; a method that does not (Direct) or ``select_every=0`` uses none."""
    target = target_space_of(old, target_space)
    dim = declared_dim(old, target)
    captions = read_corpus(corpus)
    if len(dataset) == 0:
        raise DataError("the paired set is empty: stage 2 needs image-caption pairs")
    selects = cfg.select_every > 0 and get_upgrade(cfg.method).selects
    source = GIVEN
    if not selects:
        validation = None
    elif validation is None and cfg.select_holdout > 0:
        dataset, validation = hold_out(dataset, cfg.select_holdout, cfg.seed)
        source = HELD_OUT
    if validation is not None and len(validation) == 0:
        raise DataError("the validation set is empty: stage 2's selection needs image-caption "
                        "pairs (or turn it off with select_every=0)")
    spec, model, native = new_model_of(new)
    if native == target:
        raise ConfigError(f"the new model already embeds natively into space '{target}': it "
                          f"needs no upgrade into it (upgrade a model of another space)")
    tokenizer = create_tokenizer(spec)
    check_tokenizer("the new model", model, tokenizer, captions[:TOKENIZER_PROBE])
    base_state = model_state(model)
    adapters = Adapters.attach(model, cfg.adapter_config())  # fails early on a ResNet + prompts
    encoder = Encoder(model, tokenizer, pick_device(device))
    with adapters.disabled():
        pairs = build_pairs(dataset, encoder, [cfg.language], show_progress)  # reads every image
        held = (ValidationSet(validation, build_pairs(validation, encoder, [cfg.language]),
                              validation.relevance(cfg.language), encoder.tokenizer, source)
                if validation is not None else None)
    return Prepared(old, target, dim, new, spec, native, model, adapters, base_state, encoder,
                    captions, dataset, pairs, encoder.device, held)


def with_fresh_adapters(p: Prepared, cfg: XbtConfig) -> Prepared:
    """The same inputs on a fresh copy of the new model with untrained adapters."""
    _, model, _ = new_model_of(p.new_source)
    adapters = Adapters.attach(model, cfg.adapter_config())
    encoder = Encoder(model, p.encoder.tokenizer, p.device)
    return replace(p, model=model, adapters=adapters, encoder=encoder)


def open_old(p: Prepared) -> Encoder:
    """The old version routed into the target space, checked against its declared dim."""
    old = load_encoder(p.old, p.target_space, p.device)
    check_dim(f"old version '{p.old.version_id}' in space '{p.target_space}'", p.target_dim,
              int(old.embed_dim))
    check_tokenizer(f"old version '{p.old.version_id}'", old.model, old.tokenizer,
                    p.corpus[:TOKENIZER_PROBE])
    return old


def free_memory() -> None:
    """Return a released model's memory (the old model's, before the next stage)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- the stages
def cache_text(p: Prepared, cfg: XbtConfig,
               show_progress: bool = True) -> tuple[TextCache, Anchors]:
    """Embed the corpus (and, for ``pair_anchor``, the paired set; for selection, the
    validation split) with the old version, then release it; embed the corpus with the
    off-the-shelf new model."""
    old_encoder = open_old(p)
    old = embed_corpus(old_encoder, p.corpus, "old text (cache)", show_progress)
    paired = (PairAnchor(*_old_pair_embeddings(old_encoder, p.pairs, p.dataset, p.model))
              if cfg.pair_anchor else None)
    validation = p.validation if cfg.select_every > 0 else None
    if validation is not None:
        validation = validation.with_old(*_old_pair_embeddings(
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
    from training.adapters.maps import procrustes

    phi = Projector(p.new_dim, p.target_dim, skip=True)
    phi.start_from(procrustes(cache.new, cache.old))
    return phi.to(p.device)


def pretrain_fresh(p: Prepared, cache: TextCache, cfg: XbtConfig, show_progress: bool = True,
                   on_progress: OnProgress = None) -> tuple[Projector, dict[str, Any]]:
    """Stage 1 on an existing cache: a fresh phi (``cfg.init``) pretrained on it."""
    phi = fresh_projector(p, cache, cfg)
    result = pretrain_projector(phi, cache, cfg, show_progress, on_progress, p.saves)
    return phi, {"init": cfg.init, **result_metrics(result)}


def direct(p: Prepared, cfg: XbtConfig, show_progress: bool = True,
           on_progress: OnProgress = None) -> tuple[Projector, dict[str, Any]]:
    """The Direct baseline: embed the pairs with the old model once, then train end to end."""
    start = time.perf_counter()
    old_images, old_texts = _old_pair_embeddings(open_old(p), p.pairs, p.dataset, p.model)
    free_memory()
    cached = time.perf_counter() - start
    torch.manual_seed(cfg.seed)
    phi = Projector(p.new_dim, p.target_dim).to(p.device)
    result = train_direct(p.adapters, phi, p.pairs, old_images, old_texts, cfg,
                          show_progress, on_progress, p.saves)
    return phi, {"cache_seconds": cached, **result_metrics(result)}


def _old_pair_embeddings(old: Encoder, pairs: PairTensors, dataset: PairDataset,
                         new_model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [N, D_old], captions [M, D_old]) of a paired set (``pairs``: its new-model
    tensors) by the old version (each rank embeds a block of the rows under
    torch.distributed; all ranks get all of them)."""
    same = get_model_preprocess_cfg(old.model) == get_model_preprocess_cfg(new_model)

    def images(lo: int, hi: int) -> torch.Tensor:
        if same:  # same preprocessing: reuse the pixels
            return torch.from_numpy(old.encode_image_tensors(pairs.pixels[lo:hi]))
        return torch.from_numpy(old.encode_images([dataset.load_image(i)
                                                   for i in range(lo, hi)]))

    def texts(lo: int, hi: int) -> torch.Tensor:
        return torch.from_numpy(old.encode_texts(pairs.captions[lo:hi]))
    return map_rows(len(pairs.pixels), images), map_rows(len(pairs.captions), texts)


def result_metrics(result: TrainResult) -> dict[str, Any]:
    """A training loop's record in the artifact (a resumed loop's losses are those of the
    steps it took after ``resumed_from``)."""
    return {"steps": result.steps, "seconds": result.seconds,
            "final_loss": result.final_loss if result.losses else None,
            "first_loss": result.losses[0] if result.losses else None,
            "resumed_from": result.resumed_from}


# ---------------------------------------------------------------------------- the artifact
def projector_route_entry(p: Prepared, phi: Projector, cfg: XbtConfig) -> dict[str, Any]:
    """The manifest's entry for the route into the target space: base model + adapters +
    phi (``training.xbt.route.load_projector_route`` builds the encoder from it). With the
    adapters switched off (selection chose stage 1 alone) the route is phi on the untouched
    base model: ``adapters`` and ``adapter_config`` are None."""
    on = p.adapters.enabled
    return {"kind": "projector", "adapters": ADAPTERS_FILE if on else None,
            "projector": PROJECTOR_FILE,
            "adapter_config": cfg.adapter_config().to_dict() if on else None,
            "projector_dims": phi.dims(), "embed_dim": phi.out_dim}


def write_upgrade(p: Prepared, phi: Projector, cfg: XbtConfig, metrics: dict[str, Any],
                  out: str | Path, version_id: str | None = None) -> Artifact:
    """Write the upgraded version: self-contained (base weights included), atomic."""
    vid = version_id or new_version_id()
    space = p.native_space or vid
    manifest = {
        "version_id": vid, "space": space, "kind": "xbt", "method": cfg.method,
        "parent": p.old.version_id, "target_space": p.target_space,
        "model_spec": p.spec.to_dict(), "base_model": p.spec.describe(),
        "embed_dim": p.new_dim, "preprocess": dict(get_model_preprocess_cfg(p.model)),
        "languages": [cfg.language], "hyperparameters": cfg.to_dict(), "metrics": metrics,
        "routes": {space: {"kind": "native"},
                   p.target_space: projector_route_entry(p, phi, cfg)},
    }
    tensors = {WEIGHTS: p.base_state,
               PROJECTOR_FILE: {k: v.detach() for k, v in phi.state_dict().items()}}
    if p.adapters.enabled:
        tensors[ADAPTERS_FILE] = p.adapters.state_dict()
    if cfg.slerp_t > 0:  # the route mixes with OLD's own query: OLD's weights travel along
        route = manifest["routes"][p.target_space]
        route["slerp_t"] = cfg.slerp_t
        tensors[OLD_WEIGHTS] = old_weights(p.old, p.target_space, route)
    return write_artifact(out, manifest, tensors)


def train_upgrade(p: Prepared, cfg: XbtConfig, show_progress: bool = True,
                  on_progress: OnProgress = None) -> tuple[Projector, dict[str, Any]]:
    """Run the method ``cfg.method`` names (looked up in the registry, so adding a method
    touches no code here) on prepared inputs: (trained phi, metrics)."""
    phi, metrics = get_upgrade(cfg.method)(cfg).train(p, show_progress, on_progress)
    return phi, {"pair_images": len(p.pairs.pixels), "pair_captions": len(p.pairs.tokens),
                 **metrics}


def upgrade(old: Artifact, new: Artifact | ModelSpec, corpus: str | Path | Sequence[str],
            pairs: PairDataset, out: str | Path, cfg: XbtConfig | None = None,
            version_id: str | None = None, target_space: str | None = None,
            device: str | torch.device | None = None, show_progress: bool = True,
            on_progress: OnProgress = None, validation: PairDataset | None = None,
            checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0) -> Artifact:
    """Make ``new`` compatible with ``old``'s (root) space; write the version at ``out``.

    ``new``: an artifact (its native model) or a model spec; ``corpus``: captions, a text
    file (one per line) or ``synth:N``; ``pairs``: the image-caption set of stage 2;
    ``validation``: the split stage 2's checkpoints are scored on (``select_every``;
    default: ``select_holdout`` of ``pairs``, held out of training).
    Every input is checked before training; on any failure nothing is written.
    ``on_progress`` gets every step of every stage and may raise to stop (cancellation).
    Data-parallel under torch.distributed (``training.distributed.run_ranks``): rank 0
    alone writes ``out``. With ``checkpoint_dir`` each stage saves its whole state there
    every ``checkpoint_every`` steps (stage 2 at every selection point when it selects),
    and a run started again with the same arguments resumes from what it saved.
    """
    cfg = cfg or XbtConfig()
    saves = Saves(Path(checkpoint_dir) if checkpoint_dir is not None else None,
                  checkpoint_every)
    if Path(out).exists():
        raise ConfigError(f"{out} already exists; choose another output directory")
    seed_everything(cfg.seed)
    start = time.perf_counter()
    prepared = prepare(old, new, corpus, pairs, cfg, target_space, device, show_progress,
                       validation)
    prepared.saves = saves
    phi, metrics = train_upgrade(prepared, cfg, show_progress, on_progress)
    metrics["upgrade_seconds"] = time.perf_counter() - start
    metrics["ranks"] = World.current().size
    return on_main(lambda: write_upgrade(prepared, phi, cfg, metrics, out, version_id),
                   lambda: load_artifact(out))
