"""``AdapterFitConfig``: how an adapter route is fitted (saved with the artifact)."""

from __future__ import annotations

from dataclasses import dataclass

from training.config import MethodConfig, setting
from training.errors import ConfigError

MAP_KINDS = ("procrustes", "affine", "residual-mlp")


@dataclass
class AdapterFitConfig(MethodConfig):
    """Settings of an adapter fit (``--set`` keys; the ``config`` of an ``adapter`` job)."""

    method: str = setting("procrustes", "the map: procrustes (orthogonal, closed form), affine "
                                        "(ridge least squares), residual-mlp (procrustes + a "
                                        "small residual MLP trained on the pairs)")
    per_modality: bool = setting(True, "one map per modality (image->image, text->text pairs); "
                                       "false: one map fitted on both modalities' pairs")
    ridge: float = setting(1e-2, "affine: L2 penalty of the least-squares fit")
    rank: int = setting(0, "affine: rank of the map (0: full rank)")
    hidden: int = setting(256, "residual-mlp: hidden width of the residual branch")
    steps: int = setting(300, "residual-mlp: AdamW steps on the embedding pairs")
    batch_size: int = setting(512, "residual-mlp: pairs per step")
    lr: float = setting(1e-3, "residual-mlp: learning rate")
    weight_decay: float = setting(1e-4, "residual-mlp: AdamW weight decay")
    slerp_t: float = setting(0.0, "SLERP mixing: the query is slerp(map(new(q)), old(q), t); "
                                  "0 turns it off (1 = old model only). On: the route runs "
                                  "BOTH encoders per query (two forwards' latency)")
    language: str = setting("en", "caption language of the sample's texts")
    seed: int = setting(0, "seed of the residual MLP's initialisation and batch order")

    def __post_init__(self) -> None:
        if self.method not in MAP_KINDS:
            raise ConfigError(f"method must be one of {MAP_KINDS}, got {self.method!r}")
        if self.ridge < 0 or self.rank < 0:
            raise ConfigError("ridge and rank must be >= 0 (rank 0: full rank)")
        if not 0 <= self.slerp_t <= 1:
            raise ConfigError(f"slerp_t must be in [0, 1] (0 turns SLERP off), got {self.slerp_t}")
        if self.hidden < 1 or self.steps < 0 or self.batch_size < 2 or self.lr <= 0:
            raise ConfigError("residual-mlp needs hidden >= 1, steps >= 0, batch_size >= 2, "
                              "lr > 0")
