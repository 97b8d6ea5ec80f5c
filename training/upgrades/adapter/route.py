"""Route kind "adapter": a NEW version's embeddings carried into an older space by maps
fitted on stored vectors (``training.upgrades.adapter.maps``).

Registered with ``training.routes`` on import (``training.upgrades.routes`` imports this
module for ``training.versions.load_encoder``). The encoder runs the version's untouched
towers, then the modality's map (the native route stays the plain model). With
``slerp_t`` > 0 the route also runs the OLD model, whose weights the artifact carries, and
answers ``slerp(map(new(q)), old(q), t)``: two forwards per query.
"""

from __future__ import annotations

import torch

from training.artifacts import Artifact
from training.encoders import Encoder, create_tokenizer
from training.errors import ArtifactError
from training.routes import artifact_spec, native_model, register_route_kind
from training.upgrades.adapter.maps import EmbeddingMap
from training.upgrades.slerp import SlerpEncoder, with_slerp

MAPS_FILE = "adapter_maps.safetensors"
KINDS = ("image", "text")


def load_maps(artifact: Artifact, route: dict) -> dict[str, EmbeddingMap]:
    """Modality -> its fitted map, as the route records them (dims, then weights)."""
    state = artifact.tensors(route["maps_file"])
    maps = {}
    for kind in KINDS:
        m = EmbeddingMap(**route["maps"][kind])
        prefix = f"{kind}."
        try:
            m.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                               if k.startswith(prefix)}, strict=True)
        except RuntimeError as exc:
            raise ArtifactError(f"{artifact.path / route['maps_file']} does not match the "
                                f"{kind} map dims {route['maps'][kind]}: {exc}") from exc
        maps[kind] = m.eval()
    return maps


def maps_state(maps: dict[str, EmbeddingMap]) -> dict[str, torch.Tensor]:
    """One safetensors dict for every modality's map (``image.weight``, ``text.bias``...)."""
    return {f"{kind}.{k}": v.detach().clone() for kind, m in maps.items()
            for k, v in m.state_dict().items()}


@register_route_kind("adapter")
def load_adapter_route(artifact: Artifact, route: dict,
                       device: torch.device | str | None) -> Encoder | SlerpEncoder:
    """The encoder of an "adapter" route: the version's towers, then the fitted maps."""
    for key in ("maps", "maps_file", "method"):
        if key not in route:
            raise ArtifactError(f"version '{artifact.version_id}': adapter route lacks '{key}'")
    maps = load_maps(artifact, route)
    new = Encoder(native_model(artifact), create_tokenizer(artifact_spec(artifact)), device,
                  text_head=maps["text"], image_head=maps["image"], native_towers=True)
    return with_slerp(new, artifact, route, device)
