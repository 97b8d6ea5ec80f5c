"""``upgrade``: make a NEW model's embeddings land in the OLD gallery's space.

Prepare every input (:mod:`training.upgrades.prepare`), run the method ``XbtConfig.method``
names (looked up in :mod:`training.upgrades.registry`, so adding a method touches no code
here), and write the version (:mod:`training.upgrades.artifact`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from training.artifacts import Artifact, load_artifact
from training.data import PairDataset
from training.distributed import World, on_main
from training.encoders import ModelSpec
from training.errors import ConfigError
from training.trainer import seed_everything
from training.upgrades.artifact import write_upgrade
from training.upgrades.prepare import OnProgress, Prepared, Saves, prepare
from training.upgrades.registry import get_upgrade
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector


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
