"""The route kinds the upgrade methods write; importing this module registers them.

Each kind's module registers itself with ``training.routes.register_route_kind``:
``projector`` (:mod:`training.upgrades.xbt.route`: XBT's and Direct's adapted model, then
phi) and ``adapter`` (:mod:`training.upgrades.adapter.route`: the untouched model, then a
fitted map). ``training.versions.load_encoder`` imports this module before it opens an
artifact. A new route kind is its own module plus one import line here.
"""

from __future__ import annotations

from training.upgrades.adapter import route as adapter_route  # noqa: F401  (kind "adapter")
from training.upgrades.xbt import route as projector_route  # noqa: F401  (kind "projector")
