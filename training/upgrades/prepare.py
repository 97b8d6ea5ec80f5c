"""The inputs of an upgrade that trains phi (``xbt``, ``direct``), resolved before any training.

``prepare`` checks every input (:mod:`training.upgrades.inputs`), loads the new model with
untrained adapters attached, and builds the paired set's tensors (and, for a method that
selects, the validation split's); nothing trains yet. ``Saves`` says where each training
loop saves its state; ``open_old`` and ``old_pair_embeddings`` run the old version, which
each method holds only while it caches what it needs of it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from open_clip.model import get_model_preprocess_cfg
from torch import nn

from training.artifacts import Artifact, model_state
from training.data import PairDataset
from training.distributed import map_rows
from training.encoders import Encoder, ModelSpec, create_tokenizer, model_embed_dim, pick_device
from training.errors import ConfigError, DataError
from training.pairs import PairTensors, build_pairs
from training.trainer import Progress, TrainConfig
from training.upgrades.inputs import (
    check_dim,
    check_tokenizer,
    declared_dim,
    new_model_of,
    read_corpus,
    target_space_of,
)
from training.upgrades.registry import get_upgrade
from training.upgrades.xbt.adapters import Adapters
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.selection import GIVEN, HELD_OUT, ValidationSet, hold_out
from training.versions import load_encoder

OnProgress = Callable[[Progress], None] | None

TOKENIZER_PROBE = 256  # captions tokenized up front to check each tokenizer against its tower


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
    """Resolve and check every input (see :mod:`training.upgrades.inputs`); nothing trains yet.

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


def old_pair_embeddings(old: Encoder, pairs: PairTensors, dataset: PairDataset,
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


def old_pairs(p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """The paired set by the old version (``old_pair_embeddings``); the old model is
    released before this returns."""
    embeddings = old_pair_embeddings(open_old(p), p.pairs, p.dataset, p.model)
    free_memory()
    return embeddings
