"""Experience replay: a reservoir sample of past image-caption pairs (the ER variant of
CTP, Zhu et al. 2023, Sec. 5; reservoir sampling is Vitter's Algorithm R, 1985).

Every image seen by a phase enters the reservoir with probability capacity / seen, so
the memory is a uniform sample of all past phases' images whatever their sizes. The
memory is saved with the model version (state namespace ``replay``) and mixed into
the next phase's training pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from training.pairs import PairTensors

NAMESPACE = "replay"


@dataclass
class ReplayMemory:
    capacity: int
    pixels: torch.Tensor  # [n, 3, H, W] float16, preprocessed
    tokens: torch.Tensor  # [n, C, context] int32, C = most captions per image
    counts: torch.Tensor  # [n] int32, captions of each image
    seen: int = 0  # images offered to the reservoir so far

    @classmethod
    def empty(cls, capacity: int) -> ReplayMemory:
        return cls(capacity, torch.zeros(0, 0, 0, 0, dtype=torch.float16),
                   torch.zeros(0, 0, 0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))

    def __len__(self) -> int:
        return len(self.counts)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], capacity: int) -> ReplayMemory:
        memory = cls(capacity, state["pixels"], state["tokens"], state["counts"],
                     int(state["seen"].item()))
        if len(memory) > capacity:  # a smaller memory keeps a prefix: still a uniform sample
            memory.pixels, memory.tokens, memory.counts = (
                memory.pixels[:capacity], memory.tokens[:capacity], memory.counts[:capacity])
        return memory

    def to_state(self) -> dict[str, torch.Tensor]:
        return {"pixels": self.pixels, "tokens": self.tokens, "counts": self.counts,
                "seen": torch.tensor([self.seen], dtype=torch.int64)}

    def add(self, pairs: PairTensors, rng: np.random.Generator) -> None:
        """Offer every image of ``pairs`` (with all its captions) to the reservoir."""
        groups = pairs.captions_of()
        width = max(max(len(g) for g in groups), self.tokens.shape[1] if len(self) else 0)
        self._fit(pairs, width)
        rows = torch.zeros(len(groups), width, pairs.tokens.shape[1], dtype=torch.int32)
        for image, captions in enumerate(groups):
            rows[image, :len(captions)] = pairs.tokens[captions].to(torch.int32)
        counts = torch.tensor([len(g) for g in groups], dtype=torch.int32)
        kept = len(self)
        pending: list[int] = []  # images to append, in slot order after the kept ones
        for image in range(len(groups)):
            self.seen += 1
            if kept + len(pending) < self.capacity:
                pending.append(image)
                continue
            slot = int(rng.integers(self.seen))  # uniform in [0, seen): Algorithm R
            if slot < kept:
                self.pixels[slot] = pairs.pixels[image]
                self.tokens[slot], self.counts[slot] = rows[image], counts[image]
            elif slot < self.capacity:
                pending[slot - kept] = image
        index = torch.tensor(pending, dtype=torch.long)
        self.pixels = torch.cat([self.pixels, pairs.pixels[index].half()])
        self.tokens = torch.cat([self.tokens, rows[index]])
        self.counts = torch.cat([self.counts, counts[index]])

    def _fit(self, pairs: PairTensors, width: int) -> None:
        """Give an empty memory its tensor shapes; pad the caption axis up to ``width``."""
        if not len(self):
            self.pixels = pairs.pixels[:0].half()
            self.tokens = torch.zeros(0, width, pairs.tokens.shape[1], dtype=torch.int32)
        elif width > self.tokens.shape[1]:
            pad = torch.zeros(len(self), width - self.tokens.shape[1], self.tokens.shape[2],
                              dtype=torch.int32)
            self.tokens = torch.cat([self.tokens, pad], dim=1)

    def as_pairs(self) -> PairTensors:
        """The memory as training pairs (only real captions, not the padding rows)."""
        keep = torch.arange(self.tokens.shape[1])[None, :] < self.counts[:, None]  # [n, C]
        owner = torch.arange(len(self))[:, None].expand_as(keep)[keep]  # [M]
        tokens = self.tokens[keep].long()  # [M, context]
        return PairTensors(self.pixels, tokens, owner, [""] * len(owner))


def mix(pairs: PairTensors, memory: PairTensors) -> PairTensors:
    """The phase's pairs followed by the memory's (caption owners shifted past the phase's)."""
    return PairTensors(torch.cat([pairs.pixels.half(), memory.pixels.half()]),
                       torch.cat([pairs.tokens, memory.tokens]),
                       torch.cat([pairs.owner, memory.owner + len(pairs.pixels)]),
                       pairs.captions + memory.captions)
