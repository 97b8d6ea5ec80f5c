"""Open a model version artifact as an ``Encoder`` that embeds into a chosen space.

A version natively embeds into its own space; other spaces are reached through routes
recorded in its manifest, opened by the route kinds registered in :mod:`training.routes`.
This is the opener every caller uses: it makes sure the built-in route kinds (those the
upgrade methods write, :mod:`training.upgrades.routes`) are registered first.
"""

from __future__ import annotations

import torch

from training.artifacts import Artifact, load_artifact
from training.encoders import Encoder
from training.routes import open_route


def load_encoder(artifact: Artifact | str, space: str | None = None,
                 device: torch.device | str | None = None) -> Encoder:
    """An encoder whose embeddings land in ``space`` (default: the version's native space)."""
    # Imported here, not at the top: the route kinds load peft and the upgrade code, which
    # importing this module (the gateway does at start) should not.
    from training.upgrades import routes  # noqa: F401  (registers the built-in route kinds)

    art = artifact if isinstance(artifact, Artifact) else load_artifact(artifact)
    return open_route(art, space, device)
