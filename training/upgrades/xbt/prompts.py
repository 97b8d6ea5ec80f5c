"""Visual soft prompts (VPT-shallow, Jia et al. 2022) for open_clip ViT vision towers.

XBT prepends learned prompt tokens to the vision tower's patch tokens (none on the
text side: phi was pretrained on the text tower's unchanged distribution). The
tokens go in right after the class token, ``[CLS, P_1..P_n, patches]``, and come
out again after the transformer, so the tower's own pooling (class token, or mean
of the patch tokens) reads exactly the tokens it was built for.

They are attached with forward hooks on ``visual.transformer`` rather than by
editing the tower, so the base model's modules and state dict stay as they were,
and switching the prompts off gives back the original computation exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from open_clip.transformer import VisionTransformer
from torch import nn

from training.errors import ConfigError


class VisualPrompts(nn.Module):
    """``n`` learned tokens [n, width] inserted after the class token of a ViT tower."""

    def __init__(self, n_tokens: int, width: int) -> None:
        super().__init__()
        if n_tokens < 1:
            raise ConfigError(f"need at least one prompt token, got {n_tokens}")
        # The scale of open_clip's own class/positional embedding init (width ** -0.5).
        self.tokens = nn.Parameter(torch.randn(n_tokens, width) * width ** -0.5)
        self.enabled = True
        self._handles: list[Any] = []

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def attach(self, visual: nn.Module) -> None:
        """Register on ``visual`` (a ViT tower): the module owns the tokens, hooks add them."""
        check_promptable(visual)
        visual.add_module("soft_prompts", self)
        transformer = visual.transformer
        self._handles = [transformer.register_forward_pre_hook(self._insert),
                         transformer.register_forward_hook(self._strip)]

    def detach_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _insert(self, module: nn.Module, args: tuple) -> tuple | None:
        if not self.enabled:
            return None
        x = args[0]  # [B, 1 + G, W] (batch first): class token, then G patch tokens
        prompts = self.tokens.to(x.dtype).unsqueeze(0).expand(x.shape[0], -1, -1)  # [B, n, W]
        return (torch.cat([x[:, :1], prompts, x[:, 1:]], dim=1), *args[1:])  # [B, 1 + n + G, W]

    def _strip(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if not self.enabled:
            return None
        # [B, 1 + n + G, W] -> [B, 1 + G, W]: pooling sees the class token at 0, then patches.
        return torch.cat([output[:, :1], output[:, 1 + self.n_tokens:]], dim=1)


def check_promptable(visual: nn.Module) -> None:
    """Raise ``ConfigError`` unless ``visual`` is an open_clip ViT with batch-first tokens."""
    if not isinstance(visual, VisionTransformer):
        raise ConfigError(
            f"the new model's vision tower ({type(visual).__name__}) cannot take visual soft "
            f"prompts: they need an open_clip ViT (VisionTransformer) tower. Train without them "
            f"with --set prompts=0 (XbtConfig(prompts=0)).")
    if not getattr(visual.transformer, "batch_first", True):
        raise ConfigError("visual soft prompts need a batch-first vision transformer; "
                          "use --set prompts=0 (XbtConfig(prompts=0))")
