"""The one embed function: one text forward and one image forward per batch of items,
with any encoder view that has ``encode_texts`` and ``encode_images`` (a training
``Encoder``, the gateway's ``Embedder`` on its device lane, or ``Pixels``: a batch the
backfill's reader preprocessed ahead of the forward)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

class Encodes(Protocol):
    def encode_texts(self, texts: list[str]) -> np.ndarray: ...  # [N, D]

    def encode_images(self, images: list[Any]) -> np.ndarray: ...  # [N, D]


class Embeddable(Protocol):
    """An item to embed: its text and/or image (None: it has none of that kind)."""

    @property
    def text(self) -> str | None: ...

    @property
    def image(self) -> Any: ...


def embed(encoder: Encodes, items: Sequence[Embeddable]) -> list[dict[str, np.ndarray]]:
    """Per item, kind -> [D] vector: one forward per kind for the items that have it."""
    vectors: list[dict[str, np.ndarray]] = [{} for _ in items]
    for kind, encode in (("text", encoder.encode_texts), ("image", encoder.encode_images)):
        order = [n for n, item in enumerate(items) if getattr(item, kind) is not None]
        if order:
            encoded = encode([getattr(items[n], kind) for n in order])
            for n, vector in zip(order, encoded, strict=True):
                vectors[n][kind] = vector
    return vectors


class EncodesTensors(Protocol):
    def encode_texts(self, texts: list[str]) -> np.ndarray: ...  # [N, D]

    def encode_image_tensors(self, pixels: torch.Tensor) -> np.ndarray: ...  # [N, D]


class Pixels:
    """An encoder view whose images are the rows of one preprocessed batch (``pixels``,
    [k, 3, H, W]): an item's image is its row, and ``embed`` asks for every row in order,
    so the batch goes to the forward as it is, without a copy."""

    def __init__(self, encoder: EncodesTensors, pixels: torch.Tensor | None) -> None:
        self.encoder, self.pixels = encoder, pixels

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode_texts(texts)

    def encode_images(self, rows: list[int]) -> np.ndarray:
        if self.pixels is None or rows != list(range(len(self.pixels))):
            raise ValueError(f"images must be the rows of the preprocessed batch in order, "
                             f"got {rows[:8]}")
        return self.encoder.encode_image_tensors(self.pixels)
