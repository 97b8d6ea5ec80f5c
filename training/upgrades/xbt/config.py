"""``XbtConfig``: every hyperparameter of an XBT upgrade (METHODS.md, XBT), saved with the artifact.

A ``MethodConfig``: each field carries its help text in ``metadata["help"]`` (what
``nobackfill upgrade xbt --help`` lists; settings are given as ``--set KEY=VALUE``),
``from_dict`` is strict, and ``__post_init__`` rejects bad values and combinations with
a message that says what to change. Free of torch, so the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import training
from training.config import MethodConfig, setting
from training.errors import ConfigError
from training.upgrades.registry import UPGRADES

if TYPE_CHECKING:
    from training.trainer import TrainConfig

XBT_LOG_LOGIT_SCALE = 2.6592  # log of 1/0.07: the logit scale is exp of it, not a temperature
# Transformer blocks of both towers (ViT and text), and a ResNet tower's bottleneck convs.
INITS = ("random", "procrustes")
DEFAULT_LORA_TARGETS = r".*resblocks\.\d+\.(attn|mlp\.c_fc|mlp\.c_proj)|visual\.layer\d+\.\d+\.conv\d"


@dataclass
class AdapterConfig(MethodConfig):
    """The shape of the adapters; a route records it to rebuild them (read back with
    ``from_dict(..., lenient=True)``: a route another library version wrote)."""

    lora_r: int = 16
    lora_alpha: float = 16.0
    lora_dropout: float = 0.1
    lora_targets: str = DEFAULT_LORA_TARGETS  # regex, full match on module names
    prompts: int = 10  # visual soft prompt tokens; 0 disables
    layer_norms: bool = True  # train LayerNorm deltas in both towers

    def __post_init__(self) -> None:
        if self.lora_r < 1:
            raise ConfigError(f"lora_r must be >= 1, got {self.lora_r}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.prompts < 0:
            raise ConfigError(f"prompts must be >= 0 (0 disables them), got {self.prompts}")
        try:
            re.compile(self.lora_targets)
        except re.error as exc:
            raise ConfigError(f"lora_targets is not a valid regex: {exc}") from exc


# Named configurations (``XbtConfig.preset``, ``nobackfill upgrade xbt --preset NAME``):
# settings on top of the defaults. "paper" is the method exactly as the paper describes it
# (METHODS.md, XBT): 10 visual soft prompts, stage 2 runs to its last step, nothing
# selected; "default" is the library's defaults: no soft prompts (untrained prompts are not
# a no-op: inserting them cost the bench's route most of its image->text compatibility
# before its first step, and stage 2 never won it back; README, "Why XBT's stage 2 undid
# stage 1"), stage 2 selected on validation (``select_every``).
PAPER_PROMPTS = 10
PRESETS: dict[str, dict[str, Any]] = {
    "default": {}, "paper": {"select_every": 0, "prompts": PAPER_PROMPTS}}


@dataclass
class XbtConfig(MethodConfig):
    """Hyperparameters of an XBT upgrade (or of the Direct baseline with ``method="direct"``).

    ``method`` names a registered upgrade method (``training.upgrades.registry``) and selects
    what ``train_upgrade`` runs; the artifact records it."""

    RECORD_KEYS: ClassVar[frozenset[str]] = frozenset({"package_version"})

    method: str = setting("xbt", "xbt: text-only phi pretraining, then image-text training "
                                 "without the old model; direct: random phi trained end to end "
                                 "against the old model (baseline)")
    # stage 1: text-only pretraining of phi on cached text embeddings
    pretrain_steps: int = setting(1000, "stage 1 optimizer steps (text only, cached embeddings)")
    pretrain_batch_size: int = setting(512, "stage 1 batch size (the paper: 8192)")
    pretrain_lr: float = setting(1e-4, "AdamW learning rate of phi trained from scratch: all of "
                                       "phi in stage 1 (and the Direct baseline's random phi)")
    noise_sigma: float = setting(0.05, "std of the Gaussian noise added to the new text "
                                       "embeddings (unit vectors) in stage 1; 0 disables")
    # stage 2 (and the Direct baseline): image-text pairs
    steps: int = setting(500, "stage 2 optimizer steps on image-text pairs (also Direct's steps)")
    batch_size: int = setting(128, "stage 2 batch size (image-caption pairs)")
    lr: float = setting(1e-4, "AdamW learning rate of LoRA, LayerNorms and phi's LayerNorms")
    prompt_lr: float = setting(1e-2, "AdamW learning rate of the visual soft prompts (100x lr)")
    weight_decay: float = setting(0.01, "AdamW weight decay of every group")
    warmup: float = setting(0.0, "fraction of steps with linear warmup (the paper: none)")
    schedule: str = setting("constant", "lr schedule after warmup: constant (the paper), cosine, "
                                        "linear")
    grad_clip: float = setting(1.0, "max global gradient norm; 0 disables")
    log_logit_scale: float = setting(XBT_LOG_LOGIT_SCALE, "log of the fixed logit scale of every "
                                                          "contrastive term (exp(2.6592) = 1/0.07)")
    anchor: bool = setting(False, "add L_c(phi(w_new), w_old) on the old text embeddings cached "
                                  "in stage 1 to stage 2 (keeps the text side in the old space)")
    anchor_weight: float = setting(1.0, "weight of the anchoring term")
    pair_anchor: bool = setting(False, "add L_c(phi(v_new), w_old) + L_c(phi(w_new), v_old) on "
                                       "the paired set's old image and caption embeddings, cached "
                                       "in stage 1 with the old model (not run in stage 2): trains "
                                       "the two retrievals the gate measures, new queries against "
                                       "an old gallery")
    pair_anchor_weight: float = setting(1.0, "weight of the pair anchoring term")
    # adapters
    lora_r: int = setting(16, "LoRA rank")
    lora_alpha: float = setting(16.0, "LoRA alpha (scaling = alpha / r)")
    lora_dropout: float = setting(0.1, "dropout on the LoRA branch input")
    lora_targets: str = setting(DEFAULT_LORA_TARGETS, "regex (full match) of the module names "
                                                      "that get LoRA")
    prompts: int = setting(0, "visual soft prompt tokens prepended to a ViT vision tower (the "
                              "paper: 10, --preset paper); 0 (the default) adds none: untrained "
                              "prompts move every image embedding before stage 2's first step")
    layer_norms: bool = setting(True, "train LayerNorm deltas of both towers")
    language: str = setting("en", "caption language of the paired set")
    seed: int = setting(0, "seed of initialisation, batch order and noise")
    init: str = setting("random", "phi's start: random (the paper), or procrustes: phi gets a "
                                  "linear skip branch set to the orthogonal Procrustes fit of "
                                  "stage 1's cached text pairs (fc3 zeroed), so stage 1 starts "
                                  "from the closed-form map")
    select_every: int = setting(25, "stage 2 validation selection: every N steps (and at the "
                                    "last one) score the route new->old R@1 both directions on a "
                                    "validation split against the old version's embeddings of it "
                                    "(cached in stage 1), with stage 1 alone (adapters off) as "
                                    "step 0; the best checkpoint becomes the artifact's route "
                                    "(best: highest mean of t2i and i2t R@1 among the "
                                    "checkpoints no worse than step 0 in either direction; a "
                                    "tie goes to the earlier step). 0 turns it off (the paper)")
    select_holdout: float = setting(0.1, "share of the paired set's images (with their captions) "
                                         "held out, never trained on, as the validation split of "
                                         "select_every when no validation set is given; 0: no "
                                         "selection without a validation set")
    slerp_t: float = setting(0.0, "SLERP mixing of the route (SLERP-BC): a query is "
                                  "slerp(phi(new(q)), old(q), t); 0 turns it off. On, the "
                                  "artifact carries the old model's weights and the route "
                                  "runs BOTH encoders per query (two forwards' latency)")

    def __post_init__(self) -> None:
        if self.method not in UPGRADES:
            raise ConfigError(f"method must be one of {tuple(UPGRADES)}, got {self.method!r}")
        if not 0 <= self.slerp_t <= 1:
            raise ConfigError(f"slerp_t must be in [0, 1] (0 turns SLERP off), got "
                              f"{self.slerp_t}")
        if self.init not in INITS:
            raise ConfigError(f"init must be one of {INITS}, got {self.init!r}")
        if self.select_every < 0:
            raise ConfigError(f"select_every must be >= 0 (0 turns selection off), got "
                              f"{self.select_every}")
        if not 0 <= self.select_holdout < 1:
            raise ConfigError(f"select_holdout is a share of the paired set in [0, 1), got "
                              f"{self.select_holdout}")
        if self.noise_sigma < 0:
            raise ConfigError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        for name in ("pretrain_lr", "lr", "prompt_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.weight_decay < 0 or self.anchor_weight < 0 or self.pair_anchor_weight < 0:
            raise ConfigError("weight_decay, anchor_weight and pair_anchor_weight must be >= 0")
        if not math.isfinite(self.log_logit_scale) or math.exp(self.log_logit_scale) > 100:
            raise ConfigError(f"log_logit_scale {self.log_logit_scale} gives a logit scale "
                              f"above 100 (the clamp of every contrastive loss); use <= 4.6052")
        UPGRADES[self.method].check_config(self)  # e.g. Direct takes no anchoring terms
        self.adapter_config()  # validates the LoRA / prompt fields
        self.pretrain_config()  # validates steps, batch sizes, warmup and schedule
        self.stage2_config()

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> XbtConfig:
        """A named configuration (``PRESETS``) with ``overrides`` on top (strict, as
        ``from_dict``)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown XBT preset {name!r}; known: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})

    @property
    def logit_scale(self) -> float:
        return math.exp(self.log_logit_scale)

    def adapter_config(self) -> AdapterConfig:
        return AdapterConfig(self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_targets,
                             self.prompts, self.layer_norms)

    def pretrain_config(self) -> TrainConfig:
        from training.trainer import TrainConfig  # torch: imported only when training

        return TrainConfig(steps=self.pretrain_steps, batch_size=self.pretrain_batch_size,
                           lr=self.pretrain_lr, weight_decay=self.weight_decay,
                           warmup=self.warmup, schedule=self.schedule,
                           grad_clip=self.grad_clip, seed=self.seed)

    def stage2_config(self) -> TrainConfig:
        from training.trainer import TrainConfig

        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                           weight_decay=self.weight_decay, warmup=self.warmup,
                           schedule=self.schedule, grad_clip=self.grad_clip, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        """The config as saved in an artifact, with the library version that wrote it
        (a ``RECORD_KEYS`` entry: ``from_dict`` drops it)."""
        return {**super().to_dict(), "package_version": training.__version__}
