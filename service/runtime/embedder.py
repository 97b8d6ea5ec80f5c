"""A loaded model version embedding into one space, with a micro-batcher per modality.

Images are preprocessed to pixel tensors by the caller's thread before they are
queued, so the shared device lane only runs model forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import torch
from open_clip.model import get_model_preprocess_cfg
from PIL import Image

from service.runtime.batching import MicroBatcher
from training.encoders import Encoder, pixels_many


@dataclass(frozen=True)
class Batching:
    max_size: int
    max_wait_s: float


class Embedder:
    def __init__(self, encoder: Encoder, version: str, space: str, route: str,
                 lane: Executor, batching: Batching,
                 on_batch: Callable[[str, int], None] | None = None) -> None:
        self.encoder = encoder
        self.version = version
        self.space = space
        self.route = route  # the route kind that reaches ``space``, e.g. "native"
        self.lane = lane  # one thread per device: forwards never compete for it
        self._texts = MicroBatcher(self._encode_texts, lane, batching.max_size,
                                   batching.max_wait_s, _tagged(on_batch, "text"))
        self._images = MicroBatcher(self._encode_pixels, lane, batching.max_size,
                                    batching.max_wait_s, _tagged(on_batch, "image"))
        # (this route's vector, the towers' own) from one forward: a rerank's two queries
        self._text_pairs = MicroBatcher(self._encode_text_pairs, lane, batching.max_size,
                                        batching.max_wait_s, _tagged(on_batch, "text"))
        self._image_pairs = MicroBatcher(self._encode_pixel_pairs, lane, batching.max_size,
                                         batching.max_wait_s, _tagged(on_batch, "image"))

    @property
    def dim(self) -> int:
        return self.encoder.embed_dim

    @property
    def image_side(self) -> int:
        """The longer side of the model's input: its preprocess resizes every image to it,
        so decoding far more pixels than that is wasted (``service.usecases.media``)."""
        size = get_model_preprocess_cfg(self.encoder.model).get("size", 224)
        return int(max(size)) if isinstance(size, (tuple, list)) else int(size)

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """[3, H, W] model input for one image: the model's preprocess, its tensor steps in
        numpy (``pixels_many``; blocking: run it off the event loop)."""
        return self.pixels_many([image])[0]

    def _preprocess(self, image: Image.Image) -> torch.Tensor:
        return self.encoder.preprocess(image.convert("RGB"))  # type: ignore[no-any-return]

    def pixels_many(self, images: Iterable[Image.Image]) -> list[torch.Tensor]:
        """``pixels`` of each image, the same values, the preprocess's tensor steps once for
        the stacked images, in numpy (``training.encoders.pixels_many``: in the gateway
        only the device lane runs torch, ``service.runtime.threads``)."""
        return pixels_many(self.encoder.preprocess, images, self._preprocess)

    async def embed_text(self, text: str) -> np.ndarray:
        """[D] embedding of one query text, batched with concurrent ones."""
        return await self._texts.submit(text)

    async def embed_pixels(self, pixels: torch.Tensor) -> np.ndarray:
        """[D] embedding of one preprocessed image, batched with concurrent ones."""
        return await self._images.submit(pixels)

    async def embed_text_group(self, texts: Sequence[str]) -> list[np.ndarray]:
        """[D] embedding of each text of a group that is whole already (a rerank's
        candidates): its forward starts without waiting for company."""
        return await self._texts.submit_group(texts)

    async def embed_pixels_group(self, pixels: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """``embed_text_group`` for preprocessed images."""
        return await self._images.submit_group(pixels)

    def shares_towers(self, native: Embedder) -> bool:
        """Whether ``native``'s vectors are this embedder's towers' own outputs: the same
        version, ``native`` its native route and both on the version's unchanged towers
        (an adapter route, or XBT's projector on stage 1's model). Then one forward gives
        both (``embed_text_both``) where a rerank would run two."""
        a, b = self.encoder, native.encoder
        return (self.version == native.version and isinstance(a, Encoder)
                and isinstance(b, Encoder) and a.native_towers and b.native_towers
                and b.text_head is None and b.image_head is None)

    async def embed_text_both(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(this route's [D], the towers' own [D_native]) of one query text, one forward."""
        return await self._text_pairs.submit(text)

    async def embed_pixels_both(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``embed_text_both`` for one preprocessed image."""
        return await self._image_pairs.submit(pixels)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """[N, D] for an ingest batch (blocking; submit it to ``lane``)."""
        return self.encoder.encode_texts(list(texts))

    def encode_pixels(self, pixels: Sequence[torch.Tensor]) -> np.ndarray:
        """[N, D] for an ingest batch of preprocessed images (blocking; submit it to
        ``lane``)."""
        return self.encoder.encode_image_tensors(torch.stack(list(pixels)))

    def _encode_texts(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.encoder.encode_texts(texts))

    def _encode_pixels(self, pixels: list[torch.Tensor]) -> list[np.ndarray]:
        return list(self.encoder.encode_image_tensors(torch.stack(pixels)))  # [N, 3, H, W]

    def _encode_text_pairs(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        routed, native = self.encoder.encode_texts_both(texts)
        return list(zip(routed, native))

    def _encode_pixel_pairs(self, pixels: list[torch.Tensor],
                            ) -> list[tuple[np.ndarray, np.ndarray]]:
        routed, native = self.encoder.encode_image_tensors_both(torch.stack(pixels))
        return list(zip(routed, native))


def _tagged(on_batch: Callable[[str, int], None] | None,
            modality: str) -> Callable[[int], None] | None:
    if on_batch is None:
        return None
    return lambda size: on_batch(modality, size)
