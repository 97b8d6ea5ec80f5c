"""The maps of adapter routes, fitted on paired vectors (x: NEW's, y: OLD's stored ones).

Every map is an ``EmbeddingMap``: ``normalize(x W + b + residual(x))``, [N, D_new] ->
[N, D_old]. Fitting methods are registered by name (``MAPS``), like the continual
strategies and the upgrade methods:

- ``procrustes``: orthogonal Procrustes, closed form. ``W = U V^T`` from the SVD of
  ``X^T Y`` minimises ``||X W - Y||_F`` over (semi-)orthogonal W (Schoenemann, 1966);
  a rotation keeps NEW's geometry intact, which is why it generalises from few pairs.
- ``affine``: ridge least squares on centred vectors, ``W = (Xc^T Xc + l I)^-1 Xc^T Yc``,
  ``b = mean(Y) - mean(X) W``, the penalty ``l`` relative to the mean eigenvalue of
  ``Xc^T Xc``; optionally reduced-rank (W projected on the top-r directions of the fit).
- ``residual-mlp``: Procrustes plus a small MLP residual branch whose last layer starts
  at zero (so it starts as the Procrustes map), trained with a cosine loss (Drift-Adapter).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from training.method_registry import MethodRegistry
from training.trainer import index_batches
from training.upgrades.adapter.config import AdapterFitConfig


class EmbeddingMap(nn.Module):
    """x [N, D_in] -> L2-normalised (x W + b + residual(x)) [N, D_out], where x is first
    L2-normalised: the map is fitted on embeddings (unit rows), and a route's encoder hands
    it the tower's raw features (an affine or residual map is not scale-invariant)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 0) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.hidden = in_dim, out_dim, hidden
        self.weight = nn.Parameter(torch.zeros(in_dim, out_dim))  # [D_in, D_out]
        self.bias = nn.Parameter(torch.zeros(out_dim))  # [D_out]
        self.residual = (nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(),
                                       nn.Linear(hidden, out_dim)) if hidden else None)
        if self.residual is not None:  # zero last layer: the map starts as x W + b
            nn.init.zeros_(self.residual[2].weight)
            nn.init.zeros_(self.residual[2].bias)

    def dims(self) -> dict[str, int]:
        """What a route records to rebuild the map before loading its weights."""
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": self.hidden}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.normalize(x.float(), dim=-1)
        y = x @ self.weight + self.bias
        if self.residual is not None:
            y = y + self.residual(x)
        return nn.functional.normalize(y, dim=-1)


TIE_BREAK = 1e-6  # the identity's weight, relative to the pairs' mean singular value


def procrustes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[D_in, D_out] (semi-)orthogonal W minimising ||x W - y||_F (x [N, D_in], y [N, D_out]).

    With fewer independent pairs than dimensions (a gallery sample of 5 captions in 512-d)
    the minimum is not unique: the pairs fix W only on the directions they span, and the
    SVD completes the rest with whatever basis its arithmetic gives, a map that can differ
    from run to run and move unseen queries anywhere. Where both sides have one width, the
    tie is broken towards the identity (``TIE_BREAK`` times the identity added to
    ``x^T y``): directions no pair constrains are left where they are, so a NEW that shares
    OLD's coordinates (a fine-tune, a continual phase) keeps them; with enough pairs the
    term changes W by about ``TIE_BREAK``."""
    m = x.double().T @ y.double()
    if m.shape[0] == m.shape[1]:
        scale = torch.linalg.matrix_norm(m) / m.shape[0] ** 0.5
        m = m + TIE_BREAK * float(scale) * torch.eye(len(m), dtype=m.dtype)
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    return (u @ vh).float()


def ridge_affine(x: torch.Tensor, y: torch.Tensor, ridge: float,
                 rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [D_in, D_out], b [D_out]) of ridge least squares; rank > 0: reduced-rank W."""
    x, y = x.double(), y.double()
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc  # [D_in, D_in]
    penalty = ridge * torch.trace(gram) / len(gram)
    w = torch.linalg.solve(gram + penalty * torch.eye(len(gram), dtype=gram.dtype), xc.T @ yc)
    if 0 < rank < min(w.shape):
        _, _, vh = torch.linalg.svd(xc @ w, full_matrices=False)  # directions of the fit
        w = w @ vh[:rank].T @ vh[:rank]
    return w.float(), (my - mx @ w).float()


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation of unit rows: t = 0 gives a, t = 1 gives b ([N, D] each)."""
    a = nn.functional.normalize(a.float(), dim=-1)
    b = nn.functional.normalize(b.float(), dim=-1)
    cos = (a * b).sum(-1, keepdim=True).clamp(-1.0, 1.0)  # [N, 1]
    omega = torch.arccos(cos)
    sin = torch.sin(omega)
    near = sin.abs() < 1e-6  # (anti)parallel rows: the plane is undefined; interpolate linearly
    wa = torch.where(near, torch.full_like(sin, 1 - t), torch.sin((1 - t) * omega) / sin)
    wb = torch.where(near, torch.full_like(sin, t), torch.sin(t * omega) / sin)
    return nn.functional.normalize(wa * a + wb * b, dim=-1)


class MapFit:
    """A fitting method: ``fit(x, y, config)`` -> a fitted ``EmbeddingMap``."""

    name: ClassVar[str] = ""

    @staticmethod
    def fit(x: torch.Tensor, y: torch.Tensor, cfg: AdapterFitConfig) -> EmbeddingMap:
        raise NotImplementedError


MAPS: MethodRegistry[type[MapFit]] = MethodRegistry("adapter map")


def _with(weight: torch.Tensor, bias: torch.Tensor | None = None, hidden: int = 0,
          ) -> EmbeddingMap:
    m = EmbeddingMap(weight.shape[0], weight.shape[1], hidden)
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m


@MAPS.register("procrustes")
class ProcrustesFit(MapFit):
    @staticmethod
    def fit(x: torch.Tensor, y: torch.Tensor, cfg: AdapterFitConfig) -> EmbeddingMap:
        return _with(procrustes(x, y)).eval()


@MAPS.register("affine")
class AffineFit(MapFit):
    @staticmethod
    def fit(x: torch.Tensor, y: torch.Tensor, cfg: AdapterFitConfig) -> EmbeddingMap:
        return _with(*ridge_affine(x, y, cfg.ridge, cfg.rank)).eval()


@MAPS.register("residual-mlp")
class ResidualMlpFit(MapFit):
    @staticmethod
    def fit(x: torch.Tensor, y: torch.Tensor, cfg: AdapterFitConfig) -> EmbeddingMap:
        torch.manual_seed(cfg.seed)
        m = _with(procrustes(x, y), hidden=cfg.hidden)
        m.weight.requires_grad_(False)  # the rotation stays; the residual learns what it misses
        m.bias.requires_grad_(False)
        train_residual(m, x, y, cfg)
        return m.eval()


def train_residual(m: EmbeddingMap, x: torch.Tensor, y: torch.Tensor,
                   cfg: AdapterFitConfig) -> list[float]:
    """AdamW on ``1 - cos(m(x), y)`` over seeded shuffles of the pairs; the loss per step."""
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    target = nn.functional.normalize(y.float(), dim=-1)
    losses = []
    for _, idx in zip(range(cfg.steps), index_batches(len(x), cfg.batch_size, cfg.seed)):
        loss = (1 - (m(x[idx]) * target[idx]).sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
