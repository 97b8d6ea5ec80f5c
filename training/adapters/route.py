"""Route kind "adapter": a NEW version's embeddings carried into an older space by maps
fitted on stored vectors (``training.adapters.maps``).

``training.versions.load_encoder(artifact, space=target)`` imports this module on first
use. The encoder runs the version's untouched towers, then the modality's map (the
native route stays the plain model). With ``slerp_t`` > 0 the route also runs the OLD
model, whose weights the artifact carries, and answers ``slerp(map(new(q)), old(q), t)``:
two forwards per query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from training.adapters.maps import EmbeddingMap, slerp
from training.artifacts import Artifact
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer
from training.errors import ArtifactError
from training.versions import artifact_spec, native_model, register_route

MAPS_FILE = "adapter_maps.safetensors"
OLD_WEIGHTS = "old_model.safetensors"
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


class SlerpEncoder:
    """Two encoders behind one interface: the mapped NEW one and the OLD one, mixed by
    SLERP. A preprocessed image is both models' inputs, flattened and concatenated, so a
    batch still stacks into one tensor."""

    def __init__(self, new: Encoder, old: Encoder, t: float) -> None:
        self.new, self.old, self.t = new, old, t
        self.device = new.device
        self._probe = Image.new("RGB", (8, 8))
        self._shapes = (new.preprocess(self._probe).shape, old.preprocess(self._probe).shape)

    @property
    def embed_dim(self) -> int:
        return self.old.embed_dim

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """[3*H_new*W_new + 3*H_old*W_old]: each model's own preprocessing."""
        return torch.cat([self.new.preprocess(image).flatten(), self.old.preprocess(image).flatten()])

    def image_tensors(self, images: Sequence[Image.Image]) -> torch.Tensor:
        return torch.stack([self.preprocess(im.convert("RGB")) for im in images])

    def encode_texts(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        return self._mix(self.new.encode_texts(texts, batch_size),
                         self.old.encode_texts(texts, batch_size))

    def encode_image_tensors(self, pixels: torch.Tensor, batch_size: int = 256) -> np.ndarray:
        split = int(np.prod(self._shapes[0]))
        new = pixels[:, :split].reshape(len(pixels), *self._shapes[0])
        old = pixels[:, split:].reshape(len(pixels), *self._shapes[1])
        return self._mix(self.new.encode_image_tensors(new, batch_size),
                         self.old.encode_image_tensors(old, batch_size))

    def encode_images(self, images: Sequence[Image.Image], batch_size: int = 256) -> np.ndarray:
        return self.encode_image_tensors(self.image_tensors(images), batch_size)

    def _mix(self, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        mixed = slerp(torch.from_numpy(new), torch.from_numpy(old), self.t)
        return mixed.numpy().astype(np.float32)


@register_route("adapter")
def load_adapter_route(artifact: Artifact, route: dict,
                       device: torch.device | str | None) -> Encoder | SlerpEncoder:
    """The encoder of an "adapter" route: the version's towers, then the fitted maps."""
    for key in ("maps", "maps_file", "method"):
        if key not in route:
            raise ArtifactError(f"version '{artifact.version_id}': adapter route lacks '{key}'")
    maps = load_maps(artifact, route)
    new = Encoder(native_model(artifact), create_tokenizer(artifact_spec(artifact)), device,
                  text_head=maps["text"], image_head=maps["image"])
    if not route.get("slerp_t"):
        return new
    return SlerpEncoder(new, _old_encoder(artifact, route, device), float(route["slerp_t"]))


def _old_encoder(artifact: Artifact, route: dict, device: torch.device | str | None) -> Encoder:
    spec = ModelSpec.from_dict(route["old_model_spec"]).without_weights()
    model = create_model(spec)
    model.load_state_dict(artifact.tensors(route["old_weights"]), strict=True)
    return Encoder(model.eval(), create_tokenizer(spec), device)
