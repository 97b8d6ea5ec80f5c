"""Route kinds by name: how a version's manifest entry for a space becomes an encoder.

A version natively embeds into its own space (route kind ``native``, defined here); other
spaces are reached through routes recorded in its manifest, each with a ``kind`` (e.g. an
XBT ``projector`` into an older version's space). A module that defines a route kind
registers it here with ``register_route_kind``; this module names none of them, and
manifests record the kind's name, never a module path. ``training.versions.load_encoder``
is the opener with every built-in kind registered.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from training.artifacts import Artifact, load_model_weights
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer
from training.errors import ArtifactError

RouteOpener = Callable[[Artifact, dict, "torch.device | str | None"], Encoder]
ROUTE_KINDS: dict[str, RouteOpener] = {}


def register_route_kind(kind: str) -> Callable[[RouteOpener], RouteOpener]:
    """Decorator: open a route whose manifest entry says ``"kind": kind`` with this function."""
    def wrap(opener: RouteOpener) -> RouteOpener:
        ROUTE_KINDS[kind] = opener
        return opener
    return wrap


def artifact_spec(artifact: Artifact) -> ModelSpec:
    return ModelSpec.from_dict(artifact.manifest["model_spec"])


def native_model(artifact: Artifact) -> torch.nn.Module:
    """The version's own model (architecture from the spec, weights from the artifact)."""
    model = create_model(artifact_spec(artifact).without_weights())
    load_model_weights(artifact, model)
    return model.eval()


@register_route_kind("native")
def _native_route(artifact: Artifact, route: dict, device: torch.device | str | None) -> Encoder:
    return Encoder(native_model(artifact), create_tokenizer(artifact_spec(artifact)), device,
                   native_towers=True)


def route_to(artifact: Artifact, space: str | None) -> dict:
    target = space or artifact.space
    route = artifact.routes.get(target)
    if route is None:
        raise ArtifactError(f"version '{artifact.version_id}' (space '{artifact.space}') has no "
                            f"route to space '{target}'; its routes: {sorted(artifact.routes)}")
    return route


def open_route(artifact: Artifact, space: str | None = None,
               device: torch.device | str | None = None) -> Encoder:
    """The artifact's route into ``space`` (default: native), opened by its registered kind."""
    route = route_to(artifact, space)
    kind = route.get("kind", "native")
    if kind not in ROUTE_KINDS:
        raise ArtifactError(f"version '{artifact.version_id}' uses unknown route kind '{kind}'; "
                            f"known: {sorted(ROUTE_KINDS)}")
    return ROUTE_KINDS[kind](artifact, route, device)
