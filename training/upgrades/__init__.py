"""Upgrade methods: make a NEW model's embeddings land in an OLD gallery's space.

One folder per method, each with its config and its training code:

- :mod:`.xbt`: XBT (METHODS.md, XBT): ``config`` (``XbtConfig``, ``AdapterConfig``;
  torch-free), ``method`` (registered as ``xbt``), ``projector`` (phi), ``adapters``
  (LoRA + LayerNorm deltas) and ``prompts`` (visual soft prompts), ``stage1`` (text-only
  phi), ``stage2`` (pairs, no old model), ``selection`` (stage 2's validation selection),
  ``route`` (route kind ``projector``).
- :mod:`.direct`: the Direct baseline (``method``, registered as ``direct``; ``train``).
- :mod:`.adapter`: adapter routes fitted on stored vectors (``nobackfill upgrade
  adapter``): ``config``, ``maps``, ``fit``, ``route`` (route kind ``adapter``).

Shared by the methods that train phi: ``registry`` (methods by name), ``inputs`` (checks
of every input), ``prepare`` (the resolved inputs), ``artifact`` (the version written),
``run`` (``upgrade``: prepare, run the configured method, write). ``slerp`` mixes a route
with the old model (both route kinds); ``routes`` registers the built-in route kinds.

Importing the package registers the built-in methods (torch-free: they import their
training code when they run). A new method: its folder, and one registration below.
Modules inside the package import from the submodules, never from here.
"""

from __future__ import annotations

from training.upgrades.direct.method import Direct
from training.upgrades.registry import UPGRADES, UpgradeMethod, get_upgrade, register_upgrade
from training.upgrades.xbt.method import Xbt

# The built-in methods, in the order ``nobackfill upgrade -h`` lists them.
register_upgrade("xbt")(Xbt)
register_upgrade("direct")(Direct)

__all__ = ["UPGRADES", "UpgradeMethod", "get_upgrade", "register_upgrade"]
