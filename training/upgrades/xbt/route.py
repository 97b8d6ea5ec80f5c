"""Route kind "projector": a version's embeddings carried into an older space by XBT.

Registered with ``training.routes`` on import (``training.upgrades.routes`` imports this
module for ``training.versions.load_encoder``). The encoder it returns embeds through the
version's base model with its adapters (LoRA, LayerNorm deltas, visual prompts) switched
on, then phi; the version's native route stays the untouched base model. A route whose
``adapters`` is None (stage 2's validation selection kept stage 1 alone) is phi on the
untouched base model.
"""

from __future__ import annotations

import torch

from training.artifacts import Artifact
from training.encoders import Encoder, create_tokenizer
from training.errors import ArtifactError
from training.routes import artifact_spec, native_model, register_route_kind
from training.upgrades.slerp import SlerpEncoder, with_slerp
from training.upgrades.xbt.adapters import Adapters
from training.upgrades.xbt.config import AdapterConfig
from training.upgrades.xbt.projector import Projector, ProjectorHead


def load_projector(artifact: Artifact, route: dict) -> Projector:
    """phi as the route records it (dims + weights), in eval mode."""
    phi = Projector(**route["projector_dims"])
    state = artifact.tensors(route["projector"])
    try:
        phi.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(f"{artifact.path / route['projector']} does not match the "
                            f"projector dims {route['projector_dims']}: {exc}") from exc
    return phi.eval()


def adapted_model(artifact: Artifact, route: dict) -> tuple[torch.nn.Module, Adapters]:
    """The version's base model with its trained adapters attached and switched on."""
    model = native_model(artifact)
    # lenient: a route written by another library version may record more (or newer) keys
    config = AdapterConfig.from_dict(route["adapter_config"], lenient=True)
    adapters = Adapters.attach(model, config)
    adapters.load_state_dict(artifact.tensors(route["adapters"]))
    return model.eval(), adapters


@register_route_kind("projector")
def load_projector_route(artifact: Artifact, route: dict,
                         device: torch.device | str | None) -> Encoder | SlerpEncoder:
    """The encoder of a "projector" route: the adapted base model, then phi (and, with
    ``slerp_t``, SLERP-mixed with the old model's own query embedding)."""
    for key in ("adapters", "projector", "adapter_config", "projector_dims"):
        if key not in route:
            raise ArtifactError(f"version '{artifact.version_id}': projector route lacks '{key}'")
    # adapters None: stage 2's selection kept stage 1 alone, phi on the untouched base model
    model = (adapted_model(artifact, route)[0] if route["adapters"] is not None
             else native_model(artifact).eval())
    head = ProjectorHead(load_projector(artifact, route))
    # One head object for both towers: phi is shared by images and texts (XBT eq. 4).
    routed = Encoder(model, create_tokenizer(artifact_spec(artifact)), device,
                     text_head=head, image_head=head,
                     native_towers=route["adapters"] is None)  # LoRA changes the towers
    return with_slerp(routed, artifact, route, device)  # slerp_t > 0: mixed with OLD's query
