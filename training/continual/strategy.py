"""What a continual strategy is: a validated config, the phase it sees, what it hands the loop.

The phase runner builds a ``PhaseContext`` (parent model, tokenizer, the phase's data,
the state earlier phases saved), asks the strategy to ``check`` it, ``seed`` state
from prior data, ``setup`` the task/batches/parameter groups/hooks for the generic
loop, and after training to ``finish`` (update the state saved with the new version).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from training.artifacts import Artifact
from training.config import MethodConfig
from training.data import PairDataset
from training.encoders import Encoder, ModelSpec
from training.errors import ConfigError
from training.pairs import PairTensors, build_pairs
from training.trainer import Task, TrainConfig

State = dict[str, dict[str, torch.Tensor]]  # namespace ("ctp", "dns", ...) -> tensors
Hook = Callable[[torch.optim.Optimizer], None]


@dataclass
class StrategyConfig(MethodConfig):
    """Optimisation settings every strategy has; subclasses add fields and change defaults.

    ``from_dict`` (strict, strings parsed by field type) comes from ``MethodConfig``."""

    lr: float = field(default=5e-4, metadata={"help": "peak learning rate"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW decoupled weight decay"})
    warmup: float = field(default=0.0, metadata={"help": "fraction of steps with linear warmup"})
    schedule: str = field(default="cosine", metadata={"help": "cosine | linear | constant"})
    min_lr_ratio: float = field(default=0.0, metadata={"help": "final lr / lr"})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    grad_clip: float = field(default=1.0, metadata={"help": "max global grad norm; 0 disables"})
    trainable: tuple[str, ...] = field(default=("*",), metadata={
        "help": "parameter-name patterns (fnmatch) that train; everything else is frozen"})

    def __post_init__(self) -> None:
        self.trainable = tuple(self.trainable)
        if not self.trainable:
            raise ConfigError("trainable is empty: name at least one parameter pattern")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("grad_clip and weight_decay must be >= 0")
        self.train_config(steps=1, batch_size=2, seed=0)  # TrainConfig validates the rest

    def train_config(self, steps: int, batch_size: int, seed: int) -> TrainConfig:
        return TrainConfig(steps=steps, batch_size=batch_size, lr=self.lr,
                           weight_decay=self.weight_decay, warmup=self.warmup,
                           schedule=self.schedule, min_lr_ratio=self.min_lr_ratio,
                           grad_clip=self.grad_clip, adam_eps=self.adam_eps, seed=seed)


@dataclass
class PhaseOptions:
    """How one phase runs: its length, its slice of the data, where and with what id."""

    steps: int = 200
    batch_size: int = 128
    seed: int = 0
    domain: str | None = None  # domain methods: train on this domain only (None: all)
    language: str | None = None  # language methods: the language to add
    version_id: str | None = None  # default: generated
    device: str | None = None
    show_progress: bool = True
    # the whole training state is saved here every checkpoint_every steps; a phase that
    # finds a saved state there resumes from it (training.trainer.TrainState)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 2:
            raise ConfigError(f"a phase needs steps >= 1 and batch_size >= 2, got "
                              f"{self.steps} and {self.batch_size}")
        if self.checkpoint_every < 0 or (self.checkpoint_every and not self.checkpoint_dir):
            raise ConfigError(f"checkpoint_every ({self.checkpoint_every}) must be >= 0, and "
                              f"> 0 only with a checkpoint_dir")


@dataclass
class PhaseContext:
    """Everything a strategy sees of one phase; ``spec``/``tokenizer``/``model`` may be
    replaced by the strategy (a language phase grows the vocabulary)."""

    parent: Artifact
    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: Any
    data: PairDataset
    options: PhaseOptions
    state: State
    device: torch.device
    languages: list[str]
    _pairs: PairTensors | None = None

    def encoder(self) -> Encoder:
        return Encoder(self.model, self.tokenizer, self.device)

    def pairs(self, dataset: PairDataset | None = None, language: str = "en") -> PairTensors:
        """Preprocessed pixels + ``language`` tokens of ``dataset``; the phase's own data
        (the default, English) is preprocessed once and cached."""
        if dataset is None and self._pairs is not None and language == "en":
            return self._pairs
        training = self.model.training
        pairs = build_pairs(self.data if dataset is None else dataset, self.encoder(),
                            (language,), self.options.show_progress)
        self.model.train(training)  # Encoder() switches the model to eval mode
        if dataset is None and language == "en":
            self._pairs = pairs
        return pairs

    def frozen_copy(self) -> torch.nn.Module:
        """The model as it is now, frozen (eval mode, no gradients): the "old" model."""
        old = copy.deepcopy(self.model).eval()
        old.requires_grad_(False)
        return old


@dataclass
class PhaseSetup:
    """What the generic loop needs for one phase."""

    task: Task
    batches: Iterator[Any]
    groups: list[dict[str, Any]]
    before_step: Hook | None = None
    after_step: Hook | None = None
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW


def select_trainable(model: torch.nn.Module,
                     patterns: tuple[str, ...]) -> list[tuple[str, torch.nn.Parameter]]:
    """Unfreeze exactly the parameters matching ``patterns``; ConfigError for a pattern
    that matches nothing (a typo would otherwise train nothing, silently)."""
    named = list(model.named_parameters())
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name, _ in named):
            raise ConfigError(f"trainable pattern '{pattern}' matches no parameter of the "
                              f"model; e.g. {', '.join(n for n, _ in named[:6])}, ...")
    chosen = []
    for name, param in named:
        param.requires_grad_(any(fnmatch.fnmatchcase(name, p) for p in patterns))
        if param.requires_grad:
            chosen.append((name, param))
    return chosen


class Strategy:
    """Base class of a continual method; subclasses are registered with
    ``training.continual.registry.register_strategy``."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "domain"  # "domain": image-caption pairs; "language": add a language
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig

    def __init__(self, config: StrategyConfig | None = None) -> None:
        config = self.Config() if config is None else config
        if not isinstance(config, self.Config):
            raise ConfigError(f"method '{self.name}' takes a {self.Config.__name__}, "
                              f"not a {type(config).__name__}")
        self.config = config

    def check(self, ctx: PhaseContext) -> None:
        """Raise a typed error for input this method cannot train on (before any work)."""

    def seed(self, ctx: PhaseContext, prior: PairDataset) -> None:
        """Record ``prior`` (data the parent already knows) into state the parent lacks."""

    def setup(self, ctx: PhaseContext) -> PhaseSetup:
        raise NotImplementedError

    def finish(self, ctx: PhaseContext) -> None:
        """After training: update ``ctx.state`` with what the next phase needs."""

    def report(self) -> dict[str, Any]:
        """Method-specific facts for the manifest (e.g. the tokens a phase added)."""
        return {}
