"""DNS: dual-side null-space projection on the towers' final linear projections
(METHODS.md, "DNS"; Liu et al., "Continual Multimodal Contrastive Learning", NeurIPS 2025).

Only ``visual.proj`` and ``text_projection`` train; the encoders stay frozen. After
every phase the uncentred second moments of each projection's inputs (Z_in) and of
the partner tower's projected features (Z_out, the output side) are accumulated as
running averages over all samples seen (state namespace ``dns``). At the start of a
phase they become fixed projectors P = U_k U_k^T (SVD, singular values above a
threshold) and each step's gradient of W [d_out, d_in] becomes

    dual side:  G' = G - P_out G P_in        one-sided (input space):  G' = G (I - P_in)

The reference keeps output-side directions above 0, which numerically keeps them all,
so its dual rule is in effect one-sided; ``lambda_min_out`` > 0 gives the paper's
dual rule. Adam rescales each element, so a projected gradient does not keep the
update in the null space: ``project="update"`` projects the final parameter update
(weight decay included) instead, which keeps old embeddings of a one-sided tower fixed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from training.continual.registry import register_strategy
from training.continual.seqft import ContrastiveConfig, ContrastiveStrategy
from training.continual.strategy import PhaseContext, PhaseSetup
from training.data import PairDataset
from training.distributed import World, all_reduce_sum, broadcast
from training.errors import ConfigError
from training.pairs import PairTensors

NAMESPACE = "dns"
TOWERS = ("image", "text")
PROJECT_MODES = ("gradient", "update")


@dataclass
class DnsConfig(ContrastiveConfig):
    lr: float = 1e-4
    weight_decay: float = 1e-3
    warmup: float = 0.0
    schedule: str = "linear"
    trainable: tuple[str, ...] = ("visual.proj*", "text_projection*")
    image_projection: str = field(default="visual.proj", metadata={
        "help": "attribute path of the image tower's final linear projection"})
    text_projection: str = field(default="text_projection", metadata={
        "help": "attribute path of the text tower's final linear projection"})
    lambda_min: float = field(default=0.1, metadata={
        "help": "input side: keep directions whose eigenvalue exceeds this (absolute)"})
    lambda_min_out: float = field(default=0.0, metadata={
        "help": "output side threshold; the reference's 0 keeps every direction"})
    one_sided: tuple[str, ...] = field(default=(), metadata={
        "help": "towers (image, text) using G' = G (I - P_in) instead of the dual rule"})
    project: str = field(default="gradient", metadata={
        "help": "gradient: project .grad before AdamW (reference); update: project the step"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.one_sided = tuple(self.one_sided)
        if not set(self.one_sided) <= set(TOWERS):
            raise ConfigError(f"one_sided names towers from {TOWERS}, got {self.one_sided}")
        if self.project not in PROJECT_MODES:
            raise ConfigError(f"project must be one of {PROJECT_MODES}, got {self.project!r}")
        if self.lambda_min < 0 or self.lambda_min_out < 0:
            raise ConfigError("lambda_min and lambda_min_out must be >= 0")


@dataclass
class Projection:
    """A tower's final linear projection seen as W [d_out, d_in]."""

    tower: str
    path: str
    weight: torch.nn.Parameter  # stored [d_in, d_out] when ``transposed`` (x @ proj), else W
    transposed: bool

    @property
    def in_dim(self) -> int:
        return int(self.weight.shape[0] if self.transposed else self.weight.shape[1])

    def apply(self, features: torch.Tensor) -> torch.Tensor:
        """[N, d_in] -> [N, d_out], without any bias (the output-side moment is W X^T X W^T)."""
        w = self.weight.detach()
        return features @ w if self.transposed else features @ w.t()

    def rule(self, matrix: torch.Tensor, p_in: torch.Tensor,
             p_out: torch.Tensor | None) -> torch.Tensor:
        """M - P_out M P_in (P_out None: M - M P_in) for M laid out like the weight."""
        w = matrix.t() if self.transposed else matrix  # [d_out, d_in]
        projected = w - (w if p_out is None else p_out @ w) @ p_in
        return projected.t() if self.transposed else projected


# per trained tower: (its projection, P_in [d_in, d_in], P_out [d_out, d_out] or None)
Rule = tuple[Projection, torch.Tensor, torch.Tensor | None]


def find_projection(model: torch.nn.Module, tower: str, path: str) -> Projection:
    """The linear projection at ``path``; ConfigError if it is missing or not linear."""
    owner: object = model
    for part in path.split("."):
        owner = getattr(owner, part, None)
    if isinstance(owner, torch.nn.Linear):
        return Projection(tower, path, owner.weight, transposed=False)
    if isinstance(owner, torch.nn.Parameter) and owner.ndim == 2:
        return Projection(tower, path, owner, transposed=True)
    raise ConfigError(f"DNS trains linear final projections, but the {tower} tower's "
                      f"'{path}' is {type(owner).__name__} (not nn.Linear or a 2-D matrix); "
                      f"set {tower}_projection to the attribute path of a linear projection")


@contextmanager
def _bypassed(model: torch.nn.Module, path: str) -> Iterator[None]:
    """Temporarily remove a projection so the tower returns the projection's input
    (open_clip skips a projection that is None)."""
    *parents, name = path.split(".")
    owner: object = model
    for part in parents:
        owner = getattr(owner, part)
    saved = getattr(owner, name)
    setattr(owner, name, None)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@torch.no_grad()
def projection_inputs(model: torch.nn.Module, projection: Projection,
                      encode: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                      batch_size: int = 256) -> torch.Tensor:
    """[N, d_in] float64 inputs of the projection for ``inputs`` (pixels or tokens)."""
    device = projection.weight.device
    if len(inputs) == 0:
        return torch.zeros(0, projection.in_dim, dtype=torch.float64)
    with _bypassed(model, projection.path):
        chunks = [encode(inputs[s:s + batch_size].to(device)).double()
                  for s in range(0, len(inputs), batch_size)]
    return torch.cat(chunks).cpu()


def running_moment(moment: torch.Tensor, count: int, features: torch.Tensor) -> torch.Tensor:
    """Z <- Z n/(n+N) + X^T X/(n+N): the uncentred second moment over all samples seen."""
    return _add_gram(moment, count, features.t() @ features, len(features))


def _add_gram(moment: torch.Tensor, count: int, gram: torch.Tensor, rows: int) -> torch.Tensor:
    """``running_moment`` from the Gram matrix X^T X of ``rows`` new samples."""
    total = count + rows
    return moment * (count / total) + gram / total


def subspace_projector(moment: torch.Tensor, threshold: float) -> torch.Tensor:
    """P = U_k U_k^T over the singular directions of ``moment`` above ``threshold``."""
    u, s, _ = torch.linalg.svd(moment.double())
    kept = u[:, s > threshold]  # [d, k]
    # rank 0's projector on every rank: an SVD need not be bit-identical across devices
    return broadcast((kept @ kept.t()).float().contiguous())


@register_strategy("dns")
class Dns(ContrastiveStrategy):
    Config = DnsConfig
    config: DnsConfig

    def projections(self, model: torch.nn.Module) -> dict[str, Projection]:
        return {"image": find_projection(model, "image", self.config.image_projection),
                "text": find_projection(model, "text", self.config.text_projection)}

    def check(self, ctx: PhaseContext) -> None:
        allowed = set()
        for p in self.projections(ctx.model).values():
            allowed |= {p.path, f"{p.path}.weight", f"{p.path}.bias"}
        names = [n for n, _ in ctx.model.named_parameters()
                 if any(fnmatch.fnmatchcase(n, pat) for pat in self.config.trainable)]
        if set(names) - allowed:
            raise ConfigError(f"DNS keeps the encoders frozen; trainable may only name the "
                              f"projections {sorted(allowed & set(names)) or sorted(allowed)}, "
                              f"not {sorted(set(names) - allowed)[:4]}")

    def setup(self, ctx: PhaseContext) -> PhaseSetup:
        setup = super().setup(ctx)
        rules = self._rules(ctx)
        if self.config.project == "gradient":
            setup.before_step = lambda opt: _project_gradients(rules)
        else:
            update = UpdateProjection(rules)
            setup.before_step, setup.after_step = update.remember, update.project
        return setup

    def _rules(self, ctx: PhaseContext) -> dict[str, Rule]:
        """Per trained tower with statistics: (projection, P_in, P_out or None)."""
        stats, rules = ctx.state.get(NAMESPACE), {}
        if stats is None:  # nothing learned before: the first phase trains freely
            return {}
        for tower, proj in self.projections(ctx.model).items():
            if not proj.weight.requires_grad:
                continue
            device = proj.weight.device
            p_in = subspace_projector(stats[f"{tower}_in"], self.config.lambda_min).to(device)
            p_out = None if tower in self.config.one_sided else subspace_projector(
                stats[f"{tower}_out"], self.config.lambda_min_out).to(device)
            rules[tower] = (proj, p_in, p_out)
        return rules

    def seed(self, ctx: PhaseContext, prior: PairDataset) -> None:
        super().seed(ctx, prior)
        if NAMESPACE not in ctx.state:
            self._accumulate(ctx, ctx.pairs(prior))

    def finish(self, ctx: PhaseContext) -> None:
        super().finish(ctx)
        self._accumulate(ctx, ctx.pairs())

    def _accumulate(self, ctx: PhaseContext, pairs: PairTensors) -> None:
        """Add the model's projection inputs on ``pairs`` to the running moments; under
        torch.distributed each rank encodes a block of the rows (``update_moments``
        all-reduces the sums)."""
        model, proj, world = ctx.model, self.projections(ctx.model), World.current()
        images, texts = world.row_range(len(pairs.pixels)), world.row_range(len(pairs.tokens))
        x = {"image": projection_inputs(model, proj["image"],
                                        lambda b: model.encode_image(b.float()),
                                        pairs.pixels[images[0]:images[1]]),
             "text": projection_inputs(model, proj["text"], model.encode_text,
                                       pairs.tokens[texts[0]:texts[1]])}
        ctx.state[NAMESPACE] = update_moments(ctx.state.get(NAMESPACE), x, proj)


def update_moments(stats: dict[str, torch.Tensor] | None, x: dict[str, torch.Tensor],
                   proj: dict[str, Projection]) -> dict[str, torch.Tensor]:
    """Running moments after adding inputs ``x`` ([N_t, d_in] per tower): Z_in of each tower
    from its own inputs, Z_out from the partner tower's projected features. Under
    torch.distributed ``x`` holds this rank's rows: the Gram matrices and row counts are
    summed over ranks first, so every rank gets the moments of all rows."""
    if stats is None:
        stats = {f"{t}_{side}": torch.zeros(0) for t in TOWERS for side in ("in", "out")}
        stats |= {f"{t}_count": torch.zeros(1, dtype=torch.int64) for t in TOWERS}
    new = dict(stats)
    rows = {t: int(all_reduce_sum(torch.tensor([len(x[t])], dtype=torch.int64)).item())
            for t in TOWERS}
    for tower, partner in (("image", "text"), ("text", "image")):
        n_own, n_partner = int(stats[f"{tower}_count"]), int(stats[f"{partner}_count"])
        y = proj[partner].apply(x[partner].to(proj[partner].weight)).double().cpu()  # [N, d_out]
        new[f"{tower}_in"] = _add_gram(_or_zeros(stats[f"{tower}_in"], x[tower]), n_own,
                                       all_reduce_sum(x[tower].t() @ x[tower]), rows[tower])
        new[f"{tower}_out"] = _add_gram(_or_zeros(stats[f"{tower}_out"], y), n_partner,
                                        all_reduce_sum(y.t() @ y), rows[partner])
    for tower in TOWERS:
        new[f"{tower}_count"] = stats[f"{tower}_count"] + rows[tower]
    return new


def _or_zeros(moment: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    d = features.shape[1]
    return moment if moment.numel() else torch.zeros(d, d, dtype=torch.float64)


@torch.no_grad()
def _project_gradients(rules: dict[str, Rule]) -> None:
    for proj, p_in, p_out in rules.values():
        if proj.weight.grad is not None:
            proj.weight.grad.copy_(proj.rule(proj.weight.grad, p_in, p_out))


class UpdateProjection:
    """Projects each step's whole parameter change (Adam step and weight decay included)."""

    def __init__(self, rules: dict[str, Rule]) -> None:
        self.rules = rules
        self.before: dict[str, torch.Tensor] = {}

    def remember(self, opt: torch.optim.Optimizer) -> None:
        self.before = {tower: proj.weight.detach().clone()
                       for tower, (proj, _, _) in self.rules.items()}

    @torch.no_grad()
    def project(self, opt: torch.optim.Optimizer) -> None:
        for tower, (proj, p_in, p_out) in self.rules.items():
            before = self.before[tower]
            proj.weight.copy_(before + proj.rule(proj.weight - before, p_in, p_out))
