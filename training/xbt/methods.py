"""The built-in upgrade methods: XBT (METHODS.md, XBT) and the Direct baseline.

Registered on import of :mod:`training.xbt`. Their training code lives in
:mod:`training.xbt.upgrade` and is imported when a method runs, so listing the methods
(the CLI's subcommands, a job's checks) never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from training.errors import ConfigError
from training.xbt.config import XbtConfig
from training.xbt.registry import UpgradeMethod, register_upgrade

if TYPE_CHECKING:
    from training.trainer import Progress
    from training.xbt.projector import Projector
    from training.xbt.upgrade import Prepared


@register_upgrade("xbt")
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
        from training.xbt.upgrade import stage1, train_stage2

        phi, anchors, pretrain = stage1(p, self.config, show_progress, on_progress)
        stage2 = train_stage2(p.adapters, phi, p.pairs, self.config, anchors, show_progress,
                              on_progress, p.saves)
        return phi, {"pretrain": pretrain, **stage2.metrics()}


@register_upgrade("direct")
class Direct(UpgradeMethod):
    """The baseline XBT is measured against: a random phi and the same adapters trained end
    to end against the old model's embeddings of the pairs."""

    summary = "the Direct baseline: a random phi trained end to end against the old model"
    Config = XbtConfig
    config: XbtConfig

    @classmethod
    def check_config(cls, config: XbtConfig) -> None:
        if config.anchor or config.pair_anchor:
            raise ConfigError("anchor and pair_anchor apply to method 'xbt' (Direct already "
                              "trains against the old model); drop them or use method 'xbt' "
                              "(`nobackfill upgrade xbt`)")

    def train(self, p: Prepared, show_progress: bool = True,
              on_progress: Callable[[Progress], None] | None = None,
              ) -> tuple[Projector, dict[str, Any]]:
        from training.xbt.upgrade import direct

        phi, metrics = direct(p, self.config, show_progress, on_progress)
        return phi, {"direct": metrics}
