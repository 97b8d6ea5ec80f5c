"""Upgrade method ``xbt``: cross-modal backward-compatible training (METHODS.md, XBT).

Registered as ``xbt`` by :mod:`training.upgrades`. Its training code (:mod:`.stage1`,
:mod:`.stage2`) is imported when it runs, so listing the methods (the CLI's subcommands,
a job's checks) never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from training.upgrades.registry import UpgradeMethod
from training.upgrades.xbt.config import XbtConfig

if TYPE_CHECKING:
    from training.trainer import Progress
    from training.upgrades.prepare import Prepared
    from training.upgrades.xbt.projector import Projector


class Xbt(UpgradeMethod):
    """Stage 1 pretrains phi on cached text embeddings; stage 2 trains the adapters and
    phi's LayerNorms on image-text pairs without the old model, and (``select_every``)
    keeps its best checkpoint on a validation split, stage 1 alone included."""

    summary = "cross-modal backward-compatible training (XBT): text-only phi, then pairs"
    Config = XbtConfig
    config: XbtConfig
    selects = True

    def train(self, p: Prepared, show_progress: bool = True,
              on_progress: Callable[[Progress], None] | None = None,
              ) -> tuple[Projector, dict[str, Any]]:
        from training.upgrades.xbt.stage1 import stage1
        from training.upgrades.xbt.stage2 import train_stage2

        phi, anchors, pretrain = stage1(p, self.config, show_progress, on_progress)
        stage2 = train_stage2(p.adapters, phi, p.pairs, self.config, anchors, show_progress,
                              on_progress, p.saves)
        return phi, {"pretrain": pretrain, **stage2.metrics()}
