"""CTP: compatible momentum contrast + topology preservation (METHODS.md, "CTP"; Zhu et al.,
ICCV 2023).

Three models: the current one (trained), the old one (frozen parent) and a momentum
model (a fresh copy of the current model at the start of every phase, never in the
optimiser). CTP's masked-language-modelling terms are left out: they need a fusion
encoder, and open_clip models are dual encoders without one. Everything else
applies: L = L_itc + L_cmc + L_c + L_s. The image/text feature queues of momentum
features persist across phases (state namespace ``ctp``). The ER variant is the
same strategy with ``replay`` > 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from training.continual.registry import register_strategy
from training.continual.seqft import ContrastiveConfig, ContrastiveStrategy
from training.continual.strategy import PhaseContext
from training.distributed import gather
from training.encoders import model_embed_dim
from training.errors import ConfigError
from training.losses import (
    clip_loss,
    ctp_cross_topology_loss,
    ctp_momentum_contrast_loss,
    ctp_same_topology_loss,
)
from training.trainer import Task

NAMESPACE = "ctp"


@dataclass
class CtpConfig(ContrastiveConfig):
    lr: float = 1e-4
    weight_decay: float = 0.05
    warmup: float = 0.0
    min_lr_ratio: float = 0.01  # cosine from 1e-4 down to 1e-6
    tau: float = field(default=0.07, metadata={"help": "fixed temperature of L_cmc, L_c, L_s"})
    queue_size: int = field(default=1024, metadata={"help": "K momentum features per modality"})
    momentum: float = field(default=0.9, metadata={
        "help": "m of the compatible update (phases after the first CTP phase)"})
    first_momentum: float = field(default=0.995, metadata={
        "help": "m of the plain update theta_c <- m theta_c + (1-m) theta_t (first CTP phase)"})
    self_similarity: float = field(default=-1000.0, metadata={
        "help": "value replacing each row's self-similarity in L_s, before dividing by tau"})
    itc_weight: float = 1.0
    cmc_weight: float = 1.0
    cross_weight: float = 1.0
    same_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tau <= 0 or self.queue_size < 0:
            raise ConfigError("tau must be > 0 and queue_size >= 0")
        for name in ("momentum", "first_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")


class FeatureQueues:
    """Ring buffers of the K latest momentum image and text features."""

    def __init__(self, size: int, dim: int, state: dict[str, torch.Tensor] | None = None,
                 device: torch.device | str = "cpu") -> None:
        if state is None:
            self.image = torch.zeros(size, dim, device=device)  # [K, D]
            self.text = torch.zeros(size, dim, device=device)  # [K, D]
            self.ptr, self.filled = 0, 0
        else:
            self.image = state["queue_image"].float().to(device)
            self.text = state["queue_text"].float().to(device)
            self.ptr, self.filled = int(state["queue_ptr"].item()), int(state["filled"].item())

    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([n, D], [n, D]) the filled part (slot order does not matter to the loss)."""
        return self.image[:self.filled], self.text[:self.filled]

    @torch.no_grad()
    def enqueue(self, image: torch.Tensor, text: torch.Tensor) -> None:
        size = len(self.image)
        count = min(len(image), size)
        if count == 0:  # K = 0 (the paper's no-queue ablation): ``x[-0:]`` would be all of x
            return
        slots = (self.ptr + torch.arange(count, device=self.image.device)) % max(size, 1)
        self.image[slots], self.text[slots] = image[-count:], text[-count:]
        self.ptr = (self.ptr + count) % max(size, 1)
        self.filled = min(size, self.filled + count)

    def state(self) -> dict[str, torch.Tensor]:
        return {"queue_image": self.image.cpu(), "queue_text": self.text.cpu(),
                "queue_ptr": torch.tensor([self.ptr]), "filled": torch.tensor([self.filled])}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Back to a saved ``state`` (a resumed run), in place."""
        self.image.copy_(state["queue_image"])
        self.text.copy_(state["queue_text"])
        self.ptr, self.filled = int(state["queue_ptr"].item()), int(state["filled"].item())


class CtpTask:
    def __init__(self, model: torch.nn.Module, old: torch.nn.Module, momentum: torch.nn.Module,
                 queues: FeatureQueues, cfg: CtpConfig, compatible: bool) -> None:
        self.model, self.old, self.momentum, self.queues, self.cfg = model, old, momentum, queues, cfg
        self.compatible = compatible
        # parameter triples (momentum, current, old), aligned by name once
        current, previous = dict(model.named_parameters()), dict(old.named_parameters())
        self.triples = [(p, current[n], previous[n]) for n, p in momentum.named_parameters()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a resumed run needs besides the trained weights: the momentum model and
        the queues (``training.trainer.TrainState``)."""
        momentum = {f"momentum/{k}": v.detach().cpu() for k, v in
                    self.momentum.state_dict().items()}
        return {**momentum, **{f"queues/{k}": v for k, v in self.queues.state().items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.momentum.load_state_dict({k.removeprefix("momentum/"): v for k, v in state.items()
                                       if k.startswith("momentum/")})
        self.queues.load({k.removeprefix("queues/"): v for k, v in state.items()
                          if k.startswith("queues/")})

    @torch.no_grad()
    def update_momentum(self) -> None:
        """Compatible: theta_c <- m theta_c + (1-m)/2 theta_t + (1-m)/2 theta_{t-1};
        first CTP phase: theta_c <- m0 theta_c + (1-m0) theta_t."""
        m = self.cfg.momentum if self.compatible else self.cfg.first_momentum
        for theta_c, theta_t, theta_old in self.triples:
            if self.compatible:
                theta_c.mul_(m).add_(theta_t, alpha=(1 - m) / 2).add_(theta_old, alpha=(1 - m) / 2)
            else:
                theta_c.mul_(m).add_(theta_t, alpha=1 - m)

    def losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg, device = self.cfg, self.model.logit_scale.device
        pixels, tokens = batch[0].to(device), batch[1].to(device)
        self.update_momentum()  # before the momentum features of this step
        # [B, D] each, the global batch under torch.distributed (rank order)
        image = gather(self.model.encode_image(pixels, normalize=True))
        text = gather(self.model.encode_text(tokens, normalize=True))
        with torch.no_grad():
            m_image = gather(self.momentum.encode_image(pixels, normalize=True))
            m_text = gather(self.momentum.encode_text(tokens, normalize=True))
            old_image = gather(self.old.encode_image(pixels, normalize=True))
            old_text = gather(self.old.encode_text(tokens, normalize=True))
        q_image, q_text = self.queues.features()  # [n, D] each, n <= K
        losses = {
            "itc_loss": cfg.itc_weight * clip_loss(image, text, self.model.logit_scale.exp()),
            "cmc_loss": cfg.cmc_weight * ctp_momentum_contrast_loss(
                image, text, m_image, m_text, q_image, q_text, cfg.tau),
            "cross_topology_loss": cfg.cross_weight * ctp_cross_topology_loss(
                image, text, old_image, old_text, cfg.tau),
            "same_topology_loss": cfg.same_weight * ctp_same_topology_loss(
                image, text, old_image, old_text, cfg.tau, cfg.self_similarity),
        }
        # after the loss: scored first, then queued; the global batch in rank order, so
        # every rank's queues hold the same features in the same slots
        self.queues.enqueue(m_image, m_text)
        return losses


@register_strategy("ctp")
class Ctp(ContrastiveStrategy):
    Config = CtpConfig
    config: CtpConfig

    def check(self, ctx: PhaseContext) -> None:
        stored = ctx.state.get(NAMESPACE)
        if stored is not None and len(stored["queue_image"]) != self.config.queue_size:
            raise ConfigError(f"the parent's CTP queues hold {len(stored['queue_image'])} "
                              f"features; set queue_size={len(stored['queue_image'])}")

    def task(self, ctx: PhaseContext) -> Task:
        stored = ctx.state.get(NAMESPACE)
        self.queues = FeatureQueues(self.config.queue_size, model_embed_dim(ctx.model), stored,
                                    ctx.device)
        # the first CTP phase (no saved queues) uses the plain momentum rule
        return CtpTask(ctx.model, ctx.frozen_copy(), ctx.frozen_copy(), self.queues,
                       self.config, compatible=stored is not None)

    def finish(self, ctx: PhaseContext) -> None:
        super().finish(ctx)
        ctx.state[NAMESPACE] = self.queues.state()
