"""SeqFT: sequential fine-tuning with the plain contrastive loss, the lower bound every
continual method must beat on old-domain retention (METHODS.md, "SeqFT").

``ContrastiveStrategy`` is also the base of the other domain methods (Mod-X, CTP,
DNS): it turns the phase's image-caption pairs (English captions) into batches,
selects the trainable parameters, and keeps the optional replay memory
(``replay`` > 0: reservoir of past pairs mixed into each phase's data).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from training.continual.registry import register_strategy
from training.continual.replay import NAMESPACE as REPLAY
from training.continual.replay import ReplayMemory, mix
from training.continual.strategy import (
    PhaseContext,
    PhaseSetup,
    Strategy,
    StrategyConfig,
    select_trainable,
)
from training.contrastive import ContrastiveTask
from training.data import PairDataset
from training.errors import ConfigError
from training.pairs import PairTensors, pair_batches
from training.trainer import Task


@dataclass
class ContrastiveConfig(StrategyConfig):
    """Plain contrastive fine-tuning of every parameter (the optimiser of Mod-X's SeqFT)."""

    warmup: float = 0.2
    replay: int = field(default=0, metadata={
        "help": "images in the replay memory (reservoir of past pairs); 0 disables replay"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay < 0:
            raise ConfigError(f"replay is a number of images >= 0, got {self.replay}")


class ContrastiveStrategy(Strategy):
    """A domain phase trained on image-caption pairs; subclasses change the task and hooks."""

    Config = ContrastiveConfig
    config: ContrastiveConfig

    def task(self, ctx: PhaseContext) -> Task:
        return ContrastiveTask(ctx.model)

    def setup(self, ctx: PhaseContext) -> PhaseSetup:
        params = [p for _, p in select_trainable(ctx.model, self.config.trainable)]
        batches = pair_batches(self.training_pairs(ctx), ctx.options.batch_size, ctx.options.seed)
        return PhaseSetup(self.task(ctx), batches, [{"params": params}])

    def training_pairs(self, ctx: PhaseContext) -> PairTensors:
        """The phase's pairs, plus the replay memory of earlier phases when there is one."""
        pairs = ctx.pairs()
        memory = self._memory(ctx)
        return mix(pairs, memory.as_pairs()) if memory is not None and len(memory) else pairs

    def seed(self, ctx: PhaseContext, prior: PairDataset) -> None:
        if self.config.replay and REPLAY not in ctx.state:
            self._remember(ctx, ctx.pairs(prior))

    def finish(self, ctx: PhaseContext) -> None:
        if self.config.replay:
            self._remember(ctx, ctx.pairs())

    def _memory(self, ctx: PhaseContext) -> ReplayMemory | None:
        if not self.config.replay:
            return None
        if REPLAY not in ctx.state:
            return ReplayMemory.empty(self.config.replay)
        return ReplayMemory.from_state(ctx.state[REPLAY], self.config.replay)

    def _remember(self, ctx: PhaseContext, pairs: PairTensors) -> None:
        memory = self._memory(ctx)
        assert memory is not None
        # seeded by the phase's seed and how much the reservoir has seen: reproducible
        memory.add(pairs, np.random.default_rng([ctx.options.seed, memory.seen]))
        ctx.state[REPLAY] = memory.to_state()


@register_strategy("seqft")
class SeqFT(ContrastiveStrategy):
    """Sequential fine-tuning: L = L_clip, every parameter trains."""
