"""CLL-CLIP with TEIR: add a language by training token embeddings only (METHODS.md,
"CLL-CLIP with TEIR"; Yang et al., "Embracing Language Inclusivity and Diversity in CLIP
through Continual Language Learning", AAAI 2024).

The vocabulary grows with the new language's BPE tokens; the image tower and the rest
of the text tower stay frozen, so the gallery's embeddings are untouched. The student
(the grown text tower on foreign captions) learns to reproduce the teacher (the parent
on the parallel English captions): L = 1.0 MSE(student, teacher text) + 0.01 InfoNCE
(student text, teacher image). TEIR initialises new rows from the distribution of the
existing ones and scales each row's gradient and weight decay inside AdamW by
s_v = c_v / f_v (c_v: token used by this language, f_v: how often it was learned
before; state namespace ``teir``). ``cll-clip`` is the plain baseline: new rows from
N(0, 0.02) and no scaling.

Adam divides a constant gradient scale out of its step, so a row that English shares with
the new language (Spanish "a") moves at full speed under s_v = 1/2. The option
``protect_teacher_tokens`` (beyond METHODS.md, off by default) gives the rows of tokens in
the phase's English captions scale 0: they never move, and English queries embed bit for
bit as before the phase.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from training.continual.registry import register_strategy
from training.continual.strategy import (
    PhaseContext,
    PhaseSetup,
    Strategy,
    StrategyConfig,
    select_trainable,
)
from training.continual.vocab import (
    check_expandable,
    expanded_spec,
    grow_embedding,
    learn_merges,
    use_eos_pooling,
)
from training.distributed import (
    World,
    all_reduce_sum,
    broadcast_object,
    gather,
    global_batch_size,
    map_rows,
)
from training.encoders import extend_vocabulary
from training.errors import ConfigError, DataError
from training.losses import multi_positive_infonce

NAMESPACE = "teir"
TEACHER_LANGUAGE = "en"
INITS = ("teir", "normal")


@dataclass
class TeirConfig(StrategyConfig):
    lr: float = 5e-5
    weight_decay: float = 0.05
    adam_eps: float = 1e-6
    warmup: float = 0.1
    schedule: str = "constant"
    grad_clip: float = 1.0
    trainable: tuple[str, ...] = ("token_embedding.weight",)
    init: str = field(default="teir", metadata={
        "help": "new rows: teir = N(mean, std of the current matrix); normal = N(0, init_std)"})
    init_std: float = 0.02
    scale_rows: bool = field(default=True, metadata={
        "help": "scale each row's gradient and weight decay by c_v / f_v inside AdamW"})
    protect_teacher_tokens: bool = field(default=False, metadata={
        "help": "beyond METHODS.md: rows of tokens that the phase's English captions use get "
                "scale 0, so English queries embed bit-identically (needs scale_rows)"})
    max_merges: int = field(default=10_000, metadata={
        "help": "most BPE merges learned from the new language's captions"})
    min_pair_count: int = field(default=2, metadata={"help": "rarest pair that becomes a merge"})
    mse_weight: float = 1.0
    contrastive_weight: float = 0.01
    temperature: float = field(default=0.07, metadata={"help": "initial InfoNCE temperature"})
    temperature_min: float = 0.001
    temperature_max: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init not in INITS:
            raise ConfigError(f"init must be one of {INITS}, got {self.init!r}")
        if self.max_merges < 0 or self.min_pair_count < 1:
            raise ConfigError("max_merges must be >= 0 and min_pair_count >= 1")
        if self.protect_teacher_tokens and not self.scale_rows:
            raise ConfigError("protect_teacher_tokens works through the per-row scale: it "
                              "needs scale_rows=true")
        if not 0 < self.temperature_min <= self.temperature <= self.temperature_max:
            raise ConfigError("need 0 < temperature_min <= temperature <= temperature_max")


@dataclass
class CllClipConfig(TeirConfig):
    """The plain CLL-CLIP baseline: N(0, 0.02) rows, no per-token scaling."""

    init: str = "normal"
    scale_rows: bool = False


class RowScaledAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) where a parameter group may carry ``row_scale``
    [rows]: each row's gradient is multiplied by it before the moment updates and its
    decoupled weight decay becomes theta_v (1 - lr * wd * s_v) (CLL-CLIP TEIR, Yang et al.
    2024, Sec. 3.3). Without ``row_scale`` it is AdamW.

    Rows with scale 0 never move (zero gradient, no decay, zero moments), so only the
    rows with a positive scale are read and written: a language phase touches a few
    hundred of the ~50k rows, which keeps its steps cheap.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "row_scale": None})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(param),
                                 exp_avg_sq=torch.zeros_like(param))
                state["step"] += 1
                if group["row_scale"] is None:
                    _adamw(param, param.grad, state["exp_avg"], state["exp_avg_sq"],
                           torch.ones(()), group, state["step"])
                else:
                    self._scaled_rows(param, state, group)

    @staticmethod
    def _scaled_rows(param: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        scale = group["row_scale"].to(param.device)
        rows = scale.nonzero().squeeze(1)  # [R] rows that may move
        shape = (-1, *([1] * (param.ndim - 1)))
        s = scale[rows].to(param.dtype).view(shape)  # [R, 1]
        p, m, v = param[rows], state["exp_avg"][rows], state["exp_avg_sq"][rows]  # copies
        _adamw(p, param.grad[rows] * s, m, v, s, group, state["step"])
        param[rows], state["exp_avg"][rows], state["exp_avg_sq"][rows] = p, m, v


def _adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
           exp_avg_sq: torch.Tensor, decay_scale: torch.Tensor, group: dict[str, Any],
           step: int) -> None:
    """One AdamW update in place, torch's order: decoupled decay, moments, bias-corrected step."""
    beta1, beta2 = group["betas"]
    param.mul_(1 - group["lr"] * group["weight_decay"] * decay_scale.to(param.device))
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    correction1, correction2 = 1 - beta1 ** step, 1 - beta2 ** step
    denom = (exp_avg_sq.sqrt() / math.sqrt(correction2)).add_(group["eps"])
    param.addcdiv_(exp_avg, denom, value=-group["lr"] / correction1)


def token_scale(frequency: torch.Tensor, used: torch.Tensor,
                special_ids: list[int]) -> torch.Tensor:
    """s_v = c_v / f_v, with special tokens (SOT, EOT, PAD) always 0. [V] float."""
    scale = used.float() / frequency.float()
    scale[special_ids] = 0.0
    return scale


def grown_frequency(stored: torch.Tensor | None, old_rows: int, new_rows: int) -> torch.Tensor:
    """f_v after an expansion: f starts at 1; at the first expansion every original token
    gets +1 (it was learned with the original language); new tokens start at 1."""
    if stored is None:
        stored = torch.ones(old_rows) + 1
    if len(stored) != old_rows:
        raise ConfigError(f"the parent's TEIR token statistics cover {len(stored)} tokens but "
                          f"its vocabulary has {old_rows}")
    return torch.cat([stored.float(), torch.ones(new_rows)])


@dataclass
class LanguagePairs:
    """Parallel captions of one phase: caption m in the new language, its English twin."""

    foreign: list[str]
    english: list[str]
    owners: torch.Tensor  # [M] image index of each caption

    @classmethod
    def of(cls, ctx: PhaseContext, language: str) -> LanguagePairs:
        foreign, english, owners = [], [], []
        for index, record in enumerate(ctx.data.records):
            theirs = record.captions.get(language, [])
            ours = record.captions.get(TEACHER_LANGUAGE, [])
            if len(ours) < len(theirs):
                raise DataError(f"a language phase needs parallel English captions: record "
                                f"{record.id!r} has {len(theirs)} '{language}' captions but "
                                f"{len(ours)} '{TEACHER_LANGUAGE}' ones")
            foreign += theirs
            english += ours[:len(theirs)]
            owners += [index] * len(theirs)
        return cls(foreign, english, torch.tensor(owners))


class TeirTask:
    """Student text tower on foreign captions against precomputed teacher targets.

    Under torch.distributed the MSE is this rank's mean (DDP's average makes it the global
    mean) and the InfoNCE runs on the gathered global batch (students with gradients)."""

    def __init__(self, model: torch.nn.Module, tokens: torch.Tensor, teacher_text: torch.Tensor,
                 teacher_image: torch.Tensor, owners: torch.Tensor, cfg: TeirConfig) -> None:
        self.model, self.tokens, self.owners, self.cfg = model, tokens, owners, cfg
        self.teacher_text = teacher_text  # [M, D] unnormalised English embeddings
        self.teacher_image = teacher_image  # [N, D] normalised image embeddings
        self.temperature = torch.nn.Parameter(torch.tensor(cfg.temperature))

    def losses(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        device = self.model.token_embedding.weight.device
        with torch.no_grad():
            self.temperature.clamp_(self.cfg.temperature_min, self.cfg.temperature_max)
        student = self.model.encode_text(self.tokens[batch].to(device))  # [b, D] unnormalised
        owners = gather(self.owners[batch].to(device))  # [B], the global batch
        image = self.teacher_image[owners.cpu()].to(device)  # [B, D]
        contrast = multi_positive_infonce(gather(F.normalize(student, dim=-1)), image, owners,
                                          self.temperature)
        return {"distill_loss": self.cfg.mse_weight * F.mse_loss(
                    student, self.teacher_text[batch].to(device)),
                "contrastive_loss": self.cfg.contrastive_weight * contrast}


def used_tokens(tokens: torch.Tensor, rows: int) -> torch.Tensor:
    """[V] bool: the token ids that occur in ``tokens`` [M, context]. Under torch.distributed
    each rank counts a block of the captions and the counts are summed, so the corpus is
    counted once and every rank gets the same mask."""
    lo, hi = World.current().row_range(len(tokens))
    counts = torch.bincount(tokens[lo:hi].flatten(), minlength=rows)
    return all_reduce_sum(counts) > 0


def caption_batches(count: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless batches of caption indices [B], each epoch in a new seeded order (this
    rank's shard [B/N] under torch.distributed)."""
    world = World.current()
    rng = np.random.default_rng(seed)
    batch_size = global_batch_size(batch_size, count, world)
    while True:
        order = torch.from_numpy(rng.permutation(count))
        for start in range(0, count - batch_size + 1, batch_size):
            yield world.shard(order[start:start + batch_size])


@register_strategy("teir")
class Teir(Strategy):
    """CLL-CLIP with TEIR initialisation and per-token gradient/weight-decay scaling."""

    kind = "language"
    Config = TeirConfig
    config: TeirConfig

    def check(self, ctx: PhaseContext) -> None:
        if ctx.options.language in (None, TEACHER_LANGUAGE):
            raise ConfigError(f"a language phase adds a language other than the teacher's "
                              f"'{TEACHER_LANGUAGE}'; got {ctx.options.language!r}")
        check_expandable(ctx.model, ctx.tokenizer)
        self.captions = LanguagePairs.of(ctx, ctx.options.language)

    def setup(self, ctx: PhaseContext) -> PhaseSetup:
        teacher_tokens, teacher_text, teacher_image = self._teacher(ctx)  # parent, before growth
        self._grow(ctx)
        tokens = ctx.tokenizer(self.captions.foreign)  # [M, context], grown vocabulary
        rows = ctx.model.token_embedding.num_embeddings
        self.used = used_tokens(tokens, rows)  # [V] c_v
        old_rows = rows - len(self.added)
        self.frequency = grown_frequency(ctx.state.get(NAMESPACE, {}).get("frequency"),
                                         old_rows, len(self.added))
        self.protected = torch.zeros(rows, dtype=torch.bool)  # [V] rows kept for English
        if self.config.protect_teacher_tokens:
            self.protected[:old_rows] = torch.bincount(teacher_tokens.flatten(),
                                                       minlength=old_rows) > 0
        task = TeirTask(ctx.model, tokens, teacher_text, teacher_image, self.captions.owners,
                        self.config)
        groups = self._groups(ctx, [*ctx.tokenizer.all_special_ids, 0])  # PAD is id 0
        groups.append({"params": [task.temperature], "weight_decay": 0.0})
        batches = caption_batches(len(tokens), ctx.options.batch_size, ctx.options.seed)
        return PhaseSetup(task, batches, groups, optimizer_cls=RowScaledAdamW)

    @torch.no_grad()
    def _teacher(self, ctx: PhaseContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """([M, context] English tokens, [M, D] their unnormalised embeddings, [N, D]
        normalised image embeddings), all from the parent."""
        model, chunk = ctx.model.eval(), 256
        tokens = ctx.tokenizer(self.captions.english)
        pixels = ctx.pairs().pixels

        def text(lo: int, hi: int) -> torch.Tensor:
            return torch.cat([model.encode_text(tokens[s:min(s + chunk, hi)].to(ctx.device)).cpu()
                              for s in range(lo, hi, chunk)])

        def image(lo: int, hi: int) -> torch.Tensor:
            return torch.cat([model.encode_image(pixels[s:min(s + chunk, hi)].float().to(
                ctx.device), normalize=True).cpu() for s in range(lo, hi, chunk)])

        # each rank embeds a block of the rows; every rank gets all of them
        return tokens, map_rows(len(tokens), text), map_rows(len(pixels), image)

    def _grow(self, ctx: PhaseContext) -> None:
        """Learn the language's merges, extend the tokenizer, grow the embedding and spec."""
        # learned once, on rank 0, and shared: every rank grows the same vocabulary
        self.merges = broadcast_object(
            learn_merges(ctx.tokenizer, self.captions.foreign, self.config.max_merges,
                         self.config.min_pair_count) if World.current().is_main else None)
        self.added = extend_vocabulary(ctx.tokenizer, self.merges)
        generator = torch.Generator().manual_seed(ctx.options.seed)
        grow_embedding(ctx.model, len(self.added), self.config.init, self.config.init_std,
                       generator)
        use_eos_pooling(ctx.model, ctx.tokenizer.eot_token_id)
        ctx.spec = expanded_spec(ctx.spec, ctx.model, ctx.tokenizer, self.merges)

    def _groups(self, ctx: PhaseContext, special_ids: list[int]) -> list[dict[str, Any]]:
        """The token embedding's group carries the per-row scale; other trainables are plain."""
        scale = token_scale(self.frequency, self.used & ~self.protected, special_ids)
        groups = []
        for name, param in select_trainable(ctx.model, self.config.trainable):
            group: dict[str, Any] = {"params": [param]}
            if name == "token_embedding.weight" and self.config.scale_rows:
                group["row_scale"] = scale.to(param.device)
            groups.append(group)
        return groups

    def finish(self, ctx: PhaseContext) -> None:
        # every token this language's text used counts as learned once more
        ctx.state[NAMESPACE] = {"frequency": self.frequency + self.used.float()}
        ctx.languages.append(str(ctx.options.language))

    def report(self) -> dict[str, Any]:
        return {"merges": len(self.merges), "new_tokens": len(self.added),
                "tokens_used": int(self.used.sum()),
                "tokens_protected": int((self.used & self.protected).sum())}


@register_strategy("cll-clip")
class CllClip(Teir):
    """The plain CLL-CLIP baseline: new rows from N(0, 0.02), no per-token scaling."""

    Config = CllClipConfig
