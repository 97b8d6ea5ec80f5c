"""Mod-X: off-diagonal information distillation from the frozen old model (METHODS.md,
"Mod-X"; Ni et al., ICML 2023). L = L_clip + alpha * L_kd on the current batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from training.continual.registry import register_strategy
from training.continual.seqft import ContrastiveConfig, ContrastiveStrategy
from training.continual.strategy import PhaseContext
from training.distributed import gather
from training.errors import ConfigError
from training.losses import clip_loss, modx_distill_loss
from training.trainer import Task


@dataclass
class ModXConfig(ContrastiveConfig):
    lr: float = 5e-4
    weight_decay: float = 0.1
    warmup: float = 0.2
    alpha: float = field(default=20.0, metadata={
        "help": "weight of the sum-reduced distillation KL (meaningful with the sum)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {self.alpha}")


class ModXTask:
    """Current model + frozen old model; both encode the same batch. Under torch.distributed
    both losses see the global batch: the distillation's rows and their correction are
    those of one process with the whole batch."""

    def __init__(self, model: torch.nn.Module, old: torch.nn.Module, alpha: float) -> None:
        self.model, self.old, self.alpha = model, old, alpha

    def losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        device = self.model.logit_scale.device
        pixels, tokens = batch[0].to(device), batch[1].to(device)
        image = gather(self.model.encode_image(pixels, normalize=True))  # [B, D]
        text = gather(self.model.encode_text(tokens, normalize=True))  # [B, D]
        with torch.no_grad():
            old_image = gather(self.old.encode_image(pixels, normalize=True))  # [B, D]
            old_text = gather(self.old.encode_text(tokens, normalize=True))  # [B, D]
        return {"contrastive_loss": clip_loss(image, text, self.model.logit_scale.exp()),
                "distill_loss": self.alpha * modx_distill_loss(image, text, old_image, old_text)}


@register_strategy("modx")
class ModX(ContrastiveStrategy):
    Config = ModXConfig
    config: ModXConfig

    def task(self, ctx: PhaseContext) -> Task:
        return ModXTask(ctx.model, ctx.frozen_copy(), self.config.alpha)
