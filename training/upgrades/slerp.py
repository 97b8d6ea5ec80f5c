"""SLERP mixing with the old model's own query (SLERP-BC, Ricci et al.): a route's answer
is ``slerp(routed(q), old(q), t)``. Shared by the route kinds that offer it (``adapter``
and XBT's ``projector``): the artifact carries OLD's weights, and the route runs BOTH
encoders per query (two forwards' latency).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from training.artifacts import Artifact, model_state
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer
from training.errors import ConfigError
from training.routes import native_model
from training.upgrades.adapter.maps import slerp

OLD_WEIGHTS = "old_model.safetensors"


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


def with_slerp(routed: Encoder, artifact: Artifact, route: dict,
               device: torch.device | str | None) -> Encoder | SlerpEncoder:
    """``routed`` alone, or mixed with the old model when the route sets ``slerp_t``."""
    if not route.get("slerp_t"):
        return routed
    return SlerpEncoder(routed, old_encoder(artifact, route, device), float(route["slerp_t"]))


def old_encoder(artifact: Artifact, route: dict, device: torch.device | str | None) -> Encoder:
    spec = ModelSpec.from_dict(route["old_model_spec"]).without_weights()
    model = create_model(spec)
    model.load_state_dict(artifact.tensors(route["old_weights"]), strict=True)
    return Encoder(model.eval(), create_tokenizer(spec), device)


def old_weights(old: Artifact | None, target_space: str, route: dict[str, Any],
                 ) -> dict[str, torch.Tensor]:
    """SLERP runs the OLD model natively: it must be the gallery space's own model."""
    if old is None or old.space != target_space:
        raise ConfigError(f"slerp_t > 0 needs the old model whose native space is "
                          f"'{target_space}' (the gallery's); got "
                          f"{'none' if old is None else repr(old.space)}: set slerp_t=0")
    route["old_model_spec"] = old.manifest["model_spec"]
    route["old_weights"] = OLD_WEIGHTS
    return model_state(native_model(old))
