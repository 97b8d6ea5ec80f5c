"""Image-caption pairs as tensors, and the batch stream that training loops consume.

Images are preprocessed once with the model's own eval transform and kept as
float16 ([N, 3, H, W]); captions are tokenized once ([M, context]). Each epoch
visits every image once in a seeded random order, pairing it with one of its
captions drawn at random.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from training.data import PairDataset
from training.distributed import World, global_batch_size
from training.encoders import Encoder
from training.errors import DataError


@dataclass
class PairTensors:
    pixels: torch.Tensor  # [N, 3, H, W] float16, preprocessed
    tokens: torch.Tensor  # [M, context] token ids
    owner: torch.Tensor  # [M] image index of each caption
    captions: list[str]

    def __post_init__(self) -> None:
        if len(self.pixels) == 0 or len(self.tokens) == 0:
            raise DataError("no image-caption pairs to train on (empty dataset)")

    def captions_of(self) -> list[np.ndarray]:
        """Per image, the indices of its captions."""
        order = np.argsort(self.owner.numpy(), kind="stable")
        counts = np.bincount(self.owner.numpy(), minlength=len(self.pixels))
        return np.split(order, np.cumsum(counts)[:-1])


def image_pixels(dataset: PairDataset, encoder: Encoder, show_progress: bool = False,
                 desc: str = "preprocess") -> torch.Tensor:
    """[N, 3, H, W] float16 preprocessed images of a dataset."""
    rows = [encoder.preprocess(dataset.load_image(i).convert("RGB")).half()
            for i in tqdm(range(len(dataset)), desc=desc,
                          disable=not (show_progress and World.current().is_main))]
    if not rows:
        raise DataError("the dataset has no images")
    return torch.stack(rows)


def build_pairs(dataset: PairDataset, encoder: Encoder, languages: Sequence[str] = ("en",),
                show_progress: bool = False, pixels: torch.Tensor | None = None) -> PairTensors:
    texts: list[str] = []
    owners: list[int] = []
    for lang in languages:
        lang_texts, lang_owner = dataset.captions(lang)
        texts += lang_texts
        owners += lang_owner
    if pixels is None:
        pixels = image_pixels(dataset, encoder, show_progress)
    return PairTensors(pixels, encoder.tokenize(texts), torch.tensor(owners), texts)


def pair_index_batches(pairs: PairTensors, batch_size: int,
                       seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (image indices [B], caption indices [B]): each epoch visits every image once
    in a seeded order, each with one of its captions drawn at random.

    Under torch.distributed every rank draws the same global batch and keeps its shard
    ([B/N] each; ``World.shard``)."""
    world = World.current()
    rng = np.random.default_rng(seed)
    groups = pairs.captions_of()
    usable = np.array([i for i, g in enumerate(groups) if len(g)])
    if len(usable) < 2:
        raise DataError("need at least 2 images with captions to form a contrastive batch")
    batch_size = global_batch_size(batch_size, len(usable), world)
    while True:
        order = rng.permutation(usable)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            images = order[start:start + batch_size]
            captions = [groups[i][rng.integers(len(groups[i]))] for i in images]
            yield world.shard((torch.as_tensor(images), torch.as_tensor(np.array(captions))))


def pair_batches(pairs: PairTensors, batch_size: int,
                 seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (pixels [B,3,H,W] float32, tokens [B,ctx]) batches, one caption per image."""
    for images, captions in pair_index_batches(pairs, batch_size, seed):
        yield pairs.pixels[images].float(), pairs.tokens[captions]
