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
    """phi: [..., in_dim] new-space features -> [..., out_dim] old-space features (unnormalised).

    With ``skip``, phi also has a linear branch ``x W`` (no bias) added to the MLP's output:
    ``XbtConfig(init="procrustes")`` sets W to the closed-form Procrustes fit of stage 1's
    cached text pairs and zeroes ``fc3``, so stage 1 starts from that fit (the skip is a
    linear map: frozen in stage 2 like phi's other linear maps)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int | None = None,
                 skip: bool = False) -> None:
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
        self.mlp_layers = list(self._modules)  # the sequence; ``skip`` is not part of it
        self.has_skip = skip
        if skip:
            self.add_module("skip", nn.Linear(in_dim, out_dim, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name in self.mlp_layers:
            y = self._modules[name](y)  # type: ignore[misc]
        return y + self.skip(x) if self.has_skip else y

    def start_from(self, weight: torch.Tensor) -> None:
        """Make phi the linear map ``x weight`` ([in_dim, out_dim]): skip = weight, fc3 = 0."""
        if not self.has_skip:
            raise ConfigError("start_from needs a projector built with skip=True")
        with torch.no_grad():
            self.skip.weight.copy_(weight.T)
            nn.init.zeros_(self.fc3.weight)
            nn.init.zeros_(self.fc3.bias)

    def dims(self) -> dict[str, int | bool]:
        """What a route records to rebuild phi: ``{"in_dim", "hidden_dim", "out_dim"}``
        (and ``"skip": True`` for a phi with a skip branch)."""
        dims: dict[str, int | bool] = {"in_dim": self.in_dim, "hidden_dim": self.hidden_dim,
                                       "out_dim": self.out_dim}
        if self.has_skip:
            dims["skip"] = True
        return dims

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
