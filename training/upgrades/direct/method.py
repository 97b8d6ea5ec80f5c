"""Upgrade method ``direct``: the baseline XBT is measured against.

It shares XBT's settings (``XbtConfig`` with ``method="direct"``), adapters and phi
(:mod:`training.upgrades.xbt`); what differs is its training (:mod:`.train`), imported
when it runs. Registered as ``direct`` by :mod:`training.upgrades`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from training.errors import ConfigError
from training.upgrades.registry import UpgradeMethod
from training.upgrades.xbt.config import XbtConfig

if TYPE_CHECKING:
    from training.trainer import Progress
    from training.upgrades.prepare import Prepared
    from training.upgrades.xbt.projector import Projector


class Direct(UpgradeMethod):
    """A random phi and the same adapters as XBT's stage 2, trained end to end against
    the old model's embeddings of the pairs."""

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
        from training.upgrades.direct.train import direct

        phi, metrics = direct(p, self.config, show_progress, on_progress)
        return phi, {"direct": metrics}
