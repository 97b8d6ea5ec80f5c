"""Losses, each a small module or function on L2-normalised features.

Contrastive losses take an exponentiated logit scale, never the model
(as open_clip's ``loss.py`` does). Continual and XBT losses live here too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MAX_LOGIT_SCALE = 100.0


def clip_loss(image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP, Radford et al. 2021).

    image, text: [B, D] L2-normalised; scale: exp(logit_scale), clamped to <= 100.
    L = (CE(s S, y) + CE(s S^T, y)) / 2 with S = image @ text.T and y = arange(B).
    """
    scale = torch.as_tensor(scale, device=image.device).clamp(max=MAX_LOGIT_SCALE)
    logits = scale * image @ text.t()  # [B, B]
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


class ClipLoss(nn.Module):
    """Module form of :func:`clip_loss` (plain contrastive training, SeqFT)."""

    def forward(self, image: torch.Tensor, text: torch.Tensor,
                scale: torch.Tensor | float) -> torch.Tensor:
        return clip_loss(image, text, scale)
