"""Removable adapters on an open_clip model: LoRA (via peft), LayerNorm deltas, visual prompts.

XBT never edits the new model's weights (DESIGN.md, "Adapters are removable"):
- LoRA (Hu et al. 2021) is injected with peft into the attention and MLP layers of
  both towers (and the bottleneck convolutions of a ResNet vision tower).
  ``nn.MultiheadAttention`` gets :class:`LoraSelfAttention`, which adds the low-rank
  terms to q/k/v and the output projection *without* merging them into the base
  weights; peft's own MHA layer merges and unmerges on every forward, which drifts
  the base weights by rounding and is not safe under concurrent requests.
- Every affine LayerNorm of both towers is wrapped in :class:`AdaptedLayerNorm`,
  which keeps the trained change as a separate delta (weight decay pulls it back
  towards the original norm).
- Visual soft prompts (:mod:`training.upgrades.xbt.prompts`) sit in hooks on the ViT tower.
Switching them off gives back the off-the-shelf model's computation exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora.layer import MultiheadAttention as PeftLoraMultiheadAttention
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from training.errors import ArtifactError, ConfigError
from training.upgrades.xbt.config import AdapterConfig
from training.upgrades.xbt.prompts import VisualPrompts, check_promptable

ADAPTER_NAME = "xbt"
LN_DELTAS = ("delta_weight", "delta_bias")
PROMPT_PARAM = "soft_prompts.tokens"


class LoraSelfAttention(PeftLoraMultiheadAttention):
    """LoRA on ``nn.MultiheadAttention`` (self-attention), computed unmerged.

    in_proj gets ``B A dropout(x) * scaling`` added to q/k/v; out_proj is peft's
    LoRA Linear (its forward is called here). With adapters disabled, the base
    module runs unchanged.
    """

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, need_weights: bool = False,
                attn_mask: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        base = self.get_base_layer()
        active = [a for a in self.active_adapters if a in self.lora_A]
        if self.disable_adapters or not active:
            return base(query, key, value, need_weights=need_weights, attn_mask=attn_mask, **kwargs)
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise NotImplementedError("LoraSelfAttention supports self-attention only")
        if need_weights or kwargs.get("key_padding_mask") is not None:
            raise NotImplementedError("LoraSelfAttention supports neither need_weights nor "
                                      "key_padding_mask")
        x = query if base.batch_first else query.transpose(0, 1)  # [B, L, D]
        qkv = F.linear(x, base.in_proj_weight, base.in_proj_bias)  # [B, L, 3D]
        for name in active:
            lora = self.lora_B[name](self.lora_A[name](self.lora_dropout[name](x)))
            qkv = qkv + lora * self.scaling[name]
        out = base.out_proj(_attend(qkv, base.num_heads, attn_mask,
                                    base.dropout if self.training else 0.0))  # [B, L, D]
        return (out if base.batch_first else out.transpose(0, 1)), None


def _attend(qkv: torch.Tensor, heads: int, attn_mask: torch.Tensor | None,
            dropout: float) -> torch.Tensor:
    """Scaled dot-product attention of packed [B, L, 3D] q/k/v -> [B, L, D]."""
    b, length, three_d = qkv.shape
    q, k, v = qkv.view(b, length, 3, heads, three_d // (3 * heads)).permute(2, 0, 3, 1, 4)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # nn.MultiheadAttention: True = masked out; scaled_dot_product_attention: True = kept.
        attn_mask = ~attn_mask
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
    return out.transpose(1, 2).reshape(b, length, three_d // 3)  # [B, H, L, hd] -> [B, L, D]


class AdaptedLayerNorm(nn.Module):
    """A frozen LayerNorm plus a trainable change of its affine parameters, kept apart."""

    def __init__(self, base: nn.LayerNorm) -> None:
        super().__init__()
        self.base = base
        self.delta_weight = nn.Parameter(torch.zeros_like(base.weight))
        self.delta_bias = nn.Parameter(torch.zeros_like(base.weight))
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.base(x)
        weight = self.base.weight + self.delta_weight
        bias = self.delta_bias if self.base.bias is None else self.base.bias + self.delta_bias
        out = F.layer_norm(x.to(weight.dtype), self.base.normalized_shape, weight, bias,
                           self.base.eps)
        return out.to(x.dtype)


def _affine_layer_norms(model: nn.Module) -> list[tuple[str, nn.LayerNorm]]:
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, nn.LayerNorm) and m.weight is not None]


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _inject_lora(model: nn.Module, cfg: AdapterConfig) -> None:
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_targets, bias="none")
    lora._register_custom_module({nn.MultiheadAttention: LoraSelfAttention})
    try:
        inject_adapter_in_model(lora, model, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # peft: "Target modules ... not found in the base model"
        raise ConfigError(f"no LoRA target in the model matches lora_targets "
                          f"{cfg.lora_targets!r}: {exc}") from exc


class Adapters:
    """The XBT adapters attached to one open_clip model, switchable as a whole.

    ``Adapters.attach(model, cfg)`` edits the module tree (wrappers and hooks only;
    no base weight changes) and freezes everything that is not an adapter.
    """

    def __init__(self, model: nn.Module, cfg: AdapterConfig,
                 layer_norms: list[AdaptedLayerNorm], prompts: VisualPrompts | None) -> None:
        self.model, self.cfg = model, cfg
        self.layer_norms, self.prompts = layer_norms, prompts
        self.enabled = True  # whether the model computes with its adapters (``set_enabled``)

    @classmethod
    def attach(cls, model: nn.Module, cfg: AdapterConfig) -> Adapters:
        if cfg.prompts:
            check_promptable(model.visual)  # before any edit: fail on a tower that cannot take them
        _inject_lora(model, cfg)
        norms = []
        if cfg.layer_norms:
            for name, ln in _affine_layer_norms(model):
                norms.append(AdaptedLayerNorm(ln))
                _replace(model, name, norms[-1])
        prompts = None
        if cfg.prompts:
            prompts = VisualPrompts(cfg.prompts, model.visual.class_embedding.shape[-1])
            prompts.to(model.visual.class_embedding.device).attach(model.visual)
        adapters = cls(model, cfg, norms, prompts)
        adapters.freeze_base()
        return adapters

    # ------------------------------------------------------------------ parameters
    def named_lora(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if ".lora_" in n}

    def named_layer_norm_deltas(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if n.endswith(LN_DELTAS)}

    def named_prompts(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if n.endswith(PROMPT_PARAM)}

    def named_parameters(self) -> dict[str, nn.Parameter]:
        return {**self.named_lora(), **self.named_layer_norm_deltas(), **self.named_prompts()}

    def freeze_base(self) -> None:
        """Only adapter parameters require grad; the base model's own weights never train."""
        mine = set(self.named_parameters())
        for name, param in self.model.named_parameters():
            param.requires_grad_(name in mine)

    def lora_modules(self) -> list[str]:
        """Names of the modules that carry LoRA (peft wrappers), e.g. ``visual...attn``."""
        return [n for n, m in self.model.named_modules()
                if isinstance(m, BaseTunerLayer) and ADAPTER_NAME in getattr(m, "lora_A", {})]

    def train_mode(self) -> None:
        """Training mode for the adapters (LoRA dropout on), with BatchNorm kept in eval:
        a ResNet tower's running statistics are base state and must not move."""
        self.model.train()
        for module in self.model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()

    # ------------------------------------------------------------------ on / off
    def set_enabled(self, enabled: bool) -> None:
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.enable_adapters(enabled)
        for norm in self.layer_norms:
            norm.enabled = enabled
        if self.prompts is not None:
            self.prompts.enabled = enabled
        self.enabled = enabled
        if enabled:  # peft's toggle also flips requires_grad; restore the training contract
            self.freeze_base()

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """The off-the-shelf model inside the block; the adapters switched back as they
        were afterwards."""
        was = self.enabled
        self.set_enabled(False)
        try:
            yield
        finally:
            self.set_enabled(was)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter tensors only (LoRA A/B, LayerNorm deltas, prompts), keyed by module path."""
        return {n: p.detach().clone() for n, p in self.named_parameters().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = self.named_parameters()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ArtifactError(f"adapter weights do not match the adapter config: missing "
                                f"{missing[:5]}, unexpected {unexpected[:5]}")
        with torch.no_grad():
            for name, param in own.items():
                if state[name].shape != param.shape:
                    raise ArtifactError(f"adapter weight {name} has shape "
                                        f"{tuple(state[name].shape)}, expected {tuple(param.shape)}")
                param.copy_(state[name])
