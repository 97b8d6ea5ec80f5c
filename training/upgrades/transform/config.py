"""``TransformConfig``: how a gallery-side transform and its order are fitted."""

from __future__ import annotations

from dataclasses import dataclass

from training.config import MethodConfig, setting
from training.errors import ConfigError
from training.upgrades.adapter.config import MAP_KINDS, AdapterFitConfig

ORDERS = ("id", "random", "learned")
PREDICTORS = ("knn", "ridge")


@dataclass
class TransformConfig(MethodConfig):
    """Settings of a gallery-side transform (the ``transform_config`` of a migration)."""

    method: str = setting("residual-mlp", "the map OLD -> NEW per modality: procrustes, affine "
                                          "or residual-mlp (procrustes + a residual MLP)")
    ensemble: int = setting(1, "maps averaged per modality (each on its own bootstrap of the "
                               "sample and seed); 1: one map")
    hidden: int = setting(256, "residual-mlp: hidden width")
    steps: int = setting(600, "residual-mlp: AdamW steps")
    batch_size: int = setting(256, "residual-mlp: pairs per step")
    lr: float = setting(1e-3, "residual-mlp: learning rate")
    weight_decay: float = setting(1e-4, "residual-mlp: AdamW weight decay")
    ridge: float = setting(1e-2, "affine: L2 penalty")
    holdout: float = setting(0.2, "share of the sample held out to fit the learned order "
                                  "(the map is then refitted on the whole sample)")
    order_model: str = setting("knn", "learned order's error predictor: knn (similarity-"
                                      "weighted mean error of the nearest held-out items) or "
                                      "ridge (linear in the stored vector and its transform)")
    order_k: int = setting(16, "knn: held-out neighbours averaged")
    order_ridge: float = setting(1.0, "ridge: L2 penalty of the error predictor")
    seed: int = setting(0, "seed of the split, the bootstraps and the MLPs")

    def __post_init__(self) -> None:
        if self.method not in MAP_KINDS:
            raise ConfigError(f"method must be one of {MAP_KINDS}, got {self.method!r}")
        if self.ensemble < 1:
            raise ConfigError(f"ensemble must be >= 1, got {self.ensemble}")
        if not 0 < self.holdout < 1:
            raise ConfigError(f"holdout must be in (0, 1), got {self.holdout}")
        if self.order_ridge < 0 or self.order_k < 1:
            raise ConfigError(f"order_ridge must be >= 0 and order_k >= 1, got "
                              f"{self.order_ridge}, {self.order_k}")
        if self.order_model not in PREDICTORS:
            raise ConfigError(f"order_model must be one of {PREDICTORS}, got {self.order_model!r}")
        self.map_config(self.seed)  # the map's own checks

    def map_config(self, seed: int) -> AdapterFitConfig:
        """The adapter-map settings of one member of the ensemble."""
        return AdapterFitConfig(method=self.method, ridge=self.ridge, hidden=self.hidden,
                                steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                                weight_decay=self.weight_decay, seed=seed)
