"""Open a model version artifact as an ``Encoder`` that embeds into a chosen space.

A version natively embeds into its own space; other spaces are reached through
routes recorded in its manifest (e.g. an XBT projector into an older version's
space). Route kinds are registered by name; the module that defines a kind is
imported on first use, so this module stays free of method code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from training.artifacts import Artifact, load_artifact, load_model_weights
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer
from training.errors import ArtifactError

RouteBuilder = Callable[[Artifact, dict, "torch.device | str | None"], Encoder]
ROUTE_BUILDERS: dict[str, RouteBuilder] = {}
# Route kinds defined outside this module: kind -> module that registers it on import.
ROUTE_MODULES: dict[str, str] = {"projector": "training.xbt.route", "adapter": "training.adapters.route"}


def register_route(kind: str) -> Callable[[RouteBuilder], RouteBuilder]:
    def wrap(builder: RouteBuilder) -> RouteBuilder:
        ROUTE_BUILDERS[kind] = builder
        return builder
    return wrap


def artifact_spec(artifact: Artifact) -> ModelSpec:
    return ModelSpec.from_dict(artifact.manifest["model_spec"])


def native_model(artifact: Artifact) -> torch.nn.Module:
    """The version's own model (architecture from the spec, weights from the artifact)."""
    model = create_model(artifact_spec(artifact).without_weights())
    load_model_weights(artifact, model)
    return model.eval()


@register_route("native")
def _native_route(artifact: Artifact, route: dict, device: torch.device | str | None) -> Encoder:
    return Encoder(native_model(artifact), create_tokenizer(artifact_spec(artifact)), device)


def route_to(artifact: Artifact, space: str | None) -> dict:
    target = space or artifact.space
    route = artifact.routes.get(target)
    if route is None:
        raise ArtifactError(f"version '{artifact.version_id}' (space '{artifact.space}') has no "
                            f"route to space '{target}'; its routes: {sorted(artifact.routes)}")
    return route


def load_encoder(artifact: Artifact | str, space: str | None = None,
                 device: torch.device | str | None = None) -> Encoder:
    """An encoder whose embeddings land in ``space`` (default: the version's native space)."""
    art = artifact if isinstance(artifact, Artifact) else load_artifact(artifact)
    route = route_to(art, space)
    kind = route.get("kind", "native")
    if kind not in ROUTE_BUILDERS and kind in ROUTE_MODULES:
        importlib.import_module(ROUTE_MODULES[kind])
    if kind not in ROUTE_BUILDERS:
        raise ArtifactError(f"version '{art.version_id}' uses unknown route kind '{kind}'; "
                            f"known: {sorted(ROUTE_BUILDERS)}")
    return ROUTE_BUILDERS[kind](art, route, device)
