"""XBT: cross-modal backward-compatible upgrades (METHODS.md, XBT).

- :mod:`.config`: ``XbtConfig`` (every hyperparameter, saved with the artifact) and
  ``AdapterConfig``; free of torch so the CLI's ``--help`` stays fast.
- :mod:`.registry`: upgrade methods by name (``register_upgrade``, ``get_upgrade``,
  ``UPGRADES``); :mod:`.methods` registers the built-ins, ``xbt`` and ``direct``.
- :mod:`.projector`: phi, pretrained on text only.
- :mod:`.adapters`: removable adapters on the new model (LoRA via peft, LayerNorm
  deltas) and :mod:`.prompts` (visual soft prompts).
- :mod:`.upgrade`: stage 1, stage 2 (no old model), the Direct baseline, the artifact.
- :mod:`.route`: the "projector" route into the old gallery's space.

Importing the package registers the built-in methods (torch-free: they import their
training code when they run). Modules inside the package import from the submodules,
never from here.
"""

from __future__ import annotations

from training.xbt import methods  # noqa: F401  (registers xbt and direct)
from training.xbt.registry import UPGRADES, UpgradeMethod, get_upgrade, register_upgrade

__all__ = ["UPGRADES", "UpgradeMethod", "get_upgrade", "register_upgrade"]
