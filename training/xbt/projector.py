"""The XBT projector phi: maps a NEW model's embeddings into the OLD model's space.

METHODS.md, XBT: ``Linear - LayerNorm - GELU - Linear - LayerNorm - GELU - Linear``,
hidden width 4 x the old embedding dim, input = new dim, output = old dim, no dropout
(the paper found dropout hurt). Stage 1 trains all of phi; stage 2 trains only its
LayerNorms, so phi's linear maps keep what the text-only pretraining learned.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from training.errors import ConfigError

HIDDEN_FACTOR = 4


class Projector(nn.Sequential):
    """phi: [..., in_dim] new-space features -> [..., out_dim] old-space features (unnormalised)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int | None = None) -> None:
        hidden = hidden_dim or HIDDEN_FACTOR * out_dim
        if min(in_dim, out_dim, hidden) < 1:
            raise ConfigError(f"projector dims must be positive, got in={in_dim}, "
                              f"hidden={hidden}, out={out_dim}")
        super().__init__(OrderedDict([
            ("fc1", nn.Linear(in_dim, hidden)), ("ln1", nn.LayerNorm(hidden)), ("act1", nn.GELU()),
            ("fc2", nn.Linear(hidden, hidden)), ("ln2", nn.LayerNorm(hidden)), ("act2", nn.GELU()),
            ("fc3", nn.Linear(hidden, out_dim)),
        ]))
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden, out_dim

    def dims(self) -> dict[str, int]:
        """What a route records to rebuild phi: ``{"in_dim", "hidden_dim", "out_dim"}``."""
        return {"in_dim": self.in_dim, "hidden_dim": self.hidden_dim, "out_dim": self.out_dim}

    def layer_norm_parameters(self) -> list[nn.Parameter]:
        """phi's LayerNorm weights and biases: the only part of phi stage 2 trains."""
        return [p for m in self.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()]

    def linear_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules() if isinstance(m, nn.Linear) for p in m.parameters()]

    def train_only_layer_norms(self) -> None:
        """Freeze the linear maps, leave the LayerNorms trainable (stage 2)."""
        for p in self.linear_parameters():
            p.requires_grad_(False)
        for p in self.layer_norm_parameters():
            p.requires_grad_(True)


class ProjectorHead(nn.Module):
    """Raw tower features -> phi's input: phi reads L2-normalised new embeddings (as stage 1
    trained it on), so a route normalises before projecting. ``Encoder`` normalises the output."""

    def __init__(self, phi: Projector) -> None:
        super().__init__()
        self.phi = phi
        self.out_dim = phi.out_dim  # Encoder.embed_dim reads it

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.phi(nn.functional.normalize(features, dim=-1))  # [B, new] -> [B, old]


def to_old_space(phi: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """[B, new_dim] raw tower features -> [B, old_dim] L2-normalised, as the losses take them."""
    return nn.functional.normalize(phi(nn.functional.normalize(features, dim=-1)), dim=-1)
